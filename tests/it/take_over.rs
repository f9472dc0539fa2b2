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
    assert_eq!(*seen.lock().unwrap(), std::slice::from_ref(&secret));

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

/// A recording server (its writes at once) and a manifest with its tools and `wait`, a read
/// of 1.5 s: the tools of [`SLOW_RUN`].
fn slow_run_tools() -> (crate::leases::Recorder, std::path::PathBuf) {
    let recorder = crate::leases::Recorder::new(0);
    let manifest = recorder.dir.path().join("all.toml");
    std::fs::write(
        &manifest,
        format!(
            "{}\n[[tool]]\nname = \"wait\"\neffect = \"read\"\nlatency_ms = 1500\ninput = {{ type = \"object\" }}\nscript = '1'\n",
            std::fs::read_to_string(&recorder.manifest).unwrap()
        ),
    )
    .unwrap();
    (recorder, manifest)
}

/// The `n` of each write the recorder holds, in the order recorded.
fn written(recorder: &crate::leases::Recorder) -> Vec<i64> {
    recorder
        .records()
        .iter()
        .map(|r| r["n"].as_i64().unwrap())
        .collect()
}

/// A `toolscript run` is killed (SIGKILL) in the middle of its run; a second run record is
/// made as a library caller with a per-run context would leave it, its owner gone too. A
/// `serve --http --take-over` on the same store finishes the first once its lease has
/// expired (each write recorded once), and leaves the second alone through many sweeps.
#[test]
fn serve_take_over_finishes_an_expired_run_and_leaves_one_with_a_context() {
    if !crate::support::node_available() {
        return;
    }
    let (recorder, manifest) = slow_run_tools();
    let dir = recorder.dir.path();
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
    assert_eq!(
        written(&recorder),
        [1, 2],
        "each write once: {:?}",
        recorder.records()
    );
    let stderr = served.stderr().join("\n");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// What each client of [`load`] got: its answer (the structured content), or why it has none,
/// and how long it waited.
struct Answered {
    answer: Result<Value, String>,
    took: Duration,
}

/// One `run_script` of `script` with `input` on `addr`, on a fresh connection: the answer's
/// structured content, or why there is none (the server went away).
fn run_on(addr: &str, script: &str, input: Value) -> Result<Value, String> {
    call_on(
        addr,
        None,
        "run_script",
        json!({"script": script, "input": input}),
    )
}

/// One call of the server's `tool` with `arguments` on `addr` (with the bearer `token`, if
/// any), on a fresh connection: the answer's structured content (or its text, for an error
/// without one), or why there is none.
fn call_on(addr: &str, token: Option<&str>, tool: &str, arguments: Value) -> Result<Value, String> {
    use std::io::{Read, Write};
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                      "params": {"name": tool, "arguments": arguments}})
    .to_string();
    let mut stream = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(300)))
        .map_err(|e| e.to_string())?;
    let bearer = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let head = format!(
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nConnection: close\r\n{bearer}\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    stream
        .write_all(head.as_bytes())
        .and_then(|()| stream.write_all(body.as_bytes()))
        .map_err(|e| e.to_string())?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .map_err(|e| e.to_string())?;
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no whole answer: {response:?}"))?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!("{head}\n{body}"));
    }
    let json: Value = serde_json::from_str(body).map_err(|e| format!("{e}: {body}"))?;
    let result = &json["result"];
    Ok(match result.get("structuredContent") {
        Some(structured) => structured.clone(),
        None => result["content"][0]["text"].clone(),
    })
}

/// `runs` clients at once, client `n` running `script` with input `{n}` on the instance
/// `n % addrs.len()`, while `during` runs on this thread; each client's answer, in order.
fn load(addrs: &[String], runs: usize, script: &str, during: impl FnOnce()) -> Vec<Answered> {
    std::thread::scope(|scope| {
        let clients: Vec<_> = (0..runs)
            .map(|n| {
                let addr = &addrs[n % addrs.len()];
                scope.spawn(move || {
                    let started = Instant::now();
                    let answer = run_on(addr, script, json!({"n": n}));
                    Answered {
                        answer,
                        took: started.elapsed(),
                    }
                })
            })
            .collect();
        during();
        clients.into_iter().map(|c| c.join().unwrap()).collect()
    })
}

/// Runs per second over the whole load, and the median and 99th percentile of the clients'
/// waits, in milliseconds.
fn figures(answers: &[Answered], wall: Duration) -> (f64, f64, f64) {
    let mut waits: Vec<f64> = answers
        .iter()
        .filter(|a| a.answer.is_ok())
        .map(|a| a.took.as_secs_f64() * 1000.0)
        .collect();
    waits.sort_by(f64::total_cmp);
    let at = |q: f64| waits[((waits.len() - 1) as f64 * q).round() as usize];
    (answers.len() as f64 / wall.as_secs_f64(), at(0.5), at(0.99))
}

/// Each run makes three writes through the recording server, keyed by its input.
const THREE_WRITES: &str =
    "for i in 0..3 { record_idem(#{n: input.n * 10 + i, seen: 0}); }\ninput.n";

/// `count` instances of `serve --http --take-over` on `store` with the tools of `manifest`.
fn instances(count: usize, manifest: &std::path::Path, store: &str) -> Vec<Served> {
    let m = manifest.to_str().unwrap();
    (0..count)
        .map(|_| {
            Served::start_in(
                &[("TOOLSCRIPT_LEASE_S", "2")],
                &[
                    "--take-over",
                    "--max-connections-per-peer",
                    "1000",
                    "--tools",
                    m,
                    "--store",
                    store,
                ],
            )
        })
        .collect()
}

/// Three `serve --http --take-over` instances on one PostgreSQL store, 300 clients at once
/// (100 on each), each run making three writes through a recording server that honours
/// idempotency keys; one instance is killed (SIGKILL) once a quarter of the writes are made.
/// The clients of the others all get their answer; the killed instance's runs are finished by
/// the others once their leases expire (a client that lost its answer finds its run done; one
/// whose run was never recorded runs it again elsewhere); every run completes, once, and every
/// write is recorded once.
#[test]
fn three_instances_on_postgres_finish_the_runs_of_one_killed_mid_way() {
    let Some(url) = crate::pg::database("three_instances") else {
        return;
    };
    if !crate::support::node_available() {
        return;
    }
    const RUNS: usize = 300;
    let recorder = crate::leases::Recorder::new(20);
    let mut served = instances(3, &recorder.manifest, &url);
    let addrs: Vec<String> = served.iter().map(|s| s.addr.clone()).collect();
    let killed_at = Mutex::new(None);
    let answers = load(&addrs, RUNS, THREE_WRITES, || {
        let started = Instant::now();
        while recorder.records().len() < RUNS * 3 / 4 {
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "the writes stalled"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        served[0].kill();
        *killed_at.lock().unwrap() = Some(recorder.records().len());
    });
    let killed_at = killed_at.into_inner().unwrap().unwrap();

    // The survivors' clients all got their answer.
    for (n, a) in answers.iter().enumerate().filter(|(n, _)| n % 3 != 0) {
        let answer = a
            .answer
            .as_ref()
            .unwrap_or_else(|e| panic!("client {n}: {e}"));
        assert_eq!(answer["status"], "completed", "client {n}: {answer}");
        assert_eq!(answer["value"], n, "client {n}: {answer}");
    }
    let lost: Vec<usize> = (0..RUNS).filter(|n| answers[*n].answer.is_err()).collect();
    assert!(
        !lost.is_empty(),
        "the kill came after every run of the instance ended"
    );

    let rt = tokio::runtime::Runtime::new().unwrap();
    let store = rt
        .block_on(toolscript::PostgresStore::connect(&url))
        .unwrap();
    // Every run ends: the killed instance's are taken over once their lease expires.
    let all_runs = || {
        rt.block_on(async {
            let mut runs = Vec::new();
            let mut query = toolscript::RunQuery::first(200);
            loop {
                let page = store.list_runs(query.clone()).await.unwrap();
                for run in &page.runs {
                    runs.push(store.run(&run.run_id).await.unwrap().unwrap());
                }
                match page.next {
                    Some(next) => query = query.after(Some(next)),
                    None => return runs,
                }
            }
        })
    };
    let waited = Instant::now();
    loop {
        let running = all_runs()
            .iter()
            .filter(|r| r.status == RunStatus::Running)
            .count();
        if running == 0 {
            break;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(120),
            "{running} runs never ended:\n{}\n{}",
            served[1].stderr().join("\n"),
            served[2].stderr().join("\n")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // A client that lost its answer looks for its run; one never recorded runs again.
    let recorded: Vec<i64> = all_runs()
        .iter()
        .map(|r| r.input.as_ref().unwrap()["n"].as_i64().unwrap())
        .collect();
    // A client that lost its answer gets it from another instance by the run's id.
    let by_input: std::collections::BTreeMap<i64, String> = all_runs()
        .iter()
        .map(|r| {
            (
                r.input.as_ref().unwrap()["n"].as_i64().unwrap(),
                r.run_id.clone(),
            )
        })
        .collect();
    let some_lost = lost
        .iter()
        .find_map(|n| by_input.get(&(*n as i64)).map(|id| (n, id)));
    if let Some((n, run_id)) = some_lost {
        let answer = call_on(&addrs[2], None, "resume_run", json!({"run_id": run_id})).unwrap();
        assert_eq!(answer["status"], "completed", "{answer}");
        assert_eq!(answer["value"], *n, "{answer}");
        assert!(answer.get("stats").is_none(), "{answer}");
    }
    let mut again = 0;
    for n in &lost {
        if !recorded.contains(&(*n as i64)) {
            let answer = run_on(&addrs[1], THREE_WRITES, json!({"n": n})).unwrap();
            assert_eq!(answer["status"], "completed", "client {n} again: {answer}");
            again += 1;
        }
    }

    let runs = all_runs();
    let mut inputs: Vec<i64> = runs
        .iter()
        .map(|r| r.input.as_ref().unwrap()["n"].as_i64().unwrap())
        .collect();
    inputs.sort_unstable();
    assert_eq!(
        inputs,
        (0..RUNS as i64).collect::<Vec<_>>(),
        "one run per client"
    );
    for run in &runs {
        assert_eq!(
            run.status,
            RunStatus::Completed,
            "{}: {:?}",
            run.run_id,
            run.outcome
        );
        let n = &run.input.as_ref().unwrap()["n"];
        assert_eq!(run.outcome.as_ref().map(|o| &o["value"]), Some(n));
    }
    let records = recorder.records();
    let mut made: Vec<i64> = records.iter().map(|r| r["n"].as_i64().unwrap()).collect();
    made.sort_unstable();
    let expected: Vec<i64> = (0..RUNS as i64)
        .flat_map(|n| (0..3).map(move |i| n * 10 + i))
        .collect();
    assert_eq!(made, expected, "every write recorded once");
    let taken_over = runs
        .iter()
        .filter(|r| r.lease.as_ref().is_some_and(|l| l.token > 1))
        .count();
    eprintln!(
        "killed after {killed_at} of {} writes: {} answers lost, {taken_over} runs taken over, \
         {again} never recorded and run again",
        RUNS * 3,
        lost.len()
    );
    assert!(taken_over > 0, "no run was taken over");
}

/// The figures of BENCHMARKS.md "Several instances": 300 clients at once, each run three
/// writes, on three instances over one PostgreSQL store and on one instance over SQLite; the
/// writes go through the recording server (which syncs its file at each), or to a script tool
/// of 20 ms in the instance. `cargo test --release --test it -- --ignored take_over::figures
/// --nocapture`.
#[test]
#[ignore = "a benchmark: its figures go in BENCHMARKS.md"]
fn figures_three_postgres_instances_against_one_sqlite() {
    let Some(url) = crate::pg::database("figures") else {
        return;
    };
    const RUNS: usize = 300;
    let recorder = crate::leases::Recorder::new(20);
    let put = recorder.dir.path().join("put.toml");
    std::fs::write(
        &put,
        "[[tool]]\nname = \"put\"\neffect = \"write\"\nlatency_ms = 20\ninput = { type = \"object\" }\nscript = 'args.n'\n",
    )
    .unwrap();
    let put_script = "for i in 0..3 { put(#{n: input.n * 10 + i}); }\ninput.n";
    let sqlite = recorder.dir.path().join("store.sqlite3");
    for (tools, manifest, script) in [
        ("the recorder", &recorder.manifest, THREE_WRITES),
        ("a script tool", &put, put_script),
    ] {
        for (name, store, count) in [
            ("1 instance, SQLite", sqlite.to_str().unwrap(), 1),
            ("3 instances, PostgreSQL", url.as_str(), 3),
        ] {
            let served = instances(count, manifest, store);
            let addrs: Vec<String> = served.iter().map(|s| s.addr.clone()).collect();
            let started = Instant::now();
            let answers = load(&addrs, RUNS, script, || {});
            let wall = started.elapsed();
            assert!(
                answers.iter().all(|a| a.answer.is_ok()),
                "{name}: a client failed"
            );
            let (rate, p50, p99) = figures(&answers, wall);
            eprintln!(
                "{tools}, {name}: {RUNS} runs in {wall:.2?}: {rate:.0} runs/s, p50 {p50:.0} ms, p99 {p99:.0} ms"
            );
        }
    }
}

/// A store of schema 10 (before runs kept a digest of their context) is upgraded in place: its
/// runs have no context digest, and one paused there resumes without a context.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_of_schema_10_is_upgraded_and_its_runs_have_no_context() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("s.sqlite3");
    let charge = || {
        Tool::builder("charge", Effect::Write)
            .approval(toolscript::Approval::Always)
            .handler(|_| async { Ok(json!("charged")) })
    };
    let runtime = |store: SqliteStore| {
        Runtime::builder(Registry::builder().tool(charge()).build().unwrap())
            .store(Arc::new(store) as Arc<dyn Store>)
            .build()
    };
    let paused = runtime(SqliteStore::open(&path).unwrap())
        .run("charge(#{amount: 5})")
        .await;
    assert_eq!(paused.status(), RunStatus::Paused);
    // The store as schema 10 left it.
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch("ALTER TABLE runs DROP COLUMN context_digest; PRAGMA user_version = 10;")
        .unwrap();
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(
        crate::support::user_version(&path),
        crate::support::SQLITE_SCHEMA
    );
    let record = store.run(&paused.run_id).await.unwrap().unwrap();
    assert_eq!(record.context_digest, None);
    let done = runtime(store)
        .resume(
            &paused.run_id,
            Some(Decision::Approve),
            RunOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(done.status(), RunStatus::Completed, "{:?}", done.result);
}

/// A tenant's run whose instance was killed is taken over on its tenant's runtime by an
/// instance with the same token file, and only there: an instance without `--auth` leaves it
/// alone. Once taken over it still belongs to its tenant: that tenant's token lists it and
/// reads its outcome; another tenant's is told there is no such run.
#[test]
fn a_tenants_run_is_taken_over_only_by_an_instance_that_serves_the_tenant() {
    if !crate::support::node_available() {
        return;
    }
    let (recorder, manifest) = slow_run_tools();
    let dir = recorder.dir.path();
    let sha = crate::support::sha256;
    let auth = dir.join("auth.toml");
    std::fs::write(
        &auth,
        format!(
            "[[token]]\nsha256 = \"{}\"\ntenant = \"acme\"\ncan = [\"run\", \"read\"]\n\n\
             [[token]]\nsha256 = \"{}\"\ntenant = \"other\"\ncan = [\"run\", \"read\"]\n",
            sha("acme-token"),
            sha("other-token")
        ),
    )
    .unwrap();
    let store = dir.join("store.sqlite3");
    let (m, a, s) = (
        manifest.to_str().unwrap(),
        auth.to_str().unwrap(),
        store.to_str().unwrap(),
    );
    let lease = [("TOOLSCRIPT_LEASE_S", "0.5")];
    let mut first = Served::start_in(&lease, &["--auth", a, "--tools", m, "--store", s]);
    let addr = first.addr.clone();
    let client = std::thread::spawn(move || {
        call_on(
            &addr,
            Some("acme-token"),
            "run_script",
            json!({"script": SLOW_RUN}),
        )
    });
    let started = Instant::now();
    while recorder.records().is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no first write"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    first.kill();
    assert!(
        client.join().unwrap().is_err(),
        "the killed instance answered"
    );

    let rt = tokio::runtime::Runtime::new().unwrap();
    let sqlite = SqliteStore::open(&store).unwrap();
    let run = || {
        rt.block_on(async {
            let page = sqlite
                .list_runs(toolscript::RunQuery::first(10))
                .await
                .unwrap();
            assert_eq!(page.runs.len(), 1);
            sqlite.run(&page.runs[0].run_id).await.unwrap().unwrap()
        })
    };
    assert_eq!(run().tenant.as_deref(), Some("acme"));

    // Without the token file the instance serves no tenant: the run is left alone.
    let unauthenticated = Served::start_in(&lease, &["--take-over", "--tools", m, "--store", s]);
    std::thread::sleep(Duration::from_millis(2000));
    let left = run();
    assert_eq!(left.status, RunStatus::Running);
    assert_eq!(left.lease.map(|l| l.token), Some(1), "taken without --auth");
    drop(unauthenticated);

    let second = Served::start_in(
        &lease,
        &["--take-over", "--auth", a, "--tools", m, "--store", s],
    );
    let waited = Instant::now();
    while run().status != RunStatus::Completed {
        assert!(
            waited.elapsed() < Duration::from_secs(60),
            "the tenant's run was not taken over: {:?}\n{}",
            run().status,
            second.stderr().join("\n")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let done = run();
    assert_eq!(done.tenant.as_deref(), Some("acme"));
    assert_eq!(
        written(&recorder),
        [1, 2],
        "each write once: {:?}",
        recorder.records()
    );
    let id = json!({"run_id": done.run_id});
    let answer = call_on(&second.addr, Some("acme-token"), "resume_run", id.clone()).unwrap();
    assert_eq!(answer["value"], "done", "{answer}");
    let listed = call_on(&second.addr, Some("acme-token"), "list_runs", json!({})).unwrap();
    assert_eq!(
        listed["runs"][0]["run_id"],
        done.run_id.as_str(),
        "{listed}"
    );
    let refused = call_on(&second.addr, Some("other-token"), "resume_run", id).unwrap();
    assert!(
        refused
            .as_str()
            .unwrap_or_default()
            .contains("has no such run"),
        "{refused}"
    );
}
