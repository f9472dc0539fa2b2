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
//! (`read`, `write` or `none` for the loop without calls; `spec-read` runs it speculatively.)

use serde_json::Value;
use toolscript::{Effect, Mode, Registry, RunOptions, Runtime, Tool};

fn main() {
    let mut args = std::env::args().skip(1);
    let what = args.next().unwrap_or_else(|| "read".to_string());
    let n: u64 = args.next().and_then(|n| n.parse().ok()).unwrap_or(2000);
    let echo = Tool::builder("echo", Effect::Read).handler(|args: Value| async move { Ok(args) });
    let record =
        Tool::builder("record", Effect::Write).handler(|args: Value| async move { Ok(args) });
    let registry = Registry::builder()
        .tool(echo)
        .tool(record)
        .build()
        .expect("valid tools");
    let mut budget = toolscript::Limits::default();
    budget.max_calls = n + 1;
    budget.max_speculative_calls = n + 1;
    let runtime = Runtime::builder(registry).limits(budget).build();
    let (call, mode) = match what.as_str() {
        "read" => ("echo(#{i: i}).i", Mode::Sequential),
        "spec-read" => ("echo(#{i: i}).i", Mode::Speculative),
        "write" => ("record(#{i: i}).i", Mode::Sequential),
        _ => ("#{i: i}.i", Mode::Sequential),
    };
    let script = format!("let s = 0; for i in 0..{n} {{ s += {call} }} s");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let outcome = rt.block_on(runtime.run_with(&script, RunOptions::with_mode(mode)));
    println!("{:?}", outcome.result);
}
