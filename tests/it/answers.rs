//! Every answer bounded, and artifact pages that are the stored pages: what a run hands back,
//! over MCP and in the library, stays within `max_inline_tokens` (plus the fixed part a run's
//! outcome always has, `ANSWER_OVERHEAD`), counted with the o200k BPE; every page a run
//! announces is a page a reader gets, cut for that run's budget; a page is read by a whole
//! number, and without one is page 0.

use std::sync::Arc;

use rmcp::model::{CallToolRequestParams, CallToolResult};
use serde_json::{json, Value};
use tempfile::TempDir;
use toolscript::{
    stored_artifact_page, Effect, Limits, Registry, RunOutcome, Runtime, SqliteStore, Store, Tool,
    ANSWER_OVERHEAD,
};

use crate::mcp_server::{arguments, serve_session};

fn tokens(text: &str) -> usize {
    tiktoken_rs::o200k_base_singleton()
        .encode_ordinary(text)
        .len()
}

/// A runtime over `store` (shared) whose runs have `budget` tokens, with one tool that returns
/// 3,000 records.
fn records_runtime(store: Arc<SqliteStore>, budget: usize) -> Runtime {
    let mut limits = Limits::default();
    limits.max_inline_tokens = budget;
    let records = Tool::builder("records", Effect::Read).handler(|_| async {
        Ok(json!((0..3000)
            .map(|i| json!({"id": i, "name": format!("user {i}")}))
            .collect::<Vec<_>>()))
    });
    Runtime::builder(Registry::builder().tools(vec![records]).build().unwrap())
        .limits(limits)
        .store(store as Arc<dyn Store>)
        .build()
}

/// Every page `outcome` announces for its value, read as a reader reads them (the page's
/// bytes, through the store), each checked against the run's budget; the ids of the items.
async fn read_announced(store: &SqliteStore, outcome: &RunOutcome, budget: usize) -> Vec<u64> {
    let report = outcome.to_json();
    let value = &report["value"];
    let id = value["artifact"]
        .as_str()
        .expect("the value is an artifact");
    let pages = value["pages"].as_u64().unwrap() as usize;
    let mut ids = Vec::new();
    for n in 0..pages {
        let stored = store.artifact_page(id, n).await.unwrap().unwrap();
        let page = serde_json::to_value(stored_artifact_page(&stored, n).unwrap()).unwrap();
        assert_eq!(
            page["pages"],
            json!(pages),
            "page {n} says the count announced"
        );
        let answer = json!({ "artifact": page });
        let t = tokens(&answer.to_string());
        assert!(
            t <= budget,
            "page {n} of {id} is {t} tokens as an answer, over the run's budget of {budget}"
        );
        for item in page["items"].as_array().expect("a page of items") {
            ids.push(item["id"].as_u64().unwrap());
        }
    }
    assert!(store.artifact_page(id, pages).await.unwrap().is_some());
    let past = store.artifact_page(id, pages).await.unwrap().unwrap();
    assert!(
        stored_artifact_page(&past, pages).is_err(),
        "no page past the last"
    );
    ids
}

/// The same 3,000 items made by runs with different budgets, on one store: each run's
/// announced pages, read one by one, give every item exactly once, and each page fits that
/// run's answers. Before pages were part of an artifact's identity, the second run announced
/// the first run's pages (the count was right, from the stored row) — pages of 1,039 tokens
/// for a run whose answers have 200, which this test refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn artifact_pages_across_runs_with_different_budgets_are_each_runs_own() {
    let dir = TempDir::new().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("store.sqlite3")).unwrap());
    let mut ids_seen = Vec::new();
    for budget in [1200, 200, 333, 1200, 200] {
        let runtime = records_runtime(Arc::clone(&store), budget);
        let outcome = runtime.run("records()").await;
        assert!(outcome.result.is_ok(), "{:?}", outcome.result);
        let ids = read_announced(&store, &outcome, budget).await;
        assert_eq!(ids, (0..3000).collect::<Vec<u64>>(), "at {budget}");
        ids_seen.push(outcome.artifacts[0].id.clone());
    }
    // The same bytes at the same budget are one artifact; at another, another.
    assert_eq!(ids_seen[0], ids_seen[3]);
    assert_eq!(ids_seen[1], ids_seen[4]);
    assert_ne!(ids_seen[0], ids_seen[1]);
    assert!(ids_seen.iter().all(|id| id.starts_with(&ids_seen[0][..32])));
}

/// A page is read from the content's bytes alone, where the stored index says it is; content
/// cut short behind the store's back (another program, a bad disk) makes a page the index
/// places past its end a clear store error, never a panic or a short page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_past_the_stored_bytes_is_a_clear_error() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("store.sqlite3");
    let store = Arc::new(SqliteStore::open(&path).unwrap());
    let outcome = records_runtime(Arc::clone(&store), 200)
        .run("records()")
        .await;
    let id = outcome.artifacts[0].id.clone();
    let first = store.artifact_page(&id, 0).await.unwrap().unwrap();
    assert!(stored_artifact_page(&first, 0).is_ok());
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute(
            "UPDATE artifacts SET content = substr(content, 1, 100) WHERE id = ?1",
            [&id],
        )
        .unwrap();
    let e = store.artifact_page(&id, 5).await.unwrap_err().to_string();
    assert!(e.contains("page index names bytes"), "{e}");
}

/// A store of the previous version (3), with an artifact as that version stored it (an id of
/// 32 hex digits, no page index), opens, is upgraded, and its artifact reads page by page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_artifact_of_a_version_3_store_reads_page_by_page() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("store.sqlite3");
    let value = json!((0..500).map(|i| format!("line {i}")).collect::<Vec<_>>());
    let content = serde_json::to_string(&value).unwrap();
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE runs (run_id TEXT PRIMARY KEY, script_name TEXT NOT NULL, \
             script TEXT NOT NULL, catalog_sha256 TEXT NOT NULL, mode TEXT NOT NULL, \
             status TEXT NOT NULL, owner_pid INTEGER, started_ms INTEGER NOT NULL, \
             updated_ms INTEGER NOT NULL, pending TEXT, outcome TEXT, input TEXT);
             CREATE TABLE writes (run_id TEXT NOT NULL, seq INTEGER NOT NULL, tool TEXT NOT NULL, \
             args TEXT NOT NULL, approved INTEGER NOT NULL DEFAULT 0, retry INTEGER NOT NULL \
             DEFAULT 0, intent INTEGER NOT NULL DEFAULT 0, outcome TEXT, PRIMARY KEY (run_id, seq));
             CREATE TABLE artifacts (id TEXT PRIMARY KEY, run_id TEXT NOT NULL, \
             policy TEXT NOT NULL, page_tokens INTEGER NOT NULL, content BLOB NOT NULL, \
             created_ms INTEGER NOT NULL);
             CREATE TABLE reads (run_id TEXT NOT NULL, epoch INTEGER NOT NULL, tool TEXT NOT NULL, \
             args TEXT NOT NULL, n INTEGER NOT NULL, outcome TEXT NOT NULL, \
             PRIMARY KEY (run_id, epoch, tool, args, n));
             PRAGMA user_version = 3; PRAGMA application_id = 1414751090;",
        )
        .unwrap();
        conn.execute(
            "INSERT INTO artifacts VALUES ('0123456789abcdef0123456789abcdef', 'r', 'page', \
             150, ?1, 0)",
            [content.as_bytes()],
        )
        .unwrap();
    }
    let store = SqliteStore::open(&path).unwrap();
    let id = "0123456789abcdef0123456789abcdef";
    let whole = store.artifact(id).await.unwrap().unwrap();
    assert_eq!(whole.content, content.as_bytes());
    assert!(whole.index.is_none(), "an old artifact has no index");
    let first =
        stored_artifact_page(&store.artifact_page(id, 0).await.unwrap().unwrap(), 0).unwrap();
    let mut items = Vec::new();
    for n in 0..first.pages {
        let page = store.artifact_page(id, n).await.unwrap().unwrap();
        let page = serde_json::to_value(stored_artifact_page(&page, n).unwrap()).unwrap();
        items.extend(page["items"].as_array().unwrap().iter().cloned());
    }
    assert!(first.pages > 1);
    assert_eq!(Value::Array(items), value);
}

/// A run whose script reads an artifact of the store with `page`.
async fn read_with_page(runtime: &Runtime, id: &str, page: &str) -> RunOutcome {
    let page = if page.is_empty() {
        String::new()
    } else {
        format!(", page: {page}")
    };
    runtime
        .run(&format!("ts_artifact(#{{id: \"{id}\"{page}}})"))
        .await
}

/// Pages are whole numbers: `2.0`, `1e30`, `-1`, `"2"` are clear errors (the schema's
/// `integer` takes the first two, which are refused as numbers that are not written whole);
/// no page is page 0; never the whole artifact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_is_a_whole_number_and_no_page_is_page_0() {
    let dir = TempDir::new().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("store.sqlite3")).unwrap());
    let runtime = records_runtime(Arc::clone(&store), 200);
    let made = runtime.run("records()").await;
    let id = made.artifacts[0].id.clone();
    for (page, says) in [
        ("2.0", "whole number"),
        ("1e30", "whole number"),
        ("1.0e30", "whole number"),
        ("-1", "minimum"),
        ("\"2\"", "int"),
        ("[2]", "int"),
        ("99999", "pages (0 to"),
    ] {
        let outcome = read_with_page(&runtime, &id, page).await;
        let e = outcome.result.as_ref().expect_err(page);
        assert!(e.message.contains(says), "page {page}: {}", e.message);
    }
    let first = read_with_page(&runtime, &id, "").await.result.unwrap();
    assert_eq!(first["page"], 0, "{first}");
    assert!(first["items"].as_array().unwrap().len() < 3000);
    let second = read_with_page(&runtime, &id, "1").await.result.unwrap();
    assert_eq!(
        (second["page"].clone(), second["pages"].clone()),
        (json!(1), first["pages"].clone())
    );
}

/// Tools for the MCP answers: a write that approves nothing, one that waits for approval,
/// and a tool that fails with a long message.
const MANIFEST: &str = r#"
[[tool]]
name = "write_row"
effect = "write"
script = 'true'

[[tool]]
name = "approve_rows"
effect = "write"
approval = "always"
script = 'true'
"#;

/// The tokens of a result's structured content and of its text, each.
fn answer_sizes(result: &CallToolResult) -> (usize, usize) {
    let structured = result
        .structured_content
        .as_ref()
        .map_or(0, |s| tokens(&s.to_string()));
    let text = result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| tokens(&t.text)))
        .sum();
    (structured, text)
}

/// At 200 tokens, every kind of answer a model gets over MCP — structured content and its
/// text copy, each — is within the budget and the fixed part of an outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_answers_at_200_tokens_are_bounded() {
    tokio::time::timeout(std::time::Duration::from_secs(120), mcp_answers_session())
        .await
        .expect("the MCP session finished in time");
}

async fn mcp_answers_session() {
    let dir = TempDir::new().unwrap();
    let manifest = dir.path().join("m.toml");
    std::fs::write(&manifest, MANIFEST).unwrap();
    let client = serve_session(
        &[
            "--tools".as_ref(),
            manifest.as_os_str(),
            "--max-inline-tokens".as_ref(),
            "200".as_ref(),
        ],
        &dir.path().join("store.sqlite3"),
    )
    .await;
    let budget = 200;
    let call = |name: &'static str, args: Value| {
        let request = CallToolRequestParams::new(name).with_arguments(arguments(args));
        let peer = client.peer().clone();
        async move {
            peer.call_tool(request)
                .await
                .unwrap_or_else(|e| panic!("{name} answers: {e:?}"))
        }
    };
    let check = |what: &str, result: &CallToolResult| {
        let (structured, text) = answer_sizes(result);
        eprintln!("{what}: structured {structured}, text {text}");
        assert!(
            structured <= budget + ANSWER_OVERHEAD && text <= budget + ANSWER_OVERHEAD,
            "{what}: {structured} tokens structured, {text} as text, over {budget} + {ANSWER_OVERHEAD}: {result:?}"
        );
    };
    let missing: String = (0..40).map(|i| format!("m.field_{i}; ")).collect();
    let scripts = [
        (
            "a completed run with a big value and logs",
            "let a = []; for i in 0..3000 { a.push(#{id: i, name: `user ${i}`}); print(`line ${i}`); } a".to_string(),
        ),
        (
            "a failed run with a huge message",
            "let s = \"\"; for i in 0..20000 { s += \"the message \"; } throw s".to_string(),
        ),
        (
            "a run with 2,000 effects",
            "for i in 0..2000 { write_row(#{row: i, note: \"a row of the table\"}); } 1".to_string(),
        ),
        (
            "a paused run with a huge pending call",
            "let rows = []; for i in 0..3000 { rows.push(`row ${i}`); } approve_rows(#{rows: rows})".to_string(),
        ),
        (
            "warnings",
            format!("let m = #{{a: 1, {}}}; {missing} 1", (0..20).map(|i| format!("known_field_number_{i}: {i}")).collect::<Vec<_>>().join(", ")),
        ),
    ];
    let mut artifact = None;
    for (what, script) in &scripts {
        let result = call("run_script", json!({ "script": script })).await;
        check(what, &result);
        let outcome = result.structured_content.clone().unwrap();
        if artifact.is_none() {
            artifact = outcome["value"]["artifact"].as_str().map(str::to_string);
        }
        match *what {
            "a run with 2,000 effects" => {
                let shown = outcome["effects"].as_array().unwrap().len() as u64;
                assert_eq!(
                    shown + outcome["effects_left_out"].as_u64().unwrap(),
                    2000,
                    "{outcome:#}"
                );
                assert!(outcome["effects_artifact"].is_string(), "{outcome:#}");
            }
            "a paused run with a huge pending call" => {
                assert_eq!(outcome["status"], "paused");
                assert!(
                    outcome["pending"]["args"]["artifact"].is_string(),
                    "{outcome:#}"
                );
            }
            "a failed run with a huge message" => {
                assert!(
                    outcome["error"]["message"]
                        .as_str()
                        .unwrap()
                        .contains("characters in all"),
                    "{outcome:#}"
                );
            }
            "warnings" => assert!(
                outcome["warnings_left_out"].as_u64().unwrap() > 0,
                "{outcome:#}"
            ),
            _ => {}
        }
    }
    let id = artifact.expect("the big value is an artifact");
    let first = call("read_artifact", json!({ "id": id })).await;
    check("read_artifact without a page", &first);
    assert_eq!(
        first.structured_content.as_ref().unwrap()["artifact"]["page"],
        0
    );
    let page = call("read_artifact", json!({ "id": id, "page": 3 })).await;
    check("read_artifact with a page", &page);
    for bad in [json!(2.0), json!(1e30), json!(-1), json!("2")] {
        let refused = call("read_artifact", json!({ "id": id, "page": bad })).await;
        assert_eq!(refused.is_error, Some(true), "page {bad}: {refused:?}");
        check("a bad page", &refused);
    }
    let unknown = call("read_artifact", json!({ "id": "x".repeat(100_000) })).await;
    assert_eq!(unknown.is_error, Some(true));
    check("an unknown artifact with a huge id", &unknown);
    client.cancel().await.expect("the session closes");
}

/// The library's outcome is bounded alike: a failed run whose error has a huge message, next
/// action and tool name, as `to_json` gives it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_error_is_bounded_as_a_whole_in_the_library() {
    let dir = TempDir::new().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("store.sqlite3")).unwrap());
    let fails = Tool::builder("fails", Effect::Read).handler(|_| async {
        let mut e =
            toolscript::ToolError::with_kind_name("rate_limited", "the message ".repeat(20_000))
                .unwrap();
        e.suggested_next_action = Some("the next action ".repeat(20_000));
        Err(e)
    });
    let mut limits = Limits::default();
    limits.max_inline_tokens = 200;
    let runtime = Runtime::builder(Registry::builder().tools(vec![fails]).build().unwrap())
        .limits(limits)
        .store(store as Arc<dyn Store>)
        .build();
    let outcome = runtime.run("fails()").await;
    let mut json = outcome.to_json();
    json.as_object_mut().unwrap().remove("stats");
    let t = tokens(&json.to_string());
    assert!(t <= 200 + ANSWER_OVERHEAD, "{t} tokens: {json:#}");
    let error = &json["error"];
    assert_eq!(error["kind"], "rate_limited", "{error}");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("characters in all"),
        "{error}"
    );
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .starts_with("the message"),
        "{error}"
    );
    assert!(
        error["suggested_next_action"]
            .as_str()
            .unwrap()
            .starts_with("the next"),
        "{error}"
    );
    // The whole error is an artifact.
    assert!(!outcome.artifacts.is_empty());
}
