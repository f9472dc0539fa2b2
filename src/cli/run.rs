//! `toolscript run SCRIPT`: run a script and print its value, or with `--json` the whole outcome.

use std::path::PathBuf;
use std::process::ExitCode;

use toolscript::{Mode, ResultPolicy, RunOptions, Sandbox};

use super::report::{live_ticker, report, with_progress};
use super::{read_script, runtime, LimitsArg, StoreArg, ToolsArg};

#[derive(clap::Args)]
pub(crate) struct Run {
    /// The script file, or `-` for stdin.
    script: PathBuf,
    #[command(flatten)]
    tools: ToolsArg,
    /// Dispatch every call in program order (the executor alone).
    #[arg(long)]
    sequential: bool,
    /// Print one JSON object: value or error, logs, effects, stats.
    #[arg(long)]
    json: bool,
    /// Write one receipt per dispatch to FILE (JSON Lines).
    #[arg(long, value_name = "FILE")]
    receipts: Option<PathBuf>,
    #[command(flatten)]
    store: StoreArg,
    #[command(flatten)]
    limits: LimitsArg,
    /// What happens to a value too large for the output that is no tool's result.
    #[arg(long, value_enum, default_value_t = PolicyArg::Auto)]
    result: PolicyArg,
    /// The script's input, as JSON or `@FILE` (a file of JSON): the script reads it as
    /// `input` (without it, `input` is `()`).
    #[arg(long, value_name = "JSON|@FILE")]
    input: Option<String>,
    /// Dispatch every read: the cache of reads across runs neither answers nor keeps any.
    #[arg(long)]
    no_cache: bool,
    /// `fixture`: every non-read call fails with `side_effect_blocked` without reaching its
    /// tool; reads run (or are answered by --fixtures).
    #[arg(long, value_enum, value_name = "KIND")]
    sandbox: Option<SandboxArg>,
    /// Record each read the run uses to FILE (JSON Lines): tool, arguments, occurrence,
    /// result or error. Reads holding a secret or a redacted value are left out.
    #[arg(long, value_name = "FILE")]
    record: Option<PathBuf>,
    /// Answer reads from FILE (written by --record) without calling their tools; a read it
    /// lacks fails with `fixture_missing`.
    #[arg(long, value_name = "FILE")]
    fixtures: Option<PathBuf>,
    /// With `-` as the script: read stdin as it arrives, starting the reads the text so far
    /// allows before it ends (docs/streaming.md).
    #[arg(long)]
    stream: bool,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum SandboxArg {
    /// Non-read calls are refused.
    Fixture,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum PolicyArg {
    Auto,
    Inline,
    Page,
    Compress,
    Exact,
}

impl PolicyArg {
    fn policy(self) -> ResultPolicy {
        match self {
            PolicyArg::Auto => ResultPolicy::Auto,
            PolicyArg::Inline => ResultPolicy::Inline,
            PolicyArg::Page => ResultPolicy::Page,
            PolicyArg::Compress => ResultPolicy::Compress,
            PolicyArg::Exact => ResultPolicy::Exact,
        }
    }
}

impl Run {
    pub(crate) async fn apply(self) -> Result<ExitCode, String> {
        let input = self.input.as_deref().map(read_input).transpose()?;
        let store = self.store.open()?;
        let runtime = runtime(&self.tools, store, &self.limits).await?;
        let mut options = RunOptions::with_mode(Mode::sequential_if(self.sequential))
            .result_policy(self.result.policy());
        if let Some(input) = input {
            options = options.input(input);
        }
        if self.no_cache {
            options = options.no_cache();
        }
        let streamed = self.stream && self.script == std::path::Path::new("-");
        if self.stream && !streamed {
            return Err("--stream reads the script from stdin as it arrives: give `-` as the script, e.g. `model | toolscript run - --stream`".into());
        }
        let source = if streamed {
            String::new()
        } else {
            read_script(&self.script)?
        };
        let mut options = options.script_name(self.script.display().to_string());
        // Receipts are appended as calls finish; a file that cannot be created stops the run
        // before any tool runs, and one that fails midway stops it before its next call.
        if let Some(path) = &self.receipts {
            options = options.receipts(path).map_err(|e| e.report())?;
        }
        if let Some(SandboxArg::Fixture) = self.sandbox {
            options = options.sandbox(Sandbox::Fixture);
        }
        // The fixtures are read before the recording is created: the two may be one file.
        if let Some(path) = &self.fixtures {
            options = options.fixtures(path).map_err(|e| e.report())?;
        }
        if let Some(path) = &self.record {
            options = options.record(path).map_err(|e| e.report())?;
        }
        let (options, progress) = with_progress(options);
        let ticker = live_ticker(self.json, progress);
        let outcome = if streamed {
            let chunks = super::stream::stdin_chunks();
            runtime.run_streaming(chunks, options).outcome().await
        } else {
            runtime.run_with(&source, options).await
        };
        Ok(report(&outcome, self.json, ticker))
    }
}

/// `--input`: JSON, or `@FILE` for a file of JSON.
pub(super) fn read_input(text: &str) -> Result<serde_json::Value, String> {
    let (json, from) = match text.strip_prefix('@') {
        Some(path) => (
            std::fs::read_to_string(path).map_err(|e| format!("--input {text}: {e}"))?,
            path,
        ),
        None => (text.to_string(), "the argument"),
    };
    serde_json::from_str(&json).map_err(|e| {
        format!("--input: {from} is not JSON ({e}); give a JSON value, e.g. --input '{{\"id\": 3}}', or @FILE")
    })
}
