//! `toolscript runs`: the store's runs, a line each or as JSON.

use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::Value;
use toolscript::RunRecord;

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
    pub(crate) fn apply(self) -> Result<ExitCode, String> {
        let store = open_store(self.store)?;
        let runs = store.runs().map_err(|e| e.to_string())?;
        if self.json {
            let list: Vec<Value> = runs.iter().map(RunRecord::to_json).collect();
            println!("{}", Value::Array(list));
            return Ok(ExitCode::SUCCESS);
        }
        if runs.is_empty() {
            println!("no runs in {}", store.path().display());
            return Ok(ExitCode::SUCCESS);
        }
        println!(
            "{:<16}  {:<9}  {:<20}  {:<24}  pending",
            "run", "status", "started", "script"
        );
        for r in &runs {
            let pending = r.pending.as_ref().map_or(String::new(), |p| {
                format!(
                    "#{} {} (awaiting {})",
                    p["seq"],
                    p["tool"].as_str().unwrap_or_default(),
                    p["awaiting"].as_str().unwrap_or_default()
                )
            });
            println!(
                "{:<16}  {:<9}  {:<20}  {:<24}  {pending}",
                r.run_id,
                r.status.as_str(),
                r.started(),
                r.script_name
            );
        }
        Ok(ExitCode::SUCCESS)
    }
}
