//! Plan, then apply: every effect a script would have, seen before any happens.
//!
//! - **Planning** (`Runtime::plan`): the script runs with real reads (speculated as usual) and
//!   no non-read call is made. Each reaches the dispatch path as far as the budget (the guard,
//!   the repeat guard and the approval gate see it as in a run), then is recorded as a
//!   [`PlannedCall`] and answered with its tool's `plan_result` ([`PlanSpec`]), or `()`. A call
//!   the dispatch path refuses is planned as refused. A tool with `plan = "stop"` ends the plan
//!   at its first call (`plan_incomplete`).
//! - **Unknowns**: where a `plan_result` says `"planned"`, the script sees a marker,
//!   `<from planned #3 .refund_id>`; an argument built from it shows where it came from, and
//!   apply matches it against what call #3 really returned.
//! - **Applying** (`Runtime::apply`): the same script runs for real, as a durable run. Each
//!   non-read call must be the plan's next planned call (tool and canonical arguments, markers
//!   replaced by what their calls returned): then it is made, with the approvals it needs given
//!   by the plan. Any other call pauses the run (`awaiting: "plan_divergence"`) and is made only
//!   if a person approves it. Planned calls the run never reached are `unapplied`.
//!
//! Reads after a planned call see the world without it: a plan shows what the script would do
//! against the world as it is.

mod expr;
mod render;

pub use expr::{PlanResult, PlanSpec};
pub(crate) use render::rhai_literal;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::effect::Effect;
use crate::error::{ErrorKind, ToolError};
use crate::store::CatalogPrint;
use crate::sync::lock;

/// The string a `plan_result` uses for a value known only once the call is made.
pub const UNKNOWN: &str = "planned";

/// How long a plan may wait to be applied, by default: one hour.
pub const DEFAULT_TTL_S: f64 = 3600.0;

/// Where a plan ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum PlanStatus {
    /// The script ran to its end (with a value or an error of its own).
    Complete,
    /// A tool with `plan = "stop"` ended it: what comes after depends on what that call does.
    Incomplete,
}

/// One non-read call of a plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct PlannedCall {
    /// Its position among the script's non-read calls (as in the journal of a run).
    pub seq: u64,
    /// The tool.
    pub tool: String,
    /// The tool's effect.
    pub effect: Effect,
    /// The arguments, as a person reads them (secrets and redacted values masked; values
    /// from an earlier planned call as markers).
    pub args: Value,
    /// When the arguments hold a secret or a redacted value: their keyed digest, which apply
    /// matches instead of `args`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// `planned` (apply makes it) or `refused` (the run refuses it too: `error` says how).
    pub status: CallStatus,
    /// What the script was given in its place: its tool's `plan_result`, or `()`.
    #[serde(default, skip_serializing_if = "Value::is_null")]
    pub result: Value,
    /// Why it was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<PlannedError>,
    /// What a person would be asked in a run, which applying the plan answers: the tool's
    /// approval, or a guard rule's question.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asks: Option<String>,
    /// The plan ended at this call (its tool says `plan = "stop"`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stop: bool,
}

/// Whether a planned call is to be made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum CallStatus {
    /// Apply makes it.
    Planned,
    /// The dispatch path refused it (the guard, the budget, the repeat guard): apply refuses
    /// it the same way, without making it.
    Refused,
}

/// The error a refused planned call met.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct PlannedError {
    /// The error's kind.
    pub kind: String,
    /// Its message.
    pub message: String,
}

/// A read the plan's run used: apply says which ones changed when it diverges.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct PlanRead {
    /// The tool.
    pub tool: String,
    /// The canonical arguments.
    pub args: String,
    /// The non-read calls before it.
    pub epoch: u64,
    /// Its occurrence within the epoch.
    pub n: u64,
    /// SHA-256 of its outcome's canonical JSON.
    pub sha256: String,
}

/// A plan: what a script would do, kept until it is applied or expires.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Plan {
    /// Its id (`toolscript apply ID`); empty for a plan no store keeps.
    pub plan_id: String,
    /// Where it ended.
    pub status: PlanStatus,
    /// When it was made, in ms since the Unix epoch.
    pub created_ms: i64,
    /// When it expires: apply refuses it afterwards.
    pub expires_ms: i64,
    /// The script's name.
    pub script_name: String,
    /// The script's text.
    pub script: String,
    /// The script's `input`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Value>,
    /// The hash of the catalog it was made under.
    pub catalog_sha256: String,
    /// The catalog's fingerprints, to say what changed when apply refuses it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub catalog: Option<CatalogPrint>,
    /// The non-read calls, in order.
    pub calls: Vec<PlannedCall>,
    /// The reads it used, in the order the executor used them.
    pub reads: Vec<PlanRead>,
    /// The script's value under the plan (planned calls answered by their `plan_result`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<Value>,
    /// The error that ended the script under the plan, as a run reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
    /// The run that applied it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_by: Option<String>,
}

impl Plan {
    /// The planned calls apply makes, in order.
    pub fn planned(&self) -> impl Iterator<Item = &PlannedCall> {
        self.calls
            .iter()
            .filter(|c| c.status == CallStatus::Planned)
    }

    /// The plan as JSON (`plan --json`, MCP `plan_script`).
    pub fn to_json(&self) -> Value {
        let mut value = serde_json::to_value(self).unwrap_or(Value::Null);
        if let Value::Object(map) = &mut value {
            map.insert("note".into(), Value::String(WORLD_AS_IT_IS.into()));
        }
        value
    }

    /// The plan as a person reads it: one call a line.
    pub fn render(&self) -> String {
        render::plan(self)
    }
}

/// What every plan says of itself.
pub const WORLD_AS_IT_IS: &str = "reads after a planned call see the world without it: the plan shows what the script would do against the world as it is now";

/// A run's part in a plan: making one, or applying one.
#[derive(Debug)]
pub(crate) enum PlanBook {
    Planning(Planning),
    Applying(Applying),
}

/// What a planning run has planned so far.
#[derive(Debug, Default)]
pub(crate) struct Planning {
    calls: Mutex<Vec<PlannedCall>>,
    reads: Mutex<Vec<PlanRead>>,
    stopped: AtomicBool,
    /// The key of keyed digests of arguments that hold a secret or a redacted value.
    key: Option<Arc<[u8; 32]>>,
}

/// An applying run's place in its plan.
#[derive(Debug)]
pub(crate) struct Applying {
    plan: Arc<Plan>,
    state: Mutex<ApplyState>,
    reads: Mutex<Vec<PlanRead>>,
    key: Option<Arc<[u8; 32]>>,
}

#[derive(Debug, Default)]
struct ApplyState {
    /// The index in `plan.calls` of the next call expected.
    next: usize,
    /// The planned call being made: its seq in the plan.
    making: Option<u64>,
    /// What each planned call returned, by its seq in the plan.
    results: HashMap<u64, Value>,
}

/// What an applying run does with one of the script's non-read calls.
#[derive(Debug)]
pub(crate) enum Next {
    /// It is the plan's next planned call: make it (the plan gives its approvals).
    Planned,
    /// It is the plan's next call, which the plan refused: refuse it the same way.
    Refused(ToolError),
    /// It is not the plan's next call (`None`: the plan has no more): a person decides.
    Diverges(Option<Box<PlannedCall>>),
}

impl PlanBook {
    /// The book of a planning run.
    pub(crate) fn planning(key: Option<Arc<[u8; 32]>>) -> PlanBook {
        PlanBook::Planning(Planning {
            key,
            ..Planning::default()
        })
    }

    /// The book of a run applying `plan`.
    pub(crate) fn applying(plan: Arc<Plan>, key: Option<Arc<[u8; 32]>>) -> PlanBook {
        PlanBook::Applying(Applying {
            plan,
            state: Mutex::default(),
            reads: Mutex::default(),
            key,
        })
    }

    pub(crate) fn as_planning(&self) -> Option<&Planning> {
        match self {
            PlanBook::Planning(p) => Some(p),
            PlanBook::Applying(_) => None,
        }
    }

    pub(crate) fn as_applying(&self) -> Option<&Applying> {
        match self {
            PlanBook::Applying(a) => Some(a),
            PlanBook::Planning(_) => None,
        }
    }

    /// The executor used the read `(tool, args, epoch, n)` with `outcome`.
    pub(crate) fn read(
        &self,
        tool: &str,
        args: &str,
        epoch: u64,
        n: u64,
        outcome: &Result<Value, ToolError>,
    ) {
        let reads = match self {
            PlanBook::Planning(p) => &p.reads,
            PlanBook::Applying(a) => &a.reads,
        };
        lock(reads).push(PlanRead {
            tool: tool.to_string(),
            args: args.to_string(),
            epoch,
            n,
            sha256: outcome_sha256(outcome),
        });
    }
}

/// SHA-256 of an outcome's canonical JSON (an error by its kind and message).
fn outcome_sha256(outcome: &Result<Value, ToolError>) -> String {
    let text = match outcome {
        Ok(value) => crate::json::key_json(value),
        Err(e) => format!("error:{}:{}", e.kind_name(), e.message),
    };
    crate::json::sha256_hex(text)
}

/// The digest of canonical arguments `args_key` under `key`.
fn digest(key: &[u8; 32], args_key: &str) -> String {
    format!("hmac:{}", crate::json::hmac_sha256_hex(key, args_key))
}

/// One of the script's non-read calls, as a plan records it.
pub(crate) struct Seen<'a> {
    /// Its tool's name and effect, and how the tool takes part in plans.
    pub(crate) tool: &'a str,
    pub(crate) effect: Effect,
    pub(crate) settings: &'a PlanSpec,
    /// Its place among the script's non-read calls.
    pub(crate) seq: u64,
    /// Its arguments as a person may read them (secrets and redacted values masked).
    pub(crate) shown: Value,
}

impl Planning {
    /// Records `call` as planned, and gives what the script is given in its place: its
    /// tool's `plan_result` over `args` (canonical form `args_key`), its unknowns as markers.
    /// `masked`: whether the shown arguments differ from the call's (then apply matches a
    /// keyed digest). `asks`: what a run would ask a person.
    ///
    /// # Errors
    ///
    /// `plan_incomplete` when the tool ends the plan; `internal` when its `plan_result` fails.
    pub(crate) fn plan(
        &self,
        call: Seen<'_>,
        args: &Value,
        args_key: &str,
        masked: bool,
        asks: Option<String>,
    ) -> Result<Value, ToolError> {
        let Seen {
            tool,
            effect,
            settings,
            seq,
            shown,
        } = call;
        let result = match &settings.result {
            Some(expr) => expr.eval(args).map(|value| mark_unknowns(value, seq)),
            None => Ok(Value::Null),
        };
        let digest = masked.then(|| {
            self.key
                .as_deref()
                .map_or_else(|| "unmatchable".to_string(), |k| digest(k, args_key))
        });
        lock(&self.calls).push(PlannedCall {
            seq,
            tool: tool.to_string(),
            effect,
            args: shown,
            digest,
            status: CallStatus::Planned,
            result: result.clone().unwrap_or(Value::Null),
            error: None,
            asks,
            stop: settings.stop,
        });
        if settings.stop {
            self.stopped.store(true, Ordering::SeqCst);
            return Err(ToolError::new(
                ErrorKind::PlanIncomplete,
                format!(
                    "`{tool}` ends the plan (`plan = \"stop\"`): what the script does after it depends on what it really does"
                ),
            )
            .with_recoverable(false));
        }
        result.map_err(|why| ToolError::internal(format!("`{tool}`: {why}")))
    }

    /// Records `call` as refused with `error`.
    pub(crate) fn refuse(&self, call: Seen<'_>, error: &ToolError) {
        lock(&self.calls).push(PlannedCall {
            seq: call.seq,
            tool: call.tool.to_string(),
            effect: call.effect,
            args: call.shown,
            digest: None,
            status: CallStatus::Refused,
            result: Value::Null,
            error: Some(PlannedError {
                kind: error.kind_name().to_string(),
                message: error.message.clone(),
            }),
            asks: None,
            stop: false,
        });
    }

    /// Whether the call `seq` is already in the plan.
    pub(crate) fn has(&self, seq: u64) -> bool {
        lock(&self.calls).iter().any(|c| c.seq == seq)
    }

    /// Whether a tool ended the plan.
    pub(crate) fn stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// The calls and reads planned, taken.
    pub(crate) fn take(&self) -> (Vec<PlannedCall>, Vec<PlanRead>) {
        (
            std::mem::take(&mut *lock(&self.calls)),
            std::mem::take(&mut *lock(&self.reads)),
        )
    }
}

impl Applying {
    /// What to do with the script's non-read call of `tool` with `args` (canonical form
    /// `args_key`): the plan's next call or not.
    pub(crate) fn next(&self, tool: &str, args: &Value, args_key: &str) -> Next {
        let mut state = lock(&self.state);
        let Some(planned) = self.plan.calls.get(state.next) else {
            return Next::Diverges(None);
        };
        let same = planned.tool == tool
            && match &planned.digest {
                Some(d) => self
                    .key
                    .as_deref()
                    .is_some_and(|k| digest(k, args_key) == *d),
                None => matches(&planned.args, args, &state.results),
            };
        if !same {
            return Next::Diverges(Some(Box::new(planned.clone())));
        }
        state.next += 1;
        match (&planned.status, &planned.error) {
            (CallStatus::Refused, Some(e)) => {
                let message = format!("refused, as in the plan: {}", e.message);
                let error = ToolError::with_kind_name(&e.kind, message.clone())
                    .unwrap_or_else(|| ToolError::new(ErrorKind::PermissionDenied, message));
                Next::Refused(error.with_recoverable(false))
            }
            _ => {
                state.making = Some(planned.seq);
                Next::Planned
            }
        }
    }

    /// The planned call being made answered `outcome`: later markers of it stand for it.
    pub(crate) fn made(&self, outcome: &Result<Value, ToolError>) {
        let mut state = lock(&self.state);
        if let (Some(seq), Ok(value)) = (state.making.take(), outcome) {
            state.results.insert(seq, value.clone());
        }
    }

    /// The planned calls the run never reached.
    pub(crate) fn unapplied(&self) -> Vec<PlannedCall> {
        let next = lock(&self.state).next;
        self.plan.calls[next.min(self.plan.calls.len())..]
            .iter()
            .filter(|c| c.status == CallStatus::Planned)
            .cloned()
            .collect()
    }

    /// The reads of the plan whose outcome the run found changed (or did not make), as a
    /// person reads them: `get_order {"id":17} (epoch 0)`.
    pub(crate) fn changed_reads(&self) -> Vec<String> {
        changed(&self.plan.reads, &lock(&self.reads))
    }
}

/// The reads of `then` whose outcome differs in `now`, among those `now` made.
fn changed(then: &[PlanRead], now: &[PlanRead]) -> Vec<String> {
    let now: HashMap<(&str, &str, u64, u64), &str> = now
        .iter()
        .map(|r| {
            (
                (r.tool.as_str(), r.args.as_str(), r.epoch, r.n),
                r.sha256.as_str(),
            )
        })
        .collect();
    then.iter()
        .filter(|r| {
            now.get(&(r.tool.as_str(), r.args.as_str(), r.epoch, r.n))
                .is_some_and(|sha| *sha != r.sha256)
        })
        .map(|r| format!("`{}` {} (after {} non-read calls)", r.tool, r.args, r.epoch))
        .collect()
}

/// `value` with every `"planned"` string in it replaced by a marker naming call `seq` and
/// where in its result the value is: `<from planned #3 .refund_id>`.
pub(crate) fn mark_unknowns(value: Value, seq: u64) -> Value {
    fn walk(value: Value, seq: u64, path: &mut String) -> Value {
        match value {
            Value::String(s) if s == UNKNOWN => Value::String(marker(seq, path)),
            Value::Array(items) => Value::Array(
                items
                    .into_iter()
                    .enumerate()
                    .map(|(i, item)| {
                        let len = path.len();
                        path.push_str(&format!("[{i}]"));
                        let item = walk(item, seq, path);
                        path.truncate(len);
                        item
                    })
                    .collect(),
            ),
            Value::Object(map) => Value::Object(
                map.into_iter()
                    .map(|(k, v)| {
                        let len = path.len();
                        path.push('.');
                        path.push_str(&k);
                        let v = walk(v, seq, path);
                        path.truncate(len);
                        (k, v)
                    })
                    .collect(),
            ),
            other => other,
        }
    }
    walk(value, seq, &mut String::new())
}

/// The marker of the value at `path` in what planned call `seq` returns.
fn marker(seq: u64, path: &str) -> String {
    if path.is_empty() {
        format!("<from planned #{seq}>")
    } else {
        format!("<from planned #{seq} {path}>")
    }
}

/// A marker found in a string: where it is, and the call and path it names.
struct Found<'a> {
    range: std::ops::Range<usize>,
    seq: u64,
    path: &'a str,
}

/// The markers in `text`, in order.
fn markers(text: &str) -> Vec<Found<'_>> {
    const OPEN: &str = "<from planned #";
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(start) = text[from..].find(OPEN).map(|i| i + from) {
        let rest = &text[start + OPEN.len()..];
        let Some(end) = rest.find('>') else { break };
        let inner = &rest[..end];
        let (digits, path) = inner.split_once(' ').unwrap_or((inner, ""));
        match digits.parse::<u64>() {
            Ok(seq) => {
                let stop = start + OPEN.len() + end + 1;
                found.push(Found {
                    range: start..stop,
                    seq,
                    path,
                });
                from = stop;
            }
            Err(_) => from = start + OPEN.len(),
        }
    }
    found
}

/// The value at `path` (`.a[2].b`) in `value`.
fn at_path<'v>(value: &'v Value, path: &str) -> Option<&'v Value> {
    let mut value = value;
    let mut rest = path;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('.') {
            let end = after.find(['.', '[']).unwrap_or(after.len());
            value = value.get(&after[..end])?;
            rest = &after[end..];
        } else if let Some(after) = rest.strip_prefix('[') {
            let end = after.find(']')?;
            value = value.get(after[..end].parse::<usize>().ok()?)?;
            rest = &after[end + 1..];
        } else {
            return None;
        }
    }
    Some(value)
}

/// How a value reads inside a string the script built: a string's text, else its JSON.
fn as_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Whether the actual arguments `actual` are the planned `planned`, with each marker standing
/// for what its call really returned (`results`, by seq).
fn matches(planned: &Value, actual: &Value, results: &HashMap<u64, Value>) -> bool {
    match (planned, actual) {
        (Value::String(p), _) if p.contains("<from planned #") => {
            let found = markers(p);
            let resolve = |f: &Found<'_>| results.get(&f.seq).and_then(|r| at_path(r, f.path));
            // The whole string is one marker: the value itself, of any type.
            if let [one] = found.as_slice() {
                if one.range == (0..p.len()) {
                    return resolve(one).is_some_and(|v| v == actual);
                }
            }
            let Value::String(actual) = actual else {
                return false;
            };
            let mut text = String::with_capacity(p.len());
            let mut last = 0;
            for f in &found {
                let Some(value) = resolve(f) else {
                    return false;
                };
                text.push_str(&p[last..f.range.start]);
                text.push_str(&as_text(value));
                last = f.range.end;
            }
            text.push_str(&p[last..]);
            text == *actual
        }
        (Value::Array(p), Value::Array(a)) => {
            p.len() == a.len() && p.iter().zip(a).all(|(p, a)| matches(p, a, results))
        }
        (Value::Object(p), Value::Object(a)) => {
            p.len() == a.len()
                && p.iter()
                    .all(|(k, pv)| a.get(k).is_some_and(|av| matches(pv, av, results)))
        }
        // Numbers compare as the journal's canonical form does.
        (Value::Number(_), Value::Number(_)) => {
            crate::json::key_json(planned) == crate::json::key_json(actual)
        }
        _ => planned == actual,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn planned_strings_become_markers_naming_call_and_path() {
        let value = mark_unknowns(
            json!({"refund_id": "planned", "items": [{"id": "planned"}], "amount": 7, "note": "planned later"}),
            3,
        );
        assert_eq!(
            value,
            json!({"refund_id": "<from planned #3 .refund_id>", "items": [{"id": "<from planned #3 .items[0].id>"}], "amount": 7, "note": "planned later"})
        );
        assert_eq!(
            mark_unknowns(json!("planned"), 0),
            json!("<from planned #0>")
        );
    }

    #[test]
    fn markers_match_what_their_calls_returned() {
        let results = HashMap::from([
            (
                3,
                json!({"refund_id": "r_91", "n": 4, "items": [{"id": 12}]}),
            ),
            (0, json!("whole")),
        ]);
        let planned = json!({"id": "<from planned #3 .refund_id>", "note": "refund <from planned #3 .refund_id> of <from planned #3 .n>", "item": "<from planned #3 .items[0].id>", "all": "<from planned #0>"});
        let actual = json!({"id": "r_91", "note": "refund r_91 of 4", "item": 12, "all": "whole"});
        assert!(matches(&planned, &actual, &results));
        for wrong in [
            json!({"id": "r_92", "note": "refund r_91 of 4", "item": 12, "all": "whole"}),
            json!({"id": "r_91", "note": "refund r_91 of 5", "item": 12, "all": "whole"}),
            json!({"id": "r_91", "note": "refund r_91 of 4", "item": "12", "all": "whole"}),
            json!({"id": "r_91", "note": "refund r_91 of 4", "item": 12}),
            json!({"id": "r_91", "note": "refund r_91 of 4", "item": 12, "all": "whole", "x": 1}),
        ] {
            assert!(!matches(&planned, &wrong, &results), "{wrong}");
        }
        // A marker of a call that returned nothing there never matches.
        assert!(!matches(
            &json!("<from planned #9 .x>"),
            &json!("<from planned #9 .x>"),
            &results
        ));
        // Text that only looks like a marker is compared as text.
        assert!(matches(
            &json!("<from planned #x>"),
            &json!("<from planned #x>"),
            &results
        ));
        assert!(!matches(&json!({"a": 1.5}), &json!({"a": 1}), &results));
    }

    #[test]
    fn changed_reads_are_those_whose_outcome_differs() {
        let read = |args: &str, sha: &str| PlanRead {
            tool: "get".into(),
            args: args.into(),
            epoch: 0,
            n: 0,
            sha256: sha.into(),
        };
        let then = [
            read("{\"id\":1}", "a"),
            read("{\"id\":2}", "b"),
            read("{\"id\":3}", "c"),
        ];
        let now = [read("{\"id\":1}", "a"), read("{\"id\":2}", "x")];
        assert_eq!(
            changed(&then, &now),
            vec!["`get` {\"id\":2} (after 0 non-read calls)"]
        );
    }
}
