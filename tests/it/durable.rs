//! Durable runs: approvals that pause a run, resume with a decision, a run whose process was
//! killed resumed from its journal, and the crash test — a script of 30 writes against an
//! external recorder, killed with SIGKILL at random instants and resumed until it completes:
//! every write reaches the recorder exactly once, every ambiguous call is reported, and the
//! value is the uninterrupted run's.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tempfile::TempDir;
use toolscript::{
    Approval, Awaiting, Decision, Effect, Error, ErrorKind, Mode, Registry, RunOptions, RunStatus,
    Runtime, SqliteStore, Tool,
};

use crate::support::{by_occurrence, calls_of, node_available};

/// A catalog with a read, a write that needs approval, and a second one; `made` counts the
/// bodies of the writes that ran.
fn catalog(made: &Arc<AtomicUsize>) -> Registry {
    Registry::builder().tools(tools(made)).build().unwrap()
}

fn tools(made: &Arc<AtomicUsize>) -> Vec<Tool> {
    let lookup = Tool::builder("lookup", Effect::Read).handler(|args| async move {
        Ok(json!({"n": args["n"], "twice": args["n"].as_i64().unwrap_or(0) * 2}))
    });
    let approved = |name: &str| {
        let made = Arc::clone(made);
        Tool::builder(name, Effect::Write)
            .approval(Approval::Always)
            .input_schema(json!({"type": "object"}))
            .composite(move |args, ctx| {
                let made = Arc::clone(&made);
                async move {
                    made.fetch_add(1, Ordering::SeqCst);
                    Ok(json!({"done": args, "key": ctx.idempotency_key}))
                }
            })
    };
    vec![lookup, approved("refund"), approved("notify")]
}

fn durable(dir: &TempDir, made: &Arc<AtomicUsize>) -> Runtime {
    let store = SqliteStore::open(&dir.path().join("store.sqlite3")).unwrap();
    Runtime::builder(catalog(made))
        .store(Arc::new(store))
        .build()
}

const REFUND: &str = r#"
let a = lookup(#{n: 1});
let r = refund(#{n: a.twice});
let b = lookup(#{n: 2});
[a.twice, r.done.n, b.twice]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_then_approve_completes_making_each_call_once() {
    let (dir, made) = (TempDir::new().unwrap(), Arc::new(AtomicUsize::new(0)));
    let runtime = durable(&dir, &made);
    let paused = runtime.run(REFUND).await;
    assert_eq!(paused.status(), RunStatus::Paused);
    let pending = paused.pending.clone().expect("a pending call");
    assert_eq!(
        (pending.seq, pending.tool.as_str(), pending.awaiting),
        (0, "refund", Awaiting::Approval)
    );
    assert_eq!(pending.args, json!({"n": 2}));
    assert_eq!(
        made.load(Ordering::SeqCst),
        0,
        "nothing is made before the approval"
    );
    let json = paused.to_json();
    assert_eq!(json["status"], "paused");
    assert_eq!(json["ok"], false);
    assert!(
        json.get("value").is_none() && json.get("error").is_none(),
        "{json}"
    );
    assert_eq!(json["pending"]["awaiting"], "approval");

    let done = runtime
        .resume(
            &paused.run_id,
            Some(Decision::Approve),
            RunOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(done.status(), RunStatus::Completed, "{:?}", done.result);
    assert_eq!(done.result.clone().unwrap(), json!([2, 2, 4]));
    assert_eq!(made.load(Ordering::SeqCst), 1);
    assert_eq!(
        done.run_id, paused.run_id,
        "a resume goes on with the same run"
    );
    assert_eq!(done.stats.replayed, 1, "the first read is the journal's");
    assert_eq!(done.effects.len(), 1);
    let record = runtime
        .store()
        .unwrap()
        .run(&paused.run_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.status, RunStatus::Completed);
    assert!(record.pending.is_none());
}

/// A durable run holds a quick tool's reads for the executor as any run does (each made once),
/// and its resume replays the reads its journal holds, held or not, making only the new ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_run_holds_quick_reads_and_its_resume_replays_them() {
    const N: i64 = 200;
    let (dir, made) = (TempDir::new().unwrap(), Arc::new(AtomicUsize::new(0)));
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&calls);
    let echo = Tool::builder("echo", Effect::Read).handler(move |args: Value| {
        counter.fetch_add(1, Ordering::SeqCst);
        async move { Ok(json!({"i": args["i"]})) }
    });
    let slow = Tool::builder("slow", Effect::Read).handler(|_| async {
        tokio::time::sleep(Duration::from_millis(5)).await;
        Ok(json!({"x": 1}))
    });
    let mut all = tools(&made);
    all.extend([echo, slow]);
    let store = SqliteStore::open(&dir.path().join("store.sqlite3")).unwrap();
    let runtime = Runtime::builder(Registry::builder().tools(all).build().unwrap())
        .store(Arc::new(store))
        .build();
    let script = format!(
        "let s = 0; for i in 0..{N} {{ s += echo(#{{i: i}}).i }}\n\
         let r = refund(#{{n: s}});\n\
         let t = 0; for i in 0..{N} {{ t += echo(#{{i: i}}).i }}\n\
         s + t + slow(#{{id: 1}}).x"
    );
    // The tool's first calls show it answers at once.
    let warm = format!("let s = 0; for i in 0..{N} {{ s += echo(#{{i: i}}).i }} s");
    let _ = runtime
        .run_with(&warm, RunOptions::with_mode(Mode::Sequential))
        .await;
    let mut held = 0;
    for _ in 0..5 {
        calls.store(0, Ordering::SeqCst);
        let paused = runtime.run(&script).await;
        assert_eq!(paused.status(), RunStatus::Paused, "{:?}", paused.result);
        assert_eq!(
            calls.load(Ordering::SeqCst),
            N as usize,
            "each read made once"
        );
        assert_eq!(
            paused.pending.as_ref().unwrap().args,
            json!({"n": N * (N - 1) / 2})
        );
        calls.store(0, Ordering::SeqCst);
        let done = runtime
            .resume(
                &paused.run_id,
                Some(Decision::Approve),
                RunOptions::default(),
            )
            .await
            .unwrap();
        assert_eq!(done.result.clone().unwrap(), json!(N * (N - 1) + 1));
        assert_eq!(done.stats.replayed, N as u64, "{:?}", done.stats);
        assert_eq!(
            calls.load(Ordering::SeqCst),
            N as usize,
            "the resume makes only the reads after the write"
        );
        held += paused.stats.speculative_held + done.stats.speculative_held;
        if held > 0 {
            break;
        }
    }
    assert!(
        held > 0,
        "a durable run held none of a quick tool's reads in five runs"
    );
}

/// A run's input is kept with it: the resumed script reads the same `input`, and takes the
/// same path, whatever the resume's own options say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_gives_the_script_its_input_again() {
    let (dir, made) = (TempDir::new().unwrap(), Arc::new(AtomicUsize::new(0)));
    let runtime = durable(&dir, &made);
    let script =
        "let a = lookup(#{n: input.n});\nlet r = refund(#{n: a.twice});\n[input.n, r.done.n]";
    let paused = runtime
        .run_with(script, RunOptions::default().input(json!({"n": 5})))
        .await;
    assert_eq!(paused.status(), RunStatus::Paused, "{:?}", paused.result);
    let record = runtime
        .store()
        .unwrap()
        .run(&paused.run_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.input, Some(json!({"n": 5})));
    let options = RunOptions::default().input(json!({"n": 7}));
    let done = runtime
        .resume(&paused.run_id, Some(Decision::Approve), options)
        .await
        .unwrap();
    assert_eq!(done.result.clone().unwrap(), json!([5, 10]));
    assert_eq!(
        done.stats.replayed, 1,
        "the read is the journal's, its input unchanged"
    );
    assert_eq!(made.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_idempotency_key_is_the_run_and_the_calls_place() {
    let (dir, made) = (TempDir::new().unwrap(), Arc::new(AtomicUsize::new(0)));
    let runtime = durable(&dir, &made);
    let paused = runtime.run("refund(#{n: 1})").await;
    let done = runtime
        .resume(
            &paused.run_id,
            Some(Decision::Approve),
            RunOptions::default(),
        )
        .await
        .unwrap();
    let key = format!("{}:0", paused.run_id);
    assert_eq!(done.result.unwrap()["key"], json!(key));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_call_throws_rejected_where_it_was_made() {
    let (dir, made) = (TempDir::new().unwrap(), Arc::new(AtomicUsize::new(0)));
    let runtime = durable(&dir, &made);
    let script = r#"
        let r = ();
        try { r = refund(#{n: 1}); } catch (e) { r = `${e.kind}: ${e.message}`; }
        r
    "#;
    let paused = runtime.run(script).await;
    let done = runtime
        .resume(
            &paused.run_id,
            Some(Decision::Reject {
                reason: Some("over the limit".into()),
            }),
            RunOptions::default(),
        )
        .await
        .unwrap();
    let value = done.result.unwrap();
    assert_eq!(
        value,
        json!("rejected: a person rejected this call: over the limit")
    );
    assert_eq!(
        made.load(Ordering::SeqCst),
        0,
        "a rejected call is never made"
    );
    assert!(done.effects.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncaught_rejection_fails_the_run_at_the_call() {
    let (dir, made) = (TempDir::new().unwrap(), Arc::new(AtomicUsize::new(0)));
    let runtime = durable(&dir, &made);
    let paused = runtime.run("let a = 1;\nlet r = refund(#{n: a});\nr").await;
    let done = runtime
        .resume(
            &paused.run_id,
            Some(Decision::Reject { reason: None }),
            RunOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(done.status(), RunStatus::Failed);
    let error = done.result.unwrap_err();
    assert_eq!(error.kind, ErrorKind::Rejected);
    assert_eq!(error.tool.as_deref(), Some("refund"));
    assert_eq!((error.line, error.column), (Some(2), Some(9)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_approvals_in_one_run() {
    let (dir, made) = (TempDir::new().unwrap(), Arc::new(AtomicUsize::new(0)));
    let runtime = durable(&dir, &made);
    let script = "let a = refund(#{n: 1}); let b = lookup(#{n: 5}); let c = notify(#{n: b.twice}); [a.done.n, c.done.n]";
    let first = runtime.run(script).await;
    assert_eq!(first.pending.as_ref().unwrap().tool, "refund");
    let second = runtime
        .resume(
            &first.run_id,
            Some(Decision::Approve),
            RunOptions::default(),
        )
        .await
        .unwrap();
    let pending = second.pending.as_ref().expect("paused again");
    assert_eq!((pending.tool.as_str(), pending.seq), ("notify", 1));
    assert_eq!(pending.args, json!({"n": 10}));
    assert_eq!(made.load(Ordering::SeqCst), 1);
    let done = runtime
        .resume(
            &first.run_id,
            Some(Decision::Approve),
            RunOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(done.result.unwrap(), json!([1, 10]));
    assert_eq!(
        made.load(Ordering::SeqCst),
        2,
        "each approved call made once"
    );
    assert_eq!(
        done.effects.len(),
        2,
        "the run's effects, the replayed one included"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_refuses_what_it_cannot_do() {
    let (dir, made) = (TempDir::new().unwrap(), Arc::new(AtomicUsize::new(0)));
    let runtime = durable(&dir, &made);
    let done = runtime.run("lookup(#{n: 1}).twice").await;
    assert_eq!(done.status(), RunStatus::Completed);
    let message = |e: Error| match e {
        Error::Resume { message, .. } => message,
        other => panic!("expected a resume error, got {other}"),
    };
    let again = runtime
        .resume(&done.run_id, None, RunOptions::default())
        .await
        .unwrap_err();
    assert!(message(again).contains("already completed"));
    let unknown = runtime
        .resume("nope", None, RunOptions::default())
        .await
        .unwrap_err();
    assert!(message(unknown).contains("no such run"));

    let paused = runtime.run(REFUND).await;
    let wrong = runtime
        .resume(&paused.run_id, Some(Decision::Done), RunOptions::default())
        .await
        .unwrap_err();
    assert!(message(wrong).contains("--approve or --reject"));
    let none = runtime
        .resume(&paused.run_id, None, RunOptions::default())
        .await
        .unwrap_err();
    assert!(message(none).contains("approval"));

    // Another catalog: a tool the run started with is gone.
    let store = Arc::clone(runtime.store().unwrap());
    let mut tools = tools(&made);
    tools.retain(|t| t.spec().name != "notify");
    let other = Runtime::builder(Registry::builder().tools(tools).build().unwrap())
        .store(store)
        .build();
    let changed = other
        .resume(
            &paused.run_id,
            Some(Decision::Approve),
            RunOptions::default(),
        )
        .await
        .unwrap_err();
    let changed = message(changed);
    assert!(
        changed.contains("catalog changed") && changed.contains("`notify` is gone"),
        "{changed}"
    );
    assert_eq!(made.load(Ordering::SeqCst), 0);
}

/// A run paused by the previous version resumes: its row written as that version wrote it
/// (`mode` and `status` as names, `pending` as the JSON of the pending call, no journal rows
/// yet). A row whose `pending` does not parse is an error naming the run and the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_paused_in_the_stored_format_of_the_previous_version_resumes() {
    let (dir, made) = (TempDir::new().unwrap(), Arc::new(AtomicUsize::new(0)));
    let runtime = durable(&dir, &made);
    let probe = runtime.run("1").await;
    let store = runtime.store().unwrap();
    let catalog = store
        .run(&probe.run_id)
        .await
        .unwrap()
        .unwrap()
        .catalog_sha256;
    let conn = rusqlite::Connection::open(dir.path().join("store.sqlite3")).unwrap();
    let insert = |run_id: &str, pending: &str| {
        conn.execute(
            "INSERT INTO runs (run_id, script_name, script, catalog_sha256, mode, status, \
             started_ms, updated_ms, pending, outcome, input) \
             VALUES (?1, 'refund.rhai', ?2, ?3, 'sequential', 'paused', \
             1764590000000, 1764590000000, ?4, '{\"status\":\"paused\"}', NULL)",
            rusqlite::params![run_id, REFUND, catalog, pending],
        )
        .unwrap()
    };
    insert(
        "old-format",
        r#"{"seq":0,"tool":"refund","effect":"write","args":{"n":2},"awaiting":"approval"}"#,
    );
    insert(
        "bad-pending",
        r#"{"tool":"refund","effect":"write","args":{"n":2},"awaiting":"approval"}"#,
    );

    let listed = store.run("old-format").await.unwrap().unwrap();
    assert_eq!(listed.mode, Mode::Sequential);
    assert_eq!(
        listed.pending.as_ref().map(|p| p.awaiting),
        Some(Awaiting::Approval)
    );
    let done = runtime
        .resume("old-format", Some(Decision::Approve), RunOptions::default())
        .await
        .unwrap();
    assert_eq!(done.status(), RunStatus::Completed, "{:?}", done.result);
    assert_eq!(done.result.clone().unwrap(), json!([2, 2, 4]));
    assert_eq!(
        done.stats.mode,
        Mode::Sequential,
        "a resume keeps the stored mode"
    );
    assert_eq!(made.load(Ordering::SeqCst), 1);

    let e = runtime
        .resume(
            "bad-pending",
            Some(Decision::Approve),
            RunOptions::default(),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("run bad-pending") && e.contains("`pending`"),
        "{e}"
    );
    assert_eq!(
        made.load(Ordering::SeqCst),
        1,
        "nothing is made from bad data"
    );
}

/// A store file of schema version 3, as that version wrote it (no fingerprints, no artifact
/// references, no incremental vacuum), opens and is upgraded: its paused run, stored with the
/// whole catalog's hash, resumes under the same catalog; an artifact its outcome names stays
/// when the run that made it is pruned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_of_schema_version_3_is_upgraded_and_its_old_hash_run_resumes() {
    let (dir, made) = (TempDir::new().unwrap(), Arc::new(AtomicUsize::new(0)));
    // The whole catalog's hash, as version 3 stored it (a new store still keeps it).
    let whole = {
        let probe = TempDir::new().unwrap();
        let runtime = durable(&probe, &made);
        let run = runtime.run("1").await;
        let store = runtime.store().unwrap();
        store
            .run(&run.run_id)
            .await
            .unwrap()
            .unwrap()
            .catalog_sha256
    };
    let path = dir.path().join("store.sqlite3");
    let artifact = "0123456789abcdef0123456789abcdef";
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(V3_SCHEMA).unwrap();
        conn.execute(
            "INSERT INTO runs (run_id, script_name, script, catalog_sha256, mode, status, \
             owner_pid, started_ms, updated_ms, pending, outcome, input) \
             VALUES ('v3-paused', 'refund.rhai', ?1, ?2, 'speculative', 'paused', NULL, \
             1764590000000, 1764590000000, ?3, ?4, NULL)",
            rusqlite::params![
                REFUND,
                whole,
                r#"{"seq":0,"tool":"refund","effect":"write","args":{"n":2},"awaiting":"approval"}"#,
                format!(r#"{{"status":"paused","logs":[{{"artifact":"{artifact}"}}]}}"#),
            ],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO runs (run_id, script_name, script, catalog_sha256, mode, status, \
             owner_pid, started_ms, updated_ms, pending, outcome, input) \
             VALUES ('v3-done', 'x.rhai', '1', ?1, 'speculative', 'completed', NULL, \
             1764580000000, 1764580000000, NULL, '{}', NULL)",
            [&whole],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO artifacts (id, run_id, policy, page_tokens, content, created_ms) \
             VALUES (?1, 'v3-done', 'page', 100, X'5B315D', 1764580000000)",
            [artifact],
        )
        .unwrap();
    }
    let store = Arc::new(SqliteStore::open(&path).unwrap());
    assert_eq!(
        crate::support::user_version(&path),
        crate::support::SQLITE_SCHEMA
    );
    let pruned = toolscript::prune(&*store, toolscript::PruneRule::default())
        .await
        .unwrap();
    assert_eq!((pruned.runs, pruned.artifacts), (1, 0), "{pruned:?}");
    assert!(
        toolscript::Store::artifact(&*store, artifact)
            .await
            .unwrap()
            .is_some(),
        "the paused run's outcome names it"
    );
    let runtime = Runtime::builder(catalog(&made))
        .store(store.clone())
        .build();
    let done = runtime
        .resume("v3-paused", Some(Decision::Approve), RunOptions::default())
        .await
        .unwrap();
    assert_eq!(done.status(), RunStatus::Completed, "{:?}", done.result);
    assert_eq!(done.result.unwrap(), json!([2, 2, 4]));
    assert_eq!(made.load(Ordering::SeqCst), 1);
}

/// The tables of a store of schema version 3, stamped as that version stamped them.
const V3_SCHEMA: &str = "
PRAGMA journal_mode = WAL;
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY, script_name TEXT NOT NULL, script TEXT NOT NULL,
    catalog_sha256 TEXT NOT NULL, mode TEXT NOT NULL, status TEXT NOT NULL, owner_pid INTEGER,
    started_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL, pending TEXT, outcome TEXT,
    input TEXT
);
CREATE TABLE writes (
    run_id TEXT NOT NULL, seq INTEGER NOT NULL, tool TEXT NOT NULL, args TEXT NOT NULL,
    approved INTEGER NOT NULL DEFAULT 0, retry INTEGER NOT NULL DEFAULT 0,
    intent INTEGER NOT NULL DEFAULT 0, outcome TEXT, PRIMARY KEY (run_id, seq)
);
CREATE TABLE artifacts (
    id TEXT PRIMARY KEY, run_id TEXT NOT NULL, policy TEXT NOT NULL,
    page_tokens INTEGER NOT NULL, content BLOB NOT NULL, created_ms INTEGER NOT NULL
);
CREATE TABLE reads (
    run_id TEXT NOT NULL, epoch INTEGER NOT NULL, tool TEXT NOT NULL, args TEXT NOT NULL,
    n INTEGER NOT NULL, outcome TEXT NOT NULL, PRIMARY KEY (run_id, epoch, tool, args, n)
);
PRAGMA user_version = 3;
PRAGMA application_id = 1414751090;
";

/// A store of the previous version (schema 3, whose journal did not record the processes a
/// call might reach), left by a process killed while a write ran: it is upgraded when opened,
/// and the resume asks whether the write took effect, saying it may still be running (nothing
/// says what that process had started); `--resolve retry` makes it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_cut_short_under_the_previous_version_may_still_be_running() {
    let (dir, made) = (TempDir::new().unwrap(), Arc::new(AtomicUsize::new(0)));
    let probe = durable(&dir, &made).run("1").await;
    let hash = durable(&dir, &made)
        .store()
        .unwrap()
        .run(&probe.run_id)
        .await
        .unwrap()
        .unwrap()
        .catalog_sha256;
    let path = dir.path().join("v3.sqlite3");
    let conn = rusqlite::Connection::open(&path).unwrap();
    // The previous version's schema, as it wrote it.
    conn.execute_batch(
        "CREATE TABLE runs (run_id TEXT PRIMARY KEY, script_name TEXT NOT NULL, script TEXT NOT NULL, \
         catalog_sha256 TEXT NOT NULL, mode TEXT NOT NULL, status TEXT NOT NULL, owner_pid INTEGER, \
         started_ms INTEGER NOT NULL, updated_ms INTEGER NOT NULL, pending TEXT, outcome TEXT, input TEXT);
         CREATE TABLE writes (run_id TEXT NOT NULL, seq INTEGER NOT NULL, tool TEXT NOT NULL, \
         args TEXT NOT NULL, approved INTEGER NOT NULL DEFAULT 0, retry INTEGER NOT NULL DEFAULT 0, \
         intent INTEGER NOT NULL DEFAULT 0, outcome TEXT, PRIMARY KEY (run_id, seq));
         CREATE TABLE artifacts (id TEXT PRIMARY KEY, run_id TEXT NOT NULL, policy TEXT NOT NULL, \
         page_tokens INTEGER NOT NULL, content BLOB NOT NULL, created_ms INTEGER NOT NULL);
         CREATE TABLE reads (run_id TEXT NOT NULL, epoch INTEGER NOT NULL, tool TEXT NOT NULL, \
         args TEXT NOT NULL, n INTEGER NOT NULL, outcome TEXT NOT NULL, \
         PRIMARY KEY (run_id, epoch, tool, args, n));
         PRAGMA user_version = 3; PRAGMA application_id = 1414751090;",
    )
    .unwrap();
    // Killed while `refund` ran: running, owned by a process that is gone; the write's intent
    // journaled (after its approval), its outcome not.
    conn.execute(
        "INSERT INTO runs (run_id, script_name, script, catalog_sha256, mode, status, owner_pid, \
         started_ms, updated_ms, pending, outcome, input) VALUES ('v3-run', 'refund.rhai', ?1, ?2, \
         'speculative', 'running', NULL, 1764590000000, 1764590000000, NULL, NULL, NULL)",
        rusqlite::params![REFUND, hash],
    )
    .unwrap();
    conn.execute(
        "INSERT INTO writes (run_id, seq, tool, args, approved, retry, intent, outcome) \
         VALUES ('v3-run', 0, 'refund', '{\"n\":2}', 1, 0, 1, NULL)",
        [],
    )
    .unwrap();
    drop(conn);

    let store = SqliteStore::open(&path).unwrap();
    let runtime = Runtime::builder(catalog(&made))
        .store(Arc::new(store))
        .build();
    let paused = runtime
        .resume("v3-run", None, RunOptions::default())
        .await
        .unwrap();
    assert_eq!(paused.status(), RunStatus::Paused, "{:?}", paused.result);
    let pending = paused.pending.clone().unwrap();
    assert_eq!(pending.awaiting, Awaiting::Resolve);
    assert_eq!(pending.uncertain, Some(true));
    let why = pending.why.clone().unwrap();
    assert!(why.contains("earlier toolscript"), "{why}");
    let json = paused.to_json();
    assert_eq!(json["pending"]["uncertain"], json!(true), "{json}");
    let next = paused
        .result
        .unwrap_err()
        .suggested_next_action
        .clone()
        .unwrap();
    assert!(next.contains("may still be running"), "{next}");
    assert_eq!(made.load(Ordering::SeqCst), 0);
    let done = runtime
        .resume("v3-run", Some(Decision::Retry), RunOptions::default())
        .await
        .unwrap();
    assert_eq!(done.status(), RunStatus::Completed, "{:?}", done.result);
    assert_eq!(done.result.unwrap(), json!([2, 2, 4]));
    assert_eq!(made.load(Ordering::SeqCst), 1, "made once, on retry");
    assert_eq!(
        crate::support::user_version(&path),
        crate::support::SQLITE_SCHEMA,
        "the store was upgraded"
    );
    let conn = rusqlite::Connection::open(&path).unwrap();
    let processes: Option<String> = conn
        .query_row(
            "SELECT processes FROM writes WHERE run_id = 'v3-run' AND seq = 0",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let processes: Value = serde_json::from_str(&processes.unwrap()).unwrap();
    assert_eq!(
        processes["pid"],
        json!(std::process::id()),
        "the retry's intent records its process: {processes}"
    );
}

/// A write whose process is gone but whose MCP server's process group still has a process
/// (its guard was killed first, say): the resume waits a moment for the group to end, then
/// says the call may still be running, naming the group and its pids; once the group has
/// ended, the run can be settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_server_still_runs_may_still_be_running() {
    use std::os::unix::process::CommandExt;
    let (dir, made) = (TempDir::new().unwrap(), Arc::new(AtomicUsize::new(0)));
    let runtime = durable(&dir, &made);
    let probe = runtime.run("1").await;
    let store = runtime.store().unwrap();
    let hash = store
        .run(&probe.run_id)
        .await
        .unwrap()
        .unwrap()
        .catalog_sha256;
    // The server's group: a process that outlived its guard.
    let mut server = Command::new("sleep")
        .arg("60")
        .process_group(0)
        .spawn()
        .unwrap();
    let group = server.id();
    // The process that made the call: gone (its pid, with a start time no process has).
    let processes = json!({"pid": std::process::id(), "start": u64::MAX,
        "children": [{"name": "MCP server `shop`", "group": group, "pid": group}]});
    let conn = rusqlite::Connection::open(dir.path().join("store.sqlite3")).unwrap();
    conn.execute(
        "INSERT INTO runs (run_id, script_name, script, catalog_sha256, mode, status, \
         started_ms, updated_ms) VALUES ('orphaned', 'refund.rhai', ?1, ?2, 'speculative', \
         'running', 1764590000000, 1764590000000)",
        rusqlite::params![REFUND, hash],
    )
    .unwrap();
    conn.execute(
        "INSERT INTO writes (run_id, seq, tool, args, approved, retry, intent, outcome, processes) \
         VALUES ('orphaned', 0, 'refund', '{\"n\":2}', 1, 0, 1, NULL, ?1)",
        [processes.to_string()],
    )
    .unwrap();
    let paused = runtime
        .resume("orphaned", None, RunOptions::default())
        .await
        .unwrap();
    let pending = paused.pending.clone().unwrap();
    assert_eq!(
        (pending.awaiting, pending.uncertain),
        (Awaiting::Resolve, Some(true))
    );
    let why = pending.why.unwrap();
    assert!(
        why.contains("MCP server `shop` still runs")
            && why.contains(&format!("process group {group}: pids {group}")),
        "{why}"
    );
    let listed = toolscript(&["runs"], &dir.path().join("store.sqlite3"));
    assert!(
        listed
            .stdout
            .contains("(awaiting resolve, may still be running)"),
        "{}",
        listed.stdout
    );
    server.kill().unwrap();
    server.wait().unwrap();
    let done = runtime
        .resume("orphaned", Some(Decision::Retry), RunOptions::default())
        .await
        .unwrap();
    assert_eq!(done.result.unwrap(), json!([2, 2, 4]));
    assert_eq!(made.load(Ordering::SeqCst), 1, "made once, on retry");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_store_a_run_stops_at_an_approval_and_says_why() {
    let made = Arc::new(AtomicUsize::new(0));
    let runtime = Runtime::new(catalog(&made));
    let outcome = runtime.run(REFUND).await;
    assert_eq!(outcome.status(), RunStatus::Paused);
    let error = outcome.result.unwrap_err();
    assert_eq!(error.kind, ErrorKind::Paused);
    assert!(error
        .suggested_next_action
        .as_deref()
        .unwrap()
        .contains("no store"));
    assert_eq!(made.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replayed_reads_are_not_made_again() {
    let dir = TempDir::new().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let lookup = Tool::builder("lookup", Effect::Read).handler(move |args| {
        counted.fetch_add(1, Ordering::SeqCst);
        async move { Ok(args) }
    });
    let send = Tool::builder("send", Effect::Write)
        .approval(Approval::Always)
        .handler(|args| async move { Ok(args) });
    let store = Arc::new(SqliteStore::open(&dir.path().join("s.sqlite3")).unwrap());
    let runtime = Runtime::builder(Registry::builder().tools([lookup, send]).build().unwrap())
        .store(store)
        .build();
    let script = "let xs = []; for i in 0..50 { xs.push(lookup(#{i: i}).i); } send(#{sum: xs.reduce(|s, x| s + x, 0)}).sum";
    let paused = runtime.run(script).await;
    assert_eq!(calls.load(Ordering::SeqCst), 50);
    let done = runtime
        .resume(
            &paused.run_id,
            Some(Decision::Approve),
            RunOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(done.result.unwrap(), json!(1225));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        50,
        "the journal answered all 50"
    );
    assert_eq!(done.stats.replayed, 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_replays_a_failed_read_and_its_retry_as_they_were() {
    // Every other call with the same arguments fails: the first of each epoch does, the first
    // with a tool's own kind that says it passes.
    let script = "let seen = [];\nlet r = ();\nwhile r == () { try { r = flaky(#{id: 7}); } catch (e) { seen.push(e.kind); } }\nseen.push(r.n);\nsend(#{n: r.n});\nlet again = ();\nwhile again == () { try { again = flaky(#{id: 7}); } catch (e) { seen.push(e.kind); } }\nseen.push(again.n);\nprint(seen);\nseen";
    let expected = json!(["rate_limited", 1, "unavailable", 3]);
    for (first, then) in [
        (Mode::Speculative, Mode::Sequential),
        (Mode::Sequential, Mode::Speculative),
    ] {
        let dir = TempDir::new().unwrap();
        let (flaky, calls) = by_occurrence(
            "flaky",
            |_| Duration::from_millis(3),
            |_, n| match n {
                0 => toolscript::ToolError::with_kind_name("rate_limited", "slow down")
                    .map(|e| e.with_recoverable(true)),
                n => (n % 2 == 0).then(|| toolscript::ToolError::unavailable("down")),
            },
        );
        let send = Tool::builder("send", Effect::Write)
            .approval(Approval::Always)
            .handler(|args| async move { Ok(args) });
        let store = Arc::new(SqliteStore::open(&dir.path().join("s.sqlite3")).unwrap());
        let runtime = Runtime::builder(Registry::builder().tools([flaky, send]).build().unwrap())
            .store(store)
            .build();
        let paused = runtime.run_with(script, RunOptions::with_mode(first)).await;
        assert_eq!(paused.status(), RunStatus::Paused, "{first:?}");
        assert_eq!(calls_of(&calls), 2, "{first:?}: the failure and its retry");
        let done = runtime
            .resume(
                &paused.run_id,
                Some(Decision::Approve),
                RunOptions::with_mode(then),
            )
            .await
            .unwrap();
        assert_eq!(
            done.result.as_ref().unwrap(),
            &expected,
            "{first:?} then {then:?}"
        );
        assert_eq!(
            calls_of(&calls),
            4,
            "{first:?} then {then:?}: the journal answered the first epoch's failure and its retry"
        );
        assert_eq!(done.stats.replayed, 2, "{first:?} then {then:?}");
        assert_eq!(
            done.logs,
            [r#"["rate_limited", 1, "unavailable", 3]"#],
            "{first:?} then {then:?}"
        );
        let made: Vec<_> = done
            .receipts
            .iter()
            .filter(|r| r.tool == "flaky" && (!r.speculative || r.claimed))
            .map(|r| r.error_kind.clone())
            .collect();
        assert_eq!(
            made,
            [Some("unavailable".to_string()), None],
            "{first:?} then {then:?}: the resumed process's own calls"
        );
    }
}

#[test]
fn the_clock_is_not_offered_to_scripts() {
    let made = Arc::new(AtomicUsize::new(0));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let outcome = rt.block_on(Runtime::new(catalog(&made)).run("let t = timestamp(); 1"));
    let error = outcome.result.unwrap_err();
    assert_eq!(error.kind, ErrorKind::ScriptError);
    assert!(error.message.contains("timestamp"), "{}", error.message);
}

// ---- The command line, and processes killed with SIGKILL ----

/// One invocation of the binary.
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl From<std::process::Output> for Ran {
    fn from(out: std::process::Output) -> Ran {
        Ran {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

fn toolscript(args: &[&str], store: &Path) -> Ran {
    let out = Command::new(env!("CARGO_BIN_EXE_toolscript"))
        .args(args)
        .arg("--store")
        .arg(store)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("toolscript runs");
    Ran::from(out)
}

fn json_of(ran: &Ran) -> Value {
    serde_json::from_str(ran.stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "not one JSON object ({e}): {}\nstderr: {}",
            ran.stdout, ran.stderr
        )
    })
}

fn write(dir: &TempDir, name: &str, text: &str) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn the_command_line_pauses_with_status_3_and_resumes() {
    let dir = TempDir::new().unwrap();
    let manifest = write(
        &dir,
        "m.toml",
        r#"
[[tool]]
name = "charge"
effect = "write"
approval = "always"
script = '#{ charged: args.amount, key: ctx.idempotency_key }'
"#,
    );
    let script = write(
        &dir,
        "s.rhai",
        "let c = charge(#{amount: 5}); c.charged + 1",
    );
    let store = dir.path().join("store.sqlite3");
    let m = manifest.to_str().unwrap();
    let paused = toolscript(
        &["run", script.to_str().unwrap(), "--tools", m, "--json"],
        &store,
    );
    assert_eq!(paused.code, Some(3), "{}", paused.stderr);
    let out = json_of(&paused);
    assert_eq!(out["status"], "paused");
    assert_eq!(
        out["pending"],
        json!({"seq": 0, "tool": "charge", "effect": "write", "args": {"amount": 5}, "awaiting": "approval"})
    );
    let run_id = out["run_id"].as_str().unwrap().to_string();
    // The script file changes; the run goes on with the text it started with.
    std::fs::write(&script, "999").unwrap();
    let listed = toolscript(&["runs", "--json"], &store);
    let runs = json_of(&listed);
    assert_eq!(runs[0]["run_id"], json!(run_id));
    assert_eq!(runs[0]["status"], "paused");
    assert_eq!(runs[0]["pending"]["tool"], "charge");

    let resumed = toolscript(
        &["resume", &run_id, "--approve", "--tools", m, "--json"],
        &store,
    );
    assert_eq!(resumed.code, Some(0), "{}", resumed.stderr);
    let out = json_of(&resumed);
    assert_eq!(out["status"], "completed");
    assert_eq!(out["value"], json!(6));
    let again = toolscript(&["resume", &run_id, "--tools", m], &store);
    assert_eq!(again.code, Some(0));
    assert!(
        again.stderr.contains("already completed"),
        "{}",
        again.stderr
    );
    let other = write(
        &dir,
        "other.toml",
        "[[tool]]\nname = \"charge\"\neffect = \"idempotent\"\nscript = '1'\n",
    );
    std::fs::write(&script, "charge(#{amount: 1})").unwrap();
    let paused = toolscript(
        &["run", script.to_str().unwrap(), "--tools", m, "--json"],
        &store,
    );
    assert_eq!(paused.code, Some(3), "{}", paused.stderr);
    let run_id = json_of(&paused)["run_id"].as_str().unwrap().to_string();
    let refused = toolscript(
        &[
            "resume",
            &run_id,
            "--approve",
            "--tools",
            other.to_str().unwrap(),
        ],
        &store,
    );
    assert_eq!(refused.code, Some(2));
    assert!(refused.stderr.contains("catalog"), "{}", refused.stderr);
}

/// The lease of a run these tests kill: short, so that a resume takes the run soon after.
const KILLED_LEASE_S: &str = "0.3";

/// Waits for the lease of a killed run's process to expire: a resume takes the run then.
fn lease_expires() {
    std::thread::sleep(Duration::from_millis(350));
}

/// Starts `toolscript ARGS --store STORE`, kills it with SIGKILL after `after` unless it
/// ended first (and waits for its lease to expire); what it printed if it ended.
fn run_or_kill(args: &[String], store: &Path, after: Duration) -> Option<Ran> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_toolscript"))
        .args(args)
        .arg("--store")
        .arg(store)
        .env_remove("RUST_LOG")
        .env("TOOLSCRIPT_LEASE_S", KILLED_LEASE_S)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("toolscript starts");
    let started = std::time::Instant::now();
    while started.elapsed() < after {
        if child.try_wait().unwrap().is_some() {
            return Some(Ran::from(child.wait_with_output().unwrap()));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    lease_expires();
    None
}

#[test]
fn a_write_cut_short_by_a_kill_is_ambiguous_until_a_person_settles_it() {
    let dir = TempDir::new().unwrap();
    // The write's body has run when its simulated latency starts: a kill then leaves its
    // intent journaled and its outcome lost.
    let manifest = write(
        &dir,
        "m.toml",
        r#"
[[tool]]
name = "ship"
effect = "write"
latency_ms = 3000
script = '#{ shipped: args.n }'

[[tool]]
name = "ping"
effect = "idempotent"
latency_ms = 3000
script = '#{ key: ctx.idempotency_key }'
"#,
    );
    let m = manifest.to_str().unwrap().to_string();
    for (script, tool) in [("ship(#{n: 1}); 7", "ship"), ("ping().key", "ping")] {
        let store = dir.path().join(format!("{tool}.sqlite3"));
        let script = write(&dir, &format!("{tool}.rhai"), script);
        let args: Vec<String> = ["run", script.to_str().unwrap(), "--tools", &m, "--json"]
            .map(String::from)
            .to_vec();
        assert!(
            run_or_kill(&args, &store, Duration::from_millis(1200)).is_none(),
            "the run was killed"
        );
        let runs = json_of(&toolscript(&["runs", "--json"], &store));
        assert_eq!(runs[0]["status"], "running", "a killed run is left running");
        let run_id = runs[0]["run_id"].as_str().unwrap().to_string();
        let resumed = toolscript(&["resume", &run_id, "--tools", &m, "--json"], &store);
        let out = json_of(&resumed);
        if tool == "ping" {
            // An idempotent call is made again, under the same key.
            assert_eq!(resumed.code, Some(0), "{}", resumed.stderr);
            assert_eq!(out["value"], json!(format!("{run_id}:0")));
            continue;
        }
        assert_eq!(resumed.code, Some(3), "{}", resumed.stderr);
        assert_eq!(out["pending"]["awaiting"], "resolve");
        assert_eq!(out["pending"]["tool"], "ship");
        let done = toolscript(
            &[
                "resume",
                &run_id,
                "--resolve",
                "done",
                "--tools",
                &m,
                "--json",
            ],
            &store,
        );
        assert_eq!(done.code, Some(0), "{}", done.stderr);
        let out = json_of(&done);
        assert_eq!(out["value"], json!(7));
        assert_eq!(out["effects"][0]["tool"], "ship");
    }
}

/// The crash test's script: 30 non-read calls, each after a read whose answer is the number of
/// records the recorder holds — every third an idempotent write, four a `write` composite
/// (`pair`, below) nesting an idempotent write and a write, the others writes; the value is
/// every read's answer.
const CRASH_SCRIPT: &str = r#"
let seen = [];
for i in 0..30 {
    let before = lookup(#{n: i});
    seen.push(before.records);
    if i % 3 == 0 {
        record_idem(#{n: i, seen: before.records});
    } else if i % 5 == 1 {
        pair(#{n: i, seen: before.records});
    } else {
        record(#{n: i, seen: before.records});
    }
}
seen
"#;

/// The calls of [`CRASH_SCRIPT`] that are `pair`s.
fn is_pair(i: u64) -> bool {
    !i.is_multiple_of(3) && i % 5 == 1
}

/// The crash test's composite: a `write` that nests two writes, journaled as one call. Its
/// first write is idempotent (a retried `pair` makes it again under the same key, and the
/// recorder keeps it once), so a person settles a `pair` by looking for its last one.
const PAIR: &str = r#"
[[tool]]
name = "pair"
effect = "write"
nested = ["record_idem", "record"]
script = 'record_idem(#{n: args.n + 100, seen: args.seen}); record(#{n: args.n, seen: args.seen})'
"#;

/// The crash test's recorder: three writes take 300 ms (a kill often lands in one), and the
/// server, when its stdin closes, finishes the calls under way before it exits: a write
/// toolscript did not live to see the end of would land after the kill, unless the server dies
/// with toolscript.
const CRASH_RECORDER: &str =
    "DELAY_MS = \"2\", WRITE_DELAY_MS = \"300\", SLOW_WRITES = \"8,16,23\", LINGER = \"1\"";

struct Recorder {
    dir: TempDir,
    manifest: PathBuf,
    records: PathBuf,
    pids: PathBuf,
}

impl Recorder {
    /// A recorder whose server has `env` (TOML pairs: `DELAY_MS`, `WRITE_DELAY_MS`, `LINGER`,
    /// `WRITE_HELPER`), with `more` manifest text after its table (composites over its tools).
    fn with(env: &str, more: &str) -> Recorder {
        let dir = TempDir::new().unwrap();
        let (records, pids) = (dir.path().join("records"), dir.path().join("pids"));
        let server = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/recorder.js");
        let quoted = |p: &Path| serde_json::to_string(p.to_str().unwrap()).unwrap();
        let manifest = dir.path().join("recorder.toml");
        std::fs::write(
            &manifest,
            format!(
                "[[mcp]]\nname = \"recorder\"\ncommand = [\"node\", {}]\nenv = {{ RECORD_FILE = {}, PID_FILE = {}, {env} }}\n{more}",
                quoted(&server),
                quoted(&records),
                quoted(&pids)
            ),
        )
        .unwrap();
        Recorder {
            dir,
            manifest,
            records,
            pids,
        }
    }

    /// The records as they are now.
    fn records_now(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.records)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The pids the recorder's processes wrote (the server's, its helpers').
    fn pids(&self) -> Vec<u32> {
        std::fs::read_to_string(&self.pids)
            .unwrap_or_default()
            .lines()
            .map(|l| l.parse().unwrap())
            .collect()
    }

    /// The records, once every recorder process has exited (a killed run's server ends when
    /// its stdin closes, and may record a call it had read).
    fn records(&self) -> Vec<Value> {
        let pids = std::fs::read_to_string(&self.pids).unwrap_or_default();
        for pid in pids.lines() {
            let stat = format!("/proc/{pid}/stat");
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while std::fs::read_to_string(&stat).is_ok_and(|s| {
                !s.rsplit_once(')')
                    .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
            }) && std::time::Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        std::fs::read_to_string(&self.records)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// Whether a process runs: it exists, and is not a zombie.
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
    })
}

/// The process group of a running process (`/proc/PID/stat`, field 5).
fn group_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(2)?
        .parse()
        .ok()
}

/// The running processes of the process group `pgid`.
fn members_of(pgid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| group_of(pid) == Some(pgid) && running(pid))
        .collect()
}

/// A write under way when toolscript is SIGKILLed, made by a process its MCP server started (as
/// `npx` starts `node`): the server and that process die with toolscript, so the write never
/// lands after the kill, the resume says the call cannot still be running, and what the person
/// sees when the resume asks is final: the write is made exactly once.
#[test]
fn a_killed_run_s_mcp_server_and_what_it_started_die_with_it() {
    if !node_available() || !Path::new("/proc/self/stat").exists() {
        return;
    }
    // Long enough that a write the kill did not stop lands well after it.
    const WRITE_DELAY: Duration = Duration::from_secs(3);
    let recorder = Recorder::with(
        &format!(
            "WRITE_HELPER = \"1\", WRITE_DELAY_MS = \"{}\"",
            WRITE_DELAY.as_millis()
        ),
        "",
    );
    let dir = recorder.dir.path();
    let (store, script) = (dir.join("store.sqlite3"), dir.join("one.rhai"));
    std::fs::write(&script, "record(#{n: 1, seen: 0}); 7").unwrap();
    let m = recorder.manifest.to_str().unwrap();
    let mut run = Command::new(env!("CARGO_BIN_EXE_toolscript"))
        .args(["run", script.to_str().unwrap(), "--tools", m, "--json"])
        .arg("--store")
        .arg(&store)
        .env_remove("RUST_LOG")
        .env("TOOLSCRIPT_LEASE_S", KILLED_LEASE_S)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // The write is under way once the server and its helper have written their pids.
    let started = std::time::Instant::now();
    while recorder.pids().len() < 2 {
        assert!(
            run.try_wait().unwrap().is_none(),
            "the run ended before its write was under way"
        );
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the write did not start"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let tree = recorder.pids();
    let group = group_of(tree[0]).unwrap();
    run.kill().unwrap();
    run.wait().unwrap();
    let killed = std::time::Instant::now();
    lease_expires();

    // Resumed at once, the run asks whether the write took effect; the person looks now.
    let runs = json_of(&toolscript(&["runs", "--json"], &store));
    let run_id = runs[0]["run_id"].as_str().unwrap().to_string();
    let resumed = toolscript(&["resume", &run_id, "--tools", m, "--json"], &store);
    assert_eq!(resumed.code, Some(3), "{}", resumed.stderr);
    let paused = json_of(&resumed);
    assert_eq!(paused["pending"]["awaiting"], "resolve", "{paused}");
    let seen = recorder.records_now().len();

    // No process of the server's tree is left...
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while tree.iter().any(|&pid| running(pid)) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let left: Vec<u32> = tree.iter().copied().filter(|&pid| running(pid)).collect();
    assert!(
        left.is_empty(),
        "processes of the server's tree outlived toolscript: {left:?}"
    );
    // ...and no write lands after the person looked, once the write's delay has passed.
    std::thread::sleep(
        (killed + WRITE_DELAY + Duration::from_secs(1))
            .saturating_duration_since(std::time::Instant::now()),
    );
    let records = recorder.records_now();
    assert_eq!(
        records.len(),
        seen,
        "a write landed after toolscript was killed: {records:?}"
    );
    // The server had a process group of its own, which is empty now.
    assert_ne!(
        Some(group),
        group_of(std::process::id()),
        "the server runs in a process group of its own"
    );
    assert_eq!(
        members_of(group),
        Vec::<u32>::new(),
        "the server's group is empty"
    );
    assert_eq!(
        paused["pending"]["uncertain"],
        json!(false),
        "every process the call could reach is known to have ended: {paused}"
    );

    let decision = if seen == 0 { "retry" } else { "done" };
    let settled = toolscript(
        &[
            "resume",
            &run_id,
            "--resolve",
            decision,
            "--tools",
            m,
            "--json",
        ],
        &store,
    );
    assert_eq!(settled.code, Some(0), "{}", settled.stderr);
    assert_eq!(json_of(&settled)["value"], json!(7));
    let records = recorder.records();
    assert_eq!(
        records.len(),
        1,
        "the write is made exactly once: {records:?}"
    );
}

/// Ctrl-C or SIGTERM during a write: the command stops gracefully. The call under way ends and
/// its outcome is journaled, the MCP server has its stdin closed and exits (what it started
/// with it), and the process exits with 130 or 143; a resume then goes on without asking
/// anything, and the write is made once.
#[test]
fn a_signal_mid_call_stops_the_run_after_the_call_and_closes_its_servers() {
    if !node_available() || !Path::new("/proc/self/stat").exists() {
        return;
    }
    for (signal, status) in [("-TERM", 143), ("-INT", 130)] {
        let recorder = Recorder::with("WRITE_HELPER = \"1\", WRITE_DELAY_MS = \"1000\"", "");
        let dir = recorder.dir.path();
        let (store, script) = (dir.join("store.sqlite3"), dir.join("one.rhai"));
        std::fs::write(&script, "record(#{n: 1, seen: 0}); 7").unwrap();
        let m = recorder.manifest.to_str().unwrap();
        let mut run = Command::new(env!("CARGO_BIN_EXE_toolscript"))
            .args(["run", script.to_str().unwrap(), "--tools", m, "--json"])
            .arg("--store")
            .arg(&store)
            .env_remove("RUST_LOG")
            .env("TOOLSCRIPT_LEASE_S", KILLED_LEASE_S)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let started = std::time::Instant::now();
        while recorder.pids().len() < 2 {
            assert!(
                run.try_wait().unwrap().is_none(),
                "{signal}: the run ended early"
            );
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "{signal}: no write"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let sent = Command::new("kill")
            .args([signal, &run.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        let out = run.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(status), "{signal}: {stderr}");
        assert!(stderr.contains("stopped by a signal"), "{signal}: {stderr}");
        // The server was closed before the process ended, and what it started dies with its
        // group when the guard's pipe closes, just after: nothing is left (awaited, not timed:
        // a loaded machine may run the guard a moment late).
        let pids = recorder.pids();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while pids.iter().any(|&pid| running(pid)) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let left: Vec<u32> = pids.into_iter().filter(|&pid| running(pid)).collect();
        assert!(left.is_empty(), "{signal}: {left:?} outlived toolscript");
        lease_expires();
        let runs = json_of(&toolscript(&["runs", "--json"], &store));
        let run_id = runs[0]["run_id"].as_str().unwrap().to_string();
        let resumed = toolscript(&["resume", &run_id, "--tools", m, "--json"], &store);
        assert_eq!(resumed.code, Some(0), "{signal}: {}", resumed.stderr);
        assert_eq!(json_of(&resumed)["value"], json!(7));
        assert_eq!(
            recorder.records().len(),
            1,
            "{signal}: the write is made once"
        );
    }
}

/// What a trial saw.
#[derive(Debug, Default)]
struct Trial {
    kills: usize,
    ambiguous: usize,
    /// Ambiguous calls the resume said might still be running.
    uncertain: usize,
    resolved_done: usize,
    resolved_retry: usize,
    /// How long a first run took when nothing killed it: a whole run's time as the machine
    /// runs now.
    whole_run: Option<Duration>,
}

/// Runs the crash script until it completes, killing each process at a random instant in the
/// first `window` (the seed decides); answers each ambiguous call by looking at the recorder,
/// as a person would: at once when the resume says the call cannot still be running, else once
/// the recorder's processes have ended. Returns the final value and what happened.
fn crash_trial(seed: u64, window: Option<Duration>) -> (Value, Recorder, Trial) {
    let recorder = Recorder::with(CRASH_RECORDER, PAIR);
    let store = recorder.dir.path().join("store.sqlite3");
    let script = recorder.dir.path().join("crash.rhai");
    std::fs::write(&script, CRASH_SCRIPT).unwrap();
    let m = recorder.manifest.to_str().unwrap().to_string();
    let mut rng = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut trial = Trial::default();
    let mut run_id: Option<String> = None;
    let mut decision: Option<&str> = None;
    for attempt in 0..200 {
        let mut args: Vec<String> = match &run_id {
            None => vec!["run".into(), script.to_str().unwrap().into()],
            Some(id) => vec!["resume".into(), id.clone()],
        };
        args.extend(["--tools".into(), m.clone(), "--json".into()]);
        if let Some(d) = decision.take() {
            args.extend(["--resolve".into(), d.into()]);
        }
        // Later attempts are killed less often, so that every trial ends.
        let after = match window {
            Some(window) if attempt < 12 && next() % 4 != 0 => {
                Duration::from_micros(next() % window.as_micros() as u64)
            }
            _ => Duration::from_secs(60),
        };
        let started = std::time::Instant::now();
        let ended = run_or_kill(&args, &store, after);
        if attempt == 0 && ended.is_some() {
            trial.whole_run = Some(started.elapsed());
        }
        let out = match ended {
            Some(ran) => {
                let out = json_of(&ran);
                assert!(
                    out["status"] != "failed",
                    "the run failed: {out}\n{}",
                    ran.stderr
                );
                out
            }
            None => {
                trial.kills += 1;
                // Killed: the store says where the run is (it may have paused just before).
                let runs = json_of(&toolscript(&["runs", "--json"], &store));
                match runs.get(0) {
                    Some(run) => run.clone(),
                    None => continue,
                }
            }
        };
        run_id = out["run_id"].as_str().map(str::to_string);
        match out["status"].as_str() {
            Some("completed") if out.get("value").is_some() => {
                return (out["value"].clone(), recorder, trial)
            }
            // Completed just before the kill: its value is the resume's no-op answer.
            Some("completed") | Some("running") => {}
            Some("paused") => {
                let pending = &out["pending"];
                assert_eq!(pending["awaiting"], "resolve", "{out}");
                assert!(
                    pending["tool"] == "record" || pending["tool"] == "pair",
                    "only a write that is not idempotent is ambiguous: {out}"
                );
                trial.ambiguous += 1;
                // A call that might still be running is looked at once it has ended.
                let records = if pending["uncertain"] == json!(true) {
                    trial.uncertain += 1;
                    recorder.records()
                } else {
                    recorder.records_now()
                };
                // A `pair`'s last write is `record` with its `n`, as is a `record`'s only one.
                let n = &pending["args"]["n"];
                let made = records
                    .iter()
                    .any(|r| &r["n"] == n && r["tool"] == "record");
                decision = Some(if made { "done" } else { "retry" });
                if made {
                    trial.resolved_done += 1;
                } else {
                    trial.resolved_retry += 1;
                }
            }
            other => panic!("unexpected status {other:?}: {out}"),
        }
    }
    panic!("the trial did not complete in 200 attempts: {trial:?}");
}

/// The crash test (kill-and-resume trials): `TOOLSCRIPT_CRASH_TRIALS` trials (24 by default),
/// each the crash script killed with SIGKILL at random instants and resumed until it completes,
/// each ambiguous call settled by a person's look at the recorder. Every write reaches the
/// recorder exactly once — writes nested in composites, and writes under way in a server that
/// would finish them after toolscript died — and the value is the uninterrupted run's.
#[test]
fn killed_at_random_instants_every_write_is_made_exactly_once() {
    if !node_available() {
        return;
    }
    let trials: u64 = std::env::var("TOOLSCRIPT_CRASH_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    let began = std::time::Instant::now();
    // Every write, by its `n`: the script's, and the first of each `pair`'s.
    let writes: Vec<u64> = (0..30)
        .chain((0..30).filter(|&i| is_pair(i)).map(|i| i + 100))
        .collect();
    // Read i sees the records of the calls before it: one each, two for a pair.
    let reads: Vec<u64> = (0..30)
        .map(|i| i + (0..i).filter(|&j| is_pair(j)).count() as u64)
        .collect();
    // The value of an uninterrupted run, and how long one takes: kills fall within that. The
    // shortest of three runs: the first pays for cold caches (a node server's first start), and
    // a window longer than a run lets most kills land after the run has ended.
    let mut window = std::time::Duration::MAX;
    for _ in 0..3 {
        let started = std::time::Instant::now();
        let (value, recorder, trial) = crash_trial(0, None);
        window = window.min(started.elapsed());
        assert_eq!(trial.kills, 0);
        assert_eq!(value, json!(reads), "read i sees the records before it");
        assert_eq!(recorder.records().len(), writes.len());
    }
    let mut total = Trial::default();
    let (mut lost, mut duplicated, mut wrong) = (Vec::new(), Vec::new(), Vec::new());
    for seed in 1..=trials {
        let (value, recorder, trial) = crash_trial(seed, Some(window));
        // A machine busier while calibrating than now makes the window too long, and kills
        // land after the run has ended: a whole run seen since narrows it.
        if let Some(whole) = trial.whole_run {
            window = window.min(whole);
        }
        let records = recorder.records();
        for &n in &writes {
            match records.iter().filter(|r| r["n"] == json!(n)).count() {
                1 => {}
                0 => lost.push((seed, n)),
                _ => duplicated.push((seed, n)),
            }
        }
        if value != json!(reads) {
            wrong.push((seed, value));
        }
        total.kills += trial.kills;
        total.ambiguous += trial.ambiguous;
        total.uncertain += trial.uncertain;
        total.resolved_done += trial.resolved_done;
        total.resolved_retry += trial.resolved_retry;
    }
    eprintln!(
        "crash test: {trials} trials killed within {window:?}, {} kills, {} ambiguous calls reported ({} said to be possibly still running; {} settled done, {} retry), {} writes lost, {} duplicated, {} wrong values, in {:.0?}",
        total.kills,
        total.ambiguous,
        total.uncertain,
        total.resolved_done,
        total.resolved_retry,
        lost.len(),
        duplicated.len(),
        wrong.len(),
        began.elapsed()
    );
    assert!(
        lost.is_empty() && duplicated.is_empty() && wrong.is_empty(),
        "every write exactly once, and the uninterrupted run's value: lost (seed, n) {lost:?}, duplicated {duplicated:?}, wrong values {wrong:?}"
    );
    // The invariant is the exactly-once above; this only says the trials were not vacuous.
    // How many kills land depends on how the machine's speed moves during the test.
    assert!(
        2 * total.kills > trials as usize,
        "the trials were killed: {total:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_run_continues_its_receipt_chain() {
    let (dir, made) = (TempDir::new().unwrap(), Arc::new(AtomicUsize::new(0)));
    let runtime = durable(&dir, &made);
    let file = dir.path().join("receipts.jsonl");
    let paused = runtime
        .run_with(REFUND, RunOptions::default().receipts(&file).unwrap())
        .await;
    let first = paused.receipts.len();
    assert!(first > 0);
    let done = runtime
        .resume(
            &paused.run_id,
            Some(Decision::Approve),
            RunOptions::default().append_receipts(&file).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(done.status(), RunStatus::Completed);
    let head = done.receipts.last().unwrap().hash.clone();
    let count = toolscript::receipts::verify_receipts_to(&file, &head).unwrap();
    assert_eq!(
        count,
        first + done.receipts.len(),
        "one chain: the resume's receipts follow the first process's"
    );
    assert!(
        done.receipts
            .iter()
            .all(|r| r.tool != "lookup" || r.args_sha256 != paused.receipts[0].args_sha256),
        "the read the journal answered has no second receipt"
    );
}

/// A run paused by a version that wrote receipt format 1 resumes onto its file in format 2:
/// the chain goes on from the last v1 receipt, and `verify` follows it across the versions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_paused_with_version_1_receipts_goes_on_in_version_2() {
    let (dir, made) = (TempDir::new().unwrap(), Arc::new(AtomicUsize::new(0)));
    let runtime = durable(&dir, &made);
    let file = dir.path().join("receipts.jsonl");
    let paused = runtime
        .run_with(REFUND, RunOptions::default().receipts(&file).unwrap())
        .await;
    // The file as format 1 wrote it: `v` 1, each hash the SHA-256 of the receipt's JSON with
    // keys sorted by their bytes and serde_json's numbers (serde_json's sorted map gives it).
    let mut prev = Value::Null;
    let mut v1 = String::new();
    for line in std::fs::read_to_string(&file).unwrap().lines() {
        let mut receipt: Value = serde_json::from_str(line).unwrap();
        let object = receipt.as_object_mut().unwrap();
        object.remove("hash");
        object.insert("v".into(), json!(1));
        object.insert("prev".into(), prev);
        // An integral float, whose text (`2.0`) is not JCS's (`2`): format 1 checks it.
        object.insert("duration_ms".into(), json!(2.0));
        let hash = crate::support::sha256(&serde_json::to_string(&receipt).unwrap());
        receipt["hash"] = json!(hash);
        v1 += &(serde_json::to_string(&receipt).unwrap() + "\n");
        prev = json!(hash);
    }
    std::fs::write(&file, v1).unwrap();
    let first = toolscript::receipts::verify_receipts(&file).unwrap();
    assert_eq!(first, paused.receipts.len());

    let done = runtime
        .resume(
            &paused.run_id,
            Some(Decision::Approve),
            RunOptions::default().append_receipts(&file).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(done.status(), RunStatus::Completed);
    assert!(!done.receipts.is_empty());
    assert_eq!(done.receipts[0].v, toolscript::receipts::RECEIPT_VERSION);
    assert_eq!(done.receipts[0].prev.as_deref(), prev.as_str());
    let head = done.receipts.last().unwrap().hash.clone();
    assert_eq!(
        toolscript::receipts::verify_receipts_to(&file, &head).unwrap(),
        first + done.receipts.len()
    );
}
