//! One suite of store-level tests, written once against `Arc<dyn Store>` and run on both
//! backends: SQLite (a temporary file) and PostgreSQL (a database of the tests' own cluster,
//! see `pg.rs`). Each test below is a function of a [`Backend`]; `both!` makes a `sqlite` and
//! a `postgres` test of it.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tempfile::TempDir;
use toolscript::stores::{
    CacheDrop, CacheEntry, Claim, Fence, JournalRows, JournaledWrite, Lease, PageIndex, ReadRow,
    Renewed, StoredEnd, TakeDecision, TakeRefused, Verdict, WriteState,
};
use toolscript::{
    Awaiting, Effect, Mode, PendingCall, PostgresStore, PruneRule, RunQuery, RunRecord, RunStatus,
    SqliteStore, Store, StoredArtifact, StoredPlan,
};

use crate::pg;

/// Where a test's store is: each handle opened on it is another connection (SQLite) or pool
/// (PostgreSQL), as another process would have.
pub enum Backend {
    Sqlite(TempDir),
    Postgres(String),
}

impl Backend {
    fn sqlite() -> Backend {
        Backend::Sqlite(TempDir::new().unwrap())
    }

    /// A new database of the cluster, or `None` (the test is skipped, saying so).
    fn postgres(name: &str) -> Option<Backend> {
        pg::database(name).map(Backend::Postgres)
    }

    /// A handle on the store whose leases live `ttl`.
    async fn open(&self, ttl: Duration) -> Arc<dyn Store> {
        match self {
            Backend::Sqlite(dir) => Arc::new(
                SqliteStore::open(&dir.path().join("store.sqlite3"))
                    .unwrap()
                    .with_lease_ttl(ttl),
            ),
            Backend::Postgres(url) => Arc::new(
                PostgresStore::connect(url)
                    .await
                    .unwrap()
                    .with_lease_ttl(ttl),
            ),
        }
    }
}

/// A `sqlite` and a `postgres` test of the suite's function `$name`.
macro_rules! both {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                super::$name(&super::Backend::sqlite()).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                if let Some(backend) = super::Backend::postgres(stringify!($name)) {
                    super::$name(&backend).await;
                }
            }
        }
    )*};
}

both!(
    a_run_is_created_taken_renewed_fenced_and_finished,
    the_journal_appends_and_loads_and_never_replaces_an_outcome,
    artifacts_and_their_pages,
    cached_reads_are_put_got_and_dropped,
    a_plan_is_claimed_once_and_released,
    tenants_see_their_runs_and_artifacts_only,
    runs_are_listed_by_pages_and_pruned_but_never_a_live_one,
    two_handles_share_one_digest_key,
    of_two_handles_taking_one_run_exactly_one_wins,
    a_decision_is_journaled_as_the_run_is_taken,
    the_runs_whose_lease_expired_are_listed,
);

fn claim(name: &str) -> Claim {
    Claim::new(format!("owner-{name}"), format!("host-{name}"))
}

/// A new run `id` leased to `by`.
async fn create(store: &dyn Store, id: &str, by: &Claim) {
    let mut record = RunRecord::new(id, "s.rhai", "let x = 1;", "c", Mode::Sequential);
    record.lease = Some(Lease::new(by, 1, 0, 0));
    store.create_run(record).await.unwrap();
}

fn lease(record: &RunRecord) -> Lease {
    record.lease.clone().expect("a lease")
}

fn intent(seq: u64) -> JournaledWrite {
    JournaledWrite::new(seq, "put", "{}", WriteState::new(false, false, true), None)
}

async fn append(
    store: &dyn Store,
    id: &str,
    write: JournaledWrite,
    fence: &Fence,
) -> Result<(), String> {
    let mut rows = JournalRows::new(vec![write], Vec::new());
    rows.fence = Some(fence.clone());
    store.append(id, rows).await.map_err(|e| e.report())
}

async fn a_run_is_created_taken_renewed_fenced_and_finished(backend: &Backend) {
    let store = backend.open(Duration::from_millis(400)).await;
    let (a, b) = (claim("a"), claim("b"));
    create(&*store, "r", &a).await;
    let first = lease(&store.run("r").await.unwrap().unwrap());
    assert_eq!((first.owner.as_str(), first.token), ("owner-a", 1));
    assert!(first.is_live(), "{first:?}");
    // A live lease refuses another owner.
    match store.take_run("r", b.clone(), None).await.unwrap() {
        Err(TakeRefused::Busy(held)) => assert_eq!(held.owner, "owner-a"),
        other => panic!("{other:?}"),
    }
    // Renewed, it holds longer.
    match store.renew_lease("r", &first.fence()).await.unwrap() {
        Renewed::Kept(renewed) => assert!(renewed.expires_ms >= first.expires_ms),
        other => panic!("{other:?}"),
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Expired, it is taken with the next token; the old owner is fenced off.
    let taken = store.take_run("r", b.clone(), None).await.unwrap().unwrap();
    let second = lease(&taken);
    assert_eq!((second.owner.as_str(), second.token), ("owner-b", 2));
    let refused = append(&*store, "r", intent(1), &first.fence())
        .await
        .unwrap_err();
    assert!(
        refused.contains("taken over by owner-b on host-b"),
        "{refused}"
    );
    match store.renew_lease("r", &first.fence()).await.unwrap() {
        Renewed::TakenOver(now) => assert_eq!(now.token, 2),
        other => panic!("{other:?}"),
    }
    let end = StoredEnd::new(RunStatus::Completed, None, json!({"ok": 1}));
    assert!(store
        .finish_run("r", end.clone().fenced(Some(first.fence())))
        .await
        .is_err());
    store
        .finish_run("r", end.fenced(Some(second.fence())))
        .await
        .unwrap();
    let done = store.run("r").await.unwrap().unwrap();
    assert_eq!(done.status, RunStatus::Completed);
    assert_eq!(done.outcome, Some(json!({"ok": 1})));
    assert!(!lease(&done).is_live(), "a finished run's lease is let go");
    assert!(matches!(
        store.renew_lease("r", &second.fence()).await.unwrap(),
        Renewed::Released
    ));
    assert!(matches!(
        store.take_run("r", a, None).await.unwrap(),
        Err(TakeRefused::Ended(_))
    ));
    assert!(matches!(
        store.take_run("nope", b, None).await.unwrap(),
        Err(TakeRefused::Unknown)
    ));
    assert!(store.run("nope").await.unwrap().is_none());
}

async fn the_journal_appends_and_loads_and_never_replaces_an_outcome(backend: &Backend) {
    let store = backend.open(Duration::from_secs(30)).await;
    let a = claim("a");
    create(&*store, "r", &a).await;
    let fence = lease(&store.run("r").await.unwrap().unwrap()).fence();
    let read = ReadRow::new(0, "get", "{\"k\":1}", 0, Arc::new(Ok(json!([1, 2]))));
    let mut rows = JournalRows::new(vec![intent(1), intent(2)], vec![read.clone()]);
    rows.fence = Some(fence.clone());
    store.append("r", rows).await.unwrap();
    // A read already stored is kept as it was.
    let other = ReadRow::new(0, "get", "{\"k\":1}", 0, Arc::new(Ok(json!("changed"))));
    store
        .append("r", JournalRows::new(Vec::new(), vec![other]))
        .await
        .unwrap();
    let mut done = intent(1);
    done.outcome = Some(Ok(json!({"id": 7})));
    append(&*store, "r", done.clone(), &fence).await.unwrap();
    let journal = store.load_journal("r").await.unwrap();
    assert_eq!(journal.writes.len(), 2);
    assert_eq!(format!("{:?}", journal.writes[0]), format!("{done:?}"));
    assert_eq!(
        format!("{:?}", journal.writes[1]),
        format!("{:?}", intent(2))
    );
    assert_eq!(journal.reads.len(), 1);
    assert_eq!(*journal.reads[0].outcome, Ok(json!([1, 2])));
    // An outcome is never replaced: the whole append fails, and nothing of it is kept.
    let mut again = intent(1);
    again.outcome = Some(Ok(json!("twice")));
    let both = JournalRows::new(vec![intent(3), again], Vec::new());
    let e = store.append("r", both).await.unwrap_err().report();
    assert!(e.contains("never replaced"), "{e}");
    let journal = store.load_journal("r").await.unwrap();
    assert_eq!(journal.writes.len(), 2, "the failed append left nothing");
    assert_eq!(format!("{:?}", journal.writes[0]), format!("{done:?}"));
    // A journal of a run the store does not have is empty.
    assert!(store.load_journal("none").await.unwrap().writes.is_empty());
}

async fn artifacts_and_their_pages(backend: &Backend) {
    let store = backend.open(Duration::from_secs(30)).await;
    create(&*store, "r", &claim("a")).await;
    let content = b"[1,2][3,4,5]".to_vec();
    let index = PageIndex::new("items", vec![1..4, 6..11]);
    let id = "0123456789abcdef0123456789abcdef";
    let artifact =
        StoredArtifact::new(content.clone(), 100, "items", "r").with_index(index.clone());
    store.put_artifact(id, artifact.clone()).await.unwrap();
    // Content-addressed: the first one kept stays.
    let other = StoredArtifact::new(b"other".to_vec(), 5, "text", "r");
    store.put_artifact(id, other).await.unwrap();
    assert_eq!(store.artifact(id).await.unwrap().unwrap(), artifact);
    let page = store.artifact_page(id, 1).await.unwrap().unwrap();
    assert_eq!(page.content, b"3,4,5");
    assert_eq!(page.index, Some(index));
    assert!(store
        .artifact_page(id, 2)
        .await
        .unwrap()
        .unwrap()
        .content
        .is_empty());
    assert!(store
        .artifact("ffffffffffffffffffffffffffffffff")
        .await
        .unwrap()
        .is_none());
    // An artifact without an index: its page is the whole content.
    let plain = "fedcba9876543210fedcba9876543210";
    store
        .put_artifact(
            plain,
            StoredArtifact::new(b"whole".to_vec(), 5, "text", "r"),
        )
        .await
        .unwrap();
    assert_eq!(
        store
            .artifact_page(plain, 3)
            .await
            .unwrap()
            .unwrap()
            .content,
        b"whole"
    );
    // An index naming bytes the content does not hold is an error, never a panic.
    let bad = "00000000000000000000000000000000";
    let broken = StoredArtifact::new(b"ab".to_vec(), 5, "items", "r")
        .with_index(PageIndex::new("items", vec![0..1, 0..99]));
    store.put_artifact(bad, broken).await.unwrap();
    let e = store.artifact_page(bad, 1).await.unwrap_err().report();
    assert!(e.contains("holds 2"), "{e}");
    // A large input is kept as an artifact and read back whole.
    let big = "x".repeat(70 * 1024);
    let mut record = RunRecord::new("big", "s.rhai", "1", "c", Mode::Sequential);
    record.input = Some(json!({"text": big}));
    store.create_run(record).await.unwrap();
    let back = store.run("big").await.unwrap().unwrap();
    assert_eq!(back.input, Some(json!({"text": big})));
}

async fn cached_reads_are_put_got_and_dropped(backend: &Backend) {
    let store = backend.open(Duration::from_secs(30)).await;
    let entry = |key: &str, tool: &str, scope: &str, value| {
        CacheEntry::new(key.into(), tool.into(), scope.into(), value, 100, 200)
    };
    store
        .cache_put(vec![
            entry("k1", "get", "s1", json!(1)),
            entry("k2", "get", "s2", json!(2)),
            entry("k3", "list", "s1", json!(3)),
        ])
        .await
        .unwrap();
    assert_eq!(
        store.cache_get("k1", 150).await.unwrap().unwrap().value,
        json!(1)
    );
    // Made before the run started, and not expired then.
    assert!(store.cache_get("k1", 100).await.unwrap().is_none());
    assert!(store.cache_get("k1", 200).await.unwrap().is_none());
    store
        .cache_put(vec![entry("k1", "get", "s1", json!("new"))])
        .await
        .unwrap();
    assert_eq!(
        store.cache_get("k1", 150).await.unwrap().unwrap().value,
        json!("new")
    );
    let dropped = store
        .cache_drop(vec![CacheDrop::new("get".into(), Some("s1".into()))])
        .await
        .unwrap();
    assert_eq!(dropped, 1);
    assert!(store.cache_get("k2", 150).await.unwrap().is_some());
    assert_eq!(
        store
            .cache_drop(vec![CacheDrop::new("get".into(), None)])
            .await
            .unwrap(),
        1
    );
    assert!(store.cache_get("k3", 150).await.unwrap().is_some());
}

async fn a_plan_is_claimed_once_and_released(backend: &Backend) {
    let store = backend.open(Duration::from_secs(30)).await;
    let mut plan = StoredPlan::new("p1".into(), 1, i64::MAX, "{\"a\":1}".into());
    plan.tenant = Some("t".into());
    store.put_plan(plan.clone()).await.unwrap();
    assert_eq!(store.plan("p1").await.unwrap().unwrap(), plan);
    assert_eq!(store.claim_plan("p1", "r1").await.unwrap(), None);
    assert_eq!(
        store.claim_plan("p1", "r2").await.unwrap(),
        Some("r1".into())
    );
    assert_eq!(
        store.claim_plan("gone", "r2").await.unwrap(),
        Some(String::new())
    );
    assert_eq!(
        store.plan_of_run("r1").await.unwrap().unwrap().plan_id,
        "p1"
    );
    // Only the run that claimed it gives it back.
    store.release_plan("p1", "r2").await.unwrap();
    assert_eq!(
        store.plan("p1").await.unwrap().unwrap().applied_run,
        Some("r1".into())
    );
    store.release_plan("p1", "r1").await.unwrap();
    assert_eq!(store.claim_plan("p1", "r3").await.unwrap(), None);
    // A plan a run applied is not replaced.
    let replaced = StoredPlan::new("p1".into(), 2, i64::MAX, "{\"a\":2}".into());
    store.put_plan(replaced).await.unwrap();
    assert_eq!(store.plan("p1").await.unwrap().unwrap().body, "{\"a\":1}");
}

async fn tenants_see_their_runs_and_artifacts_only(backend: &Backend) {
    let store = backend.open(Duration::from_secs(30)).await;
    for (id, tenant) in [("a1", "ta"), ("a2", "ta"), ("b1", "tb")] {
        let mut record = RunRecord::new(id, "s.rhai", "1", "c", Mode::Sequential);
        record.tenant = Some(tenant.into());
        store.create_run(record).await.unwrap();
    }
    let id = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    store
        .put_artifact(id, StoredArtifact::new(b"1".to_vec(), 5, "json", "a1"))
        .await
        .unwrap();
    assert!(store.artifact_of_tenant(id, "ta").await.unwrap());
    assert!(!store.artifact_of_tenant(id, "tb").await.unwrap());
    // A run of tb naming ta's artifact does not make it tb's.
    let mut record = RunRecord::new(
        "b2",
        "s.rhai",
        format!("ts_artifact(\"{id}\")"),
        "c",
        Mode::Sequential,
    );
    record.tenant = Some("tb".into());
    store.create_run(record).await.unwrap();
    assert!(!store.artifact_of_tenant(id, "tb").await.unwrap());
    // A later run of ta naming it refers to it.
    let mut record = RunRecord::new(
        "a3",
        "s.rhai",
        format!("ts_artifact(\"{id}\")"),
        "c",
        Mode::Sequential,
    );
    record.tenant = Some("ta".into());
    store.create_run(record).await.unwrap();
    let page = store
        .list_runs(RunQuery::first(10).tenant(Some("ta".into())))
        .await
        .unwrap();
    let mut ids: Vec<_> = page.runs.iter().map(|r| r.run_id.as_str()).collect();
    ids.sort();
    assert_eq!(ids, ["a1", "a2", "a3"]);
    let all = store.list_runs(RunQuery::first(10)).await.unwrap();
    assert_eq!(all.runs.len(), 5);
}

async fn runs_are_listed_by_pages_and_pruned_but_never_a_live_one(backend: &Backend) {
    let store = backend.open(Duration::from_secs(30)).await;
    // Ids of both cases: the order is by bytes (as SQLite's), whatever the database's collation.
    for i in 0..5 {
        let id = if i % 2 == 0 {
            format!("a{i}")
        } else {
            format!("B{i}")
        };
        let mut record = RunRecord::new(id, "s.rhai", "1", "c", Mode::Sequential);
        record.started_ms = 1000 + i64::from(i % 3);
        store.create_run(record).await.unwrap();
    }
    let mut seen = Vec::new();
    let mut cursor = None;
    loop {
        let page = store
            .list_runs(RunQuery::first(2).after(cursor.clone()))
            .await
            .unwrap();
        assert!(page.runs.len() <= 2);
        seen.extend(page.runs.iter().map(|r| r.run_id.clone()));
        cursor = page.next;
        if cursor.is_none() {
            break;
        }
    }
    assert_eq!(seen, ["a2", "B1", "a4", "B3", "a0"]);
    let bad = store
        .list_runs(RunQuery::first(2).after(Some("nope".into())))
        .await;
    assert!(bad.is_err());
    // a0 completed, B1 failed, the others running without a lease (expired), `live` running
    // under a live lease.
    let done = |s| StoredEnd::new(s, None, json!(null));
    store
        .finish_run("a0", done(RunStatus::Completed))
        .await
        .unwrap();
    store
        .finish_run("B1", done(RunStatus::Failed))
        .await
        .unwrap();
    let live = claim("live");
    create(&*store, "live", &live).await;
    let paused = store
        .list_runs(RunQuery::first(10).statuses([RunStatus::Completed, RunStatus::Failed]))
        .await
        .unwrap();
    assert_eq!(paused.runs.len(), 2);
    let id = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    store
        .put_artifact(id, StoredArtifact::new(b"1".to_vec(), 5, "json", "a0"))
        .await
        .unwrap();
    let mut rule = PruneRule::default();
    rule.statuses = vec![RunStatus::Completed, RunStatus::Failed, RunStatus::Running];
    rule.dry_run = true;
    let dry = store.prune(rule.clone()).await.unwrap();
    assert_eq!((dry.runs, dry.kept_alive), (5, 1), "{dry:?}");
    assert!(
        store.run("a0").await.unwrap().is_some(),
        "a dry run removes nothing"
    );
    rule.dry_run = false;
    let pruned = store.prune(rule).await.unwrap();
    assert_eq!(
        (pruned.runs, pruned.artifacts, pruned.kept_alive),
        (5, 1, 1),
        "{pruned:?}"
    );
    assert!(store.run("a0").await.unwrap().is_none());
    assert!(store.artifact(id).await.unwrap().is_none());
    assert!(store.run("live").await.unwrap().is_some());
    assert!(pruned.bytes_after.is_some());
}

async fn two_handles_share_one_digest_key(backend: &Backend) {
    let (one, two) = (
        backend.open(Duration::from_secs(30)).await,
        backend.open(Duration::from_secs(30)).await,
    );
    let (a, b) = tokio::join!(one.digest_key(), two.digest_key());
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a, b);
    assert_ne!(*a, [0u8; 32]);
    let three = backend.open(Duration::from_secs(30)).await;
    assert_eq!(three.digest_key().await.unwrap(), a);
}

async fn of_two_handles_taking_one_run_exactly_one_wins(backend: &Backend) {
    let (one, two) = (
        backend.open(Duration::from_millis(200)).await,
        backend.open(Duration::from_millis(200)).await,
    );
    for round in 0..5 {
        let id = format!("r{round}");
        create(&*one, &id, &claim("dead")).await;
        tokio::time::sleep(Duration::from_millis(250)).await;
        let (x, y) = tokio::join!(
            one.take_run(&id, claim("x"), None),
            two.take_run(&id, claim("y"), None)
        );
        let (x, y) = (x.unwrap(), y.unwrap());
        let won = [&x, &y].iter().filter(|r| r.is_ok()).count();
        assert_eq!(won, 1, "round {round}: {x:?} / {y:?}");
        let loser = if x.is_ok() { &y } else { &x };
        assert!(
            matches!(loser, Err(TakeRefused::Busy(l)) if l.token == 2),
            "{loser:?}"
        );
    }
}

async fn a_decision_is_journaled_as_the_run_is_taken(backend: &Backend) {
    let store = backend.open(Duration::from_secs(30)).await;
    create(&*store, "r", &claim("a")).await;
    let pending = PendingCall::new(3, "put", Effect::Write, json!({"k": 1}), Awaiting::Approval);
    let end = StoredEnd::new(
        RunStatus::Paused,
        Some(pending.clone()),
        json!({"paused": true}),
    );
    store.finish_run("r", end).await.unwrap();
    // A paused run is not taken without a decision, nor with one for another call.
    assert!(matches!(
        store.take_run("r", claim("b"), None).await.unwrap(),
        Err(TakeRefused::Stale(_))
    ));
    let wrong = TakeDecision::new(4, Verdict::Approve);
    assert!(matches!(
        store.take_run("r", claim("b"), Some(wrong)).await.unwrap(),
        Err(TakeRefused::Stale(_))
    ));
    let taken = store
        .take_run(
            "r",
            claim("b"),
            Some(TakeDecision::on(&pending, Verdict::Approve)),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(lease(&taken).token, 2);
    let journal = store.load_journal("r").await.unwrap();
    assert_eq!(journal.writes.len(), 1);
    assert!(journal.writes[0].state.approved);
    assert_eq!(
        store.run("r").await.unwrap().unwrap().status,
        RunStatus::Running
    );
}

// What the PostgreSQL store alone does: its URL, its server, its schema's versions.

/// A URL to a port nothing listens on fails soon, saying what to check, its password masked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_unreachable_server_is_a_clear_error_soon() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://me:hunter2@127.0.0.1:{port}/db?connect_timeout=2");
    let started = std::time::Instant::now();
    let e = PostgresStore::connect(&url).await.unwrap_err().report();
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert!(e.contains("check"), "{e}");
    assert!(!e.contains("hunter2"), "{e}");
    assert!(e.contains("me:***@127.0.0.1"), "{e}");
    // A server that takes the connection and never answers: no hang either.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let holder = std::thread::spawn(move || {
        let held: Vec<_> = silent.incoming().take(2).collect();
        std::thread::sleep(Duration::from_secs(8));
        drop(held);
    });
    let url = format!("postgres://me@127.0.0.1:{port}/db?connect_timeout=1&sslmode=disable");
    let started = std::time::Instant::now();
    let e = PostgresStore::connect(&url).await.unwrap_err().report();
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
    assert!(e.contains("in time") && e.contains("check"), "{e}");
    drop(holder);
    // A URL that does not parse, and a bad sslmode, are refused before any connection.
    let e = PostgresStore::new("postgres://h/d?sslmode=sometimes")
        .unwrap_err()
        .report();
    assert!(e.contains("sslmode=sometimes"), "{e}");
}

/// A database holding another program's tables is refused, left as it was; so is a store of a
/// newer version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_foreign_or_newer_database_is_refused_untouched() {
    let Some(url) = pg::database("foreign") else {
        return;
    };
    let cluster = pg::cluster();
    let db = pg::Cluster::db_of(&url);
    cluster.psql_in(
        &db,
        "CREATE TABLE customers (id int); CREATE TABLE orders (id int)",
    );
    let e = PostgresStore::connect(&url).await.unwrap_err().report();
    assert!(e.contains("not a toolscript store"), "{e}");
    assert!(e.contains("`customers`, `orders`"), "{e}");
    // Untouched: a second try finds the same two tables, and nothing of a store.
    let e = PostgresStore::connect(&url).await.unwrap_err().report();
    assert!(
        e.contains("`customers`, `orders` and no toolscript_meta"),
        "{e}"
    );
    // A newer store.
    let Some(url) = pg::database("newer") else {
        return;
    };
    let store = PostgresStore::connect(&url).await.unwrap();
    drop(store);
    let db = pg::Cluster::db_of(&url);
    cluster.psql_in(
        &db,
        "UPDATE toolscript_meta SET value = '99' WHERE key = 'schema_version'",
    );
    let e = PostgresStore::connect(&url).await.unwrap_err().report();
    assert!(e.contains("schema version 99"), "{e}");
}

/// Several handles opening a new database at once set its schema up once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_handles_opening_a_new_database_together_agree() {
    let Some(url) = pg::database("together") else {
        return;
    };
    let opened = futures::future::join_all((0..6).map(|_| PostgresStore::connect(&url))).await;
    for store in opened {
        store.unwrap();
    }
}

/// TLS modes against the cluster, which offers TLS with a certificate for `localhost` only:
/// each mode connects (encrypted or not) or is refused as libpq's would be, and a refusal
/// says what to check, its password masked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_each_sslmode_connects_or_refuses_as_libpq_does() {
    let Some(url) = pg::database("tls") else {
        return;
    };
    let cluster = pg::cluster();
    let Some(ca) = cluster.ca.clone() else {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("the test cluster offers no TLS (openssl could not make its certificates)");
        }
        eprintln!("SKIPPED (the test cluster offers no TLS)");
        return;
    };
    let db = pg::Cluster::db_of(&url);
    let (port, ca) = (cluster.port, ca.display().to_string());
    let at =
        |host: &str, params: &str| format!("postgres://postgres:pw@{host}:{port}/{db}?{params}");
    // Connections of the database encrypted, and all of them, as the server sees them.
    let count = || {
        let sql = format!(
            "SELECT count(*) FILTER (WHERE s.ssl) || '/' || count(*) FROM pg_stat_ssl s \
             JOIN pg_stat_activity a USING (pid) WHERE a.datname = '{db}'"
        );
        cluster.psql_in("postgres", &sql)
    };
    let cases = [
        (at("127.0.0.1", "sslmode=disable"), Some("0/1")),
        (at("127.0.0.1", "sslmode=prefer"), Some("1/1")),
        (at("127.0.0.1", "sslmode=require"), Some("1/1")),
        (
            at(
                "localhost",
                &format!("sslmode=verify-full&sslrootcert={ca}"),
            ),
            Some("1/1"),
        ),
        (
            at("127.0.0.1", &format!("sslmode=verify-ca&sslrootcert={ca}")),
            Some("1/1"),
        ),
        // The certificate does not name 127.0.0.1.
        (
            at(
                "127.0.0.1",
                &format!("sslmode=verify-full&sslrootcert={ca}"),
            ),
            None,
        ),
        // Nor is its root among webpki's.
        (at("localhost", "sslmode=verify-full"), None),
        (at("localhost", "sslmode=verify-ca"), None),
    ];
    for (url, encrypted) in cases {
        let opened = PostgresStore::connect(&url).await;
        match (opened, encrypted) {
            (Ok(store), Some(want)) => {
                assert_eq!(count(), want, "{url}");
                drop(store);
                // The pool's connections close with it.
                let started = std::time::Instant::now();
                while count() != "0/0" {
                    assert!(started.elapsed() < Duration::from_secs(10), "{url}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            (Err(e), None) => {
                let e = e.report();
                assert!(e.contains("sslmode"), "{url}: {e}");
                assert!(e.contains("postgres:***@") && !e.contains("pw@"), "{e}");
            }
            (opened, _) => panic!("{url}: {opened:?}"),
        }
    }
}

/// A transaction the server aborts for a serialization failure or a deadlock is run again, a
/// bounded number of times: a trigger fails the first inserts of runs (its count kept in a
/// sequence, which no rollback undoes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_conflict_is_retried_a_bounded_number_of_times() {
    let Some(url) = pg::database("retried") else {
        return;
    };
    let store = PostgresStore::connect(&url).await.unwrap();
    let db = pg::Cluster::db_of(&url);
    pg::cluster().psql_in(
        &db,
        "CREATE SEQUENCE conflicts; \
         CREATE TABLE conflict_codes (n int, code text); \
         INSERT INTO conflict_codes VALUES (1, '40001'), (2, '40P01'), (3, '40001'); \
         CREATE FUNCTION conflict() RETURNS trigger AS $$ \
         DECLARE k bigint := nextval('conflicts'); c text; BEGIN \
           SELECT code INTO c FROM conflict_codes WHERE conflict_codes.n = k; \
           IF c IS NULL AND NEW.run_id LIKE 'never%' THEN c := '40001'; END IF; \
           IF c IS NOT NULL THEN RAISE EXCEPTION 'a conflict (%)', k USING ERRCODE = c; END IF; \
           RETURN NEW; END $$ LANGUAGE plpgsql; \
         CREATE TRIGGER conflict BEFORE INSERT ON runs FOR EACH ROW EXECUTE FUNCTION conflict();",
    );
    // Three conflicts, then it goes through: the run is there once.
    let record = RunRecord::new("r", "s.rhai", "1", "c", Mode::Sequential);
    store.create_run(record).await.unwrap();
    assert!(store.run("r").await.unwrap().is_some());
    // One that conflicts every time fails, after a bounded number of tries.
    let started = std::time::Instant::now();
    let record = RunRecord::new("never", "s.rhai", "1", "c", Mode::Sequential);
    let e = store.create_run(record).await.unwrap_err().report();
    assert!(e.contains("a conflict"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let tries: i64 = pg::cluster()
        .psql_in(&db, "SELECT last_value FROM conflicts")
        .parse()
        .unwrap();
    assert_eq!(
        tries,
        4 + 6,
        "3 conflicts and a success, then 1 try and 5 more"
    );
    assert!(store.run("never").await.unwrap().is_none());
}

/// The running runs whose lease expired (or that have none), for another process to take; not
/// a live one, a paused one or an ended one.
async fn the_runs_whose_lease_expired_are_listed(backend: &Backend) {
    let store = backend.open(Duration::from_millis(300)).await;
    create(&*store, "short", &claim("a")).await;
    let unowned = RunRecord::new("unowned", "s.rhai", "1", "c", Mode::Sequential);
    store.create_run(unowned).await.unwrap();
    create(&*store, "ended", &claim("a")).await;
    let end = StoredEnd::new(RunStatus::Completed, None, json!(null));
    store.finish_run("ended", end).await.unwrap();
    assert_eq!(store.expired_runs(10).await.unwrap(), ["unowned"]);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let mut expired = store.expired_runs(10).await.unwrap();
    expired.sort();
    assert_eq!(expired, ["short", "unowned"]);
    assert_eq!(store.expired_runs(1).await.unwrap().len(), 1);
    assert!(store.expired_runs(0).await.unwrap().is_empty());
    // Taken again, it is live.
    store
        .take_run("short", claim("b"), None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(store.expired_runs(10).await.unwrap(), ["unowned"]);
}

/// A user who may not create tables in the database is told so, and nothing is made; once the
/// database is the user's, the store is set up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_user_without_the_right_to_create_tables_is_told_so() {
    let Some(url) = pg::database("rights") else {
        return;
    };
    let cluster = pg::cluster();
    let db = pg::Cluster::db_of(&url);
    let role = format!("plain_{db}");
    cluster.psql(&format!("CREATE ROLE {role} LOGIN"));
    cluster.psql_in(&db, "REVOKE CREATE ON SCHEMA public FROM PUBLIC");
    let plain = url.replacen("postgres@", &format!("{role}@"), 1);
    let e = PostgresStore::connect(&plain).await.unwrap_err().report();
    assert!(e.contains("the right to create tables"), "{e}");
    let tables = cluster.psql_in(
        &db,
        "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'",
    );
    assert_eq!(tables, "0", "nothing was made");
    cluster.psql(&format!("ALTER DATABASE {db} OWNER TO {role}"));
    cluster.psql_in(&db, &format!("ALTER SCHEMA public OWNER TO {role}"));
    let store = PostgresStore::connect(&plain).await.unwrap();
    create(&store, "r", &claim("a")).await;
    assert!(store.run("r").await.unwrap().is_some());
}

/// A PostgreSQL store of schema 1 (before runs kept a digest of their context) is upgraded to
/// 2 when an instance connects: its runs are kept, with no context digest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_store_of_schema_1_is_upgraded_and_keeps_its_runs() {
    let Some(url) = pg::database("schema_one") else {
        return;
    };
    let store = PostgresStore::connect(&url).await.unwrap();
    let record = toolscript::RunRecord::new("r1", "s.rhai", "1", "c", toolscript::Mode::Sequential);
    store.create_run(record).await.unwrap();
    drop(store);
    let db = pg::Cluster::db_of(&url);
    let cluster = pg::cluster();
    cluster.psql_in(
        &db,
        "ALTER TABLE runs DROP COLUMN context_digest; \
         UPDATE toolscript_meta SET value = '1' WHERE key = 'schema_version'",
    );
    let store = PostgresStore::connect(&url).await.unwrap();
    let version = cluster.psql_in(
        &db,
        "SELECT value FROM toolscript_meta WHERE key = 'schema_version'",
    );
    assert_eq!(version.trim(), "2");
    let run = store.run("r1").await.unwrap().expect("the run is kept");
    assert_eq!(run.context_digest, None);
}
