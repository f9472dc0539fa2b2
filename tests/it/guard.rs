//! The guard in the dispatch path: rules, path rules and the default decide every call (the
//! script's, the scout's, a composite's nested ones); `ask` pauses the script's own call (a
//! read too, keyed by its epoch and occurrence) of a durable run and denies everywhere else; a denied call gets a receipt and never
//! reaches its tool or the breaker.

use std::sync::Arc;

use serde_json::{json, Value};
use tempfile::TempDir;
use toolscript::guard::{Guard, PathArg, Rule, Ruling};
use toolscript::{
    Awaiting, Decision, Effect, ErrorKind, Manifests, Mode, Registry, RunOptions, RunStatus,
    Runtime, SqliteStore, Tool,
};

/// A read `get` and a write `refund` whose bodies count their calls by `id`, a read `cat`
/// naming a file and a write `save` naming one, and a composite `both` nesting `refund`.
fn tools(seen: &Arc<std::sync::Mutex<Vec<String>>>) -> Vec<Tool> {
    let note = |name: &'static str| {
        let seen = Arc::clone(seen);
        move |args: Value| {
            let seen = Arc::clone(&seen);
            async move {
                seen.lock().unwrap().push(format!("{name} {args}"));
                Ok(args)
            }
        }
    };
    let nested = {
        let seen = Arc::clone(seen);
        move |args: Value, ctx: toolscript::ToolContext| {
            let seen = Arc::clone(&seen);
            async move {
                seen.lock().unwrap().push(format!("both {args}"));
                ctx.call("refund", args).await
            }
        }
    };
    vec![
        Tool::builder("get", Effect::Read).handler(note("get")),
        Tool::builder("refund", Effect::Write).handler(note("refund")),
        Tool::builder("cat", Effect::Read)
            .paths([PathArg::read("path")])
            .handler(note("cat")),
        Tool::builder("save", Effect::Write)
            .paths([PathArg::write("path")])
            .handler(note("save")),
        Tool::builder("both", Effect::Write)
            .nested(["refund"])
            .composite(nested),
    ]
}

fn guard(dir: &std::path::Path) -> Guard {
    Guard::builder(dir)
        .write(["out/**"], ["**/*.lock"])
        .rule(
            Rule::new(["refund"], Ruling::Ask, "refunds over $500 need a person")
                .unwrap()
                .when("args.amount_cents > 50000")
                .unwrap(),
        )
        .rule(
            Rule::new(
                ["get"],
                Ruling::Deny,
                "id 3 and ids from 100 are off limits",
            )
            .unwrap()
            .when("args.id == 3 || args.id >= 100")
            .unwrap(),
        )
        .build()
        .unwrap()
}

struct Setup {
    _dir: TempDir,
    runtime: Runtime,
    seen: Arc<std::sync::Mutex<Vec<String>>>,
}

fn setup(durable: bool) -> Setup {
    let dir = TempDir::new().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let registry = Registry::builder()
        .tools(tools(&seen))
        .guard(guard(dir.path()))
        .build()
        .unwrap();
    let mut builder = Runtime::builder(registry);
    if durable {
        let store = SqliteStore::open(&dir.path().join("store.sqlite3")).unwrap();
        builder = builder.store(Arc::new(store));
    }
    Setup {
        _dir: dir,
        runtime: builder.build(),
        seen,
    }
}

fn error_message(outcome: &toolscript::RunOutcome) -> (ErrorKind, String) {
    let e = outcome.result.as_ref().expect_err("the run failed");
    (e.kind, e.message.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_call_names_its_rule_gets_a_receipt_and_never_reaches_the_tool_or_breaker() {
    let s = setup(false);
    // A denied call is no failure of the tool: after more denials than any breaker's
    // threshold, calls still reach it.
    let script = r#"
        let denied = 0;
        for i in 100..108 { try { get(#{id: i}); } catch (e) { denied += 1; } }
        [denied, get(#{id: 4}).id]
    "#;
    let out = s.runtime.run(script).await;
    assert_eq!(
        out.result.clone().unwrap(),
        json!([8, 4]),
        "{:?}",
        out.result
    );
    let seen = s.seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        [r#"get {"id":4}"#],
        "the denied calls never reached the tool"
    );
    let denied: Vec<_> = out
        .receipts
        .iter()
        .filter(|r| r.error_kind.as_deref() == Some("permission_denied"))
        .collect();
    assert_eq!(denied.len(), 8, "each denied call has its receipt");

    let out = s.runtime.run("get(#{id: 3})").await;
    let (kind, message) = error_message(&out);
    assert_eq!(kind, ErrorKind::PermissionDenied);
    assert!(message.contains("off limits"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_rules_deny_forbidden_and_unlisted_names_in_any_case() {
    let s = setup(false);
    for (script, rule) in [
        (r#"cat(#{path: ".env"})"#, "forbidden"),
        (r#"cat(#{path: "config/.ENV.local"})"#, "forbidden"),
        (r#"cat(#{path: "../x"})"#, "root"),
        (r#"cat(#{path: "/etc/passwd"})"#, "root"),
        (r#"cat(#{path: "~/x"})"#, "root"),
        (r#"save(#{path: "src/main.rs"})"#, "write.allow"),
        (r#"save(#{path: "out/Cargo.LOCK"})"#, "write.deny"),
        (r#"save(#{path: ["out/a", ".git/config"]})"#, "forbidden"),
        (r#"save(#{path: 7})"#, "arguments"),
    ] {
        let out = s.runtime.run(script).await;
        let (kind, message) = error_message(&out);
        assert_eq!(kind, ErrorKind::PermissionDenied, "{script}: {message}");
        assert!(message.contains(rule), "{script}: {message}");
    }
    assert!(s.seen.lock().unwrap().is_empty());
    let out = s
        .runtime
        .run(r#"[cat(#{path: "README.md"}).path, save(#{path: "out/r.txt"}).path]"#)
        .await;
    assert_eq!(out.result.unwrap(), json!(["README.md", "out/r.txt"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_condition_that_fails_to_evaluate_denies() {
    let s = setup(false);
    // `amount_cents` missing: `() > 50000` is an error, and an error denies.
    let out = s.runtime.run("refund(#{id: 1})").await;
    let (kind, message) = error_message(&out);
    assert_eq!(kind, ErrorKind::PermissionDenied, "{message}");
    assert!(message.contains("condition"), "{message}");
    assert!(s.seen.lock().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ask_without_a_store_and_inside_a_composite_is_denied_closed() {
    let s = setup(false);
    let out = s.runtime.run("refund(#{amount_cents: 90000})").await;
    let (kind, message) = error_message(&out);
    assert_eq!(kind, ErrorKind::PermissionDenied, "{message}");
    assert!(message.contains("cannot pause"), "{message}");
    let s = setup(true);
    let out = s.runtime.run("both(#{amount_cents: 90000})").await;
    let (kind, message) = error_message(&out);
    assert_eq!(kind, ErrorKind::PermissionDenied, "{message}");
    assert!(message.contains("composite"), "{message}");
    let seen = s.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "only the composite's body ran: {seen:?}");
    // Under the threshold the rule passes and the nested call is made.
    let out = s
        .runtime
        .run("both(#{amount_cents: 100}).amount_cents")
        .await;
    assert_eq!(out.result.unwrap(), json!(100));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ask_pauses_the_script_and_an_approval_makes_that_call_once() {
    let s = setup(true);
    let script = r#"
        let small = refund(#{amount_cents: 100});
        let big = refund(#{amount_cents: 90000});
        [small.amount_cents, big.amount_cents]
    "#;
    let paused = s.runtime.run(script).await;
    assert_eq!(paused.status(), RunStatus::Paused, "{:?}", paused.result);
    let pending = paused.pending.clone().unwrap();
    assert_eq!(pending.awaiting, Awaiting::Approval);
    assert_eq!(pending.tool, "refund");
    assert_eq!(pending.args, json!({"amount_cents": 90000}));
    assert_eq!(
        pending.reason.as_deref(),
        Some("refunds over $500 need a person")
    );
    assert!(pending
        .rule
        .as_deref()
        .unwrap()
        .contains("refunds over $500"));
    assert_eq!(
        s.seen.lock().unwrap().len(),
        1,
        "only the small refund was made"
    );
    let json = paused.to_json();
    assert_eq!(json["pending"]["reason"], "refunds over $500 need a person");

    let done = s
        .runtime
        .resume(
            &paused.run_id,
            Some(Decision::Approve),
            RunOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(
        done.result.clone().unwrap(),
        json!([100, 90000]),
        "{:?}",
        done.result
    );
    let seen = s.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "each refund made once: {seen:?}");

    // A rejection fails the call instead.
    let paused = s.runtime.run(script).await;
    let done = s
        .runtime
        .resume(
            &paused.run_id,
            Some(Decision::Reject {
                reason: Some("no".into()),
            }),
            RunOptions::default(),
        )
        .await
        .unwrap();
    assert!(done.result.is_err());
}

/// The scout evaluates the guard as the executor would and never starts a denied call: the
/// tool's side effect (its log of calls) holds no call the guard refused, speculative or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scout_never_starts_a_denied_call() {
    for mode in [Mode::Speculative, Mode::Sequential] {
        let s = setup(false);
        let script = r#"
            let out = [];
            for i in 0..10 {
                try { out.push(get(#{id: i}).id); } catch (e) { out.push(-1); }
            }
            out
        "#;
        let out = s
            .runtime
            .run_with(script, RunOptions::with_mode(mode))
            .await;
        assert_eq!(
            out.result.unwrap(),
            json!([0, 1, 2, -1, 4, 5, 6, 7, 8, 9]),
            "{mode:?}"
        );
        let seen = s.seen.lock().unwrap().clone();
        assert!(
            !seen.iter().any(|c| c == r#"get {"id":3}"#),
            "{mode:?}: the denied read was started: {seen:?}"
        );
    }
}

#[test]
fn a_manifest_guard_merges_and_decides() {
    let dir = TempDir::new().unwrap();
    let manifest = |text: &str, name: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let a = manifest(
        r#"
[guard]
root = "."
write = { allow = ["out/**"] }

[[guard.rule]]
tools = ["pay*"]
when = "args.cents > 100"
decision = "deny"
reason = "big payments are off"

[[tool]]
name = "pay"
effect = "write"
script = "args"
"#,
        "a.toml",
    );
    let b = manifest(
        r#"
[guard]
forbidden = ["**/private/**"]
"#,
        "b.toml",
    );
    let mut m = Manifests::new();
    m.load_file(&a).unwrap();
    m.load_file(&b).unwrap();
    let registry = m.into_registry().unwrap();
    assert!(registry.guard().is_active());
    assert!(registry.guard().hides("x/private/y"));
    assert!(registry.guard().hides(".env"), "the default list stays");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let runtime = Runtime::builder(registry).build();
    let out = rt.block_on(runtime.run("pay(#{cents: 500})"));
    let e = out.result.unwrap_err();
    assert_eq!(e.kind, ErrorKind::PermissionDenied);
    assert!(e.message.contains("big payments are off"), "{}", e.message);
    let out = rt.block_on(runtime.run("pay(#{cents: 5}).cents"));
    assert_eq!(out.result.unwrap(), json!(5));

    for (bad, says) in [
        ("[guard]\ndefault = \"maybe\"\n", "maybe"),
        (
            "[guard]\n[[guard.rule]]\ntools = []\ndecision = \"deny\"\n",
            "names no tools",
        ),
        (
            "[guard]\n[[guard.rule]]\ntools = [\"x\"]\nwhen = \"args.(\"\ndecision = \"deny\"\n",
            "does not compile",
        ),
        ("[guard]\nread = { allow = [\"[\"] }\n", "not valid"),
        ("[guard]\nroot = \"no/such/folder\"\n", "cannot be opened"),
        ("[guard]\nsurprise = 1\n", "surprise"),
    ] {
        let path = manifest(bad, "bad.toml");
        let mut m = Manifests::new();
        let err = m
            .load_file(&path)
            .and_then(|()| m.into_registry().map(|_| ()))
            .unwrap_err()
            .to_string();
        assert!(err.contains(says), "{bad:?}: {err}");
    }
}

/// `--approve-rule` approves the call and every later call of the same rule in the run; a
/// call another rule asks about still pauses; a tool's own approval cannot be answered with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approve_rule_passes_later_calls_of_that_rule_only() {
    let dir = TempDir::new().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let guard = Guard::builder(dir.path())
        .rule(
            Rule::new(["refund"], Ruling::Ask, "refunds need a person")
                .unwrap()
                .named("refunds"),
        )
        .rule(
            Rule::new(["save"], Ruling::Ask, "saves need a person")
                .unwrap()
                .named("saves"),
        )
        .build()
        .unwrap();
    let registry = Registry::builder()
        .tools(tools(&seen))
        .guard(guard)
        .build()
        .unwrap();
    let store = SqliteStore::open(&dir.path().join("store.sqlite3")).unwrap();
    let runtime = Runtime::builder(registry).store(Arc::new(store)).build();
    let script = r#"
        let a = refund(#{n: 1});
        let b = refund(#{n: 2});
        let c = refund(#{n: 3});
        let d = save(#{path: "out/x"});
        [a.n, b.n, c.n, d.path]
    "#;
    let paused = runtime.run(script).await;
    let pending = paused.pending.clone().unwrap();
    assert_eq!((pending.seq, pending.rule.as_deref()), (0, Some("refunds")));
    let e = paused.result.as_ref().unwrap_err();
    assert!(
        e.suggested_next_action
            .as_deref()
            .unwrap()
            .contains("--approve-rule"),
        "{e:?}"
    );
    let next = runtime
        .resume(
            &paused.run_id,
            Some(Decision::ApproveRule),
            RunOptions::default(),
        )
        .await
        .unwrap();
    // Both later refunds passed; the save's own rule asks.
    let pending = next.pending.clone().expect("paused at the save");
    assert_eq!((pending.seq, pending.tool.as_str()), (3, "save"));
    assert_eq!(pending.rule.as_deref(), Some("saves"));
    assert_eq!(seen.lock().unwrap().len(), 3, "three refunds, each once");
    let done = runtime
        .resume(&next.run_id, Some(Decision::Approve), RunOptions::default())
        .await
        .unwrap();
    assert_eq!(done.result.unwrap(), json!([1, 2, 3, "out/x"]));
    assert_eq!(seen.lock().unwrap().len(), 4);
}

/// The file tools of a manifest with a `[guard]`: listings leave out what the guard forbids,
/// a read of it is denied by the guard before the tool, writes go only where `write` allows.
#[test]
fn file_tools_under_a_manifest_guard() {
    let dir = TempDir::new().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::fs::create_dir_all(root.join("private")).unwrap();
    std::fs::write(root.join("src/a.rs"), "fn a() {}\n").unwrap();
    std::fs::write(root.join(".env"), "TOKEN=1\n").unwrap();
    std::fs::write(root.join("private/k.txt"), "k\n").unwrap();
    std::fs::write(
        root.join("tools.toml"),
        "[guard]\nforbidden = [\"private/**\"]\nwrite = { allow = [\"out/**\"] }\n\n[files]\n",
    )
    .unwrap();
    let mut m = Manifests::new();
    m.load_file(&root.join("tools.toml")).unwrap();
    let registry = m.into_registry().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let runtime = Runtime::new(registry);
    let out = rt.block_on(runtime.run(r#"fs_glob(#{pattern: "**"}).paths"#));
    let paths = out.result.unwrap();
    assert!(
        paths.as_array().unwrap().contains(&json!("src/a.rs")),
        "{paths}"
    );
    for hidden in [".env", "private/k.txt"] {
        assert!(
            !paths.as_array().unwrap().contains(&json!(hidden)),
            "{paths}"
        );
    }
    for (script, rule) in [
        (r#"fs_read(#{path: ".env"})"#, "forbidden"),
        (r#"fs_read(#{path: "private/k.txt"})"#, "forbidden"),
        (
            r#"fs_write(#{path: "src/b.rs", content: "x"})"#,
            "write.allow",
        ),
    ] {
        let e = rt.block_on(runtime.run(script)).result.unwrap_err();
        assert_eq!(
            e.kind,
            ErrorKind::PermissionDenied,
            "{script}: {}",
            e.message
        );
        assert!(e.message.contains(rule), "{script}: {}", e.message);
    }
    let out = rt.block_on(runtime.run(r#"fs_write(#{path: "out/r.txt", content: "ok"}).created"#));
    assert_eq!(out.result.unwrap(), json!(true));
    assert_eq!(
        std::fs::read_to_string(root.join("out/r.txt")).unwrap(),
        "ok"
    );
    assert!(!root.join("src/b.rs").exists());

    // File tools in another folder than the guard's root would be checked by the wrong names.
    std::fs::write(
        root.join("other.toml"),
        "[guard]\n\n[files]\nroot = \"src\"\n",
    )
    .unwrap();
    let mut m = Manifests::new();
    m.load_file(&root.join("other.toml")).unwrap();
    let err = m.into_registry().unwrap_err().to_string();
    assert!(err.contains("not the guard's root"), "{err}");
}

/// The worked example of docs/guard.md, on a repository of 240 files: both modes give the same
/// value, the report is written under `out/`, and the forbidden file is neither listed nor read.
#[test]
fn the_worked_example_runs_the_same_in_both_modes() {
    let dir = TempDir::new().unwrap();
    let root = dir.path();
    let example = root.join("examples/guard");
    std::fs::create_dir_all(&example).unwrap();
    let here = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/guard");
    for name in ["tools.toml", "report.rhai"] {
        std::fs::copy(here.join(name), example.join(name)).unwrap();
    }
    for i in 0..240 {
        let folder = root.join(format!("src/m{}", i % 12));
        std::fs::create_dir_all(&folder).unwrap();
        let todo = if i % 40 == 0 { "// TODO: more\n" } else { "" };
        std::fs::write(
            folder.join(format!("f{i}.rs")),
            format!("{todo}fn f{i}() {{}}\n").repeat(1 + i % 5),
        )
        .unwrap();
    }
    std::fs::write(root.join(".env.rs"), "// TODO: never read\n").unwrap();
    let script = std::fs::read_to_string(example.join("report.rhai")).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut values = Vec::new();
    for mode in [Mode::Speculative, Mode::Sequential] {
        let mut m = Manifests::new();
        m.load_file(&example.join("tools.toml")).unwrap();
        let runtime = Runtime::new(m.into_registry().unwrap());
        let out = rt.block_on(runtime.run_with(&script, RunOptions::with_mode(mode)));
        values.push(out.result.clone().unwrap());
        std::fs::remove_dir_all(root.join("out")).unwrap();
    }
    assert_eq!(values[0], values[1]);
    assert_eq!(
        values[0]["files"],
        json!(242),
        "240 sources, the manifest and the script, not .env.rs"
    );
    assert_eq!(values[0]["todo"], json!(6), "{}", values[0]);
}

/// `[guard] commands` decide command tools and `run_command` (which a manifest offers only
/// with command rules): a denied program is denied through any wrapper; an allowed one runs
/// in the root with nothing of the parent's environment.
#[test]
fn command_rules_from_a_manifest_decide_command_tools() {
    let dir = TempDir::new().unwrap();
    let root = dir.path();
    std::fs::write(root.join("victim.txt"), "keep me\n").unwrap();
    let toml = r#"
[guard]
commands = { allow = ["echo *", "ls *"], ask = ["touch *"], deny = ["rm *"] }

[[tool]]
name = "say"
kind = "command"
argv = ["echo", "{text}"]
effect = "read"
"#;
    std::fs::write(root.join("tools.toml"), toml).unwrap();
    let mut m = Manifests::new();
    m.load_file(&root.join("tools.toml")).unwrap();
    let registry = m.into_registry().unwrap();
    assert!(registry.guard().has_command_rules());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let runtime = Runtime::new(registry);
    let out = rt.block_on(runtime.run(r#"say(#{text: "; rm -rf /"}).stdout"#));
    assert_eq!(out.result.unwrap(), json!("; rm -rf /\n"));
    for (argv, rule) in [
        (r#"["rm", "victim.txt"]"#, "commands.deny"),
        (r#"["/bin/rm", "victim.txt"]"#, "commands.deny"),
        (
            r#"["env", "nice", "timeout", "5", "rm", "victim.txt"]"#,
            "commands.deny",
        ),
        (r#"["sh", "-c", "rm victim.txt"]"#, "sh"),
        (r#"["find", ".", "-delete"]"#, "find"),
        (r#"["touch", "x"]"#, "cannot pause"),
        (r#"["cat", "victim.txt"]"#, "commands.allow"),
    ] {
        let script = format!("run_command(#{{argv: {argv}}})");
        let e = rt.block_on(runtime.run(&script)).result.unwrap_err();
        assert_eq!(e.kind, ErrorKind::PermissionDenied, "{argv}: {}", e.message);
        assert!(e.message.contains(rule), "{argv}: {}", e.message);
    }
    assert_eq!(
        std::fs::read_to_string(root.join("victim.txt")).unwrap(),
        "keep me\n"
    );
    let out = rt.block_on(runtime.run(r#"run_command(#{argv: ["ls", "."]}).stdout"#));
    assert!(out.result.unwrap().as_str().unwrap().contains("victim.txt"));
}

/// File tools without a `[guard]` still have the default one over their folder: `.env` is
/// neither listed nor read.
#[test]
fn file_tools_without_a_guard_keep_the_forbidden_list() {
    let dir = TempDir::new().unwrap();
    let root = dir.path();
    std::fs::write(root.join(".env"), "TOKEN=1\n").unwrap();
    std::fs::write(root.join("a.txt"), "a\n").unwrap();
    std::fs::write(root.join("tools.toml"), "[files]\n").unwrap();
    let mut m = Manifests::new();
    m.load_file(&root.join("tools.toml")).unwrap();
    let registry = m.into_registry().unwrap();
    assert!(registry.guard().is_active());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let runtime = Runtime::new(registry);
    let out = rt.block_on(runtime.run(r#"fs_glob(#{pattern: "*"}).paths"#));
    assert_eq!(out.result.unwrap(), json!(["a.txt", "tools.toml"]));
    let e = rt
        .block_on(runtime.run(r#"fs_read(#{path: ".env"})"#))
        .result
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::PermissionDenied, "{}", e.message);
}

/// A registry whose read `get` a rule asks about for ids from 50 (the rule `big ids`), beside
/// the write `refund`, over a store.
fn asking_reads(dir: &std::path::Path, seen: &Arc<std::sync::Mutex<Vec<String>>>) -> Runtime {
    let guard = Guard::builder(dir)
        .rule(
            Rule::new(["get"], Ruling::Ask, "big ids are private")
                .unwrap()
                .named("big ids")
                .when("args.id >= 50")
                .unwrap(),
        )
        .build()
        .unwrap();
    let registry = Registry::builder()
        .tools(tools(seen))
        .guard(guard)
        .build()
        .unwrap();
    let store = SqliteStore::open(&dir.join("store.sqlite3")).unwrap();
    Runtime::builder(registry).store(Arc::new(store)).build()
}

fn calls_of(seen: &Arc<std::sync::Mutex<Vec<String>>>, call: &str) -> usize {
    seen.lock().unwrap().iter().filter(|c| *c == call).count()
}

/// A read of the script that a rule asks about pauses the run (keyed by its epoch and
/// occurrence), whichever the mode: the read is made only once a person approves it, an
/// approval is for that read alone (the same read in a later epoch asks again),
/// `--approve-rule` lets every later call of the rule through, and the scout never starts
/// the read before a person decides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_a_rule_asks_about_pauses_and_resumes_on_approval() {
    for mode in [Mode::Speculative, Mode::Sequential] {
        let dir = TempDir::new().unwrap();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let runtime = asking_reads(dir.path(), &seen);
        let script = r#"
            let a = get(#{id: 1}).id;
            let b = get(#{id: 60}).id;
            refund(#{amount_cents: 5});
            let c = get(#{id: 60}).id;
            let d = get(#{id: 61}).id;
            [a, b, c, d]
        "#;
        let options = || RunOptions::with_mode(mode);
        let paused = runtime.run_with(script, options()).await;
        assert_eq!(
            paused.status(),
            RunStatus::Paused,
            "{mode:?}: {:?}",
            paused.result
        );
        let pending = paused.pending.clone().unwrap();
        assert_eq!(pending.effect, Effect::Read);
        assert_eq!(pending.read, Some(toolscript::ReadAt::new(0, 0)));
        assert_eq!(pending.rule.as_deref(), Some("big ids"));
        assert_eq!(pending.args, json!({"id": 60}));
        let json = paused.to_json();
        assert_eq!(
            json["pending"]["read"],
            json!({"epoch": 0, "occurrence": 0})
        );
        assert_eq!(
            calls_of(&seen, r#"get {"id":60}"#),
            0,
            "{mode:?}: made before a person decided"
        );
        assert_eq!(
            calls_of(&seen, r#"get {"id":61}"#),
            0,
            "{mode:?}: the scout crossed the pause"
        );

        // An approval makes that read; the same read after the refund asks again.
        let next = runtime
            .resume(&paused.run_id, Some(Decision::Approve), options())
            .await
            .unwrap();
        let pending = next.pending.clone().expect("paused again");
        assert_eq!(
            pending.read,
            Some(toolscript::ReadAt::new(1, 0)),
            "{mode:?}"
        );
        assert_eq!(calls_of(&seen, r#"get {"id":60}"#), 1);
        assert_eq!(
            calls_of(&seen, r#"get {"id":1}"#),
            1,
            "the first read is replayed"
        );

        // The rule, approved: the last read passes without a pause.
        let done = runtime
            .resume(&next.run_id, Some(Decision::ApproveRule), options())
            .await
            .unwrap();
        assert_eq!(
            done.result.clone().unwrap(),
            json!([1, 60, 60, 61]),
            "{mode:?}"
        );
        assert_eq!(calls_of(&seen, r#"get {"id":60}"#), 2);
        assert_eq!(calls_of(&seen, r#"get {"id":61}"#), 1);
        assert_eq!(
            calls_of(&seen, r#"refund {"amount_cents":5}"#),
            1,
            "{mode:?}: the write made once"
        );

        // A decision for the read is not one for anything else: the run is over.
        let again = runtime
            .resume(&done.run_id, Some(Decision::Approve), options())
            .await;
        assert!(again.is_err());
    }
}

/// A rejected read throws `rejected` where the script made it (a script may catch it), and a
/// resume replays the rejection: the read is never made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_read_throws_where_the_script_made_it() {
    let dir = TempDir::new().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let runtime = asking_reads(dir.path(), &seen);
    let script = r#"
        let b = 0;
        try { b = get(#{id: 70}).id; } catch (e) { b = e.kind; }
        b
    "#;
    let paused = runtime.run(script).await;
    assert_eq!(paused.status(), RunStatus::Paused);
    let done = runtime
        .resume(
            &paused.run_id,
            Some(Decision::Reject {
                reason: Some("not this one".into()),
            }),
            RunOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(done.result.unwrap(), json!("rejected"));
    assert_eq!(calls_of(&seen, r#"get {"id":70}"#), 0);
    // Uncaught, the rejection fails the run naming the tool.
    let paused = runtime.run("get(#{id: 71})").await;
    let done = runtime
        .resume(
            &paused.run_id,
            Some(Decision::Reject { reason: None }),
            RunOptions::default(),
        )
        .await
        .unwrap();
    let e = done.result.unwrap_err();
    assert_eq!(e.kind, ErrorKind::Rejected, "{e:?}");
    assert_eq!(calls_of(&seen, r#"get {"id":71}"#), 0);
}

/// No read crosses a pause: the scout starts nothing past a read the guard asks a person
/// about, even where the script would catch its error or the read has not landed yet, until
/// a person has decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scout_starts_nothing_past_a_read_a_rule_asks_about() {
    for script in [
        "let a = get(#{id: 1}).id;\nlet b = 0;\ntry { b = get(#{id: 60}).id; } catch (e) { }\nlet x = get(#{id: 7}).id;\n[a, b, x]",
        "let a = get(#{id: 1});\nlet b = get(#{id: 60});\nlet x = get(#{id: 7});\n[a.id, b.id, x.id]",
        "let out = [];\nfor id in [2, 60, 8, 9] { out.push(get(#{id: id}).id); }\nout",
    ] {
        let dir = TempDir::new().unwrap();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let runtime = asking_reads(dir.path(), &seen);
        let paused = runtime
            .run_with(script, RunOptions::with_mode(Mode::Speculative))
            .await;
        assert_eq!(paused.status(), RunStatus::Paused, "{script}: {:?}", paused.result);
        let after: Vec<String> = seen
            .lock()
            .unwrap()
            .iter()
            .filter(|c| [r#"get {"id":7}"#, r#"get {"id":8}"#, r#"get {"id":9}"#].contains(&c.as_str()))
            .cloned()
            .collect();
        assert!(after.is_empty(), "{script}: read past the pause: {after:?}");
    }
}

/// A slow read `customer` (a VIP, not `ok`), a read `peek` whose calls are kept, a write
/// `refund` a person approves, a write `wire` and a read `audit` a rule asks about.
fn pausing_tools(dir: &std::path::Path, seen: &Arc<std::sync::Mutex<Vec<String>>>) -> Runtime {
    let kept = |name: &'static str| {
        let seen = Arc::clone(seen);
        move |args: Value| {
            let seen = Arc::clone(&seen);
            async move {
                seen.lock().unwrap().push(format!("{name} {args}"));
                Ok(json!({"id": args["id"], "done": true}))
            }
        }
    };
    let customer = Tool::builder("customer", Effect::Read).handler(|args: Value| async move {
        tokio::time::sleep(std::time::Duration::from_millis(60)).await;
        Ok(json!({"id": args["id"], "vip": true, "ok": false}))
    });
    let tools = vec![
        customer,
        Tool::builder("peek", Effect::Read).handler(kept("peek")),
        Tool::builder("refund", Effect::Write)
            .approval(toolscript::Approval::Always)
            .handler(kept("refund")),
        Tool::builder("wire", Effect::Write).handler(kept("wire")),
        Tool::builder("audit", Effect::Read).handler(kept("audit")),
    ];
    let guard = Guard::builder(dir)
        .rule(Rule::new(["wire", "audit"], Ruling::Ask, "a person looks first").unwrap())
        .build()
        .unwrap();
    let registry = Registry::builder()
        .tools(tools)
        .guard(guard)
        .build()
        .unwrap();
    let store = SqliteStore::open(&dir.join("store.sqlite3")).unwrap();
    Runtime::builder(registry).store(Arc::new(store)).build()
}

/// No read crosses a pause on a guessed path: where a branch that may pause (an approval, a
/// rule that asks, a script function that makes such a call) depends on a read still in
/// flight, the scout guesses that branch, stops at its call, and starts nothing after it —
/// whether the branch writes, leaves, is the `else`, or pauses inside a helper. Nor past a
/// read a rule may ask about whose arguments wait for a read in flight (a deferred read).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scout_starts_nothing_past_a_call_that_may_pause() {
    for script in [
        "let c = customer(#{id: 1});\nlet a = audit(#{id: c.id});\npeek(#{id: 2}).id",
        "let c = customer(#{id: 1});\nlet a = audit(#{id: `${c.id}`});\nlet b = peek(#{id: c.id});\npeek(#{id: 2}).id",
        "let c = customer(#{id: 1});\nif c.vip { refund(#{id: 1}); }\npeek(#{id: 2}).id",
        "let c = customer(#{id: 1});\nif c.vip { refund(#{id: 1}); return 0; }\npeek(#{id: 2}).id",
        "let c = customer(#{id: 1});\nif c.ok { peek(#{id: 3}); } else { refund(#{id: 1}); }\npeek(#{id: 2}).id",
        "fn pay(c) { refund(#{id: c.id}) }\nlet c = customer(#{id: 1});\nif c.vip { pay(c); return 0; }\npeek(#{id: 2}).id",
        "fn settle(c) { if c.vip { refund(#{id: c.id}); return true; } false }\nlet c = customer(#{id: 1});\nsettle(c);\npeek(#{id: 2}).id",
        "let c = customer(#{id: 1});\nif c.vip { wire(#{id: 1}); }\npeek(#{id: 2}).id",
        "let c = customer(#{id: 1});\nif c.vip { audit(#{id: 1}); return 0; }\npeek(#{id: 2}).id",
        "let out = [];\nfor id in [1, 2] {\nlet c = customer(#{id: id});\nif c.vip { refund(#{id: id}); continue; }\nout.push(peek(#{id: id}).id);\n}\nout.push(peek(#{id: 9}).id);\nout",
    ] {
        let dir = TempDir::new().unwrap();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let runtime = pausing_tools(dir.path(), &seen);
        let paused = runtime
            .run_with(script, RunOptions::with_mode(Mode::Speculative))
            .await;
        assert_eq!(paused.status(), RunStatus::Paused, "{script}: {:?}", paused.result);
        // The scout's passes have ended with the run; what they started has been counted.
        let peeks: Vec<String> = seen
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.starts_with("peek"))
            .cloned()
            .collect();
        assert!(peeks.is_empty(), "{script}: read past the pause: {peeks:?}");
        assert!(
            paused.receipts.iter().all(|r| r.tool != "peek"),
            "{script}: {:?}",
            paused.receipts
        );
    }
}

/// Applying a plan, any write may pause the run (a divergence from the plan): where the world
/// changed so that a branch's write is no longer the plan's, the scout has started nothing
/// past it when the run pauses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applying_a_plan_the_scout_starts_nothing_past_a_write_that_may_diverge() {
    let dir = TempDir::new().unwrap();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let vip = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = Arc::clone(&vip);
    let customer = Tool::builder("customer", Effect::Read).handler(move |args: Value| {
        let vip = flag.load(std::sync::atomic::Ordering::SeqCst);
        async move {
            tokio::time::sleep(std::time::Duration::from_millis(60)).await;
            Ok(json!({"id": args["id"], "vip": vip}))
        }
    });
    let kept = |name: &'static str| {
        let seen = Arc::clone(&seen);
        move |args: Value| {
            let seen = Arc::clone(&seen);
            async move {
                seen.lock().unwrap().push(format!("{name} {args}"));
                Ok(json!({"id": args["id"]}))
            }
        }
    };
    let tools = vec![
        customer,
        Tool::builder("peek", Effect::Read).handler(kept("peek")),
        Tool::builder("wire", Effect::Write).handler(kept("wire")),
    ];
    let registry = Registry::builder().tools(tools).build().unwrap();
    let store = SqliteStore::open(&dir.path().join("store.sqlite3")).unwrap();
    let runtime = Runtime::builder(registry).store(Arc::new(store)).build();
    let script = "let c = customer(#{id: 1});\nif c.vip { wire(#{id: 1}); }\npeek(#{id: 2}).id";
    let planned = runtime
        .plan(script, RunOptions::with_mode(Mode::Speculative))
        .await
        .unwrap();
    assert!(planned.plan.calls.is_empty(), "{:?}", planned.plan.calls);
    seen.lock().unwrap().clear();
    vip.store(true, std::sync::atomic::Ordering::SeqCst);
    let applied = runtime
        .apply(
            &planned.plan.plan_id,
            RunOptions::with_mode(Mode::Speculative),
        )
        .await
        .unwrap();
    assert_eq!(applied.status(), RunStatus::Paused, "{:?}", applied.result);
    let seen = seen.lock().unwrap().clone();
    assert!(
        seen.is_empty(),
        "read or written past the divergence: {seen:?}"
    );
}
