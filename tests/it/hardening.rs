//! Guarantees against hostile scripts: a run never outlives its deadline (sleeping included,
//! in the executor or in a branch only the scout walks), compiling is bounded by size, a run
//! whose future is dropped stops, and one whose receipts cannot be written makes no further
//! call.

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::json;
use toolscript::{ErrorKind, Limits, Mode, Registry, RunOptions, Runtime};

use crate::support::{error_of, fixture_tools, run_in, value_of, Probe};

fn runtime_with(probe: &Probe, limits: Limits) -> Runtime {
    let registry = Registry::builder()
        .tools(fixture_tools(probe))
        .build()
        .unwrap();
    Runtime::builder(registry).limits(limits).build()
}

fn short_deadline() -> Limits {
    let mut limits = Limits::default();
    limits.timeout = Duration::from_millis(300);
    limits
}

/// Rhai's `sleep` is one operation; it used to outlive any deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleep_ends_at_the_run_s_deadline() {
    let runtime = runtime_with(&Probe::default(), short_deadline());
    for mode in [Mode::Sequential, Mode::Speculative] {
        let outcome = run_in(&runtime, "let a = 1;\nsleep(100000);\na", mode).await;
        let e = error_of(&outcome);
        assert_eq!(e.kind, ErrorKind::LimitExceeded, "{mode:?}: {e:?}");
        assert!(e.message.contains("deadline"), "{}", e.message);
        assert_eq!(e.line, Some(2), "{mode:?}: the sleep's line");
    }
}

/// A branch the program never takes used to stall the scout in it, and the run with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scout_never_sleeps_in_a_branch_the_run_never_takes() {
    let runtime = runtime_with(&Probe::default(), Limits::default());
    let script = "let out = [];\nfor id in 1..=4 {\n  let u = lookup(#{id: id});\n  if u.id > 100 { sleep(1000000); }\n  out.push(u.id);\n}\nout";
    let outcome = run_in(&runtime, script, Mode::Speculative).await;
    assert_eq!(value_of(&outcome), &json!([1, 2, 3, 4]));
    assert!(outcome.stats.speculative_claimed > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compiling_is_bounded_by_size_and_function_count() {
    let runtime = runtime_with(&Probe::default(), Limits::default());
    let big = "let x = 1;\n".repeat(30_000);
    let e = runtime.compile(&big).unwrap_err();
    assert_eq!(e.kind, ErrorKind::LimitExceeded);
    assert!(e.message.contains("bytes"), "{}", e.message);
    let many: String = (0..1_001)
        .map(|i| format!("fn f{i}() {{ {i} }}\n"))
        .collect();
    let e = runtime.compile(&many).unwrap_err();
    assert_eq!(e.kind, ErrorKind::LimitExceeded, "{e:?}");
    assert!(e.message.contains("1000 functions"), "{e:?}");
    assert_eq!(
        e.limit.map(|l| (l.key, l.value)),
        Some(("max_functions", 1000.0))
    );
    assert!(e.to_string().ends_with("(Limits::max_functions)"), "{e}");
    let fine: String = (0..100).map(|i| format!("fn f{i}() {{ {i} }}\n")).collect();
    assert!(runtime.compile(&(fine + "f99()")).is_ok());
}

/// Dropping a run's future (a client that gave up) ends its script: no call is made after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_run_stops_calling_tools() {
    let probe = Probe::default();
    let runtime = runtime_with(&probe, Limits::default());
    let script = "for i in 0..100000 { get_user(#{id: i % 50}); sleep(0.01); }";
    for mode in [Mode::Sequential, Mode::Speculative] {
        let run = runtime.run_with(script, RunOptions::with_mode(mode));
        assert!(tokio::time::timeout(Duration::from_millis(200), run)
            .await
            .is_err());
        // The script thread looks at its cancellation at every sleep slice; give it time to.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let after_drop = Probe::count(&probe.user_calls);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            Probe::count(&probe.user_calls),
            after_drop,
            "{mode:?}: no call after the run was dropped"
        );
    }
}

/// Appending a receipt failed: the run stops before its next call, and no `catch` goes on.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_receipt_append_stops_the_run_before_its_next_call() {
    for mode in [Mode::Sequential, Mode::Speculative] {
        let probe = Probe::default();
        let runtime = runtime_with(&probe, Limits::default());
        let options = RunOptions::with_mode(mode)
            .receipts(std::path::Path::new("/dev/full"))
            .unwrap();
        let script = "create_order(#{user: 1});\nlet kinds = [];\ntry { create_order(#{user: 2}); } catch (e) { kinds.push(e.kind); }\nkinds";
        let outcome = runtime.run_with(script, options).await;
        let e = error_of(&outcome);
        assert_eq!(e.kind, ErrorKind::Internal, "{mode:?}: {e:?}");
        assert!(e.message.contains("/dev/full"), "{}", e.message);
        assert_eq!(e.line, Some(3), "{mode:?}: stopped at the next call");
        assert_eq!(probe.write_calls.load(Ordering::SeqCst), 1, "{mode:?}");
        assert_eq!(outcome.effects.len(), 1);
    }
}

/// Closures over distinct half-megabyte strings: no size limit sees them, but the memory budget
/// does, and the run ends with `limit_exceeded` instead of the process aborting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_past_its_memory_budget_ends_cleanly() {
    toolscript::set_memory_probe(|| crate::ALLOCATOR.allocated());
    let mut limits = Limits::default();
    // The budget is the whole process's: what it holds now, and 256 MiB more.
    limits.max_memory_mb = (crate::ALLOCATOR.allocated() >> 20) as u64 + 256;
    let runtime = runtime_with(&Probe::default(), limits.clone());
    let script = "let keep = [];\nlet s = \"x\";\nfor i in 0..19 { s += s; }\nfor i in 0..100000 { let t = s + i; keep.push(|| t.len()); }\nkeep.len()";
    let outcome = run_in(&runtime, script, Mode::Sequential).await;
    let e = error_of(&outcome);
    assert_eq!(e.kind, ErrorKind::LimitExceeded, "{e:?}");
    assert!(e.message.contains("memory budget"), "{}", e.message);
    assert_eq!(e.line, Some(4));
    // `replace` is checked before it allocates: a 1 MiB result, not a 17 GB one.
    let outcome = run_in(
        &runtime,
        "let t = \"a\";\nfor i in 0..16 { t += t; }\nlet s = \"bbbbbbbbbbbbbbbb\";\nfor i in 0..12 { s += s; }\nt.replace(\"a\", s); t.len()",
        Mode::Sequential,
    )
    .await;
    let e = error_of(&outcome);
    assert_eq!(e.kind, ErrorKind::LimitExceeded, "{e:?}");
    assert!(e.message.contains("after `replace`"), "{}", e.message);
}
