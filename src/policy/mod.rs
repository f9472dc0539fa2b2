//! Result policies: what a run hands back to a model is bounded, and nothing is lost.
//!
//! A run's output — its `value`, `logs`, `error`, `warnings`, `effects`, `pending` call and
//! list of `artifacts` as the model receives them (each as canonical JSON) — stays within
//! `max_inline_tokens`, counted with a real BPE ([`tokens`]); the outcome's fixed part adds at
//! most [`ANSWER_OVERHEAD`]. A text cut to fit is never longer than it was ([`cut`]).
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

mod cut;
mod pages;
mod tokens;

pub(crate) use cut::cut;
pub use pages::{page_of, pages_of, stored_page, ArtifactPage, PageContent, MIN_PAGE_TOKENS};
pub(crate) use tokens::{count, fits};

use pages::{index_of, pages};

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::error::{RunError, Warning};
use crate::json::{key_json, sha256_hex};
use crate::store::{PendingCall, Store, StoredArtifact};

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

/// Tokens a run's outcome takes besides what `max_inline_tokens` covers, at most: its fixed
/// part (`run_id`, `status`, `ok`, `receipts`, the counts of what was left out, and the names
/// of its fields), with every field there and its counts at many digits. An answer of
/// `run_script` or `resume_run` (without `stats`) is within `max_inline_tokens` plus this.
/// Counted a byte a token (a build without the `tokens` feature), the same part is larger.
#[cfg(feature = "tokens")]
pub const ANSWER_OVERHEAD: usize = 150;
/// Tokens a run's outcome takes besides what `max_inline_tokens` covers, at most, counted a
/// byte a token as this build counts (without the `tokens` feature).
#[cfg(not(feature = "tokens"))]
pub const ANSWER_OVERHEAD: usize = 400;

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

/// Tokens the least map standing for a value takes (`{artifact, policy, pages}`), at most.
const LEAST_VALUE: usize = 40;
/// Tokens the least logs take (one line saying where they are), at most.
const LEAST_LOGS: usize = 60;
/// Tokens the least effects take (none shown, and where they are), at most.
const LEAST_EFFECTS: usize = 40;
/// Tokens the least error takes (its kind, `…`, where the rest is), at most.
const LEAST_ERROR: usize = 60;
/// Tokens the least pending call takes (its seq, effect, what it awaits, a cut tool name and
/// the least map standing for its arguments), at most.
const LEAST_PENDING: usize = 80;

/// The effects as the output carries them: those shown, and when some are left out, how many
/// and the artifact holding them all (`effects_left_out`, `effects_artifact`).
fn effects_text_of<E: Serialize>(shown: &[E], artifact: Option<&str>, left_out: usize) -> String {
    let mut text = String::from("[");
    for (i, effect) in shown.iter().enumerate() {
        if i > 0 {
            text.push(',');
        }
        text.push_str(&effect_json(effect));
    }
    text.push(']');
    if let Some(id) = artifact {
        text.push_str(&key_json(
            &json!({"effects_left_out": left_out, "effects_artifact": id}),
        ));
    }
    text
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
    /// The first warnings, as many as fit in their share.
    pub(crate) warnings: Vec<Warning>,
    /// Warnings left out to fit.
    pub(crate) warnings_left_out: usize,
    /// How many of the first effects are shown; the others are left out (and all kept in
    /// `effects_artifact`).
    pub(crate) effects_shown: usize,
    /// The artifact holding every effect, when some were left out.
    pub(crate) effects_artifact: Option<String>,
    /// The pending call, its arguments and tool within their share.
    pub(crate) pending: Option<PendingCall>,
    /// Every artifact the run made.
    pub(crate) artifacts: Vec<Artifact>,
    /// How many of the first artifacts the output lists; each is named where it stands too.
    pub(crate) artifacts_shown: usize,
}

/// What one run's output is made of, before it is bounded.
#[derive(Default)]
pub(crate) struct Parts<'a, E = Value> {
    /// The value, its policy, and the tool whose result it is.
    pub(crate) value: Option<(&'a Value, ResultPolicy, Option<&'a str>)>,
    pub(crate) logs: &'a [String],
    pub(crate) error: Option<RunError>,
    pub(crate) warnings: &'a [Warning],
    /// The effects, each written as its JSON when it is looked at.
    pub(crate) effects: &'a [E],
    pub(crate) pending: Option<&'a PendingCall>,
}

/// One effect's canonical JSON.
fn effect_json<E: Serialize>(effect: &E) -> String {
    serde_json::to_value(effect).map_or_else(|_| "null".to_string(), |v| key_json(&v))
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

/// Tokens a front end may add to an error's message to name the limit the run reached
/// (` (--max-calls)`, ` (max_calls; the server's limit, `max_calls` in its [limits])`), at most:
/// kept free in the error's share.
const NAMING: usize = 40;

/// The tokens of `error` as an output carries it, with room for a front end's name of its
/// limit.
fn error_tokens(error: &RunError) -> usize {
    count(&key_json(&error.to_json())) + if error.limit.is_some() { NAMING } else { 0 }
}

/// The tokens of one entry of the output's list of artifacts, at most: an id and a hash of
/// hex digits, numbers and a policy (measured on a typical entry, with a margin).
fn artifact_entry_tokens() -> usize {
    static TOKENS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *TOKENS.get_or_init(|| {
        let entry = json!({
            "id": "9f86d081884c7d659a2feaa0c55ad015-1039",
            "sha256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
            "bytes": 18_446_744_073_709u64, "tokens": 18_446_744_073_709u64,
            "pages": 18_446_744_073u64, "policy": "compress",
        });
        count(&key_json(&entry)) + 12
    })
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

    /// Bounds the output's parts together within the budget (see docs/results.md):
    ///
    /// - the warnings keep as many of the first as fit in a quarter of it (the others are
    ///   counted, not kept);
    /// - the error, as a whole (kind, message, tool, next action), keeps within half (a failed run has no value), the
    ///   whole of it kept as an artifact when it is cut;
    /// - the pending call of a paused run, within a third: its arguments as a value is, its
    ///   tool's name cut;
    /// - the effects, within a quarter: the first that fit, and all of them as an artifact;
    /// - then, when value and logs do not both fit in what is left (less room for the list of
    ///   artifacts), the logs get the larger of a quarter of it and what the value leaves, and
    ///   the value the rest;
    /// - the list of artifacts, as many of the first as fit in what is left: each is named in
    ///   the place of what it holds too.
    ///
    /// Each share is also held to what the parts after it need at the least, so that the whole
    /// stays within the budget at its smallest.
    pub(crate) fn bound<E: Serialize>(mut self, parts: Parts<'_, E>) -> Result<Bounded, Unbounded> {
        let Parts {
            value,
            logs,
            error,
            warnings,
            effects,
            pending,
        } = parts;
        // A token is at least a byte: output that fits in bytes is not counted.
        let value_text = value.map(|(v, _, _)| key_json(v));
        let logs_text = key_json(&json!(logs));
        // The effects' bytes as far as the budget, one at a time: past it nothing fits whole.
        let mut effects_bytes = 2;
        for effect in effects {
            if effects_bytes > self.budget {
                break;
            }
            effects_bytes += effect_json(effect).len() + 1;
        }
        let pending_text = pending.map(|p| key_json(&json!(p)));
        let error_bytes = error.as_ref().map_or(0, |e| {
            key_json(&e.to_json()).len() + if e.limit.is_some() { NAMING } else { 0 }
        });
        let bytes = value_text.as_ref().map_or(0, String::len)
            + logs_text.len()
            + warnings_text(warnings).len()
            + effects_bytes
            + pending_text.as_ref().map_or(0, String::len)
            + error_bytes;
        if bytes <= self.budget {
            return Ok(Bounded {
                value: value.map(|(v, _, _)| v.clone()),
                logs: logs.to_vec(),
                error,
                warnings: warnings.to_vec(),
                warnings_left_out: 0,
                effects_shown: effects.len(),
                effects_artifact: None,
                pending: pending.cloned(),
                artifacts: Vec::new(),
                artifacts_shown: 0,
            });
        }
        let budget = self.budget;
        let value_tokens = value_text.as_deref().map_or(0, count);
        let logs_tokens = count(&logs_text);
        // What the parts bounded after each one need at the least: a value's map, a line of
        // logs, an effect's artifact, and an entry of the list for each.
        let entry = artifact_entry_tokens();
        let least_value = if value_tokens > 0 {
            LEAST_VALUE + entry
        } else {
            0
        };
        let least_logs = if logs.is_empty() {
            0
        } else {
            LEAST_LOGS + entry
        };
        let least_effects = if effects.is_empty() {
            0
        } else {
            LEAST_EFFECTS + entry
        };
        let least_error = if error.is_some() {
            LEAST_ERROR + entry
        } else {
            0
        };
        let least_pending = if pending.is_some() {
            LEAST_PENDING + entry
        } else {
            0
        };
        let after_warnings = least_error + least_pending + least_effects + least_value + least_logs;
        let kept = bound_warnings(
            warnings,
            (budget / 4).min(budget.saturating_sub(after_warnings)),
        );
        let mut used = count(&warnings_text(&warnings[..kept]));
        let room = |used: usize, after: usize| budget.saturating_sub(used + after);
        // A failed run has no value: its error may take half.
        let error = error.map(|e| {
            let cap = (budget / 2).min(room(
                used,
                least_pending + least_effects + least_value + least_logs,
            ));
            self.bound_error(e, cap)
        });
        used += error.as_ref().map_or(0, error_tokens);
        let pending = match pending {
            None => None,
            Some(p) => {
                let cap = (budget / 3).min(room(used, least_effects + least_value + least_logs));
                Some(self.bound_pending(p, cap)?)
            }
        };
        used += pending.as_ref().map_or(0, |p| count(&key_json(&json!(p))));
        let (effects_shown, effects_artifact) = if effects.is_empty() {
            (0, None)
        } else {
            let cap = (budget / 4).min(room(used, least_value + least_logs));
            self.bound_effects(effects, cap)
        };
        used += count(&effects_text_of(
            &effects[..effects_shown],
            effects_artifact.as_deref(),
            effects.len() - effects_shown,
        ));
        // The list holds the artifacts made so far, and those of the value and the logs if
        // they are cut.
        let made = self.artifacts.len();
        let rest = budget.saturating_sub(used + made * entry);
        let (value_cap, logs_cap) = if value_tokens + logs_tokens <= rest {
            (rest, rest)
        } else {
            let rest = rest.saturating_sub(entry * usize::from(value_tokens > 0));
            let logs_cap = (rest / 4).max(rest.saturating_sub(value_tokens));
            let logs_cap = logs_cap.min(logs_tokens);
            let logs_cut = logs_tokens > logs_cap;
            let rest = rest.saturating_sub(entry * usize::from(logs_cut));
            let logs_cap = logs_cap.min(rest.saturating_sub(least_value.min(rest)));
            (rest - logs_cap, logs_cap)
        };
        let value = match value {
            None => None,
            Some((v, _, _)) if value_tokens <= value_cap => Some(v.clone()),
            Some((v, policy, tool)) => {
                Some(self.bound_value(v, value_tokens, policy, tool, value_cap)?)
            }
        };
        let logs = if logs_tokens <= logs_cap || logs.is_empty() {
            logs.to_vec()
        } else {
            self.bound_logs(logs, logs_cap)
        };
        used += value.as_ref().map_or(0, |v| count(&key_json(v))) + count(&key_json(&json!(logs)));
        // The list: as many of the first entries as fit in what is left.
        let left = budget.saturating_sub(used);
        let mut artifacts_shown = self.artifacts.len();
        while artifacts_shown > 0
            && !fits(&key_json(&json!(self.artifacts[..artifacts_shown])), left)
        {
            artifacts_shown -= 1;
        }
        Ok(Bounded {
            value,
            logs,
            error,
            warnings: warnings[..kept].to_vec(),
            warnings_left_out: warnings.len() - kept,
            effects_shown,
            effects_artifact,
            pending,
            artifacts: self.artifacts,
            artifacts_shown,
        })
    }

    /// The error within `cap`, as a whole: when it does not fit, the whole of it (kind,
    /// message, tool, next action) is kept as an artifact, and each text is cut to its share
    /// of `cap` — the kind and the tool an eighth each, the next action a quarter, the message
    /// the rest — the message saying how long it was and where the rest is.
    fn bound_error(&mut self, mut error: RunError, cap: usize) -> RunError {
        if error_tokens(&error) <= cap {
            return error;
        }
        let whole = error.to_json();
        let kept = self.keep(&whole, None, ResultPolicy::Page, cap);
        let note = |text: &str| {
            format!(
                " ({} characters in all; {})",
                text.chars().count(),
                kept.short()
            )
        };
        let margin = if error.limit.is_some() { NAMING } else { 0 };
        let fields = cap.saturating_sub(margin);
        if let Some(tool) = error.tool.take() {
            error.tool = Some(cut(&tool, fields / 8, ""));
        }
        if let Some(kind) = error.custom_kind.take() {
            error.custom_kind = Some(cut(&kind, fields / 8, "").into());
        }
        if let Some(next) = error.suggested_next_action.take() {
            error.suggested_next_action = Some(cut(&next, fields / 4, &note(&next)));
        }
        // The message gets what the other fields leave: its start, and where the rest is.
        let message = std::mem::take(&mut error.message);
        let mut share = cap.saturating_sub(error_tokens(&error)) + count("\"\"");
        loop {
            error.message = cut(&message, share, &note(&message));
            if error_tokens(&error) <= cap || share == 0 {
                break;
            }
            share -= 1;
        }
        // At the smallest share, the other texts give way too.
        if error_tokens(&error) > cap {
            error.suggested_next_action =
                error.suggested_next_action.take().map(|n| cut(&n, 0, ""));
            error.tool = error.tool.take().map(|t| cut(&t, 0, ""));
        }
        error
    }

    /// A paused run's pending call within `cap`: its arguments bounded as a value (paged or
    /// summarised, the whole kept as an artifact) in what its other fields leave, its tool's
    /// name cut to an eighth.
    fn bound_pending(
        &mut self,
        pending: &PendingCall,
        cap: usize,
    ) -> Result<PendingCall, Unbounded> {
        let mut bounded = pending.clone();
        if fits(&key_json(&json!(bounded)), cap) {
            return Ok(bounded);
        }
        bounded.tool = cut(
            &pending.tool,
            cap / 8,
            &format!(" ({} characters in all)", pending.tool.chars().count()),
        );
        bounded.args = Value::Null;
        let others = count(&key_json(&json!(bounded)));
        let args_tokens = count(&key_json(&pending.args));
        let args_cap = cap.saturating_sub(others);
        if args_tokens > args_cap {
            bounded.args = self.bound_value(
                &pending.args,
                args_tokens,
                ResultPolicy::Auto,
                None,
                args_cap,
            )?;
        } else {
            bounded.args = pending.args.clone();
        }
        Ok(bounded)
    }

    /// How many of the first `effects` fit in `cap` with the fields that say where the others
    /// are, and the artifact holding them all (none when all fit).
    fn bound_effects<E: Serialize>(
        &mut self,
        effects: &[E],
        cap: usize,
    ) -> (usize, Option<String>) {
        // The effects' JSON, one at a time, as far as needed: while it fits in bytes (a token
        // is at least a byte), then counted one by one to twice the cap. The sums estimate
        // the lists' counts (a BPE may merge across a comma), and every answer is the count
        // of the text it stands for; a list over twice the cap by the estimate does not fit.
        let mut texts: Vec<String> = Vec::new();
        let mut bytes = 2;
        for effect in effects {
            if bytes > cap {
                break;
            }
            let text = effect_json(effect);
            bytes += text.len() + 1;
            texts.push(text);
        }
        if texts.len() == effects.len() && bytes <= cap + 1 {
            return (effects.len(), None);
        }
        let mut prefix = vec![1];
        for i in 0..effects.len() {
            let last = prefix[prefix.len() - 1];
            if last > 2 * cap {
                break;
            }
            if i == texts.len() {
                texts.push(effect_json(&effects[i]));
            }
            prefix.push(last + count(&texts[i]) + 1);
        }
        if prefix.len() > effects.len()
            && prefix[effects.len()] <= 2 * cap
            && fits(&format!("[{}]", texts.join(",")), cap)
        {
            return (effects.len(), None);
        }
        // With no store nothing kept could be read back: the effects are only left out.
        let kept = match self.store {
            Some(_) => {
                self.keep(
                    &Value::Array(effects.iter().map(|e| json!(e)).collect()),
                    None,
                    ResultPolicy::Page,
                    cap,
                )
                .id
            }
            None => None,
        };
        let id = kept.clone().unwrap_or_default();
        let fit = |n: usize| {
            let text = effects_text_of(&effects[..n], Some(&id), effects.len() - n);
            fits(&text, cap)
        };
        let tail = count(&effects_text_of::<E>(&[], Some(&id), effects.len()));
        let guess = prefix.iter().rposition(|&t| t + tail <= cap).unwrap_or(0);
        // The most that fit: fitting is monotone in the count. From the guess, a step at a
        // time, doubling, to bounds either side, then halving between them: every text
        // counted is near the cap.
        let (mut lo, mut hi) = (0, effects.len());
        let mut step = 1;
        if fit(guess) {
            lo = guess;
            while lo < hi {
                let probe = (lo + step).min(hi);
                if fit(probe) {
                    lo = probe;
                    step *= 2;
                } else {
                    hi = probe - 1;
                    break;
                }
            }
        } else {
            hi = guess.saturating_sub(1);
            while hi > 0 {
                let probe = hi.saturating_sub(step);
                if fit(probe) {
                    lo = probe;
                    break;
                }
                hi = probe.saturating_sub(1);
                step *= 2;
            }
        }
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if fit(mid) {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        (lo, kept)
    }

    /// The logs within `cap`: the oldest and newest lines, and a line saying where the middle
    /// went.
    fn bound_logs(&mut self, logs: &[String], cap: usize) -> Vec<String> {
        let kept = self.keep(&json!(logs), None, ResultPolicy::Page, cap);
        let (mut head, mut tail) = (logs.len().min(50) / 2, logs.len().min(50) / 2);
        loop {
            let middle = logs.len() - head - tail;
            let mut out: Vec<String> = logs[..head].to_vec();
            out.push(format!(
                "… {middle} more lines of {} ({})",
                logs.len(),
                kept.where_()
            ));
            out.extend_from_slice(&logs[logs.len() - tail..]);
            if head + tail == 0 && !fits(&key_json(&json!(out)), count(&key_json(&json!(logs)))) {
                // A few lines just over a small share: the line saying where they went would
                // be longer than they are. Their start, then, never longer than they were.
                let joined = logs.join("\n");
                return vec![cut(
                    &joined,
                    cap.saturating_sub(2),
                    &format!(" ({})", kept.short()),
                )];
            }
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
                    tool.map_or("a tool's".to_string(), |t| format!("`{}`'s", crate::error::shown_run_id(t))),
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
        if let Some(filled) = filled {
            return Ok(filled);
        }
        // The bare map, or at the smallest what it stands for and its size.
        let bare = Value::Object(bare);
        if fits(&key_json(&bare), cap) {
            return Ok(bare);
        }
        Ok(json!({"artifact": kept.id, "policy": form.as_str(), "pages": kept.pages}))
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
            Some(id) => format!(
                "in artifact {id}, pages 0 to {}: ts_artifact(#{{id, page: N}})",
                self.pages.saturating_sub(1)
            ),
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
        // The id is said once, in `artifact`: an id is some 25 tokens.
        let last = self.pages.saturating_sub(1);
        let rest = match &self.id {
            Some(_) if form == ResultPolicy::Page => format!(
                "page N (0 to {last}) of the artifact: ts_artifact(#{{id, page: N}}) in a script, read_artifact over MCP, `toolscript artifact ID --page N`"
            ),
            Some(_) => format!(
                "the whole value, in pages 0 to {last} of the artifact: ts_artifact(#{{id, page: N}}) in a script, read_artifact over MCP, `toolscript artifact ID [--page N]`"
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

/// The error of reading an artifact the store does not have (or the reader may not see).
pub(crate) fn no_artifact(id: &str) -> crate::error::ToolError {
    crate::error::ToolError::not_found(format!(
        "no artifact `{}` in this store",
        crate::error::shown_run_id(id)
    ))
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
        .ok_or_else(|| no_artifact(id))?;
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

    /// The tokens of everything the budget covers in `b`: value, logs, error (with room for a
    /// limit's name), warnings, the effects shown with the fields saying where the others
    /// are, the pending call, and the artifacts listed.
    fn covered(b: &Bounded, effects: &[Value]) -> usize {
        let json_tokens = |v: &Value| count(&key_json(v));
        b.value.as_ref().map_or(0, json_tokens)
            + json_tokens(&json!(b.logs))
            + b.error.as_ref().map_or(0, error_tokens)
            + count(&warnings_text(&b.warnings))
            + count(&effects_text_of(
                &effects[..b.effects_shown],
                b.effects_artifact.as_deref(),
                effects.len() - b.effects_shown,
            ))
            + b.pending.as_ref().map_or(0, |p| json_tokens(&json!(p)))
            + json_tokens(&json!(b.artifacts[..b.artifacts_shown]))
    }

    fn huge(what: &str) -> String {
        format!("{what} ").repeat(20_000)
    }

    fn warning(i: usize) -> Warning {
        Warning {
            line: Some(i + 1),
            column: Some(3),
            message: format!("the map has no field `f{i}`; the run went on with ()"),
            field: format!("f{i}"),
            fields: (0..20)
                .map(|k| format!("field_{k}_{}", "x".repeat(40)))
                .collect(),
            closest: None,
        }
    }

    /// Bounds `parts` at `budget` with a store in a folder of its own (on the blocking pool,
    /// as the runtime does), and checks what the budget covers against it.
    fn bounded_at(budget: usize, owned: OwnedParts) -> (Bounded, OwnedParts) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.sqlite3");
        rt.block_on(async move {
            tokio::task::spawn_blocking(move || {
                let store = crate::store::SqliteStore::open(&path).unwrap();
                let bounded = Bounder::new(Some(&store), "run", budget)
                    .bound(owned.parts())
                    .unwrap();
                let tokens = covered(&bounded, &owned.effects);
                assert!(
                    tokens <= budget,
                    "{tokens} tokens, over {budget}: {bounded:#?}"
                );
                (bounded, owned)
            })
            .await
            .unwrap()
        })
    }

    /// The parts of an output, owned.
    #[derive(Default)]
    struct OwnedParts {
        value: Option<Value>,
        logs: Vec<String>,
        error: Option<RunError>,
        warnings: Vec<Warning>,
        effects: Vec<Value>,
        pending: Option<PendingCall>,
    }

    impl OwnedParts {
        fn parts(&self) -> Parts<'_> {
            Parts {
                value: self.value.as_ref().map(|v| (v, ResultPolicy::Auto, None)),
                logs: &self.logs,
                error: self.error.clone(),
                warnings: &self.warnings,
                effects: &self.effects,
                pending: self.pending.as_ref(),
            }
        }
    }

    fn effect(i: usize) -> Value {
        json!({"tool": "write_row", "effect": "write", "args": {"row": i, "note": "a row of the table"}, "ok": true})
    }

    #[test]
    fn every_part_of_an_output_counts_at_the_smallest_budget() {
        let big_logs = || {
            (0..3000)
                .map(|i| format!("log line {i}: something happened"))
                .collect::<Vec<_>>()
        };
        let big_value = || {
            json!((0..3000)
                .map(|i| json!({"id": i, "name": format!("user {i}")}))
                .collect::<Vec<_>>())
        };
        let mut failing = RunError::new(crate::error::ErrorKind::Unavailable, huge("the message"));
        failing.suggested_next_action = Some(huge("the next action"));
        failing.tool = Some(huge("tool"));
        let custom =
            crate::error::ToolError::with_kind_name("rate_limited", huge("slow down")).unwrap();
        let limited = RunError::from_tool(
            crate::error::ToolError::limit(
                crate::error::ErrorKind::LimitExceeded,
                huge("too many"),
                crate::error::LimitReached {
                    key: "max_calls",
                    value: 10.0,
                },
            ),
            Some(1),
            Some(1),
        );
        let pending = || {
            let args = json!({"rows": big_value()});
            let tool = huge("charge");
            PendingCall::new(
                3,
                tool,
                crate::effect::Effect::Write,
                args,
                crate::store::Awaiting::Approval,
            )
        };
        let effects = || (0..2000).map(effect).collect::<Vec<_>>();
        let cases: Vec<(&str, OwnedParts)> = vec![
            (
                "a big value and big logs",
                OwnedParts {
                    value: Some(big_value()),
                    logs: big_logs(),
                    ..Default::default()
                },
            ),
            (
                "a huge error, its next action and tool",
                OwnedParts {
                    error: Some(failing.clone()),
                    logs: big_logs(),
                    ..Default::default()
                },
            ),
            (
                "a tool's own kind",
                OwnedParts {
                    error: Some(RunError::from_tool(custom, None, None)),
                    ..Default::default()
                },
            ),
            (
                "a limit a front end names",
                OwnedParts {
                    error: Some(limited),
                    ..Default::default()
                },
            ),
            (
                "2,000 effects",
                OwnedParts {
                    value: Some(big_value()),
                    effects: effects(),
                    ..Default::default()
                },
            ),
            (
                "a huge pending call",
                OwnedParts {
                    pending: Some(pending()),
                    effects: effects(),
                    logs: big_logs(),
                    ..Default::default()
                },
            ),
            (
                "warnings and everything",
                OwnedParts {
                    error: Some(failing),
                    logs: big_logs(),
                    warnings: (0..20).map(warning).collect(),
                    effects: effects(),
                    ..Default::default()
                },
            ),
        ];
        for budget in [MIN_INLINE_TOKENS, 333, 1200] {
            for (name, parts) in &cases {
                let owned = OwnedParts {
                    value: parts.value.clone(),
                    logs: parts.logs.clone(),
                    error: parts.error.clone(),
                    warnings: parts.warnings.clone(),
                    effects: parts.effects.clone(),
                    pending: parts.pending.clone(),
                };
                let (b, owned) = bounded_at(budget, owned);
                eprintln!(
                    "{name} at {budget}: {} tokens; effects {}/{}, artifacts {}/{}",
                    covered(&b, &owned.effects),
                    b.effects_shown,
                    owned.effects.len(),
                    b.artifacts_shown,
                    b.artifacts.len()
                );
                if let Some(e) = &b.error {
                    // The error as a whole: every text of it cut, its kind kept.
                    let shown = key_json(&e.to_json());
                    assert!(shown.len() < 4 * budget, "{name}: {shown}");
                    assert!(
                        e.message.contains("characters in all")
                            || e.message.is_empty()
                            || e.message.ends_with('…'),
                        "{name}: {}",
                        e.message
                    );
                }
                if let Some(p) = &b.pending {
                    assert!(
                        p.args.get("artifact").is_some(),
                        "{name}: the arguments' artifact: {p:?}"
                    );
                    assert_eq!((p.seq, p.awaiting), (3, crate::store::Awaiting::Approval));
                }
                if owned.effects.len() > b.effects_shown {
                    assert!(
                        b.effects_artifact.is_some(),
                        "{name}: where the effects are"
                    );
                }
            }
        }
    }

    /// The fixed part of an outcome, at its largest (counts of many digits, every field
    /// there, hashes of hex digits, which the BPE cuts small), is within the overhead.
    #[test]
    fn the_fixed_part_of_an_outcome_is_within_the_overhead() {
        for seed in 0..64 {
            let head = sha256_hex(format!("head {seed}"));
            let run_id = &sha256_hex(format!("run {seed}"))[..16];
            let fixed = json!({
                "artifacts_left_out": 99_999, "effects_left_out": 99_999_999,
                "warnings_left_out": 99_999, "ok": false, "status": "interrupted",
                "receipts": {"count": 99_999_999, "head": head}, "run_id": run_id,
                "value": null, "logs": null, "effects": null, "effects_artifact": null,
                "error": null, "warnings": null, "pending": null, "artifacts": null,
            });
            let tokens = count(&key_json(&fixed));
            assert!(tokens <= ANSWER_OVERHEAD, "{tokens}: {fixed}");
        }
    }

    /// Reading a page reads its bytes and parses them: nothing is counted, whatever the size
    /// of the artifact. An artifact stored without an index (by an earlier version) is cut
    /// whole when read, counting all of it: what every read did before.
    #[test]
    fn a_page_read_costs_the_page_not_the_whole_value() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _context = rt.enter();
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::SqliteStore::open(&dir.path().join("s.sqlite3")).unwrap();
        let value = json!((0..20_000)
            .map(|i| json!({"id": i, "name": format!("user {i}")}))
            .collect::<Vec<_>>());
        let parts: Parts<'_> = Parts {
            value: Some((&value, ResultPolicy::Page, None)),
            ..Parts::default()
        };
        let bounded = Bounder::new(Some(&store), "r", 200).bound(parts).unwrap();
        let artifact = &bounded.artifacts[0];
        assert!(artifact.pages > 100, "{artifact:?}");
        let counted = || tokens::COUNTED.with(std::cell::Cell::get);
        for n in [
            0,
            1,
            artifact.pages as usize / 2,
            artifact.pages as usize - 1,
        ] {
            let before = counted();
            let page = rt
                .block_on(read_artifact(&store, &artifact.id, Some(n)))
                .unwrap();
            assert_eq!(page["page"], n);
            assert_eq!(counted(), before, "page {n} counted tokens");
        }
        // The same bytes without an index.
        let text = key_json(&value);
        let legacy = StoredArtifact::new(text.clone().into_bytes(), 150, "page", "old");
        rt.block_on(store.put_artifact("legacy", legacy)).unwrap();
        let before = counted();
        rt.block_on(read_artifact(&store, "legacy", Some(3)))
            .unwrap();
        assert!(
            counted() - before >= text.len() / 2,
            "{} of {} bytes counted",
            counted() - before,
            text.len()
        );
    }

    /// Logs cut to a share smaller than the line that says where they went are their start,
    /// never longer than they were; logs cut to a larger share keep their oldest and newest
    /// lines.
    #[test]
    fn cut_logs_are_never_longer_than_the_logs() {
        let logs: Vec<String> = (0..3).map(|i| format!("line {i} of the log")).collect();
        let tokens = count(&key_json(&json!(logs)));
        for cap in [0, 1, 5, tokens / 2, tokens - 1] {
            let out = Bounder::new(None, "r", 200).bound_logs(&logs, cap);
            let cut_tokens = count(&key_json(&json!(out)));
            assert!(
                cut_tokens <= tokens,
                "at {cap}: {out:?} is {cut_tokens}, over {tokens}"
            );
        }
        let many: Vec<String> = (0..500).map(|i| format!("line {i} of the log")).collect();
        let out = Bounder::new(None, "r", 200).bound_logs(&many, 150);
        assert_eq!(out[0], "line 0 of the log");
        assert_eq!(out.last().unwrap(), "line 499 of the log");
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

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 128, failure_persistence: None, ..Default::default() })]

        /// The effects shown are the most that fit with the line saying where the rest are:
        /// whatever their sizes (some alone over the cap, some merging across commas), and
        /// whether or not all of them fit.
        #[test]
        fn the_effects_shown_are_the_most_that_fit(
            sizes in proptest::collection::vec((0usize..400, 0usize..4), 0..300),
            cap in 4usize..3000,
        ) {
            let effects: Vec<Value> = sizes
                .iter()
                .enumerate()
                .map(|(i, &(n, kind))| match kind {
                    0 => json!(i),
                    1 => json!({"tool": "w", "args": {"s": "ab ".repeat(n)}}),
                    2 => json!({"t": "}},{{".repeat(n)}),
                    _ => json!(["é漢🙂".repeat(n / 4)]),
                })
                .collect();
            if effects.is_empty() {
                return Ok(());
            }
            let (n, id) = Bounder::new(None, "run", 0).bound_effects(&effects, cap);
            proptest::prop_assert!(id.is_none());
            let fit = |n: usize| {
                let tail = (n < effects.len()).then_some("");
                fits(&effects_text_of(&effects[..n], tail, effects.len() - n), cap)
            };
            proptest::prop_assert!(n == 0 || fit(n), "{n} shown do not fit in {cap}");
            proptest::prop_assert!(n == effects.len() || !fit(n + 1), "{} would fit in {cap}, {n} shown", n + 1);
        }
    }
}
