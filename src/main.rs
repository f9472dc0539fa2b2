//! The `toolscript` command line: parse arguments, build the runtime, print. No logic lives here.

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use serde_json::{json, Value};
use toolscript::bench::bench_script;
use toolscript::mcp::{serve_http, serve_stdio, HttpOptions, MCP_PATH};
use toolscript::receipts::{verify_receipts, verify_receipts_to};
use toolscript::{
    demo_catalog, Decision, Error, Format, Limits, Manifests, Mode, Progress, Registry,
    ResultPolicy, RunOptions, RunOutcome, RunRecord, RunStatus, Runtime, SqliteStore, Store,
};

/// Exit status of a usage, manifest or registry error.
const USAGE: u8 = 2;
/// Exit status of a run that paused, waiting for a person's decision.
const PAUSED: u8 = 3;

#[derive(Parser)]
#[command(
    name = "toolscript",
    version,
    about = "Runs orchestration scripts written by language models: many tool calls, one script."
)]
struct Cli {
    /// More diagnostics on stderr (-v: debug, -vv: trace); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a script and print its value (or, with --json, the whole outcome).
    Run {
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
    },
    /// Resume a paused run, or one whose process died: replay it from its journal, then go on.
    Resume {
        /// The run's id (`run --json` prints it; `runs` lists them).
        run_id: String,
        /// Approve the call the run waits at: it is made, and the run goes on.
        #[arg(long, conflicts_with_all = ["reject", "resolve"])]
        approve: bool,
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
        /// The store of runs (SQLite). Default: $TOOLSCRIPT_STORE, else
        /// toolscript/store.sqlite3 in the user's data directory (~/.local/share on Linux).
        #[arg(long, value_name = "PATH")]
        store: Option<PathBuf>,
    },
    /// Print an artifact exactly as stored (a run's output refers to it), or one of its pages.
    Artifact {
        /// The artifact's id (`artifacts[].id` of `run --json`).
        id: String,
        /// Print this page (from 0) as `{"page", "pages", "items" | "text"}`.
        #[arg(long, value_name = "N")]
        page: Option<usize>,
        /// The store of runs (SQLite). Default: $TOOLSCRIPT_STORE, else
        /// toolscript/store.sqlite3 in the user's data directory (~/.local/share on Linux).
        #[arg(long, value_name = "PATH")]
        store: Option<PathBuf>,
    },
    /// List the store's runs: id, status, start, script, pending call.
    Runs {
        /// Print the runs as JSON.
        #[arg(long)]
        json: bool,
        /// The store of runs (SQLite). Default: $TOOLSCRIPT_STORE, else
        /// toolscript/store.sqlite3 in the user's data directory (~/.local/share on Linux).
        #[arg(long, value_name = "PATH")]
        store: Option<PathBuf>,
    },
    /// Compile a script and check its calls without running any tool.
    Check {
        /// The script file, or `-` for stdin.
        script: PathBuf,
        #[command(flatten)]
        tools: ToolsArg,
        /// Print the problems as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print the tools' API, as a model reads it.
    Tools {
        #[command(flatten)]
        tools: ToolsArg,
        /// Output format.
        #[arg(long, value_enum, default_value_t = FormatArg::Text)]
        format: FormatArg,
    },
    /// Run scripts sequentially and speculatively, alternating; compare wall times and results.
    Bench {
        /// The script files.
        #[arg(required = true)]
        scripts: Vec<PathBuf>,
        #[command(flatten)]
        tools: ToolsArg,
        /// Runs of each mode per script.
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1000))]
        runs: u32,
        /// Print the reports as JSON.
        #[arg(long)]
        json: bool,
        /// Journal every run in this store, as `run` does by default (bench runs without one
        /// unless given: it measures speculation, not the disk).
        #[arg(long, value_name = "PATH")]
        store: Option<PathBuf>,
        #[command(flatten)]
        limits: LimitsArg,
    },
    /// Serve toolscript as an MCP server on stdio (or with --http, over Streamable HTTP):
    /// `run_script`, `describe_tools`, `resume_run`, `list_runs` and `read_artifact`.
    Serve {
        /// Serve MCP Streamable HTTP at http://ADDR/mcp instead of stdio (e.g. 127.0.0.1:8080;
        /// port 0 picks a free port, printed on stderr). No authentication: bind to loopback,
        /// or put it behind a proxy that authenticates.
        #[arg(long, value_name = "ADDR")]
        http: Option<String>,
        /// With --http: keep a session per client (Mcp-Session-Id) in this process instead of
        /// answering each request on its own (stateless, the default).
        #[arg(long, requires = "http")]
        stateful: bool,
        /// With --http: accept this Host header (a name, or name:port) besides loopback names
        /// and the bound address; repeat for several.
        #[arg(long = "allow-host", value_name = "HOST", requires = "http")]
        allow_hosts: Vec<String>,
        #[command(flatten)]
        tools: ToolsArg,
        #[command(flatten)]
        store: StoreArg,
        #[command(flatten)]
        limits: LimitsArg,
    },
    /// Check every hash and the chain of a receipts file.
    Verify {
        /// The receipts file (JSON Lines).
        receipts: PathBuf,
        /// The hash the chain must end at (`receipts.head` of `run --json`): a file whose
        /// last receipts were cut off fails.
        #[arg(long)]
        head: Option<String>,
    },
}

#[derive(clap::Args)]
struct ToolsArg {
    /// A tool manifest (TOML); repeat for several. Without it, the embedded demo catalog.
    #[arg(long = "tools", value_name = "MANIFEST")]
    manifests: Vec<PathBuf>,
}

#[derive(clap::Args)]
struct StoreArg {
    /// The store of runs (SQLite), where every run is journaled so that it can pause for
    /// approvals and be resumed. Default: $TOOLSCRIPT_STORE, else toolscript/store.sqlite3 in
    /// the user's data directory (~/.local/share on Linux), created on first use.
    #[arg(long, value_name = "PATH")]
    store: Option<PathBuf>,
    /// Journal nothing: a throwaway run, which cannot be resumed (a call that needs approval
    /// stops it).
    #[arg(long, conflicts_with = "store")]
    no_store: bool,
}

/// A flag for every limit of `Limits::KEYS` (`--max-calls N`, `--timeout-s S`, ...), each
/// overriding the manifests' `[limits]` and the default.
#[derive(Clone, Default)]
struct LimitsArg {
    set: Vec<(&'static str, f64)>,
}

impl clap::FromArgMatches for LimitsArg {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let set = Limits::KEYS
            .iter()
            .filter_map(|key| matches.get_one::<f64>(key.name).map(|v| (key.name, *v)))
            .collect();
        Ok(LimitsArg { set })
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = LimitsArg::from_arg_matches(matches)?;
        Ok(())
    }
}

impl clap::Args for LimitsArg {
    fn augment_args(command: clap::Command) -> clap::Command {
        let defaults = Limits::default();
        Limits::KEYS.iter().fold(command, |command, key| {
            let default = defaults.get(key.name).unwrap_or_default();
            command.arg(
                clap::Arg::new(key.name)
                    .long(key.name.replace('_', "-"))
                    .value_name(if key.name == "timeout_s" { "S" } else { "N" })
                    .value_parser(clap::value_parser!(f64))
                    .allow_negative_numbers(true)
                    .help(format!(
                        "Limit: {} (default {default}; also `{}` in [limits])",
                        key.what, key.name
                    ))
                    .help_heading("Limits"),
            )
        })
    }

    fn augment_args_for_update(command: clap::Command) -> clap::Command {
        LimitsArg::augment_args(command)
    }
}

impl LimitsArg {
    /// `limits` with the flags applied over them.
    fn apply(&self, mut limits: Limits) -> Result<Limits, String> {
        for (name, value) in &self.set {
            limits
                .set(name, *value)
                .map_err(|e| format!("--{}: {e}", name.replace('_', "-")))?;
        }
        Ok(limits)
    }
}

#[derive(Clone, Copy, ValueEnum)]
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

#[derive(Clone, Copy, ValueEnum)]
enum ResolveArg {
    Done,
    Retry,
}

#[derive(Clone, Copy, ValueEnum)]
enum FormatArg {
    Text,
    Json,
    Rhai,
}

/// Counts every allocation of the process, so that a run's memory budget (`Limits::max_memory_mb`)
/// can end a script that grows too large before the process runs out of memory. No limit is set
/// on the allocator itself: a refused allocation would abort the process.
#[global_allocator]
static ALLOCATOR: cap::Cap<std::alloc::System> = cap::Cap::new(std::alloc::System, usize::MAX);

fn main() -> ExitCode {
    toolscript::set_memory_probe(|| ALLOCATOR.allocated());
    let cli = Cli::parse();
    init_tracing(cli.verbose);
    let result = async_runtime().and_then(|rt| {
        // MCP servers' connections live on this runtime: every command uses it.
        let outcome = rt.block_on(command(cli.command));
        // Tools of MCP servers may still hold tasks; do not wait for them at exit.
        rt.shutdown_background();
        outcome
    });
    result.unwrap_or_else(|message| {
        eprintln!("toolscript: {message}");
        ExitCode::from(USAGE)
    })
}

async fn command(command: Command) -> Result<ExitCode, String> {
    match command {
        Command::Run {
            script,
            tools,
            sequential,
            json,
            receipts,
            store,
            limits,
            result,
            input,
        } => {
            let input = input.as_deref().map(read_input).transpose()?;
            let store = if store.no_store {
                None
            } else {
                Some(open_store(store.store)?)
            };
            let runtime = runtime(&tools, store, &limits).await?;
            let mut options = RunOptions::with_mode(Mode::sequential_if(sequential))
                .result_policy(result.policy());
            if let Some(input) = input {
                options = options.input(input);
            }
            run(&script, &runtime, options, json, receipts.as_deref()).await
        }
        Command::Resume {
            run_id,
            approve,
            reject,
            reason,
            resolve,
            tools,
            json,
            receipts,
            store,
            limits,
        } => {
            let decision = match (approve, reject, resolve) {
                (true, _, _) => Some(Decision::Approve),
                (_, true, _) => Some(Decision::Reject { reason }),
                (_, _, Some(ResolveArg::Done)) => Some(Decision::Done),
                (_, _, Some(ResolveArg::Retry)) => Some(Decision::Retry),
                _ => None,
            };
            let store = open_store(store)?;
            resume(
                &run_id,
                decision,
                &tools,
                &limits,
                json,
                receipts.as_deref(),
                store,
            )
            .await
        }
        Command::Artifact { id, page, store } => artifact(&*open_store(store)?, &id, page).await,
        Command::Runs { json, store } => runs(&*open_store(store)?, json).await,
        Command::Check {
            script,
            tools,
            json,
        } => check(&script, &tools, json).await,
        Command::Tools { tools, format } => {
            let registry = registry(&tools).await?;
            let format = match format {
                FormatArg::Text => Format::Text,
                FormatArg::Json => Format::Json,
                FormatArg::Rhai => Format::Rhai,
            };
            print!("{}", Runtime::new(registry).describe(format));
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench {
            scripts,
            tools,
            runs,
            json,
            store,
            limits,
        } => {
            let store = store.map(|path| open_store(Some(path))).transpose()?;
            bench(&scripts, &tools, &limits, runs as usize, json, store).await
        }
        Command::Serve {
            http,
            stateful,
            allow_hosts,
            tools,
            store,
            limits,
        } => {
            let store = if store.no_store {
                None
            } else {
                Some(open_store(store.store)?)
            };
            let runtime = runtime(&tools, store, &limits).await?;
            match http {
                None => serve_stdio(runtime).await.map_err(|e| e.to_string())?,
                Some(addr) => {
                    let listener = tokio::net::TcpListener::bind(&addr)
                        .await
                        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
                    let bound = listener.local_addr().map_err(|e| e.to_string())?;
                    let mut options = HttpOptions::new().stateful(stateful);
                    for host in allow_hosts {
                        options = options.allow_host(host);
                    }
                    let stop = stop_signal();
                    // The one line a user (or a test, with port 0) reads to find the server.
                    eprintln!("toolscript: serving MCP on http://{bound}{MCP_PATH}");
                    serve_http(runtime, listener, options, stop).await;
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Verify { receipts, head } => match match &head {
            Some(head) => verify_receipts_to(&receipts, head),
            None => verify_receipts(&receipts),
        } {
            Ok(n) => {
                println!("ok: {n} receipts, every hash and the chain check out");
                Ok(ExitCode::SUCCESS)
            }
            Err(e @ Error::Receipt { .. }) => {
                eprintln!("toolscript: verification failed: {e}");
                Ok(ExitCode::from(1))
            }
            Err(e) => Err(e.to_string()),
        },
    }
}

/// Completes at Ctrl-C or SIGTERM: a server stops cleanly on either. The handlers are in place
/// when this returns, before the server says it is listening, so no signal comes too early.
fn stop_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let term = signal(SignalKind::terminate());
        let int = signal(SignalKind::interrupt());
        async move {
            match (term, int) {
                (Ok(mut term), Ok(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                }
                _ => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

fn init_tracing(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "toolscript=debug",
        _ => "toolscript=trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default))
        // The MCP SDK traces whole messages at its lowest levels: tools' results and
        // arguments, secrets among them. Its own diagnostics stop at `debug`.
        .add_directive(
            if verbose == 0 {
                "rmcp=warn"
            } else {
                "rmcp=debug"
            }
            .parse()
            .expect("a valid directive"),
        );
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal; never escape codes in a client's log.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// The registry of `--tools` (starting their MCP servers), or the demo catalog.
async fn registry(tools: &ToolsArg) -> Result<Registry, String> {
    Ok(new_registry(tools).await.map_err(|e| e.to_string())?.0)
}

/// The registry of `--tools` and the limits of their `[limits]` tables over the defaults.
async fn new_registry(tools: &ToolsArg) -> Result<(Registry, Limits), Error> {
    if tools.manifests.is_empty() {
        return Ok((demo_catalog()?, Limits::default()));
    }
    let mut manifests = Manifests::new();
    for path in &tools.manifests {
        manifests.load_file(path)?;
    }
    let limits = manifests.limits().clone();
    Ok((manifests.build().await?, limits))
}

/// `--input`: JSON, or `@FILE` for a file of JSON.
fn read_input(text: &str) -> Result<serde_json::Value, String> {
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

fn read_script(path: &Path) -> Result<String, String> {
    if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| format!("cannot read the script from stdin: {e}"))?;
        return Ok(text);
    }
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn async_runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))
}

/// The store at `path`, else at its default place.
fn open_store(path: Option<PathBuf>) -> Result<Arc<dyn Store>, String> {
    let path = path.or_else(SqliteStore::default_path).ok_or_else(|| {
        "no data directory to keep the store of runs in: give --store PATH (or --no-store)"
            .to_string()
    })?;
    match SqliteStore::open(&path) {
        Ok(store) => Ok(Arc::new(store)),
        Err(e) => Err(e.to_string()),
    }
}

/// A runtime over the registry of `tools`, journaling in `store`.
async fn runtime(
    tools: &ToolsArg,
    store: Option<Arc<dyn Store>>,
    flags: &LimitsArg,
) -> Result<Runtime, String> {
    let (registry, limits) = new_registry(tools).await.map_err(|e| e.to_string())?;
    let mut builder = Runtime::builder(registry).limits(flags.apply(limits)?);
    if let Some(store) = store {
        builder = builder.store(store);
    }
    Ok(builder.build())
}

async fn run(
    script: &Path,
    runtime: &Runtime,
    options: RunOptions,
    json: bool,
    receipts: Option<&Path>,
) -> Result<ExitCode, String> {
    let source = read_script(script)?;
    let mut options = options.script_name(script.display().to_string());
    // Receipts are appended as calls finish; a file that cannot be created stops the run
    // before any tool runs, and one that fails midway stops it before its next call.
    if let Some(path) = receipts {
        options = options.receipts(path).map_err(|e| e.to_string())?;
    }
    let (options, progress) = with_progress(options);
    let ticker = live_ticker(json, progress);
    let outcome = runtime.run_with(&source, options).await;
    Ok(report(&outcome, json, ticker))
}

async fn resume(
    run_id: &str,
    decision: Option<Decision>,
    tools: &ToolsArg,
    flags: &LimitsArg,
    json: bool,
    receipts: Option<&Path>,
    store: Arc<dyn Store>,
) -> Result<ExitCode, String> {
    let record = store
        .run(run_id)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| {
            format!(
                "run {run_id}: the store {} has no such run",
                store.location()
            )
        })?;
    // An ended run is a no-op: its outcome again, and nothing is run.
    if record.status.is_final() {
        eprintln!(
            "toolscript: run {run_id} has already {}; nothing was run",
            record.status.as_str()
        );
        if json {
            println!("{}", record.outcome.unwrap_or(Value::Null));
        }
        return Ok(exit_for(record.status));
    }
    let runtime = runtime(tools, Some(store), flags).await?;
    let mut options = RunOptions::default();
    if let Some(path) = receipts {
        options = options.append_receipts(path).map_err(|e| e.to_string())?;
    }
    let (options, progress) = with_progress(options);
    let ticker = live_ticker(json, progress);
    let outcome = runtime
        .resume(run_id, decision, options)
        .await
        .map_err(|e| e.to_string())?;
    Ok(report(&outcome, json, ticker))
}

/// Prints an artifact exactly as stored (no newline added: its SHA-256 is its id), or a page.
async fn artifact(store: &dyn Store, id: &str, page: Option<usize>) -> Result<ExitCode, String> {
    let Some(stored) = store.artifact(id).await.map_err(|e| e.to_string())? else {
        return Err(format!(
            "no artifact `{id}` in the store {}",
            store.location()
        ));
    };
    let mut out = std::io::stdout().lock();
    let written = match page {
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

async fn runs(store: &dyn Store, json: bool) -> Result<ExitCode, String> {
    let runs = store.runs().await.map_err(|e| e.to_string())?;
    if json {
        let list: Vec<Value> = runs.iter().map(RunRecord::to_json).collect();
        println!("{}", Value::Array(list));
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
            format!("#{} {} (awaiting {})", p.seq, p.tool, p.awaiting.as_str())
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

fn with_progress(options: RunOptions) -> (RunOptions, Arc<Progress>) {
    let progress = Arc::new(Progress::default());
    (options.progress(Arc::clone(&progress)), progress)
}

/// The live line on stderr, for a person at a terminal.
fn live_ticker(json: bool, progress: Arc<Progress>) -> Option<tokio::task::JoinHandle<()>> {
    let live = !json && std::io::stderr().is_terminal();
    live.then(|| tokio::spawn(live_line(progress)))
}

/// Prints a run's outcome; its exit status.
fn report(
    outcome: &RunOutcome,
    json: bool,
    ticker: Option<tokio::task::JoinHandle<()>>,
) -> ExitCode {
    if let Some(ticker) = ticker {
        ticker.abort();
        eprint!("\r\x1b[2K");
    }
    if json {
        println!("{}", outcome.to_json());
    } else {
        print_human(outcome);
    }
    exit_for(outcome.status())
}

fn exit_for(status: RunStatus) -> ExitCode {
    match status {
        RunStatus::Completed => ExitCode::SUCCESS,
        RunStatus::Paused => ExitCode::from(PAUSED),
        _ => ExitCode::from(1),
    }
}

/// The line on stderr that shows a run going on; the caller clears it.
async fn live_line(progress: Arc<Progress>) {
    let started = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        eprint!(
            "\r\x1b[2K{} calls done, {} in flight, {:.1} s",
            progress.done(),
            progress.in_flight(),
            started.elapsed().as_secs_f64()
        );
        let _ = std::io::stderr().flush();
    }
}

/// Text a script or a tool produced, safe for a terminal: control characters but newlines and
/// tabs (terminal escapes, carriage returns) are shown escaped, so that no script can move the
/// cursor, recolour or retitle the terminal. Text for a pipe is left as it is.
fn for_terminal(text: &str, terminal: bool) -> String {
    if !terminal {
        return text.to_string();
    }
    text.chars()
        .map(|c| match c {
            '\n' | '\t' => c.to_string(),
            c if c.is_control() => c.escape_default().to_string(),
            c => c.to_string(),
        })
        .collect()
}

/// The value on stdout, alone, so that it can be piped; logs, errors and the summary on stderr.
fn print_human(outcome: &RunOutcome) {
    let err_terminal = std::io::stderr().is_terminal();
    for line in &outcome.logs {
        eprintln!("{}", for_terminal(line, err_terminal));
    }
    let terminal = std::io::stdout().is_terminal();
    let mut out = std::io::stdout().lock();
    if let Some(pending) = &outcome.pending {
        eprintln!(
            "paused: run {} waits at `{}` (call #{}, {}) with {}",
            outcome.run_id,
            pending.tool,
            pending.seq,
            match pending.awaiting {
                toolscript::Awaiting::Approval => "awaiting approval",
                _ => "awaiting resolve: its outcome was lost",
            },
            for_terminal(&pending.args.to_string(), err_terminal)
        );
    }
    match &outcome.result {
        Err(e) if outcome.pending.is_some() => {
            if let Some(action) = &e.suggested_next_action {
                eprintln!("  next: {}", for_terminal(action, err_terminal));
            }
        }
        Ok(Value::String(s)) => {
            let _ = writeln!(out, "{}", for_terminal(s, terminal));
        }
        Ok(value) => {
            let _ = writeln!(
                out,
                "{}",
                serde_json::to_string_pretty(value).unwrap_or_default()
            );
        }
        Err(e) => {
            eprintln!("error: {}", for_terminal(&e.to_string(), err_terminal));
            if let Some(action) = &e.suggested_next_action {
                eprintln!("  hint: {}", for_terminal(action, err_terminal));
            }
        }
    }
    let s = &outcome.stats;
    let mut summary = format!(
        "{} tool calls ({} dispatched, {} deduplicated, {} effectful) in {:.1} ms, {}",
        s.tool_calls,
        s.dispatched,
        s.deduplicated,
        s.effectful_calls,
        s.wall_ms,
        match s.mode {
            Mode::Sequential => s.mode.as_str().to_string(),
            _ => format!(
                "speculative: {} reads started early, {} claimed, {} wasted",
                s.speculative_launched, s.speculative_claimed, s.speculative_wasted
            ),
        }
    );
    if s.replayed > 0 {
        summary.push_str(&format!("; {} answered by the journal", s.replayed));
    }
    if !outcome.effects.is_empty() {
        let effects: Vec<String> = outcome
            .effects
            .iter()
            .map(|e| {
                let outcome = match e.ok {
                    Some(true) => "",
                    Some(false) => " (failed)",
                    None => " (outcome unknown)",
                };
                format!("{}{outcome}", e.tool)
            })
            .collect();
        summary.push_str(&format!("; effects: {}", effects.join(", ")));
    }
    eprintln!("{summary}");
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

async fn bench(
    scripts: &[PathBuf],
    tools: &ToolsArg,
    flags: &LimitsArg,
    runs: usize,
    json: bool,
    store: Option<Arc<dyn Store>>,
) -> Result<ExitCode, String> {
    let sources = scripts
        .iter()
        .map(|path| read_script(path).map(|source| (path.display().to_string(), source)))
        .collect::<Result<Vec<_>, String>>()?;
    // Check the manifests once, up front: every run builds a fresh runtime from them, so that
    // tools' state (and MCP servers) start afresh.
    let (_, limits) = new_registry(tools).await.map_err(|e| e.to_string())?;
    let limits = flags.apply(limits)?;
    let manifests = tools.manifests.clone();
    let make_runtime = move || -> futures::future::BoxFuture<'static, Result<Runtime, Error>> {
        let tools = ToolsArg {
            manifests: manifests.clone(),
        };
        let store = store.clone();
        let limits = limits.clone();
        Box::pin(async move {
            let mut builder = Runtime::builder(new_registry(&tools).await?.0).limits(limits);
            if let Some(store) = store {
                builder = builder.store(store);
            }
            Ok(builder.build())
        })
    };
    let bar = indicatif::ProgressBar::new((sources.len() * runs * 2) as u64);
    if std::io::stderr().is_terminal() {
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg:24} [{bar:30}] {pos}/{len} runs {elapsed}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
    } else {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    let mut reports = Vec::new();
    for (name, source) in &sources {
        bar.set_message(name.clone());
        let report = bench_script(name, source, runs, &make_runtime, &mut || bar.inc(1))
            .await
            .map_err(|e| format!("{name}: {e}"))?;
        reports.push(report);
    }
    bar.finish_and_clear();
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&reports).unwrap_or_default()
        );
    } else {
        println!(
            "{:<28} {:>12} {:>12} {:>8} {:>10} {:>8} {:>6} {:>8} {:>6} {:>6}  same result",
            "script",
            "sequential",
            "speculative",
            "speedup",
            "best",
            "vs best",
            "calls",
            "launched",
            "wasted",
            "passes"
        );
        for r in &reports {
            let (best, to_best) = match (r.best_ms, r.to_best) {
                (Some(best), Some(ratio)) => (format!("{best:.0} ms"), format!("{ratio:.2}x")),
                _ => ("-".to_string(), "-".to_string()),
            };
            println!(
                "{:<28} {:>9.1} ms {:>9.1} ms {:>7.1}x {:>10} {:>8} {:>6} {:>8} {:>6} {:>6}  {}",
                r.script,
                r.sequential_ms,
                r.speculative_ms,
                r.speedup,
                best,
                to_best,
                r.tool_calls,
                r.launched,
                r.wasted,
                r.scout_passes,
                if r.same_result { "yes" } else { "NO" }
            );
        }
        for r in reports.iter().filter(|r| !r.same_result) {
            eprintln!(
                "{}: {}",
                r.script,
                r.difference.as_deref().unwrap_or_default()
            );
        }
    }
    for r in &reports {
        if let Some(failure) = &r.failure {
            eprintln!(
                "{}: a run failed, so its times measure nothing: {failure}",
                r.script
            );
        }
    }
    Ok(
        if reports.iter().all(|r| r.same_result && r.failure.is_none()) {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        },
    )
}

#[cfg(test)]
mod tests {
    use super::for_terminal;

    #[test]
    fn terminal_escapes_from_scripts_are_shown_not_obeyed() {
        let text = "red \u{1b}[31mtext\r\n\tnext\u{7}";
        let shown = for_terminal(text, true);
        assert_eq!(shown, "red \\u{1b}[31mtext\\r\n\tnext\\u{7}");
        assert_eq!(
            for_terminal(text, false),
            text,
            "a pipe gets the text as it is"
        );
    }
}
