//! `toolscript bench`: each script run sequentially and speculatively, alternating, on fresh
//! runtimes; median wall times, the speedup, and a check that both modes gave the same result.

use futures::future::BoxFuture;
use serde::Serialize;
use serde_json::{json, Value};

use crate::error::{Error, RunError};
use crate::report::Mode;
use crate::runtime::{RunOptions, RunOutcome, Runtime};

/// What `bench` measured for one script.
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct BenchReport {
    /// The script, as named on the command line.
    pub script: String,
    /// Runs of each mode.
    pub runs: usize,
    /// Median wall time of the sequential runs, in milliseconds.
    pub sequential_ms: f64,
    /// Median wall time of the speculative runs, in milliseconds.
    pub speculative_ms: f64,
    /// `sequential_ms / speculative_ms`.
    pub speedup: f64,
    /// Tool calls the script made (the same in both modes).
    pub tool_calls: u64,
    /// Median speculative reads launched per speculative run.
    pub launched: u64,
    /// Median speculative reads wasted per speculative run.
    pub wasted: u64,
    /// Median scout passes per speculative run.
    pub scout_passes: u64,
    /// Median interpreter operations of the executor.
    pub script_operations: u64,
    /// Median interpreter operations of the scout, all passes.
    pub scout_operations: u64,
    /// Whether every pair of runs gave the same value or error, logs and effects.
    pub same_result: bool,
    /// The first difference found, if any.
    pub difference: Option<String>,
    /// The best possible wall time the script declares (`// best: 40 ms` on one of its first
    /// lines): its rounds of reads under the epoch rule and the default caps.
    pub best_ms: Option<f64>,
    /// `speculative_ms / best_ms`, when the script declares its best.
    pub to_best: Option<f64>,
    /// The error of the first run that failed, if any did: a benchmark of a failing script
    /// measures nothing.
    pub failure: Option<String>,
}

/// The best possible time a script declares in its first lines: `// best: 40 ms`.
pub fn declared_best_ms(source: &str) -> Option<f64> {
    source.lines().take(5).find_map(|line| {
        let rest = line
            .trim()
            .strip_prefix("//")?
            .trim()
            .strip_prefix("best:")?;
        let number: String = rest
            .trim()
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        number.parse().ok()
    })
}

/// The observable result of a run, for comparing two runs: its value or error, its logs, its
/// effects, in order, and its warnings. This is what speculation must keep the same as a
/// sequential run (ARCHITECTURE.md, "Invariants").
pub fn observable(outcome: &RunOutcome) -> Value {
    let result = match &outcome.result {
        Ok(value) => json!({"value": value}),
        Err(e) => json!({"error": e.to_json()}),
    };
    json!({
        "result": result,
        "logs": outcome.logs,
        "effects": outcome.effects,
        "warnings": outcome.warnings,
        "warnings_left_out": outcome.warnings_left_out,
    })
}

/// Benchmarks one script: `runs` runs of each mode, alternating which goes first, each on a
/// runtime from `make_runtime` (so tools' state starts afresh). `after_run` is called after
/// every run, for progress.
///
/// # Errors
///
/// The script's compile error, or the error `make_runtime` returned.
pub async fn bench_script(
    name: &str,
    source: &str,
    runs: usize,
    make_runtime: &dyn Fn() -> BoxFuture<'static, Result<Runtime, Error>>,
    after_run: &mut dyn FnMut(),
) -> Result<BenchReport, BenchError> {
    let runs = runs.max(1);
    let mut sequential = Vec::with_capacity(runs);
    let mut speculative = Vec::with_capacity(runs);
    let mut difference = None;
    for i in 0..runs {
        let order = if i % 2 == 0 {
            [Mode::Sequential, Mode::Speculative]
        } else {
            [Mode::Speculative, Mode::Sequential]
        };
        let mut pair = Vec::with_capacity(2);
        for mode in order {
            let runtime = make_runtime().await.map_err(BenchError::Setup)?;
            let script = runtime.compile(source).map_err(BenchError::Script)?;
            let outcome = runtime
                .run_script(&script, RunOptions::with_mode(mode))
                .await;
            after_run();
            pair.push((mode, outcome));
        }
        let (a, b) = (observable(&pair[0].1), observable(&pair[1].1));
        if a != b && difference.is_none() {
            difference = Some(format!(
                "run {}: sequential and speculative differ: {a} / {b}",
                i + 1
            ));
        }
        for (mode, outcome) in pair {
            match mode {
                Mode::Sequential => sequential.push(outcome),
                _ => speculative.push(outcome),
            }
        }
    }
    let median_ms =
        |outcomes: &[RunOutcome]| median_f(outcomes.iter().map(|o| o.stats.wall_ms).collect());
    let median_of = |f: &dyn Fn(&RunOutcome) -> u64| median_u(speculative.iter().map(f).collect());
    let (sequential_ms, speculative_ms) = (median_ms(&sequential), median_ms(&speculative));
    let best_ms = declared_best_ms(source);
    let failure = sequential
        .iter()
        .chain(&speculative)
        .find_map(|o| o.result.as_ref().err())
        .map(|e| e.to_string());
    Ok(BenchReport {
        script: name.to_string(),
        runs,
        sequential_ms,
        speculative_ms,
        speedup: sequential_ms / speculative_ms.max(f64::MIN_POSITIVE),
        tool_calls: sequential[0].stats.tool_calls,
        launched: median_of(&|o| o.stats.speculative_launched),
        wasted: median_of(&|o| o.stats.speculative_wasted),
        scout_passes: median_of(&|o| o.stats.scout_passes),
        script_operations: median_u(
            sequential
                .iter()
                .map(|o| o.stats.script_operations)
                .collect(),
        ),
        scout_operations: median_of(&|o| o.stats.scout_operations),
        same_result: difference.is_none(),
        difference,
        best_ms,
        to_best: best_ms.map(|best| speculative_ms / best),
        failure,
    })
}

/// Why a script could not be benchmarked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    /// The runtime could not be built.
    #[error("{0}")]
    Setup(Error),
    /// The script does not compile.
    #[error("{0}")]
    Script(RunError),
}

fn median_f(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

fn median_u(mut values: Vec<u64>) -> u64 {
    values.sort_unstable();
    values.get(values.len() / 2).copied().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median_f(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median_f(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median_u(vec![5, 1, 9]), 5);
    }

    #[test]
    fn scripts_declare_their_best_time() {
        assert_eq!(
            declared_best_ms("// best: 40 ms — two rounds\nx"),
            Some(40.0)
        );
        assert_eq!(declared_best_ms("let a = 1;\n//best: 2.5ms\n"), Some(2.5));
        assert_eq!(declared_best_ms("// the best there is\n1"), None);
    }
}
