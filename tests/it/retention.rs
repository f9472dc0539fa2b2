//! Retention and the list of runs: `prune` (by age and status, the resumable runs kept unless
//! asked, a live run never, artifacts kept while a kept run refers to them, the file smaller
//! after the vacuum), `[store] keep_days`, large inputs kept as artifacts, `runs` and
//! `list_runs` a page at a time; and the catalog a paused run resumes under: prose may change,
//! behaviour may not, and a refusal names the tool and what changed.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::{json, Value};
use tempfile::TempDir;
use toolscript::{
    Approval, Decision, Effect, Error, Manifests, PruneRule, Registry, RunOptions, RunQuery,
    RunRecord, RunStatus, Runtime, SqliteStore, Store, StoredArtifact, Tool,
};

const DAY_MS: i64 = 86_400_000;

fn open(dir: &TempDir) -> Arc<SqliteStore> {
    Arc::new(SqliteStore::open(&dir.path().join("store.sqlite3")).unwrap())
}

fn sql(dir: &TempDir) -> rusqlite::Connection {
    rusqlite::Connection::open(dir.path().join("store.sqlite3")).unwrap()
}

/// Records a run `id` that ended in `status` (or is left `running`), its record last changed
/// `age_days` ago.
async fn stored_run(
    store: &SqliteStore,
    dir: &TempDir,
    id: &str,
    status: RunStatus,
    age_days: i64,
) {
    let mut record = RunRecord::new(id, "s.rhai", "1", "c", toolscript::Mode::Sequential);
    record.started_ms -= age_days * DAY_MS;
    store.create_run(record).await.unwrap();
    if status != RunStatus::Running {
        let end = toolscript::stores::StoredEnd::new(status, None, json!({"status": status}));
        store.finish_run(id, end).await.unwrap();
    }
    sql(dir)
        .execute(
            "UPDATE runs SET updated_ms = updated_ms - ?2 WHERE run_id = ?1",
            rusqlite::params![id, age_days * DAY_MS],
        )
        .unwrap();
}

fn ids(store: &SqliteStore) -> Vec<String> {
    let conn = rusqlite::Connection::open(store.path()).unwrap();
    let mut statement = conn
        .prepare("SELECT run_id FROM runs ORDER BY run_id")
        .unwrap();
    let rows = statement.query_map([], |row| row.get(0)).unwrap();
    rows.map(Result::unwrap).collect()
}

/// Leases `id` to an owner until `expires_ms` (milliseconds since the Unix epoch): a live
/// lease when it is ahead, an expired one (its owner stalled or died) when it is behind.
fn set_lease(dir: &TempDir, id: &str, expires_ms: i64) {
    sql(dir)
        .execute(
            "UPDATE runs SET lease_owner = 'someone', lease_host = 'elsewhere', \
             lease_expires_ms = ?2 WHERE run_id = ?1",
            rusqlite::params![id, expires_ms],
        )
        .unwrap();
}

/// Now, in milliseconds since the Unix epoch.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_removes_ended_runs_and_keeps_resumable_and_live_ones_unless_asked() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    for (id, status) in [
        ("completed", RunStatus::Completed),
        ("failed", RunStatus::Failed),
        ("paused", RunStatus::Paused),
        ("interrupted", RunStatus::Interrupted),
        ("running-dead", RunStatus::Running),
        ("running-live", RunStatus::Running),
    ] {
        stored_run(&store, &dir, id, status, 40).await;
    }
    set_lease(&dir, "running-live", now_ms() + 600_000);
    set_lease(&dir, "running-dead", now_ms() - 1);

    // A dry run counts and removes nothing.
    let mut dry = PruneRule::default();
    dry.dry_run = true;
    let would = toolscript::prune(&*store, dry).await.unwrap();
    assert_eq!(would.runs, 2);
    assert_eq!(ids(&store).len(), 6);

    let pruned = toolscript::prune(&*store, PruneRule::default())
        .await
        .unwrap();
    assert_eq!(pruned.runs, 2, "{pruned:?}");
    assert_eq!(
        ids(&store),
        ["interrupted", "paused", "running-dead", "running-live"],
        "by default only completed and failed runs go"
    );

    // `--status` widens the rule; a run under a live lease stays all the same.
    let rule = PruneRule::default().statuses([
        RunStatus::Paused,
        RunStatus::Interrupted,
        RunStatus::Running,
    ]);
    let pruned = toolscript::prune(&*store, rule).await.unwrap();
    assert_eq!(pruned.runs, 3, "{pruned:?}");
    assert_eq!(pruned.kept_alive, 1);
    assert_eq!(ids(&store), ["running-live"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_by_age_keeps_what_changed_recently() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    stored_run(&store, &dir, "old", RunStatus::Completed, 40).await;
    stored_run(&store, &dir, "recent", RunStatus::Completed, 2).await;
    stored_run(&store, &dir, "old-paused", RunStatus::Paused, 400).await;
    let rule = PruneRule::default().older_than(std::time::Duration::from_secs(30 * 86_400));
    let pruned = toolscript::prune(&*store, rule).await.unwrap();
    assert_eq!(pruned.runs, 1);
    assert_eq!(ids(&store), ["old-paused", "recent"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn artifacts_stay_while_a_kept_run_refers_to_them() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    stored_run(&store, &dir, "kept", RunStatus::Paused, 1).await;
    stored_run(&store, &dir, "gone", RunStatus::Completed, 1).await;
    let put = |id: &'static str, run: &'static str| {
        let store = Arc::clone(&store);
        async move {
            let artifact = StoredArtifact::new(id.as_bytes().to_vec(), 100, "page", run);
            store.put_artifact(id, artifact).await.unwrap();
        }
    };
    let id = |c: char| -> &'static str { Box::leak(c.to_string().repeat(32).into_boxed_str()) };
    put(id('a'), "kept").await; // made by the kept run
    put(id('b'), "gone").await; // made by the pruned run only
    put(id('c'), "gone").await; // made by the pruned run first...
    put(id('c'), "kept").await; // ...and by the kept run (same bytes, one row)
    put(id('d'), "nobody").await; // of no run at all
    put(id('e'), "gone").await; // named in a kept run's script
    let mut record = RunRecord::new(
        "reader",
        "r.rhai",
        format!("ts_artifact(#{{id: \"{}\"}})", id('e')),
        "c",
        toolscript::Mode::Sequential,
    );
    record.started_ms -= DAY_MS;
    store.create_run(record).await.unwrap();
    set_lease(&dir, "reader", now_ms() - 1);

    let pruned = toolscript::prune(&*store, PruneRule::default())
        .await
        .unwrap();
    assert_eq!((pruned.runs, pruned.artifacts), (1, 2), "{pruned:?}");
    for (c, kept) in [
        ('a', true),
        ('b', false),
        ('c', true),
        ('d', false),
        ('e', true),
    ] {
        assert_eq!(
            store.artifact(id(c)).await.unwrap().is_some(),
            kept,
            "artifact {c}"
        );
    }
}

/// Completed runs with large outcomes and journals, `n` of them.
async fn fill(store: &SqliteStore, dir: &TempDir, n: usize) {
    let big = "x".repeat(200_000);
    for i in 0..n {
        let id = format!("big{i}");
        stored_run(store, dir, &id, RunStatus::Completed, 3).await;
        sql(dir)
            .execute(
                "UPDATE runs SET outcome = ?2 WHERE run_id = ?1",
                rusqlite::params![id, json!({"value": big}).to_string()],
            )
            .unwrap();
    }
}

fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_shrinks_after_a_prune_new_store_and_old_alike() {
    for old in [false, true] {
        let dir = TempDir::new().unwrap();
        let path = dir.path().join("store.sqlite3");
        {
            let store = open(&dir);
            if old {
                // A store made before version 4 has no incremental vacuum.
                sql(&dir)
                    .execute_batch("PRAGMA auto_vacuum = NONE; VACUUM;")
                    .unwrap();
            }
            stored_run(&store, &dir, "paused", RunStatus::Paused, 1).await;
            fill(&store, &dir, 10).await;
        }
        let vacuum_mode = |dir: &TempDir| -> i64 {
            sql(dir)
                .query_row("PRAGMA auto_vacuum", [], |r| r.get(0))
                .unwrap()
        };
        assert_eq!(vacuum_mode(&dir), if old { 0 } else { 2 });
        sql(&dir)
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        let before = file_size(&path);
        assert!(before > 2_000_000, "{before}");
        let store = open(&dir);
        let pruned = toolscript::prune(&*store, PruneRule::default())
            .await
            .unwrap();
        assert_eq!(pruned.runs, 10);
        let after = file_size(&path);
        assert!(
            after * 10 < before,
            "old store: {old}; {before} bytes before, {after} after ({pruned:?})"
        );
        assert_eq!(pruned.bytes_after, Some(after));
        assert_eq!(
            vacuum_mode(&dir),
            2,
            "the store gives pages back from now on"
        );
        assert_eq!(ids(&store), ["paused"]);
    }
}

// ---- The command line ----

struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
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
    Ran {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn write(dir: &TempDir, name: &str, text: &str) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_prunes_and_says_what_it_did() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("store.sqlite3");
    {
        let store = open(&dir);
        stored_run(&store, &dir, "old", RunStatus::Completed, 40).await;
        stored_run(&store, &dir, "recent", RunStatus::Failed, 1).await;
        stored_run(&store, &dir, "paused", RunStatus::Paused, 40).await;
    }
    for (bad, says) in [
        ("30x", "`30x` is not a duration"),
        ("30", "`30` has no unit"),
        ("-1d", "not a duration"),
    ] {
        let flag = format!("--older-than={bad}");
        let out = toolscript(&["prune", &flag], &path);
        assert_eq!(out.code, Some(2), "{}", out.stderr);
        assert!(
            out.stderr.contains(says) && out.stderr.contains("`30d`"),
            "{}",
            out.stderr
        );
    }
    let bad_status = toolscript(&["prune", "--status", "done"], &path);
    assert_eq!(bad_status.code, Some(2));
    assert!(
        bad_status.stderr.contains("completed"),
        "{}",
        bad_status.stderr
    );

    let dry = toolscript(&["prune", "--older-than", "30d", "--dry-run"], &path);
    assert!(
        dry.stdout.contains("would remove 1 completed/failed run"),
        "{}",
        dry.stdout
    );
    let out = toolscript(&["prune", "--older-than", "30d", "--json"], &path);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let pruned: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(pruned["runs"], 1);
    let out = toolscript(&["prune", "--status", "paused,failed"], &path);
    assert!(
        out.stdout.contains("removed 2 paused/failed runs"),
        "{}",
        out.stdout
    );
    let listed = toolscript(&["runs"], &path);
    assert!(listed.stdout.starts_with("no runs"), "{}", listed.stdout);
}

#[test]
fn prune_help_says_what_is_kept() {
    let out = Command::new(env!("CARGO_BIN_EXE_toolscript"))
        .args(["prune", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for words in [
        "only completed and failed runs",
        "never removed",
        "--older-than <DURATION>",
        "`30d`",
        "--status <STATUS>",
        "keep_days",
        "--dry-run",
    ] {
        assert!(help.contains(words), "{words}: {help}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_days_in_a_manifest_prunes_when_a_run_starts() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("store.sqlite3");
    {
        let store = open(&dir);
        stored_run(&store, &dir, "old", RunStatus::Completed, 40).await;
        stored_run(&store, &dir, "young", RunStatus::Completed, 3).await;
        stored_run(&store, &dir, "old-paused", RunStatus::Paused, 400).await;
    }
    let tool = "[[tool]]\nname = \"one\"\neffect = \"read\"\nscript = \"1\"\n";
    let manifest = write(
        &dir,
        "m.toml",
        &format!("{tool}\n[store]\nkeep_days = 30\n"),
    );
    let script = write(&dir, "s.rhai", "one(#{})");
    let m = manifest.to_str().unwrap();
    let out = toolscript(&["run", script.to_str().unwrap(), "--tools", m], &path);
    assert_eq!(out.code, Some(0), "{}", out.stderr);
    let store = open(&dir);
    let left = ids(&store);
    assert_eq!(left.len(), 3, "{left:?}");
    assert!(!left.contains(&"old".to_string()) && left.contains(&"old-paused".to_string()));

    for (bad, says) in [
        ("keep_days = 0", "from 1 to 36500, not 0"),
        ("keep_days = 2.5", "not 2.5"),
        ("keep_days = \"30d\"", "whole number of days"),
        ("keep = 3", "unknown field `keep`"),
    ] {
        let text = format!("{tool}\n[store]\n{bad}\n");
        let e = Manifests::new()
            .load_str(Path::new("m.toml"), &text)
            .unwrap_err()
            .to_string();
        assert!(e.contains(says) && e.contains("m.toml:7"), "{bad}: {e}");
    }
}

// ---- Large inputs ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_input_is_kept_as_an_artifact_and_given_back_whole_to_a_resume() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let made = Arc::new(AtomicUsize::new(0));
    let runtime = Runtime::builder(catalog(&made, Variant::Base))
        .store(Arc::clone(&store) as Arc<dyn Store>)
        .build();
    let input = json!({"rows": (0..20_000).map(|i| json!({"i": i, "s": "ab\u{e9}\""})).collect::<Vec<_>>()});
    let script = "refund(#{n: input.rows.len()}); input";
    let paused = runtime
        .run_with(script, RunOptions::default().input(input.clone()))
        .await;
    assert_eq!(paused.status(), RunStatus::Paused, "{:?}", paused.result);
    let (inline, artifact): (Option<String>, Option<String>) = sql(&dir)
        .query_row(
            "SELECT input, input_artifact FROM runs WHERE run_id = ?1",
            [&paused.run_id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert!(inline.is_none());
    let artifact = artifact.expect("the input is an artifact");
    // The list reads none of it; a resume gets it whole.
    let page = store.list_runs(RunQuery::first(5)).await.unwrap();
    assert_eq!(page.runs.len(), 1);
    let done = runtime
        .resume(
            &paused.run_id,
            Some(Decision::Approve),
            RunOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(done.status(), RunStatus::Completed, "{:?}", done.result);
    assert_eq!(done.result.unwrap(), input);
    // A small input stays in its row.
    let small = runtime
        .run_with("input", RunOptions::default().input(json!([1, 2])))
        .await;
    let inline: Option<String> = sql(&dir)
        .query_row(
            "SELECT input FROM runs WHERE run_id = ?1",
            [&small.run_id],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(inline.as_deref(), Some("[1,2]"));
    // Pruned with its run.
    let pruned = toolscript::prune(&*store, PruneRule::default())
        .await
        .unwrap();
    assert_eq!(pruned.runs, 2);
    assert!(store.artifact(&artifact).await.unwrap().is_none());
}

// ---- The list of runs ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn walking_the_cursor_lists_every_run_once_in_order() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let statuses = [
        RunStatus::Completed,
        RunStatus::Paused,
        RunStatus::Failed,
        RunStatus::Interrupted,
    ];
    let mut expected = Vec::new();
    for i in 0..103 {
        let id = format!("r{i:03}");
        let mut record = RunRecord::new(&id, "s.rhai", "1", "c", toolscript::Mode::Sequential);
        // Many runs share a start: the cursor must tell them apart.
        record.started_ms = 1_700_000_000_000 + (i / 4) as i64;
        store.create_run(record).await.unwrap();
        let status = statuses[i % 4];
        let end = toolscript::stores::StoredEnd::new(status, None, json!({}));
        store.finish_run(&id, end).await.unwrap();
        expected.push((1_700_000_000_000 + (i / 4) as i64, id, status));
    }
    expected.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for limit in [1, 7, 103, 500] {
        let mut seen = Vec::new();
        let mut query = RunQuery::first(limit);
        let mut pages = 0;
        loop {
            let page = store.list_runs(query.clone()).await.unwrap();
            assert!(page.runs.len() <= limit);
            pages += 1;
            seen.extend(page.runs.iter().map(|r| r.run_id.clone()));
            match page.next {
                Some(next) => query = query.after(Some(next)),
                None => break,
            }
        }
        let want: Vec<String> = expected.iter().map(|e| e.1.clone()).collect();
        assert_eq!(seen, want, "limit {limit}");
        assert_eq!(pages, 103usize.div_ceil(limit).max(1), "limit {limit}");
    }
    let mut seen = Vec::new();
    let mut query = RunQuery::first(4).statuses([RunStatus::Paused, RunStatus::Interrupted]);
    loop {
        let page = store.list_runs(query.clone()).await.unwrap();
        seen.extend(page.runs.iter().map(|r| (r.run_id.clone(), r.status)));
        match page.next {
            Some(next) => query = query.after(Some(next)),
            None => break,
        }
    }
    let want: Vec<_> = expected
        .iter()
        .filter(|e| matches!(e.2, RunStatus::Paused | RunStatus::Interrupted))
        .map(|e| (e.1.clone(), e.2))
        .collect();
    assert_eq!(seen, want);
    for bad in ["", "nodot", "x.r001", "12."] {
        let e = store
            .list_runs(RunQuery::first(3).after(Some(bad.to_string())))
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("cursor"), "{bad}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_line_lists_a_page_with_a_cursor_and_a_filter() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("store.sqlite3");
    {
        let store = open(&dir);
        for i in 0..5 {
            let status = if i % 2 == 0 {
                RunStatus::Paused
            } else {
                RunStatus::Completed
            };
            stored_run(&store, &dir, &format!("run{i}"), status, 10 - i).await;
        }
    }
    let first = toolscript(&["runs", "--json", "--limit", "2"], &path);
    let runs: Value = serde_json::from_str(first.stdout.trim()).unwrap();
    assert_eq!(runs.as_array().unwrap().len(), 2);
    assert_eq!(runs[0]["run_id"], "run4");
    let cursor = first
        .stderr
        .split("--after ")
        .nth(1)
        .expect("the next page's cursor")
        .trim()
        .to_string();
    let second = toolscript(
        &["runs", "--json", "--limit", "2", "--after", &cursor],
        &path,
    );
    let runs: Value = serde_json::from_str(second.stdout.trim()).unwrap();
    assert_eq!(runs[0]["run_id"], "run2");
    let paused = toolscript(&["runs", "--status", "paused"], &path);
    assert_eq!(paused.stdout.lines().count(), 4, "{}", paused.stdout);
    assert!(!paused.stdout.contains("completed"));
    let bad = toolscript(&["runs", "--limit", "0"], &path);
    assert_eq!(bad.code, Some(2));
    let bad = toolscript(&["runs", "--after", "nonsense"], &path);
    assert_ne!(bad.code, Some(0));
    assert!(bad.stderr.contains("cursor"), "{}", bad.stderr);
}

// ---- The catalog a paused run resumes under ----

/// What differs from the base catalog.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Variant {
    Base,
    Description,
    NoApproval,
    Effect,
    Schema,
    Version,
    Added,
}

fn catalog(made: &Arc<AtomicUsize>, variant: Variant) -> Registry {
    let made = Arc::clone(made);
    let mut refund = Tool::builder(
        "refund",
        if variant == Variant::Effect {
            Effect::External
        } else {
            Effect::Write
        },
    )
    .description(if variant == Variant::Description {
        "Refunds an order (text the server updated)."
    } else {
        "Refunds an order."
    })
    .input_schema(if variant == Variant::Schema {
        json!({"type": "object", "required": ["n", "reason"]})
    } else {
        json!({"type": "object", "description": if variant == Variant::Description { "new words" } else { "words" }})
    })
    .version(if variant == Variant::Version { "2" } else { "1" });
    if variant != Variant::NoApproval {
        refund = refund.approval(Approval::Always);
    }
    let refund = refund.handler(move |args| {
        let made = Arc::clone(&made);
        async move {
            made.fetch_add(1, Ordering::SeqCst);
            Ok(json!({"done": args}))
        }
    });
    let lookup = Tool::builder("lookup", Effect::Read).handler(|args| async move { Ok(args) });
    let mut tools = vec![lookup, refund];
    if variant == Variant::Added {
        tools.push(Tool::builder("extra", Effect::Read).handler(|_| async { Ok(json!(0)) }));
    }
    Registry::builder().tools(tools).build().unwrap()
}

fn runtime_of(store: &Arc<SqliteStore>, made: &Arc<AtomicUsize>, variant: Variant) -> Runtime {
    Runtime::builder(catalog(made, variant))
        .store(Arc::clone(store) as Arc<dyn Store>)
        .build()
}

fn resume_error(e: Error) -> String {
    match e {
        Error::Resume { message, .. } => message,
        other => panic!("expected a resume error, got {other}"),
    }
}

const REFUND: &str = "let a = lookup(#{n: 1}); refund(#{n: a.n}).done.n + 1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prose_may_change_under_a_paused_run_and_behaviour_may_not() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let made = Arc::new(AtomicUsize::new(0));
    let base = runtime_of(&store, &made, Variant::Base);
    for (variant, says) in [
        (
            Variant::NoApproval,
            "`refund`: its approval (always → never) changed",
        ),
        (
            Variant::Effect,
            "`refund`: its effect (write → external) changed",
        ),
        (Variant::Schema, "`refund`: its input schema changed"),
        (Variant::Version, "`refund`: its version (1 → 2) changed"),
    ] {
        let paused = base.run(REFUND).await;
        assert_eq!(paused.status(), RunStatus::Paused, "{:?}", paused.result);
        let other = runtime_of(&store, &made, variant);
        let e = resume_error(
            other
                .resume(
                    &paused.run_id,
                    Some(Decision::Approve),
                    RunOptions::default(),
                )
                .await
                .unwrap_err(),
        );
        assert!(
            e.contains(says) && e.contains("same --tools"),
            "{variant:?}: {e}"
        );
        // Refused without a trace: the run still waits, under its catalog.
        let record = store.run(&paused.run_id).await.unwrap().unwrap();
        assert_eq!(record.status, RunStatus::Paused);
    }
    assert_eq!(
        made.load(Ordering::SeqCst),
        0,
        "no refused run made its call"
    );

    // A description that changed (an MCP server rewording its tools), or a tool added: the
    // run resumes.
    for variant in [Variant::Description, Variant::Added] {
        let paused = base.run(REFUND).await;
        let other = runtime_of(&store, &made, variant);
        let done = other
            .resume(
                &paused.run_id,
                Some(Decision::Approve),
                RunOptions::default(),
            )
            .await
            .unwrap();
        assert_eq!(
            done.status(),
            RunStatus::Completed,
            "{variant:?}: {:?}",
            done.result
        );
        assert_eq!(done.result.unwrap(), json!(2));
    }
    assert_eq!(made.load(Ordering::SeqCst), 2);
}

/// A run stored with only the whole catalog's hash (as before fingerprints) is judged by that
/// rule once: it resumes under the very catalog it started with, is refused under another
/// (even one that changed in prose only), and once resumed it carries fingerprints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_stored_with_the_old_whole_catalog_hash_is_judged_by_it_once() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let made = Arc::new(AtomicUsize::new(0));
    let base = runtime_of(&store, &made, Variant::Base);
    let mut paused = Vec::new();
    for _ in 0..2 {
        let run = base.run(REFUND).await;
        assert_eq!(run.status(), RunStatus::Paused);
        // As the previous version stored it: no fingerprints.
        sql(&dir)
            .execute(
                "UPDATE runs SET catalog = NULL WHERE run_id = ?1",
                [&run.run_id],
            )
            .unwrap();
        paused.push(run.run_id);
    }
    let reworded = runtime_of(&store, &made, Variant::Description);
    let e = resume_error(
        reworded
            .resume(&paused[0], Some(Decision::Approve), RunOptions::default())
            .await
            .unwrap_err(),
    );
    assert!(
        e.contains("earlier toolscript") && e.contains("whole catalog"),
        "{e}"
    );
    let done = base
        .resume(&paused[0], Some(Decision::Approve), RunOptions::default())
        .await
        .unwrap();
    assert_eq!(done.status(), RunStatus::Completed, "{:?}", done.result);
    assert_eq!(made.load(Ordering::SeqCst), 1);

    // Resumed without a decision it pauses again at its call; from then on it is judged by
    // fingerprints, so a reworded catalog takes it.
    let again = base.resume(&paused[1], None, RunOptions::default()).await;
    assert!(again.is_err(), "a paused run needs a decision");
    let record = store.run(&paused[1]).await.unwrap().unwrap();
    assert!(record.catalog.is_none(), "a refused resume changes nothing");
    let mut conn = sql(&dir);
    let tx = conn.transaction().unwrap();
    tx.execute(
        "UPDATE runs SET status = 'interrupted', pending = NULL WHERE run_id = ?1",
        [&paused[1]],
    )
    .unwrap();
    tx.commit().unwrap();
    let repaused = base
        .resume(&paused[1], None, RunOptions::default())
        .await
        .unwrap();
    assert_eq!(repaused.status(), RunStatus::Paused);
    let record = store.run(&paused[1]).await.unwrap().unwrap();
    assert!(
        record.catalog.is_some(),
        "the resume stamped its fingerprints"
    );
    let done = reworded
        .resume(&paused[1], Some(Decision::Approve), RunOptions::default())
        .await
        .unwrap();
    assert_eq!(done.status(), RunStatus::Completed, "{:?}", done.result);
}

/// A script tool's body and an MCP server's command are part of the catalog; the tools'
/// descriptions are not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_script_body_refuses_a_paused_run_and_a_changed_description_does_not() {
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let manifest = |body: &str, description: &str| {
        format!(
            "[[tool]]\nname = \"pay\"\neffect = \"write\"\napproval = \"always\"\n\
             description = \"{description}\"\nscript = \"{body}\"\n"
        )
    };
    let runtime = |text: &str| {
        let mut manifests = Manifests::new();
        manifests.load_str(Path::new("m.toml"), text).unwrap();
        Runtime::builder(manifests.into_registry().unwrap())
            .store(Arc::clone(&store) as Arc<dyn Store>)
            .build()
    };
    let base = runtime(&manifest("args.n * 2", "Pays."));
    let paused = base.run("pay(#{n: 4})").await;
    assert_eq!(paused.status(), RunStatus::Paused);
    let e = resume_error(
        runtime(&manifest("args.n * 3", "Pays."))
            .resume(
                &paused.run_id,
                Some(Decision::Approve),
                RunOptions::default(),
            )
            .await
            .unwrap_err(),
    );
    assert!(e.contains("`pay`: its script body changed"), "{e}");
    let done = runtime(&manifest("args.n * 2", "Pays money."))
        .resume(
            &paused.run_id,
            Some(Decision::Approve),
            RunOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(done.result.unwrap(), json!(8));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_mcp_command_refuses_a_paused_run_and_reworded_tools_do_not() {
    if !crate::support::node_available() {
        eprintln!("skipped: Node.js is not installed");
        return;
    }
    let dir = TempDir::new().unwrap();
    let store = open(&dir);
    let server = |name: &str, description: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, MCP_SERVER.replace("DESCRIPTION", description)).unwrap();
        path
    };
    let first = server("server.js", "Charges a card.");
    let copy = server("copy.js", "Charges a card.");
    let manifest = |path: &Path| {
        format!(
            "[[mcp]]\nname = \"pay\"\ncommand = [\"node\", {}]\napproval = {{ charge = \"always\" }}\n",
            serde_json::to_string(&path.to_string_lossy()).unwrap()
        )
    };
    let runtime = |text: String| {
        let store = Arc::clone(&store);
        async move {
            let mut manifests = Manifests::new();
            manifests
                .load_str(&std::env::temp_dir().join("m.toml"), &text)
                .unwrap();
            Runtime::builder(manifests.build().await.unwrap())
                .store(store as Arc<dyn Store>)
                .build()
        }
    };
    let base = runtime(manifest(&first)).await;
    let paused = base.run("charge(#{amount: 5})").await;
    assert_eq!(paused.status(), RunStatus::Paused, "{:?}", paused.result);
    let moved = runtime(manifest(&copy)).await;
    let e = resume_error(
        moved
            .resume(
                &paused.run_id,
                Some(Decision::Approve),
                RunOptions::default(),
            )
            .await
            .unwrap_err(),
    );
    assert!(
        e.contains("`charge`: its MCP server's command changed"),
        "{e}"
    );
    // The server rewords its tool: same command, new text.
    server("server.js", "Charges a card, in cents.");
    let reworded = runtime(manifest(&first)).await;
    let done = reworded
        .resume(
            &paused.run_id,
            Some(Decision::Approve),
            RunOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(done.status(), RunStatus::Completed, "{:?}", done.result);
    assert_eq!(done.result.unwrap(), json!({"charged": 5}));
}

/// A minimal MCP server over stdio: one tool, `charge`, whose description is DESCRIPTION.
const MCP_SERVER: &str = r#"
const readline = require("readline");
const rl = readline.createInterface({ input: process.stdin });
const send = (m) => process.stdout.write(JSON.stringify(m) + "\n");
rl.on("line", (line) => {
  const m = JSON.parse(line);
  if (m.id === undefined) return;
  if (m.method === "initialize") {
    send({ jsonrpc: "2.0", id: m.id, result: { protocolVersion: "2025-06-18",
      capabilities: { tools: {} }, serverInfo: { name: "pay", version: "1" } } });
  } else if (m.method === "tools/list") {
    send({ jsonrpc: "2.0", id: m.id, result: { tools: [{ name: "charge",
      description: "DESCRIPTION", inputSchema: { type: "object", description: "DESCRIPTION" },
      annotations: { readOnlyHint: false, destructiveHint: true } }] } });
  } else if (m.method === "tools/call") {
    const r = { charged: m.params.arguments.amount };
    send({ jsonrpc: "2.0", id: m.id, result: { content: [{ type: "text", text: JSON.stringify(r) }],
      structuredContent: r } });
  } else {
    send({ jsonrpc: "2.0", id: m.id, error: { code: -32601, message: "no such method" } });
  }
}).on("close", () => process.exit(0));
"#;

// ---- `list_runs` over MCP ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_runs_pages_by_cursor_within_a_token_bound() {
    use rmcp::model::CallToolRequestParams;
    use toolscript::{Awaiting, PendingCall};
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("store.sqlite3");
    let total = 260;
    {
        let store = open(&dir);
        for i in 0..total {
            let id = format!("{i:016x}");
            let mut record =
                RunRecord::new(&id, "refund.rhai", "1", "c", toolscript::Mode::Speculative);
            record.started_ms = 1_764_000_000_000 + (i / 3) as i64 * 1000;
            store.create_run(record).await.unwrap();
            let (status, pending) = if i % 2 == 0 {
                // One paused run waits at a call whose arguments are huge.
                let args = if i == 100 {
                    json!({"note": "word ".repeat(20_000)})
                } else {
                    json!({"order_id": i, "amount": 12.5})
                };
                let call = PendingCall::new(0, "refund", Effect::Write, args, Awaiting::Approval);
                (RunStatus::Paused, Some(call))
            } else {
                (RunStatus::Completed, None)
            };
            let end = toolscript::stores::StoredEnd::new(status, pending, json!({}));
            store.finish_run(&id, end).await.unwrap();
        }
    }
    let client = crate::mcp_server::serve_session(&[], &path).await;
    let call = |args: Value| {
        let args = args.as_object().unwrap().clone();
        client.call_tool(CallToolRequestParams::new("list_runs").with_arguments(args))
    };
    let tokens = |value: &Value| {
        tiktoken_rs::o200k_base_singleton()
            .encode_ordinary(&value.to_string())
            .len()
    };
    let walk = |first: Value| async {
        let mut seen = Vec::new();
        let mut pages = Vec::new();
        let mut args = first;
        loop {
            let result = call(args.clone()).await.expect("list_runs answers");
            assert_ne!(result.is_error, Some(true), "{result:?}");
            let answer = result.structured_content.clone().expect("structured");
            pages.push(answer.clone());
            seen.extend(answer["runs"].as_array().unwrap().iter().map(|r| {
                (
                    r["run_id"].as_str().unwrap().to_string(),
                    r["status"].clone(),
                )
            }));
            match answer["next_cursor"].as_str() {
                Some(cursor) => args["cursor"] = json!(cursor),
                None => break,
            }
        }
        (seen, pages)
    };
    let (seen, pages) = walk(json!({})).await;
    let mut ids: Vec<&String> = seen.iter().map(|s| &s.0).collect();
    assert_eq!(ids.len(), total, "every run once");
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), total, "no run twice");
    let biggest = pages.iter().map(tokens).max().unwrap();
    assert!(biggest <= 8000, "a page of {biggest} tokens");
    assert_eq!(
        pages[0]["runs"].as_array().unwrap().len(),
        50,
        "the default page"
    );
    eprintln!(
        "list_runs: {} pages for {total} runs; the first (50 runs) {} tokens, the largest {biggest}",
        pages.len(),
        tokens(&pages[0])
    );
    let huge = pages
        .iter()
        .flat_map(|p| p["runs"].as_array().unwrap().clone())
        .find(|r| r["run_id"] == format!("{:016x}", 100))
        .unwrap();
    assert!(
        huge["pending"]["args"]
            .as_str()
            .is_some_and(|s| s.starts_with("(left out:")),
        "{huge}"
    );

    let (paused, _) = walk(json!({"status": ["paused"], "limit": 7})).await;
    assert_eq!(paused.len(), total / 2);
    assert!(paused.iter().all(|(_, s)| s == "paused"));

    let bad = call(json!({"cursor": "not-a-cursor"})).await.unwrap();
    assert_eq!(bad.is_error, Some(true));
    let text = format!("{:?}", bad.content);
    assert!(text.contains("cursor"), "{text}");
    for args in [
        json!({"limit": 0}),
        json!({"limit": 201}),
        json!({"status": ["done"]}),
    ] {
        let bad = call(args.clone()).await.unwrap();
        assert_eq!(bad.is_error, Some(true), "{args}");
    }
    client.cancel().await.unwrap();
}
