//! Manifests: script tools with `args`, the shared `state`, thrown errors, latency, timeouts,
//! retries and repeats; malformed manifests name the file and the line.

use std::path::Path;

use serde_json::json;
use toolscript::{demo_catalog, Error, ErrorKind, Manifests, Runtime};

use crate::support::{error_of, value_of};

fn runtime(text: &str) -> Runtime {
    let mut manifests = Manifests::new();
    manifests.load_str(Path::new("test.toml"), text).unwrap();
    Runtime::new(manifests.into_registry().unwrap())
}

fn load_error(text: &str) -> (Option<usize>, String) {
    let mut manifests = Manifests::new();
    let result = manifests
        .load_str(Path::new("bad.toml"), text)
        .and_then(|()| manifests.into_registry());
    match result {
        Err(Error::Manifest {
            file,
            line,
            message,
            ..
        }) => {
            assert_eq!(file, Path::new("bad.toml"));
            (line, message)
        }
        other => panic!("expected a manifest error, got {other:?}"),
    }
}

const COUNTER: &str = r#"
[[tool]]
name = "add"
effect = "write"
input = { type = "object", properties = { n = { type = "integer" } }, required = ["n"] }
script = '''
if args.n < 0 { throw #{ kind: "invalid_input", message: "n must not be negative" } }
state.total = (state.total ?? 0) + args.n;
if args.n == 13 { throw "unlucky" }
state.total
'''

[[tool]]
name = "total"
effect = "read"
latency_ms = 5
script = "state.total ?? 0"

[[tool]]
name = "spoil"
effect = "write"
allow_repeat = true
script = "state = 5; 1"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_tools_share_state_and_failed_bodies_leave_it_alone() {
    let runtime = runtime(COUNTER);
    let outcome = runtime
        .run(
            r#"
            let seen = [total()];
            add(#{n: 3});
            seen.push(total());
            try { add(#{n: 13}); } catch (e) { seen.push(e.kind); }
            seen.push(total());
            try { add(#{n: -1}); } catch (e) { seen.push(e.kind); }
            try { spoil(); } catch (e) { seen.push(e.kind); }
            seen.push(total());
            seen
            "#,
        )
        .await;
    assert_eq!(
        value_of(&outcome),
        &json!([0, 3, "failed", 3, "invalid_input", "internal", 3])
    );
    // State lives as long as the tools: a second run sees the first run's writes.
    let outcome = runtime.run("total()").await;
    assert_eq!(value_of(&outcome), &json!(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_tool_that_runs_too_long_times_out() {
    let runtime = runtime(
        "[[tool]]\nname = \"spin\"\neffect = \"read\"\ntimeout_ms = 100\nscript = \"let i = 0; while i >= 0 { i += 1; } i\"\n",
    );
    let outcome = runtime.run("spin()").await;
    let e = error_of(&outcome);
    assert!(
        e.kind == ErrorKind::Timeout || e.message.contains("operations"),
        "either the timeout or the tool's operation limit ends it: {e}"
    );
}

/// A quick script tool's body runs in place, on the thread of the script that calls it, where
/// no timer can interrupt it: it stops itself at its call's timeout, in both modes. A read
/// that overran times out; a write is `ambiguous_outcome`, and a body stopped before its end
/// leaves `state` as it found it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_run_in_place_stops_at_its_timeout() {
    use toolscript::Mode;
    let tools = r#"
[[tool]]
name = "nap"
effect = "read"
timeout_ms = 100
script = "if args.long { sleep(30); } 1"

[[tool]]
name = "stamp"
effect = "write"
timeout_ms = 100
allow_repeat = true
script = "state.n = (state.n ?? 0) + 1; if args.long { sleep(30); } state.n"

[[tool]]
name = "peek"
effect = "read"
script = "state.n ?? 0"
"#;
    for mode in [Mode::Sequential, Mode::Speculative] {
        let runtime = runtime(tools);
        // Were the body not stopped in place, each run would last its 30 s sleep.
        let runtime = &runtime;
        let run = |script: &'static str| async move {
            tokio::time::timeout(
                std::time::Duration::from_secs(20),
                crate::support::run_in(runtime, script, mode),
            )
            .await
            .expect("the body stops at its timeout")
        };
        let out = run("nap(#{long: false}) + nap(#{long: true})").await;
        assert_eq!(error_of(&out).kind, ErrorKind::Timeout, "{mode:?}");
        assert_eq!(value_of(&run("stamp(#{long: false})").await), &json!(1));
        let out = run("stamp(#{long: true})").await;
        assert_eq!(error_of(&out).kind, ErrorKind::AmbiguousOutcome, "{mode:?}");
        assert_eq!(value_of(&run("peek()").await), &json!(1), "{mode:?}");
        // The tool's body was slow: its next call runs on the pool, and answers.
        assert_eq!(value_of(&run("nap(#{long: false})").await), &json!(1));
    }
}

/// A body running in place stops when its run is dropped (a client that went away), as one on
/// the pool does: it leaves `state` as it found it and frees the lock it held at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_run_in_place_stops_when_its_run_is_dropped() {
    let runtime = runtime(
        r#"
[[tool]]
name = "stamp"
effect = "write"
script = "state.n = 1; sleep(30); 2"

[[tool]]
name = "peek"
effect = "read"
script = "state.n ?? 0"
"#,
    );
    let dropped = tokio::time::timeout(
        std::time::Duration::from_millis(300),
        runtime.run("stamp()"),
    )
    .await;
    assert!(dropped.is_err(), "the run was still going: {dropped:?}");
    // `peek` waits for the lock `stamp` held: it answers once that body has stopped.
    let peek = tokio::time::timeout(std::time::Duration::from_secs(20), runtime.run("peek()"))
        .await
        .expect("the dropped run's body stopped");
    assert_eq!(value_of(&peek), &json!(0));
}

/// A read body (or a composite) is given a copy of `state` only if its text names it, so that
/// a read that never looks at a large state does not pay for copying it: one that names it
/// sees it; one that does not has no such variable (`eval` being disabled, only a name
/// computed at run time could tell).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_body_that_names_state_is_given_it() {
    let runtime = runtime(
        r#"
[[tool]]
name = "seed"
effect = "write"
script = "state.users = []; for i in 0..5000 { state.users.push(#{ id: i }); } state.users.len()"

[[tool]]
name = "count"
effect = "read"
script = "state.users.len()"

[[tool]]
name = "blind"
effect = "read"
script = 'is_def_var("sta" + "te")'
"#,
    );
    let out = runtime.run("[seed(), count(), blind()]").await;
    assert_eq!(value_of(&out), &json!([5000, 5000, false]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifest_settings_reach_the_spec() {
    let runtime = runtime(
        "[[tool]]\nname = \"lookup\"\ndescription = \"Finds.\"\neffect = \"read\"\ntimeout_ms = 1500\nretries = 2\nspeculate = false\noutput = { type = \"integer\" }\nscript = \"args.x\"\n",
    );
    let spec = runtime.registry().specs().next().unwrap();
    assert_eq!(spec.description, "Finds.");
    assert_eq!(spec.timeout.as_millis(), 1500);
    assert_eq!(spec.retries, 2);
    assert!(!spec.speculate);
    let outcome = runtime.run("lookup(#{x: \"text\"})").await;
    assert_eq!(error_of(&outcome).kind, ErrorKind::InvalidOutput);
    let outcome = runtime.run("lookup(#{x: 4})").await;
    assert_eq!(value_of(&outcome), &json!(4));
}

#[test]
fn malformed_manifests_name_file_line_and_problem() {
    let cases: &[(&str, Option<usize>, &str)] = &[
        ("[[tool]\nname = 1", Some(1), ""),
        ("[[tool]]\nname = \"a\"\neffect = \"read\"\n", Some(1), "script"),
        ("[[tool]]\nname = \"a\"\neffect = \"sometimes\"\nscript = \"1\"\n", Some(3), "read"),
        ("[[tool]]\nname = \"a\"\neffect = \"read\"\nscript = \"1\"\ncolor = 2\n", Some(5), "color"),
        ("[[tool]]\nname = \"a b\"\neffect = \"read\"\nscript = \"1\"\n", Some(1), "tool `a b`"),
        ("[[tool]]\nname = \"ts_x\"\neffect = \"read\"\nscript = \"1\"\n", Some(1), "reserved"),
        ("\n[[tool]]\nname = \"w\"\neffect = \"write\"\nretries = 1\nscript = \"1\"\n", Some(2), "retries"),
        ("[[tool]]\nname = \"a\"\neffect = \"read\"\ntimeout_ms = 0\nscript = \"1\"\n", Some(1), "timeout"),
        ("[[tool]]\nname = \"a\"\neffect = \"read\"\ninput = { type = \"array\" }\nscript = \"1\"\n", Some(1), "object"),
        ("[[tool]]\nname = \"a\"\neffect = \"read\"\noutput = { type = 5 }\nscript = \"1\"\n", Some(1), "output schema"),
        ("[[tool]]\nname = \"a\"\neffect = \"read\"\nscript = '''\n1 +\n'''\n", Some(6), "does not compile"),
        ("[[tool]]\nname = \"a\"\neffect = \"read\"\nnested = [\"b\"]\nscript = \"1\"\n", Some(1), "`b` does not exist"),
        ("[[mcp]]\ncommand = [\"server\"]\n", Some(1), "not started"),
        ("[[mcp]]\nname = \"x\"\n", Some(1), "command"),
    ];
    for (text, line, needle) in cases {
        let (got_line, message) = load_error(text);
        assert_eq!(got_line, *line, "{text:?}: {message}");
        assert!(message.contains(needle), "{text:?}: {message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_catalog_runs_the_demo_script() {
    let runtime = Runtime::new(demo_catalog().unwrap());
    let script =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/demo.rhai")).unwrap();
    let outcome = runtime.run(&script).await;
    let value = value_of(&outcome);
    assert!(value["refunded"].is_array() && value["escalated"].is_array());
    // Every refunded ticket was refunded and closed, in that order, and every effect is a write.
    let refunded = value["refunded"].as_array().unwrap().len();
    let closed = outcome
        .effects
        .iter()
        .filter(|e| e.tool == "close_ticket")
        .count();
    assert!(refunded > 0 && closed == refunded, "{:?}", outcome.effects);
    assert!(outcome
        .effects
        .iter()
        .all(|e| e.effect != toolscript::Effect::Read));
    // Refunds are remembered: running the triage again finds fewer open tickets to refund.
    let again = runtime.run(&script).await;
    let refunded_again = value_of(&again)["refunded"].as_array().unwrap().len();
    assert!(refunded_again < value["refunded"].as_array().unwrap().len().max(1));
}
