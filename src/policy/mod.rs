//! Result policies: what a run hands back to a model is bounded, and nothing is lost.
//!
//! A run's output — its `value`, `logs` and `error` as the model receives them (each as
//! canonical JSON) — stays within `max_inline_tokens`, counted with a real BPE ([`tokens`]).
//! What does not fit becomes an **artifact**: its canonical JSON stored byte-exact in the run's
//! store, content-addressed by SHA-256, and replaced in the output by a small map that says what
//! it is and how to get the rest:
//!
//! - `page`: the first page, the page count and the artifact id. Arrays are paged by their
//!   items, maps by their entries, strings by their lines, anything else as the text of its
//!   canonical JSON (see [`pages`]); every page is within the page budget and, but the last, at
//!   least a quarter of it, and the pages together are the whole value.
//! - `compress`: a deterministic structural summary (see [`summary`]) and the artifact id.
//! - `exact`: as `auto`, but nothing is replaced until the stored copy has been read back and
//!   its hash checked; without a store the run fails rather than lose the value.
//! - `inline`: the value may enter whole; over the budget the run fails with `limit_exceeded`.
//! - `auto`: `page` for arrays and text, `compress` for everything else.

mod pages;
mod tokens;

pub use pages::{page_of, pages_of, stored_page, ArtifactPage, PageContent, MIN_PAGE_TOKENS};
pub(crate) use tokens::{count, fits};

use pages::{index_of, pages};

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::error::{RunError, Warning};
use crate::json::{key_json, sha256_hex};
use crate::store::{Store, StoredArtifact};

/// What happens to a result that does not fit in a run's output.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum ResultPolicy {
    /// `page` for arrays and long text, `compress` for deep structures.
    #[default]
    Auto,
    /// Enters the output whole; a run whose output would exceed the budget fails.
    Inline,
    /// The first page inline; the rest in an artifact, page by page.
    Page,
    /// A deterministic summary inline; the original in an artifact.
    Compress,
    /// Replaced only once a byte-exact copy is stored and verified.
    Exact,
}

impl ResultPolicy {
    /// The policy's name, as manifests and JSON spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            ResultPolicy::Auto => "auto",
            ResultPolicy::Inline => "inline",
            ResultPolicy::Page => "page",
            ResultPolicy::Compress => "compress",
            ResultPolicy::Exact => "exact",
        }
    }
}

/// The smallest inline budget: what the map that stands for an artifact needs, with room.
pub const MIN_INLINE_TOKENS: usize = 200;

/// Tokens the map standing for an artifact takes besides its page or summary, at most.
const ENVELOPE: usize = 160;

/// The page budget of an artifact made by a run whose output has `budget` tokens, where the
/// map standing for it may take `cap` of them: what `cap` leaves besides the map's own fields,
/// so that the first page can be shown in it, but never less than half the budget nor than
/// [`MIN_PAGE_TOKENS`]. The pages are read one at a time, each an answer of its own: a share of
/// the output cut small (the logs' quarter, the error's third) would cut them into slivers.
fn page_budget(budget: usize, cap: usize) -> usize {
    cap.saturating_sub(ENVELOPE)
        .max(budget / 2)
        .max(MIN_PAGE_TOKENS)
}

/// An artifact a run made, as `run --json` lists it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Artifact {
    /// Its id: the first 32 hex digits of the SHA-256 of its bytes.
    pub id: String,
    /// SHA-256 of its bytes, as `toolscript artifact ID` prints them.
    pub sha256: String,
    /// Its size.
    pub bytes: u64,
    /// Its tokens.
    pub tokens: u64,
    /// Its pages.
    pub pages: u64,
    /// The policy that made it.
    pub policy: ResultPolicy,
}

/// A run's output, bounded.
#[derive(Clone, Debug, Default)]
pub(crate) struct Bounded {
    pub(crate) value: Option<Value>,
    pub(crate) logs: Vec<String>,
    pub(crate) error: Option<RunError>,
    /// The first warnings, as many as fit in a quarter of the budget.
    pub(crate) warnings: Vec<Warning>,
    /// Warnings left out to fit.
    pub(crate) warnings_left_out: usize,
    pub(crate) artifacts: Vec<Artifact>,
}

/// The warnings as the output carries them.
fn warnings_text(warnings: &[Warning]) -> String {
    if warnings.is_empty() {
        return String::new();
    }
    serde_json::to_value(warnings).map_or_else(|_| String::new(), |v| key_json(&v))
}

/// How many of the first `warnings` fit in `cap` tokens.
fn bound_warnings(warnings: &[Warning], cap: usize) -> usize {
    let mut kept = warnings.len();
    while kept > 0 && !fits(&warnings_text(&warnings[..kept]), cap) {
        kept -= 1;
    }
    kept
}

/// Why a run's output cannot be bounded: the run fails with `limit_exceeded` and this message.
#[derive(Debug)]
pub(crate) struct Unbounded(pub(crate) String);

/// Bounds one run's output. Keeping an artifact waits for the store: a bounder runs off the
/// async workers (the runtime runs it on the blocking pool).
pub(crate) struct Bounder<'a> {
    pub(crate) store: Option<&'a dyn Store>,
    pub(crate) run_id: &'a str,
    pub(crate) budget: usize,
    artifacts: Vec<Artifact>,
}

impl<'a> Bounder<'a> {
    pub(crate) fn new(store: Option<&'a dyn Store>, run_id: &'a str, budget: usize) -> Bounder<'a> {
        Bounder {
            store,
            run_id,
            budget: budget.max(MIN_INLINE_TOKENS),
            artifacts: Vec::new(),
        }
    }

    /// Bounds `value` (with `policy`, and `tool` when it is that tool's result), `logs`,
    /// `error` and `warnings` together within the budget. The warnings keep as many of the
    /// first as fit in a quarter of the budget (the others are counted, not kept). The error
    /// keeps its kind and at least the start of its message, within a quarter of the budget;
    /// then, when value and logs do not both fit, the logs get the larger of a quarter of what
    /// is left and what the value leaves, and the value the rest.
    pub(crate) fn bound(
        mut self,
        value: Option<(&Value, ResultPolicy, Option<&str>)>,
        logs: &[String],
        error: Option<RunError>,
        warnings: &[Warning],
    ) -> Result<Bounded, Unbounded> {
        // A token is at least a byte: output that fits in bytes is not counted.
        let value_text = value.map(|(v, _, _)| key_json(v));
        let logs_value = json!(logs);
        let logs_text = key_json(&logs_value);
        let warnings_bytes = warnings_text(warnings).len();
        let bytes = value_text.as_ref().map_or(0, String::len)
            + logs_text.len()
            + warnings_bytes
            + error.as_ref().map_or(0, |e| key_json(&e.to_json()).len());
        if bytes <= self.budget {
            return Ok(Bounded {
                value: value.map(|(v, _, _)| v.clone()),
                logs: logs.to_vec(),
                error,
                warnings: warnings.to_vec(),
                warnings_left_out: 0,
                artifacts: Vec::new(),
            });
        }
        let kept = bound_warnings(warnings, self.budget / 4);
        let warnings_used = count(&warnings_text(&warnings[..kept]));
        let error = error.map(|e| self.bound_error(e));
        let used = error.as_ref().map_or(0, |e| count(&key_json(&e.to_json()))) + warnings_used;
        let rest = self.budget.saturating_sub(used);
        let value_tokens = value_text.as_deref().map_or(0, count);
        let logs_tokens = count(&logs_text);
        let (value_cap, logs_cap) = if value_tokens + logs_tokens <= rest {
            (rest, rest)
        } else {
            let logs_cap = (rest / 4).max(rest.saturating_sub(value_tokens));
            let logs_cap = logs_cap.min(logs_tokens);
            (rest - logs_cap, logs_cap)
        };
        let value = match value {
            None => None,
            Some((v, _, _)) if value_tokens <= value_cap => Some(v.clone()),
            Some((v, policy, tool)) => {
                Some(self.bound_value(v, value_tokens, policy, tool, value_cap)?)
            }
        };
        let logs = if logs_tokens <= logs_cap {
            logs.to_vec()
        } else {
            self.bound_logs(logs, logs_cap)
        };
        Ok(Bounded {
            value,
            logs,
            error,
            warnings: warnings[..kept].to_vec(),
            warnings_left_out: warnings.len() - kept,
            artifacts: self.artifacts,
        })
    }

    /// The error, its message cut to fit a quarter of the budget (the whole message kept as
    /// an artifact).
    fn bound_error(&mut self, mut error: RunError) -> RunError {
        let cap = self.budget / 3;
        if fits(&key_json(&error.to_json()), cap) {
            return error;
        }
        let message = std::mem::take(&mut error.message);
        let kept = self.keep(&json!(message), None, ResultPolicy::Page, cap);
        let mut head: String = message.chars().take(cap).collect();
        loop {
            error.message = format!(
                "{head} … ({} characters in all; {})",
                message.chars().count(),
                kept.short()
            );
            if fits(&key_json(&error.to_json()), cap) || head.is_empty() {
                return error;
            }
            let keep = head.chars().count() * 3 / 4;
            head = head.chars().take(keep).collect();
        }
    }

    /// The logs within `cap`: the oldest and newest lines, and a line saying where the middle
    /// went.
    fn bound_logs(&mut self, logs: &[String], cap: usize) -> Vec<String> {
        let kept = self.keep(&json!(logs), None, ResultPolicy::Page, cap);
        let (mut head, mut tail) = (logs.len().min(50) / 2, logs.len().min(50) / 2);
        loop {
            let cut = logs.len() - head - tail;
            let mut out: Vec<String> = logs[..head].to_vec();
            out.push(format!(
                "… {cut} more lines of {} ({})",
                logs.len(),
                kept.where_()
            ));
            out.extend_from_slice(&logs[logs.len() - tail..]);
            if fits(&key_json(&json!(out)), cap) || head + tail == 0 {
                return out;
            }
            head /= 2;
            tail /= 2;
        }
    }

    /// One value over `cap`, by its policy.
    fn bound_value(
        &mut self,
        value: &Value,
        tokens: usize,
        policy: ResultPolicy,
        tool: Option<&str>,
        cap: usize,
    ) -> Result<Value, Unbounded> {
        let form = match policy {
            ResultPolicy::Inline => {
                return Err(Unbounded(format!(
                    "the run's value is {} result, whose policy is `inline`, and it is {tokens} tokens: over the run's max_inline_tokens of {} (with its logs and error); return less of it, or give the tool another result policy",
                    tool.map_or("a tool's".to_string(), |t| format!("`{t}`'s")),
                    self.budget
                )))
            }
            ResultPolicy::Exact if self.store.is_none() => {
                return Err(Unbounded(format!(
                    "the run's value is {tokens} tokens, over max_inline_tokens ({}), and its policy is `exact`: with no store it cannot be kept, so it is not replaced",
                    self.budget
                )))
            }
            ResultPolicy::Page => ResultPolicy::Page,
            ResultPolicy::Compress => ResultPolicy::Compress,
            ResultPolicy::Auto | ResultPolicy::Exact => match value {
                Value::Array(_) | Value::String(_) => ResultPolicy::Page,
                _ => ResultPolicy::Compress,
            },
        };
        let kept = self.keep(value, Some(tokens), policy_or(policy, form), cap);
        if policy == ResultPolicy::Exact && !kept.verified {
            return Err(Unbounded(format!(
                "the run's value is {tokens} tokens, over max_inline_tokens ({}), and its policy is `exact`, but its copy could not be stored and verified",
                self.budget
            )));
        }
        let bare = kept.envelope(form, tokens);
        let with = |fields: Vec<(&str, Value)>| {
            let mut envelope = bare.clone();
            envelope.extend(fields.into_iter().map(|(k, v)| (k.to_string(), v)));
            Value::Object(envelope)
        };
        // The first page, or the most detailed summary, that fits with the map around it.
        let filled = match form {
            ResultPolicy::Page => kept.first.clone().and_then(|first| {
                let field = first.field();
                let page = with(vec![("page", json!(0)), (field, first.into_value())]);
                fits(&key_json(&page), cap).then_some(page)
            }),
            _ => summaries(value)
                .map(|summary| with(vec![("summary", summary)]))
                .find(|envelope| fits(&key_json(envelope), cap)),
        };
        Ok(filled.unwrap_or(Value::Object(bare)))
    }

    /// Stores `value` (of `tokens`, when they are counted already) as an artifact (once per
    /// run), paged for `cap` (see [`page_budget`]). The page budget is part of the artifact's
    /// id (`HASH-PAGE_TOKENS`): the same bytes made by a run with another budget are another
    /// artifact, cut for that run. The pages are cut once, here, and their places stored with
    /// the bytes; the count and first page announced are those of the stored row, which
    /// readers get.
    fn keep(
        &mut self,
        value: &Value,
        tokens: Option<usize>,
        policy: ResultPolicy,
        cap: usize,
    ) -> Kept {
        let text = key_json(value);
        let sha256 = sha256_hex(&text);
        let page_tokens = page_budget(self.budget, cap);
        // The hash's first half, shorter in the output, and the page budget.
        let id = format!("{}-{page_tokens}", &sha256[..32]);
        let all = pages(value, page_tokens);
        let Some(store) = self.store else {
            return Kept {
                id: None,
                pages: all.len() as u64,
                first: all.into_iter().next(),
                bytes: text.len() as u64,
                verified: false,
            };
        };
        let index = index_of(&all, &text);
        let mut artifact = StoredArtifact::new(
            text.as_bytes().to_vec(),
            page_tokens,
            policy.as_str(),
            self.run_id,
        );
        if let Some(index) = index.clone() {
            artifact = artifact.with_index(index);
        }
        let stored = futures::executor::block_on(async {
            store.put_artifact(&id, artifact).await?;
            store.artifact(&id).await
        });
        let verified = matches!(&stored, Ok(Some(a)) if sha256_hex(&a.content) == sha256);
        let (pages, first) = match &stored {
            // Another build (another token counter) stored these bytes for this budget
            // first: its pages are the ones read.
            Ok(Some(a)) if verified && a.index.is_some() && a.index != index => {
                let first = a.index.as_ref().and_then(|i| {
                    let range = i.ranges.first()?;
                    let mut one = a.clone();
                    one.content = a.content[range.start as usize..range.end as usize].to_vec();
                    stored_page(&one, 0).ok()
                });
                let count = a.index.as_ref().map_or(0, |i| i.ranges.len());
                (count as u64, first.map(|p| p.content))
            }
            _ => (all.len() as u64, all.into_iter().next()),
        };
        if let Err(e) = &stored {
            tracing::error!(error = %e, "an artifact could not be stored");
        }
        if verified && !self.artifacts.iter().any(|a| a.id == id) {
            self.artifacts.push(Artifact {
                id: id.clone(),
                sha256: sha256.clone(),
                bytes: text.len() as u64,
                tokens: tokens.unwrap_or_else(|| count(&text)) as u64,
                pages,
                policy,
            });
        }
        Kept {
            id: verified.then_some(id),
            pages,
            first,
            bytes: text.len() as u64,
            verified,
        }
    }
}

fn policy_or(policy: ResultPolicy, form: ResultPolicy) -> ResultPolicy {
    match policy {
        ResultPolicy::Auto | ResultPolicy::Inline => form,
        other => other,
    }
}

/// What [`Bounder::keep`] did with a value.
struct Kept {
    /// The artifact's id; `None` when nothing was kept (no store, or the store failed).
    id: Option<String>,
    pages: u64,
    /// The first page.
    first: Option<PageContent>,
    bytes: u64,
    verified: bool,
}

impl Kept {
    /// Where the rest is, in few words.
    fn short(&self) -> String {
        match &self.id {
            Some(id) => format!("artifact {id}"),
            None => "the rest was not kept".to_string(),
        }
    }

    /// Where the rest is, for a person or a model.
    fn where_(&self) -> String {
        match &self.id {
            Some(id) => format!("in artifact {id}: ts_artifact(#{{id: \"{id}\"}})"),
            None => "not kept: the run has no store".to_string(),
        }
    }

    fn envelope(&self, form: ResultPolicy, tokens: usize) -> Map<String, Value> {
        let mut map = Map::new();
        map.insert("artifact".into(), json!(self.id));
        map.insert("policy".into(), json!(form.as_str()));
        map.insert("bytes".into(), json!(self.bytes));
        map.insert("tokens".into(), json!(tokens));
        map.insert("pages".into(), json!(self.pages));
        let rest = match &self.id {
            Some(id) if form == ResultPolicy::Page => format!(
                "page N of {}: ts_artifact(#{{id: \"{id}\", page: N}}) in a script, or `toolscript artifact {id} --page N`",
                self.pages
            ),
            Some(id) => format!(
                "the whole value: ts_artifact(#{{id: \"{id}\"}}) in a script, or `toolscript artifact {id}`"
            ),
            None => "the rest was not kept: the run has no store".to_string(),
        };
        map.insert("rest".into(), json!(rest));
        map
    }
}

/// Summaries of a value, from the most detailed to the least: long strings become their head,
/// length and hash; long arrays their first items and count; maps past a depth their keys.
fn summaries(value: &Value) -> impl Iterator<Item = Value> + '_ {
    [(8, 200, 4), (4, 80, 3), (2, 40, 2), (1, 16, 1), (0, 0, 0)]
        .into_iter()
        .map(move |(items, chars, depth)| summary(value, items, chars, depth))
}

/// The summary of `value` showing at most `items` items (and `4 * items` keys) of each array
/// (map), `chars` characters of each string, to `depth` levels:
/// - a longer string: `{"head": FIRST_CHARS, "chars": N, "sha256": HASH}`;
/// - a longer array: `{"first": [SUMMARIES], "count": N}`;
/// - a map with more keys: its first keys summarised, and `"…": "N keys in all"`;
/// - below `depth`: an array is `{"count": N}`, a map `{"keys": [FIRST_KEYS], "count": N}`
///   (`{"count": N}` when no item is shown).
pub(crate) fn summary(value: &Value, items: usize, chars: usize, depth: usize) -> Value {
    match value {
        Value::String(s) if s.chars().count() > chars => json!({
            "head": s.chars().take(chars).collect::<String>(),
            "chars": s.chars().count(),
            "sha256": sha256_hex(s),
        }),
        Value::Array(a) if depth == 0 => json!({ "count": a.len() }),
        Value::Array(a) => {
            let shown: Vec<Value> = a
                .iter()
                .take(items)
                .map(|v| summary(v, items, chars, depth - 1))
                .collect();
            if a.len() > items {
                json!({ "first": shown, "count": a.len() })
            } else {
                Value::Array(shown)
            }
        }
        Value::Object(m) if depth == 0 && items == 0 => json!({ "count": m.len() }),
        Value::Object(m) if depth == 0 => json!({
            "keys": m.keys().take(items * 4).collect::<Vec<_>>(),
            "count": m.len(),
        }),
        Value::Object(m) => {
            let mut out: Map<String, Value> = m
                .iter()
                .take(items * 4)
                .map(|(k, v)| (k.clone(), summary(v, items, chars, depth - 1)))
                .collect();
            if m.len() > items * 4 {
                out.insert("…".into(), json!(format!("{} keys in all", m.len())));
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

/// The name of the runtime's own tool that reads artifacts.
pub(crate) const ARTIFACT_TOOL: &str = "ts_artifact";

/// The schema of [`ArtifactArgs`], the arguments of `ts_artifact` and of the MCP server's
/// `read_artifact`.
pub(crate) fn artifact_args_schema() -> Value {
    Value::Object(crate::schema::input::<ArtifactArgs>())
}

/// Page `page` of an artifact of `store` (page 0 when none is asked: an answer is never the
/// whole of something too large for an answer), as `{page, pages, items | entries | text |
/// json}`. A page's bytes are read and parsed, nothing more.
///
/// # Errors
///
/// `not_found` for an unknown id or page; `internal` when the store fails or the page does
/// not parse.
pub(crate) async fn read_artifact(
    store: &dyn Store,
    id: &str,
    page: Option<usize>,
) -> Result<Value, crate::error::ToolError> {
    use crate::error::ToolError;
    let n = page.unwrap_or(0);
    let artifact = store
        .artifact_page(id, n)
        .await
        .map_err(|e| ToolError::internal(e.report()))?
        .ok_or_else(|| {
            ToolError::not_found(format!(
                "no artifact `{}` in this store",
                crate::error::shown_run_id(id)
            ))
        })?;
    let page = stored_page(&artifact, n).map_err(ToolError::not_found)?;
    serde_json::to_value(page)
        .map_err(|e| ToolError::internal(format!("the page does not serialise: {e}")))
}

/// The arguments of `ts_artifact` and of the MCP server's `read_artifact`: an id and a page.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ArtifactArgs {
    /// The artifact's id.
    pub(crate) id: String,
    /// A page, from 0.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "whole_page"
    )]
    #[schemars(with = "usize")]
    pub(crate) page: Option<usize>,
}

/// A page number: a whole number from 0, written as one. JSON Schema's `integer` takes `2.0`
/// and `1e30`, which are not page numbers: they are refused here, saying so.
fn whole_page<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    use serde::de::Error as _;
    let page = Value::deserialize(d)?;
    let refused = |what: String| {
        D::Error::custom(format!(
            "`page` must be a whole number from 0, written without a point or exponent (like 2); {what}"
        ))
    };
    match &page {
        Value::Null => Ok(None),
        Value::Number(n) => match n.as_u64().map(usize::try_from) {
            Some(Ok(n)) => Ok(Some(n)),
            Some(Err(_)) => Err(refused(format!("{n} is too large"))),
            None => Err(refused(format!("{n} is not one"))),
        },
        Value::String(_) => Err(refused("it is a string".into())),
        Value::Bool(_) => Err(refused("it is a boolean".into())),
        Value::Array(_) => Err(refused("it is an array".into())),
        Value::Object(_) => Err(refused("it is a map".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ts_artifact`'s schema is part of the catalog hash a paused run resumes under: it is the
    /// schema the runtime published before the schemas were generated, so that runs paused
    /// then still resume.
    #[test]
    fn ts_artifact_publishes_the_schema_paused_runs_were_hashed_with() {
        assert_eq!(
            artifact_args_schema(),
            json!({
                "type": "object",
                "properties": {
                    "id": {"type": "string", "description": "The artifact's id."},
                    "page": {"type": "integer", "minimum": 0, "description": "A page, from 0."}
                },
                "required": ["id"],
                "additionalProperties": false
            })
        );
    }

    #[test]
    fn summaries_shrink_to_nothing_but_counts() {
        let deep = json!({"a": {"b": {"c": {"d": {"e": [1, 2, 3]}}}}, "s": "x".repeat(500)});
        let last = summaries(&deep).last().unwrap();
        assert_eq!(last, json!({"count": 2}));
        let keys = summary(&deep, 1, 16, 0);
        assert_eq!(keys, json!({"keys": ["a", "s"], "count": 2}));
        let first = summaries(&deep).next().unwrap();
        assert_eq!(first["s"]["chars"], 500);
    }
}
