//! Durable runs at their edges: decisions racing each other over a busy store, a run whose
//! future is dropped mid-call or while it is recorded, a composite that a resume would make
//! again, another program's SQLite file given as the store, a read-only store, a run id of a
//! megabyte, a decision given to a run that is still running.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tempfile::TempDir;
use toolscript::stores::{
    Claim, Fence, JournalRows, Renewed, StoreFuture, StoredEnd, TakeDecision, TakeRefused,
};
use toolscript::{
    Approval, CatalogPrint, Decision, Effect, Error, ErrorKind, PruneRule, Pruned, Registry,
    RunOptions, RunPage, RunQuery, RunRecord, RunStatus, Runtime, SqliteStore, Store,
    StoredArtifact, Tool, ToolError,
};

use crate::support::the_run_once_ended;

/// The calls whose bodies ran, as `tool:n`.
type Made = Arc<Mutex<Vec<String>>>;

/// Two writes that need approval, and a read; every body that runs is written down in `made`.
fn approvals(made: &Made) -> Registry {
    let write = |name: &'static str| {
        let made = Arc::clone(made);
        Tool::builder(name, Effect::Write)
            .approval(Approval::Always)
            .handler(move |args| {
                made.lock().unwrap().push(format!("{name}:{}", args["n"]));
                async move { Ok(json!({"done": args})) }
            })
    };
    let lookup = Tool::builder("lookup", Effect::Read).handler(|args| async move { Ok(args) });
    Registry::builder()
        .tools([lookup, write("refund"), write("notify")])
        .build()
        .unwrap()
}

/// A runtime on its own connection to the store at `path`.
fn on_store(path: &Path, registry: Registry) -> Runtime {
    let store = SqliteStore::open(path).unwrap();
    Runtime::builder(registry).store(Arc::new(store)).build()
}

/// The journal's row of the non-read call `seq`: `(intent, outcome)`, read past the library.
fn journal_row(path: &Path, run_id: &str, seq: i64) -> Option<(bool, Option<Value>)> {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.busy_timeout(Duration::from_secs(30)).unwrap();
    let row = conn.query_row(
        "SELECT intent, outcome FROM writes WHERE run_id = ?1 AND seq = ?2",
        rusqlite::params![run_id, seq],
        |row| Ok((row.get::<_, bool>(0)?, row.get::<_, Option<String>>(1)?)),
    );
    match row {
        Ok((intent, outcome)) => Some((
            intent,
            outcome.map(|text| serde_json::from_str(&text).unwrap()),
        )),
        Err(rusqlite::Error::QueryReturnedNoRows) => None,
        Err(e) => panic!("{e}"),
    }
}

/// Keeps the store busy from another connection: short write transactions, one after the
/// other, until dropped.
struct Busy {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Busy {
    fn start(path: &Path, seed: u64) -> Busy {
        let (stop, path) = (Arc::new(AtomicBool::new(false)), path.to_path_buf());
        let stopping = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let conn = rusqlite::Connection::open(&path).unwrap();
            conn.busy_timeout(Duration::from_secs(30)).unwrap();
            let mut rng = seed | 1;
            while !stopping.load(Ordering::SeqCst) {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                conn.execute_batch("BEGIN IMMEDIATE").unwrap();
                std::thread::sleep(Duration::from_micros(rng % 4000));
                conn.execute_batch("COMMIT").unwrap();
                std::thread::sleep(Duration::from_micros(rng % 1000));
            }
        });
        Busy {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Two approvals and a rejection of the same paused call, started together on three
/// connections while another keeps the store busy: in every trial exactly one decision is
/// taken, the others are refused (the run moved on, is still running, or has ended), and the
/// journal says what was made: the approved call made once and nothing else, or nothing made
/// and the call rejected. No decision ever reaches the run's next call.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_decisions_one_wins_and_the_journal_agrees_with_what_was_made() {
    let trials = 30;
    let mut refusals = std::collections::BTreeMap::<String, usize>::new();
    for trial in 0..trials {
        let dir = TempDir::new().unwrap();
        let path = dir.path().join("store.sqlite3");
        let made: Made = Arc::default();
        let first = on_store(&path, approvals(&made));
        let paused = first
            .run("let a = refund(#{n: 1}); let b = notify(#{n: 2}); [a.done.n, b.done.n]")
            .await;
        assert_eq!(paused.status(), RunStatus::Paused);
        let id = paused.run_id.clone();
        let deciders: Vec<(Runtime, Decision)> = vec![
            (on_store(&path, approvals(&made)), Decision::Approve),
            (
                on_store(&path, approvals(&made)),
                Decision::Reject {
                    reason: Some("no".into()),
                },
            ),
            (on_store(&path, approvals(&made)), Decision::Approve),
        ];
        let busy = Busy::start(&path, trial + 1);
        let decided = futures::future::join_all(deciders.iter().map(|(runtime, decision)| {
            runtime.resume(&id, Some(decision.clone()), RunOptions::default())
        }))
        .await;
        drop(busy);
        let mut accepted = Vec::new();
        for ((_, decision), result) in deciders.iter().zip(decided) {
            match result {
                Ok(outcome) => accepted.push((decision.clone(), outcome)),
                Err(Error::Resume { message, .. }) => {
                    let kind = message
                        .split([';', ',', ':'])
                        .next()
                        .unwrap_or("")
                        .to_string();
                    *refusals.entry(kind).or_default() += 1;
                }
                Err(other) => panic!("trial {trial}: {other}"),
            }
        }
        let made = made.lock().unwrap().clone();
        assert_eq!(
            accepted.len(),
            1,
            "trial {trial}: exactly one decision is taken; made {made:?}, accepted {:?}",
            accepted
                .iter()
                .map(|(d, o)| (d, o.status(), o.pending.clone()))
                .collect::<Vec<_>>()
        );
        let (decision, outcome) = &accepted[0];
        let row = journal_row(&path, &id, 0).expect("the decided call is journaled");
        match decision {
            Decision::Approve => {
                assert_eq!(made, ["refund:1"], "trial {trial}");
                assert_eq!(outcome.status(), RunStatus::Paused, "trial {trial}");
                assert_eq!(outcome.pending.as_ref().unwrap().seq, 1, "trial {trial}");
                assert!(
                    row.0 && row.1.as_ref().unwrap().get("ok").is_some(),
                    "trial {trial}: {row:?}"
                );
            }
            _ => {
                assert!(
                    made.is_empty(),
                    "trial {trial}: a rejected call is never made: {made:?}"
                );
                let error = &row.1.as_ref().unwrap()["error"];
                assert_eq!(error["kind"], "rejected", "trial {trial}: {row:?}");
                assert!(!row.0, "trial {trial}: {row:?}");
            }
        }
        assert_eq!(
            journal_row(&path, &id, 1),
            None,
            "trial {trial}: no decision reached the next call"
        );
    }
    eprintln!(
        "racing decisions: {trials} trials, one decision taken in each; refusals: {refusals:?}"
    );
}

/// A durable run whose future is dropped while a write's body runs (its caller went away):
/// the write ends and its outcome is journaled, the store records the run as `interrupted`
/// (not `running`, owned by a live process, for ever), and a resume finishes it with each
/// write made once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_run_future_leaves_the_run_interrupted_and_resumable() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("store.sqlite3");
    let made: Made = Arc::default();
    let started = Arc::new(tokio::sync::Notify::new());
    let put = {
        let (made, started) = (Arc::clone(&made), Arc::clone(&started));
        Tool::builder("put", Effect::Write).handler(move |args| {
            let (made, started) = (Arc::clone(&made), Arc::clone(&started));
            async move {
                started.notify_one();
                tokio::time::sleep(Duration::from_millis(100)).await;
                made.lock().unwrap().push(format!("put:{}", args["n"]));
                Ok(args)
            }
        })
    };
    let runtime = on_store(&path, Registry::builder().tool(put).build().unwrap());
    let script = "let a = put(#{n: 1}); let b = put(#{n: 2}); [a.n, b.n]";
    {
        let run = runtime.run(script);
        tokio::pin!(run);
        tokio::select! {
            outcome = &mut run => panic!("the run ended before its first write began: {:?}", outcome.result),
            () = started.notified() => {}
        }
        // The run's future is dropped here, mid-call.
    }
    let store = runtime.store().unwrap();
    let (id, status) = the_run_once_ended(store.as_ref()).await;
    assert_eq!(status.as_str(), "interrupted");
    assert_eq!(
        made.lock().unwrap().clone(),
        ["put:1"],
        "the call under way ended"
    );
    let done = runtime
        .resume(&id, None, RunOptions::default())
        .await
        .unwrap();
    assert_eq!(done.result.unwrap(), json!([1, 2]));
    assert_eq!(
        made.lock().unwrap().clone(),
        ["put:1", "put:2"],
        "each write made once: the first answered by the journal"
    );
}

/// A durable run dropped while a write's body runs, the body honouring the cancellation (it
/// stops and says `cancelled`, or that its outcome is unknown): that answer is the run's end,
/// not the tool's. It is not journaled as the call's outcome — a resume would replay it as an
/// error the script never met — so the resume asks whether the call took effect, and a retry
/// makes each write once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_cut_short_by_a_dropped_run_is_asked_about_not_replayed_as_an_error() {
    for kind in [ErrorKind::Cancelled, ErrorKind::AmbiguousOutcome] {
        let dir = TempDir::new().unwrap();
        let path = dir.path().join("store.sqlite3");
        let made: Made = Arc::default();
        let started = Arc::new(tokio::sync::Notify::new());
        let put = {
            let (made, started) = (Arc::clone(&made), Arc::clone(&started));
            Tool::builder("put", Effect::Write).composite(move |args, ctx| {
                let (made, started) = (Arc::clone(&made), Arc::clone(&started));
                async move {
                    started.notify_one();
                    tokio::select! {
                        () = ctx.cancelled() => Err(ToolError::new(kind, "stopped: the run went away")),
                        () = tokio::time::sleep(Duration::from_millis(200)) => {
                            made.lock().unwrap().push(format!("put:{}", args["n"]));
                            Ok(args)
                        }
                    }
                }
            })
        };
        let runtime = on_store(&path, Registry::builder().tool(put).build().unwrap());
        let script = "let a = put(#{n: 1}); let b = put(#{n: 2}); [a.n, b.n]";
        {
            let run = runtime.run(script);
            tokio::pin!(run);
            tokio::select! {
                outcome = &mut run => panic!("the run ended before its first write began: {:?}", outcome.result),
                () = started.notified() => {}
            }
        }
        let store = runtime.store().unwrap();
        let id = store.list_runs(RunQuery::first(1)).await.unwrap().runs[0]
            .run_id
            .clone();
        let mut status = RunStatus::Running;
        for _ in 0..6000 {
            status = store.run(&id).await.unwrap().unwrap().status;
            if status != RunStatus::Running {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(status.as_str(), "interrupted", "{kind:?}");
        assert_eq!(
            journal_row(&path, &id, 0),
            Some((true, None)),
            "{kind:?}: the intent is open, no outcome journaled"
        );
        let asked = runtime
            .resume(&id, None, RunOptions::default())
            .await
            .unwrap();
        let pending = asked.pending.as_ref().expect("the resume asks");
        assert_eq!(pending.awaiting.as_str(), "resolve", "{kind:?}");
        let done = runtime
            .resume(&id, Some(Decision::Retry), RunOptions::default())
            .await
            .unwrap();
        assert_eq!(done.result.unwrap(), json!([1, 2]), "{kind:?}");
        assert_eq!(
            made.lock().unwrap().clone(),
            ["put:1", "put:2"],
            "{kind:?}: each write made once"
        );
    }
}

/// A store that holds the first `create_run` or `load_journal` (`at`) once the inner store has
/// done it, until `open` is notified: a run's future can be dropped just after the store took
/// the run as `running` under this process's lease, and before the run started.
#[derive(Debug)]
struct Held {
    inner: SqliteStore,
    at: &'static str,
    armed: AtomicBool,
    reached: tokio::sync::Notify,
    open: tokio::sync::Notify,
}

impl Held {
    /// `done`, then, the first time `call` is `at`, a wait until `open`.
    fn hold<'a, T: Send + 'a>(
        &'a self,
        call: &'static str,
        done: StoreFuture<'a, T>,
    ) -> StoreFuture<'a, T> {
        Box::pin(async move {
            let out = done.await;
            if call == self.at && self.armed.swap(false, Ordering::SeqCst) {
                self.reached.notify_one();
                self.open.notified().await;
            }
            out
        })
    }
}

impl Store for Held {
    fn location(&self) -> String {
        self.inner.location()
    }
    fn create_run(&self, record: RunRecord) -> StoreFuture<'_, ()> {
        self.hold("create_run", self.inner.create_run(record))
    }
    fn run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<RunRecord>> {
        self.inner.run(run_id)
    }
    fn list_runs(&self, query: RunQuery) -> StoreFuture<'_, RunPage> {
        self.inner.list_runs(query)
    }
    fn prune(&self, rule: PruneRule) -> StoreFuture<'_, Pruned> {
        self.inner.prune(rule)
    }
    fn renew_lease<'a>(&'a self, run_id: &'a str, fence: &'a Fence) -> StoreFuture<'a, Renewed> {
        self.inner.renew_lease(run_id, fence)
    }
    fn set_catalog<'a>(
        &'a self,
        run_id: &'a str,
        catalog_sha256: String,
        catalog: CatalogPrint,
    ) -> StoreFuture<'a, ()> {
        self.inner.set_catalog(run_id, catalog_sha256, catalog)
    }
    fn take_run<'a>(
        &'a self,
        run_id: &'a str,
        claim: Claim,
        decision: Option<TakeDecision>,
    ) -> StoreFuture<'a, Result<RunRecord, TakeRefused>> {
        self.inner.take_run(run_id, claim, decision)
    }
    fn finish_run<'a>(&'a self, run_id: &'a str, end: StoredEnd) -> StoreFuture<'a, ()> {
        self.inner.finish_run(run_id, end)
    }
    fn load_journal<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, JournalRows> {
        self.hold("load_journal", self.inner.load_journal(run_id))
    }
    fn append<'a>(&'a self, run_id: &'a str, rows: JournalRows) -> StoreFuture<'a, ()> {
        self.inner.append(run_id, rows)
    }
    fn put_artifact<'a>(&'a self, id: &'a str, artifact: StoredArtifact) -> StoreFuture<'a, ()> {
        self.inner.put_artifact(id, artifact)
    }
    fn artifact<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<StoredArtifact>> {
        self.inner.artifact(id)
    }
}

/// A durable run whose future is dropped after the store took it as `running` under this
/// process's lease and before its script started (a client that hung up while the run was
/// being recorded, or its journal opened): the store records it as `interrupted`, not
/// `running` under a lease no one renews, and a resume makes its write once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_dropped_while_it_is_recorded_is_left_interrupted_not_running() {
    for at in ["create_run", "load_journal"] {
        let dir = TempDir::new().unwrap();
        let made: Made = Arc::default();
        let put = {
            let made = Arc::clone(&made);
            Tool::builder("put", Effect::Write).handler(move |args| {
                made.lock().unwrap().push(format!("put:{}", args["n"]));
                async move { Ok(args) }
            })
        };
        let store = Arc::new(Held {
            inner: SqliteStore::open(&dir.path().join("store.sqlite3")).unwrap(),
            at,
            armed: AtomicBool::new(true),
            reached: tokio::sync::Notify::new(),
            open: tokio::sync::Notify::new(),
        });
        let registry = Registry::builder().tool(put).build().unwrap();
        let runtime = Runtime::builder(registry).store(store.clone()).build();
        {
            let run = runtime.run("put(#{n: 1}).n");
            tokio::pin!(run);
            tokio::select! {
                outcome = &mut run => panic!("{at}: the run ended before it was held: {:?}", outcome.result),
                () = store.reached.notified() => {}
            }
            // The run's future is dropped here: the store holds it as running.
        }
        store.open.notify_one();
        let (id, status) = the_run_once_ended(store.as_ref()).await;
        assert_eq!(status.as_str(), "interrupted", "{at}");
        assert!(made.lock().unwrap().is_empty(), "{at}: nothing was made");
        let done = runtime
            .resume(&id, None, RunOptions::default())
            .await
            .unwrap();
        assert_eq!(done.result.unwrap(), json!(1), "{at}");
        assert_eq!(made.lock().unwrap().clone(), ["put:1"], "{at}");
    }
}

/// A decision given to a run that is still running, in this process: refused, saying it is
/// still running, who holds it and until when (not that its process stopped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_on_a_live_run_says_it_is_still_running() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("store.sqlite3");
    let (started, release) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    let hold = {
        let (started, release) = (Arc::clone(&started), Arc::clone(&release));
        Tool::builder("hold", Effect::Write).handler(move |_| {
            let (started, release) = (Arc::clone(&started), Arc::clone(&release));
            async move {
                started.notify_one();
                release.notified().await;
                Ok(json!(1))
            }
        })
    };
    let registry = || Registry::builder().tool(hold.clone()).build().unwrap();
    let runtime = on_store(&path, registry());
    let other = on_store(&path, registry());
    let run = runtime.run("hold(#{})");
    tokio::pin!(run);
    tokio::select! {
        _ = &mut run => panic!("the run ended before its write began"),
        () = started.notified() => {}
    }
    let id = runtime
        .store()
        .unwrap()
        .list_runs(RunQuery::first(1))
        .await
        .unwrap()
        .runs[0]
        .run_id
        .clone();
    let refused = other
        .resume(&id, Some(Decision::Approve), RunOptions::default())
        .await
        .unwrap_err()
        .to_string();
    let (owner, token) = {
        let record = other.store().unwrap().run(&id).await.unwrap().unwrap();
        let lease = record.lease.expect("a running run has a lease");
        (lease.holder(), lease.token)
    };
    assert!(
        refused.contains(&format!(
            "still running, held by {owner} (fencing token {token})"
        )),
        "{refused}"
    );
    assert!(
        refused.contains("under a lease that expires at"),
        "{refused}"
    );
    release.notify_one();
    assert_eq!(run.await.status(), RunStatus::Completed);
}

/// A run id of a megabyte is cut in the errors that name it, from the library and from the
/// command line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_run_id_is_cut_in_errors() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("store.sqlite3");
    let runtime = on_store(&path, approvals(&Made::default()));
    let id = "r".repeat(1 << 20);
    let e = runtime
        .resume(&id, Some(Decision::Approve), RunOptions::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.len() < 400 && e.contains("no such run"),
        "{} bytes: {}",
        e.len(),
        &e[..200]
    );
    assert!(e.contains("1048576 bytes"), "{e}");
    // The command line: an argument is at most 128 KiB.
    let id = "r".repeat(100_000);
    let out = toolscript(&["resume", &id, "--approve"], &path, None);
    assert_eq!(out.code, Some(2));
    assert!(
        out.stderr.len() < 400 && out.stderr.contains("no such run"),
        "{} bytes",
        out.stderr.len()
    );
}

/// An idempotent composite nesting a write is refused when the registry is built, naming both
/// tools (in a manifest, with the file and line): a resume makes an idempotent call whose
/// outcome was lost again, without asking, and would make the nested write twice. Nesting
/// reads and idempotent tools is allowed; a write composite nesting writes stays as it is
/// (never made again without a person's word).
#[test]
fn an_idempotent_composite_may_not_nest_a_write() {
    let leaf = |name: &str, effect| Tool::builder(name, effect).handler(|_| async { Ok(json!(1)) });
    let composite = |effect, nested: [&str; 2]| {
        Tool::builder("both", effect)
            .nested(nested)
            .composite(|_, _| async { Ok(json!(1)) })
    };
    let tools = |c: Tool| {
        vec![
            leaf("get", Effect::Read),
            leaf("put", Effect::Write),
            leaf("send", Effect::External),
            leaf("tag", Effect::Idempotent),
            c,
        ]
    };
    for nested in ["put", "send"] {
        let e = Registry::builder()
            .tools(tools(composite(Effect::Idempotent, ["get", nested])))
            .build()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`both`") && e.contains(&format!("`{nested}`")) && e.contains("idempotent"),
            "{e}"
        );
    }
    Registry::builder()
        .tools(tools(composite(Effect::Idempotent, ["get", "tag"])))
        .build()
        .expect("reads and idempotent tools may be nested");
    for effect in [Effect::Write, Effect::External] {
        Registry::builder()
            .tools(tools(composite(effect, ["put", "send"])))
            .build()
            .expect("write and external composites nest writes");
    }
    let mut manifests = toolscript::Manifests::new();
    manifests
        .load_str(
            Path::new("shop.toml"),
            "[[tool]]\nname = \"put\"\neffect = \"write\"\nscript = \"1\"\n\n[[tool]]\nname = \"put_twice\"\neffect = \"idempotent\"\nnested = [\"put\"]\nscript = \"put(#{}); put(#{})\"\n",
        )
        .unwrap();
    match manifests.into_registry() {
        Err(Error::Manifest {
            file,
            line,
            message,
            ..
        }) => {
            assert_eq!((file.as_path(), line), (Path::new("shop.toml"), Some(6)));
            assert!(
                message.contains("`put_twice`") && message.contains("`put`"),
                "{message}"
            );
        }
        other => panic!("expected a manifest error, got {other:?}"),
    }
}

/// Another program's SQLite file given as the store is refused, left byte for byte as it was
/// (no table added, no `ALTER TABLE`, no `user_version`, no WAL switch); an empty file becomes
/// a store, stamped with the store's application id; a store written before stores were
/// stamped is known by its tables and version, and is stamped, its runs kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_programs_database_is_refused_untouched() {
    let dir = TempDir::new().unwrap();
    let cases = [
        ("notes", "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT); INSERT INTO notes (body) VALUES ('keep me');"),
        // Its own `runs` table, with no store's version.
        ("runs", "CREATE TABLE runs (run_id TEXT PRIMARY KEY, miles REAL); INSERT INTO runs VALUES ('monday', 5.2);"),
        // The store's very tables, but another program's stamp.
        ("stamped", "CREATE TABLE runs (x); PRAGMA application_id = 1234; PRAGMA user_version = 3;"),
        ("version", "PRAGMA user_version = 7;"),
    ];
    for (name, setup) in cases {
        let path = dir.path().join(format!("{name}.db"));
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(setup).unwrap();
        drop(conn);
        let before = std::fs::read(&path).unwrap();
        let e = SqliteStore::open(&path).unwrap_err().to_string();
        assert!(e.contains("not a toolscript store"), "{name}: {e}");
        assert_eq!(
            std::fs::read(&path).unwrap(),
            before,
            "{name}: the file is untouched"
        );
        // The command line says so too, and leaves it as it is.
        let out = toolscript(&["runs"], &path, None);
        assert_eq!(out.code, Some(2), "{name}: {}", out.stderr);
        assert!(
            out.stderr.contains("not a toolscript store"),
            "{name}: {}",
            out.stderr
        );
        assert_eq!(
            std::fs::read(&path).unwrap(),
            before,
            "{name}: the file is untouched"
        );
    }
    // An empty file is a new store.
    let empty = dir.path().join("empty.sqlite3");
    std::fs::write(&empty, b"").unwrap();
    let runtime = on_store(&empty, approvals(&Made::default()));
    let done = runtime.run("lookup(#{n: 1}).n").await;
    assert_eq!(done.status(), RunStatus::Completed);
    drop(runtime);
    let conn = rusqlite::Connection::open(&empty).unwrap();
    let stamp: i64 = conn
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .unwrap();
    assert_ne!(stamp, 0, "a new store is stamped");
    // A store from before the stamp: its tables and version say what it is.
    conn.execute_batch("PRAGMA application_id = 0").unwrap();
    drop(conn);
    let store = SqliteStore::open(&empty).unwrap();
    let runs = toolscript::RunListing::all(&store).await.unwrap();
    assert_eq!(runs.len(), 1, "its runs are kept");
    drop(store);
    let conn = rusqlite::Connection::open(&empty).unwrap();
    let again: i64 = conn
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .unwrap();
    assert_eq!(again, stamp, "and it is stamped");
}

/// A store this process cannot write is read: `runs` lists its runs and `artifact` prints an
/// artifact, and a command that writes (`run`, `resume`) fails saying the store is read-only.
/// (Run as another user when the tests run as root, whom file modes do not stop.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_store_can_be_read() {
    let dir = TempDir::new().unwrap();
    let folder = dir.path().join("ro");
    std::fs::create_dir(&folder).unwrap();
    let path = folder.join("store.sqlite3");
    let script = dir.path().join("s.rhai");
    std::fs::write(&script, "refund(#{n: 1})").unwrap();
    let manifest = dir.path().join("m.toml");
    std::fs::write(
        &manifest,
        "[[tool]]\nname = \"refund\"\neffect = \"write\"\napproval = \"always\"\nscript = \"1\"\n",
    )
    .unwrap();
    let m = manifest.to_str().unwrap();
    let paused = toolscript(
        &["run", script.to_str().unwrap(), "--tools", m, "--json"],
        &path,
        None,
    );
    assert_eq!(paused.code, Some(3), "{}", paused.stderr);
    let paused: Value = serde_json::from_str(paused.stdout.trim()).unwrap();
    let id = paused["run_id"].as_str().unwrap().to_string();
    use std::os::unix::fs::PermissionsExt;
    let mode =
        |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    mode(dir.path(), 0o755);
    mode(&path, 0o444);
    mode(&folder, 0o555);
    mode(&script, 0o644);
    mode(&manifest, 0o644);
    let user = running_as_root().then_some(65534);
    let listed = toolscript(&["runs", "--json"], &path, user);
    mode(&folder, 0o755);
    assert_eq!(listed.code, Some(0), "{}", listed.stderr);
    let runs: Value = serde_json::from_str(listed.stdout.trim()).unwrap();
    assert_eq!(runs[0]["run_id"], json!(id));
    assert_eq!(runs[0]["status"], "paused");
    mode(&folder, 0o555);
    let run = toolscript(
        &["run", script.to_str().unwrap(), "--tools", m],
        &path,
        user,
    );
    let resume = toolscript(&["resume", &id, "--approve", "--tools", m], &path, user);
    mode(&folder, 0o755);
    mode(&path, 0o644);
    for out in [run, resume] {
        assert_ne!(out.code, Some(0), "{}", out.stderr);
        assert!(out.stderr.contains("read-only"), "{}", out.stderr);
    }
    let listed = toolscript(&["runs", "--json"], &path, None);
    let runs: Value = serde_json::from_str(listed.stdout.trim()).unwrap();
    assert_eq!(runs[0]["status"], "paused", "nothing was written");
}

/// Whether this process runs as root (file modes do not stop it).
fn running_as_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    let probe = tempfile::NamedTempFile::new().unwrap();
    probe.as_file().metadata().unwrap().uid() == 0
}

/// One invocation of the binary.
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// `toolscript ARGS --store STORE`, as the user `uid` if given.
fn toolscript(args: &[&str], store: &Path, uid: Option<u32>) -> Ran {
    use std::os::unix::process::CommandExt;
    let mut command = Command::new(env!("CARGO_BIN_EXE_toolscript"));
    command
        .args(args)
        .arg("--store")
        .arg(store)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    if let Some(uid) = uid {
        command.uid(uid).gid(uid).env("HOME", "/nonexistent");
    }
    let out = command.output().expect("toolscript runs");
    Ran {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}
