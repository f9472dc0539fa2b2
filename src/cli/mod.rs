//! The subcommands of the command line, one file each, and what they share: the flags of the
//! tools, the store and the limits, and the steps from flags to a runtime.
//!
//! These modules belong to the binary. They use the library through its public API only (the
//! layering test checks that no `crate::` path here leaves `cli`), and they hold the command
//! line's words: a limit is `--max-calls` here, `max_calls` to the library and the MCP server.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use toolscript::{
    demo_catalog, Error, LimitReached, Limits, Manifests, Registry, RunStatus, Runtime,
    SqliteStore, Store,
};

pub(crate) mod artifact;
pub(crate) mod bench;
pub(crate) mod check;
pub(crate) mod plan;
pub(crate) mod prune;
mod report;
pub(crate) mod resume;
pub(crate) mod run;
pub(crate) mod runs;
pub(crate) mod serve;
mod stream;
pub(crate) mod tools;
pub(crate) mod verify;

/// Exit status of a usage, manifest or registry error.
pub(crate) const USAGE: u8 = 2;
/// Exit status of a run that paused, waiting for a person's decision.
const PAUSED: u8 = 3;

#[derive(clap::Args)]
pub(crate) struct ToolsArg {
    /// A tool manifest (TOML); repeat for several. Without it, the embedded demo catalog.
    #[arg(long = "tools", value_name = "MANIFEST")]
    manifests: Vec<PathBuf>,
}

#[derive(clap::Args)]
pub(crate) struct StoreArg {
    /// The store of runs, where every run is journaled so that it can pause for approvals and
    /// be resumed: a SQLite file, or a PostgreSQL database (postgres://USER:PASSWORD@HOST/DB,
    /// docs/several-machines.md). Default: $TOOLSCRIPT_STORE, else toolscript/store.sqlite3 in
    /// the user's data directory (~/.local/share on Linux), created on first use.
    #[arg(long, value_name = "PATH|URL")]
    store: Option<PathBuf>,
    /// Journal nothing: a throwaway run, which cannot be resumed (a call that needs approval
    /// stops it).
    #[arg(long, conflicts_with = "store")]
    no_store: bool,
    #[command(flatten)]
    lease: LeaseArg,
}

impl StoreArg {
    /// The store the flags name, or none for `--no-store`.
    fn open(self) -> Result<Option<Arc<dyn Store>>, String> {
        if self.no_store {
            return Ok(None);
        }
        open_leased(self.store, &self.lease).map(Some)
    }
}

#[derive(clap::Args)]
pub(crate) struct LeaseArg {
    /// How long a run's lease holds unless its owner renews it (every third of it), in
    /// seconds, fractions allowed: a resume elsewhere takes a running run only once its lease
    /// has expired. Default: $TOOLSCRIPT_LEASE_S, else 30.
    #[arg(long = "lease-s", value_name = "SECONDS")]
    lease_s: Option<String>,
}

/// A flag for every limit of `Limits::KEYS` (`--max-calls N`, `--timeout-s S`, ...), each
/// overriding the manifests' `[limits]` and the default.
#[derive(Clone, Default)]
pub(crate) struct LimitsArg {
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
                    .value_name(if key.name.ends_with("_s") { "S" } else { "N" })
                    .value_parser(clap::value_parser!(f64))
                    .allow_negative_numbers(true)
                    .help(if key.max < 2f64.powi(53) {
                        format!(
                            "Limit: {} (default {default}, at most {}; also `{}` in [limits])",
                            key.what, key.max, key.name
                        )
                    } else {
                        format!(
                            "Limit: {} (default {default}; also `{}` in [limits])",
                            key.what, key.name
                        )
                    })
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
            limits.set(name, *value).map_err(|e| {
                let flag = name.replace('_', "-");
                format!("--{flag}: {e}")
            })?;
        }
        Ok(limits)
    }
}

/// How the command line names a limit a run reached, and how to raise it:
/// `max_calls; raise it with --max-calls or `max_calls` in a manifest's [limits]`.
fn name_limit(limit: &LimitReached) -> String {
    let key = limit.key;
    format!(
        "{key}; raise it with --{} or `{key}` in a manifest's [limits]",
        key.replace('_', "-")
    )
}

/// The registry of `--tools` (starting their MCP servers), or the demo catalog.
async fn registry(tools: &ToolsArg) -> Result<Registry, String> {
    Ok(new_registry(tools).await.map_err(|e| e.report())?.0)
}

/// The registry of `--tools`, the limits of their `[limits]` tables over the defaults, and
/// their `[store] keep_days`.
async fn new_registry(tools: &ToolsArg) -> Result<(Registry, Limits, Option<u32>), Error> {
    if tools.manifests.is_empty() {
        return Ok((demo_catalog()?, Limits::default(), None));
    }
    let mut manifests = Manifests::new();
    for path in &tools.manifests {
        manifests.load_file(path)?;
    }
    let limits = manifests.limits().clone();
    let keep_days = manifests.keep_days();
    Ok((manifests.build().await?, limits, keep_days))
}

/// A runtime over the registry of `tools`, journaling in `store`.
async fn runtime(
    tools: &ToolsArg,
    store: Option<Arc<dyn Store>>,
    flags: &LimitsArg,
) -> Result<Runtime, String> {
    let (registry, limits, keep_days) = new_registry(tools).await.map_err(|e| e.report())?;
    let mut builder = Runtime::builder(registry).limits(flags.apply(limits)?);
    if let Some(store) = store {
        if let Some(days) = keep_days {
            keep_for(&*store, days).await;
        }
        builder = builder.store(store);
    }
    Ok(builder.build())
}

/// Removes the completed and failed runs whose record is older than `days` (a manifest's
/// `[store] keep_days`), without rewriting the file: the indexed delete finds nothing to do on
/// most starts. A failure is a warning: the run goes on.
async fn keep_for(store: &dyn Store, days: u32) {
    let mut rule = toolscript::PruneRule::default()
        .older_than(std::time::Duration::from_secs(u64::from(days) * 86_400));
    rule.vacuum = false;
    match toolscript::prune(store, rule).await {
        Ok(pruned) if pruned.runs > 0 => tracing::info!(
            runs = pruned.runs,
            artifacts = pruned.artifacts,
            keep_days = days,
            "old runs removed from the store"
        ),
        Ok(_) => {}
        Err(e) => eprintln!(
            "toolscript: warning: the runs older than keep_days = {days} could not be removed: {}",
            e.report()
        ),
    }
}

/// The store at `path`, else at its default place, with the lease's time to live `lease`
/// gives (else `$TOOLSCRIPT_LEASE_S`, else 30 s): for the commands that run scripts.
fn open_leased(path: Option<PathBuf>, lease: &LeaseArg) -> Result<Arc<dyn Store>, String> {
    let ttl = toolscript::lease_from(lease.lease_s.as_deref())?;
    if let Some(url) = postgres_url(path.as_deref()) {
        let store = toolscript::PostgresStore::new(&url).map_err(|e| e.report())?;
        return Ok(Arc::new(store.with_lease_ttl(ttl)));
    }
    Ok(Arc::new(open_sqlite(path)?.with_lease_ttl(ttl)))
}

/// The store at `path`, else at its default place.
fn open_store(path: Option<PathBuf>) -> Result<Arc<dyn Store>, String> {
    if let Some(url) = postgres_url(path.as_deref()) {
        let store = toolscript::PostgresStore::new(&url).map_err(|e| e.report())?;
        return Ok(Arc::new(store));
    }
    Ok(Arc::new(open_sqlite(path)?))
}

/// The `postgres://` (or `postgresql://`) URL that `--store`, else `$TOOLSCRIPT_STORE`, gives.
fn postgres_url(path: Option<&Path>) -> Option<String> {
    let text = match path {
        Some(path) => path.to_str()?.to_string(),
        None => std::env::var(toolscript::STORE_ENV).ok()?,
    };
    toolscript::is_postgres_url(&text).then_some(text)
}

/// The SQLite store at `path`, else at its default place.
fn open_sqlite(path: Option<PathBuf>) -> Result<SqliteStore, String> {
    let path = path.or_else(SqliteStore::default_path).ok_or_else(|| {
        "no data directory to keep the store of runs in: give --store PATH (or --no-store)"
            .to_string()
    })?;
    SqliteStore::open(&path).map_err(|e| e.report())
}

/// A run id as messages show it: whole up to 64 characters, else its start and its length (a
/// run id is typed or pasted, and may be anything).
fn shown_id(run_id: &str) -> String {
    match run_id.char_indices().nth(64) {
        None => run_id.to_string(),
        Some((end, _)) => format!("{}… ({} bytes)", &run_id[..end], run_id.len()),
    }
}

/// A script file, or stdin for `-`.
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

/// The exit status of a run that ended in `status`.
fn exit_for(status: RunStatus) -> ExitCode {
    match status {
        RunStatus::Completed => ExitCode::SUCCESS,
        RunStatus::Paused => ExitCode::from(PAUSED),
        // Failed, or interrupted (resumable): the run did not finish.
        _ => ExitCode::from(1),
    }
}

/// Completes at Ctrl-C or SIGTERM with the exit status a process killed by it would have (130,
/// 143). The handlers are in place when this returns, so no signal after that comes too early;
/// from then on neither signal ends the process by itself.
pub(crate) fn stop_signal() -> impl std::future::Future<Output = u8> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let term = signal(SignalKind::terminate());
        let int = signal(SignalKind::interrupt());
        async move {
            match (term, int) {
                (Ok(mut term), Ok(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => 143,
                        _ = int.recv() => 130,
                    }
                }
                _ => {
                    let _ = tokio::signal::ctrl_c().await;
                    130
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
            130
        }
    }
}
