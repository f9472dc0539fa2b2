//! `toolscript resume RUN_ID`: replay a paused run (or one whose process died) from its journal,
//! with a person's decision on the call it waits at, then go on.

use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::Value;
use toolscript::{Decision, RunOptions};

use super::report::{live_ticker, report, with_progress};
use super::{exit_for, open_leased, runtime, shown_id, LeaseArg, LimitsArg, ToolsArg};

#[derive(clap::Args)]
pub(crate) struct Resume {
    /// The run's id (`run --json` prints it; `runs` lists them).
    run_id: String,
    /// Approve the call the run waits at: it is made, and the run goes on.
    #[arg(long, conflicts_with_all = ["reject", "resolve", "approve_rule"])]
    approve: bool,
    /// Approve the call the guard asked about, and every later call in this run that the
    /// same rule asks about (other rules still ask).
    #[arg(long, conflicts_with_all = ["reject", "resolve"])]
    approve_rule: bool,
    /// Reject the call the run waits at: it throws a catchable `rejected` error.
    #[arg(long, conflicts_with = "resolve")]
    reject: bool,
    /// Why the call is rejected (the script's error message says it).
    #[arg(long, requires = "reject", value_name = "TEXT")]
    reason: Option<String>,
    /// Settle a call whose outcome was lost: `done` (it took effect; its result is null) or
    /// `retry` (make it again, with the same idempotency key).
    #[arg(long, value_enum, value_name = "done|retry")]
    resolve: Option<ResolveArg>,
    #[command(flatten)]
    tools: ToolsArg,
    /// Print one JSON object, as `run --json`.
    #[arg(long)]
    json: bool,
    /// Append this run's new receipts to FILE, continuing the chain it holds.
    #[arg(long, value_name = "FILE")]
    receipts: Option<PathBuf>,
    #[command(flatten)]
    limits: LimitsArg,
    /// The store of runs (a SQLite file, or a postgres:// URL). Default: $TOOLSCRIPT_STORE, else
    /// toolscript/store.sqlite3 in the user's data directory (~/.local/share on Linux).
    #[arg(long, value_name = "PATH")]
    store: Option<PathBuf>,
    #[command(flatten)]
    lease: LeaseArg,
    /// Dispatch every read: the cache of reads across runs neither answers nor keeps any.
    #[arg(long)]
    no_cache: bool,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ResolveArg {
    Done,
    Retry,
}

impl Resume {
    pub(crate) async fn apply(self) -> Result<ExitCode, String> {
        let decision = match (self.approve, self.reject, self.resolve) {
            _ if self.approve_rule => Some(Decision::ApproveRule),
            (true, _, _) => Some(Decision::Approve),
            (_, true, _) => Some(Decision::Reject {
                reason: self.reason,
            }),
            (_, _, Some(ResolveArg::Done)) => Some(Decision::Done),
            (_, _, Some(ResolveArg::Retry)) => Some(Decision::Retry),
            _ => None,
        };
        let run_id = self.run_id;
        let shown = shown_id(&run_id);
        let store = open_leased(self.store, &self.lease)?;
        let record = store
            .run(&run_id)
            .await
            .map_err(|e| e.report())?
            .ok_or_else(|| {
                format!(
                    "run {shown}: the store {} has no such run",
                    store.location()
                )
            })?;
        // An ended run is a no-op: its outcome again, and nothing is run.
        if record.status.is_final() {
            eprintln!(
                "toolscript: run {shown} has already {}; nothing was run",
                record.status.as_str()
            );
            if self.json {
                println!("{}", record.outcome.unwrap_or(Value::Null));
            }
            return Ok(exit_for(record.status));
        }
        let runtime = runtime(&self.tools, Some(store), &self.limits).await?;
        let mut options = RunOptions::default();
        if self.no_cache {
            options = options.no_cache();
        }
        if let Some(path) = &self.receipts {
            options = options.append_receipts(path).map_err(|e| e.report())?;
        }
        let (options, progress) = with_progress(options);
        let ticker = live_ticker(self.json, progress);
        let outcome = runtime
            .resume(&run_id, decision, options)
            .await
            .map_err(|e| e.report())?;
        Ok(report(&outcome, self.json, ticker))
    }
}
