//! Durable runs end to end on the PostgreSQL store: a run paused for approval and resumed
//! (through the runtime, and through the command line with `--store postgres://...` and
//! `$TOOLSCRIPT_STORE`), a resume after a crash, and a take-over once a lease expires, refused
//! while it is live. A password in the URL is never printed.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tempfile::TempDir;
use toolscript::{
    Approval, Decision, Effect, PostgresStore, Registry, RunOptions, RunStatus, Runtime, Tool,
};

use crate::pg;

/// One invocation of the binary.
struct Ran {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn ran(out: std::process::Output) -> Ran {
    Ran {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `toolscript ARGS` with the store given by `--store URL`, or by `$TOOLSCRIPT_STORE` when
/// `by_env`.
fn toolscript(args: &[&str], url: &str, by_env: bool) -> Ran {
    let mut command = Command::new(env!("CARGO_BIN_EXE_toolscript"));
    command
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    if by_env {
        command.env("TOOLSCRIPT_STORE", url);
    } else {
        command
            .arg("--store")
            .arg(url)
            .env_remove("TOOLSCRIPT_STORE");
    }
    ran(command.output().expect("toolscript runs"))
}

fn json_of(ran: &Ran) -> Value {
    serde_json::from_str(ran.stdout.trim())
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\nstderr: {}", ran.stdout, ran.stderr))
}

fn write(dir: &TempDir, name: &str, text: &str) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// The test database's URL with a password the server does not check (trust), which must
/// never be printed.
fn with_password(url: &str) -> String {
    url.replacen("postgres@", "postgres:hunter2@", 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_paused_for_approval_resumes_through_the_runtime() {
    let Some(url) = pg::database("runtime_approval") else {
        return;
    };
    let made = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&made);
    let refund = Tool::builder("refund", Effect::Write)
        .approval(Approval::Always)
        .composite(move |args, _ctx| {
            let made = Arc::clone(&counted);
            async move {
                made.fetch_add(1, Ordering::SeqCst);
                Ok(json!({"done": args}))
            }
        });
    let lookup = Tool::builder("lookup", Effect::Read)
        .handler(|args| async move { Ok(json!({"twice": args["n"].as_i64().unwrap_or(0) * 2})) });
    let registry = Registry::builder()
        .tools(vec![lookup, refund])
        .build()
        .unwrap();
    let store = PostgresStore::connect(&url).await.unwrap();
    let runtime = Runtime::builder(registry).store(Arc::new(store)).build();
    let script = "let a = lookup(#{n: 1}); let r = refund(#{n: a.twice}); [a.twice, r.done.n]";
    let paused = runtime.run(script).await;
    assert_eq!(paused.status(), RunStatus::Paused);
    assert_eq!(made.load(Ordering::SeqCst), 0);
    let done = runtime
        .resume(
            &paused.run_id,
            Some(Decision::Approve),
            RunOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(done.status(), RunStatus::Completed, "{:?}", done.result);
    assert_eq!(done.result.clone().unwrap(), json!([2, 2]));
    assert_eq!(made.load(Ordering::SeqCst), 1);
    assert_eq!(done.stats.replayed, 1, "the read is the journal's");
    // Resumed again, nothing is made twice.
    let again = runtime
        .resume(&paused.run_id, None, RunOptions::default())
        .await;
    assert!(again.is_err() || made.load(Ordering::SeqCst) == 1);
    assert_eq!(made.load(Ordering::SeqCst), 1);
}

#[test]
fn the_command_line_pauses_and_resumes_on_postgres_and_never_prints_the_password() {
    let Some(url) = pg::database("cli_approval") else {
        return;
    };
    let url = with_password(&url);
    let dir = TempDir::new().unwrap();
    let manifest = write(
        &dir,
        "m.toml",
        "[[tool]]\nname = \"charge\"\neffect = \"write\"\napproval = \"always\"\nscript = '#{ charged: args.amount }'\n",
    );
    let script = write(
        &dir,
        "s.rhai",
        "let c = charge(#{amount: 5}); c.charged + 1",
    );
    let (m, s) = (manifest.to_str().unwrap(), script.to_str().unwrap());
    let paused = toolscript(&["run", s, "--tools", m, "--json"], &url, false);
    assert_eq!(paused.code, Some(3), "{}", paused.stderr);
    let run_id = json_of(&paused)["run_id"].as_str().unwrap().to_string();
    // Listed through $TOOLSCRIPT_STORE.
    let listed = toolscript(&["runs", "--json"], &url, true);
    assert_eq!(listed.code, Some(0), "{}", listed.stderr);
    let runs = json_of(&listed);
    assert_eq!(runs[0]["run_id"], json!(run_id));
    assert_eq!(runs[0]["status"], "paused");
    let resumed = toolscript(
        &["resume", &run_id, "--approve", "--tools", m, "--json"],
        &url,
        false,
    );
    assert_eq!(resumed.code, Some(0), "{}", resumed.stderr);
    assert_eq!(json_of(&resumed)["value"], json!(6));
    let table = toolscript(&["runs"], &url, false);
    // Prune removes the completed run.
    let pruned = toolscript(&["prune", "--json"], &url, false);
    assert_eq!(pruned.code, Some(0), "{}", pruned.stderr);
    assert_eq!(json_of(&pruned)["runs"], json!(1), "{}", pruned.stdout);
    let left = json_of(&toolscript(&["runs", "--json"], &url, false));
    assert_eq!(left, json!([]));
    for out in [&paused, &listed, &resumed, &table, &pruned] {
        assert!(!out.stdout.contains("hunter2") && !out.stderr.contains("hunter2"));
    }
    // A server that is not there: a clear error, soon, the password masked.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let gone = format!("postgres://me:hunter2@127.0.0.1:{port}/db?connect_timeout=2");
    let started = Instant::now();
    let failed = toolscript(&["runs"], &gone, false);
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_ne!(failed.code, Some(0));
    assert!(
        failed.stderr.contains("me:***@127.0.0.1"),
        "{}",
        failed.stderr
    );
    assert!(!failed.stderr.contains("hunter2"), "{}", failed.stderr);
    assert!(failed.stderr.contains("check"), "{}", failed.stderr);
}

/// Starts `toolscript ARGS --store URL` with leases of `lease_s`.
fn start(args: &[&str], url: &str, lease_s: &str) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_toolscript"))
        .args(args)
        .args(["--store", url, "--lease-s", lease_s])
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("toolscript starts")
}

/// The id of the one run the store lists, once it is there.
fn only_run(url: &str) -> String {
    let started = Instant::now();
    loop {
        let runs = json_of(&toolscript(&["runs", "--json"], url, false));
        if let Some(id) = runs[0]["run_id"].as_str() {
            return id.to_string();
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no run appeared"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_crashed_run_is_refused_while_its_lease_lives_then_taken_over_and_settled() {
    let Some(url) = pg::database("crash") else {
        return;
    };
    let dir = TempDir::new().unwrap();
    // The write's body has run when its simulated latency starts: a kill then leaves its
    // intent journaled and its outcome lost.
    let manifest = write(
        &dir,
        "m.toml",
        "[[tool]]\nname = \"ship\"\neffect = \"write\"\nlatency_ms = 4000\nscript = '#{ shipped: args.n }'\n",
    );
    let script = write(&dir, "s.rhai", "ship(#{n: 1}); 7");
    let (m, s) = (manifest.to_str().unwrap(), script.to_str().unwrap());
    let mut child = start(&["run", s, "--tools", m, "--json"], &url, "1");
    let run_id = only_run(&url);
    std::thread::sleep(Duration::from_millis(800));
    // Its owner renews its lease: another process is refused.
    let busy = toolscript(&["resume", &run_id, "--tools", m, "--json"], &url, false);
    assert_ne!(busy.code, Some(0), "{}", busy.stdout);
    assert!(busy.stderr.contains("lease"), "{}", busy.stderr);
    child.kill().unwrap();
    child.wait().unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    // Expired: taken over. The write's outcome was lost: a person settles it.
    let resumed = toolscript(&["resume", &run_id, "--tools", m, "--json"], &url, false);
    assert_eq!(resumed.code, Some(3), "{}", resumed.stderr);
    let out = json_of(&resumed);
    assert_eq!(out["pending"]["awaiting"], "resolve");
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
        &url,
        false,
    );
    assert_eq!(done.code, Some(0), "{}", done.stderr);
    assert_eq!(json_of(&done)["value"], json!(7));
    let runs = json_of(&toolscript(&["runs", "--json"], &url, false));
    assert_eq!(runs[0]["status"], "completed");
}

/// A run whose write takes a redacted password pauses on one instance and is resumed by
/// another (a second store handle, as another machine would have): both keyed the write's
/// journaled arguments with the database's one digest key, so the resume answers it from the
/// journal and makes it once; no table holds the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_with_a_redacted_argument_resumes_on_another_instance() {
    const PASSWORD: &str = "pw-hunter2-correct-horse";
    let Some(url) = pg::database("shared_key") else {
        return;
    };
    let logins = Arc::new(AtomicUsize::new(0));
    let registry = |logins: &Arc<AtomicUsize>| {
        let logins = Arc::clone(logins);
        Registry::builder()
            .tool(
                Tool::builder("get_password", Effect::Read)
                    .redact(["result.password"])
                    .handler(|_args: Value| async move { Ok(json!({"password": PASSWORD})) }),
            )
            .tool(
                Tool::builder("login", Effect::Write)
                    .redact(["args.password"])
                    .handler(move |args: Value| {
                        let logins = Arc::clone(&logins);
                        async move {
                            logins.fetch_add(1, Ordering::SeqCst);
                            Ok(json!({"ok": args["password"] == PASSWORD}))
                        }
                    }),
            )
            .tool(
                Tool::builder("approve_me", Effect::Write)
                    .approval(Approval::Always)
                    .handler(|args: Value| async move { Ok(args) }),
            )
            .build()
            .unwrap()
    };
    let script = r#"
        let pw = get_password().password;
        let logged = login(#{user: "jane", password: pw});
        approve_me(#{n: 1});
        logged.ok
    "#;
    let here = Runtime::builder(registry(&logins))
        .store(Arc::new(PostgresStore::connect(&url).await.unwrap()))
        .build();
    let paused = here.run(script).await;
    assert_eq!(paused.status(), RunStatus::Paused, "{:?}", paused.result);
    assert_eq!(logins.load(Ordering::SeqCst), 1);
    let there = Runtime::builder(registry(&logins))
        .store(Arc::new(PostgresStore::connect(&url).await.unwrap()))
        .build();
    let done = there
        .resume(
            &paused.run_id,
            Some(Decision::Approve),
            RunOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(done.status(), RunStatus::Completed, "{:?}", done.result);
    assert_eq!(done.result.clone().unwrap(), json!(true));
    assert_eq!(
        logins.load(Ordering::SeqCst),
        1,
        "the login was answered from the journal"
    );
    let db = pg::Cluster::db_of(&url);
    for table in [
        "runs",
        "writes",
        "reads",
        "approved_reads",
        "cache",
        "plans",
    ] {
        let text = pg::cluster().psql_in(
            &db,
            &format!("SELECT coalesce(string_agg(t::text, ' '), '') FROM {table} t"),
        );
        assert!(
            !text.contains(PASSWORD),
            "{table} holds the password: {text}"
        );
    }
    let journaled = pg::cluster().psql_in(&db, "SELECT args FROM writes WHERE tool = 'login'");
    assert!(journaled.starts_with("hmac:"), "{journaled}");
}
