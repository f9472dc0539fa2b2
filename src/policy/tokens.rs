//! Counting tokens as a model does: the o200k_base BPE (embedded in `tiktoken-rs`; nothing is
//! downloaded), built once per process on first use.

/// The number of tokens of `text`.
pub(crate) fn count(text: &str) -> usize {
    tiktoken_rs::o200k_base_singleton()
        .encode_ordinary(text)
        .len()
}

/// Whether `text` is at most `budget` tokens. A token is at least one byte, so text that fits in
/// bytes is not counted.
pub(crate) fn fits(text: &str, budget: usize) -> bool {
    text.len() <= budget || count(text) <= budget
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_counted_by_the_bpe_not_by_characters() {
        assert_eq!(count(""), 0);
        assert_eq!(count("hello world"), 2);
        let long = "tokens ".repeat(1000);
        let n = count(&long);
        assert!(n < long.len() / 3, "{n} tokens for {} bytes", long.len());
        assert!(fits("abc", 3) && !fits(&long, 100));
    }
}
