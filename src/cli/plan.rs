//! `toolscript plan SCRIPT` and `toolscript apply PLAN_ID`: see every effect a script would
//! have before any happens, then make exactly those (docs/plans.md).

use std::path::PathBuf;
use std::process::ExitCode;

use toolscript::{Mode, RunOptions};

use super::report::{live_ticker, report, with_progress};
use super::run::read_input;
use super::{name_limit, read_script, runtime, LimitsArg, StoreArg, ToolsArg};

#[derive(clap::Args)]
pub(crate) struct Plan {
    /// The script file, or `-` for stdin.
    script: PathBuf,
    #[command(flatten)]
    tools: ToolsArg,
    /// Dispatch every read in program order (the executor alone).
    #[arg(long)]
    sequential: bool,
    /// Print the plan as one JSON object.
    #[arg(long)]
    json: bool,
    /// The script's input, as JSON or `@FILE`.
    #[arg(long, value_name = "JSON|@FILE")]
    input: Option<String>,
    #[command(flatten)]
    store: StoreArg,
    #[command(flatten)]
    limits: LimitsArg,
}

impl Plan {
    pub(crate) async fn apply(self) -> Result<ExitCode, String> {
        let input = self.input.as_deref().map(read_input).transpose()?;
        let store = self.store.open()?;
        let runtime = runtime(&self.tools, store, &self.limits).await?;
        let mut options = RunOptions::with_mode(Mode::sequential_if(self.sequential))
            .script_name(self.script.display().to_string());
        if let Some(input) = input {
            options = options.input(input);
        }
        let source = read_script(&self.script)?;
        let planned = runtime
            .plan(&source, options)
            .await
            .map_err(|e| e.report())?;
        let plan = &planned.plan;
        if self.json {
            let mut json = plan.to_json();
            if let Some(map) = json.as_object_mut() {
                map.insert("logs".into(), planned.run.logs.clone().into());
                if let Err(e) = &planned.run.result {
                    map.insert("error".into(), e.report(name_limit).to_json());
                }
            }
            println!("{json}");
        } else {
            for line in &planned.run.logs {
                eprintln!("{line}");
            }
            print!("{}", plan.render());
            if plan.plan_id.is_empty() {
                eprintln!("toolscript: the plan was not kept (--no-store): it cannot be applied");
            }
        }
        Ok(if planned.run.result.is_ok() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        })
    }
}

#[derive(clap::Args)]
pub(crate) struct Apply {
    /// The plan's id (`toolscript plan` prints it).
    plan_id: String,
    #[command(flatten)]
    tools: ToolsArg,
    /// Dispatch every read in program order (the executor alone).
    #[arg(long)]
    sequential: bool,
    /// Print one JSON object, as `run --json`.
    #[arg(long)]
    json: bool,
    /// Write one receipt per dispatch to FILE (JSON Lines).
    #[arg(long, value_name = "FILE")]
    receipts: Option<PathBuf>,
    /// The store of runs (a SQLite file, or a postgres:// URL) the plan is kept in. Default: $TOOLSCRIPT_STORE, else
    /// toolscript/store.sqlite3 in the user's data directory.
    #[arg(long, value_name = "PATH")]
    store: Option<PathBuf>,
    #[command(flatten)]
    limits: LimitsArg,
}

impl Apply {
    pub(crate) async fn apply(self) -> Result<ExitCode, String> {
        let store = super::open_store(self.store)?;
        let runtime = runtime(&self.tools, Some(store), &self.limits).await?;
        let mut options = RunOptions::with_mode(Mode::sequential_if(self.sequential));
        if let Some(path) = &self.receipts {
            options = options.receipts(path).map_err(|e| e.report())?;
        }
        let (options, progress) = with_progress(options);
        let ticker = live_ticker(self.json, progress);
        let outcome = runtime
            .apply(&self.plan_id, options)
            .await
            .map_err(|e| e.report())?;
        Ok(report(&outcome, self.json, ticker))
    }
}
