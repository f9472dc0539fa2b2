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
//! The same figures under `spec/` against those under `seq/` give what speculation adds per call
//! when there is no latency to hide (the scout's pass, placeholders, the prefetch table).
//!
//! Run with `cargo bench --bench dispatch` (add `-- --quick` for a rough figure).

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use serde_json::Value;
use toolscript::{Effect, Mode, Registry, RunOptions, Runtime, Script, Tool};

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

fn compile(runtime: &Runtime, source: &str) -> Script {
    runtime
        .compile(source)
        .expect("the benchmark's scripts compile")
}

fn dispatch(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
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
        group
            .throughput(Throughput::Elements(N))
            .sample_size(20)
            .measurement_time(Duration::from_secs(3))
            .warm_up_time(Duration::from_secs(1));
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
}

criterion_group!(benches, dispatch);
criterion_main!(benches);
