//! Secrets and redaction: a sentinel secret and redacted values, and a script that tries every
//! way out — returning, printing, throwing, an error message, a tool whose invalid output echoes
//! the secret, a value big enough to become an artifact, a paused run, a second process
//! resuming it — leave no byte of them in the run's output, its receipts or any file of the
//! store, while the script computes on the real values.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde_json::{json, Value};
use tempfile::TempDir;
use toolscript::secrets::{SecretSource, Secrets};
use toolscript::Store as _;
use toolscript::{
    Decision, Effect, Registry, RunOptions, RunStatus, Runtime, SqliteStore, Tool, ToolError,
};

const SENTINEL: &str = "SENTINEL-7f3a9c21-secret";
const SSN: &str = "078-05-1120";
const EMAIL: &str = "jane.private@example.org";
const PASSWORD: &str = "pw-hunter2-correct-horse";
/// A secret a manifest fetches with a command.
const HELPER: &str = "HELPER-c0ffee-0b5cure-value";
/// What must never be found.
const NEEDLES: [&str; 5] = [SENTINEL, SSN, EMAIL, PASSWORD, HELPER];

/// The tools: `get_token` returns the secret; `get_user` returns a record whose `ssn` and
/// contacts' emails are redacted; `login` takes a redacted password; `echo` writes back what
/// it is given; `strict` promises a number and returns what it is given (its invalid output
/// fails schema validation); `fail_with` fails with its argument in the message; `approve_me`
/// needs a person.
fn registry() -> Registry {
    let secrets = token_secret();
    Registry::builder()
        .secrets(secrets)
        .tool(
            Tool::builder("get_token", Effect::Read).handler_with_context(|_args, ctx| async move {
                let token = ctx.secret("TOKEN").await?;
                Ok(json!({"token": &*token, "length": token.len()}))
            }),
        )
        .tool(
            Tool::builder("get_user", Effect::Read)
                .redact(["result.ssn", "result.contacts[*].email"])
                .handler(|args: Value| async move {
                    Ok(json!({"id": args["id"], "ssn": SSN, "contacts": [{"email": EMAIL, "kind": "home"}]}))
                }),
        )
        .tool(
            Tool::builder("get_password", Effect::Read)
                .redact(["result.password"])
                .handler(|_args: Value| async move { Ok(json!({"password": PASSWORD})) }),
        )
        .tool(
            Tool::builder("login", Effect::Write)
                .redact(["args.password"])
                .handler(|args: Value| async move {
                    Ok(json!({"ok": args["password"] == PASSWORD}))
                }),
        )
        .tool(Tool::builder("echo", Effect::Write).handler(|args: Value| async move { Ok(args) }))
        .tool(
            Tool::builder("strict", Effect::Read)
                .output_schema(json!({"type": "object", "properties": {"n": {"type": "number"}}, "required": ["n"]}))
                .handler(|args: Value| async move { Ok(json!({"n": args["v"]})) }),
        )
        .tool(Tool::builder("fail_with", Effect::Read).handler(|args: Value| async move {
            Err::<Value, _>(ToolError::not_found(format!("nothing for {}", args["x"])))
        }))
        .tool(
            Tool::builder("approve_me", Effect::Write)
                .approval(toolscript::Approval::Always)
                .handler(|args: Value| async move { Ok(args) }),
        )
        .build()
        .unwrap()
}

/// The secret `TOKEN`, whose value is the sentinel.
fn token_secret() -> Secrets {
    Secrets::new(BTreeMap::from([(
        "TOKEN".to_string(),
        SecretSource::Value(SENTINEL.to_string()),
    )]))
}

/// Every way out a script has, in one script (which never writes the values itself: the text
/// of a script is kept as it is, for a resume); it pauses at `approve_me` (with the secret in
/// its arguments) and, once approved, ends with the secret in its value.
const SCRIPT: &str = r#"
    let t = get_token().token;
    print(`token: ${t}`);
    debug(t);
    let u = get_user(#{id: 1});
    print(`ssn ${u.ssn} email ${u.contacts[0].email}`);
    let pw = get_password().password;
    let logged = login(#{user: "jane", password: pw});
    echo(#{v: t, ssn: u.ssn, nested: [#{deep: t}]});
    let caught = [];
    try { strict(#{v: t}); } catch (e) { caught.push(e.message); print(e); }
    try { fail_with(#{x: t}); } catch (e) { caught.push(e.message); }
    let big = [];
    for i in 0..4000 { big.push(`${t}/${u.ssn}/${i}`); }
    approve_me(#{token: t, password: pw});
    let keyed = #{};
    keyed[t] = 1;
    #{
        token: t,
        same: t.starts_with("SENTINEL-") && t.ends_with("-secret"),
        length: t.len(),
        ssn_ok: u.ssn.len() == 11 && u.ssn.starts_with("078"),
        logged: logged.ok,
        caught: caught,
        big: big,
        keyed: keyed,
    }
"#;

/// Every byte of every file under `dir`, and where each sentinel was found.
fn leaks_in_files(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(leaks_in_files(&path));
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        for needle in NEEDLES {
            if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                found.push(format!("{} holds {needle}", path.display()));
            }
        }
    }
    found
}

fn leaks_in_text(what: &str, text: &str) -> Vec<String> {
    NEEDLES
        .iter()
        .filter(|needle| text.contains(*needle))
        .map(|needle| format!("{what} holds {needle}"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_or_redacted_value_leaves_the_run_by_any_way_out() {
    let dir = TempDir::new().unwrap();
    let store_dir = dir.path().join("store");
    std::fs::create_dir(&store_dir).unwrap();
    let store: Arc<SqliteStore> =
        Arc::new(SqliteStore::open(&store_dir.join("runs.sqlite3")).unwrap());
    let receipts = dir.path().join("receipts.jsonl");
    let resumed_receipts = dir.path().join("resumed.jsonl");
    let runtime = Runtime::builder(registry()).store(store.clone()).build();
    let paused = runtime
        .run_with(SCRIPT, RunOptions::default().receipts(&receipts).unwrap())
        .await;
    assert_eq!(paused.status(), RunStatus::Paused, "{:?}", paused.result);
    let mut leaks = leaks_in_text("the paused run's output", &paused.to_json().to_string());
    let pending = paused.pending.clone().unwrap();
    assert_eq!(pending.args["password"], "[redacted]", "{pending:?}");
    assert_eq!(pending.args["token"], "[secret:TOKEN]", "{pending:?}");
    leaks.extend(leaks_in_files(&store_dir));

    // Another runtime (a resume in a new process) over the same store: reads that held a
    // secret or a redacted value were not journaled, and are made again.
    let runtime = Runtime::builder(registry()).store(store.clone()).build();
    let done = runtime
        .resume(
            &paused.run_id,
            Some(Decision::Approve),
            RunOptions::default().receipts(&resumed_receipts).unwrap(),
        )
        .await
        .unwrap();
    let value = done.result.clone().unwrap_or_else(|e| panic!("{e:?}"));
    // The script computed on the real values.
    assert_eq!(value["same"], true, "{value}");
    assert_eq!(value["ssn_ok"], true);
    assert_eq!(value["logged"], true, "the tool saw the real password");
    assert_eq!(value["length"], SENTINEL.len());
    // What it hands back holds none of them.
    assert_eq!(value["token"], "[secret:TOKEN]");
    let json = done.to_json().to_string();
    leaks.extend(leaks_in_text("the run's output", &json));
    for log in &done.logs {
        leaks.extend(leaks_in_text("a log line", log));
    }
    assert!(
        done.logs.iter().any(|l| l.contains("[secret:TOKEN]")),
        "{:?}",
        done.logs
    );
    assert!(json.contains("[redacted]"), "{json}");
    // The big value became an artifact: kept masked, pages and all.
    assert!(
        !done.artifacts.is_empty(),
        "the big value was kept as an artifact"
    );
    for artifact in &done.artifacts {
        let kept = store.artifact(&artifact.id).await.unwrap().unwrap();
        leaks.extend(leaks_in_text(
            "an artifact",
            &String::from_utf8_lossy(&kept.content),
        ));
    }
    // The effects name the write's redacted argument as such.
    let login = done.effects.iter().find(|e| e.tool == "login");
    if let Some(login) = login {
        assert_eq!(login.args["password"], "[redacted]");
    }
    leaks.extend(leaks_in_files(&store_dir));
    let receipts_text = std::fs::read_to_string(&receipts).unwrap()
        + std::fs::read_to_string(&resumed_receipts).unwrap().as_str();
    leaks.extend(leaks_in_text("the receipts", &receipts_text));
    // Keyed digests in the receipts for calls that held such values.
    assert!(
        receipts_text.contains("\"args_sha256\":\"hmac:"),
        "{receipts_text}"
    );
    // The key of those digests lives beside the store, readable by its owner alone.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let key = store_dir.join("runs.sqlite3.key");
        let mode = std::fs::metadata(&key).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{key:?}");
    }
    assert!(leaks.is_empty(), "{leaks:#?}");
}

/// A script that throws the secret, and one that fails with it in a tool's error: the run's
/// error is masked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thrown_secret_is_masked_in_the_run_error() {
    let runtime = Runtime::new(registry());
    for script in [
        "let t = get_token().token; throw t;",
        "let t = get_token().token; fail_with(#{x: t})",
        "let t = get_token().token; strict(#{v: t})",
        "let t = get_token().token; parse_int(t)",
    ] {
        let out = runtime.run(script).await;
        let json = out.to_json().to_string();
        assert!(out.result.is_err(), "{script}: {json}");
        let leaks = leaks_in_text(script, &json);
        assert!(leaks.is_empty(), "{leaks:?}: {json}");
    }
}

/// A read that held a secret is not journaled: a resume makes it again (and says so by the
/// count of its calls).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_holding_a_secret_is_made_again_on_resume() {
    let dir = TempDir::new().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("s.sqlite3")).unwrap());
    let runtime = Runtime::builder(registry()).store(store.clone()).build();
    let script = "let t = get_token().token; approve_me(#{x: 1}); t.len()";
    let paused = runtime.run(script).await;
    assert_eq!(paused.status(), RunStatus::Paused);
    let done = runtime
        .resume(
            &paused.run_id,
            Some(Decision::Approve),
            RunOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(done.result.unwrap(), json!(SENTINEL.len()));
    assert_eq!(done.stats.replayed, 0, "the token's read was made again");
}

/// A manifest's secrets, from a file and a command, reach a command tool's environment; with
/// `RUST_LOG=trace`, over MCP, and after the process is killed mid-run, no byte of them is in
/// stdout, stderr, MCP traffic or any file of the store.
mod command_line {
    use std::io::Write;
    use std::path::PathBuf;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    use tempfile::TempDir;

    use super::{leaks_in_files, leaks_in_text as leaks, HELPER, SENTINEL};

    struct Setup {
        dir: TempDir,
        manifest: PathBuf,
        store: PathBuf,
    }

    fn setup() -> Setup {
        let dir = TempDir::new().unwrap();
        std::fs::write(dir.path().join("token.txt"), format!("{SENTINEL}\n")).unwrap();
        std::fs::write(dir.path().join("helper.txt"), HELPER).unwrap();
        let manifest = dir.path().join("tools.toml");
        std::fs::write(
            &manifest,
            format!(
                r#"
[secrets]
TOKEN = {{ file = "token.txt" }}
HELPER = {{ command = ["cat", "{}"] }}

[[tool]]
kind = "command"
name = "show_env"
description = "Prints its environment."
argv = ["env"]
env = {{ TOKEN = {{ secret = "TOKEN" }}, OTHER = {{ secret = "HELPER" }}, PLAIN = "plain-value" }}
effect = "read"

[[tool]]
name = "slow_write"
description = "Takes its time."
effect = "write"
latency_ms = 30000
script = "args"
"#,
                dir.path().join("helper.txt").display()
            ),
        )
        .unwrap();
        let store = dir.path().join("store");
        std::fs::create_dir(&store).unwrap();
        Setup {
            store: store.join("runs.sqlite3"),
            manifest,
            dir,
        }
    }

    const SCRIPT: &str = r#"
        let out = show_env().stdout;
        print(out);
        let lines = out.split("\n");
        let token = "";
        for line in lines { if line.starts_with("TOKEN=") { token = line.sub_string(6); } }
        print(`the token is ${token}, ${token.len()} bytes`);
        #{ env: out, token: token, length: token.len() }
    "#;

    #[test]
    fn a_traced_run_shows_no_secret() {
        let s = setup();
        let script = s.dir.path().join("s.rhai");
        std::fs::write(&script, SCRIPT).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_toolscript"))
            .args(["run", "--json", "-vv", "--tools"])
            .arg(&s.manifest)
            .arg("--store")
            .arg(&s.store)
            .arg(&script)
            .env("RUST_LOG", "trace")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stdout}\n{stderr}");
        let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        // The command got the secrets, and the script computed on them.
        assert_eq!(json["value"]["length"], SENTINEL.len(), "{stdout}");
        assert_eq!(json["value"]["token"], "[secret:TOKEN]", "{stdout}");
        let env = json["value"]["env"].as_str().unwrap();
        assert!(
            env.contains("OTHER=[secret:HELPER]") && env.contains("PLAIN=plain-value"),
            "{env}"
        );
        assert!(
            stderr.contains("TRACE") || stderr.contains("DEBUG"),
            "traced: {stderr}"
        );
        let mut found = leaks("stdout", &stdout);
        found.extend(leaks("stderr", &stderr));
        found.extend(leaks_in_files(s.store.parent().unwrap()));
        assert!(found.is_empty(), "{found:#?}");
    }

    #[test]
    fn a_run_killed_mid_call_leaves_no_secret_in_the_store() {
        let s = setup();
        let script = s.dir.path().join("s.rhai");
        std::fs::write(
            &script,
            format!("{SCRIPT}; let t = show_env().stdout; slow_write(#{{ t: t }}); 1"),
        )
        .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_toolscript"))
            .args(["run", "--tools"])
            .arg(&s.manifest)
            .arg("--store")
            .arg(&s.store)
            .arg(&script)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // The write's intent is journaled before its body (30 s of latency) runs.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let journaled = rusqlite::Connection::open(&s.store)
                .and_then(|c| {
                    c.query_row("SELECT count(*) FROM writes", [], |r| r.get::<_, i64>(0))
                })
                .unwrap_or(0);
            if journaled > 0 {
                break;
            }
            assert!(Instant::now() < deadline, "the write was never journaled");
            std::thread::sleep(Duration::from_millis(50));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        let found = leaks_in_files(s.store.parent().unwrap());
        assert!(found.is_empty(), "{found:#?}");
    }

    #[test]
    fn mcp_traffic_holds_no_secret() {
        let s = setup();
        let mut child = Command::new(env!("CARGO_BIN_EXE_toolscript"))
            .args(["serve", "--tools"])
            .arg(&s.manifest)
            .arg("--store")
            .arg(&s.store)
            .env("RUST_LOG", "trace")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let messages = [
            serde_json::json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"0"}}}),
            serde_json::json!({"jsonrpc":"2.0","method":"notifications/initialized"}),
            serde_json::json!({"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"run_script","arguments":{"script": SCRIPT}}}),
        ];
        for m in &messages {
            writeln!(stdin, "{m}").unwrap();
        }
        // Reads answers until the run's arrives, then closes the session.
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            use std::io::BufRead;
            let mut all = String::new();
            for line in std::io::BufReader::new(stdout).lines() {
                let line = line.unwrap();
                all.push_str(&line);
                all.push('\n');
                if line.contains("\"id\":2") {
                    break;
                }
            }
            all
        });
        let traffic = reader.join().unwrap();
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(traffic.contains("[secret:TOKEN]"), "{traffic}");
        let mut found = leaks("MCP traffic", &traffic);
        found.extend(leaks("stderr", &stderr));
        found.extend(leaks_in_files(s.store.parent().unwrap()));
        assert!(found.is_empty(), "{found:#?}");
    }
}

/// What a manifest gets wrong about secrets and redaction is an error naming the file and line,
/// before anything runs.
#[test]
fn manifest_mistakes_about_secrets_and_redaction_are_errors() {
    let dir = TempDir::new().unwrap();
    let load = |text: &str| -> Result<(), String> {
        let path = dir.path().join("m.toml");
        std::fs::write(&path, text).unwrap();
        let mut m = toolscript::Manifests::new();
        m.load_file(&path).map_err(|e| e.to_string())?;
        m.into_registry().map(|_| ()).map_err(|e| e.to_string())
    };
    let command = |env: &str| {
        format!("[[tool]]\nkind = \"command\"\nname = \"c\"\ndescription = \"d\"\nargv = [\"true\"]\nenv = {{ {env} }}\n")
    };
    for (text, says) in [
        ("[secrets]\nA = { env = \"X\", file = \"y\" }\n", "exactly one source"),
        ("[secrets]\nA = {}\n", "exactly one source"),
        ("[secrets]\nA = { command = [] }\n", "exactly one source"),
        ("[secrets]\nA = { vault = \"x\" }\n", "unknown field"),
        ("[secrets]\n\"a b\" = { env = \"X\" }\n", "letters, digits"),
        (&command("T = { secret = \"NOPE\" }"), "names the secret `NOPE`"),
        (
            "[[tool]]\nname = \"t\"\neffect = \"read\"\nscript = \"args\"\nredact = [\"args.password\"]\ninput = { type = \"object\", properties = { user = { type = \"string\" } }, additionalProperties = false }\n",
            "no field `password`",
        ),
        (
            "[[tool]]\nname = \"t\"\neffect = \"read\"\nscript = \"args\"\nredact = [\"token\"]\n",
            "starts with `args` or `result`",
        ),
        (
            "[[tool]]\nname = \"t\"\neffect = \"read\"\nscript = \"args\"\nredact = [\"result.items[*]\"]\noutput = { type = \"object\", properties = { items = { type = \"string\" } } }\n",
            "no items",
        ),
    ] {
        let e = load(text).expect_err(text);
        assert!(e.contains(says), "{text}\n→ {e}");
        assert!(e.contains("m.toml"), "names the file: {e}");
    }
    // Declared in a later manifest is fine; declared twice is not.
    let mut m = toolscript::Manifests::new();
    m.load_str(Path::new("a.toml"), &command("T = { secret = \"S\" }"))
        .unwrap();
    m.load_str(Path::new("b.toml"), "[secrets]\nS = { env = \"X\" }\n")
        .unwrap();
    let e = m
        .load_str(Path::new("c.toml"), "[secrets]\nS = { env = \"Y\" }\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("declared twice"), "{e}");
    assert!(m.into_registry().is_ok());
}

/// `tools` and `check` never fetch a secret: a command source that leaves a mark runs only when
/// a run first needs the secret.
#[cfg(feature = "commands")]
#[test]
fn tools_and_check_never_fetch_a_secret() {
    use std::process::Command;
    let dir = TempDir::new().unwrap();
    let mark = dir.path().join("fetched");
    std::fs::write(
        dir.path().join("tools.toml"),
        format!(
            "[secrets]\nT = {{ command = [\"sh\", \"-c\", \"touch '{}'; echo fetched-value-1234\"] }}\n\n[[tool]]\nkind = \"command\"\nname = \"show\"\ndescription = \"d\"\nargv = [\"printenv\", \"T\"]\nenv = {{ T = {{ secret = \"T\" }} }}\neffect = \"read\"\n",
            mark.display()
        ),
    )
    .unwrap();
    std::fs::write(dir.path().join("s.rhai"), "show().stdout").unwrap();
    let toolscript = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_toolscript"))
            .current_dir(dir.path())
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    toolscript(&["tools", "--tools", "tools.toml"]);
    toolscript(&["check", "--tools", "tools.toml", "s.rhai"]);
    assert!(!mark.exists(), "`tools` or `check` fetched the secret");
    let value = toolscript(&["run", "--no-store", "--tools", "tools.toml", "s.rhai"]);
    assert!(mark.exists(), "the run fetched it");
    assert!(
        value.contains("[secret:T]") && !value.contains("fetched-value-1234"),
        "{value}"
    );
}

/// A read the guard asks about, whose arguments hold the secret, pauses with them masked; the
/// approval is kept against their keyed digest, so the resumed run makes the read once and goes
/// on (it does not ask again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asked_read_holding_a_secret_is_approved_by_its_digest() {
    use toolscript::guard::{Guard, Rule, Ruling};
    let dir = TempDir::new().unwrap();
    let made = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&made);
    let guard = Guard::builder(dir.path())
        .rule(Rule::new(["lookup"], Ruling::Ask, "lookups need a person").unwrap())
        .build()
        .unwrap();
    let registry = Registry::builder()
        .secrets(token_secret())
        .guard(guard)
        .tool(
            Tool::builder("get_token", Effect::Read).handler_with_context(
                |_args, ctx| async move { Ok(json!({"token": &*ctx.secret("TOKEN").await?})) },
            ),
        )
        .tool(
            Tool::builder("lookup", Effect::Read).handler(move |args: Value| {
                let counted = Arc::clone(&counted);
                async move {
                    counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    Ok(json!({"found": args["token"].as_str().map(str::len)}))
                }
            }),
        )
        .build()
        .unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("s.sqlite3")).unwrap());
    let runtime = Runtime::builder(registry).store(store).build();
    let paused = runtime
        .run("let t = get_token().token; lookup(#{token: t}).found")
        .await;
    assert_eq!(paused.status(), RunStatus::Paused, "{:?}", paused.result);
    let pending = paused.pending.clone().unwrap();
    assert_eq!(pending.args["token"], "[secret:TOKEN]");
    assert!(pending.read.is_some());
    assert!(
        pending
            .journal_args
            .as_deref()
            .unwrap()
            .starts_with("hmac:"),
        "{pending:?}"
    );
    assert_eq!(made.load(std::sync::atomic::Ordering::SeqCst), 0);
    let done = runtime
        .resume(
            &paused.run_id,
            Some(Decision::Approve),
            RunOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(
        done.result.clone().unwrap(),
        json!(SENTINEL.len()),
        "{:?}",
        done.pending
    );
    assert_eq!(made.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(!done.to_json().to_string().contains(SENTINEL));
}

/// A cached read whose result holds a secret, or whose tool redacts, is never cached: a second
/// run within the TTL makes it again, while a plain cached read is answered from the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_holding_secrets_or_redacted_values_are_never_cached() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let dir = TempDir::new().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let count = |name: &'static str, result: Value, redact: &'static [&'static str]| {
        let calls = Arc::clone(&calls);
        Tool::builder(name, Effect::Read)
            .cache_ttl(std::time::Duration::from_secs(600))
            .redact(redact.iter().copied())
            .handler_with_context(move |_args, ctx| {
                let (calls, result) = (Arc::clone(&calls), result.clone());
                async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    if result.is_null() {
                        return Ok(json!({"token": &*ctx.secret("TOKEN").await?}));
                    }
                    Ok(result)
                }
            })
    };
    let registry = || {
        Registry::builder()
            .secrets(token_secret())
            .tool(count("token", Value::Null, &[]))
            .tool(count("ssn", json!({"ssn": SSN}), &["result.ssn"]))
            .tool(count("plain", json!({"n": 1}), &[]))
            .build()
            .unwrap()
    };
    let store = Arc::new(SqliteStore::open(&dir.path().join("s.sqlite3")).unwrap());
    for (script, second_run_calls) in [
        ("token().token.len()", 1),
        ("ssn().ssn.len()", 1),
        ("plain().n", 0),
    ] {
        let runtime = Runtime::builder(registry()).store(store.clone()).build();
        runtime.run(script).await.result.unwrap();
        let before = calls.load(Ordering::SeqCst);
        let again = runtime.run(script).await;
        again.result.unwrap();
        assert_eq!(
            calls.load(Ordering::SeqCst) - before,
            second_run_calls,
            "{script}"
        );
    }
    assert!(
        leaks_in_files(dir.path()).is_empty(),
        "{:?}",
        leaks_in_files(dir.path())
    );
}

/// Members of the same class, found by review: a secret with quotes, a backslash and newlines
/// (escaped in JSON, where a plain search misses it), a redacted value that is a number, a
/// redacting tool whose invalid output would quote its value, and a composite that forwards a
/// redacted argument to its nested tool: none of them is kept or handed back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escaped_numeric_invalid_and_forwarded_values_stay_masked() {
    const PEM: &str = "-----BEGIN KEY-----\nMIIq\"uoted\\slash\n-----END KEY-----";
    const PIN: i64 = 73_918_264;
    let dir = TempDir::new().unwrap();
    let store_dir = dir.path().join("store");
    std::fs::create_dir(&store_dir).unwrap();
    let registry = Registry::builder()
        .secrets(Secrets::new(BTreeMap::from([(
            "PEM".to_string(),
            SecretSource::Value(PEM.to_string()),
        )])))
        .tool(Tool::builder("get_pem", Effect::Read).handler_with_context(
            |_args, ctx| async move { Ok(json!({"pem": &*ctx.secret("PEM").await?})) },
        ))
        .tool(
            Tool::builder("get_pin", Effect::Read)
                .redact(["result.pin"])
                .handler(|_args: Value| async move { Ok(json!({"pin": PIN})) }),
        )
        .tool(
            Tool::builder("bad_ssn", Effect::Read)
                .redact(["result.ssn"])
                .output_schema(
                    json!({"type": "object", "properties": {"ssn": {"type": "integer"}}}),
                )
                .handler(|_args: Value| async move { Ok(json!({"ssn": SSN})) }),
        )
        .tool(
            Tool::builder("set_password", Effect::Write)
                .redact(["args.password"])
                .handler(
                    |args: Value| async move { Ok(json!({"ok": args["password"].is_string()})) },
                ),
        )
        .tool(
            Tool::builder("rotate", Effect::Write)
                .nested(["set_password"])
                .composite(|args: Value, ctx: toolscript::ToolContext| async move {
                    ctx.call("set_password", json!({"password": args["new"]}))
                        .await
                }),
        )
        .tool(
            Tool::builder("store_it", Effect::Write).handler(|args: Value| async move { Ok(args) }),
        )
        .build()
        .unwrap();
    let store = Arc::new(SqliteStore::open(&store_dir.join("runs.sqlite3")).unwrap());
    let runtime = Runtime::builder(registry).store(store).build();
    let script = r#"
        let pem = get_pem().pem;
        store_it(#{ key: pem });
        let pin = get_pin().pin;
        let caught = "";
        try { bad_ssn(); } catch (e) { caught = e.message; }
        rotate(#{ fresh: `${pem.len()}-pw-${pin}` });
        #{ pem: pem, pin: pin, caught: caught, lines: pem.split("\n").len() }
    "#;
    let out = runtime.run(script).await;
    let value = out.result.clone().unwrap_or_else(|e| panic!("{e:?}"));
    assert_eq!(value["lines"], 3, "the script has the real key");
    assert_eq!(value["pem"], "[secret:PEM]");
    assert_eq!(value["pin"], "[redacted]", "a redacted number is masked");
    let json = out.to_json().to_string();
    let mut found = Vec::new();
    for needle in [PEM, "MIIq", &PIN.to_string(), SSN] {
        if json.contains(needle)
            || json.contains(&serde_json::to_string(needle).unwrap()[1..needle.len()])
        {
            found.push(format!("the output holds {needle:?}"));
        }
    }
    for file in std::fs::read_dir(&store_dir).unwrap() {
        let path = file.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        for needle in [
            "MIIq",
            "uoted\\\\slash",
            "uoted\\slash",
            &format!("pw-{PIN}"),
            SSN,
        ] {
            if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                found.push(format!("{} holds {needle:?}", path.display()));
            }
        }
    }
    assert!(found.is_empty(), "{found:#?}\n{json}");
}
