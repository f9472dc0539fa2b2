//! Limits: runaway scripts end with `limit_exceeded`; the engine is locked down.

use std::time::Duration;

use toolscript::{ErrorKind, Limits, Runtime};

use crate::support::{error_of, fixture_registry, run, value_of, Probe};

/// Under the defaults, with the process's allocations counted (as the command line counts
/// them), containers are bounded by the memory budget and loops by the operation count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runaway_scripts_hit_a_limit() {
    toolscript::set_memory_probe(|| crate::ALLOCATOR.allocated());
    // Fewer operations than the default, so that the loops end soon in a debug build.
    let mut limits = Limits::default();
    limits.max_operations = 2_000_000;
    // The count is the process's, shared with the tests running beside this one: the budget
    // sits a little above what it holds now, so that reaching it leaves the others room.
    limits.max_memory_mb = (crate::ALLOCATOR.allocated() >> 20) as u64 + 256;
    let runtime = Runtime::builder(fixture_registry(&Probe::default()))
        .limits(limits)
        .build();
    for (script, message) in [
        ("loop { }", "operations"),
        ("let i = 0; while true { i += 1; }", "operations"),
        ("fn f(n) { f(n + 1) }\nf(0)", "nested deeper"),
        ("let s = \"x\";\nloop { s += s; }", "memory"),
        ("let a = [];\nloop { a.push(1); }", "operations"),
        (
            "let m = #{}; let i = 0;\nloop { m[`k${i}`] = i; i += 1; m.len(); }",
            "operations",
        ),
        ("let a = [];\na.pad(1 << 40, 0);", "memory"),
        ("let s = \"\";\ns.pad(1 << 40, \"ab\");", "memory"),
        ("let b = blob(1 << 40);", "memory"),
    ] {
        let outcome = runtime.run(script).await;
        let e = error_of(&outcome);
        assert_eq!(e.kind, ErrorKind::LimitExceeded, "{script}: {e}");
        assert!(e.to_string().contains(message), "{script}: {e}");
        assert!(e.limit.is_some(), "{script}: the limit is data: {e:?}");
        assert!(e.line.is_some(), "{script}: a limit names where it was hit");
    }
}

/// The per-container sizes, when they are set, apply as Rhai measures them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_sizes_apply_when_set() {
    let mut limits = Limits::default();
    limits.max_string_bytes = 1_000;
    limits.max_array_items = 1_000;
    limits.max_map_items = 1_000;
    let runtime = Runtime::builder(fixture_registry(&Probe::default()))
        .limits(limits)
        .build();
    for (script, message) in [
        ("let s = \"x\";\nloop { s += s; }", "max_string_bytes"),
        ("let a = [];\nloop { a.push(1); }", "max_array_items"),
        // Rhai checks a map's size when the map is used, not on every insertion.
        (
            "let m = #{}; let i = 0;\nloop { m[`k${i}`] = i; i += 1; m.len(); }",
            "max_map_items",
        ),
        ("let s = \"\";\ns.pad(2000, \"ab\");", "max_string_bytes"),
        ("let a = [];\na.pad(2000, 0);", "max_array_items"),
    ] {
        let outcome = runtime.run(script).await;
        let e = error_of(&outcome);
        assert_eq!(e.kind, ErrorKind::LimitExceeded, "{script}: {e}");
        assert_eq!(e.limit.map(|l| l.key), Some(message), "{script}: {e}");
        assert_eq!(e.limit.map(|l| l.value), Some(1_000.0), "{script}: {e}");
        assert!(
            e.to_string().ends_with(&format!("(Limits::{message})")),
            "the library names the field: {e}"
        );
    }
}

/// `pad` and `blob`, which allocate what they are asked for in one step, are the built-ins'
/// own below the limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn padding_keeps_its_meaning() {
    let outcome = run(
        "let s = \"ab\"; s.pad(7, \"xyz\"); let t = \"é\"; t.pad(3, '*'); \
         let a = [1]; a.pad(3, 0); let b = blob(2, 0x41); b.pad(3, 0x42); \
         let r = \"abc\"; r.replace(\"b\", \"BB\"); [s, t, a, b.len(), b[2], r]",
    )
    .await;
    assert_eq!(
        value_of(&outcome),
        &serde_json::json!(["abxyzxy", "é**", [1, 0, 0], 3, 0x42, "aBBc"])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_cannot_be_caught() {
    let outcome = run("try { loop { } } catch (e) { \"caught\" }").await;
    assert_eq!(error_of(&outcome).kind, ErrorKind::LimitExceeded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_ends_a_script() {
    let mut limits = Limits::default();
    limits.max_operations = u64::MAX;
    limits.timeout = Duration::from_millis(200);
    let runtime = Runtime::builder(fixture_registry(&Probe::default()))
        .limits(limits)
        .build();
    let outcome = runtime.run("let i = 0;\nloop { i += 1; }").await;
    let e = error_of(&outcome);
    assert_eq!(e.kind, ErrorKind::LimitExceeded);
    assert!(e.message.contains("deadline"), "{}", e.message);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_limits_apply() {
    let mut limits = Limits::default();
    limits.max_operations = 1_000;
    limits.max_call_depth = 4;
    let runtime = Runtime::builder(fixture_registry(&Probe::default()))
        .limits(limits)
        .build();
    let outcome = runtime
        .run("let s = 0; for i in 0..10000 { s += i; } s")
        .await;
    assert!(error_of(&outcome).message.contains("1000 operations"));
    let outcome = runtime
        .run("fn f(n) { if n == 0 { 0 } else { f(n - 1) } }\nf(10)")
        .await;
    assert!(error_of(&outcome).message.contains("4 levels"));
    let outcome = runtime
        .run("fn f(n) { if n == 0 { 0 } else { f(n - 1) } }\nf(2)")
        .await;
    assert_eq!(value_of(&outcome), &serde_json::json!(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_and_import_are_unavailable() {
    for script in ["eval(\"1 + 1\")", "import \"os\" as os;\n1"] {
        let outcome = run(script).await;
        let e = error_of(&outcome);
        assert_eq!(e.kind, ErrorKind::InvalidScript, "{script}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_are_capped() {
    let mut limits = Limits::default();
    limits.max_log_bytes = 100;
    let runtime = Runtime::builder(fixture_registry(&Probe::default()))
        .limits(limits)
        .build();
    let outcome = runtime
        .run("for i in 0..1000 { print(`line ${i}`); } 1")
        .await;
    value_of(&outcome);
    assert!(outcome.logs.len() < 20, "{} lines kept", outcome.logs.len());
    assert!(outcome.logs.last().unwrap().contains("cut at 100 bytes"));
}
