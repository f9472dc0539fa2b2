//! The command line contract: `run`, `run --json`, exit statuses, stdin scripts, `--tools`
//! manifests, receipts and `verify`, `check`, `tools` and `bench`, run on the built binary.
//!
//! Most of it is one table, [`CASES`]: arguments (with files and stdin) and what the binary must
//! give, as JSON fields of its `--json` output and exact lines (or line patterns) of its text.
//! What takes several invocations (receipts then `verify`, two modes compared) is a test of its
//! own below the table.

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

// ---------------------------------------------------------------------------------------------
// The table

/// One invocation of the binary and what it must give.
struct Case {
    /// What the case shows, for the failure message.
    name: &'static str,
    /// The arguments. `{demo}` is the demo script; `{FILE}` is the path of the case's file
    /// `FILE`, written in a fresh temporary folder.
    args: &'static [&'static str],
    /// The files to write first: name and text.
    files: &'static [(&'static str, &'static str)],
    /// What stdin holds.
    stdin: &'static str,
    /// The exit status.
    code: i32,
    /// JSON pointers into the one JSON value on stdout, and the JSON each points at. A `*`
    /// step maps the rest of the pointer over an array's items. `"<absent>"` is a pointer
    /// that must find nothing, `"<string>"` any string, `">=N"` a number of at least N.
    json: &'static [(&'static str, &'static str)],
    /// The whole of stdout, when it is known exactly.
    stdout_is: Option<&'static str>,
    /// Lines that stdout must hold, as patterns: `*` is any text, `{dir}` the temporary folder.
    stdout: &'static [&'static str],
    /// Lines that stderr must hold, as patterns.
    stderr: &'static [&'static str],
    /// Text that appears nowhere on stdout.
    not_stdout: &'static [&'static str],
    /// Text that appears nowhere on stderr.
    not_stderr: &'static [&'static str],
}

const CASE: Case = Case {
    name: "",
    args: &[],
    files: &[],
    stdin: "",
    code: 0,
    json: &[],
    stdout_is: None,
    stdout: &[],
    stderr: &[],
    not_stdout: &[],
    not_stderr: &[],
};

const DEMO_VALUE: &str = r#"{"refunded": [{"ticket": 8, "customer": "Hugo Lindqvist", "cents": 719}], "escalated": [9, 5, 4, 1]}"#;

const DEMO_NAMES: &str = r#"["get_customer", "list_orders", "get_order", "list_open_tickets", "get_ticket", "refund_policy", "list_refunds", "issue_refund", "add_ticket_note", "close_ticket", "send_email", "customer_overview", "refund_and_close"]"#;

const DEMO_EFFECTS: &str = r#"["read", "read", "read", "read", "read", "read", "read", "write", "write", "idempotent", "external", "read", "write"]"#;

const FAIL_999: &str = "let ok = 1;\nlet c = get_customer(#{id: 999});\nc.name\n";
const BROKEN: &str = "let x = 1;\nlet = ;\n";
const UNKNOWN: &str = "let x = 1;\nlet y = frobnicate(x);\ntool(\"no_such_tool\", #{})\n";
const WARNINGS: &str = "let n = 3;\nprint(\"n is ${n}\");\nlet r = 0;\ntry { r = get_customer(#{id: n}); } catch (e) { r = () }";
const TEN_READS: &str = "let s = 0;\nfor i in 1..10 { s += get_customer(#{id: i}).id; }\ns\n";
const DUP: &str = "[[tool]]\nname = \"lookup\"\neffect = \"read\"\nscript = \"1\"\n\n[[tool]]\nname = \"lookup\"\neffect = \"read\"\nscript = \"2\"\n";
const LOOKUP: &str = "[[tool]]\nname = \"lookup\"\neffect = \"read\"\nscript = \"1\"\n";

const CASES: &[Case] = &[
    // run, human output
    Case {
        name: "the demo's value on stdout, its logs and summary on stderr",
        args: &["run", "{demo}"],
        stdout: &[
            "  \"escalated\": [",
            "  \"refunded\": [",
            "      \"customer\": \"Hugo Lindqvist\",",
        ],
        stderr: &[
            "14 open tickets, 1 refunded, 4 escalated",
            "50 tool calls (* dispatched, 0 deduplicated, 6 effectful) in * ms, speculative: * reads started early, * claimed, * wasted; effects: add_ticket_note, issue_refund, close_ticket, add_ticket_note, add_ticket_note, add_ticket_note",
        ],
        not_stdout: &["tool calls"],
        not_stderr: &["\"refunded\""],
        ..CASE
    },
    Case {
        name: "a plain value is stdout's one line",
        args: &["run", "{answer.rhai}"],
        files: &[("answer.rhai", "let x = 40;\nx + 2\n")],
        stdout_is: Some("42\n"),
        stderr: &["0 tool calls (0 dispatched, 0 deduplicated, 0 effectful) in * ms, *"],
        ..CASE
    },
    Case {
        name: "a failing script exits 1 with the error and its line:column on stderr",
        args: &["run", "{fail.rhai}"],
        files: &[("fail.rhai", FAIL_999)],
        code: 1,
        stdout_is: Some(""),
        stderr: &[
            "error: not_found in `get_customer` at 2:9: no customer 999",
            "  hint: check the identifier; look it up with a search tool first",
        ],
        ..CASE
    },
    // run --json
    Case {
        name: "the demo as one object: value, logs, effects with their args, stats",
        args: &["run", "--json", "{demo}"],
        json: &[
            ("/ok", "true"),
            ("/status", r#""completed""#),
            ("/value", DEMO_VALUE),
            ("/logs", r#"["14 open tickets, 1 refunded, 4 escalated"]"#),
            (
                "/effects/*/tool",
                r#"["add_ticket_note", "issue_refund", "close_ticket", "add_ticket_note", "add_ticket_note", "add_ticket_note"]"#,
            ),
            ("/effects/*/ok", "[true, true, true, true, true, true]"),
            ("/effects/1/effect", r#""write""#),
            (
                "/effects/1/args",
                r#"{"order_id": 1701, "amount_cents": 719, "reason": "ticket 8: late"}"#,
            ),
            ("/effects/2/effect", r#""idempotent""#),
            (
                "/effects/2/args",
                r#"{"ticket_id": 8, "resolution": "refunded R-1701"}"#,
            ),
            // 2 lookups, then 3 reads for each of the 14 open tickets; 6 effectful calls.
            ("/stats/tool_calls", "50"),
            ("/stats/effectful_calls", "6"),
            ("/stats/deduplicated", "0"),
            ("/stats/dispatched", ">=1"),
        ],
        ..CASE
    },
    Case {
        name: "print and debug go to `logs` and nowhere else; values map to JSON naturally",
        args: &["run", "--json", "{logs.rhai}"],
        files: &[(
            "logs.rhai",
            "print(\"MARKER-first-7d1c\");\n\
             debug(\"MARKER-debug-7d1c\");\n\
             let c = get_customer(#{id: 3});\n\
             print(`MARKER-name-${c.name}`);\n\
             #{ n: 3, f: 1.5, s: \"x\", u: (), b: true, list: [1, 2] }\n",
        )],
        json: &[
            (
                "/logs",
                r#"["MARKER-first-7d1c", "\"MARKER-debug-7d1c\"", "MARKER-name-Dana Tanaka"]"#,
            ),
            // Integers stay integers (`3`, not `3.0`), `()` is null.
            (
                "/value",
                r#"{"n": 3, "f": 1.5, "s": "x", "u": null, "b": true, "list": [1, 2]}"#,
            ),
        ],
        not_stderr: &["MARKER"],
        ..CASE
    },
    Case {
        name: "failed and successful effects are recorded with their args",
        args: &["run", "--json", "{effects.rhai}"],
        files: &[(
            "effects.rhai",
            "try {\n\
             \x20 issue_refund(#{order_id: 101, amount_cents: 99999999, reason: \"too much\"});\n\
             } catch (e) { print(e.kind); }\n\
             let r = issue_refund(#{order_id: 101, amount_cents: 100, reason: \"test\"});\n\
             r.refund_id\n",
        )],
        json: &[
            ("/value", r#""R-101""#),
            ("/logs", r#"["invalid_input"]"#),
            (
                "/effects",
                r#"[{"tool": "issue_refund", "effect": "write", "args": {"order_id": 101, "amount_cents": 99999999, "reason": "too much"}, "ok": false},
                    {"tool": "issue_refund", "effect": "write", "args": {"order_id": 101, "amount_cents": 100, "reason": "test"}, "ok": true}]"#,
            ),
            ("/stats/effectful_calls", "2"),
        ],
        ..CASE
    },
    Case {
        name: "a failed call: kind, tool, the call's position; what ran before it is kept",
        args: &["run", "--json", "{fail.rhai}"],
        files: &[(
            "fail.rhai",
            "print(\"before\");\nlet c = get_customer(#{id: 999});\nprint(\"after\");\nc.name\n",
        )],
        code: 1,
        json: &[
            ("/ok", "false"),
            ("/status", r#""failed""#),
            ("/value", "<absent>"),
            (
                "/error",
                r#"{"kind": "not_found", "tool": "get_customer", "line": 2, "column": 9,
                    "message": "no customer 999", "recoverable": false,
                    "suggested_next_action": "check the identifier; look it up with a search tool first"}"#,
            ),
            ("/logs", r#"["before"]"#),
            ("/stats/tool_calls", "1"),
        ],
        ..CASE
    },
    Case {
        name: "a bare call's failure points at the call",
        args: &["run", "--json", "{bare.rhai}"],
        files: &[("bare.rhai", "let x = 1;\nget_customer(#{id: 999})\n")],
        code: 1,
        json: &[
            ("/error/kind", r#""not_found""#),
            ("/error/line", "2"),
            ("/error/column", "1"),
        ],
        ..CASE
    },
    Case {
        name: "a compile error is invalid_script at its line and column, before any call",
        args: &["run", "--json", "{broken.rhai}"],
        files: &[("broken.rhai", BROKEN)],
        code: 1,
        json: &[
            ("/error/kind", r#""invalid_script""#),
            ("/error/line", "2"),
            ("/error/column", "5"),
            ("/error/tool", "<absent>"),
            ("/stats/tool_calls", "0"),
            ("/effects", "[]"),
        ],
        ..CASE
    },
    Case {
        name: "an unknown tool called by name suggests the closest",
        args: &["run", "--json", "-"],
        stdin: "let x = 1;\nlet y = tool(\"get_custmer\", #{id: 1});\n",
        code: 1,
        json: &[
            ("/error/kind", r#""unknown_tool""#),
            ("/error/line", "2"),
            ("/error/column", "9"),
            (
                "/error/message",
                r#""there is no tool named `get_custmer`; did you mean `get_customer`?""#,
            ),
            ("/error/suggested_next_action", r#""call `get_customer` instead""#),
        ],
        ..CASE
    },
    // stdin
    Case {
        name: "`run -` reads the script from stdin",
        args: &["run", "-"],
        stdin: "let c = get_customer(#{id: 1});\nc.name\n",
        stdout_is: Some("Bruno Lindqvist\n"),
        ..CASE
    },
    Case {
        name: "`run --json -` reads the script from stdin",
        args: &["run", "--json", "-"],
        stdin: "print(\"from stdin\");\n[1, 2, 3].len() * 14\n",
        json: &[("/value", "42"), ("/logs", r#"["from stdin"]"#)],
        ..CASE
    },
    Case {
        name: "`check -` reads the script from stdin",
        args: &["check", "-"],
        stdin: "get_customer(#{id: 1})\n",
        stdout_is: Some("ok: no problems found\n"),
        ..CASE
    },
    Case {
        name: "`check -` reports an unknown function at its line",
        args: &["check", "-"],
        stdin: "let a = 1;\nfrobnicate(a)\n",
        code: 1,
        stdout: &["2:1: error: there is no tool or function named `frobnicate`"],
        ..CASE
    },
    Case {
        name: "warnings are reported with what to do next, and the check passes",
        args: &["check", "-"],
        stdin: WARNINGS,
        stdout: &[
            "2:7: warning: \"n is ${n}\" is not interpolated: `${...}` works only in backtick strings",
            "  next: use backticks: `n is ${n}`",
            "4:1: warning: the script's last statement has no value, so the script returns (): a `try` is a statement",
        ],
        ..CASE
    },
    Case {
        name: "warnings as JSON: ok, every problem a warning",
        args: &["check", "--json", "-"],
        stdin: WARNINGS,
        json: &[
            ("/ok", "true"),
            ("/problems/*/severity", r#"["warning", "warning"]"#),
            ("/problems/*/line", "[4, 2]"),
        ],
        ..CASE
    },
    // check
    Case {
        name: "check accepts the demo",
        args: &["check", "scripts/demo.rhai"],
        stdout_is: Some("ok: no problems found\n"),
        ..CASE
    },
    Case {
        name: "check --json accepts the demo",
        args: &["check", "--json", "scripts/demo.rhai"],
        json: &[("", r#"{"ok": true, "problems": []}"#)],
        ..CASE
    },
    Case {
        name: "check reports unknown functions and tools at line:column",
        args: &["check", "{unknown.rhai}"],
        files: &[("unknown.rhai", UNKNOWN)],
        code: 1,
        stdout: &[
            "2:9: error: there is no tool or function named `frobnicate`",
            "3:1: error: there is no tool named `no_such_tool`",
            "  next: call one of the tools the catalog lists",
        ],
        ..CASE
    },
    Case {
        name: "check --json reports unknown functions and tools",
        args: &["check", "--json", "{unknown.rhai}"],
        files: &[("unknown.rhai", UNKNOWN)],
        code: 1,
        json: &[
            ("/ok", "false"),
            ("/problems/*/line", "[2, 3]"),
            ("/problems/*/column", "[9, 1]"),
            (
                "/problems/*/message",
                r#"["there is no tool or function named `frobnicate`", "there is no tool named `no_such_tool`"]"#,
            ),
        ],
        ..CASE
    },
    Case {
        name: "check of a script whose only call is to an unknown tool fails",
        args: &["check", "-"],
        stdin: "let a = 1;\ntool(\"no_such_tool\", #{})\n",
        code: 1,
        stdout: &["2:1: error: there is no tool named `no_such_tool`"],
        ..CASE
    },
    Case {
        name: "check reports a compile error",
        args: &["check", "{broken.rhai}"],
        files: &[("broken.rhai", BROKEN)],
        code: 1,
        stdout_is: Some("error: invalid_script at 2:5: Expecting name of a variable\n"),
        ..CASE
    },
    Case {
        name: "check --json reports a compile error",
        args: &["check", "--json", "{broken.rhai}"],
        files: &[("broken.rhai", BROKEN)],
        code: 1,
        json: &[
            ("/ok", "false"),
            ("/error/kind", r#""invalid_script""#),
            ("/error/line", "2"),
            ("/error/column", "5"),
        ],
        ..CASE
    },
    // exit status 2: usage, manifest and registry errors
    Case {
        name: "a malformed manifest names the file and line",
        args: &["run", "--tools", "{malformed.toml}", "{s.rhai}"],
        files: &[
            ("malformed.toml", "[[tool]]\nname = \"a\"\neffect = \n"),
            ("s.rhai", "1\n"),
        ],
        code: 2,
        stderr: &["toolscript: {dir}/malformed.toml:3: string values must be quoted*"],
        ..CASE
    },
    Case {
        name: "a malformed manifest with --json is still a usage error",
        args: &["run", "--json", "--tools", "{malformed.toml}", "{s.rhai}"],
        files: &[
            ("malformed.toml", "[[tool]]\nname = \"a\"\neffect = \n"),
            ("s.rhai", "1\n"),
        ],
        code: 2,
        stderr: &["toolscript: {dir}/malformed.toml:3: string values must be quoted*"],
        ..CASE
    },
    Case {
        name: "an unknown effect names the file, line and value, and lists the allowed ones",
        args: &["run", "--tools", "{effect.toml}", "{s.rhai}"],
        files: &[
            ("effect.toml", "[[tool]]\nname = \"a\"\neffect = \"reed\"\nscript = \"1\"\n"),
            ("s.rhai", "1\n"),
        ],
        code: 2,
        stderr: &["toolscript: {dir}/effect.toml:3: unknown variant `reed`, expected one of `read`, `write`, `idempotent`, `external`"],
        ..CASE
    },
    Case {
        name: "two tools of one name: the second's line, the tool and the rule (run)",
        args: &["run", "--tools", "{dup.toml}", "{s.rhai}"],
        files: &[("dup.toml", DUP), ("s.rhai", "1\n")],
        code: 2,
        stderr: &["toolscript: {dir}/dup.toml:6: tool `lookup`: two tools have this name"],
        ..CASE
    },
    Case {
        name: "two tools of one name (run --json)",
        args: &["run", "--json", "--tools", "{dup.toml}", "{s.rhai}"],
        files: &[("dup.toml", DUP), ("s.rhai", "1\n")],
        code: 2,
        stderr: &["toolscript: {dir}/dup.toml:6: tool `lookup`: two tools have this name"],
        ..CASE
    },
    Case {
        name: "two tools of one name (check)",
        args: &["check", "--tools", "{dup.toml}", "{s.rhai}"],
        files: &[("dup.toml", DUP), ("s.rhai", "1\n")],
        code: 2,
        stderr: &["toolscript: {dir}/dup.toml:6: tool `lookup`: two tools have this name"],
        ..CASE
    },
    Case {
        name: "two tools of one name (tools)",
        args: &["tools", "--tools", "{dup.toml}"],
        files: &[("dup.toml", DUP)],
        code: 2,
        stderr: &["toolscript: {dir}/dup.toml:6: tool `lookup`: two tools have this name"],
        ..CASE
    },
    Case {
        name: "one name in two manifests",
        args: &["tools", "--tools", "{first.toml}", "--tools", "{second.toml}"],
        files: &[("first.toml", LOOKUP), ("second.toml", LOOKUP)],
        code: 2,
        stderr: &["toolscript: {dir}/second.toml:1: tool `lookup`: two tools have this name"],
        ..CASE
    },
    Case {
        name: "a reserved name breaks a registry rule",
        args: &["tools", "--tools", "{reserved.toml}"],
        files: &[(
            "reserved.toml",
            "[[tool]]\nname = \"ts_mine\"\neffect = \"read\"\nscript = \"1\"\n",
        )],
        code: 2,
        stderr: &["toolscript: {dir}/reserved.toml:1: tool `ts_mine`: names starting with `ts_` are reserved for the runtime's own tools"],
        ..CASE
    },
    Case {
        name: "a retried write breaks a registry rule",
        args: &["tools", "--tools", "{retried.toml}"],
        files: &[(
            "retried.toml",
            "[[tool]]\nname = \"w\"\neffect = \"write\"\nretries = 2\nscript = \"1\"\n",
        )],
        code: 2,
        stderr: &["toolscript: {dir}/retried.toml:1: tool `w`: `retries` is not allowed on a write tool: only read and idempotent tools are retried"],
        ..CASE
    },
    Case {
        name: "a missing script (run)",
        args: &["run", "{no-such-script.rhai}"],
        code: 2,
        stderr: &["toolscript: {dir}/no-such-script.rhai: *"],
        ..CASE
    },
    Case {
        name: "a missing script (run --json)",
        args: &["run", "--json", "{no-such-script.rhai}"],
        code: 2,
        stderr: &["toolscript: {dir}/no-such-script.rhai: *"],
        ..CASE
    },
    Case {
        name: "a missing script (check)",
        args: &["check", "{no-such-script.rhai}"],
        code: 2,
        stderr: &["toolscript: {dir}/no-such-script.rhai: *"],
        ..CASE
    },
    Case {
        name: "a missing manifest",
        args: &["run", "--tools", "{no-such-tools.toml}", "{s.rhai}"],
        files: &[("s.rhai", "1\n")],
        code: 2,
        stderr: &["toolscript: {dir}/no-such-tools.toml: *"],
        ..CASE
    },
    Case {
        name: "a missing receipts file to verify",
        args: &["verify", "{no-such.jsonl}"],
        code: 2,
        stderr: &["toolscript: {dir}/no-such.jsonl: *"],
        ..CASE
    },
    Case {
        name: "a receipts file that cannot be created stops the run before any call",
        args: &["run", "--json", "--receipts", "{no-such-dir/receipts.jsonl}", "{s.rhai}"],
        files: &[("s.rhai", "get_customer(#{id: 1}).id\n")],
        code: 2,
        stderr: &["toolscript: {dir}/no-such-dir/receipts.jsonl: *"],
        ..CASE
    },
    Case {
        name: "an unknown flag",
        args: &["run", "--bogus", "scripts/demo.rhai"],
        code: 2,
        stderr: &["error: unexpected argument '--bogus' found"],
        ..CASE
    },
    Case {
        name: "an unknown format",
        args: &["tools", "--format", "yaml"],
        code: 2,
        stderr: &["error: invalid value 'yaml' for '--format <FORMAT>'"],
        ..CASE
    },
    Case {
        name: "an unknown subcommand",
        args: &["frobnicate"],
        code: 2,
        stderr: &["error: unrecognized subcommand 'frobnicate'"],
        ..CASE
    },
    Case {
        name: "a missing SCRIPT",
        args: &["run"],
        code: 2,
        stderr: &["error: the following required arguments were not provided:", "  <SCRIPT>"],
        ..CASE
    },
    // --tools
    Case {
        name: "a manifest replaces the demo catalog; its tools keep state",
        args: &["run", "--json", "--tools", "{counter.toml}", "{count.rhai}"],
        files: &[
            ("counter.toml", COUNTER_MANIFEST),
            (
                "count.rhai",
                "let before = total();\nbump(#{n: 3});\nlet after = bump(#{n: 4});\n[before, after.total, total()]\n",
            ),
        ],
        json: &[
            ("/value", "[0, 7, 7]"),
            (
                "/effects",
                r#"[{"tool": "bump", "effect": "write", "args": {"n": 3}, "ok": true},
                    {"tool": "bump", "effect": "write", "args": {"n": 4}, "ok": true}]"#,
            ),
            ("/stats/tool_calls", "4"),
            ("/stats/effectful_calls", "2"),
        ],
        ..CASE
    },
    Case {
        name: "with a manifest, the demo's tools are unknown (as functions)",
        args: &["run", "--json", "--tools", "{counter.toml}", "-"],
        files: &[("counter.toml", COUNTER_MANIFEST)],
        stdin: "get_customer(#{id: 1})\n",
        code: 1,
        json: &[("/error/kind", r#""unknown_tool""#)],
        ..CASE
    },
    Case {
        name: "with a manifest, the demo's tools are unknown (by name)",
        args: &["run", "--json", "--tools", "{counter.toml}", "-"],
        files: &[("counter.toml", COUNTER_MANIFEST)],
        stdin: "tool(\"get_customer\", #{id: 1})\n",
        code: 1,
        json: &[("/error/kind", r#""unknown_tool""#)],
        ..CASE
    },
    Case {
        name: "with a manifest, `tools` lists its tools alone",
        args: &["tools", "--tools", "{counter.toml}", "--format", "json"],
        files: &[("counter.toml", COUNTER_MANIFEST)],
        json: &[("/*/name", r#"["bump", "total"]"#)],
        ..CASE
    },
    Case {
        name: "with a manifest, `check` finds the demo's calls unknown",
        args: &["check", "--tools", "{counter.toml}", "{demo}"],
        files: &[("counter.toml", COUNTER_MANIFEST)],
        code: 1,
        stdout: &["*: error: *`get_customer`*"],
        ..CASE
    },
    Case {
        name: "a manifest's input schema is enforced before the call reaches the tool",
        args: &["run", "--json", "--tools", "{counter.toml}", "-"],
        files: &[("counter.toml", COUNTER_MANIFEST)],
        stdin: "let a = total();\nbump(#{n: \"three\"})\n",
        code: 1,
        json: &[
            ("/error/kind", r#""invalid_input""#),
            ("/error/tool", r#""bump""#),
            ("/error/line", "2"),
            (
                "/error/message",
                r#""arguments of `bump` do not match its input schema: `args.n` must be an int; it is \"three\" (a string)""#,
            ),
            // Refused before it reached the tool: not an effect the run executed.
            ("/effects", "[]"),
        ],
        ..CASE
    },
    Case {
        name: "several manifests load together and share state",
        args: &["run", "--json", "--tools", "{writer.toml}", "--tools", "{reader.toml}", "{s.rhai}"],
        files: &[
            (
                "writer.toml",
                "[[tool]]\nname = \"remember\"\neffect = \"write\"\n\
                 input = { type = \"object\", properties = { word = { type = \"string\" } }, required = [\"word\"] }\n\
                 script = '''\nstate.word = args.word;\n#{ saved: true }\n'''\n",
            ),
            (
                "reader.toml",
                "[[tool]]\nname = \"recall\"\neffect = \"read\"\nlatency_ms = 1\n\
                 script = '''\nstate.word ?? \"nothing\"\n'''\n",
            ),
            (
                "s.rhai",
                "let a = recall();\nremember(#{word: \"kettle\"});\n[a, recall()]\n",
            ),
        ],
        json: &[
            ("/value", r#"["nothing", "kettle"]"#),
            ("/effects/*/tool", r#"["remember"]"#),
        ],
        ..CASE
    },
    // receipts
    Case {
        name: "a receipts file that fails midway stops the run before its next call",
        args: &["run", "--json", "--receipts", "/dev/full", "{two.rhai}"],
        files: &[(
            "two.rhai",
            "issue_refund(#{order_id: 101, amount_cents: 100, reason: \"late\"});\n\
             try { issue_refund(#{order_id: 102, amount_cents: 100, reason: \"late again\"}); } catch (e) { }\n\
             1\n",
        )],
        code: 1,
        json: &[
            ("/error/kind", r#""internal""#),
            ("/error/line", "2"),
            ("/effects/*/tool", r#"["issue_refund"]"#),
        ],
        stdout: &["*\"message\":\"the run's receipts could not be written (/dev/full: *); it makes no further call\"*"],
        ..CASE
    },
    // tools
    Case {
        name: "tools as JSON: every tool with its effect, description and input schema",
        args: &["tools", "--format", "json"],
        json: &[
            ("/*/name", DEMO_NAMES),
            ("/*/effect", DEMO_EFFECTS),
            ("/*/description", "<string>"),
            ("/*/input_schema/type", r#"["object", "object", "object", "object", "object", "object", "object", "object", "object", "object", "object", "object", "object"]"#),
            ("/0/input_schema/required", r#"["id"]"#),
        ],
        ..CASE
    },
    Case {
        name: "tools in Rhai follow a custom manifest",
        args: &["tools", "--tools", "{counter.toml}", "--format", "rhai"],
        files: &[("counter.toml", COUNTER_MANIFEST)],
        stdout: &[
            "fn bump(*",
            "fn total(*",
            "/// Add n to a counter kept in state; return the new total.",
        ],
        not_stdout: &["fn get_customer("],
        ..CASE
    },
    // bench
    Case {
        name: "bench of a failing script exits 1: its times measure nothing",
        args: &["bench", "--runs", "1", "{fails.rhai}"],
        files: &[("fails.rhai", "// best: 20 ms\nget_customer(#{id: 999})\n")],
        code: 1,
        stdout: &["{dir}/fails.rhai * 20 ms *"],
        stderr: &["{dir}/fails.rhai: a run failed, so its times measure nothing: not_found in `get_customer` at 2:1: no customer 999"],
        ..CASE
    },
    // The command line's words for a limit: its flag, and the key of a manifest's [limits].
    Case {
        name: "a limit reached is named by its flag (JSON), and carried as data",
        args: &["run", "--no-store", "--json", "--sequential", "--max-calls", "2", "{ten.rhai}"],
        files: &[("ten.rhai", TEN_READS)],
        code: 1,
        json: &[
            ("/error/kind", r#""budget_exceeded""#),
            ("/error/limit", r#"{"key": "max_calls", "value": 2}"#),
            (
                "/error/message",
                r#""the run may make at most 2 tool calls (max_calls; raise it with --max-calls or `max_calls` in a manifest's [limits])""#,
            ),
            ("/stats/tool_calls", "3"),
        ],
        ..CASE
    },
    Case {
        name: "a limit reached is named by its flag (text)",
        args: &["run", "--no-store", "--sequential", "--max-calls", "2", "{ten.rhai}"],
        files: &[("ten.rhai", TEN_READS)],
        code: 1,
        stderr: &[
            "error: budget_exceeded in `get_customer` at 2:23: the run may make at most 2 tool calls (max_calls; raise it with --max-calls or `max_calls` in a manifest's [limits])",
            "  hint: make fewer tool calls, or return what you have",
        ],
        not_stderr: &["Limits::"],
        ..CASE
    },
    Case {
        name: "a caught limit error names the field of `Limits`, and has the limit as data",
        args: &["run", "--no-store", "--json", "--max-calls", "1", "-"],
        stdin: "get_customer(#{id: 1});\n\
                let r = ();\n\
                try { get_customer(#{id: 2}); } catch (e) { r = [e.kind, e.message, e.limit]; }\n\
                r\n",
        json: &[(
            "/value",
            r#"["budget_exceeded", "the run may make at most 1 tool calls (Limits::max_calls)", {"key": "max_calls", "value": 1}]"#,
        )],
        ..CASE
    },
    Case {
        name: "a caught limit error thrown again is named by its flag again",
        args: &["run", "--no-store", "--json", "--max-calls", "1", "-"],
        stdin: "get_customer(#{id: 1});\n\
                try { get_customer(#{id: 2}); } catch (e) { throw e; }\n",
        code: 1,
        json: &[
            ("/error/kind", r#""budget_exceeded""#),
            ("/error/limit", r#"{"key": "max_calls", "value": 1}"#),
            (
                "/error/message",
                r#""the run may make at most 1 tool calls (max_calls; raise it with --max-calls or `max_calls` in a manifest's [limits])""#,
            ),
        ],
        ..CASE
    },
    Case {
        name: "the deadline is named by --timeout-s, in seconds",
        args: &["run", "--no-store", "--json", "--timeout-s", "0.2", "-"],
        stdin: "loop { sleep(0.01); }",
        code: 1,
        json: &[
            ("/error/kind", r#""limit_exceeded""#),
            ("/error/limit", r#"{"key": "timeout_s", "value": 0.2}"#),
            (
                "/error/message",
                r#""the run's deadline of 0.2 s passed (timeout_s; raise it with --timeout-s or `timeout_s` in a manifest's [limits])""#,
            ),
        ],
        ..CASE
    },
    Case {
        name: "a script too long to compile is named by --max-script-bytes",
        args: &["run", "--no-store", "--json", "--max-script-bytes", "10", "-"],
        stdin: "let x = 1; x + 1",
        code: 1,
        json: &[
            ("/error/kind", r#""limit_exceeded""#),
            (
                "/error/message",
                r#""the script is 16 bytes; at most 10 may be compiled (max_script_bytes; raise it with --max-script-bytes or `max_script_bytes` in a manifest's [limits])""#,
            ),
        ],
        ..CASE
    },
    Case {
        name: "logs cut at their limit say which limit, with no front end's words",
        args: &["run", "--no-store", "--json", "--max-log-bytes", "20", "-"],
        stdin: "for i in 0..10 { print(`line ${i}`); } 1",
        json: &[(
            "/logs",
            r#"["line 0", "line 1", "line 2", "(log output cut at 20 bytes: the limit max_log_bytes)"]"#,
        )],
        ..CASE
    },
    Case {
        name: "a limit flag's bad value names the flag and the key",
        args: &["run", "--no-store", "--timeout-s", "-1", "{s.rhai}"],
        files: &[("s.rhai", "1")],
        code: 2,
        stderr: &["toolscript: --timeout-s: `timeout_s` must be at least 0.001, not -1"],
        ..CASE
    },
];

/// Whether `line` matches `pattern`, where `*` is any run of characters.
fn matches(pattern: &str, line: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let (first, rest) = parts.split_first().expect("split gives one part at least");
    let Some(mut left) = line.strip_prefix(first) else {
        return false;
    };
    let Some((last, middle)) = rest.split_last() else {
        return left.is_empty();
    };
    for part in middle {
        match left.find(part) {
            Some(at) => left = &left[at + part.len()..],
            None => return false,
        }
    }
    left.ends_with(last)
}

/// What `pointer` finds in `value`; a `*` step maps the rest over an array's items.
fn find(value: &Value, pointer: &str) -> Option<Value> {
    match pointer.split_once("/*") {
        None => value.pointer(pointer).cloned(),
        Some((before, after)) => {
            let items = value.pointer(before)?.as_array()?;
            items
                .iter()
                .map(|item| find(item, after))
                .collect::<Option<Vec<_>>>()
                .map(Value::Array)
        }
    }
}

/// Checks that `found` (what a pointer found) is what `expected` says.
fn check_json(case: &Case, pointer: &str, found: Option<Value>, expected: &str, out: &Output) {
    let name = case.name;
    match expected {
        "<absent>" => assert!(found.is_none(), "{name}: {pointer} is absent:\n{out:?}"),
        "<string>" => {
            let strings = match &found {
                Some(Value::String(_)) => true,
                Some(Value::Array(items)) => items.iter().all(Value::is_string),
                _ => false,
            };
            assert!(strings, "{name}: {pointer} is a string: {found:?}\n{out:?}");
        }
        _ if expected.starts_with(">=") => {
            let least: f64 = expected[2..].parse().expect("a number after >=");
            let n = found.as_ref().and_then(Value::as_f64);
            assert!(
                n.is_some_and(|n| n >= least),
                "{name}: {pointer} {expected}: {found:?}"
            );
        }
        _ => {
            let expected: Value = serde_json::from_str(expected)
                .unwrap_or_else(|e| panic!("{name}: the expected JSON of {pointer}: {e}"));
            assert_eq!(found, Some(expected), "{name}: {pointer}\n{out:?}");
        }
    }
}

/// Runs one case and checks everything it says.
fn check(case: &Case) {
    let dir = TempDir::new().unwrap();
    let root = dir.path().display().to_string();
    for (name, text) in case.files {
        write_file(&dir, name, text);
    }
    let demo = demo_script();
    let args: Vec<String> = case
        .args
        .iter()
        .map(
            |arg| match arg.strip_prefix('{').and_then(|a| a.strip_suffix('}')) {
                Some("demo") => demo.clone(),
                Some(file) => format!("{root}/{file}"),
                None => arg.to_string(),
            },
        )
        .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = toolscript_with_stdin(&args, case.stdin);
    let name = case.name;
    assert_eq!(out.code, case.code, "{name}: exit status\n{out:?}");
    if case.code == 2 {
        assert!(
            out.stdout.trim().is_empty(),
            "{name}: nothing on stdout for a usage error\n{out:?}"
        );
    }
    if !case.json.is_empty() {
        let value = if args.contains(&"run") && args.contains(&"--json") {
            Value::Object(run_json_shape(&out))
        } else {
            serde_json::from_str(&out.stdout)
                .unwrap_or_else(|e| panic!("{name}: stdout is one JSON value ({e})\n{out:?}"))
        };
        for (pointer, expected) in case.json {
            check_json(case, pointer, find(&value, pointer), expected, &out);
        }
    }
    if let Some(stdout) = case.stdout_is {
        assert_eq!(out.stdout, stdout, "{name}: the whole of stdout\n{out:?}");
    }
    for (stream, text, patterns) in [
        ("stdout", &out.stdout, case.stdout),
        ("stderr", &out.stderr, case.stderr),
    ] {
        for pattern in patterns {
            let pattern = pattern.replace("{dir}", &root);
            assert!(
                text.lines().any(|line| matches(&pattern, line)),
                "{name}: a line of {stream} is `{pattern}`\n{out:?}"
            );
        }
    }
    for (stream, text, absent) in [
        ("stdout", &out.stdout, case.not_stdout),
        ("stderr", &out.stderr, case.not_stderr),
    ] {
        for needle in absent {
            assert!(
                !text.contains(needle),
                "{name}: no {needle:?} on {stream}\n{out:?}"
            );
        }
    }
}

#[test]
fn the_command_line_gives_what_each_case_says() {
    for case in CASES {
        check(case);
    }
}

/// The table's checks can fail: a line pattern, a JSON pointer mapped over an array.
#[test]
fn the_table_s_checks_can_fail() {
    assert!(matches(
        "error: * at 2:9: *",
        "error: not_found at 2:9: no customer"
    ));
    assert!(!matches(
        "error: * at 2:9: *",
        "error: not_found at 2:1: no customer"
    ));
    assert!(!matches("42", "421"));
    assert!(matches("*", ""));
    let value = json!({"effects": [{"tool": "a"}, {"tool": "b"}], "ok": true});
    assert_eq!(find(&value, "/effects/*/tool"), Some(json!(["a", "b"])));
    assert_eq!(find(&value, "/effects/*/args"), None);
    assert_eq!(find(&value, "/ok"), Some(json!(true)));
}

// ---------------------------------------------------------------------------------------------
// What takes more than one invocation

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

/// `tools` in text lists every tool with its effect, with or without `--format text`.
#[test]
fn tools_text_lists_every_tool_with_its_effect() {
    for args in [&["tools"][..], &["tools", "--format", "text"][..]] {
        let out = toolscript(args);
        assert_eq!(out.code, 0, "{out:?}");
        for (name, effect) in DEMO_TOOLS {
            let line = format!("{name} ({effect})");
            assert!(
                out.stdout.lines().any(|l| l == line),
                "a line `{line}`: {}",
                out.stdout
            );
        }
    }
}

#[test]
fn tools_rhai_declares_a_documented_function_per_tool() {
    let out = toolscript(&["tools", "--format", "rhai"]);
    assert_eq!(out.code, 0, "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    for (name, _) in DEMO_TOOLS {
        let at = lines
            .iter()
            .position(|l| l.starts_with(&format!("fn {name}(")))
            .unwrap_or_else(|| panic!("fn {name}( is declared: {}", out.stdout));
        assert!(
            at > 0 && lines[at - 1].starts_with("///"),
            "{name} has a doc comment right above it: {}",
            out.stdout
        );
    }
    // The doc comment right above `fn get_customer(` carries its description.
    let at = lines
        .iter()
        .position(|l| l.starts_with("fn get_customer("))
        .unwrap();
    let docs: Vec<&str> = lines[..at]
        .iter()
        .rev()
        .take_while(|l| l.starts_with("///"))
        .copied()
        .collect();
    assert!(
        docs.iter()
            .any(|l| l.starts_with("/// Look up one customer by id")),
        "{docs:?}"
    );
}

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
    assert_eq!(
        out.stdout, "ok: 3 receipts, every hash and the chain check out\n",
        "verify says how many: {out:?}"
    );

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
