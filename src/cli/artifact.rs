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
    /// The store of runs (SQLite). Default: $TOOLSCRIPT_STORE, else
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
        let Some(stored) = store.artifact(id).await.map_err(|e| e.report())? else {
            return Err(format!(
                "no artifact `{id}` in the store {}",
                store.location()
            ));
        };
        let mut out = std::io::stdout().lock();
        let written = match self.page {
            None => out.write_all(&stored.content),
            Some(n) => {
                let text = String::from_utf8_lossy(&stored.content);
                let page = toolscript::artifact_page(&text, stored.page_tokens, n)?;
                writeln!(out, "{page}")
            }
        };
        written
            .and_then(|()| out.flush())
            .map_err(|e| format!("cannot write the artifact: {e}"))?;
        Ok(ExitCode::SUCCESS)
    }
}
