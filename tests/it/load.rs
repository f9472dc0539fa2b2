//! Load, bounded in count and time so that it runs in CI: many reads in one run, and many
//! concurrent runs over `serve`. Each test prints what it measured (time, memory); the
//! assertions are on results, never on speed.

use std::process::Stdio;
use std::time::Instant;

use rmcp::model::{CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation};
use rmcp::transport::TokioChildProcess;
use rmcp::ServiceExt;
use serde_json::{json, Value};
use toolscript::{Effect, Limits, Mode, Registry, RunOptions, Runtime, Tool};

/// 10,000 reads of a zero-latency tool in one run, in both modes: every call dispatched and
/// receipted, the same value, and the memory the run held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_reads_in_one_run() {
    const N: u64 = 10_000;
    let echo = Tool::builder("echo", Effect::Read).handler(|args: Value| async move { Ok(args) });
    let mut budget = Limits::default();
    budget.max_calls = N;
    budget.max_speculative_calls = N;
    let runtime = Runtime::builder(Registry::builder().tool(echo).build().unwrap())
        .limits(budget)
        .build();
    let script = format!("let s = 0; for i in 0..{N} {{ s += echo(#{{i: i}}).i }} s");
    for mode in [Mode::Sequential, Mode::Speculative] {
        let before = crate::ALLOCATOR.allocated();
        let started = Instant::now();
        let outcome = runtime.run_with(&script, RunOptions::with_mode(mode)).await;
        let wall = started.elapsed();
        assert_eq!(outcome.result, Ok(json!(N * (N - 1) / 2)), "{mode:?}");
        assert_eq!(outcome.stats.tool_calls, N);
        let executor = outcome
            .receipts
            .iter()
            .filter(|r| !r.speculative || r.claimed);
        assert_eq!(executor.count() as u64, N, "{mode:?}: one receipt a call");
        let held = crate::ALLOCATOR.allocated().saturating_sub(before);
        eprintln!(
            "load: {N} reads, {mode:?}: {:.0} ms, {} dispatched, {} speculative, {:.1} MiB held with its receipts",
            wall.as_secs_f64() * 1e3,
            outcome.stats.dispatched,
            outcome.stats.speculative_launched,
            held as f64 / (1 << 20) as f64
        );
    }
}

/// 200 `run_script` calls at once over one `toolscript serve` on stdio: every one answered
/// with its own result, and the server's peak memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_runs_over_serve() {
    const RUNS: usize = 200;
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_toolscript"));
    cmd.arg("serve")
        .env_remove("RUST_LOG")
        .env("TOOLSCRIPT_STORE", crate::support::test_store());
    // The server's log, kept so that a failure can say why the server went away.
    let log = tempfile::NamedTempFile::new().unwrap();
    let (transport, _stderr) = TokioChildProcess::builder(cmd)
        .stderr(Stdio::from(log.reopen().unwrap()))
        .spawn()
        .expect("toolscript serve starts");
    let log_path = log.path().to_path_buf();
    let server_log = move || std::fs::read_to_string(&log_path).unwrap_or_default();
    let pid = transport.id();
    let client = ClientConfig::new(
        ClientCapabilities::default(),
        Implementation::new("toolscript-load", "0"),
    )
    .serve(transport)
    .await
    .expect("the session initialises");
    let started = Instant::now();
    let calls = (0..RUNS).map(|i| {
        let peer = client.peer().clone();
        let server_log = server_log.clone();
        async move {
            let id = 1 + i % 8;
            let args =
                json!({"script": format!("let c = get_customer(#{{id: {id}}}); [{i}, c.id]")});
            let Value::Object(args) = args else {
                unreachable!()
            };
            let result = peer
                .call_tool(CallToolRequestParams::new("run_script").with_arguments(args))
                .await
                .unwrap_or_else(|e| {
                    panic!(
                        "run_script answers: {e}; the server's log:\n{}",
                        server_log()
                    )
                });
            (i, id, result.structured_content)
        }
    });
    let results = tokio::time::timeout(
        std::time::Duration::from_secs(120),
        futures::future::join_all(calls),
    )
    .await
    .expect("every run is answered in time");
    let wall = started.elapsed();
    for (i, id, structured) in &results {
        let outcome = structured.as_ref().expect("structured content");
        assert_eq!(outcome["ok"], json!(true), "{outcome}");
        assert_eq!(
            outcome["value"],
            json!([i, id]),
            "each run got its own answer"
        );
    }
    let peak = pid
        .and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
        .and_then(|status| {
            status
                .lines()
                .find(|l| l.starts_with("VmHWM:"))
                .map(|l| l.trim_start_matches("VmHWM:").trim().to_string())
        })
        .unwrap_or_else(|| "unknown".to_string());
    eprintln!(
        "load: {RUNS} concurrent run_script calls over serve: {:.0} ms, server peak memory {peak}",
        wall.as_secs_f64() * 1e3
    );
    let _ = client.cancel().await;
}
