//! The records a store keeps of a run, typed: its mode, its status, the call it paused at. A
//! backend keeps each as text (the names below, or JSON) and reads it back through
//! [`RunRecord::parse_field`], so that a record that does not parse is an error naming the run
//! and the field, never a default.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::catalog::CatalogPrint;
use crate::effect::Effect;

/// How a run dispatches its reads.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Mode {
    /// The executor alone: every call blocks the script until its result is there.
    Sequential,
    /// The executor, plus the scout starting reads early and in parallel.
    #[default]
    Speculative,
}

impl Mode {
    /// `Sequential` when `sequential` is set (a `--sequential` flag, a request's option), else
    /// `Speculative`.
    pub fn sequential_if(sequential: bool) -> Mode {
        if sequential {
            Mode::Sequential
        } else {
            Mode::Speculative
        }
    }

    /// The mode's name, as in `stats.mode` and in the store.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Sequential => "sequential",
            Mode::Speculative => "speculative",
        }
    }
}

/// What a paused run waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Awaiting {
    /// A person's approval of a call of a tool that needs one.
    Approval,
    /// A person's word on a call whose outcome was lost (the process died while it ran):
    /// `done` (it took effect) or `retry` (make it again).
    Resolve,
    /// A person's approval of a call that an applied plan did not plan (another tool, other
    /// arguments, a call past the plan's end): `approve` makes it, `reject` throws.
    #[serde(rename = "plan_divergence")]
    PlanDivergence,
}

impl Awaiting {
    /// Its name, as in JSON and the store.
    pub fn as_str(self) -> &'static str {
        match self {
            Awaiting::Approval => "approval",
            Awaiting::Resolve => "resolve",
            Awaiting::PlanDivergence => "plan_divergence",
        }
    }
}

/// Where a run is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum RunStatus {
    /// A process is running it, or died while it ran (then `resume` goes on with it).
    Running,
    /// It waits for a person's decision on its pending call.
    Paused,
    /// The script finished with a value.
    Completed,
    /// The script finished with an error.
    Failed,
    /// Its process stopped it before its end, for a reason that is not the script's: the
    /// store could not be written, or its caller went away (a dropped run future, a client
    /// that disconnected). Nothing is lost: `resume` goes on with it.
    Interrupted,
}

impl RunStatus {
    /// The status as the store and `run --json` spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Paused => "paused",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Interrupted => "interrupted",
        }
    }

    /// Whether the run has ended: nothing is left to resume.
    pub fn is_final(self) -> bool {
        matches!(self, RunStatus::Completed | RunStatus::Failed)
    }
}

/// Where one of the script's reads is in its run: what a read's pause is keyed by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct ReadAt {
    /// The non-read calls completed before it.
    pub epoch: u64,
    /// Which occurrence of the same read (tool and arguments) in its epoch, from 0.
    pub occurrence: u64,
}

impl ReadAt {
    /// The `occurrence`th read of its kind in `epoch`.
    pub fn new(epoch: u64, occurrence: u64) -> ReadAt {
        ReadAt { epoch, occurrence }
    }
}

/// The call a paused run waits at, as the store keeps it (JSON: `{seq, tool, effect, args,
/// awaiting}`, and for a call awaiting `resolve`, `uncertain` and its `why`; for a call the
/// guard asks about, `rule` and `reason`; for a read, `read`: the shape `run --json` prints
/// as `pending`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct PendingCall {
    /// Its position among the script's non-read calls: the journal's key of the call. (For a
    /// read, the non-read calls before it: its epoch.)
    pub seq: u64,
    /// The tool.
    pub tool: String,
    /// The tool's effect (a read waits only for a person the guard asks).
    pub effect: Effect,
    /// The call's arguments.
    pub args: Value,
    /// What it waits for.
    pub awaiting: Awaiting,
    /// For a call awaiting `resolve`: whether it might still be running, because the process
    /// that made it is gone but a process it may have reached (an MCP server, or what that
    /// server started) still runs or cannot be checked. `false`: every such process has ended,
    /// so what a person sees now will not change. (`None`: awaiting approval, or paused by a
    /// version that did not say.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uncertain: Option<bool>,
    /// Why the call might still be running, when it might.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// For a call the guard asks a person about: the rule that asks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// Why the rule asks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// For one of the script's reads (the guard asked about it): where it is in the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read: Option<ReadAt>,
    /// The call's arguments as the journal keeps them, when that is not their canonical JSON:
    /// a keyed digest (`hmac:…`) of arguments that hold a secret or a redacted value, which
    /// `args` shows masked. A decision is journaled against it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub journal_args: Option<String>,
    /// For a call awaiting `plan_divergence`: the planned call the applied plan expected
    /// there, or `null` when it had no more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planned: Option<Value>,
}

impl PendingCall {
    /// The call `seq` of `tool` (whose effect is `effect`) with `args`, waiting for `awaiting`.
    pub fn new(
        seq: u64,
        tool: impl Into<String>,
        effect: Effect,
        args: Value,
        awaiting: Awaiting,
    ) -> PendingCall {
        PendingCall {
            seq,
            tool: tool.into(),
            effect,
            args,
            awaiting,
            uncertain: None,
            why: None,
            rule: None,
            reason: None,
            read: None,
            journal_args: None,
            planned: None,
        }
    }

    /// The call's arguments as the journal keeps them.
    pub fn journal_args(&self) -> String {
        self.journal_args
            .clone()
            .unwrap_or_else(|| crate::json::key_json(&self.args))
    }

    /// Where the call is, as a person reads it: `call #3` (a non-read call), or `a read at
    /// epoch 1, occurrence 0`.
    pub fn place(&self) -> String {
        match self.read {
            Some(at) => format!("a read at epoch {}, occurrence {}", at.epoch, at.occurrence),
            None => format!("call #{}", self.seq),
        }
    }

    /// The call, saying whether it might still be running: `Some(why)` if it might, `None` if
    /// every process it could have reached has ended.
    pub fn still_running(mut self, why: Option<String>) -> PendingCall {
        self.uncertain = Some(why.is_some());
        self.why = why;
        self
    }
}

/// One run as the store keeps it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct RunRecord {
    /// The run's id, as in its receipts.
    pub run_id: String,
    /// The script's name (its file, or `-`).
    pub script_name: String,
    /// The script's text, as it started: resume runs this.
    pub script: String,
    /// SHA-256 of the catalog the run started with, as `tools --format json` printed it: the
    /// rule of stores before version 4, by which a run stored without [`RunRecord::catalog`]
    /// is judged once.
    pub catalog_sha256: String,
    /// The fingerprint of each tool of the catalog the run started with: a resume refuses a
    /// catalog in which one of them changed, naming it. `None` for a run stored by an earlier
    /// version.
    pub catalog: Option<CatalogPrint>,
    /// How the run dispatches its reads: a resume keeps it.
    pub mode: Mode,
    /// Where the run is.
    pub status: RunStatus,
    /// Who holds it, and until when: the lease of its last owner (expired, or let go, once
    /// the run paused or ended: then only its fencing token counts). `None` for a run no
    /// owner has held since stores kept leases.
    pub lease: Option<super::Lease>,
    /// When it started, in milliseconds since the Unix epoch.
    pub started_ms: i64,
    /// When its record last changed.
    pub updated_ms: i64,
    /// The pending call of a paused run.
    pub pending: Option<PendingCall>,
    /// What the run's last process printed with `--json` (a final or paused run).
    pub outcome: Option<Value>,
    /// The script's `input`, which a resume gives it again (`None`: the script had none).
    pub input: Option<Value>,
    /// The tenant the run belongs to (`serve --http --auth`); `None` for a run started
    /// without one, which no tenant sees.
    pub tenant: Option<String>,
    /// Which token started the run: the first hex digits of its SHA-256, never the token.
    pub started_by: Option<String>,
    /// A keyed digest (`hmac:…`, under the store's digest key) of the per-run context the run
    /// started with ([`RunOptions::context`](crate::RunOptions::context)), never the context:
    /// a resume must give the same context, and `serve --take-over` leaves the run to a
    /// caller that can. `None` for a run started without one.
    pub context_digest: Option<String>,
}

impl RunRecord {
    /// A new run's record: `running`, started now, with no pending call, outcome or input.
    pub fn new(
        run_id: impl Into<String>,
        script_name: impl Into<String>,
        script: impl Into<String>,
        catalog_sha256: impl Into<String>,
        mode: Mode,
    ) -> RunRecord {
        let now = super::now_ms();
        RunRecord {
            run_id: run_id.into(),
            script_name: script_name.into(),
            script: script.into(),
            catalog_sha256: catalog_sha256.into(),
            catalog: None,
            mode,
            status: RunStatus::Running,
            lease: None,
            started_ms: now,
            updated_ms: now,
            pending: None,
            outcome: None,
            input: None,
            tenant: None,
            started_by: None,
            context_digest: None,
        }
    }

    /// When the run started, as a UTC date and time (`2026-12-01T11:37:06Z`).
    pub fn started(&self) -> String {
        utc(self.started_ms)
    }

    /// The run as `toolscript runs --json` and MCP's `list_runs` show it: `run_id`, `status`,
    /// `started`, `script`, `mode`, and the `pending` call of a paused run.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "run_id": self.run_id,
            "status": self.status,
            "started": self.started(),
            "script": self.script_name,
            "mode": self.mode,
            "pending": self.pending,
        })
    }

    /// A field of the run `run_id` as a backend keeps it: a name (`mode`, `status`) or JSON
    /// (`pending`, `outcome`, `input`), parsed into its type.
    ///
    /// # Errors
    ///
    /// A message naming the run and the field, and why it does not parse.
    pub fn parse_field<T: DeserializeOwned>(
        run_id: &str,
        field: &str,
        text: &str,
        is_json: bool,
    ) -> Result<T, String> {
        let parsed = if is_json {
            serde_json::from_str(text)
        } else {
            serde_json::from_value(Value::String(text.to_string()))
        };
        parsed.map_err(|e| {
            let shown: String = text.chars().take(80).collect();
            let run_id = super::shown_run_id(run_id);
            format!("run {run_id}: its stored `{field}` does not parse ({e}): {shown:?}")
        })
    }
}

/// A run as a list of runs shows it: only what the list reads, never the script, the input or
/// the outcome (which may be large).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct RunSummary {
    /// The run's id.
    pub run_id: String,
    /// The script's name (its file, or `-`).
    pub script_name: String,
    /// How the run dispatches its reads.
    pub mode: Mode,
    /// Where the run is.
    pub status: RunStatus,
    /// When it started, in milliseconds since the Unix epoch.
    pub started_ms: i64,
    /// The pending call of a paused run.
    pub pending: Option<PendingCall>,
    /// The lease of a running run (`None` for a run no owner has held since stores kept
    /// leases, and for a run that is not running).
    pub lease: Option<super::Lease>,
}

impl RunSummary {
    /// When the run started, as a UTC date and time (`2026-12-01T11:37:06Z`).
    pub fn started(&self) -> String {
        utc(self.started_ms)
    }

    /// The cursor of the page that follows this run in a list (newest first).
    pub fn cursor(&self) -> String {
        format!("{}.{}", self.started_ms, self.run_id)
    }
}

/// Which runs a list holds: their statuses (all when empty), at most `limit` of them, after a
/// cursor (a page's `next`), newest first.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct RunQuery {
    /// The statuses listed; every status when empty.
    pub statuses: Vec<RunStatus>,
    /// The most runs a page holds (at least 1).
    pub limit: usize,
    /// The runs after this cursor (a page's `next`): `None` starts with the newest.
    pub after: Option<String>,
    /// Only the runs of this tenant; every run when `None`.
    pub tenant: Option<String>,
}

impl RunQuery {
    /// The first page of at most `limit` runs of any status.
    pub fn first(limit: usize) -> RunQuery {
        RunQuery {
            statuses: Vec::new(),
            limit,
            after: None,
            tenant: None,
        }
    }

    /// Only the runs of `tenant` (every run when `None`).
    pub fn tenant(mut self, tenant: Option<String>) -> RunQuery {
        self.tenant = tenant;
        self
    }

    /// Only runs of these statuses.
    pub fn statuses(mut self, statuses: impl IntoIterator<Item = RunStatus>) -> RunQuery {
        self.statuses = statuses.into_iter().collect();
        self
    }

    /// The page after `cursor`.
    pub fn after(mut self, cursor: Option<String>) -> RunQuery {
        self.after = cursor;
        self
    }

    /// The cursor split into the start time and run id of the run it follows.
    ///
    /// # Errors
    ///
    /// A message saying the cursor is not one a page gave.
    pub fn position(&self) -> Result<Option<(i64, &str)>, String> {
        let Some(cursor) = &self.after else {
            return Ok(None);
        };
        cursor
            .split_once('.')
            .and_then(|(ms, id)| Some((ms.parse::<i64>().ok()?, id)))
            .filter(|(_, id)| !id.is_empty())
            .map(Some)
            .ok_or_else(|| {
                let shown: String = cursor.chars().take(40).collect();
                format!("the cursor {shown:?} is not one a list of runs gave (give the `next` of the previous page)")
            })
    }
}

/// One page of a list of runs.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct RunPage {
    /// The runs, newest first.
    pub runs: Vec<RunSummary>,
    /// The cursor of the next page, when there are more runs.
    pub next: Option<String>,
}

/// Which runs a prune removes: those of `statuses` whose record last changed before
/// `updated_before_ms` (any time when `None`). A running run whose lease is live is never
/// removed, whatever the rule.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct PruneRule {
    /// The statuses removed (by default `completed` and `failed`: never a resumable run).
    pub statuses: Vec<RunStatus>,
    /// Only runs whose record last changed before this instant (milliseconds since the Unix
    /// epoch).
    pub updated_before_ms: Option<i64>,
    /// Give the freed pages back to the file system: a full `VACUUM` where the store was not
    /// set up for incremental vacuum (then it is), else an incremental one.
    pub vacuum: bool,
    /// Count what would be removed, and remove nothing.
    pub dry_run: bool,
}

impl Default for PruneRule {
    fn default() -> PruneRule {
        PruneRule {
            statuses: vec![RunStatus::Completed, RunStatus::Failed],
            updated_before_ms: None,
            vacuum: true,
            dry_run: false,
        }
    }
}

impl PruneRule {
    /// Only runs whose record last changed more than `age` ago.
    pub fn older_than(mut self, age: std::time::Duration) -> PruneRule {
        let age = i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
        self.updated_before_ms = Some(super::now_ms().saturating_sub(age));
        self
    }

    /// Removes runs of these statuses instead of the default ones.
    pub fn statuses(mut self, statuses: impl IntoIterator<Item = RunStatus>) -> PruneRule {
        self.statuses = statuses.into_iter().collect();
        self
    }
}

/// What a prune removed (or, in a dry run, would remove).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct Pruned {
    /// Runs removed, with their journals.
    pub runs: u64,
    /// Artifacts removed: none that a kept run refers to.
    pub artifacts: u64,
    /// Running runs of the rule's statuses kept because their lease is live.
    pub kept_alive: u64,
    /// Expired cached reads removed.
    pub cache_entries: u64,
    /// The store's size before, in bytes, where it is a file.
    pub bytes_before: Option<u64>,
    /// Its size after (and after the vacuum, when one ran).
    pub bytes_after: Option<u64>,
}

/// Milliseconds since the Unix epoch as a UTC date and time, `2026-12-01T11:37:06Z`.
pub(crate) fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_previous_formats_parse_and_bad_ones_are_errors_naming_run_and_field() {
        let mode: Mode = RunRecord::parse_field("r", "mode", "sequential", false).unwrap();
        assert_eq!(mode, Mode::Sequential);
        let pending: PendingCall = RunRecord::parse_field(
            "r",
            "pending",
            r#"{"seq":3,"tool":"refund","effect":"write","args":{"id":7},"awaiting":"approval"}"#,
            true,
        )
        .unwrap();
        assert_eq!(
            pending,
            PendingCall::new(
                3,
                "refund",
                Effect::Write,
                json!({"id": 7}),
                Awaiting::Approval
            )
        );
        // An effect the store does not know is an error, never a default.
        let e = RunRecord::parse_field::<PendingCall>(
            "r9",
            "pending",
            r#"{"seq":3,"tool":"refund","effect":"delete","args":{},"awaiting":"approval"}"#,
            true,
        )
        .unwrap_err();
        assert!(e.contains("`pending`") && e.contains("delete"), "{e}");
        let e = RunRecord::parse_field::<Mode>("r9", "mode", "fast", false).unwrap_err();
        assert!(e.contains("run r9") && e.contains("`mode`"), "{e}");
        let e = RunRecord::parse_field::<PendingCall>(
            "r9",
            "pending",
            r#"{"tool":"refund","effect":"write","args":{},"awaiting":"approval"}"#,
            true,
        )
        .unwrap_err();
        assert!(e.contains("`pending`") && e.contains("seq"), "{e}");
        let e = RunRecord::parse_field::<RunStatus>("r9", "status", "sleeping", false).unwrap_err();
        assert!(e.contains("`status`"), "{e}");
    }

    #[test]
    fn names_are_what_serde_writes() {
        for mode in [Mode::Sequential, Mode::Speculative] {
            assert_eq!(json!(mode), json!(mode.as_str()));
        }
        for status in [
            RunStatus::Running,
            RunStatus::Paused,
            RunStatus::Completed,
            RunStatus::Failed,
            RunStatus::Interrupted,
        ] {
            assert_eq!(json!(status), json!(status.as_str()));
        }
        for awaiting in [Awaiting::Approval, Awaiting::Resolve] {
            assert_eq!(json!(awaiting), json!(awaiting.as_str()));
        }
    }
}
