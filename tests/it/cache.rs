//! The cache of reads across runs: hits across runs of one store (and of one runtime without
//! a store), expiry, scopes by arguments and by context, `no_cache`, invalidating writes, what
//! is never cached, a changed tool missing, receipts and stats of a hit, the breaker never
//! touched and the budget charged; and manifests' cache settings and their errors.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use toolscript::{
    BreakerConfig, Effect, Error, ErrorKind, Limits, Manifests, Mode, Registry, RunOptions,
    RunOutcome, Runtime, SqliteStore, Store, Tool, ToolError,
};

use crate::support::{error_of, value_of};

/// The catalog's state and counters: rates by account, how often each body ran.
#[derive(Clone, Default)]
struct Bank {
    rates: Arc<Mutex<HashMap<String, i64>>>,
    rate_calls: Arc<AtomicUsize>,
    tenant_calls: Arc<AtomicUsize>,
    failing_calls: Arc<AtomicUsize>,
    /// While true, `rate` fails with `unavailable`.
    down: Arc<AtomicBool>,
}

impl Bank {
    fn calls(&self) -> usize {
        self.rate_calls.load(Ordering::SeqCst)
    }
}

fn account_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"account": {"type": "string"}, "rate": {"type": "integer"}},
        "required": ["account"],
        "additionalProperties": false
    })
}

/// `rate` (cached, scope `args.account`), `tenant_rate` (cached, scope `context.tenant`),
/// `failing` (cached, always fails), `set_rate` (invalidates `rate`), `note` (a write that
/// invalidates nothing). `version` is `rate`'s version.
fn tools(bank: &Bank, ttl: Duration, version: &str) -> Vec<Tool> {
    let (rates, calls, down) = (
        Arc::clone(&bank.rates),
        Arc::clone(&bank.rate_calls),
        Arc::clone(&bank.down),
    );
    let rate = Tool::builder("rate", Effect::Read)
        .input_schema(account_schema())
        .cache_ttl(ttl)
        .cache_scope(["args.account"])
        .version(version)
        .handler(move |args| {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            let account = args["account"].as_str().unwrap_or_default().to_string();
            let rate = *rates.lock().unwrap().get(&account).unwrap_or(&1);
            let down = down.load(Ordering::SeqCst);
            async move {
                if down {
                    return Err(ToolError::new(ErrorKind::Unavailable, "the bank is down"));
                }
                Ok(json!({"account": account, "rate": rate, "n": n}))
            }
        });
    let tenant_calls = Arc::clone(&bank.tenant_calls);
    let tenant_rate = Tool::builder("tenant_rate", Effect::Read)
        .cache_ttl(ttl)
        .cache_scope(["context.tenant"])
        .handler(move |_| {
            let n = tenant_calls.fetch_add(1, Ordering::SeqCst);
            async move { Ok(json!({"n": n})) }
        });
    let failing_calls = Arc::clone(&bank.failing_calls);
    let failing = Tool::builder("failing", Effect::Read)
        .cache_ttl(ttl)
        .handler(move |_| {
            failing_calls.fetch_add(1, Ordering::SeqCst);
            async { Err(ToolError::not_found("nothing here")) }
        });
    let rates = Arc::clone(&bank.rates);
    let set_rate = Tool::builder("set_rate", Effect::Write)
        .input_schema(account_schema())
        .invalidates(["rate"])
        .handler(move |args| {
            let account = args["account"].as_str().unwrap_or_default().to_string();
            let rate = args["rate"].as_i64().unwrap_or_default();
            rates.lock().unwrap().insert(account, rate);
            async { Ok(Value::Null) }
        });
    let note = Tool::builder("note", Effect::Write).handler(|_| async { Ok(Value::Null) });
    vec![rate, tenant_rate, failing, set_rate, note]
}

fn registry(bank: &Bank, ttl: Duration, version: &str) -> Registry {
    Registry::builder()
        .tools(tools(bank, ttl, version))
        .build()
        .expect("the catalog is valid")
}

fn on_store(bank: &Bank, store: &Arc<SqliteStore>) -> Runtime {
    Runtime::builder(registry(bank, Duration::from_secs(60), "1"))
        .store(Arc::clone(store) as Arc<dyn Store>)
        .build()
}

fn new_store() -> (tempfile::TempDir, Arc<SqliteStore>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("s.sqlite3")).unwrap());
    (dir, store)
}

async fn run(runtime: &Runtime, script: &str, options: RunOptions) -> RunOutcome {
    runtime.run_with(script, options).await
}

fn seq() -> RunOptions {
    RunOptions::with_mode(Mode::Sequential)
}

const TWO_ACCOUNTS: &str = r#"[rate(#{account: "a"}), rate(#{account: "b"})]"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_run_on_one_store_reads_from_the_cache() {
    let (_dir, store) = new_store();
    let bank = Bank::default();
    let first = run(&on_store(&bank, &store), TWO_ACCOUNTS, seq()).await;
    assert_eq!(bank.calls(), 2);
    assert_eq!(first.stats.cache_hits, 0);
    // A new runtime (a new process, say) on the same store.
    let second = run(&on_store(&bank, &store), TWO_ACCOUNTS, seq()).await;
    assert_eq!(bank.calls(), 2, "the tool body ran once per account");
    assert_eq!(value_of(&second), value_of(&first));
    assert_eq!(second.stats.cache_hits, 2);
    // The receipts say the cache answered, with the entry's age, and no attempt was made.
    let hits: Vec<_> = second.receipts.iter().filter(|r| r.cached).collect();
    assert_eq!(hits.len(), 2);
    for r in &hits {
        assert_eq!(r.tool, "rate");
        assert_eq!(r.attempt, 0);
        assert!(r.cached_age_ms.is_some_and(|age| age >= 0.0), "{r:?}");
    }
    assert!(first
        .receipts
        .iter()
        .all(|r| !r.cached && r.cached_age_ms.is_none()));
    // The receipts file of a run with hits verifies.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r.jsonl");
    toolscript::receipts::write_receipts(&path, &second.receipts).unwrap();
    toolscript::receipts::verify_receipts(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("\"cached\":true"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_store_the_runtime_s_runs_share_a_cache_in_memory() {
    let bank = Bank::default();
    let runtime = Runtime::new(registry(&bank, Duration::from_secs(60), "1"));
    run(&runtime, TWO_ACCOUNTS, seq()).await;
    let second = run(&runtime, TWO_ACCOUNTS, seq()).await;
    assert_eq!(bank.calls(), 2);
    assert_eq!(second.stats.cache_hits, 2);
    // Another runtime has a cache of its own.
    let other = Runtime::new(registry(&bank, Duration::from_secs(60), "1"));
    run(&other, TWO_ACCOUNTS, seq()).await;
    assert_eq!(bank.calls(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_never_reads_entries_it_made_itself() {
    let bank = Bank::default();
    let runtime = Runtime::new(registry(&bank, Duration::from_secs(60), "1"));
    // The same read in two epochs: the second is dispatched again within the run.
    let script =
        r#"let a = rate(#{account: "a"}); note(#{}); let b = rate(#{account: "a"}); [a.n, b.n]"#;
    let outcome = run(&runtime, script, seq()).await;
    assert_eq!(value_of(&outcome), &json!([0, 1]));
    assert_eq!(outcome.stats.cache_hits, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_expire() {
    let (_dir, store) = new_store();
    let bank = Bank::default();
    let short = || {
        Runtime::builder(registry(&bank, Duration::from_millis(30), "1"))
            .store(Arc::clone(&store) as Arc<dyn Store>)
            .build()
    };
    run(&short(), TWO_ACCOUNTS, seq()).await;
    tokio::time::sleep(Duration::from_millis(120)).await;
    // `prune` removes expired entries.
    let pruned = toolscript::prune(&*store, toolscript::PruneRule::default())
        .await
        .unwrap();
    assert_eq!(pruned.cache_entries, 2, "{pruned:?}");
    let second = run(&short(), TWO_ACCOUNTS, seq()).await;
    assert_eq!(bank.calls(), 4, "expired entries answer nothing");
    assert_eq!(second.stats.cache_hits, 0);
    // Entries that expired without a prune answer nothing either.
    tokio::time::sleep(Duration::from_millis(120)).await;
    let third = run(&short(), TWO_ACCOUNTS, seq()).await;
    assert_eq!(bank.calls(), 6);
    assert_eq!(third.stats.cache_hits, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_arguments_and_other_tenants_miss() {
    let (_dir, store) = new_store();
    let bank = Bank::default();
    run(&on_store(&bank, &store), r#"rate(#{account: "a"})"#, seq()).await;
    run(&on_store(&bank, &store), r#"rate(#{account: "c"})"#, seq()).await;
    assert_eq!(bank.calls(), 2, "another account is another entry");

    let tenant = |t: &str| seq().context(json!({"tenant": t}));
    let calls = || bank.tenant_calls.load(Ordering::SeqCst);
    let a1 = run(&on_store(&bank, &store), "tenant_rate(#{})", tenant("a")).await;
    let b = run(&on_store(&bank, &store), "tenant_rate(#{})", tenant("b")).await;
    assert_eq!(calls(), 2, "another tenant misses");
    assert_ne!(value_of(&a1), value_of(&b));
    let a2 = run(&on_store(&bank, &store), "tenant_rate(#{})", tenant("a")).await;
    assert_eq!(calls(), 2, "the same tenant hits");
    assert_eq!(value_of(&a2), value_of(&a1));
    let none = run(&on_store(&bank, &store), "tenant_rate(#{})", seq()).await;
    assert_eq!(calls(), 3, "a run without a tenant is a scope of its own");
    assert_ne!(value_of(&none), value_of(&a1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_cache_dispatches_and_keeps_nothing() {
    let (_dir, store) = new_store();
    let bank = Bank::default();
    run(&on_store(&bank, &store), TWO_ACCOUNTS, seq().no_cache()).await;
    let second = run(&on_store(&bank, &store), TWO_ACCOUNTS, seq()).await;
    assert_eq!(bank.calls(), 4, "a run without the cache kept nothing");
    let third = run(&on_store(&bank, &store), TWO_ACCOUNTS, seq().no_cache()).await;
    assert_eq!(bank.calls(), 6, "a run without the cache reads nothing");
    assert_eq!(third.stats.cache_hits, 0);
    assert_eq!(second.stats.cache_hits, 0);
    let runtime = on_store(&bank, &store).without_cache();
    run(&runtime, TWO_ACCOUNTS, seq()).await;
    assert_eq!(bank.calls(), 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalidating_write_drops_its_scope_s_entries_only() {
    let (_dir, store) = new_store();
    let bank = Bank::default();
    run(&on_store(&bank, &store), TWO_ACCOUNTS, seq()).await;
    assert_eq!(bank.calls(), 2);
    // Within the run: a hit, the write, then the read again reaches the tool.
    let script = r#"
        let before = rate(#{account: "a"});
        set_rate(#{account: "a", rate: 7});
        let after = rate(#{account: "a"});
        [before.rate, after.rate]
    "#;
    let outcome = run(&on_store(&bank, &store), script, seq()).await;
    assert_eq!(value_of(&outcome), &json!([1, 7]));
    assert_eq!(outcome.stats.cache_hits, 1);
    assert_eq!(bank.calls(), 3);
    // The read after the write left a fresh entry: later runs see the new rate.
    let later = run(&on_store(&bank, &store), TWO_ACCOUNTS, seq()).await;
    assert_eq!(bank.calls(), 3);
    assert_eq!(later.stats.cache_hits, 2);
    assert_eq!(value_of(&later)[0]["rate"], json!(7));
    // A write alone drops its account's entry for later runs, and only that one.
    run(
        &on_store(&bank, &store),
        r#"set_rate(#{account: "b", rate: 4})"#,
        seq(),
    )
    .await;
    let later = run(&on_store(&bank, &store), TWO_ACCOUNTS, seq()).await;
    assert_eq!(bank.calls(), 4, "b was read again, a answered by the cache");
    assert_eq!(later.stats.cache_hits, 1);
    assert_eq!(value_of(&later)[1]["rate"], json!(4));
    // A write that invalidates nothing drops nothing.
    run(&on_store(&bank, &store), r#"note(#{})"#, seq()).await;
    let again = run(&on_store(&bank, &store), TWO_ACCOUNTS, seq()).await;
    assert_eq!(again.stats.cache_hits, 2);
    assert_eq!(bank.calls(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalidating_write_in_memory_drops_its_scope_too() {
    let bank = Bank::default();
    let runtime = Runtime::new(registry(&bank, Duration::from_secs(60), "1"));
    run(&runtime, TWO_ACCOUNTS, seq()).await;
    run(&runtime, r#"set_rate(#{account: "b", rate: 3})"#, seq()).await;
    let later = run(&runtime, TWO_ACCOUNTS, seq()).await;
    assert_eq!(later.stats.cache_hits, 1);
    assert_eq!(value_of(&later)[1]["rate"], json!(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_never_cached() {
    let (_dir, store) = new_store();
    let bank = Bank::default();
    for _ in 0..2 {
        let outcome = run(&on_store(&bank, &store), "failing(#{})", seq()).await;
        assert_eq!(error_of(&outcome).kind, ErrorKind::NotFound);
    }
    assert_eq!(bank.failing_calls.load(Ordering::SeqCst), 2);
    bank.down.store(true, Ordering::SeqCst);
    run(&on_store(&bank, &store), r#"rate(#{account: "z"})"#, seq()).await;
    bank.down.store(false, Ordering::SeqCst);
    let outcome = run(&on_store(&bank, &store), r#"rate(#{account: "z"})"#, seq()).await;
    value_of(&outcome);
    assert_eq!(outcome.stats.cache_hits, 0);
    assert_eq!(bank.calls(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_tool_definition_misses() {
    let (_dir, store) = new_store();
    let bank = Bank::default();
    let with = |version: &str| {
        Runtime::builder(registry(&bank, Duration::from_secs(60), version))
            .store(Arc::clone(&store) as Arc<dyn Store>)
            .build()
    };
    run(&with("1"), TWO_ACCOUNTS, seq()).await;
    let changed = run(&with("2"), TWO_ACCOUNTS, seq()).await;
    assert_eq!(
        bank.calls(),
        4,
        "version 2's calls miss version 1's entries"
    );
    assert_eq!(changed.stats.cache_hits, 0);
    let same = run(&with("2"), TWO_ACCOUNTS, seq()).await;
    assert_eq!(same.stats.cache_hits, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hit_never_touches_the_breaker() {
    let (_dir, store) = new_store();
    let bank = Bank::default();
    let runtime = Runtime::builder(registry(&bank, Duration::from_secs(60), "1"))
        .store(Arc::clone(&store) as Arc<dyn Store>)
        .breaker({
            let mut config = BreakerConfig::default();
            config.failure_threshold = 2;
            config.cooldown = Duration::from_secs(600);
            config
        })
        .build();
    run(&runtime, r#"rate(#{account: "a"})"#, seq()).await;
    // Another run (which sees the entry) opens `rate`'s breaker with two failures...
    bank.down.store(true, Ordering::SeqCst);
    let script = r#"
        let kinds = [];
        for x in ["x", "y", "w"] { try { rate(#{account: x}); kinds.push("ok"); } catch (e) { kinds.push(e.kind); } }
        kinds.push(rate(#{account: "a"}).rate);
        try { rate(#{account: "v"}); } catch (e) { kinds.push(e.kind); }
        kinds
    "#;
    let outcome = run(&runtime, script, seq()).await;
    // ...the hit answers through the open breaker, and leaves it open.
    assert_eq!(
        value_of(&outcome),
        &json!([
            "unavailable",
            "unavailable",
            "circuit_open",
            1,
            "circuit_open"
        ])
    );
    assert_eq!(outcome.stats.cache_hits, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hit_is_a_call_of_the_budget() {
    let (_dir, store) = new_store();
    let bank = Bank::default();
    let script = r#"[rate(#{account: "a"}), rate(#{account: "b"}), rate(#{account: "c"})]"#;
    run(&on_store(&bank, &store), script, seq()).await;
    let mut limits = Limits::default();
    limits.max_calls = 2;
    for mode in [Mode::Sequential, Mode::Speculative] {
        let runtime = Runtime::builder(registry(&bank, Duration::from_secs(60), "1"))
            .store(Arc::clone(&store) as Arc<dyn Store>)
            .limits(limits.clone())
            .build();
        let outcome = run(&runtime, script, RunOptions::with_mode(mode)).await;
        assert_eq!(
            error_of(&outcome).kind,
            ErrorKind::BudgetExceeded,
            "{mode:?}"
        );
    }
    assert_eq!(bank.calls(), 3, "only hits were made after the first run");
}

/// Fills a fresh store's cache with both accounts' rates, then runs a script that reads them,
/// writes one and reads them again, in `mode`.
async fn read_write_read(mode: Mode) -> RunOutcome {
    let (_dir, store) = new_store();
    let bank = Bank::default();
    let script = r#"
        let a = rate(#{account: "a"});
        let b = rate(#{account: "b"});
        set_rate(#{account: "a", rate: a.rate + 1});
        let c = rate(#{account: "a"});
        let d = rate(#{account: "b"});
        [a.rate, b.rate, c.rate, d.rate, a.n, b.n, c.n, d.n]
    "#;
    run(&on_store(&bank, &store), TWO_ACCOUNTS, seq()).await;
    run(
        &on_store(&bank, &store),
        script,
        RunOptions::with_mode(mode),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speculative_runs_read_the_same_entries_as_sequential_ones() {
    let sequential = read_write_read(Mode::Sequential).await;
    let speculative = read_write_read(Mode::Speculative).await;
    assert_eq!(value_of(&sequential), &json!([1, 1, 2, 1, 0, 1, 2, 1]));
    assert_eq!(value_of(&speculative), value_of(&sequential));
    assert_eq!(sequential.stats.cache_hits, 3);
    assert_eq!(speculative.stats.cache_hits, 3);
}

fn load(text: &str) -> Result<Registry, Error> {
    let mut manifests = Manifests::new();
    manifests.load_str(Path::new("bank.toml"), text)?;
    manifests.into_registry()
}

#[track_caller]
fn manifest_error(text: &str) -> (Option<usize>, String) {
    match load(text) {
        Err(Error::Manifest { line, message, .. }) => (line, message),
        Err(other) => panic!("expected a manifest error, got {other}"),
        Ok(_) => panic!("expected a manifest error, the manifest loaded"),
    }
}

const MANIFEST: &str = r#"
[[tool]]
name = "get_rate"
effect = "read"
cache_ttl_s = 60
cache_scope = ["args.account", "context.tenant"]
input = { type = "object", properties = { account = { type = "string" } }, additionalProperties = false }
script = '''
state.n = (state.n ?? 0) + 1;
#{ rate: state.rate ?? 1, n: state.n }
'''

[[tool]]
name = "set_rate"
effect = "write"
invalidates = ["get_rate"]
input = { type = "object", properties = { account = { type = "string" }, rate = { type = "integer" } } }
script = 'state.rate = args.rate; ()'
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifests_declare_caches_and_invalidations() {
    let registry = load(MANIFEST).unwrap();
    let runtime = Runtime::new(registry);
    let read = r#"get_rate(#{account: "a"}).n"#;
    let first = run(&runtime, read, seq()).await;
    let second = run(&runtime, read, seq()).await;
    assert_eq!(value_of(&first), value_of(&second));
    assert_eq!(second.stats.cache_hits, 1);
    run(&runtime, r#"set_rate(#{account: "a", rate: 5})"#, seq()).await;
    let third = run(&runtime, r#"get_rate(#{account: "a"}).rate"#, seq()).await;
    assert_eq!(value_of(&third), &json!(5));
    assert_eq!(third.stats.cache_hits, 0);
}

#[test]
fn manifest_cache_mistakes_name_the_file_and_line() {
    let cases = [
        (
            "[[tool]]\nname = \"w\"\neffect = \"write\"\ncache_ttl_s = 5\nscript = '1'\n",
            "a cache is for reads only",
        ),
        (
            "[[tool]]\nname = \"r\"\neffect = \"read\"\ncache_ttl_s = 5\ncache_scope = \"args.nope\"\ninput = { type = \"object\", properties = { a = { type = \"string\" } }, additionalProperties = false }\nscript = '1'\n",
            "names an argument its input schema does not allow",
        ),
        (
            "[[tool]]\nname = \"r\"\neffect = \"read\"\ncache_ttl_s = 5\ncache_scope = \"tenant\"\nscript = '1'\n",
            "is not a path",
        ),
        (
            "[[tool]]\nname = \"w\"\neffect = \"write\"\ninvalidates = [\"ghost\"]\nscript = '1'\n",
            "`invalidates` names `ghost`",
        ),
        (
            "[[tool]]\nname = \"r\"\neffect = \"read\"\ncache_ttl_s = 0\nscript = '1'\n",
            "greater than zero",
        ),
        (
            "[[tool]]\nname = \"r\"\neffect = \"read\"\ncache_scope = \"args.a\"\nscript = '1'\n",
            "without `cache_ttl`",
        ),
        (
            "[[tool]]\nname = \"r\"\neffect = \"read\"\ninvalidates = [\"r\"]\nscript = '1'\n",
            "`invalidates` is for tools that are not reads",
        ),
        (
            "[[mcp]]\ncommand = [\"x\"]\ncache = { get = { ttl_s = -1 } }\n",
            "greater than zero",
        ),
    ];
    for (text, expected) in cases {
        let (line, message) = manifest_error(text);
        assert_eq!(line, Some(1), "{message}");
        assert!(message.contains(expected), "{expected}: {message}");
    }
}

/// The command line: the demo over its cached catalog twice on one store, the second from the
/// cache with the same value; `--no-cache` dispatches every read.
#[test]
fn the_demo_twice_on_one_store_reads_from_the_cache_and_no_cache_dispatches() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("s.sqlite3");
    let store = store.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "scripts/demo.rhai",
            "--tools",
            "scripts/bench/demo_cached.toml",
            "--store",
            store,
            "--json",
        ];
        args.extend_from_slice(extra);
        let out = crate::cli::toolscript(&args);
        let report: Value = serde_json::from_str(&out.stdout).expect("run --json prints JSON");
        assert_eq!(report["ok"], json!(true), "{report}");
        report
    };
    let first = run(&[]);
    let second = run(&[]);
    let uncached = run(&["--no-cache"]);
    assert_eq!(first["stats"]["cache_hits"], json!(0));
    let hits = second["stats"]["cache_hits"].as_u64().unwrap();
    assert!(hits > 0, "{second}");
    assert_eq!(uncached["stats"]["cache_hits"], json!(0));
    assert_eq!(first["value"], second["value"]);
    assert_eq!(first["value"], uncached["value"]);
}

/// A call that invalidates, abandoned while its body runs (its composite timed out), may have
/// taken effect: its drops still happen, and the run's next read reaches the tool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_invalidating_call_still_drops() {
    let (_dir, store) = new_store();
    let bank = Bank::default();
    let slow_set = Tool::builder("slow_set", Effect::Write)
        .input_schema(account_schema())
        .invalidates(["rate"])
        .handler(|_| async {
            tokio::time::sleep(Duration::from_secs(20)).await;
            Ok(Value::Null)
        });
    let batch = Tool::builder("batch", Effect::Write)
        .nested(["slow_set"])
        .timeout(Duration::from_millis(50))
        .composite(|_, ctx| async move { ctx.call("slow_set", json!({"account": "a"})).await });
    let mut all = tools(&bank, Duration::from_secs(60), "1");
    all.extend([slow_set, batch]);
    let runtime = || {
        Runtime::builder(Registry::builder().tools(all.clone()).build().unwrap())
            .store(Arc::clone(&store) as Arc<dyn Store>)
            .build()
    };
    run(&runtime(), TWO_ACCOUNTS, seq()).await;
    let script = r#"
        let kind = "ok";
        try { batch(#{}); } catch (e) { kind = e.kind; }
        [kind, rate(#{account: "a"}).n, rate(#{account: "b"}).n]
    "#;
    let outcome = run(&runtime(), script, seq()).await;
    let value = value_of(&outcome);
    assert_ne!(value[0], json!("ok"), "{value}");
    assert_eq!(
        value[1],
        json!(2),
        "a's entry was dropped: the tool answered"
    );
    assert_eq!(value[2], json!(1), "b's entry stayed");
    assert_eq!(outcome.stats.cache_hits, 1);
}
