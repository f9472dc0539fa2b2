//! Runs taken over after their owner went away: `serve --http --take-over` resumes the running
//! runs whose lease expired, except those started with a per-run context, which only a caller
//! that gives the same context again may resume; and three instances on one PostgreSQL store
//! finish the runs of one killed in the middle of 300, each write recorded once.

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tempfile::TempDir;
use toolscript::{
    Decision, Effect, Registry, RunOptions, RunStatus, Runtime, SqliteStore, Store, Tool,
};

use crate::serve_limits::Served;

/// A run started with a per-run context keeps a keyed digest of it (never the context): a
/// resume without it, or with another, is refused before anything is taken; the same one
/// resumes it. A run started without one is not resumed with one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_started_with_a_context_resumes_only_with_the_same_context() {
    let dir = TempDir::new().unwrap();
    let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
    let saw = Arc::clone(&seen);
    let charge = Tool::builder("charge", Effect::Write)
        .approval(toolscript::Approval::Always)
        .handler_with_context(move |_, ctx| {
            let saw = Arc::clone(&saw);
            async move {
                saw.lock()
                    .unwrap()
                    .push(ctx.context.as_deref().cloned().unwrap_or(Value::Null));
                Ok(json!("charged"))
            }
        });
    let store = Arc::new(SqliteStore::open(&dir.path().join("s.sqlite3")).unwrap());
    let runtime = Runtime::builder(Registry::builder().tool(charge).build().unwrap())
        .store(Arc::clone(&store) as Arc<dyn Store>)
        .build();
    let secret = json!({"tenant": "acme", "api_key": "sk-live-4242"});
    let with = |context: &Value| RunOptions::default().context(context.clone());

    let paused = runtime
        .run_with("charge(#{amount: 5})", with(&secret))
        .await;
    assert_eq!(paused.status(), RunStatus::Paused, "{:?}", paused.result);
    let id = paused.run_id.clone();
    let record = store.run(&id).await.unwrap().unwrap();
    let digest = record
        .context_digest
        .clone()
        .expect("a digest of the context");
    assert!(
        digest.starts_with("hmac:") && digest.len() == 5 + 64,
        "{digest}"
    );
    let bytes = std::fs::read(dir.path().join("s.sqlite3")).unwrap();
    assert!(
        !bytes.windows(12).any(|w| w == b"sk-live-4242"),
        "the store holds the context"
    );

    for (options, says) in [
        (
            RunOptions::default(),
            "only a caller that gives the same context",
        ),
        (
            with(&json!({"tenant": "acme", "api_key": "sk-other"})),
            "not the one it started with",
        ),
    ] {
        let refused = runtime
            .resume(&id, Some(Decision::Approve), options)
            .await
            .unwrap_err()
            .report();
        assert!(refused.contains(says), "{refused}");
    }
    assert!(
        seen.lock().unwrap().is_empty(),
        "a refused resume made the call"
    );
    let record = store.run(&id).await.unwrap().unwrap();
    assert_eq!(record.status, RunStatus::Paused);

    let done = runtime
        .resume(&id, Some(Decision::Approve), with(&secret))
        .await
        .unwrap();
    assert_eq!(done.status(), RunStatus::Completed, "{:?}", done.result);
    assert_eq!(*seen.lock().unwrap(), [secret.clone()]);

    let bare = runtime.run("charge(#{amount: 6})").await;
    assert_eq!(bare.status(), RunStatus::Paused);
    let refused = runtime
        .resume(&bare.run_id, Some(Decision::Approve), with(&secret))
        .await
        .unwrap_err()
        .report();
    assert!(
        refused.contains("started without a per-run context"),
        "{refused}"
    );
}

/// The script the killed owner runs: a write, a long read, a write.
const SLOW_RUN: &str =
    "record_idem(#{n: 1, seen: 0});\nlet w = wait(#{});\nrecord_idem(#{n: 2, seen: 0});\n\"done\"";

/// A `toolscript run` is killed (SIGKILL) in the middle of its run; a second run record is
/// made as a library caller with a per-run context would leave it, its owner gone too. A
/// `serve --http --take-over` on the same store finishes the first once its lease has
/// expired (each write recorded once), and leaves the second alone through many sweeps.
#[test]
fn serve_take_over_finishes_an_expired_run_and_leaves_one_with_a_context() {
    if !crate::support::node_available() {
        return;
    }
    let recorder = crate::leases::Recorder::new(0);
    let dir = recorder.dir.path();
    let manifest = dir.join("all.toml");
    std::fs::write(
        &manifest,
        format!(
            "{}\n[[tool]]\nname = \"wait\"\neffect = \"read\"\nlatency_ms = 1500\ninput = {{ type = \"object\" }}\nscript = '1'\n",
            std::fs::read_to_string(&recorder.manifest).unwrap()
        ),
    )
    .unwrap();
    let (store, script) = (dir.join("store.sqlite3"), dir.join("slow.rhai"));
    std::fs::write(&script, SLOW_RUN).unwrap();
    let m = manifest.to_str().unwrap();
    let lease = ("TOOLSCRIPT_LEASE_S", "0.5");
    let mut owner = Command::new(env!("CARGO_BIN_EXE_toolscript"))
        .args(["run", script.to_str().unwrap(), "--tools", m, "--json"])
        .arg("--store")
        .arg(&store)
        .env_remove("RUST_LOG")
        .env(lease.0, lease.1)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while recorder.records().is_empty() {
        assert!(owner.try_wait().unwrap().is_none(), "the run ended early");
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no first write"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    owner.kill().unwrap();
    owner.wait().unwrap();

    let rt = tokio::runtime::Runtime::new().unwrap();
    let sqlite = SqliteStore::open(&store).unwrap();
    let (killed, kept) = rt.block_on(async {
        let page = sqlite
            .list_runs(toolscript::RunQuery::first(10))
            .await
            .unwrap();
        assert_eq!(page.runs.len(), 1);
        let killed = page.runs[0].run_id.clone();
        // The same run as a caller with a context would have left it: its lease expires.
        let mut record = sqlite.run(&killed).await.unwrap().unwrap();
        record.run_id = "0123456789abcdef".into();
        record.context_digest = Some(format!("hmac:{}", "0".repeat(64)));
        let claim = toolscript::stores::Claim::this_process();
        record.lease = Some(toolscript::stores::Lease::new(&claim, 1, 0, 0));
        let kept = record.run_id.clone();
        SqliteStore::open(&store)
            .unwrap()
            .with_lease_ttl(Duration::from_millis(500))
            .create_run(record)
            .await
            .unwrap();
        (killed, kept)
    });

    let served = Served::start_in(
        &[lease],
        &[
            "--take-over",
            "--tools",
            m,
            "--store",
            store.to_str().unwrap(),
        ],
    );
    let status = |id: &str| {
        rt.block_on(sqlite.run(id))
            .unwrap()
            .map(|r| (r.status, r.lease.map(|l| l.token)))
    };
    let waited = Instant::now();
    while status(&killed).map(|s| s.0) != Some(RunStatus::Completed) {
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "the expired run was not taken over: {:?}\n{}",
            status(&killed),
            served.stderr().join("\n")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Six sweeps more (one every half lease): the run with a context is never taken.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(status(&kept), Some((RunStatus::Running, Some(1))));
    let record = rt.block_on(sqlite.run(&killed)).unwrap().unwrap();
    assert_eq!(
        record.outcome.as_ref().map(|o| &o["value"]),
        Some(&json!("done"))
    );
    let made: Vec<i64> = recorder
        .records()
        .iter()
        .map(|r| r["n"].as_i64().unwrap())
        .collect();
    assert_eq!(made, [1, 2], "each write once: {:?}", recorder.records());
    let stderr = served.stderr().join("\n");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
