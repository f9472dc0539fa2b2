//! Cutting a text to a number of tokens: its start, then `…` and a note saying what was cut.
//! A cut text is never longer than the text it was cut from, in bytes, characters or tokens:
//! a note that would make it longer is left out, and a text too short to gain from a cut is
//! kept whole.

use serde_json::Value;

use super::tokens::fits;
use crate::json::key_json;

/// What stands for the part of a text that was cut.
const ELLIPSIS: &str = "…";

/// `text` as a JSON string: how a text in an answer is counted.
fn json_string(text: &str) -> String {
    key_json(&Value::String(text.to_string()))
}

/// `text` within `budget` tokens (counted as a JSON string): `text` itself when it fits; else
/// its longest start that fits followed by `…` and `note` (` (1,234 characters in all; …)`);
/// else, when the note does not fit or would not leave the cut text shorter than `text`, its
/// start and `…` alone; else the empty string. Never longer than `text` in bytes, characters
/// or tokens, and within `budget` unless `budget` is under the two tokens at most that `""`
/// takes.
pub(crate) fn cut(text: &str, budget: usize, note: &str) -> String {
    if fits(&json_string(text), budget) {
        return text.to_string();
    }
    let chars = text.chars().count();
    for suffix in [format!("{ELLIPSIS}{note}"), ELLIPSIS.to_string()] {
        // A cut text shorter than `text` in bytes and characters, and within the budget, which
        // `text` is not: shorter in tokens too.
        let fitting = |head: &str| {
            let cut = format!("{head}{suffix}");
            cut.len() < text.len()
                && head.chars().count() + suffix.chars().count() < chars
                && fits(&json_string(&cut), budget)
        };
        if let Some(end) = longest_start(text, &fitting) {
            return format!("{}{suffix}", &text[..end]);
        }
    }
    String::new()
}

/// The end (a character boundary) of the longest start of `text` that is `fitting`, or `None`
/// when not even the empty start is. Searched by doubling from a short start, then halving:
/// the cost is that of counting a few starts about as long as the answer, whatever the
/// length of `text`.
fn longest_start(text: &str, fitting: &dyn Fn(&str) -> bool) -> Option<usize> {
    if !fitting("") {
        return None;
    }
    let floor = |mut i: usize| {
        i = i.min(text.len());
        while !text.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    let after = |i: usize| i + text[i..].chars().next().map_or(0, char::len_utf8);
    // `lo` fits; `hi`, when known, does not.
    let (mut lo, mut hi) = (0, None::<usize>);
    let mut probe = floor(256);
    while hi.is_none() {
        if probe <= lo {
            probe = after(lo);
        }
        if probe > text.len() || probe == lo {
            return Some(lo);
        }
        if fitting(&text[..probe]) {
            lo = probe;
            if probe == text.len() {
                return Some(lo);
            }
            probe = floor(probe.saturating_mul(2));
        } else {
            hi = Some(probe);
        }
    }
    let mut hi = hi.unwrap_or(text.len());
    loop {
        let mut mid = floor(lo + (hi - lo) / 2);
        if mid <= lo {
            mid = after(lo);
        }
        if mid >= hi {
            return Some(lo);
        }
        if fitting(&text[..mid]) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::tokens::count;
    use proptest::prelude::*;

    fn tokens(text: &str) -> usize {
        count(&json_string(text))
    }

    /// Every promise of [`cut`], for one text, budget and note.
    fn check(text: &str, budget: usize, note: &str) -> String {
        let out = cut(text, budget, note);
        assert!(out.len() <= text.len(), "{out:?} is longer than {text:?}");
        assert!(out.chars().count() <= text.chars().count(), "{out:?}");
        assert!(tokens(&out) <= tokens(text), "{out:?} has more tokens");
        assert!(
            tokens(&out) <= budget || out.is_empty(),
            "{out:?} is {} tokens, over {budget}",
            tokens(&out)
        );
        if fits(&json_string(text), budget) {
            assert_eq!(out, text);
        } else {
            let head = out
                .strip_suffix(&format!("{ELLIPSIS}{note}"))
                .or_else(|| out.strip_suffix(ELLIPSIS))
                .unwrap_or(&out);
            assert!(text.starts_with(head), "{out:?} is not a start of the text");
        }
        out
    }

    #[test]
    fn a_long_text_keeps_its_start_and_the_note() {
        let text = "a long message about what went wrong. ".repeat(2000);
        let out = check(&text, 60, " (76000 characters in all; artifact x)");
        assert!(out.starts_with("a long message"), "{out}");
        assert!(
            out.ends_with("(76000 characters in all; artifact x)"),
            "{out}"
        );
        assert!(tokens(&out) > 40, "it uses its budget: {out}");
    }

    #[test]
    fn a_text_just_over_the_budget_is_never_made_longer_by_its_note() {
        let note = " (a note much longer than what it would save, about the whole text)";
        for n in 1..40 {
            let text = "word ".repeat(n);
            for budget in [0, 1, 2, 3, 5, 8] {
                check(&text, budget, note);
            }
        }
        // Two bytes over the budget: `…` alone is three bytes, so nothing is gained by it.
        assert_eq!(check("ab", 0, note), "");
        assert_eq!(check("ab", 100, note), "ab");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

        /// Any text (with characters of every width, escapes and newlines), any budget from
        /// none, any note: never longer than the text, within the budget, a start of it.
        #[test]
        fn a_cut_text_is_never_longer_than_its_original(
            text in "[a-z é☕😀\"\\\\\n\t\u{1}0-9]{0,400}",
            repeat in 1usize..20,
            budget in 0usize..120,
            note in "[ a-z0-9;()é]{0,60}",
        ) {
            check(&text.repeat(repeat), budget, &note);
        }
    }
}
