//! What a run is given: its limits (one name each, flag over manifest over default), the
//! script's `input`, the tools' per-run context, and defaults that fit a 100,000-record value.

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tempfile::TempDir;
use toolscript::{Effect, ErrorKind, Limits, Registry, RunOptions, Runtime, Tool};

use crate::cli::toolscript;
use crate::support::{error_of, value_of};

fn write(dir: &TempDir, name: &str, text: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

const COUNTER: &str = r#"
[[tool]]
name = "tick"
effect = "read"
allow_repeat = true
script = "args.n"
"#;

/// Ten calls of `tick`: how far the budget lets it go.
const TEN_CALLS: &str = "let s = 0; for i in 0..10 { s += tick(#{n: i}); } s";

#[test]
fn a_limit_comes_from_its_flag_over_the_last_manifest_over_the_default() {
    let dir = TempDir::new().unwrap();
    let tools = write(&dir, "tools.toml", COUNTER);
    let three = write(
        &dir,
        "three.toml",
        "[limits]\nmax_calls = 3\ntimeout_s = 5\n",
    );
    let four = write(&dir, "four.toml", "[limits]\nmax_calls = 4\n");
    let script = write(&dir, "s.rhai", TEN_CALLS);
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "--no-store", "--json", "--tools", &tools];
        args.extend_from_slice(extra);
        args.push(&script);
        let out = toolscript(&args);
        let json: Value =
            serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
        (out.code, json)
    };
    let (code, json) = run(&[]);
    assert_eq!((code, &json["value"]), (0, &json!(45)), "{json}");
    for (extra, calls) in [
        (&["--tools", three.as_str()][..], 3),
        (
            &["--tools", three.as_str(), "--tools", four.as_str()][..],
            4,
        ),
        (
            &["--tools", four.as_str(), "--tools", three.as_str()][..],
            3,
        ),
        (&["--tools", four.as_str(), "--max-calls", "2"][..], 2),
    ] {
        let (code, json) = run(extra);
        assert_eq!(code, 1, "{extra:?}: {json}");
        assert_eq!(
            json["error"]["kind"], "budget_exceeded",
            "{extra:?}: {json}"
        );
        let message = json["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("at most {calls} tool calls"))
                && message.contains("max_calls")
                && message.contains("--max-calls"),
            "{extra:?}: {message}"
        );
    }
}

#[test]
fn a_bad_limit_is_refused_before_anything_runs() {
    let dir = TempDir::new().unwrap();
    let script = write(&dir, "s.rhai", "1");
    for (manifest, expected) in [
        (
            "[limits]\nmax_tool_calls = 5\n",
            "2: `[limits]`: unknown limit `max_tool_calls`: the limits are max_calls",
        ),
        (
            "[limits]\nmax_calls = \"many\"\n",
            "2: `[limits]` `max_calls` takes a number, not a string",
        ),
        ("[limits]\nmax_calls = 2.5\n", "whole number"),
        (
            "[limits]\nmax_in_flight = 0\n",
            "`max_in_flight` must be at least 1",
        ),
    ] {
        let path = write(&dir, "bad.toml", manifest);
        let out = toolscript(&["run", "--no-store", "--tools", &path, &script]);
        assert_eq!(out.code, 2, "{manifest}: {out:?}");
        assert!(out.stderr.contains(expected), "{manifest}: {out:?}");
    }
    let out = toolscript(&["run", "--no-store", "--timeout-s", "-1", &script]);
    assert_eq!(out.code, 2, "{out:?}");
    assert!(
        out.stderr
            .contains("--timeout-s: `timeout_s` must be at least"),
        "{out:?}"
    );
    let help = toolscript(&["run", "--help"]).stdout;
    for key in Limits::KEYS {
        let flag = format!("--{}", key.name.replace('_', "-"));
        assert!(help.contains(&flag), "`run --help` lists {flag}");
    }
}

#[test]
fn the_deadline_flag_is_the_run_s_one_deadline() {
    let dir = TempDir::new().unwrap();
    let script = write(&dir, "s.rhai", "let i = 0; loop { i += 1; sleep(0.01); }");
    let out = toolscript(&["run", "--no-store", "--json", "--timeout-s", "0.3", &script]);
    let json: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(json["error"]["kind"], "limit_exceeded", "{json}");
    assert!(
        json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("deadline of 0.3 s passed (timeout_s"),
        "{json}"
    );
}

#[test]
fn the_script_reads_its_input() {
    let dir = TempDir::new().unwrap();
    let script = write(
        &dir,
        "s.rhai",
        "if input == () { \"none\" } else { input.user.id * 2 }",
    );
    let file = write(&dir, "in.json", r#"{"user": {"id": 21}}"#);
    for (args, expected) in [
        (vec!["--input", r#"{"user": {"id": 4}}"#], "8"),
        (vec!["--input", &format!("@{file}")], "42"),
        (vec![], "none"),
    ] {
        let mut all = vec!["run", "--no-store"];
        all.extend(args.iter().copied());
        all.push(&script);
        let out = toolscript(&all);
        assert_eq!(
            (out.code, out.stdout.trim()),
            (0, expected),
            "{args:?}: {out:?}"
        );
    }
    let out = toolscript(&["run", "--no-store", "--input", "{user: 1}", &script]);
    assert_eq!(out.code, 2, "{out:?}");
    assert!(
        out.stderr.contains("--input: the argument is not JSON"),
        "{out:?}"
    );
    let missing = dir.path().join("missing.json");
    let out = toolscript(&[
        "run",
        "--no-store",
        "--input",
        &format!("@{}", missing.display()),
        &script,
    ]);
    assert_eq!(out.code, 2, "{out:?}");
    // The input is a constant: a script cannot change it for a later part of itself.
    let assigns = write(&dir, "assigns.rhai", "input = 2;\ninput");
    let out = toolscript(&["run", "--no-store", "--input", "1", "--json", &assigns]);
    let json: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(json["error"]["kind"], "script_error", "{json}");
    assert_eq!(json["error"]["line"], 1, "{json}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_tool_body_of_a_run_gets_its_context_and_the_script_does_not() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = |name: &'static str, effect: Effect| {
        let seen = Arc::clone(&seen);
        Tool::builder(name, effect).composite(move |_, ctx| {
            let seen = Arc::clone(&seen);
            async move {
                seen.lock()
                    .unwrap()
                    .push((ctx.tool.clone(), ctx.context.as_deref().cloned()));
                Ok(json!(ctx.context.as_deref().map(|c| c["tenant"].clone())))
            }
        })
    };
    let outer = Tool::builder("outer", Effect::Read)
        .nested(["inner"])
        .composite(|_, ctx| async move { ctx.call("inner", json!({})).await });
    let mut manifests = toolscript::Manifests::new();
    manifests
        .load_str(
            std::path::Path::new("m.toml"),
            "[[tool]]\nname = \"scripted\"\neffect = \"read\"\nscript = \"ctx.context?.tenant\"\n",
        )
        .unwrap();
    let mut tools = manifests.into_tools();
    tools.extend([
        record("inner", Effect::Read),
        record("note", Effect::Write),
        outer,
    ]);
    let runtime = Runtime::new(Registry::builder().tools(tools).build().unwrap());
    let script = "[outer(), note(), scripted(), type_of(ctx)]";
    let tenant = json!({"tenant": "acme", "token": "secret"});
    let outcome = runtime
        .run_with(script, RunOptions::default().context(tenant.clone()))
        .await;
    // `ctx` is no variable of the script's: the value is not for it.
    assert_eq!(
        error_of(&outcome).kind,
        ErrorKind::ScriptError,
        "{outcome:?}"
    );
    let script = "[outer(), note(), scripted()]";
    let outcome = runtime
        .run_with(script, RunOptions::default().context(tenant.clone()))
        .await;
    assert_eq!(value_of(&outcome), &json!(["acme", "acme", "acme"]));
    assert!(
        outcome
            .receipts
            .iter()
            .all(|r| !serde_json::to_string(r).unwrap().contains("secret")),
        "the context is in no receipt"
    );
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert!(seen.iter().any(|(tool, _)| tool == "inner"), "{seen:?}");
    assert!(
        seen.iter().all(|(_, c)| c.as_ref() == Some(&tenant)),
        "{seen:?}"
    );
    let outcome = runtime.run(script).await;
    assert_eq!(
        value_of(&outcome),
        &json!([null, null, null]),
        "no context: none"
    );
}

/// A tool returning 100,000 records of three fields, filtered, regrouped and counted by a
/// script under the default limits (the memory budget counted, as the command line counts it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_defaults_fit_a_100000_record_result() {
    toolscript::set_memory_probe(|| crate::ALLOCATOR.allocated());
    let users = Tool::builder("list_users", Effect::Read).handler(|_| async {
        let users: Vec<Value> = (0..100_000)
            .map(|i| json!({"id": i, "name": format!("user{i}"), "team": i % 10}))
            .collect();
        Ok(Value::Array(users))
    });
    let runtime = Runtime::new(Registry::builder().tool(users).build().unwrap());
    let script = r#"
        let users = list_users();
        let picked = [];
        let by_name = #{};
        for u in users {
            if u.team < 3 { picked.push(#{ id: u.id, name: u.name }); }
            by_name[u.name] = u.team;
        }
        let sevens = users.filter(|u| u.team == 7).map(|u| u.id);
        #{ users: users.len(), picked: picked.len(), names: by_name.len(),
           sevens: sevens.len(), last: picked[-1] }
    "#;
    let outcome = runtime.run(script).await;
    assert_eq!(
        value_of(&outcome),
        &json!({"users": 100_000, "picked": 30_000, "names": 100_000, "sevens": 10_000,
                "last": {"id": 99_992, "name": "user99992"}})
    );
}

/// Every limit a script can reach names its key when it is reached, whichever part of the
/// runtime enforces it. `max_speculative_calls` and `max_in_flight` never fail a run that the
/// sequential run would not fail (the scout stops starting reads; the executor makes one call
/// at a time), and `max_inline_tokens` keeps what does not fit as an artifact.
#[test]
fn every_limit_names_its_key_when_it_is_reached() {
    let dir = TempDir::new().unwrap();
    let tools = write(&dir, "tools.toml", COUNTER);
    let deep = format!("{}1{}", "(".repeat(20), ")".repeat(20));
    let cases: Vec<(&str, String, String)> = vec![
        ("max_calls", "2".into(), TEN_CALLS.into()),
        ("timeout_s", "0.2".into(), "loop { sleep(0.01); }".into()),
        ("max_operations", "1000".into(), "loop { }".into()),
        (
            "max_call_depth",
            "8".into(),
            "fn f(n) { f(n + 1) }\nf(0)".into(),
        ),
        ("max_expr_depth", "8".into(), deep),
        (
            "max_string_bytes",
            "100".into(),
            "let s = \"x\";\nloop { s += s; }".into(),
        ),
        (
            "max_array_items",
            "100".into(),
            "let a = [];\nloop { a.push(1); }".into(),
        ),
        (
            "max_map_items",
            "100".into(),
            "let m = #{}; let i = 0;\nloop { m[`k${i}`] = i; i += 1; m.len(); }".into(),
        ),
        ("max_script_bytes", "10".into(), "let x = 1; x + 1".into()),
        (
            "max_functions",
            "2".into(),
            "fn a() { 1 }\nfn b() { 2 }\nfn c() { 3 }\n1".into(),
        ),
        (
            "max_variables",
            "2".into(),
            "let a = 1; let b = 2; let c = 3; a + b + c".into(),
        ),
        (
            "max_memory_mb",
            "64".into(),
            "let s = \"x\";\nloop { s += s; }".into(),
        ),
    ];
    for (key, value, script) in &cases {
        let path = write(&dir, "s.rhai", script);
        let flag = format!("--{}", key.replace('_', "-"));
        let out = toolscript(&[
            "run",
            "--no-store",
            "--json",
            "--tools",
            &tools,
            &flag,
            value,
            &path,
        ]);
        let json: Value =
            serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{key}: {e}: {out:?}"));
        let error = &json["error"];
        assert!(
            matches!(
                error["kind"].as_str(),
                Some("limit_exceeded" | "budget_exceeded")
            ),
            "{key}: {json}"
        );
        let message = error["message"].as_str().unwrap();
        assert!(
            message.contains(key) && message.contains(&flag),
            "{key}: {message}"
        );
    }
    let prints = write(&dir, "p.rhai", "for i in 0..100 { print(`line ${i}`); } 1");
    let out = toolscript(&[
        "run",
        "--no-store",
        "--json",
        "--max-log-bytes",
        "60",
        &prints,
    ]);
    let json: Value = serde_json::from_str(&out.stdout).unwrap();
    let last = json["logs"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .as_str()
        .unwrap()
        .to_string();
    assert!(last.contains("max_log_bytes"), "{json}");
    let big = write(
        &dir,
        "b.rhai",
        "let a = [];\nfor i in 0..5000 { a.push(`item ${i}`); }\na",
    );
    let out = toolscript(&[
        "run",
        "--no-store",
        "--json",
        "--max-inline-tokens",
        "200",
        &big,
    ]);
    let json: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(json["ok"], true, "{json}");
    assert!(
        json["value"].get("rest").is_some(),
        "the value says what was left out: {json}"
    );
    let covered: Vec<&str> = cases.iter().map(|c| c.0).collect();
    for key in Limits::KEYS {
        assert!(
            covered.contains(&key.name)
                || [
                    "max_speculative_calls",
                    "max_in_flight",
                    "max_log_bytes",
                    "max_inline_tokens",
                    // Not a run's: an expired plan is refused (plans::an_expired_plan_*).
                    "plan_ttl_s",
                    // Not a run's: the streaming phase's (streaming::the_stream_has_a_bound_*).
                    "stream_timeout_s"
                ]
                .contains(&key.name),
            "a new limit, `{}`, needs a case here",
            key.name
        );
    }
}
