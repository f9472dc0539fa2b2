//! The fixture sandbox and recorded fixtures: how a script is tested offline.
//!
//! - **The sandbox** ([`Sandbox::Fixture`]) refuses every non-read call in the dispatch path,
//!   after the guard and before the approval gate, with `side_effect_blocked`: the call never
//!   reaches its body, its breaker or its timeout, and its receipt's status is `blocked`. A
//!   call the guard would ask a person about is blocked without asking.
//! - **A recording** ([`Recorder`]) writes each read the executor used, one JSON line each:
//!   its tool, its arguments, its occurrence and its outcome.
//! - **Fixtures** ([`Fixtures`]) answer reads from such a file, after the budget and before
//!   the breaker: a read the file lacks fails with `fixture_missing`.
//!
//! # Occurrences
//!
//! A fixture is keyed by (tool, canonical arguments, occurrence), where the occurrence counts
//! the times the run answered that read by a call of its own, from 0, across the whole run: a
//! repeat the ledger answers within an epoch is the same occurrence; the same read after a
//! non-read call, a retry after a recoverable failure, and each call of a polling tool are
//! the next. It does not depend on epochs, so that a script that gains or loses a non-read
//! call still finds its reads. The run ledger counts them (`RunLedger::fixture_occurrence`).
//!
//! # Format
//!
//! JSON Lines, one read a line, in the order the executor used them:
//!
//! ```json
//! {"tool":"get_customer","args":{"id":"c_1"},"occurrence":0,"ok":{"name":"Ada"}}
//! {"tool":"get_order","args":{"id":"o_9"},"occurrence":0,"error":{"kind":"not_found","message":"no order o_9","recoverable":false}}
//! ```
//!
//! Blank lines are skipped; a later line for the same key replaces an earlier one.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::{json, Map, Value};

use crate::error::{Error, ErrorKind, ToolError};
use crate::json::key_json;
use crate::sync::lock;
use crate::tool::ToolSpec;

/// What a run's non-read calls may do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Sandbox {
    /// They reach their tools (the default).
    #[default]
    Off,
    /// Every non-read call fails with `side_effect_blocked` without reaching its tool; reads
    /// run (or are answered from fixtures).
    Fixture,
}

impl Sandbox {
    /// Whether the sandbox refuses a call of `spec`, and its error if it does.
    pub(crate) fn refuse(self, spec: &ToolSpec) -> Option<ToolError> {
        if self == Sandbox::Off || spec.effect == crate::tool::Effect::Read {
            return None;
        }
        Some(
            ToolError::new(
                ErrorKind::SideEffectBlocked,
                format!(
                    "the run is a fixture sandbox: `{}` ({}) was not made",
                    spec.name,
                    spec.effect.as_str()
                ),
            )
            .with_recoverable(false),
        )
    }
}

/// A read's key in a fixtures file: tool, canonical arguments, occurrence.
type Key = (String, String, u64);

/// The answers of a fixtures file.
#[derive(Debug)]
pub(crate) struct Fixtures {
    file: PathBuf,
    answers: HashMap<Key, Result<Value, ToolError>>,
}

impl Fixtures {
    /// Reads the fixtures file at `path`.
    ///
    /// # Errors
    ///
    /// [`Error::Fixture`] when the file cannot be read, or a line (named) is malformed.
    pub(crate) fn load(path: &Path) -> Result<Fixtures, Error> {
        let fail = |line: Option<usize>, message: String| Error::Fixture {
            file: path.to_path_buf(),
            line,
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|e| {
            let why = match e.kind() {
                std::io::ErrorKind::NotFound => {
                    "no such file: record one first with `toolscript run --record FILE`".into()
                }
                _ => format!("it cannot be read: {e}"),
            };
            fail(None, why)
        })?;
        let mut answers = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let (key, outcome) = parse_line(line).map_err(|why| fail(Some(i + 1), why))?;
            answers.insert(key, outcome);
        }
        Ok(Fixtures {
            file: path.to_path_buf(),
            answers,
        })
    }

    /// The recorded outcome of `tool` with `args_key` at `occurrence`, or `fixture_missing`.
    pub(crate) fn answer(
        &self,
        tool: &str,
        args_key: &str,
        occurrence: u64,
    ) -> Result<Value, ToolError> {
        let key = (tool.to_string(), args_key.to_string(), occurrence);
        match self.answers.get(&key) {
            Some(outcome) => outcome.clone(),
            None => Err(ToolError::new(
                ErrorKind::FixtureMissing,
                format!(
                    "the fixtures file {} has no answer for `{tool}` with these arguments (occurrence {occurrence})",
                    self.file.display()
                ),
            )),
        }
    }
}

/// One line of a fixtures file: its key and outcome, or what is wrong with it.
fn parse_line(line: &str) -> Result<(Key, Result<Value, ToolError>), String> {
    let value: Value = serde_json::from_str(line).map_err(|e| format!("not a JSON object: {e}"))?;
    let Value::Object(mut map) = value else {
        return Err("not a JSON object".into());
    };
    let tool = match map.get("tool") {
        Some(Value::String(tool)) => tool.clone(),
        _ => return Err("`tool` must be the tool's name, a string".into()),
    };
    let args = map
        .remove("args")
        .ok_or("`args` is missing: the call's arguments, a JSON value")?;
    let occurrence = map
        .get("occurrence")
        .and_then(Value::as_u64)
        .ok_or("`occurrence` must be a whole number from 0")?;
    let outcome = match (map.remove("ok"), map.get("error")) {
        (Some(value), None) => Ok(value),
        (None, Some(error)) => Err(parse_error(error)?),
        _ => {
            return Err(
                "a line has either `ok` (the result) or `error`, not both nor neither".into(),
            )
        }
    };
    Ok(((tool, key_json(&args), occurrence), outcome))
}

/// A recorded error: `{"kind", "message", "recoverable"?, "suggested_next_action"?}`.
fn parse_error(error: &Value) -> Result<ToolError, String> {
    let text = |key: &str| error.get(key).and_then(Value::as_str);
    let kind = text("kind").ok_or("`error.kind` must be a string")?;
    let mut parsed = ToolError::with_kind_name(kind, text("message").unwrap_or_default())
        .ok_or_else(|| format!("`error.kind` {kind:?} is not a lowercase identifier"))?;
    if let Some(recoverable) = error.get("recoverable") {
        parsed.recoverable = recoverable
            .as_bool()
            .ok_or("`error.recoverable` must be true or false")?;
    }
    if let Some(next) = text("suggested_next_action") {
        parsed.suggested_next_action = Some(next.to_string());
    }
    Ok(parsed)
}

/// One fixtures line for a read's outcome.
fn line_of(
    tool: &str,
    args_key: &str,
    occurrence: u64,
    outcome: &Result<Value, ToolError>,
) -> String {
    let args: Value = serde_json::from_str(args_key).unwrap_or(Value::Null);
    let mut map = Map::new();
    map.insert("tool".into(), json!(tool));
    map.insert("args".into(), args);
    map.insert("occurrence".into(), json!(occurrence));
    match outcome {
        Ok(value) => map.insert("ok".into(), value.clone()),
        Err(e) => map.insert(
            "error".into(),
            json!({
                "kind": e.kind_name(),
                "message": e.message,
                "recoverable": e.recoverable,
                "suggested_next_action": e.suggested_next_action,
            }),
        ),
    };
    let mut line = Value::Object(map).to_string();
    line.push('\n');
    line
}

/// Writes the reads a run used to a fixtures file as they are used, one line each.
#[derive(Debug)]
pub(crate) struct Recorder {
    file: PathBuf,
    /// `None` once a write failed: the recording stops there (the run goes on).
    out: Mutex<Option<std::fs::File>>,
}

impl Recorder {
    /// Creates (or truncates) the fixtures file at `path`.
    ///
    /// # Errors
    ///
    /// [`Error::Fixture`] when the file cannot be created.
    pub(crate) fn create(path: &Path) -> Result<Recorder, Error> {
        let out = std::fs::File::create(path).map_err(|e| Error::Fixture {
            file: path.to_path_buf(),
            line: None,
            message: format!("it cannot be created: {e}"),
        })?;
        Ok(Recorder {
            file: path.to_path_buf(),
            out: Mutex::new(Some(out)),
        })
    }

    /// Appends the read of `tool` with `args_key` at `occurrence` and its outcome.
    pub(crate) fn record(
        &self,
        tool: &str,
        args_key: &str,
        occurrence: u64,
        outcome: &Result<Value, ToolError>,
    ) {
        let mut out = lock(&self.out);
        let Some(file) = out.as_mut() else {
            return;
        };
        if let Err(e) = file.write_all(line_of(tool, args_key, occurrence, outcome).as_bytes()) {
            tracing::error!(file = %self.file.display(), error = %e, "the fixtures file could not be written: the recording stops here");
            *out = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Fixtures, Error> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.jsonl");
        std::fs::write(&path, text).unwrap();
        Fixtures::load(&path)
    }

    #[test]
    fn a_recorded_line_answers_its_read_and_only_it() {
        let error = ToolError::with_kind_name("rate_limited", "slow down")
            .unwrap()
            .with_recoverable(true);
        let args = key_json(&json!({"b": [1, 2.5], "a": "x"}));
        let text = [
            line_of("t", &args, 0, &Ok(json!({"v": 1}))),
            "\n".into(),
            line_of("t", &args, 1, &Err(error.clone())),
        ]
        .concat();
        let fixtures = load(&text).unwrap();
        assert_eq!(fixtures.answer("t", &args, 0), Ok(json!({"v": 1})));
        let replayed = fixtures.answer("t", &args, 1).unwrap_err();
        assert_eq!(replayed.kind_name(), "rate_limited");
        assert!(replayed.recoverable);
        for (tool, args, n) in [
            ("t", args.as_str(), 2),
            ("u", args.as_str(), 0),
            ("t", "{}", 0),
        ] {
            let missing = fixtures.answer(tool, args, n).unwrap_err();
            assert_eq!(missing.kind, ErrorKind::FixtureMissing, "{tool} {args} {n}");
            assert!(!missing.recoverable);
        }
    }

    #[test]
    fn arguments_match_whatever_order_the_file_writes_their_keys_in() {
        let fixtures =
            load(r#"{"args":{"z":1,"a":{"y":2,"b":3}},"tool":"t","occurrence":0,"ok":7}"#).unwrap();
        let args = key_json(&json!({"a": {"b": 3, "y": 2}, "z": 1}));
        assert_eq!(fixtures.answer("t", &args, 0), Ok(json!(7)));
    }

    #[test]
    fn a_malformed_line_is_named() {
        let good = line_of("t", "{}", 0, &Ok(json!(1)));
        for (bad, words) in [
            ("not json", "not a JSON object"),
            ("[1]", "not a JSON object"),
            (r#"{"args":{},"occurrence":0,"ok":1}"#, "`tool`"),
            (r#"{"tool":"t","occurrence":0,"ok":1}"#, "`args`"),
            (
                r#"{"tool":"t","args":{},"occurrence":-1,"ok":1}"#,
                "`occurrence`",
            ),
            (r#"{"tool":"t","args":{},"occurrence":0}"#, "either `ok`"),
            (
                r#"{"tool":"t","args":{},"occurrence":0,"ok":1,"error":{}}"#,
                "either `ok`",
            ),
            (
                r#"{"tool":"t","args":{},"occurrence":0,"error":{"kind":"Bad Kind"}}"#,
                "lowercase",
            ),
            (
                r#"{"tool":"t","args":{},"occurrence":0,"error":{"kind":"x","recoverable":1}}"#,
                "true or false",
            ),
        ] {
            let text = format!("{good}\n{bad}\n");
            let e = load(&text).unwrap_err();
            let Error::Fixture { line, message, .. } = &e else {
                panic!("{e}");
            };
            assert_eq!(*line, Some(3), "{bad}");
            assert!(message.contains(words), "{bad}: {message}");
            assert!(e.to_string().contains("f.jsonl:3"), "{e}");
        }
    }

    #[test]
    fn a_missing_file_says_how_to_make_one() {
        let e = Fixtures::load(Path::new("/nonexistent/fixtures.jsonl")).unwrap_err();
        assert!(e.to_string().contains("--record"), "{e}");
    }

    #[test]
    fn the_recorder_writes_lines_the_loader_reads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.jsonl");
        let recorder = Recorder::create(&path).unwrap();
        recorder.record("t", r#"{"id":1}"#, 0, &Ok(json!("a")));
        recorder.record("t", r#"{"id":1}"#, 1, &Err(ToolError::not_found("gone")));
        let fixtures = Fixtures::load(&path).unwrap();
        assert_eq!(fixtures.answer("t", r#"{"id":1}"#, 0), Ok(json!("a")));
        assert_eq!(
            fixtures.answer("t", r#"{"id":1}"#, 1).unwrap_err().kind,
            ErrorKind::NotFound
        );
        assert!(Recorder::create(&dir.path().join("no/such/dir.jsonl")).is_err());
    }
}
