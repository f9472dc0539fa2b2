//! `toolscript check SCRIPT`: compile a script and check its calls without running any tool.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::json;
use toolscript::Runtime;

use super::{read_script, registry, ToolsArg};

#[derive(clap::Args)]
pub(crate) struct Check {
    /// The script file, or `-` for stdin.
    script: PathBuf,
    #[command(flatten)]
    tools: ToolsArg,
    /// Print the problems as JSON.
    #[arg(long)]
    json: bool,
}

impl Check {
    /// Exit status 0 when no problem is an error (warnings are reported, and pass), else 1.
    pub(crate) async fn apply(self) -> Result<ExitCode, String> {
        check(&self.script, &self.tools, self.json).await
    }
}

async fn check(script: &Path, tools: &ToolsArg, json: bool) -> Result<ExitCode, String> {
    let source = read_script(script)?;
    let runtime = Runtime::new(registry(tools).await?);
    // Warnings (a script that runs, but most likely not as meant) are reported; only errors
    // fail the check.
    let no_errors = |problems: &[toolscript::Problem]| {
        problems
            .iter()
            .all(|p| p.severity != toolscript::Severity::Error)
    };
    let (ok, report) = match runtime.check(&source) {
        Ok(problems) if json => (
            no_errors(&problems),
            json!({"ok": no_errors(&problems), "problems": problems}).to_string(),
        ),
        Ok(problems) if problems.is_empty() => (true, "ok: no problems found".to_string()),
        Ok(problems) => {
            let lines: Vec<String> = problems
                .iter()
                .map(|p| {
                    let severity = match p.severity {
                        toolscript::Severity::Error => "error",
                        _ => "warning",
                    };
                    let at = match (p.line, p.column) {
                        (Some(l), Some(c)) => format!("{l}:{c}: "),
                        _ => String::new(),
                    };
                    let next = p
                        .suggested_next_action
                        .as_ref()
                        .map(|a| format!("\n  next: {a}"))
                        .unwrap_or_default();
                    format!("{at}{severity}: {}{next}", p.message)
                })
                .collect();
            (no_errors(&problems), lines.join("\n"))
        }
        Err(e) if json => (
            false,
            json!({"ok": false, "error": e.to_json()}).to_string(),
        ),
        Err(e) => (false, format!("error: {e}")),
    };
    println!("{report}");
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
