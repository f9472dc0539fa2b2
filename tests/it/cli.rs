//! The command line contract (DESIGN.md section 8): `run`, `run --json`, exit statuses, stdin
//! scripts, `--tools` manifests, receipts and `verify`, `check` and `tools`, run on the built binary.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use tempfile::TempDir;

/// What one invocation of the binary produced.
pub(crate) struct Output {
    pub(crate) code: i32,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl std::fmt::Debug for Output {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit status {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

fn command(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_toolscript"));
    cmd.args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("RUST_LOG")
        .env("TOOLSCRIPT_STORE", crate::support::test_store())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Runs the binary with `args` and an empty stdin.
pub(crate) fn toolscript(args: &[&str]) -> Output {
    toolscript_with_stdin(args, "")
}

/// Runs the binary with `args`, writing `input` to its stdin.
fn toolscript_with_stdin(args: &[&str], input: &str) -> Output {
    let mut child = command(args)
        .stdin(Stdio::piped())
        .spawn()
        .expect("the toolscript binary starts");
    {
        let mut stdin = child.stdin.take().expect("stdin is piped");
        // The binary may exit before reading stdin (a usage error); a broken pipe is fine then.
        let _ = stdin.write_all(input.as_bytes());
    }
    let out = child
        .wait_with_output()
        .expect("the toolscript binary ends");
    Output {
        code: out
            .status
            .code()
            .expect("the binary exits with a status, not a signal"),
        stdout: String::from_utf8(out.stdout).expect("stdout is UTF-8"),
        stderr: String::from_utf8(out.stderr).expect("stderr is UTF-8"),
    }
}

/// The demo script, by its absolute path.
fn demo_script() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("scripts/demo.rhai")
        .display()
        .to_string()
}

/// Writes `text` to `name` inside `dir`; returns the path as a string for the command line.
fn write_file(dir: &TempDir, name: &str, text: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, text).expect("the temporary file is written");
    path.display().to_string()
}

/// Parses stdout as exactly one JSON object, with nothing else around it but whitespace.
fn one_json_object(out: &Output) -> serde_json::Map<String, Value> {
    let values: Vec<Value> = serde_json::Deserializer::from_str(&out.stdout)
        .into_iter::<Value>()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("stdout is not only JSON ({e}):\n{out:?}"));
    assert_eq!(
        values.len(),
        1,
        "exactly one JSON value on stdout:\n{out:?}"
    );
    match values.into_iter().next() {
        Some(Value::Object(map)) => map,
        other => panic!("stdout is not a JSON object: {other:?}"),
    }
}

const STAT_COUNTERS: [&str; 8] = [
    "tool_calls",
    "dispatched",
    "speculative_launched",
    "speculative_claimed",
    "speculative_wasted",
    "deduplicated",
    "effectful_calls",
    "scout_passes",
];

/// Checks the shape every `run --json` object has, whether the run succeeded or not, and returns it.
fn run_json_shape(out: &Output) -> serde_json::Map<String, Value> {
    let obj = one_json_object(out);
    let ok = obj
        .get("ok")
        .and_then(Value::as_bool)
        .unwrap_or_else(|| panic!("`ok` is a boolean:\n{out:?}"));
    if ok {
        assert!(obj.contains_key("value"), "`value` when ok:\n{out:?}");
        assert!(!obj.contains_key("error"), "no `error` when ok:\n{out:?}");
    } else {
        assert!(
            !obj.contains_key("value"),
            "no `value` when failed:\n{out:?}"
        );
        let error = obj["error"]
            .as_object()
            .unwrap_or_else(|| panic!("`error` is an object when failed:\n{out:?}"));
        assert!(error["kind"].is_string(), "{out:?}");
        assert!(error["message"].is_string(), "{out:?}");
        for key in ["line", "column"] {
            if let Some(v) = error.get(key) {
                assert!(
                    v.as_u64().is_some_and(|n| n >= 1),
                    "{key} is 1-based: {out:?}"
                );
            }
        }
        if let Some(tool) = error.get("tool") {
            assert!(tool.is_string(), "{out:?}");
        }
    }

    let logs = obj["logs"].as_array().expect("`logs` is an array");
    assert!(
        logs.iter().all(Value::is_string),
        "logs are strings: {logs:?}"
    );

    let effects = obj["effects"].as_array().expect("`effects` is an array");
    for effect in effects {
        let effect = effect.as_object().expect("an effect is an object");
        assert!(effect["tool"].is_string(), "{effect:?}");
        let kind = effect["effect"].as_str().expect("`effect` is a string");
        assert!(
            ["write", "idempotent", "external"].contains(&kind),
            "only non-read calls are effects: {effect:?}"
        );
        assert!(effect.contains_key("args"), "{effect:?}");
        assert!(effect["ok"].is_boolean(), "{effect:?}");
    }

    let stats = obj["stats"].as_object().expect("`stats` is an object");
    let mode = stats["mode"].as_str().expect("`mode` is a string");
    assert!(["speculative", "sequential"].contains(&mode), "mode {mode}");
    let wall = stats["wall_ms"].as_f64().expect("`wall_ms` is a number");
    assert!(wall >= 0.0, "wall_ms {wall}");
    for key in STAT_COUNTERS {
        assert!(
            stats.get(key).and_then(Value::as_u64).is_some(),
            "stats.{key} is a non-negative integer: {stats:?}"
        );
    }
    let n = |key: &str| stats[key].as_u64().unwrap_or_default();
    assert!(n("speculative_claimed") + n("speculative_wasted") <= n("speculative_launched"));
    assert!(n("deduplicated") <= n("tool_calls"));
    assert!(n("effectful_calls") <= n("tool_calls"));
    assert!(
        effects.len() as u64 <= n("effectful_calls"),
        "every effect is an effectful call: {stats:?}"
    );
    obj
}

fn stat(obj: &serde_json::Map<String, Value>, key: &str) -> u64 {
    obj["stats"][key].as_u64().expect("a counter")
}

fn effect_tools(obj: &serde_json::Map<String, Value>) -> Vec<String> {
    obj["effects"]
        .as_array()
        .expect("effects")
        .iter()
        .map(|e| e["tool"].as_str().expect("tool").to_string())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// run, human output

#[test]
fn run_demo_prints_the_value_on_stdout_and_a_summary_on_stderr() {
    let out = toolscript(&["run", "scripts/demo.rhai"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("\"refunded\""), "{out:?}");
    assert!(out.stdout.contains("\"escalated\""), "{out:?}");
    assert!(out.stdout.contains("Hugo Lindqvist"), "{out:?}");
    assert!(out.stderr.contains("tool calls"), "{out:?}");
    assert!(
        !out.stdout.contains("tool calls"),
        "the summary is not on stdout: {out:?}"
    );
    assert!(
        !out.stderr.contains("\"refunded\""),
        "the value is not on stderr: {out:?}"
    );
}

#[test]
fn run_prints_a_plain_value_on_the_last_line_of_stdout() {
    let dir = TempDir::new().unwrap();
    let script = write_file(&dir, "answer.rhai", "let x = 40;\nx + 2\n");
    let out = toolscript(&["run", &script]);
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.stdout.trim_end().lines().last(), Some("42"), "{out:?}");
    assert!(out.stderr.contains("tool calls"), "{out:?}");
}

#[test]
fn run_failing_script_exits_1_with_the_error_on_stderr() {
    let dir = TempDir::new().unwrap();
    let script = write_file(
        &dir,
        "fail.rhai",
        "let ok = 1;\nlet c = get_customer(#{id: 999});\nc.name\n",
    );
    let out = toolscript(&["run", &script]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.contains("not_found"), "{out:?}");
    assert!(
        out.stderr.contains("2:9"),
        "the error names line:column: {out:?}"
    );
    assert!(!out.stdout.contains("not_found"), "{out:?}");
}

// ---------------------------------------------------------------------------------------------
// run --json

#[test]
fn run_json_demo_is_one_object_with_value_logs_effects_and_stats() {
    let out = toolscript(&["run", "--json", &demo_script()]);
    assert_eq!(out.code, 0, "{out:?}");
    let obj = run_json_shape(&out);
    assert_eq!(obj["ok"], json!(true));

    assert_eq!(
        obj["value"],
        json!({
            "refunded": [{"ticket": 8, "customer": "Hugo Lindqvist", "cents": 719}],
            "escalated": [9, 5, 4, 1]
        })
    );
    assert_eq!(
        obj["logs"],
        json!(["14 open tickets, 1 refunded, 4 escalated"])
    );

    assert_eq!(
        effect_tools(&obj),
        [
            "add_ticket_note",
            "issue_refund",
            "close_ticket",
            "add_ticket_note",
            "add_ticket_note",
            "add_ticket_note"
        ]
    );
    let effects = obj["effects"].as_array().unwrap();
    assert_eq!(effects[1]["effect"], json!("write"));
    assert_eq!(
        effects[1]["args"],
        json!({"order_id": 1701, "amount_cents": 719, "reason": "ticket 8: late"})
    );
    assert_eq!(effects[2]["effect"], json!("idempotent"));
    assert_eq!(
        effects[2]["args"],
        json!({"ticket_id": 8, "resolution": "refunded R-1701"})
    );
    assert!(effects.iter().all(|e| e["ok"] == json!(true)));

    // 2 lookups, then 3 reads for each of the 14 open tickets; 6 effectful calls.
    assert_eq!(stat(&obj, "tool_calls"), 50);
    assert_eq!(stat(&obj, "effectful_calls"), 6);
    assert_eq!(stat(&obj, "deduplicated"), 0);
    assert!(stat(&obj, "dispatched") >= 1);
}

#[test]
fn run_json_print_and_debug_go_to_logs_and_nowhere_else() {
    let dir = TempDir::new().unwrap();
    let script = write_file(
        &dir,
        "logs.rhai",
        "print(\"MARKER-first-7d1c\");\n\
         debug(\"MARKER-debug-7d1c\");\n\
         let c = get_customer(#{id: 3});\n\
         print(`MARKER-name-${c.name}`);\n\
         #{ n: 3, f: 1.5, s: \"x\", u: (), b: true, list: [1, 2] }\n",
    );
    let out = toolscript(&["run", "--json", &script]);
    assert_eq!(out.code, 0, "{out:?}");
    let obj = run_json_shape(&out);
    let logs: Vec<&str> = obj["logs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert_eq!(logs.len(), 3, "{logs:?}");
    assert_eq!(logs[0], "MARKER-first-7d1c");
    assert!(logs[1].contains("MARKER-debug-7d1c"), "{logs:?}");
    assert!(logs[2].starts_with("MARKER-name-"), "{logs:?}");
    // Each marker appears once on stdout: inside the JSON `logs`, and nowhere else.
    assert_eq!(
        out.stdout.matches("MARKER-first-7d1c").count(),
        1,
        "{out:?}"
    );
    assert_eq!(
        out.stdout.matches("MARKER-debug-7d1c").count(),
        1,
        "{out:?}"
    );
    assert!(!out.stderr.contains("MARKER"), "{out:?}");
    // Script values map to JSON naturally: integers stay integers, () is null.
    let value = &obj["value"];
    assert!(value["n"].is_i64(), "{value}");
    assert_eq!(value["n"], json!(3));
    assert_eq!(value["f"], json!(1.5));
    assert_eq!(value["s"], json!("x"));
    assert_eq!(value["u"], Value::Null);
    assert_eq!(value["b"], json!(true));
    assert_eq!(value["list"], json!([1, 2]));
}

#[test]
fn run_json_records_failed_and_successful_effects_with_their_args() {
    let dir = TempDir::new().unwrap();
    let script = write_file(
        &dir,
        "effects.rhai",
        "try {\n\
         \x20 issue_refund(#{order_id: 101, amount_cents: 99999999, reason: \"too much\"});\n\
         } catch (e) { print(e.kind); }\n\
         let r = issue_refund(#{order_id: 101, amount_cents: 100, reason: \"test\"});\n\
         r.refund_id\n",
    );
    let out = toolscript(&["run", "--json", &script]);
    assert_eq!(out.code, 0, "{out:?}");
    let obj = run_json_shape(&out);
    assert_eq!(obj["value"], json!("R-101"));
    assert_eq!(obj["logs"], json!(["invalid_input"]));
    assert_eq!(
        obj["effects"],
        json!([
            {"tool": "issue_refund", "effect": "write",
             "args": {"order_id": 101, "amount_cents": 99999999, "reason": "too much"}, "ok": false},
            {"tool": "issue_refund", "effect": "write",
             "args": {"order_id": 101, "amount_cents": 100, "reason": "test"}, "ok": true}
        ])
    );
    assert_eq!(stat(&obj, "effectful_calls"), 2);
}

#[test]
fn run_json_failed_call_exits_1_with_kind_tool_and_the_calls_position() {
    let dir = TempDir::new().unwrap();
    let script = write_file(
        &dir,
        "fail.rhai",
        "print(\"before\");\n\
         let c = get_customer(#{id: 999});\n\
         print(\"after\");\n\
         c.name\n",
    );
    let out = toolscript(&["run", "--json", &script]);
    assert_eq!(out.code, 1, "{out:?}");
    let obj = run_json_shape(&out);
    assert_eq!(obj["ok"], json!(false));
    let error = &obj["error"];
    assert_eq!(error["kind"], json!("not_found"));
    assert_eq!(error["tool"], json!("get_customer"));
    assert_eq!(error["line"], json!(2));
    assert_eq!(error["column"], json!(9));
    assert!(
        error["message"].as_str().unwrap().contains("999"),
        "{error}"
    );
    assert_eq!(error["recoverable"], json!(false));
    // What happened before the failure is kept; nothing after it ran.
    assert_eq!(obj["logs"], json!(["before"]));
    assert_eq!(stat(&obj, "tool_calls"), 1);
}

#[test]
fn run_json_bare_call_failure_points_at_the_call() {
    let dir = TempDir::new().unwrap();
    let script = write_file(&dir, "bare.rhai", "let x = 1;\nget_customer(#{id: 999})\n");
    let out = toolscript(&["run", "--json", &script]);
    assert_eq!(out.code, 1, "{out:?}");
    let obj = run_json_shape(&out);
    assert_eq!(obj["error"]["kind"], json!("not_found"));
    assert_eq!(obj["error"]["line"], json!(2));
    assert_eq!(obj["error"]["column"], json!(1));
}

#[test]
fn run_json_compile_error_is_invalid_script_with_line_and_column() {
    let dir = TempDir::new().unwrap();
    let script = write_file(&dir, "broken.rhai", "let x = 1;\nlet = ;\n");
    let out = toolscript(&["run", "--json", &script]);
    assert_eq!(out.code, 1, "{out:?}");
    let obj = run_json_shape(&out);
    let error = &obj["error"];
    assert_eq!(error["kind"], json!("invalid_script"));
    assert_eq!(error["line"], json!(2));
    assert_eq!(error["column"], json!(5));
    assert!(
        error.get("tool").is_none(),
        "no tool for a syntax error: {error}"
    );
    assert_eq!(stat(&obj, "tool_calls"), 0);
    assert_eq!(obj["effects"], json!([]));
}

#[test]
fn run_json_unknown_tool_by_name_suggests_the_closest() {
    let out = toolscript_with_stdin(
        &["run", "--json", "-"],
        "let x = 1;\nlet y = tool(\"get_custmer\", #{id: 1});\n",
    );
    assert_eq!(out.code, 1, "{out:?}");
    let obj = run_json_shape(&out);
    let error = &obj["error"];
    assert_eq!(error["kind"], json!("unknown_tool"));
    assert_eq!(error["line"], json!(2));
    assert_eq!(error["column"], json!(9));
    let text = format!(
        "{} {}",
        error["message"],
        error["suggested_next_action"].as_str().unwrap_or_default()
    );
    assert!(text.contains("get_customer"), "{error}");
}

#[test]
fn run_sequential_gives_the_same_result_in_sequential_mode() {
    let speculative = toolscript(&["run", "--json", &demo_script()]);
    let sequential = toolscript(&["run", "--json", "--sequential", &demo_script()]);
    assert_eq!(speculative.code, 0, "{speculative:?}");
    assert_eq!(sequential.code, 0, "{sequential:?}");
    let a = run_json_shape(&speculative);
    let b = run_json_shape(&sequential);
    assert_eq!(b["stats"]["mode"], json!("sequential"));
    assert_eq!(stat(&b, "speculative_launched"), 0);
    assert_eq!(stat(&b, "scout_passes"), 0);
    for key in ["ok", "value", "logs", "effects"] {
        assert_eq!(a[key], b[key], "`{key}` is the same in both modes");
    }
    assert_eq!(stat(&a, "tool_calls"), stat(&b, "tool_calls"));
}

// ---------------------------------------------------------------------------------------------
// stdin

#[test]
fn run_dash_reads_the_script_from_stdin() {
    let out = toolscript_with_stdin(&["run", "-"], "let c = get_customer(#{id: 1});\nc.name\n");
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.stdout.trim_end(), "Bruno Lindqvist", "{out:?}");

    let out = toolscript_with_stdin(
        &["run", "--json", "-"],
        "print(\"from stdin\");\n[1, 2, 3].len() * 14\n",
    );
    assert_eq!(out.code, 0, "{out:?}");
    let obj = run_json_shape(&out);
    assert_eq!(obj["value"], json!(42));
    assert_eq!(obj["logs"], json!(["from stdin"]));
}

#[test]
fn check_dash_reads_the_script_from_stdin() {
    let out = toolscript_with_stdin(&["check", "-"], "get_customer(#{id: 1})\n");
    assert_eq!(out.code, 0, "{out:?}");
    let out = toolscript_with_stdin(&["check", "-"], "let a = 1;\nfrobnicate(a)\n");
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stdout.contains("2:1:"), "{out:?}");
    assert!(out.stdout.contains("frobnicate"), "{out:?}");
}

/// A warning (the script runs, but most likely not as meant) is reported, and the check passes.
#[test]
fn check_reports_warnings_and_passes_on_them() {
    let script = "let n = 3;\nprint(\"n is ${n}\");\nlet r = 0;\ntry { r = get_customer(#{id: n}); } catch (e) { r = () }";
    let out = toolscript_with_stdin(&["check", "-"], script);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("2:7: warning:"), "{out:?}");
    assert!(out.stdout.contains("4:1: warning:"), "{out:?}");
    assert!(out.stdout.contains("next: "), "{out:?}");
    let out = toolscript_with_stdin(&["check", "--json", "-"], script);
    let json: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(json["ok"], true, "{json}");
    assert!(
        json["problems"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["severity"] == "warning"),
        "{json}"
    );
}

// ---------------------------------------------------------------------------------------------
// exit status 2: usage, manifest and registry errors

/// Asserts a usage-class failure: status 2, nothing on stdout, and stderr containing each of `needles`.
fn assert_usage_error(out: &Output, needles: &[&str]) {
    assert_eq!(out.code, 2, "{out:?}");
    assert!(
        out.stdout.trim().is_empty(),
        "nothing on stdout for a usage error: {out:?}"
    );
    for needle in needles {
        assert!(
            out.stderr.contains(needle),
            "stderr names {needle:?}: {out:?}"
        );
    }
}

#[test]
fn malformed_manifest_exits_2_naming_the_file_and_line() {
    let dir = TempDir::new().unwrap();
    let manifest = write_file(
        &dir,
        "malformed.toml",
        "[[tool]]\nname = \"a\"\neffect = \n",
    );
    let script = write_file(&dir, "s.rhai", "1\n");
    for json in [false, true] {
        let mut args = vec!["run", "--tools", manifest.as_str(), script.as_str()];
        if json {
            args.insert(1, "--json");
        }
        let out = toolscript(&args);
        assert_usage_error(&out, &["malformed.toml:3"]);
    }
}

#[test]
fn manifest_with_an_unknown_effect_exits_2_naming_the_file_line_and_value() {
    let dir = TempDir::new().unwrap();
    let manifest = write_file(
        &dir,
        "effect.toml",
        "[[tool]]\nname = \"a\"\neffect = \"reed\"\nscript = \"1\"\n",
    );
    let script = write_file(&dir, "s.rhai", "1\n");
    let out = toolscript(&["run", "--tools", &manifest, &script]);
    assert_usage_error(&out, &["effect.toml:3", "reed"]);
    // The message lists what is allowed.
    assert!(
        out.stderr.contains("read") && out.stderr.contains("write"),
        "{out:?}"
    );
}

#[test]
fn manifest_with_two_tools_of_one_name_exits_2_naming_the_tool_and_rule() {
    let dir = TempDir::new().unwrap();
    let manifest = write_file(
        &dir,
        "dup.toml",
        "[[tool]]\nname = \"lookup\"\neffect = \"read\"\nscript = \"1\"\n\n\
         [[tool]]\nname = \"lookup\"\neffect = \"read\"\nscript = \"2\"\n",
    );
    let script = write_file(&dir, "s.rhai", "1\n");
    let expected = ["dup.toml", "`lookup`", "two tools"];
    assert_usage_error(
        &toolscript(&["run", "--tools", &manifest, &script]),
        &expected,
    );
    assert_usage_error(
        &toolscript(&["run", "--json", "--tools", &manifest, &script]),
        &expected,
    );
    assert_usage_error(
        &toolscript(&["check", "--tools", &manifest, &script]),
        &expected,
    );
    assert_usage_error(&toolscript(&["tools", "--tools", &manifest]), &expected);
    // The line is the second declaration's.
    assert!(toolscript(&["tools", "--tools", &manifest])
        .stderr
        .contains("dup.toml:6"));
}

#[test]
fn duplicate_names_across_two_manifests_exit_2() {
    let dir = TempDir::new().unwrap();
    let tool = "[[tool]]\nname = \"lookup\"\neffect = \"read\"\nscript = \"1\"\n";
    let first = write_file(&dir, "first.toml", tool);
    let second = write_file(&dir, "second.toml", tool);
    let out = toolscript(&["tools", "--tools", &first, "--tools", &second]);
    assert_usage_error(&out, &["`lookup`", "two tools"]);
    assert!(out.stderr.contains(".toml"), "names a file: {out:?}");
}

#[test]
fn registry_rules_broken_by_a_manifest_exit_2() {
    let dir = TempDir::new().unwrap();
    let reserved = write_file(
        &dir,
        "reserved.toml",
        "[[tool]]\nname = \"ts_mine\"\neffect = \"read\"\nscript = \"1\"\n",
    );
    assert_usage_error(
        &toolscript(&["tools", "--tools", &reserved]),
        &["reserved.toml", "`ts_mine`", "reserved"],
    );
    let retried_write = write_file(
        &dir,
        "retried.toml",
        "[[tool]]\nname = \"w\"\neffect = \"write\"\nretries = 2\nscript = \"1\"\n",
    );
    assert_usage_error(
        &toolscript(&["tools", "--tools", &retried_write]),
        &["retried.toml", "`w`", "retries"],
    );
}

#[test]
fn missing_files_exit_2_naming_the_file() {
    let dir = TempDir::new().unwrap();
    let missing_script = dir.path().join("no-such-script.rhai").display().to_string();
    assert_usage_error(
        &toolscript(&["run", &missing_script]),
        &["no-such-script.rhai"],
    );
    assert_usage_error(
        &toolscript(&["run", "--json", &missing_script]),
        &["no-such-script.rhai"],
    );
    assert_usage_error(
        &toolscript(&["check", &missing_script]),
        &["no-such-script.rhai"],
    );

    let script = write_file(&dir, "s.rhai", "1\n");
    let missing_manifest = dir.path().join("no-such-tools.toml").display().to_string();
    assert_usage_error(
        &toolscript(&["run", "--tools", &missing_manifest, &script]),
        &["no-such-tools.toml"],
    );
    let missing_receipts = dir.path().join("no-such.jsonl").display().to_string();
    assert_usage_error(
        &toolscript(&["verify", &missing_receipts]),
        &["no-such.jsonl"],
    );
}

#[test]
fn bad_flags_and_subcommands_exit_2() {
    let out = toolscript(&["run", "--bogus", "scripts/demo.rhai"]);
    assert_usage_error(&out, &["--bogus"]);
    let out = toolscript(&["tools", "--format", "yaml"]);
    assert_usage_error(&out, &["yaml"]);
    let out = toolscript(&["frobnicate"]);
    assert_usage_error(&out, &["frobnicate"]);
    let out = toolscript(&["run"]);
    assert_eq!(out.code, 2, "a missing SCRIPT is a usage error: {out:?}");
}

// ---------------------------------------------------------------------------------------------
// --tools

const COUNTER_MANIFEST: &str = r#"
[[tool]]
name = "bump"
description = "Add n to a counter kept in state; return the new total."
effect = "write"
latency_ms = 5
input = { type = "object", properties = { n = { type = "integer", minimum = 1 } }, required = ["n"], additionalProperties = false }
output = { type = "object", required = ["total"] }
script = '''
if state.total == () { state.total = 0; }
state.total += args.n;
#{ total: state.total }
'''

[[tool]]
name = "total"
description = "The counter."
effect = "read"
latency_ms = 5
input = { type = "object", additionalProperties = false }
script = '''
state.total ?? 0
'''
"#;

#[test]
fn tools_manifest_replaces_the_demo_catalog() {
    let dir = TempDir::new().unwrap();
    let manifest = write_file(&dir, "counter.toml", COUNTER_MANIFEST);
    let script = write_file(
        &dir,
        "count.rhai",
        "let before = total();\nbump(#{n: 3});\nlet after = bump(#{n: 4});\n[before, after.total, total()]\n",
    );
    let out = toolscript(&["run", "--json", "--tools", &manifest, &script]);
    assert_eq!(out.code, 0, "{out:?}");
    let obj = run_json_shape(&out);
    assert_eq!(obj["value"], json!([0, 7, 7]));
    assert_eq!(
        obj["effects"],
        json!([
            {"tool": "bump", "effect": "write", "args": {"n": 3}, "ok": true},
            {"tool": "bump", "effect": "write", "args": {"n": 4}, "ok": true}
        ])
    );
    assert_eq!(stat(&obj, "tool_calls"), 4);
    assert_eq!(stat(&obj, "effectful_calls"), 2);

    // The demo's tools are gone.
    let out = toolscript_with_stdin(
        &["run", "--json", "--tools", &manifest, "-"],
        "get_customer(#{id: 1})\n",
    );
    assert_eq!(out.code, 1, "{out:?}");
    assert_eq!(run_json_shape(&out)["error"]["kind"], json!("unknown_tool"));
    let out = toolscript_with_stdin(
        &["run", "--json", "--tools", &manifest, "-"],
        "tool(\"get_customer\", #{id: 1})\n",
    );
    assert_eq!(out.code, 1, "{out:?}");
    assert_eq!(run_json_shape(&out)["error"]["kind"], json!("unknown_tool"));

    let out = toolscript(&["tools", "--tools", &manifest, "--format", "json"]);
    assert_eq!(out.code, 0, "{out:?}");
    let tools: Value = serde_json::from_str(&out.stdout).unwrap();
    let names: Vec<&str> = tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["bump", "total"]);

    let out = toolscript(&["check", "--tools", &manifest, &demo_script()]);
    assert_eq!(out.code, 1, "the demo's tools are unknown here: {out:?}");
    assert!(out.stdout.contains("get_customer"), "{out:?}");
}

#[test]
fn tools_manifest_input_schema_is_enforced() {
    let dir = TempDir::new().unwrap();
    let manifest = write_file(&dir, "counter.toml", COUNTER_MANIFEST);
    let out = toolscript_with_stdin(
        &["run", "--json", "--tools", &manifest, "-"],
        "let a = total();\nbump(#{n: \"three\"})\n",
    );
    assert_eq!(out.code, 1, "{out:?}");
    let obj = run_json_shape(&out);
    let error = &obj["error"];
    assert_eq!(error["kind"], json!("invalid_input"));
    assert_eq!(error["tool"], json!("bump"));
    assert_eq!(error["line"], json!(2));
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("`args.n` must be an int"),
        "{error}"
    );
    // The call was refused before it reached the tool: it is not an effect the run executed.
    assert_eq!(obj["effects"], json!([]), "{obj:?}");
}

#[test]
fn several_tools_manifests_load_together_and_share_state() {
    let dir = TempDir::new().unwrap();
    let writer = write_file(
        &dir,
        "writer.toml",
        "[[tool]]\nname = \"remember\"\neffect = \"write\"\n\
         input = { type = \"object\", properties = { word = { type = \"string\" } }, required = [\"word\"] }\n\
         script = '''\nstate.word = args.word;\n#{ saved: true }\n'''\n",
    );
    let reader = write_file(
        &dir,
        "reader.toml",
        "[[tool]]\nname = \"recall\"\neffect = \"read\"\nlatency_ms = 1\n\
         script = '''\nstate.word ?? \"nothing\"\n'''\n",
    );
    let script = write_file(
        &dir,
        "s.rhai",
        "let a = recall();\nremember(#{word: \"kettle\"});\n[a, recall()]\n",
    );
    let out = toolscript(&[
        "run", "--json", "--tools", &writer, "--tools", &reader, &script,
    ]);
    assert_eq!(out.code, 0, "{out:?}");
    let obj = run_json_shape(&out);
    assert_eq!(obj["value"], json!(["nothing", "kettle"]));
    assert_eq!(effect_tools(&obj), ["remember"]);
}

// ---------------------------------------------------------------------------------------------
// receipts and verify

fn receipt_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .expect("the receipts file exists")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect()
}

fn write_receipt_lines(path: &Path, lines: &[Value]) {
    let text: String = lines.iter().map(|v| format!("{v}\n")).collect();
    std::fs::write(path, text).unwrap();
}

/// Whether a verification failure on stderr names `line` of the receipts file.
fn names_line(stderr: &str, line: usize) -> bool {
    stderr.contains(&format!(":{line}:")) || stderr.contains(&format!("line {line}"))
}

#[test]
fn run_receipts_writes_a_hash_chain_that_verify_accepts() {
    let dir = TempDir::new().unwrap();
    let receipts = dir.path().join("receipts.jsonl");
    let receipts_arg = receipts.display().to_string();
    let script = write_file(
        &dir,
        "r.rhai",
        "let a = get_customer(#{id: 1});\n\
         let b = get_customer(#{id: 2});\n\
         issue_refund(#{order_id: 101, amount_cents: 100, reason: \"test\"});\n\
         a.name\n",
    );
    let out = toolscript(&["run", "--json", "--receipts", &receipts_arg, &script]);
    assert_eq!(out.code, 0, "{out:?}");
    let obj = run_json_shape(&out);

    let lines = receipt_lines(&receipts);
    assert_eq!(
        lines.len() as u64,
        stat(&obj, "dispatched"),
        "one receipt per dispatch"
    );
    assert_eq!(lines.len(), 3);
    let run_id = lines[0]["run_id"].clone();
    let mut prev = Value::Null;
    for (i, r) in lines.iter().enumerate() {
        assert_eq!(r["v"], json!(2), "{r}");
        assert_eq!(r["seq"], json!(i), "{r}");
        assert_eq!(r["run_id"], run_id, "{r}");
        assert_eq!(r["prev"], prev, "the chain links line {}", i + 1);
        let hash = r["hash"].as_str().expect("a hash");
        assert_eq!(hash.len(), 64);
        assert!(hash.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(r["status"], json!("ok"));
        for key in [
            "call_id",
            "parent",
            "tool",
            "effect",
            "speculative",
            "claimed",
            "args_sha256",
            "result_sha256",
            "error_kind",
            "started_ms",
            "duration_ms",
            "attempt",
        ] {
            assert!(r.get(key).is_some(), "receipt field {key}: {r}");
        }
        prev = r["hash"].clone();
    }
    let tools: Vec<&str> = lines.iter().map(|r| r["tool"].as_str().unwrap()).collect();
    assert_eq!(tools, ["get_customer", "get_customer", "issue_refund"]);
    assert_eq!(lines[2]["effect"], json!("write"));

    let out = toolscript(&["verify", &receipts_arg]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains('3'), "verify says how many: {out:?}");

    // `run --json` names the chain's end; `verify --head` finds a file whose end was cut off,
    // which a plain `verify` cannot.
    let head = obj["receipts"]["head"]
        .as_str()
        .expect("the head hash")
        .to_string();
    assert_eq!(obj["receipts"]["count"], json!(3));
    assert_eq!(lines[2]["hash"], json!(head));
    let out = toolscript(&["verify", &receipts_arg, "--head", &head]);
    assert_eq!(out.code, 0, "{out:?}");
    let cut = dir.path().join("cut.jsonl");
    write_receipt_lines(&cut, &lines[..2]);
    let cut_arg = cut.display().to_string();
    assert_eq!(
        toolscript(&["verify", &cut_arg]).code,
        0,
        "a plain verify cannot tell"
    );
    let out = toolscript(&["verify", &cut_arg, "--head", &head]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.contains("receipts are missing"), "{out:?}");
}

/// A receipts file that fails to take an append stops the run before its next call: the
/// first refund is made and receipted, the second is never made.
#[cfg(target_os = "linux")]
#[test]
fn a_receipts_file_that_fails_stops_the_run_before_its_next_call() {
    let dir = TempDir::new().unwrap();
    let script = write_file(
        &dir,
        "two.rhai",
        "issue_refund(#{order_id: 101, amount_cents: 100, reason: \"late\"});\n\
         try { issue_refund(#{order_id: 102, amount_cents: 100, reason: \"late again\"}); } catch (e) { }\n\
         1\n",
    );
    let out = toolscript(&["run", "--json", "--receipts", "/dev/full", &script]);
    assert_eq!(out.code, 1, "{out:?}");
    let obj = one_json_object(&out);
    assert_eq!(obj["error"]["kind"], json!("internal"), "{obj:?}");
    assert!(
        obj["error"]["message"]
            .as_str()
            .unwrap()
            .contains("receipts could not be written"),
        "{obj:?}"
    );
    assert_eq!(
        obj["effects"].as_array().unwrap().len(),
        1,
        "the second refund never ran: {obj:?}"
    );
}

#[test]
fn verify_names_the_first_tampered_line() {
    let dir = TempDir::new().unwrap();
    let receipts = dir.path().join("receipts.jsonl");
    let receipts_arg = receipts.display().to_string();
    let script = write_file(
        &dir,
        "r.rhai",
        "let a = get_customer(#{id: 1});\n\
         let b = get_order(#{id: 101});\n\
         let c = list_orders(#{customer_id: 3});\n\
         [a.id, b.id, c.len()]\n",
    );
    // Sequential, so that the receipts come in program order.
    let out = toolscript(&["run", "--sequential", "--receipts", &receipts_arg, &script]);
    assert_eq!(out.code, 0, "{out:?}");
    let original = receipt_lines(&receipts);
    assert_eq!(original.len(), 3);
    assert_eq!(toolscript(&["verify", &receipts_arg]).code, 0);

    // A changed tool name on line 2.
    let mut lines = original.clone();
    lines[1]["tool"] = json!("get_customer");
    let tampered = dir.path().join("tool.jsonl");
    write_receipt_lines(&tampered, &lines);
    let out = toolscript(&["verify", &tampered.display().to_string()]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(names_line(&out.stderr, 2), "stderr names line 2: {out:?}");
    assert!(!names_line(&out.stderr, 1), "{out:?}");

    // A changed attempt count on line 3.
    let mut lines = original.clone();
    lines[2]["attempt"] = json!(lines[2]["attempt"].as_u64().unwrap() + 1);
    let tampered = dir.path().join("attempt.jsonl");
    write_receipt_lines(&tampered, &lines);
    let out = toolscript(&["verify", &tampered.display().to_string()]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(names_line(&out.stderr, 3), "stderr names line 3: {out:?}");

    // A line removed from the middle breaks the chain at the line that follows it.
    let lines = [original[0].clone(), original[2].clone()];
    let tampered = dir.path().join("removed.jsonl");
    write_receipt_lines(&tampered, &lines);
    let out = toolscript(&["verify", &tampered.display().to_string()]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(names_line(&out.stderr, 2), "stderr names line 2: {out:?}");

    // A line that is not JSON.
    let mut text = std::fs::read_to_string(&receipts).unwrap();
    text.push_str("{not json\n");
    let tampered = dir.path().join("garbage.jsonl");
    std::fs::write(&tampered, text).unwrap();
    let out = toolscript(&["verify", &tampered.display().to_string()]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(names_line(&out.stderr, 4), "stderr names line 4: {out:?}");
}

#[test]
fn receipts_are_written_for_a_failed_run_too() {
    let dir = TempDir::new().unwrap();
    let receipts = dir.path().join("receipts.jsonl");
    let receipts_arg = receipts.display().to_string();
    let script = write_file(&dir, "fail.rhai", "let c = get_customer(#{id: 999});\nc\n");
    let out = toolscript(&["run", "--json", "--receipts", &receipts_arg, &script]);
    assert_eq!(out.code, 1, "{out:?}");
    let lines = receipt_lines(&receipts);
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["status"], json!("error"));
    assert_eq!(lines[0]["error_kind"], json!("not_found"));
    assert_eq!(lines[0]["result_sha256"], Value::Null);
    assert_eq!(toolscript(&["verify", &receipts_arg]).code, 0);
}

#[test]
fn unwritable_receipts_path_exits_2_naming_the_file() {
    let dir = TempDir::new().unwrap();
    let receipts = dir.path().join("no-such-dir").join("receipts.jsonl");
    let script = write_file(&dir, "s.rhai", "get_customer(#{id: 1}).id\n");
    let out = toolscript(&[
        "run",
        "--json",
        "--receipts",
        &receipts.display().to_string(),
        &script,
    ]);
    assert_usage_error(&out, &["receipts.jsonl"]);
    assert!(!receipts.exists());
}

// ---------------------------------------------------------------------------------------------
// check

#[test]
fn check_accepts_the_demo_script() {
    let out = toolscript(&["check", "scripts/demo.rhai"]);
    assert_eq!(out.code, 0, "{out:?}");
    let out = toolscript(&["check", "--json", "scripts/demo.rhai"]);
    assert_eq!(out.code, 0, "{out:?}");
    let obj = one_json_object(&out);
    assert_eq!(Value::Object(obj), json!({"ok": true, "problems": []}));
}

#[test]
fn check_reports_unknown_functions_and_tools_with_line_and_column() {
    let dir = TempDir::new().unwrap();
    let script = write_file(
        &dir,
        "unknown.rhai",
        "let x = 1;\nlet y = frobnicate(x);\ntool(\"no_such_tool\", #{})\n",
    );
    let out = toolscript(&["check", &script]);
    assert_eq!(out.code, 1, "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("2:9: ") && l.contains("frobnicate")),
        "{out:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("3:1: ") && l.contains("no_such_tool")),
        "{out:?}"
    );

    let out = toolscript(&["check", "--json", &script]);
    assert_eq!(out.code, 1, "{out:?}");
    let obj = one_json_object(&out);
    assert_eq!(obj["ok"], json!(false));
    let problems = obj["problems"].as_array().expect("problems");
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert_eq!(problems[0]["line"], json!(2));
    assert_eq!(problems[0]["column"], json!(9));
    assert!(problems[0]["message"]
        .as_str()
        .unwrap()
        .contains("frobnicate"));
    assert_eq!(problems[1]["line"], json!(3));
    assert_eq!(problems[1]["column"], json!(1));
    assert!(problems[1]["message"]
        .as_str()
        .unwrap()
        .contains("no_such_tool"));
}

#[test]
fn check_only_tool_call_to_unknown_tool_fails() {
    let out = toolscript_with_stdin(&["check", "-"], "let a = 1;\ntool(\"no_such_tool\", #{})\n");
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stdout
            .lines()
            .any(|l| l.starts_with("2:1: ") && l.contains("no_such_tool")),
        "{out:?}"
    );
}

#[test]
fn check_reports_a_compile_error() {
    let dir = TempDir::new().unwrap();
    let script = write_file(&dir, "broken.rhai", "let x = 1;\nlet = ;\n");
    let out = toolscript(&["check", &script]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stdout.contains("invalid_script"), "{out:?}");
    assert!(out.stdout.contains("2:5"), "{out:?}");

    let out = toolscript(&["check", "--json", &script]);
    assert_eq!(out.code, 1, "{out:?}");
    let obj = one_json_object(&out);
    assert_eq!(obj["ok"], json!(false));
    let error = &obj["error"];
    assert_eq!(error["kind"], json!("invalid_script"));
    assert_eq!(error["line"], json!(2));
    assert_eq!(error["column"], json!(5));
}

// ---------------------------------------------------------------------------------------------
// tools

const DEMO_TOOLS: [(&str, &str); 13] = [
    ("get_customer", "read"),
    ("list_orders", "read"),
    ("get_order", "read"),
    ("list_open_tickets", "read"),
    ("get_ticket", "read"),
    ("refund_policy", "read"),
    ("list_refunds", "read"),
    ("issue_refund", "write"),
    ("add_ticket_note", "write"),
    ("close_ticket", "idempotent"),
    ("send_email", "external"),
    ("customer_overview", "read"),
    ("refund_and_close", "write"),
];

#[test]
fn tools_text_lists_every_tool_with_its_effect() {
    for args in [&["tools"][..], &["tools", "--format", "text"][..]] {
        let out = toolscript(args);
        assert_eq!(out.code, 0, "{out:?}");
        for (name, effect) in DEMO_TOOLS {
            assert!(
                out.stdout.contains(name),
                "{name} is listed: {}",
                out.stdout
            );
            assert!(
                out.stdout
                    .lines()
                    .any(|l| l.contains(name) && l.contains(effect)),
                "{name} is listed with its effect {effect}"
            );
        }
    }
}

#[test]
fn tools_json_is_an_array_with_name_effect_and_input_schema() {
    let out = toolscript(&["tools", "--format", "json"]);
    assert_eq!(out.code, 0, "{out:?}");
    let tools: Value = serde_json::from_str(&out.stdout).expect("tools --format json is JSON");
    let tools = tools.as_array().expect("an array");
    assert_eq!(tools.len(), DEMO_TOOLS.len());
    for (name, effect) in DEMO_TOOLS {
        let tool = tools
            .iter()
            .find(|t| t["name"] == json!(name))
            .unwrap_or_else(|| panic!("{name} is listed"));
        assert_eq!(tool["effect"], json!(effect), "{tool}");
        assert_eq!(tool["input_schema"]["type"], json!("object"), "{tool}");
        assert!(tool["description"].is_string(), "{tool}");
    }
    let get_customer = tools
        .iter()
        .find(|t| t["name"] == json!("get_customer"))
        .unwrap();
    assert_eq!(
        get_customer["input_schema"]["required"],
        json!(["id"]),
        "{get_customer}"
    );
}

#[test]
fn tools_rhai_declares_a_documented_function_per_tool() {
    let out = toolscript(&["tools", "--format", "rhai"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("fn get_customer("), "{}", out.stdout);
    for (name, _) in DEMO_TOOLS {
        assert!(out.stdout.contains(&format!("fn {name}(")), "fn {name}(");
    }
    let doc_lines: Vec<&str> = out
        .stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("///"))
        .collect();
    assert!(doc_lines.len() >= DEMO_TOOLS.len(), "{}", out.stdout);
    // The doc comment right above `fn get_customer(` carries its description.
    let lines: Vec<&str> = out.stdout.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.contains("fn get_customer("))
        .unwrap();
    let docs: Vec<&str> = lines[..at]
        .iter()
        .rev()
        .take_while(|l| l.trim_start().starts_with("///"))
        .copied()
        .collect();
    assert!(!docs.is_empty(), "get_customer has doc comment lines");
    assert!(
        docs.iter().any(|l| l.contains("Look up one customer")),
        "{docs:?}"
    );
}

#[test]
fn tools_formats_follow_a_custom_manifest() {
    let dir = TempDir::new().unwrap();
    let manifest = write_file(&dir, "counter.toml", COUNTER_MANIFEST);
    let out = toolscript(&["tools", "--tools", &manifest, "--format", "rhai"]);
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.contains("fn bump("), "{}", out.stdout);
    assert!(out.stdout.contains("fn total("), "{}", out.stdout);
    assert!(!out.stdout.contains("fn get_customer("), "{}", out.stdout);
    assert!(
        out.stdout
            .lines()
            .any(|l| l.starts_with("///") && l.contains("Add n to a counter")),
        "{}",
        out.stdout
    );
}

/// `bench` of a script that fails says so and exits 1: its times measure nothing.
#[test]
fn bench_of_a_failing_script_exits_1() {
    let dir = TempDir::new().unwrap();
    let script = write_file(
        &dir,
        "fails.rhai",
        "// best: 20 ms\nget_customer(#{id: 999})\n",
    );
    let out = toolscript(&["bench", "--runs", "1", &script]);
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.contains("a run failed"), "{out:?}");
    assert!(
        out.stdout.contains("20 ms"),
        "the declared best is shown: {out:?}"
    );
}
