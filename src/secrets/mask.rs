//! Masking by value: every secret fetched, and every value a tool's `redact` paths name, is
//! replaced wherever it would be kept or handed back (`[secret:NAME]`, `[redacted]`). A value
//! is found as a substring of any string or map key, however the script built it, so that a tool
//! that echoes its token is caught too.

use std::borrow::Cow;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, RwLock};

use aho_corasick::{AhoCorasick, MatchKind};
use serde_json::Value;

/// The shortest value masked by value: a shorter one would mask the words around it.
pub const MIN_MASKED_LEN: usize = 4;

/// The values a mask replaces, and the automaton that finds them.
#[derive(Default)]
struct Table {
    /// (value, replacement), in the order they were added.
    entries: Vec<(String, String)>,
    /// Built from the first `covered` entries.
    finder: Option<Arc<AhoCorasick>>,
    covered: usize,
}

impl Table {
    /// The entries the automaton does not cover yet.
    fn tail(&self) -> &[(String, String)] {
        &self.entries[self.covered.min(self.entries.len())..]
    }

    /// Whether a check may use the automaton and look at the few entries added since by hand
    /// (a run that adds a value at each call rebuilds the automaton only now and then).
    fn fresh_enough(&self) -> bool {
        self.finder.is_some() && self.tail().len() <= 16.max(self.covered / 2)
    }
}

/// A set of values to replace, shared by whoever keeps or hands back what a run made.
#[derive(Default)]
pub struct Mask {
    table: RwLock<Table>,
    /// How many values it masks, read without the lock: a run with nothing to mask pays one
    /// atomic load per check.
    count: AtomicUsize,
}

impl std::fmt::Debug for Mask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the values.
        f.debug_struct("Mask")
            .field("values", &self.len())
            .finish_non_exhaustive()
    }
}

impl Mask {
    /// Replaces `value` with `replacement` from now on. A value shorter than
    /// [`MIN_MASKED_LEN`] is not masked by value; `false` then.
    pub fn add(&self, value: &str, replacement: &str) -> bool {
        if value.len() < MIN_MASKED_LEN {
            return false;
        }
        // The value as JSON and Rust's debug output escape it too (a key with a newline, a
        // password with a quote): each form is found where it stands.
        let mut forms = vec![value.to_string()];
        let json = serde_json::to_string(value).unwrap_or_default();
        let debug = format!("{value:?}");
        for quoted in [json, debug] {
            let inner = quoted
                .strip_prefix('"')
                .and_then(|q| q.strip_suffix('"'))
                .unwrap_or_default();
            if !inner.is_empty() && !forms.iter().any(|f| f == inner) {
                forms.push(inner.to_string());
            }
        }
        let mut table = self.table.write().unwrap_or_else(|e| e.into_inner());
        if table.entries.iter().any(|(v, _)| v == value) {
            return true;
        }
        for form in forms {
            table.entries.push((form, replacement.to_string()));
        }
        self.count.store(table.entries.len(), Ordering::Release);
        true
    }

    /// How many values it masks.
    pub fn len(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// Whether it masks nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The automaton over every entry and the replacements, `None` when nothing is masked.
    fn finder(&self) -> Option<(Arc<AhoCorasick>, Vec<String>)> {
        if self.is_empty() {
            return None;
        }
        {
            let table = self.table.read().unwrap_or_else(|e| e.into_inner());
            if table.entries.is_empty() {
                return None;
            }
            if let (Some(finder), true) = (&table.finder, table.tail().is_empty()) {
                let replacements = table.entries.iter().map(|(_, r)| r.clone()).collect();
                return Some((Arc::clone(finder), replacements));
            }
        }
        let mut table = self.table.write().unwrap_or_else(|e| e.into_inner());
        let finder = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(table.entries.iter().map(|(v, _)| v.as_str()))
            .ok()
            .map(Arc::new)?;
        table.finder = Some(Arc::clone(&finder));
        table.covered = table.entries.len();
        let replacements = table.entries.iter().map(|(_, r)| r.clone()).collect();
        Some((finder, replacements))
    }

    /// Whether any masked value occurs in what `check` is given: the automaton, then each
    /// value it does not cover yet.
    fn found(&self, check: impl Fn(&AhoCorasick, &[(String, String)]) -> bool) -> bool {
        if self.is_empty() {
            return false;
        }
        {
            let table = self.table.read().unwrap_or_else(|e| e.into_inner());
            if table.entries.is_empty() {
                return false;
            }
            if table.fresh_enough() {
                if let Some(finder) = &table.finder {
                    return check(finder, table.tail());
                }
            }
        }
        match self.finder() {
            Some((finder, _)) => check(&finder, &[]),
            None => false,
        }
    }

    /// `text` with every masked value replaced.
    pub fn text<'a>(&self, text: &'a str) -> Cow<'a, str> {
        match self.finder() {
            Some((finder, replacements)) => replace(&finder, &replacements, text),
            None => Cow::Borrowed(text),
        }
    }

    /// Replaces every masked value in `value`'s strings and map keys; whether any was.
    pub fn value(&self, value: &mut Value) -> bool {
        match self.finder() {
            Some((finder, replacements)) => mask_value(&finder, &replacements, value),
            None => false,
        }
    }

    /// Whether `value` holds a masked value, in a string or a map key (or is one, a number).
    pub fn holds(&self, value: &Value) -> bool {
        self.found(|finder, tail| {
            holds(
                value,
                &|s| finder.is_match(s) || tail.iter().any(|(v, _)| s.contains(v.as_str())),
                &|n| whole(finder, n) || tail.iter().any(|(v, _)| v == n),
            )
        })
    }

    /// Whether `text` holds a masked value.
    pub fn holds_text(&self, text: &str) -> bool {
        self.found(|finder, tail| {
            finder.is_match(text) || tail.iter().any(|(v, _)| text.contains(v.as_str()))
        })
    }
}

fn replace<'a>(finder: &AhoCorasick, replacements: &[String], text: &'a str) -> Cow<'a, str> {
    if !finder.is_match(text) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    finder.replace_all_with(text, &mut out, |m, _, out| {
        out.push_str(&replacements[m.pattern().as_usize()]);
        true
    });
    Cow::Owned(out)
}

/// Whether `finder` matches the whole of `text`: a number is masked only when it is a masked
/// value itself.
fn whole(finder: &AhoCorasick, text: &str) -> bool {
    finder
        .find(text)
        .is_some_and(|m| m.start() == 0 && m.end() == text.len())
}

fn mask_value(finder: &AhoCorasick, replacements: &[String], value: &mut Value) -> bool {
    match value {
        Value::Number(n) => {
            let text = n.to_string();
            match finder.find(&text).filter(|_| whole(finder, &text)) {
                Some(m) => {
                    *value = Value::String(replacements[m.pattern().as_usize()].clone());
                    true
                }
                None => false,
            }
        }
        Value::String(s) => match replace(finder, replacements, s) {
            Cow::Owned(masked) => {
                *s = masked;
                true
            }
            Cow::Borrowed(_) => false,
        },
        Value::Array(items) => items.iter_mut().fold(false, |any, item| {
            mask_value(finder, replacements, item) | any
        }),
        Value::Object(map) => {
            let mut any = false;
            if map.keys().any(|k| finder.is_match(k)) {
                let entries = std::mem::take(map);
                for (k, v) in entries {
                    map.insert(replace(finder, replacements, &k).into_owned(), v);
                }
                any = true;
            }
            map.values_mut().fold(any, |any, item| {
                mask_value(finder, replacements, item) | any
            })
        }
        _ => false,
    }
}

fn holds(value: &Value, matches: &impl Fn(&str) -> bool, number: &impl Fn(&str) -> bool) -> bool {
    match value {
        Value::String(s) => matches(s),
        Value::Number(n) => number(&n.to_string()),
        Value::Array(items) => items.iter().any(|v| holds(v, matches, number)),
        Value::Object(map) => map
            .iter()
            .any(|(k, v)| matches(k) || holds(v, matches, number)),
        _ => false,
    }
}

/// The masks of one run: every secret the process fetched, then the run's own values.
#[derive(Clone, Copy)]
pub(crate) struct Masks<'a> {
    pub(crate) masks: [&'a Mask; 2],
}

impl Masks<'_> {
    /// Whether any value is masked at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.masks.iter().all(|m| m.is_empty())
    }

    /// Replaces masked values in `value`; whether any was.
    pub(crate) fn value(&self, value: &mut Value) -> bool {
        self.masks.iter().fold(false, |any, m| m.value(value) | any)
    }

    /// Replaces masked values in `text`.
    pub(crate) fn string(&self, text: &mut String) {
        for m in self.masks {
            if let Cow::Owned(masked) = m.text(text) {
                *text = masked;
            }
        }
    }

    /// Whether `value` holds a masked value.
    pub(crate) fn holds(&self, value: &Value) -> bool {
        self.masks.iter().any(|m| m.holds(value))
    }

    /// Whether `text` holds a masked value.
    pub(crate) fn holds_text(&self, text: &str) -> bool {
        self.masks.iter().any(|m| m.holds_text(text))
    }

    /// Replaces masked values in an error's words.
    pub(crate) fn error(&self, error: &mut crate::error::ToolError) {
        self.string(&mut error.message);
        if let Some(next) = &mut error.suggested_next_action {
            self.string(next);
        }
        if let Some(tool) = &mut error.tool {
            self.string(tool);
        }
    }

    /// Whether an outcome holds a masked value, in its value or its error's words.
    pub(crate) fn holds_outcome(&self, outcome: &Result<Value, crate::error::ToolError>) -> bool {
        match outcome {
            Ok(value) => self.holds(value),
            Err(e) => {
                self.holds_text(&e.message)
                    || e.suggested_next_action
                        .as_deref()
                        .is_some_and(|t| self.holds_text(t))
            }
        }
    }

    /// An outcome with its masked values replaced.
    pub(crate) fn outcome(
        &self,
        outcome: &Result<Value, crate::error::ToolError>,
    ) -> Result<Value, crate::error::ToolError> {
        let mut outcome = outcome.clone();
        match &mut outcome {
            Ok(value) => {
                self.value(value);
            }
            Err(e) => self.error(e),
        }
        outcome
    }
}

/// Every secret this process fetched: what the command line's log output masks (the library's
/// own tracing never carries values; a dependency's might).
pub fn process_mask() -> &'static Mask {
    static MASK: OnceLock<Mask> = OnceLock::new();
    MASK.get_or_init(Mask::default)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_are_masked_in_strings_and_keys_longest_first() {
        let mask = Mask::default();
        assert!(!mask.add("abc", "[x]"), "too short to mask by value");
        mask.add("hunter22", "[secret:PW]");
        mask.add("hunter2234", "[secret:LONG]");
        assert_eq!(
            mask.text("a hunter2234 b hunter22"),
            "a [secret:LONG] b [secret:PW]"
        );
        let mut v = json!({"k hunter22": ["x", "yhunter22y", 5, {"z": "hunter22"}]});
        assert!(mask.value(&mut v));
        assert_eq!(
            v,
            json!({"k [secret:PW]": ["x", "y[secret:PW]y", 5, {"z": "[secret:PW]"}]})
        );
        assert!(!mask.holds(&v));
        assert!(mask.holds(&json!([{"a": "..hunter22.."}])));
        assert!(!mask.value(&mut json!({"a": 1})));
        assert!(Mask::default().text("hunter22") == "hunter22");
    }

    /// Values added one at a time between checks are all found, whether the automaton covers
    /// them yet or not.
    #[test]
    fn every_value_added_is_found_between_rebuilds() {
        let mask = Mask::default();
        for i in 0..500 {
            mask.add(&format!("value-{i:04}"), "[redacted]");
            for j in [0, i / 2, i] {
                assert!(mask.holds_text(&format!("x value-{j:04} y")), "{i} {j}");
            }
            assert!(!mask.holds_text("value-9999"));
        }
        assert_eq!(mask.text("value-0499 value-0000"), "[redacted] [redacted]");
    }
}
