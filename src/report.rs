//! The JSON formats a run is reported in, one type each: a run's outcome ([`RunReport`], as
//! `run --json` prints it and the MCP server's `run_script` and `resume_run` answer with it), its
//! [`Stats`], and the list of runs ([`RunListing`], `runs --json` and `list_runs`). The outcome
//! holds types of the layers below: the [`Pending`] call, the [`EffectRecord`]s, the
//! [`RunError`], the [`Artifact`]s.
//!
//! Each type derives `Serialize`, `Deserialize` and `JsonSchema`: what is printed is the type
//! serialised, and the schema the MCP server publishes for it is generated from it
//! (`crate::schema`), so that the two cannot disagree.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::dispatch::EffectRecord;
use crate::error::{Error, ErrorReport, Warning};
use crate::policy::Artifact;
pub use crate::store::Mode;
use crate::store::{PendingCall, RunQuery, RunRecord, RunStatus, RunSummary, Store};

/// Counts and timing of one run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct Stats {
    /// How reads were dispatched.
    pub mode: Mode,
    /// Wall-clock time of the run, in milliseconds.
    #[schemars(range(min = 0))]
    pub wall_ms: f64,
    /// Tool calls the script made, including those answered by an earlier identical read.
    pub tool_calls: u64,
    /// Calls that entered the dispatch path.
    pub dispatched: u64,
    /// Reads started by speculation.
    pub speculative_launched: u64,
    /// Of those, reads the executor claimed.
    pub speculative_claimed: u64,
    /// Of those, reads nobody needed.
    pub speculative_wasted: u64,
    /// Reads the scout met and left to the executor rather than start early: their tool
    /// answers at once, and the executor was running (docs/speculation.md).
    #[serde(default)]
    pub speculative_held: u64,
    /// Reads answered by an identical read earlier in the same epoch.
    pub deduplicated: u64,
    /// Non-read calls the script made.
    pub effectful_calls: u64,
    /// Calls answered by the run's journal (made by an earlier process of the run).
    pub replayed: u64,
    /// Passes of the scout over the script.
    pub scout_passes: u64,
    /// Reads the cache of reads across runs answered (docs/cache.md).
    #[serde(default)]
    pub cache_hits: u64,
    /// Interpreter operations of the executor; not in the JSON output.
    #[serde(skip)]
    pub script_operations: u64,
    /// Interpreter operations of all scout passes; not in the JSON output.
    #[serde(skip)]
    pub scout_operations: u64,
}

/// A run's outcome as JSON: what `toolscript run --json` prints, what the MCP server's
/// `run_script` and `resume_run` answer with (there without `stats` unless asked), and what the
/// store keeps of a run that ended or paused.
///
/// Which of `value`, `error` and `pending` it has follows from `status`: a completed run has its
/// `value`, a failed one its `error`, a paused one its `pending` call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct RunReport {
    /// The run's id: `resume_run` and `toolscript resume` take it.
    pub run_id: String,
    /// Where the run ended, and what it ended with.
    #[serde(flatten)]
    pub end: RunEnd,
    /// Whether the script finished with a value.
    pub ok: bool,
    /// The script's print lines, in order (bounded, like the value, by `max_inline_tokens`).
    pub logs: Vec<String>,
    /// Reads of fields the maps did not have, which the script did not handle (it went on
    /// with `()`): one per place in the script, in the order they first happened. Left out
    /// when there is none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<Warning>,
    /// Places that read a missing field besides those in `warnings` (past the first 20, or
    /// beyond the output's budget). Left out when there is none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub warnings_left_out: usize,
    /// Calls of non-read tools that reached their tool, in order: the first of them, as many
    /// as fit in the output's budget.
    pub effects: Vec<EffectRecord>,
    /// Effects left out of `effects` to keep the output within its budget; `effects_artifact`
    /// holds them all. Left out when there is none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub effects_left_out: usize,
    /// The artifact holding every effect, when some were left out of `effects`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effects_artifact: Option<String>,
    /// Counts and timing; left out of MCP answers unless asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<Stats>,
    /// The run's receipt chain.
    pub receipts: ReceiptChain,
    /// What did not fit in the output, kept in the store: `read_artifact` gives it, page by
    /// page. The first of them, as many as fit in the output's budget (each is named where
    /// it stands in the output too). Left out when there is none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<Artifact>,
    /// Artifacts left out of `artifacts` to keep the output within its budget. Left out when
    /// there is none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub artifacts_left_out: usize,
    /// For a run that applied a plan and ended: the planned calls it never reached. Left out
    /// when there is none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unapplied: Vec<crate::plan::PlannedCall>,
}

/// How a run ended: `status`, with the value, the error or the pending call that goes with it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "status", rename_all = "lowercase")]
#[non_exhaustive]
pub enum RunEnd {
    /// The script finished with a value.
    Completed {
        /// The script's value, any JSON (in its bounded form when it was too large).
        value: Value,
    },
    /// The script ended with an error.
    Failed {
        /// What ended the script.
        error: ErrorReport,
    },
    /// The run waits at a call for a person's decision: `resume_run` goes on with it.
    Paused {
        /// The call it waits at.
        pending: PendingCall,
    },
    /// The run stopped before its end for a reason that is not the script's (its store could
    /// not be written): `resume_run` goes on with it, and the error says whether its last
    /// call was made.
    Interrupted {
        /// What stopped it.
        error: ErrorReport,
    },
}

/// A run's receipt chain in brief: its last hash and its length.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct ReceiptChain {
    /// The hash of the last receipt; null when the run made no call.
    pub head: Option<String>,
    /// How many receipts the run wrote.
    pub count: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl RunReport {
    /// The report as a JSON value.
    pub fn to_json(&self) -> Value {
        // Maps with string keys, strings, numbers and booleans always serialise: the `Null` is
        // never reached.
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// The listing of a run's lease while it runs.
fn running_lease(
    status: RunStatus,
    lease: Option<&crate::store::Lease>,
) -> Option<crate::store::LeaseListing> {
    lease
        .filter(|_| status == RunStatus::Running)
        .map(crate::store::LeaseListing::of)
}

/// One run in the store's list of runs, as `toolscript runs --json` and the MCP server's
/// `list_runs` show it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct RunListing {
    /// The run's id.
    pub run_id: String,
    /// Where the run is.
    pub status: RunStatus,
    /// When it started, as a UTC date and time (`2026-12-01T11:37:06Z`).
    pub started: String,
    /// The script's name (its file, or `-`).
    pub script: String,
    /// How the run dispatches its reads.
    pub mode: Mode,
    /// The call a paused run waits at; null for any other run.
    pub pending: Option<PendingCall>,
    /// A running run's lease: who holds it, until when, and whether it still holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<crate::store::LeaseListing>,
}

impl RunListing {
    /// The listing of `record`.
    pub fn of(record: &RunRecord) -> RunListing {
        RunListing {
            run_id: record.run_id.clone(),
            status: record.status,
            started: record.started(),
            script: record.script_name.clone(),
            mode: record.mode,
            pending: record.pending.clone(),
            lease: running_lease(record.status, record.lease.as_ref()),
        }
    }

    /// The listing of a run as a list of runs reads it.
    pub fn of_summary(summary: &RunSummary) -> RunListing {
        RunListing {
            run_id: summary.run_id.clone(),
            status: summary.status,
            started: summary.started(),
            script: summary.script_name.clone(),
            mode: summary.mode,
            pending: summary.pending.clone(),
            lease: running_lease(summary.status, summary.lease.as_ref()),
        }
    }

    /// A page of the runs of `store`, newest first, and the cursor of the next page, if any.
    ///
    /// # Errors
    ///
    /// [`Error::Store`] when the store fails, the cursor is not one a page gave, or a record
    /// is damaged (the store reads a record that does not parse as an error, never as a
    /// default).
    pub async fn page(
        store: &dyn Store,
        query: RunQuery,
    ) -> Result<(Vec<RunListing>, Option<String>), Error> {
        let page = store.list_runs(query).await?;
        let runs = page.runs.iter().map(RunListing::of_summary).collect();
        Ok((runs, page.next))
    }

    /// Every run of `store`, newest first, read a page at a time.
    ///
    /// # Errors
    ///
    /// As [`RunListing::page`].
    pub async fn all(store: &dyn Store) -> Result<Vec<RunListing>, Error> {
        let mut all = Vec::new();
        let mut query = RunQuery::first(1000);
        loop {
            let (runs, next) = RunListing::page(store, query.clone()).await?;
            all.extend(runs);
            match next {
                Some(cursor) => query = query.after(Some(cursor)),
                None => return Ok(all),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// The schema of a run's outcome: every part inline, and each way a run ends says which
    /// field it has.
    #[test]
    fn the_outcome_schema_ties_each_status_to_its_field() {
        let schema = Value::Object(crate::schema::output::<RunReport>());
        let text = schema.to_string();
        assert!(
            !text.contains("$ref") && !text.contains("$defs"),
            "{schema:#}"
        );
        let validator = jsonschema::validator_for(&schema).expect("compiles");
        let base = json!({"run_id": "r", "ok": true, "logs": [], "effects": [],
                          "receipts": {"head": null, "count": 0}});
        let with = |extra: Value| {
            let mut out = base.clone();
            out.as_object_mut()
                .expect("an object")
                .extend(extra.as_object().expect("an object").clone());
            out
        };
        assert!(validator.is_valid(&with(json!({"status": "completed", "value": 1}))));
        assert!(!validator.is_valid(&with(json!({"status": "completed"}))));
        assert!(!validator.is_valid(&with(json!({"status": "failed", "value": 1}))));
        assert!(!validator.is_valid(&with(json!({"status": "running", "value": 1}))));
        assert!(!validator.is_valid(&base));
    }
}
