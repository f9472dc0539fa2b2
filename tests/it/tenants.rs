//! `toolscript serve --http --auth FILE`: bearer tokens, rights, tenants kept apart, decisions
//! made out of band. Requests are raw HTTP posts (stateless: each a whole exchange), so that
//! each can carry its own token.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tempfile::TempDir;

use crate::serve_limits::{post, Served};

/// One token of the file: its text, tenant and rights (TOML array).
type Token<'a> = (&'a str, &'a str, &'a str);

fn sha(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A server on its own store with the approval manifest and an auth file of `tokens` and
/// `tenants` (TOML tables).
fn serve(dir: &TempDir, tokens: &[Token<'_>], tenants: &str) -> Served {
    serve_with(dir, tokens, tenants, &[])
}

/// [`serve`] with `extra` arguments.
fn serve_with(dir: &TempDir, tokens: &[Token<'_>], tenants: &str, extra: &[&str]) -> Served {
    let mut auth = String::new();
    for (token, tenant, can) in tokens {
        auth.push_str(&format!(
            "[[token]]\nsha256 = \"{}\"\ntenant = \"{tenant}\"\ncan = {can}\n\n",
            sha(token)
        ));
    }
    auth.push_str(tenants);
    let auth_path = write(dir, "auth.toml", &auth);
    let manifest = write(
        dir,
        "m.toml",
        &format!("{}{CACHED_READ}", crate::support::APPROVAL_MANIFEST),
    );
    let store = dir.path().join("store.sqlite3");
    Served::start(
        &[
            "--auth",
            auth_path.to_str().unwrap(),
            "--tools",
            manifest.to_str().unwrap(),
            "--store",
            store.to_str().unwrap(),
        ]
        .into_iter()
        .chain(extra.iter().copied())
        .collect::<Vec<_>>(),
    )
}

/// A read whose results later runs may use.
const CACHED_READ: &str = r#"
[[tool]]
name = "rate"
effect = "read"
cache_ttl_s = 60
input = { type = "object" }
script = '#{ rate: 1.07 }'
"#;

fn write(dir: &TempDir, name: &str, text: &str) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// The `result` of calling `tool` with `args` as `token`: `isError`, the structured content
/// (or the text parsed as JSON, or the text as a string).
fn call(served: &Served, token: &str, tool: &str, args: Value) -> (bool, Value) {
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                      "params": {"name": tool, "arguments": args}});
    let header = format!("Authorization: Bearer {token}");
    let answer = post(&served.addr, &[&header], &body.to_string());
    assert_eq!(answer.status, 200, "{answer:?}");
    let json: Value = serde_json::from_str(&answer.body)
        .unwrap_or_else(|e| panic!("a JSON answer ({e}): {answer:?}"));
    let result = &json["result"];
    let error = result["isError"] == json!(true);
    if let Some(structured) = result.get("structuredContent") {
        return (error, structured.clone());
    }
    let text = result["content"][0]["text"].as_str().unwrap_or_default();
    let value = serde_json::from_str(text).unwrap_or_else(|_| json!(text));
    (error, value)
}

/// The error text of a refused call.
fn refused(served: &Served, token: &str, tool: &str, args: Value) -> String {
    let (error, value) = call(served, token, tool, args);
    assert!(error, "{tool} was not refused: {value:#}");
    value
        .as_str()
        .map_or_else(|| value.to_string(), str::to_string)
}

const PAUSES: &str = "let c = charge(#{amount: 5}); c.charged + 1";

fn run_id(outcome: &Value) -> String {
    outcome["run_id"].as_str().expect("a run id").to_string()
}

#[test]
fn requests_without_a_listed_token_are_refused_with_401_before_the_mcp_layer() {
    let dir = TempDir::new().unwrap();
    let served = serve(&dir, &[("good-token", "acme", "[\"run\"]")], "");
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                      "params": {"name": "run_script", "arguments": {"script": "40 + 2"}}})
    .to_string();
    let cases: [&[&str]; 6] = [
        &[],
        &["Authorization: Bearer wrong-token"],
        &["Authorization: Bearer good-toke"],
        &["Authorization: Basic Z29vZC10b2tlbg=="],
        &["Authorization: Bearer "],
        &[
            "Authorization: Bearer good-token",
            "Authorization: Bearer good-token",
        ],
    ];
    for headers in cases {
        let answer = post(&served.addr, headers, &body);
        assert_eq!(answer.status, 401, "{headers:?}: {answer:?}");
        let challenge = answer.header("www-authenticate").unwrap_or_default();
        assert!(challenge.starts_with("bearer"), "{headers:?}: {answer:?}");
        assert!(answer.body.contains("Authorization: Bearer"), "{answer:?}");
        assert!(!answer.body.contains("jsonrpc"), "{answer:?}");
    }
    // Even `initialize` and `tools/list` need a token.
    let list = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
    assert_eq!(post(&served.addr, &[], list).status, 401);
    let (error, outcome) = call(
        &served,
        "good-token",
        "run_script",
        json!({"script": "40 + 2"}),
    );
    assert!(!error, "{outcome:#}");
    assert_eq!(outcome["value"], 42);
}

#[test]
fn a_second_tenant_cannot_list_resume_approve_read_or_apply_the_firsts() {
    let dir = TempDir::new().unwrap();
    let all = "[\"run\", \"read\", \"approve\"]";
    let served = serve(
        &dir,
        &[
            ("a-agent", "a", "[\"run\", \"read\"]"),
            ("a-boss", "a", all),
            ("b-all", "b", all),
        ],
        "",
    );
    let (_, paused) = call(&served, "a-agent", "run_script", json!({"script": PAUSES}));
    assert_eq!(paused["status"], "paused", "{paused:#}");
    let run = run_id(&paused);
    // A value too large for the output is kept as an artifact.
    let big = "let s = []; for i in 0..2000 { s.push(`item number ${i}`); } s";
    let (_, large) = call(&served, "a-agent", "run_script", json!({"script": big}));
    let artifact = large["value"]["artifact"]
        .as_str()
        .unwrap_or_else(|| panic!("an artifact: {large:#}"))
        .to_string();
    let (_, planned) = call(
        &served,
        "a-agent",
        "plan_script",
        json!({"script": "charge(#{amount: 1}); 1"}),
    );
    let plan = planned["plan_id"].as_str().expect("a plan id").to_string();

    // Tenant a sees its own.
    let (_, listed) = call(&served, "a-agent", "list_runs", json!({}));
    let ids: Vec<&str> = listed["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["run_id"].as_str())
        .collect();
    assert!(ids.contains(&run.as_str()), "{listed:#}");
    let (error, page) = call(&served, "a-agent", "read_artifact", json!({"id": artifact}));
    assert!(!error, "{page:#}");

    // Tenant b sees nothing of it, and is told exactly what a missing id gets.
    let (_, listed) = call(&served, "b-all", "list_runs", json!({}));
    assert_eq!(listed["runs"], json!([]), "{listed:#}");
    let (_, listed) = call(&served, "b-all", "list_runs", json!({"status": ["paused"]}));
    assert_eq!(listed["runs"], json!([]), "{listed:#}");
    let missing_run = "r0000000000000000000000000000000";
    let no_run = refused(
        &served,
        "b-all",
        "resume_run",
        json!({"run_id": missing_run}),
    );
    for args in [
        json!({"run_id": run}),
        json!({"run_id": run, "decision": "approve"}),
        json!({"run_id": run, "decision": "reject", "reason": "no"}),
    ] {
        let text = refused(&served, "b-all", "resume_run", args);
        assert_eq!(text.replace(&run, "ID"), no_run.replace(missing_run, "ID"));
        assert!(!text.contains("tenant"), "{text}");
    }
    let missing = "0123456789abcdef0123456789abcdef";
    let no_artifact = refused(&served, "b-all", "read_artifact", json!({"id": missing}));
    let text = refused(&served, "b-all", "read_artifact", json!({"id": artifact}));
    assert_eq!(
        text.replace(&artifact, "ID"),
        no_artifact.replace(missing, "ID")
    );
    // Nor through a script: `ts_artifact` reads its tenant's artifacts only, and naming
    // another tenant's artifact in a script does not make it the tenant's.
    let read = format!("ts_artifact(#{{id: \"{artifact}\", page: 0}}).pages");
    let (error, own) = call(&served, "a-agent", "run_script", json!({"script": read}));
    assert!(!error, "{own:#}");
    let (error, theirs) = call(&served, "b-all", "run_script", json!({"script": read}));
    assert!(error, "{theirs:#}");
    assert_eq!(theirs["error"]["kind"], "not_found", "{theirs:#}");
    let text = refused(&served, "b-all", "read_artifact", json!({"id": artifact}));
    assert_eq!(
        text.replace(&artifact, "ID"),
        no_artifact.replace(missing, "ID")
    );
    let no_plan = refused(
        &served,
        "b-all",
        "apply_plan",
        json!({"plan_id": "pnothing"}),
    );
    let text = refused(&served, "b-all", "apply_plan", json!({"plan_id": plan}));
    assert_eq!(text.replace(&plan, "ID"), no_plan.replace("pnothing", "ID"));

    // The run is still paused, and tenant a's approver finishes it.
    let (_, resumed) = call(
        &served,
        "a-boss",
        "resume_run",
        json!({"run_id": run, "decision": "approve"}),
    );
    assert_eq!(resumed["status"], "completed", "{resumed:#}");
    assert_eq!(resumed["value"], 6);
}

#[test]
fn the_token_that_started_a_run_cannot_decide_its_call_and_another_approver_can() {
    let dir = TempDir::new().unwrap();
    let all = "[\"run\", \"read\", \"approve\"]";
    let served = serve(
        &dir,
        &[
            ("agent", "acme", all),
            ("person", "acme", "[\"approve\"]"),
            ("solo", "lone", all),
        ],
        "[tenant.acme]\nself_approve = true\n\n[tenant.lone]\nself_approve = true\n",
    );
    let (_, paused) = call(&served, "agent", "run_script", json!({"script": PAUSES}));
    let run = run_id(&paused);
    for decision in [
        json!({"decision": "approve"}),
        json!({"decision": "reject", "reason": "x"}),
    ] {
        let mut args = json!({"run_id": run});
        args.as_object_mut()
            .unwrap()
            .extend(decision.as_object().unwrap().clone());
        let text = refused(&served, "agent", "resume_run", args);
        assert!(text.contains("cannot decide its calls"), "{text}");
        assert!(text.contains("person"), "{text}");
    }
    // Nothing was decided: the person approves, and the call is made once.
    let (error, resumed) = call(
        &served,
        "person",
        "resume_run",
        json!({"run_id": run, "decision": "approve"}),
    );
    assert!(!error, "{resumed:#}");
    assert_eq!(resumed["status"], "completed", "{resumed:#}");
    assert_eq!(
        resumed["effects"].as_array().unwrap().len(),
        1,
        "{resumed:#}"
    );

    // A token alone in a tenant that allows it decides its own runs' calls.
    let (_, paused) = call(&served, "solo", "run_script", json!({"script": PAUSES}));
    let (error, resumed) = call(
        &served,
        "solo",
        "resume_run",
        json!({"run_id": run_id(&paused), "decision": "approve"}),
    );
    assert!(!error, "{resumed:#}");
    assert_eq!(resumed["value"], 6);

    // A token with only `approve` cannot run, list or read.
    let text = refused(&served, "person", "run_script", json!({"script": "1"}));
    assert!(text.contains("needs the right `run`"), "{text}");
    let text = refused(&served, "person", "list_runs", json!({}));
    assert!(text.contains("needs the right `read`"), "{text}");
}

#[test]
fn applying_a_plan_needs_approve_and_another_token_than_the_one_that_made_it() {
    let dir = TempDir::new().unwrap();
    let served = serve(
        &dir,
        &[
            ("agent", "acme", "[\"run\", \"read\"]"),
            ("agent2", "acme", "[\"run\", \"approve\"]"),
            ("person", "acme", "[\"approve\"]"),
        ],
        "",
    );
    let script = json!({"script": "charge(#{amount: 3}); 1"});
    let (_, planned) = call(&served, "agent", "plan_script", script.clone());
    let plan = planned["plan_id"].as_str().expect("a plan id").to_string();
    let text = refused(&served, "agent", "apply_plan", json!({"plan_id": plan}));
    assert!(text.contains("needs the right `approve`"), "{text}");
    // Nor a resume with a decision, though the run is the token's own tenant's.
    let text = refused(
        &served,
        "agent",
        "resume_run",
        json!({"run_id": "r1", "decision": "approve"}),
    );
    assert!(text.contains("needs the right `approve`"), "{text}");
    let (_, own) = call(&served, "agent2", "plan_script", script);
    let own = own["plan_id"].as_str().unwrap().to_string();
    let text = refused(&served, "agent2", "apply_plan", json!({"plan_id": own}));
    assert!(text.contains("cannot decide"), "{text}");
    let (error, applied) = call(&served, "person", "apply_plan", json!({"plan_id": plan}));
    assert!(!error, "{applied:#}");
    assert_eq!(applied["status"], "completed", "{applied:#}");
    assert_eq!(applied["effects"][0]["tool"], "charge");
}

#[test]
fn a_tenant_past_its_concurrent_runs_is_refused_as_unavailable_and_others_are_not() {
    let dir = TempDir::new().unwrap();
    let served = std::sync::Arc::new(serve(
        &dir,
        &[("a", "a", "[\"run\"]"), ("b", "b", "[\"run\"]")],
        "[tenant.a]\nmax_concurrent_runs = 1\nmax_operations = 1000000000\ntimeout_s = 120\n",
    ));
    let slow = "let x = 0; while x < 3000000 { x += 1; } x";
    // A probe may take the slot just before the slow run asks for it: then the slow run is
    // the one refused, and the round starts again.
    let mut refusal = None;
    for round in 1..=10 {
        let first = {
            let served = std::sync::Arc::clone(&served);
            std::thread::spawn(move || call(&served, "a", "run_script", json!({"script": slow})))
        };
        // The slow run is given a head start (longer each round, for a loaded machine), and
        // the probes a pause between them, so that it finds the slot free.
        std::thread::sleep(std::time::Duration::from_millis(200 * round));
        while refusal.is_none() && !first.is_finished() {
            std::thread::sleep(std::time::Duration::from_millis(20));
            let (error, outcome) = call(&served, "a", "run_script", json!({"script": "1"}));
            if error {
                refusal = Some(outcome);
                // Tenant b is not held by tenant a's cap.
                let (error, outcome) = call(&served, "b", "run_script", json!({"script": "2"}));
                assert!(!error, "{outcome:#}");
            }
        }
        let (error, outcome) = first.join().unwrap();
        if refusal.is_some() {
            assert!(!error, "{outcome:#}");
            assert_eq!(outcome["value"], 3_000_000);
            break;
        }
        assert_eq!(outcome["error"]["kind"], "unavailable", "{outcome:#}");
    }
    let refusal = refusal.expect("a second run of tenant a while its first ran was refused");
    assert_eq!(refusal["error"]["kind"], "unavailable", "{refusal:#}");
    assert_eq!(refusal["error"]["recoverable"], true, "{refusal:#}");
    let message = refusal["error"]["message"].as_str().unwrap();
    assert!(message.contains("max_concurrent_runs"), "{message}");
    // Its slot is free again.
    let (error, outcome) = call(&served, "a", "run_script", json!({"script": "1"}));
    assert!(!error, "{outcome:#}");
}

#[test]
fn a_malformed_auth_file_stops_the_server_naming_the_file_and_line() {
    let dir = TempDir::new().unwrap();
    let cases = [
        ("[[token]]\nsha256 = \"abc\"\ntenant = \"t\"\ncan = [\"run\"]\n", "line 2", "64 hex digits"),
        ("[[token]]\nsha256 = \"{sha}\"\ntenant = \"t\"\ncan = [\"fly\"]\n", "line 4", "unknown right"),
        ("[[token]]\nsha256 = \"{sha}\"\ntenant = \"t\"\ncan = [\"run\"]\n[tenant.t]\nmax_calls = \"x\"\n", "line 6", "max_calls"),
        ("[[token]\n", "line 1", ""),
    ];
    for (text, line, what) in cases {
        let path = write(&dir, "bad.toml", &text.replace("{sha}", &sha("x")));
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_toolscript"))
            .args(["serve", "--http", "127.0.0.1:0", "--auth"])
            .arg(&path)
            .args(["--no-store"])
            .output()
            .unwrap();
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(&path.display().to_string()), "{stderr}");
        assert!(
            stderr.contains(line) && stderr.contains(what),
            "{line} {what}: {stderr}"
        );
    }
    let missing: &Path = &dir.path().join("missing.toml");
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_toolscript"))
        .args(["serve", "--http", "127.0.0.1:0", "--no-store", "--auth"])
        .arg(missing)
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("cannot read the auth file"));
}

#[test]
fn one_tenants_cached_reads_never_answer_anothers() {
    let dir = TempDir::new().unwrap();
    let served = serve(
        &dir,
        &[
            ("a1", "a", "[\"run\"]"),
            ("a2", "a", "[\"run\"]"),
            ("b", "b", "[\"run\"]"),
        ],
        "",
    );
    let hits = |token: &str| {
        let (error, outcome) = call(
            &served,
            token,
            "run_script",
            json!({"script": "rate(#{}).rate", "stats": true}),
        );
        assert!(!error, "{outcome:#}");
        outcome["stats"]["cache_hits"].as_u64().expect("stats")
    };
    assert_eq!(hits("a1"), 0);
    assert_eq!(hits("a2"), 1, "the same tenant's read answers");
    assert_eq!(hits("b"), 0, "another tenant's read does not");
    assert_eq!(hits("b"), 1);
}

/// A store of schema 9 (before tenants) is upgraded to 10: its runs and plans keep their rows
/// and have no tenant, so that no tenant lists them; new runs and plans keep theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_of_schema_9_gains_tenants_and_its_old_runs_belong_to_none() {
    use toolscript::{Mode, RunQuery, RunRecord, SqliteStore, Store, StoredPlan};
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("store.sqlite3");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(&format!(
            "CREATE TABLE runs (run_id TEXT PRIMARY KEY, script_name TEXT NOT NULL, \
             script TEXT NOT NULL, catalog_sha256 TEXT NOT NULL, mode TEXT NOT NULL, \
             status TEXT NOT NULL, started_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL, \
             pending TEXT, outcome TEXT, input TEXT, catalog TEXT, input_artifact TEXT, \
             lease_owner TEXT, lease_host TEXT, lease_token INTEGER NOT NULL DEFAULT 0, \
             lease_expires_ms INTEGER, lease_since_ms INTEGER); \
             CREATE TABLE plans (plan_id TEXT PRIMARY KEY, created_ms INTEGER NOT NULL, \
             expires_ms INTEGER NOT NULL, applied_run TEXT, body TEXT NOT NULL); \
             INSERT INTO runs (run_id, script_name, script, catalog_sha256, mode, status, \
             started_ms, updated_ms) VALUES ('old', 's.rhai', '1', 'c', 'sequential', \
             'completed', 1, 1); \
             INSERT INTO plans VALUES ('pold', 1, 9999999999999, NULL, '{{}}'); \
             PRAGMA user_version = 9; PRAGMA application_id = {};",
            0x5453_6372
        ))
        .unwrap();
    }
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(
        crate::support::user_version(&path),
        crate::support::SQLITE_SCHEMA
    );
    let old = store.run("old").await.unwrap().unwrap();
    assert_eq!((old.tenant, old.started_by), (None, None));
    let plan = store.plan("pold").await.unwrap().unwrap();
    assert_eq!((plan.tenant, plan.made_by), (None, None));

    let mut record = RunRecord::new("new", "s.rhai", "1", "c", Mode::Sequential);
    record.tenant = Some("acme".into());
    record.started_by = Some("0123456789ab".into());
    store.create_run(record).await.unwrap();
    let mut plan = StoredPlan::new("pnew".into(), 1, 9_999_999_999_999, "{}".into());
    plan.tenant = Some("acme".into());
    plan.made_by = Some("0123456789ab".into());
    store.put_plan(plan).await.unwrap();
    let new = store.run("new").await.unwrap().unwrap();
    assert_eq!(new.tenant.as_deref(), Some("acme"));
    assert_eq!(new.started_by.as_deref(), Some("0123456789ab"));
    assert_eq!(
        store
            .plan("pnew")
            .await
            .unwrap()
            .unwrap()
            .made_by
            .as_deref(),
        Some("0123456789ab")
    );

    let ids = |page: toolscript::RunPage| -> Vec<String> {
        page.runs.into_iter().map(|r| r.run_id).collect()
    };
    let all = ids(store.list_runs(RunQuery::first(10)).await.unwrap());
    assert_eq!(all.len(), 2, "{all:?}");
    let acme = ids(store
        .list_runs(RunQuery::first(10).tenant(Some("acme".into())))
        .await
        .unwrap());
    assert_eq!(acme, ["new"]);
    let other = store
        .list_runs(RunQuery::first(10).tenant(Some("other".into())))
        .await
        .unwrap();
    assert!(other.runs.is_empty());
    // Paged, with a cursor and a filter on status as well.
    let first = store
        .list_runs(RunQuery::first(1).tenant(Some("acme".into())))
        .await
        .unwrap();
    assert_eq!(ids(first.clone()), ["new"]);
    let after = RunQuery::first(1)
        .tenant(Some("acme".into()))
        .after(Some(first.runs[0].cursor()));
    assert!(store.list_runs(after).await.unwrap().runs.is_empty());
    let running = RunQuery::first(10)
        .tenant(Some("acme".into()))
        .statuses([toolscript::RunStatus::Running]);
    assert_eq!(ids(store.list_runs(running).await.unwrap()), ["new"]);
    assert!(!store.artifact_of_tenant("nothing", "acme").await.unwrap());
}

/// With `--stateful`, every request of a session carries its own token, and is its own
/// caller's: the session is not the tenant.
#[test]
fn in_a_stateful_session_each_request_is_its_own_tokens() {
    let dir = TempDir::new().unwrap();
    let served = serve_with(
        &dir,
        &[
            ("a", "a", "[\"run\", \"read\"]"),
            ("b", "b", "[\"run\", \"read\"]"),
        ],
        "",
        &["--stateful"],
    );
    let initialize = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#;
    assert_eq!(post(&served.addr, &[], initialize).status, 401);
    let opened = post(&served.addr, &["Authorization: Bearer a"], initialize);
    let id = opened
        .header("mcp-session-id")
        .expect("a session")
        .to_string();
    let session = format!("Mcp-Session-Id: {id}");
    let version = "MCP-Protocol-Version: 2025-06-18";
    let note = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    let answer = post(
        &served.addr,
        &[&session, version, "Authorization: Bearer a"],
        note,
    );
    assert_eq!(answer.status, 202, "{answer:?}");
    let run = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                     "params": {"name": "run_script", "arguments": {"script": PAUSES}}});
    let ran = post(
        &served.addr,
        &[&session, version, "Authorization: Bearer a"],
        &run.to_string(),
    );
    assert_eq!(ran.status, 200, "{ran:?}");
    assert!(ran.body.contains("paused"), "{ran:?}");
    let list = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                      "params": {"name": "list_runs", "arguments": {}}})
    .to_string();
    let as_a = post(
        &served.addr,
        &[&session, version, "Authorization: Bearer a"],
        &list,
    );
    assert!(as_a.body.contains("paused"), "{as_a:?}");
    let as_b = post(
        &served.addr,
        &[&session, version, "Authorization: Bearer b"],
        &list,
    );
    assert_eq!(as_b.status, 200, "{as_b:?}");
    assert!(!as_b.body.contains("paused"), "{as_b:?}");
    assert!(as_b.body.contains("\"runs\":[]"), "{as_b:?}");
    assert_eq!(post(&served.addr, &[&session, version], &list).status, 401);
}

/// A large input is kept as an artifact whose id is its hash: another tenant that names that id
/// in a script neither reads it nor gains it (a run's script refers only to artifacts its
/// tenant already has).
#[test]
fn naming_another_tenants_input_artifact_in_a_script_does_not_make_it_yours() {
    let dir = TempDir::new().unwrap();
    let served = serve(
        &dir,
        &[
            ("a", "a", "[\"run\", \"read\"]"),
            ("b", "b", "[\"run\", \"read\"]"),
        ],
        "",
    );
    let input = json!({"text": "x".repeat(70_000)});
    let id = sha(&input.to_string())[..32].to_string();
    let (error, ran) = call(
        &served,
        "a",
        "run_script",
        json!({"script": "input.text.len()", "input": input}),
    );
    assert!(!error, "{ran:#}");
    // Tenant a has it (its page is larger than an answer holds, which is said as such).
    let (_, page) = call(&served, "a", "read_artifact", json!({"id": id}));
    assert!(page.to_string().contains("max_inline_tokens"), "{page:#}");
    let read = format!("ts_artifact(#{{id: \"{id}\", page: 0}}).pages");
    let (error, theirs) = call(&served, "b", "run_script", json!({"script": read}));
    assert!(error, "{theirs:#}");
    assert_eq!(theirs["error"]["kind"], "not_found", "{theirs:#}");
    let text = refused(&served, "b", "read_artifact", json!({"id": id}));
    assert!(text.contains("no artifact"), "{text}");
}
