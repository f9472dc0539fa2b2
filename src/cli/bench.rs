//! `toolscript bench SCRIPT...`: run scripts sequentially and speculatively, alternating, and
//! compare wall times and results.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use toolscript::bench::bench_script;
use toolscript::{Error, Runtime, Store};

use super::{new_registry, open_store, read_script, LimitsArg, ToolsArg};

#[derive(clap::Args)]
pub(crate) struct Bench {
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
    /// Use the cache of reads across runs (with --store, runs answer each other's reads):
    /// bench runs without it unless asked, for it measures speculation.
    #[arg(long)]
    cache: bool,
}

impl Bench {
    /// Exit status 1 when a script failed or gave different results in the two modes.
    pub(crate) async fn apply(self) -> Result<ExitCode, String> {
        let store = self.store.map(|path| open_store(Some(path))).transpose()?;
        bench(
            &self.scripts,
            &self.tools,
            &self.limits,
            self.runs as usize,
            self.json,
            store,
            self.cache,
        )
        .await
    }
}

async fn bench(
    scripts: &[PathBuf],
    tools: &ToolsArg,
    flags: &LimitsArg,
    runs: usize,
    json: bool,
    store: Option<Arc<dyn Store>>,
    cache: bool,
) -> Result<ExitCode, String> {
    let sources = scripts
        .iter()
        .map(|path| read_script(path).map(|source| (path.display().to_string(), source)))
        .collect::<Result<Vec<_>, String>>()?;
    // Check the manifests once, up front: every run builds a fresh runtime from them, so that
    // tools' state (and MCP servers) start afresh.
    let (_, limits, _) = new_registry(tools).await.map_err(|e| e.report())?;
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
            let runtime = builder.build();
            Ok(if cache {
                runtime
            } else {
                runtime.without_cache()
            })
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
