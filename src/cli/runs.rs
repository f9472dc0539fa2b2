//! `toolscript runs`: the store's runs, a line each or as JSON.

use std::path::PathBuf;
use std::process::ExitCode;

use super::open_store;

#[derive(clap::Args)]
pub(crate) struct Runs {
    /// Print the runs as JSON.
    #[arg(long)]
    json: bool,
    /// The store of runs (SQLite). Default: $TOOLSCRIPT_STORE, else
    /// toolscript/store.sqlite3 in the user's data directory (~/.local/share on Linux).
    #[arg(long, value_name = "PATH")]
    store: Option<PathBuf>,
}

impl Runs {
    pub(crate) async fn apply(self) -> Result<ExitCode, String> {
        let store = open_store(self.store)?;
        let runs = toolscript::RunListing::all(&*store)
            .await
            .map_err(|e| e.report())?;
        if self.json {
            let list = serde_json::to_string(&runs).map_err(|e| e.to_string())?;
            println!("{list}");
            return Ok(ExitCode::SUCCESS);
        }
        if runs.is_empty() {
            println!("no runs in {}", store.location());
            return Ok(ExitCode::SUCCESS);
        }
        println!(
            "{:<16}  {:<9}  {:<20}  {:<24}  pending",
            "run", "status", "started", "script"
        );
        for r in &runs {
            let pending = r.pending.as_ref().map_or(String::new(), |p| {
                let uncertain = if p.uncertain == Some(true) {
                    ", may still be running"
                } else {
                    ""
                };
                format!(
                    "#{} {} (awaiting {}{uncertain})",
                    p.seq,
                    p.tool,
                    p.awaiting.as_str()
                )
            });
            println!(
                "{:<16}  {:<9}  {:<20}  {:<24}  {pending}",
                r.run_id,
                r.status.as_str(),
                r.started,
                r.script
            );
        }
        Ok(ExitCode::SUCCESS)
    }
}
