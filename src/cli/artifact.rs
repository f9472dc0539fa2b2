//! `toolscript artifact ID`: an artifact exactly as stored, or one of its pages.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use super::open_store;

#[derive(clap::Args)]
pub(crate) struct Artifact {
    /// The artifact's id (`artifacts[].id` of `run --json`).
    id: String,
    /// Print this page (from 0) as `{"page", "pages", "items" | "entries" | "text" | "json"}`.
    #[arg(long, value_name = "N")]
    page: Option<usize>,
    /// The store of runs (a SQLite file, or a postgres:// URL). Default: $TOOLSCRIPT_STORE, else
    /// toolscript/store.sqlite3 in the user's data directory (~/.local/share on Linux).
    #[arg(long, value_name = "PATH")]
    store: Option<PathBuf>,
}

impl Artifact {
    /// Prints the artifact exactly as stored (no newline added: its SHA-256 is its id), or a
    /// page.
    pub(crate) async fn apply(self) -> Result<ExitCode, String> {
        let store = open_store(self.store)?;
        let id = &self.id;
        let found = match self.page {
            None => store.artifact(id).await,
            // A page's bytes alone, cut where they were cut when it was stored.
            Some(n) => store.artifact_page(id, n).await,
        };
        let Some(stored) = found.map_err(|e| e.report())? else {
            return Err(format!(
                "no artifact `{id}` in the store {}",
                store.location()
            ));
        };
        let mut out = std::io::stdout().lock();
        let written = match self.page {
            None => out.write_all(&stored.content),
            Some(n) => {
                let page = toolscript::stored_artifact_page(&stored, n)?;
                let page = serde_json::to_string(&page)
                    .map_err(|e| format!("the page does not serialise: {e}"))?;
                writeln!(out, "{page}")
            }
        };
        written
            .and_then(|()| out.flush())
            .map_err(|e| format!("cannot write the artifact: {e}"))?;
        Ok(ExitCode::SUCCESS)
    }
}
