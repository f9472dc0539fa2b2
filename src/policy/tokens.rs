//! Counting tokens, behind one small trait so that the count can come from a real tokenizer or
//! from an estimate:
//!
//! - with the feature `tokens`, [`Bpe`]: the o200k_base BPE as a model counts (embedded in
//!   `tiktoken-rs`; nothing is downloaded), built once per process on first use;
//! - without it, [`Bytes`]: one token per byte. A BPE token is at least one byte, so this never
//!   counts fewer tokens than the text has: pages are smaller and the inline budget is reached
//!   sooner than with the BPE, never later. Outputs and pages stay within what a model is given,
//!   at the price of more of them.
//!
//! An artifact's pages are cut by the counter of the process that reads them: a store shared by
//! builds with and without `tokens` pages the same artifact differently (each page is within its
//! budget either way).

/// Counts the tokens of text.
pub(crate) trait TokenCounter: Sync {
    /// The number of tokens of `text`; never fewer than a model would count.
    fn count(&self, text: &str) -> usize;
}

/// The o200k_base BPE.
#[cfg(feature = "tokens")]
pub(crate) struct Bpe;

#[cfg(feature = "tokens")]
impl TokenCounter for Bpe {
    fn count(&self, text: &str) -> usize {
        tiktoken_rs::o200k_base_singleton()
            .encode_ordinary(text)
            .len()
    }
}

/// One token per byte: an upper bound of any byte-level BPE's count.
#[cfg_attr(feature = "tokens", allow(dead_code))]
pub(crate) struct Bytes;

impl TokenCounter for Bytes {
    fn count(&self, text: &str) -> usize {
        text.len()
    }
}

/// The counter this build uses.
fn counter() -> &'static dyn TokenCounter {
    #[cfg(feature = "tokens")]
    return &Bpe;
    #[cfg(not(feature = "tokens"))]
    return &Bytes;
}

#[cfg(test)]
thread_local! {
    /// Bytes counted on this thread: what a test reads to tell that something was not counted.
    pub(crate) static COUNTED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The number of tokens of `text`.
pub(crate) fn count(text: &str) -> usize {
    #[cfg(test)]
    COUNTED.with(|c| c.set(c.get() + text.len()));
    counter().count(text)
}

/// Whether `text` is at most `budget` tokens. A token is at least one byte, so text that fits in
/// bytes is not counted.
pub(crate) fn fits(text: &str, budget: usize) -> bool {
    text.len() <= budget || count(text) <= budget
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "tokens")]
    #[test]
    fn tokens_are_counted_by_the_bpe_not_by_characters() {
        assert_eq!(count(""), 0);
        assert_eq!(count("hello world"), 2);
        let long = "tokens ".repeat(1000);
        let n = count(&long);
        assert!(n < long.len() / 3, "{n} tokens for {} bytes", long.len());
        assert!(fits("abc", 3) && !fits(&long, 100));
    }

    #[test]
    fn the_estimate_never_counts_fewer_tokens_than_the_text_has() {
        for text in ["", "hello world", "naïve café ☕", &"tokens ".repeat(300)] {
            assert_eq!(Bytes.count(text), text.len());
            #[cfg(feature = "tokens")]
            assert!(Bytes.count(text) >= Bpe.count(text), "{text}");
        }
    }
}
