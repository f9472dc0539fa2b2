//! The per-call overhead of the dispatch path, measured with tools that take no time at all.
//!
//! Each benchmark runs one compiled script through the public API
//! ([`Runtime::run_script`]) on a multi-thread tokio runtime, sequentially (`seq/`) and
//! speculatively (`spec/`). Every script loops 200 times; criterion's `time` is that of one
//! whole run, and its `thrpt` (`Throughput::Elements(200)`) is loop iterations per second:
//!
//! - `a_read_distinct`: 200 read calls with distinct arguments, none of them deduplicated;
//! - `b_baseline`: the same loop without the tool call, the interpreter's own cost;
//! - `c_write_distinct`: 200 write calls with distinct arguments (each ends an epoch and is
//!   logged as an effect);
//! - `d_read_identical`: 200 identical reads, answered by the first from the second on.
//!
//! Every run also pays a fixed cost (a fresh script thread, the run context), which the baseline
//! includes. The per-call overhead of the dispatch path is therefore, with `a`, `b`, `c` the
//! `time` figures:
//!
//! ```text
//! read overhead  = (a - b) / 200
//! write overhead = (c - b) / 200
//! ```
//!
//! and `(d - b) / 200` is the cost of a deduplicated read, which never enters the dispatch path.
//! `spec_unheld/a_read_distinct` is `spec/a_read_distinct` with `SpeculationLimits::hold_quick`
//! off: every read the scout's to start, though `echo` answers at once.
//! The same figures under `spec/` against those under `seq/` give what speculation adds per call
//! when there is no latency to hide (the scout's pass, placeholders, the prefetch table).
//!
//! The `with/` group measures what each optional step adds to a sequential read when it is
//! used, against `with/a_none` (the same runtime without it, measured in the same group): a
//! guard with one rule for the tool (`b_guard_rule`), the same rule with a condition over the
//! arguments (`c_guard_condition`), a redaction path on the arguments (`d_redaction`), and the
//! cache of reads across runs (`e_cache_hit`: in memory, without a store; the first run fills
//! it, so every measured read is answered from it and its tool is not reached). Per call,
//! `(with/x - with/a_none) / 200`.
//!
//! Run with `cargo bench --bench dispatch` (add `-- --quick` for a rough figure).

use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use serde_json::Value;
use toolscript::guard::{Guard, Rule, Ruling};
use toolscript::{Effect, Mode, Registry, RunOptions, Runtime, Script, Tool, ToolBuilder};

/// The number of loop iterations in every script.
const N: u64 = 200;

/// The value of the scripts that sum `0..200`.
const SUM: u64 = N * (N - 1) / 2;

/// A runtime with two zero-latency tools that return their arguments: `echo` (a read) and
/// `record` (a write).
fn runtime() -> Runtime {
    let echo = Tool::builder("echo", Effect::Read).handler(|args: Value| async move { Ok(args) });
    let record =
        Tool::builder("record", Effect::Write).handler(|args: Value| async move { Ok(args) });
    let registry = Registry::builder()
        .tool(echo)
        .tool(record)
        .build()
        .expect("the benchmark's tools are valid");
    Runtime::new(registry)
}

/// The multi-thread tokio runtime every benchmark runs on.
fn tokio_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Every group's settings: throughput in loop iterations, 20 samples of 3 s after 1 s.
fn configure(group: &mut BenchmarkGroup<'_, WallTime>) {
    group
        .throughput(Throughput::Elements(N))
        .sample_size(20)
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_secs(1));
}

fn compile(runtime: &Runtime, source: &str) -> Script {
    runtime
        .compile(source)
        .expect("the benchmark's scripts compile")
}

fn dispatch(c: &mut Criterion) {
    let rt = tokio_runtime();
    let runtime = runtime();
    let scripts = [
        (
            "a_read_distinct",
            "let s = 0; for i in 0..200 { s += echo(#{i: i}).i } s",
            SUM,
        ),
        (
            "b_baseline",
            "let s = 0; for i in 0..200 { s += #{i: i}.i } s",
            SUM,
        ),
        (
            "c_write_distinct",
            "let s = 0; for i in 0..200 { s += record(#{i: i}).i } s",
            SUM,
        ),
        (
            "d_read_identical",
            "let s = 0; for i in 0..200 { s += echo(#{i: 7}).i } s",
            7 * N,
        ),
    ];

    for (group_name, mode) in [("seq", Mode::Sequential), ("spec", Mode::Speculative)] {
        let options = RunOptions::with_mode(mode);
        let mut group = c.benchmark_group(group_name);
        configure(&mut group);
        for (name, source, expected) in scripts {
            let script = compile(&runtime, source);
            // One checked run up front makes sure the benchmark measures successful runs, not a
            // script that stops at its first error.
            let outcome = rt.block_on(runtime.run_script(&script, options.clone()));
            assert_eq!(
                outcome.result.as_ref().ok(),
                Some(&Value::from(expected)),
                "{name}: {:?}",
                outcome.result
            );
            group.bench_function(name, |b| {
                b.iter(|| rt.block_on(runtime.run_script(&script, options.clone())))
            });
        }
        group.finish();
    }

    // The speculative reads again with every read the scout's to start (none held for the
    // executor, though `echo` answers at once): what holding them saves.
    let mut speculation = toolscript::SpeculationLimits::default();
    speculation.hold_quick = false;
    let launching = Runtime::builder(runtime.registry().clone())
        .speculation(speculation)
        .build();
    let mut group = c.benchmark_group("spec_unheld");
    configure(&mut group);
    let (name, source, _) = scripts[0];
    let script = compile(&launching, source);
    let options = RunOptions::with_mode(Mode::Speculative);
    group.bench_function(name, |b| {
        b.iter(|| rt.block_on(launching.run_script(&script, options.clone())))
    });
    group.finish();
}

/// A runtime whose one read, `echo`, is built by `echo` and whose registry has `guard`.
fn runtime_with(echo: impl FnOnce(ToolBuilder) -> ToolBuilder, guard: Option<Guard>) -> Runtime {
    let echo =
        echo(Tool::builder("echo", Effect::Read)).handler(|args: Value| async move { Ok(args) });
    let mut registry = Registry::builder().tool(echo);
    if let Some(guard) = guard {
        registry = registry.guard(guard);
    }
    Runtime::new(registry.build().expect("the benchmark's tools are valid"))
}

/// A guard over the temporary directory with one rule that allows `echo`, under `condition`.
fn guard(condition: Option<&str>) -> Guard {
    let rule =
        Rule::new(["echo"], Ruling::Allow, "echo reads nothing private").expect("a valid rule");
    let rule = match condition {
        Some(condition) => rule.when(condition).expect("a valid condition"),
        None => rule,
    };
    Guard::builder(std::env::temp_dir())
        .rule(rule)
        .build()
        .expect("a valid guard")
}

fn optional_steps(c: &mut Criterion) {
    let rt = tokio_runtime();
    let runtimes = [
        ("a_none", runtime_with(|b| b, None)),
        ("b_guard_rule", runtime_with(|b| b, Some(guard(None)))),
        (
            "c_guard_condition",
            runtime_with(|b| b, Some(guard(Some("args.i >= 0")))),
        ),
        ("d_redaction", runtime_with(|b| b.redact(["args.i"]), None)),
        (
            "e_cache_hit",
            runtime_with(|b| b.cache_ttl(Duration::from_secs(3600)), None),
        ),
    ];
    let options = RunOptions::with_mode(Mode::Sequential);
    let mut group = c.benchmark_group("with");
    configure(&mut group);
    for (name, runtime) in &runtimes {
        let script = compile(
            runtime,
            "let s = 0; for i in 0..200 { s += echo(#{i: i}).i } s",
        );
        let outcome = rt.block_on(runtime.run_script(&script, options.clone()));
        assert_eq!(
            outcome.result.as_ref().ok(),
            Some(&Value::from(SUM)),
            "{name}: {:?}",
            outcome.result
        );
        if *name == "e_cache_hit" {
            // The runs measured are answered by the cache the first one filled.
            let again = rt.block_on(runtime.run_script(&script, options.clone()));
            assert!(again.receipts.iter().all(|r| r.cached), "{name}");
        }
        group.bench_function(*name, |b| {
            b.iter(|| rt.block_on(runtime.run_script(&script, options.clone())))
        });
    }
    group.finish();
}

criterion_group!(benches, dispatch, optional_steps);
criterion_main!(benches);
