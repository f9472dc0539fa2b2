//! The dispatch path's cost per call, for an instruction counter: runs a script of `N` reads
//! (or writes) of a zero-latency tool once, sequentially, and prints its value. Run it under
//! callgrind with N and with 0; the difference over N is the cost of one call:
//!
//! ```text
//! cargo build --release --example dispatch_calls
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     target/release/examples/dispatch_calls read 2000
//! ```
//!
//! (`read`, `write`, `same` for one read repeated, answered by the first, or `none` for the loop
//! without calls; `spec-read` runs it speculatively, `spec-launch` too but with every read the
//! scout's to start, none held for the executor: `SpeculationLimits::hold_quick` off.)
//! A third argument runs the script that many times in the process and prints the median wall
//! time of a run, and of a call, and the fastest run's, to stderr: how the cost of a call
//! changes with the run's length (`dispatch_calls spec-read 10000 20`).
//! A fourth adds that many more tools to the registry, none of them called: what a catalog's
//! size costs a run (`dispatch_calls read 1 200 500`).

use serde_json::Value;
use toolscript::{Effect, Mode, Registry, RunOptions, Runtime, Tool};

fn main() {
    let mut args = std::env::args().skip(1);
    let what = args.next().unwrap_or_else(|| "read".to_string());
    let n: u64 = args.next().and_then(|n| n.parse().ok()).unwrap_or(2000);
    let runs: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(1);
    let more: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(0);
    let echo = Tool::builder("echo", Effect::Read).handler(|args: Value| async move { Ok(args) });
    let record =
        Tool::builder("record", Effect::Write).handler(|args: Value| async move { Ok(args) });
    let others = (0..more).map(|i| {
        Tool::builder(format!("other_{i}"), Effect::Read)
            .handler(|args: Value| async move { Ok(args) })
    });
    let registry = Registry::builder()
        .tool(echo)
        .tool(record)
        .tools(others)
        .build()
        .expect("valid tools");
    let mut budget = toolscript::Limits::default();
    budget.max_calls = n + 1;
    budget.max_speculative_calls = n + 1;
    let mut speculation = toolscript::SpeculationLimits::default();
    speculation.hold_quick = what != "spec-launch";
    let runtime = Runtime::builder(registry)
        .limits(budget)
        .speculation(speculation)
        .build();
    let (call, mode) = match what.as_str() {
        "read" => ("echo(#{i: i}).i", Mode::Sequential),
        "spec-read" | "spec-launch" => ("echo(#{i: i}).i", Mode::Speculative),
        "write" => ("record(#{i: i}).i", Mode::Sequential),
        "same" => ("echo(#{i: 7}).i", Mode::Sequential),
        _ => ("#{i: i}.i", Mode::Sequential),
    };
    let script = format!("let s = 0; for i in 0..{n} {{ s += {call} }} s");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    // Compiled once, as a benchmark's script: a run's time is then its own, not its parse's.
    let script = runtime.compile(&script).expect("the script compiles");
    let mut times = Vec::with_capacity(runs);
    let mut last = None;
    for _ in 0..runs.max(1) {
        let start = std::time::Instant::now();
        let outcome = rt.block_on(runtime.run_script(&script, RunOptions::with_mode(mode)));
        times.push(start.elapsed());
        last = Some(outcome);
    }
    let outcome = last.expect("at least one run");
    if runs > 1 {
        times.sort();
        let (median, fastest) = (times[times.len() / 2], times[0]);
        eprintln!(
            "{what} {n}: median of {runs} runs {:.3} ms, {:.2} µs a call; fastest {:.3} ms",
            median.as_secs_f64() * 1e3,
            median.as_secs_f64() * 1e6 / n.max(1) as f64,
            fastest.as_secs_f64() * 1e3,
        );
        let stats = &outcome.stats;
        eprintln!(
            "  last run: {} scout passes ({} operations), {} reads speculated, {} claimed, {} left to the executor",
            stats.scout_passes,
            stats.scout_operations,
            stats.speculative_launched,
            stats.speculative_claimed,
            stats.speculative_held
        );
    }
    println!("{:?}", outcome.result);
}
