//! Store faults are not final: a journal commit that fails (the store locked by another
//! connection past the busy timeout, a disk that is full) leaves the run `interrupted`, its
//! message saying exactly whether the call was made, and a later resume finishes it with every
//! write made once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use tempfile::TempDir;
use toolscript::stores::{
    Claim, Fence, JournalRows, Renewed, StoreFuture, StoredEnd, TakeDecision, TakeRefused,
};
use toolscript::{
    CatalogPrint, Decision, Effect, Error, PruneRule, Pruned, Registry, RunOptions, RunPage,
    RunQuery, RunRecord, RunStatus, Runtime, SqliteStore, Store, StoredArtifact, Tool,
};

/// The calls whose bodies ran, as `tool:n`.
type Made = Arc<Mutex<Vec<String>>>;

fn put(made: &Made) -> Tool {
    let made = Arc::clone(made);
    Tool::builder("put", Effect::Write).handler(move |args| {
        made.lock().unwrap().push(format!("put:{}", args["n"]));
        async move { Ok(args) }
    })
}

/// The store locked by another connection (an exclusive transaction, taken by the script's
/// first read) while the run commits its first write's intent: the run is interrupted, not
/// failed, its message says the write was not made, nothing was made; once the lock is gone a
/// resume finishes it, each write made once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_locked_during_an_intent_commit_interrupts_the_run_resumably() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("store.sqlite3");
    let made: Made = Arc::default();
    let holder: Arc<Mutex<Option<rusqlite::Connection>>> = Arc::default();
    let once = Arc::new(AtomicBool::new(false));
    let lock_store = {
        let (holder, path) = (Arc::clone(&holder), path.clone());
        Tool::builder("lock_store", Effect::Read).handler(move |_| {
            let mut slot = holder.lock().unwrap();
            if !once.swap(true, Ordering::SeqCst) {
                let conn = rusqlite::Connection::open(&path).unwrap();
                conn.execute_batch("BEGIN EXCLUSIVE").unwrap();
                *slot = Some(conn);
            }
            async { Ok(json!(5)) }
        })
    };
    let store = SqliteStore::open(&path)
        .unwrap()
        .busy_timeout(Duration::from_millis(200))
        .unwrap();
    let registry = Registry::builder()
        .tools([lock_store, put(&made)])
        .build()
        .unwrap();
    let runtime = Runtime::builder(registry).store(Arc::new(store)).build();
    let script = "let a = lock_store(#{}); put(#{n: 1}); put(#{n: a}); a";
    let stopped = runtime.run(script).await;
    assert_eq!(
        stopped.status(),
        RunStatus::Interrupted,
        "{:?}",
        stopped.result
    );
    let error = stopped.result.as_ref().unwrap_err();
    assert!(
        error.message.contains("`put` (call #0) was not made")
            && !error.message.contains("whether it took effect"),
        "{}",
        error.message
    );
    assert!(error.recoverable);
    assert_eq!(stopped.to_json()["status"], "interrupted");
    assert!(made.lock().unwrap().is_empty(), "nothing was made");
    // The lock goes away; the run (left `running`, its owner done with it, for its end could
    // not be written either) is taken by a resume and finished.
    holder.lock().unwrap().take();
    let store = runtime.store().unwrap();
    let record = store.run(&stopped.run_id).await.unwrap().unwrap();
    assert!(
        matches!(record.status, RunStatus::Running | RunStatus::Interrupted),
        "{:?}",
        record.status
    );
    let done = runtime
        .resume(&stopped.run_id, None, RunOptions::default())
        .await
        .unwrap();
    assert_eq!(done.result.unwrap(), json!(5));
    assert_eq!(made.lock().unwrap().clone(), ["put:1", "put:5"]);
    let record = store.run(&stopped.run_id).await.unwrap().unwrap();
    assert_eq!(record.status, RunStatus::Completed);
}

/// A store whose appends fail while `full` is set and the append carries a call's outcome (a
/// disk that filled up between a call's intent and its outcome).
#[derive(Debug)]
struct FullDisk {
    inner: SqliteStore,
    full: AtomicBool,
}

impl Store for FullDisk {
    fn location(&self) -> String {
        self.inner.location()
    }
    fn create_run(&self, record: RunRecord) -> StoreFuture<'_, ()> {
        self.inner.create_run(record)
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
        self.inner.load_journal(run_id)
    }
    fn append<'a>(&'a self, run_id: &'a str, rows: JournalRows) -> StoreFuture<'a, ()> {
        if rows.writes.iter().any(|w| w.outcome.is_some())
            && self.full.swap(false, Ordering::SeqCst)
        {
            return Box::pin(async {
                Err(Error::Io {
                    path: "store.sqlite3".into(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::StorageFull,
                        "no space left on device",
                    ),
                })
            });
        }
        self.inner.append(run_id, rows)
    }
    fn put_artifact<'a>(&'a self, id: &'a str, artifact: StoredArtifact) -> StoreFuture<'a, ()> {
        self.inner.put_artifact(id, artifact)
    }
    fn artifact<'a>(&'a self, id: &'a str) -> StoreFuture<'a, Option<StoredArtifact>> {
        self.inner.artifact(id)
    }
}

/// The disk fills up between a write's intent and its outcome: the run is interrupted, its
/// message says the write was made (and how it answered), the store records it
/// `interrupted`; a resume asks whether it took effect, and `done` finishes the run with each
/// write made once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_outcome_commit_says_the_call_was_made_and_the_run_resumes() {
    let dir = TempDir::new().unwrap();
    let made: Made = Arc::default();
    let store = Arc::new(FullDisk {
        inner: SqliteStore::open(&dir.path().join("s.sqlite3")).unwrap(),
        full: AtomicBool::new(true),
    });
    let registry = Registry::builder().tool(put(&made)).build().unwrap();
    let runtime = Runtime::builder(registry).store(store.clone()).build();
    let stopped = runtime.run("put(#{n: 1}); put(#{n: 2}); 7").await;
    assert_eq!(
        stopped.status(),
        RunStatus::Interrupted,
        "{:?}",
        stopped.result
    );
    let message = &stopped.result.as_ref().unwrap_err().message;
    assert!(
        message.contains("`put` (call #0) was made (it answered with a result)")
            && message.contains("no space left on device")
            && message.contains("--resolve done"),
        "{message}"
    );
    assert_eq!(made.lock().unwrap().clone(), ["put:1"]);
    let record = store.run(&stopped.run_id).await.unwrap().unwrap();
    assert_eq!(record.status, RunStatus::Interrupted);
    let paused = runtime
        .resume(&stopped.run_id, None, RunOptions::default())
        .await
        .unwrap();
    let pending = paused
        .pending
        .expect("it asks whether the write took effect");
    assert_eq!((pending.seq, pending.tool.as_str()), (0, "put"));
    let done = runtime
        .resume(&stopped.run_id, Some(Decision::Done), RunOptions::default())
        .await
        .unwrap();
    assert_eq!(done.result.unwrap(), json!(7));
    assert_eq!(made.lock().unwrap().clone(), ["put:1", "put:2"]);
}

/// At the store: a decision for a call the run no longer waits at, or of the wrong kind, is
/// refused and changes nothing; a decision on a call whose outcome is journaled is refused; an
/// append never replaces a journaled outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_checks_a_decision_where_it_applies_it() {
    use toolscript::stores::{JournaledWrite, Verdict, WriteState};
    use toolscript::{Awaiting, Mode, PendingCall};
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("s.sqlite3");
    let store = SqliteStore::open(&path).unwrap();
    store
        .create_run(RunRecord::new("r", "s.rhai", "1", "c", Mode::Sequential))
        .await
        .unwrap();
    let pause = |seq, awaiting| {
        let pending = PendingCall::new(seq, "put", Effect::Write, json!({"n": 1}), awaiting);
        StoredEnd::new(RunStatus::Paused, Some(pending), json!({}))
    };
    store
        .finish_run("r", pause(1, Awaiting::Approval))
        .await
        .unwrap();
    let never = Claim::new("a resume", "here");
    let take =
        |seq, verdict| store.take_run("r", never.clone(), Some(TakeDecision::new(seq, verdict)));
    assert!(
        matches!(take(0, Verdict::Approve).await.unwrap(), Err(TakeRefused::Stale(r)) if r.pending.as_ref().unwrap().seq == 1)
    );
    assert!(matches!(
        take(1, Verdict::Done).await.unwrap(),
        Err(TakeRefused::Stale(_))
    ));
    assert!(matches!(
        store.take_run("r", never.clone(), None).await.unwrap(),
        Err(TakeRefused::Stale(_))
    ));
    assert_eq!(
        store.run("r").await.unwrap().unwrap().status,
        RunStatus::Paused,
        "nothing changed"
    );
    assert!(store.load_journal("r").await.unwrap().writes.is_empty());
    // The call's outcome is in the journal already (another process made it): refused.
    let made = JournaledWrite::new(
        1,
        "put",
        r#"{"n":1}"#,
        WriteState::new(true, false, true),
        Some(Ok(json!(1))),
    );
    store
        .append("r", JournalRows::new(vec![made], vec![]))
        .await
        .unwrap();
    assert!(matches!(
        take(1, Verdict::Approve).await.unwrap(),
        Err(TakeRefused::Settled(1))
    ));
    store
        .finish_run("r", pause(1, Awaiting::Resolve))
        .await
        .unwrap();
    assert!(matches!(
        take(1, Verdict::Done).await.unwrap(),
        Err(TakeRefused::Settled(1))
    ));
    // An append over it fails whole, and the outcome stays.
    let lost = JournaledWrite::new(
        1,
        "put",
        r#"{"n":1}"#,
        WriteState::new(false, false, true),
        None,
    );
    let e = store
        .append("r", JournalRows::new(vec![lost], vec![]))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("never replaced"), "{e}");
    let rows = store.load_journal("r").await.unwrap();
    assert_eq!(rows.writes[0].outcome, Some(Ok(json!(1))));
    // The decision that fits is taken, with the run.
    store
        .finish_run("r", pause(2, Awaiting::Approval))
        .await
        .unwrap();
    let taken = take(2, Verdict::Approve).await.unwrap().unwrap();
    assert_eq!(
        taken.status,
        RunStatus::Paused,
        "the record as it was before"
    );
    let rows = store.load_journal("r").await.unwrap();
    assert!(rows
        .writes
        .iter()
        .any(|w| w.seq == 2 && w.state.approved && w.outcome.is_none()));
    assert_eq!(
        store.run("r").await.unwrap().unwrap().status,
        RunStatus::Running
    );
}
