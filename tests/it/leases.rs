//! Runs owned by leases, never by process ids: the store's leases and fencing tokens, a resume
//! refused while a lease is live (whoever and wherever its owner is), a take-over once it has
//! expired, and an owner that stalled (SIGSTOP) and lost its run making no further write.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tempfile::TempDir;
use toolscript::stores::{Claim, Fence, JournalRows, JournaledWrite, Renewed, WriteState};
use toolscript::stores::{StoredEnd, TakeRefused};
use toolscript::{
    Effect, Mode, PendingCall, Registry, RunOptions, RunRecord, RunStatus, Runtime, SqliteStore,
    Store, Tool,
};

/// A store at `dir` whose leases live `ttl`.
fn store(dir: &TempDir, ttl: Duration) -> SqliteStore {
    SqliteStore::open(&dir.path().join("store.sqlite3"))
        .unwrap()
        .with_lease_ttl(ttl)
}

/// A new run `id`, created by `claim`'s owner.
async fn created(store: &SqliteStore, id: &str, claim: &Claim) {
    let mut record = RunRecord::new(id, "s.rhai", "1", "c", Mode::Sequential);
    record.lease = Some(toolscript::stores::Lease::new(claim, 1, 0, 0));
    store.create_run(record).await.unwrap();
}

/// A journal append of the non-read call `seq`'s intent, under `fence`.
async fn append(store: &SqliteStore, id: &str, seq: u64, fence: &Fence) -> Result<(), String> {
    let write = JournaledWrite::new(seq, "put", "{}", WriteState::new(false, false, true), None);
    let mut rows = JournalRows::new(vec![write], Vec::new());
    rows.fence = Some(fence.clone());
    store.append(id, rows).await.map_err(|e| e.report())
}

fn lease_of(record: &RunRecord) -> toolscript::stores::Lease {
    record.lease.clone().expect("the run has a lease")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_grows_with_each_take_over_and_a_live_lease_is_refused() {
    let dir = TempDir::new().unwrap();
    let store = store(&dir, Duration::from_millis(300));
    let (a, b, c) = (
        Claim::new("owner-a", "host-a"),
        Claim::new("owner-b", "host-b"),
        Claim::new("owner-c", "host-c"),
    );
    created(&store, "r", &a).await;
    let held = lease_of(&store.run("r").await.unwrap().unwrap());
    assert_eq!(
        (held.owner.as_str(), held.host.as_str(), held.token),
        ("owner-a", "host-a", 1)
    );
    assert!(held.is_live(), "{held:?}");

    // While a's lease lives, nobody takes the run: not b, not a itself from elsewhere.
    for claim in [&b, &a] {
        match store.take_run("r", claim.clone(), None).await.unwrap() {
            Err(TakeRefused::Busy(lease)) => assert_eq!(lease, held),
            other => panic!("a live lease was taken: {other:?}"),
        }
    }
    // Only the owner itself, saying it no longer runs the run, takes its own live lease.
    assert!(matches!(
        store
            .take_run("r", b.clone().retaking_own(), None)
            .await
            .unwrap(),
        Err(TakeRefused::Busy(_))
    ));
    // An owner that stalled past its lease, with nobody taking the run meanwhile, renews it
    // and goes on: expiry alone fences nothing, a take-over does.
    tokio::time::sleep(Duration::from_millis(350)).await;
    match store
        .renew_lease("r", &Fence::new("owner-a", 1))
        .await
        .unwrap()
    {
        Renewed::Kept(lease) => assert!(lease.is_live() && lease.token == 1),
        other => panic!("{other:?}"),
    }
    let retaken = store
        .take_run("r", a.clone().retaking_own(), None)
        .await
        .unwrap();
    let retaken = lease_of(&retaken.expect("an owner retakes its own lease"));
    assert_eq!((retaken.owner.as_str(), retaken.token), ("owner-a", 2));
    let held = retaken;

    // Once it expired, b takes it with the next token; then c, once b's expired, with one more.
    tokio::time::sleep(Duration::from_millis(350)).await;
    let taken = store.take_run("r", b.clone(), None).await.unwrap().unwrap();
    let lease_b = lease_of(&taken);
    assert_eq!(
        (lease_b.owner.as_str(), lease_b.token),
        ("owner-b", held.token + 1)
    );
    assert!(lease_b.is_live());
    assert_eq!(lease_of(&store.run("r").await.unwrap().unwrap()), lease_b);
    tokio::time::sleep(Duration::from_millis(350)).await;
    let lease_c = lease_of(&store.take_run("r", c, None).await.unwrap().unwrap());
    assert_eq!(
        (lease_c.owner.as_str(), lease_c.token),
        ("owner-c", held.token + 2)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_token_writes_nothing_once_a_newer_owner_took_the_run() {
    let dir = TempDir::new().unwrap();
    let store = store(&dir, Duration::from_millis(200));
    let (a, b) = (
        Claim::new("owner-a", "host-a"),
        Claim::new("owner-b", "host-b"),
    );
    created(&store, "r", &a).await;
    let stale = Fence::new("owner-a", 1);
    append(&store, "r", 1, &stale)
        .await
        .expect("the owner writes");
    tokio::time::sleep(Duration::from_millis(250)).await;
    let taken = store.take_run("r", b.clone(), None).await.unwrap().unwrap();
    let fresh = lease_of(&taken).fence();
    assert_eq!(fresh, Fence::new("owner-b", 2));

    // Every write of the stale owner is refused, saying who took the run and that it stops.
    let refused = append(&store, "r", 2, &stale).await.unwrap_err();
    assert!(
        refused.contains("was taken over by owner-b on host-b at "),
        "{refused}"
    );
    assert!(refused.contains("this process stops"), "{refused}");
    let end = StoredEnd::new(RunStatus::Completed, None, json!({})).fenced(Some(stale.clone()));
    let refused = store.finish_run("r", end).await.unwrap_err().report();
    assert!(refused.contains("taken over by owner-b"), "{refused}");
    match store.renew_lease("r", &stale).await.unwrap() {
        Renewed::TakenOver(now) => assert_eq!(now.token, 2),
        other => panic!("a stale lease was renewed: {other:?}"),
    }
    // The stale owner cannot take the run back while the new lease lives either.
    assert!(matches!(
        store.take_run("r", a, None).await.unwrap(),
        Err(TakeRefused::Busy(_))
    ));
    let journal = store.load_journal("r").await.unwrap();
    assert_eq!(journal.writes.len(), 1, "the refused intent left no row");
    let record = store.run("r").await.unwrap().unwrap();
    assert_eq!(
        record.status,
        RunStatus::Running,
        "the refused end changed nothing"
    );

    // The new owner writes and ends the run; its lease is let go, its token kept.
    append(&store, "r", 2, &fresh).await.unwrap();
    let end = StoredEnd::new(RunStatus::Completed, None, json!({})).fenced(Some(fresh));
    store.finish_run("r", end).await.unwrap();
    let lease = lease_of(&store.run("r").await.unwrap().unwrap());
    assert_eq!(lease.token, 2);
    assert!(
        !lease.is_live(),
        "an ended run holds no live lease: {lease:?}"
    );

    // A run removed from the store takes no fenced write: its owner stops.
    let rule = toolscript::PruneRule::default();
    assert_eq!(toolscript::prune(&store, rule).await.unwrap().runs, 1);
    let refused = append(&store, "r", 3, &Fence::new("owner-b", 2))
        .await
        .unwrap_err();
    assert!(refused.contains("is no longer in the store"), "{refused}");
    assert!(store.load_journal("r").await.unwrap().writes.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_keeps_a_lease_and_a_pause_lets_it_go() {
    let dir = TempDir::new().unwrap();
    let store = store(&dir, Duration::from_millis(300));
    let (a, b) = (
        Claim::new("owner-a", "host-a"),
        Claim::new("owner-b", "host-b"),
    );
    created(&store, "r", &a).await;
    let fence = Fence::new("owner-a", 1);
    // Renewed every 100 ms for a second, three times its time to live: never taken.
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(1) {
        match store.renew_lease("r", &fence).await.unwrap() {
            Renewed::Kept(lease) => assert!(lease.is_live() && lease.token == 1),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            store.take_run("r", b.clone(), None).await.unwrap(),
            Err(TakeRefused::Busy(_))
        ));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A pause lets the lease go: there is nothing left to renew, and a decision takes the
    // run at once, with the next token.
    let pending = PendingCall::new(
        1,
        "put",
        Effect::Write,
        json!({}),
        toolscript::Awaiting::Approval,
    );
    let end = StoredEnd::new(RunStatus::Paused, Some(pending.clone()), json!({}))
        .fenced(Some(fence.clone()));
    store.finish_run("r", end).await.unwrap();
    assert_eq!(
        store.renew_lease("r", &fence).await.unwrap(),
        Renewed::Released
    );
    let decision =
        toolscript::stores::TakeDecision::on(&pending, toolscript::stores::Verdict::Approve);
    let taken = store
        .take_run("r", b, Some(decision))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(lease_of(&taken).token, 2);
}

/// A store of schema 7, whose running run names its owner by a process id: this very
/// process's, alive. The id is not read: the run has no lease, which counts as expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_of_schema_7_is_migrated_and_its_pid_owner_is_ignored() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("store.sqlite3");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(&format!(
            "CREATE TABLE runs (run_id TEXT PRIMARY KEY, script_name TEXT NOT NULL, \
             script TEXT NOT NULL, catalog_sha256 TEXT NOT NULL, mode TEXT NOT NULL, \
             status TEXT NOT NULL, owner_pid INTEGER, started_ms INTEGER NOT NULL, \
             updated_ms INTEGER NOT NULL, pending TEXT, outcome TEXT, input TEXT, catalog TEXT, \
             input_artifact TEXT); \
             INSERT INTO runs VALUES ('old', 's.rhai', '1', 'c', 'sequential', 'running', {}, \
             1, 1, NULL, NULL, NULL, NULL, NULL); \
             PRAGMA user_version = 7; PRAGMA application_id = {};",
            std::process::id(),
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
    assert_eq!((old.status, old.lease.clone()), (RunStatus::Running, None));
    let taken = store
        .take_run("old", Claim::new("me", "here"), None)
        .await
        .unwrap()
        .expect("a run without a lease is taken, whatever pid it names");
    assert_eq!(lease_of(&taken).token, 1);
}

/// A run held by an owner elsewhere (another machine, another PID namespace: the store knows
/// only its lease) is refused to a resume, from the library and the command line, with the
/// owner and when its lease expires; no process id is looked at.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_of_a_live_run_is_refused_with_its_owner_and_expiry() {
    let dir = TempDir::new().unwrap();
    let store = store(&dir, Duration::from_secs(30));
    created(&store, "r", &Claim::new("owner-elsewhere", "box-2")).await;
    let expires = lease_of(&store.run("r").await.unwrap().unwrap()).expires_ms;
    assert!(expires > now_ms() + 20_000);

    let registry = Registry::builder().build().unwrap();
    let runtime = Runtime::builder(registry).store(Arc::new(store)).build();
    let refused = runtime
        .resume("r", None, RunOptions::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        refused.contains("still running, held by owner-elsewhere on box-2 (fencing token 1)"),
        "{refused}"
    );
    assert!(refused.contains("a lease that expires at 20"), "{refused}");

    let out = toolscript(&["resume", "r"], &dir.path().join("store.sqlite3"), &[]);
    assert_ne!(out.status.code(), Some(0));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("held by owner-elsewhere on box-2"),
        "{stderr}"
    );
    assert!(stderr.contains("expires at"), "{stderr}");

    // The list of runs says who holds it; once the lease has expired, that a resume takes it.
    let path = dir.path().join("store.sqlite3");
    let listed: Value =
        serde_json::from_slice(&toolscript(&["runs", "--json"], &path, &[]).stdout).unwrap();
    let lease = &listed[0]["lease"];
    assert_eq!(
        (
            &lease["owner"],
            &lease["host"],
            &lease["token"],
            &lease["live"]
        ),
        (
            &json!("owner-elsewhere"),
            &json!("box-2"),
            &json!(1),
            &json!(true)
        ),
        "{listed}"
    );
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute("UPDATE runs SET lease_expires_ms = 1", [])
        .unwrap();
    let table = toolscript(&["runs"], &path, &[]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("lease expired at 1970-01-01T00:00:00Z: resume it to go on"),
        "{table}"
    );
}

/// What a tool saw: the run its token is for, and the token.
type Fenced = (Option<String>, Option<u64>);

/// A tool sees the run's fencing token: 1 for a new run, one more after each take-over; a run
/// without a store has none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fencing_token_reaches_the_tool() {
    let dir = TempDir::new().unwrap();
    let seen: Arc<Mutex<Vec<Fenced>>> = Arc::default();
    let registry = || {
        let seen = Arc::clone(&seen);
        let tool = Tool::builder("put", Effect::Write)
            .approval(toolscript::Approval::Always)
            .handler_with_context(move |_, ctx| {
                let seen = Arc::clone(&seen);
                async move {
                    let run = ctx.fenced_run().map(str::to_string);
                    seen.lock().unwrap().push((run, ctx.fencing_token()));
                    Ok(json!(1))
                }
            });
        Registry::builder().tool(tool).build().unwrap()
    };
    let runtime = Runtime::builder(registry())
        .store(Arc::new(store(&dir, Duration::from_secs(5))))
        .build();
    let paused = runtime.run("put(#{})").await;
    assert_eq!(paused.status(), RunStatus::Paused);
    let id = paused.run_id.clone();
    let done = runtime
        .resume(
            &id,
            Some(toolscript::Decision::Approve),
            RunOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(done.status(), RunStatus::Completed);
    assert_eq!(*seen.lock().unwrap(), [(Some(id.clone()), Some(2))]);

    let bare = Runtime::builder(registry()).build();
    let paused = bare.run("put(#{})").await;
    assert_ne!(paused.status(), RunStatus::Completed);
    assert_eq!(
        seen.lock().unwrap().len(),
        1,
        "a run without a store makes no gated call"
    );
}

/// A script tool sees the token as `ctx.fencing_token`: 1 in a new durable run, `()` (null)
/// in a run without a store.
#[test]
fn a_script_tool_sees_the_fencing_token() {
    let dir = TempDir::new().unwrap();
    let manifest = dir.path().join("m.toml");
    std::fs::write(
        &manifest,
        "[[tool]]\nname = \"token\"\neffect = \"write\"\nscript = 'ctx.fencing_token'\n",
    )
    .unwrap();
    let script = dir.path().join("s.rhai");
    std::fs::write(&script, "token(#{})").unwrap();
    let (m, s) = (manifest.to_str().unwrap(), script.to_str().unwrap());
    let store = dir.path().join("store.sqlite3");
    let durable = toolscript(&["run", s, "--tools", m, "--json"], &store, &[]);
    let value: Value = serde_json::from_slice(&durable.stdout).unwrap();
    assert_eq!(value["value"], 1, "{value}");
    let bare = Command::new(env!("CARGO_BIN_EXE_toolscript"))
        .args(["run", s, "--tools", m, "--json", "--no-store"])
        .output()
        .unwrap();
    let value: Value = serde_json::from_slice(&bare.stdout).unwrap();
    assert_eq!(value["value"], Value::Null, "{value}");
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// `toolscript ARGS --store STORE`, with `env`, to its end.
fn toolscript(args: &[&str], store: &Path, env: &[(&str, &str)]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_toolscript"))
        .args(args)
        .arg("--store")
        .arg(store)
        .env_remove("RUST_LOG")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("toolscript runs")
}

/// A recording MCP server (tests/fixtures/recorder.js) whose writes take `delay_ms` before
/// they are recorded; its manifest and its records.
pub(crate) struct Recorder {
    pub(crate) dir: TempDir,
    pub(crate) manifest: PathBuf,
    records: PathBuf,
}

impl Recorder {
    pub(crate) fn new(delay_ms: u64) -> Recorder {
        let dir = TempDir::new().unwrap();
        let records = dir.path().join("records");
        let server = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/recorder.js");
        let quoted = |p: &Path| serde_json::to_string(p.to_str().unwrap()).unwrap();
        let manifest = dir.path().join("recorder.toml");
        std::fs::write(
            &manifest,
            format!(
                "[[mcp]]\nname = \"recorder\"\ncommand = [\"node\", {}]\nenv = {{ RECORD_FILE = {}, PID_FILE = {}, WRITE_DELAY_MS = \"{delay_ms}\" }}\n",
                quoted(&server),
                quoted(&records),
                quoted(&dir.path().join("pids")),
            ),
        )
        .unwrap();
        Recorder {
            dir,
            manifest,
            records,
        }
    }

    pub(crate) fn records(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.records)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// The seq of a non-read call whose intent is journaled and whose outcome is not, if any.
fn call_under_way(store: &Path) -> Option<i64> {
    let conn = rusqlite::Connection::open(store).ok()?;
    conn.busy_timeout(Duration::from_secs(5)).ok()?;
    conn.query_row(
        "SELECT seq FROM writes WHERE intent = 1 AND outcome IS NULL",
        [],
        |r| r.get(0),
    )
    .ok()
}

/// Stops `pid` (SIGSTOP) at a moment it holds no write lock on the store: a process stopped
/// inside a commit (a renewal, say) keeps SQLite's write lock until it goes on or dies, and a
/// lease cannot break a lock (docs/durable.md says so). Stopped inside one, it is continued and
/// stopped again a moment later.
fn stop_outside_a_commit(pid: u32, store: &Path) {
    let conn = rusqlite::Connection::open(store).unwrap();
    conn.busy_timeout(Duration::ZERO).unwrap();
    for _ in 0..50 {
        signal("-STOP", pid);
        // Whatever it was doing, it is stopped now: the lock is free, or it holds it.
        std::thread::sleep(Duration::from_millis(20));
        if conn.execute_batch("BEGIN IMMEDIATE; ROLLBACK;").is_ok() {
            return;
        }
        signal("-CONT", pid);
        std::thread::sleep(Duration::from_millis(7));
    }
    panic!("the owner held the store's write lock every time it was stopped");
}

/// Sends `signal` to `pid`.
fn signal(signal: &str, pid: u32) {
    let sent = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success(), "kill {signal} {pid}");
}

/// A `toolscript run` making six writes through a slow recording server is stopped (SIGSTOP)
/// while a write is under way. A resume is refused while its lease lives, then takes the run
/// once it has expired, asks whether the write under way took effect (it did), and completes
/// the run. The stopped owner, continued, learns it lost the run and makes no further write:
/// every write is recorded once, each with the fencing token of the owner that made it.
#[test]
fn a_stopped_owner_loses_its_run_and_never_writes_again() {
    let recorder = Recorder::new(1000);
    let dir = recorder.dir.path();
    let (store, script) = (dir.join("store.sqlite3"), dir.join("six.rhai"));
    std::fs::write(&script, "for i in 1..7 { record(#{n: i, seen: 0}); } 7").unwrap();
    let m = recorder.manifest.to_str().unwrap();
    let lease = [("TOOLSCRIPT_LEASE_S", "0.5")];
    let mut owner = Command::new(env!("CARGO_BIN_EXE_toolscript"))
        .args(["run", script.to_str().unwrap(), "--tools", m, "--json"])
        .arg("--store")
        .arg(&store)
        .env_remove("RUST_LOG")
        .envs(lease)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Stopped while the third write (seq 2) is in the server's hands (its intent journaled,
    // its record a second away).
    let started = Instant::now();
    while call_under_way(&store) != Some(2) {
        assert!(owner.try_wait().unwrap().is_none(), "the run ended early");
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no second write"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(200));
    stop_outside_a_commit(owner.id(), &store);
    let stopped = Instant::now();
    let run_id = {
        let out = toolscript(&["runs", "--json"], &store, &[]);
        let runs: Value = serde_json::from_slice(&out.stdout).unwrap();
        runs[0]["run_id"].as_str().unwrap().to_string()
    };

    // While the stopped owner's lease lives, a resume is refused, naming it.
    let refused = toolscript(&["resume", &run_id, "--tools", m, "--json"], &store, &lease);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_ne!(refused.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("still running, held by "), "{stderr}");
    assert!(stderr.contains("(fencing token 1)"), "{stderr}");

    // Once it has expired (and the write the owner started has landed), a resume takes the
    // run: the third write's outcome is lost, so it asks; the write did take effect.
    while recorder.records().len() < 3 {
        assert!(
            stopped.elapsed() < Duration::from_secs(30),
            "write 3 never landed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(700).saturating_sub(stopped.elapsed()));
    let asked = toolscript(&["resume", &run_id, "--tools", m, "--json"], &store, &lease);
    let stderr = String::from_utf8_lossy(&asked.stderr);
    assert_eq!(asked.status.code(), Some(3), "{stderr}");
    let paused: Value = serde_json::from_slice(&asked.stdout).unwrap();
    assert_eq!(paused["pending"]["awaiting"], "resolve", "{paused}");
    assert_eq!(paused["pending"]["seq"], 2, "{paused}");
    let done = toolscript(
        &[
            "resume",
            &run_id,
            "--resolve",
            "done",
            "--tools",
            m,
            "--json",
        ],
        &store,
        &lease,
    );
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert_eq!(done.status.code(), Some(0), "{stderr}");
    let ended: Value = serde_json::from_slice(&done.stdout).unwrap();
    assert_eq!(ended["value"], 7, "{ended}");

    // The stopped owner, continued, finds its run taken and stops without a write.
    signal("-CONT", owner.id());
    let out = owner.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("was taken over by "), "{stderr}");
    std::thread::sleep(Duration::from_millis(1500));
    let records = recorder.records();
    let made: Vec<i64> = records.iter().map(|r| r["n"].as_i64().unwrap()).collect();
    assert_eq!(made, [1, 2, 3, 4, 5, 6], "every write once: {records:#?}");
    // The token each write carried: the first owner's (1) for the writes it made, the
    // settling resume's (3: the refused resume took nothing, the asking one took 2) after.
    let tokens: Vec<i64> = records
        .iter()
        .map(|r| r["fence"]["token"].as_i64().unwrap())
        .collect();
    assert_eq!(tokens, [1, 1, 1, 3, 3, 3], "{records:#?}");
    assert!(records.iter().all(|r| r["fence"]["run"] == run_id.as_str()));
    let status = toolscript(&["runs", "--json"], &store, &[]);
    let runs: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(runs[0]["status"], "completed", "{runs}");
}

/// A resume started in another PID namespace (as another container on the same store file
/// would be), where the owner's process id names nothing, is refused while the owner runs the
/// run: the store's lease says it is held, whatever `/proc` shows there. The run then completes
/// in its owner, each write made once. (Without `unshare`, or without the right to use it, the
/// resume runs as a plain process: the lease is judged the same way.)
#[test]
fn a_resume_from_another_pid_namespace_is_refused_while_the_owner_runs() {
    let recorder = Recorder::new(1500);
    let dir = recorder.dir.path();
    let (store, script) = (dir.join("store.sqlite3"), dir.join("two.rhai"));
    std::fs::write(
        &script,
        "record(#{n: 1, seen: 0}); record(#{n: 2, seen: 0}); 2",
    )
    .unwrap();
    let m = recorder.manifest.to_str().unwrap();
    let owner = Command::new(env!("CARGO_BIN_EXE_toolscript"))
        .args(["run", script.to_str().unwrap(), "--tools", m, "--json"])
        .arg("--store")
        .arg(&store)
        .env_remove("RUST_LOG")
        .envs([("TOOLSCRIPT_LEASE_S", "0.5")])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while call_under_way(&store).is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no write began"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    // Past several lease times: the owner renews it all along.
    std::thread::sleep(Duration::from_millis(800));
    let run_id = {
        let out = toolscript(&["runs", "--json"], &store, &[]);
        let runs: Value = serde_json::from_slice(&out.stdout).unwrap();
        runs[0]["run_id"].as_str().unwrap().to_string()
    };
    let resume = [
        env!("CARGO_BIN_EXE_toolscript"),
        "resume",
        &run_id,
        "--tools",
        m,
        "--store",
        store.to_str().unwrap(),
    ];
    let isolated = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc"])
        .args(resume)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output();
    let out = match isolated {
        Ok(out) if !String::from_utf8_lossy(&out.stderr).contains("unshare failed") => out,
        _ => {
            eprintln!("unshare is not available here: the resume runs as a plain process");
            Command::new(resume[0])
                .args(&resume[1..])
                .env_remove("RUST_LOG")
                .stdin(Stdio::null())
                .output()
                .unwrap()
        }
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "a refused resume: {stderr}");
    assert!(stderr.contains("still running, held by "), "{stderr}");
    assert!(
        stderr.contains("under a lease that expires at "),
        "{stderr}"
    );

    let ran = owner.wait_with_output().unwrap();
    let stdout: Value = serde_json::from_slice(&ran.stdout).unwrap();
    assert_eq!(stdout["value"], 2, "{stdout}");
    let made: Vec<i64> = recorder
        .records()
        .iter()
        .map(|r| r["n"].as_i64().unwrap())
        .collect();
    assert_eq!(made, [1, 2], "each write once, by the owner alone");
}

/// A lease's time to live that is not a number of seconds is refused before anything runs,
/// naming where it came from; fractions are taken.
#[test]
fn a_bad_lease_time_is_refused_naming_where_it_came_from() {
    let dir = TempDir::new().unwrap();
    let store = dir.path().join("store.sqlite3");
    let script = dir.path().join("s.rhai");
    std::fs::write(&script, "40 + 2").unwrap();
    let s = script.to_str().unwrap();
    for (args, env, named) in [
        (vec!["run", s, "--lease-s", "soon"], None, "--lease-s:"),
        (vec!["run", s, "--lease-s=-1"], None, "--lease-s:"),
        (vec!["run", s], Some("0"), "$TOOLSCRIPT_LEASE_S:"),
        (vec!["resume", "r"], Some("1e12"), "$TOOLSCRIPT_LEASE_S:"),
    ] {
        let env: Vec<(&str, &str)> = env.map(|v| ("TOOLSCRIPT_LEASE_S", v)).into_iter().collect();
        let out = toolscript(&args, &store, &env);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(named), "{args:?}: {stderr}");
        assert!(
            stderr.contains("seconds from 0.1 to 86400"),
            "{args:?}: {stderr}"
        );
    }
    let ok = toolscript(&["run", s, "--lease-s", "0.5", "--json"], &store, &[]);
    let value: Value = serde_json::from_slice(&ok.stdout).unwrap();
    assert_eq!(value["value"], 42, "{value}");
}
