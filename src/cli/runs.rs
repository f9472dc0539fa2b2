//! `toolscript runs`: a page of the store's runs, a line each or as JSON; only the columns it
//! shows are read (never a run's script, input or outcome).

use std::path::PathBuf;
use std::process::ExitCode;

use toolscript::{RunListing, RunQuery, RunStatus};

use super::open_store;

/// How many runs a page holds unless `--limit` says.
const DEFAULT_LIMIT: u64 = 50;

/// The most runs one page may hold.
const MAX_LIMIT: u64 = 10_000;

#[derive(clap::Args)]
pub(crate) struct Runs {
    /// Print the runs as JSON (an array; the next page's cursor, if any, is said on stderr).
    #[arg(long)]
    json: bool,
    /// Only runs of this status; repeat, or separate with commas, for several.
    #[arg(long, value_enum, value_delimiter = ',', value_name = "STATUS")]
    status: Vec<StatusArg>,
    /// The most runs to list (at most 10000).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_LIMIT,
          value_parser = clap::value_parser!(u64).range(1..=MAX_LIMIT))]
    limit: u64,
    /// The page after this cursor (the one the previous page gave).
    #[arg(long, value_name = "CURSOR")]
    after: Option<String>,
    /// The store of runs (a SQLite file, or a postgres:// URL). Default: $TOOLSCRIPT_STORE, else
    /// toolscript/store.sqlite3 in the user's data directory (~/.local/share on Linux).
    #[arg(long, value_name = "PATH")]
    store: Option<PathBuf>,
}

/// A run's status, as the command line takes it.
#[derive(Clone, Copy, clap::ValueEnum)]
pub(crate) enum StatusArg {
    Running,
    Paused,
    Completed,
    Failed,
    Interrupted,
}

impl StatusArg {
    pub(crate) fn status(self) -> RunStatus {
        match self {
            StatusArg::Running => RunStatus::Running,
            StatusArg::Paused => RunStatus::Paused,
            StatusArg::Completed => RunStatus::Completed,
            StatusArg::Failed => RunStatus::Failed,
            StatusArg::Interrupted => RunStatus::Interrupted,
        }
    }
}

impl Runs {
    pub(crate) async fn apply(self) -> Result<ExitCode, String> {
        let store = open_store(self.store)?;
        let query = RunQuery::first(self.limit as usize)
            .statuses(self.status.iter().map(|s| s.status()))
            .after(self.after);
        let (runs, next) = RunListing::page(&*store, query)
            .await
            .map_err(|e| e.report())?;
        let more = || {
            if let Some(cursor) = &next {
                eprintln!("toolscript: more runs follow: --after {cursor}");
            }
        };
        if self.json {
            let list = serde_json::to_string(&runs).map_err(|e| e.to_string())?;
            println!("{list}");
            more();
            return Ok(ExitCode::SUCCESS);
        }
        if runs.is_empty() {
            println!("no runs in {}", store.location());
            return Ok(ExitCode::SUCCESS);
        }
        println!(
            "{:<16}  {:<11}  {:<20}  {:<24}  pending",
            "run", "status", "started", "script"
        );
        for r in &runs {
            // A running run says who holds it, or that its lease expired (a resume takes it).
            let held = r.lease.as_ref().map(|l| match l.live {
                true => format!("held by {} on {} until {}", l.owner, l.host, l.expires),
                false => format!("lease expired at {}: resume it to go on", l.expires),
            });
            let pending = r.pending.as_ref().map_or(held.unwrap_or_default(), |p| {
                let uncertain = if p.uncertain == Some(true) {
                    ", may still be running"
                } else {
                    ""
                };
                format!(
                    "{} {} (awaiting {}{uncertain})",
                    p.place().replacen("call ", "", 1),
                    p.tool,
                    p.awaiting.as_str()
                )
            });
            println!(
                "{:<16}  {:<11}  {:<20}  {:<24}  {pending}",
                r.run_id,
                r.status.as_str(),
                r.started,
                r.script
            );
        }
        more();
        Ok(ExitCode::SUCCESS)
    }
}
