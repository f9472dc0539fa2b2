//! Result policies: a run's output (value, logs, error) within `max_inline_tokens`, what does
//! not fit kept byte-exact as an artifact, every page within the budget and the pages together
//! the whole.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use proptest::prelude::*;
use serde_json::{json, Value};
use tempfile::TempDir;
use toolscript::{
    artifact_page, artifact_pages, Effect, Limits, Registry, ResultPolicy, RunOptions, RunOutcome,
    Runtime, SqliteStore, Store, StoredArtifact, Tool,
};

use crate::support::sha256;

/// `value` in the form artifacts are stored in (canonical JSON's key form: keys sorted by their
/// bytes, numbers as serde_json writes them), which serde_json's sorted map gives for the plain
/// values these tests store.
fn canonical(value: &Value) -> String {
    serde_json::to_string(value).unwrap()
}

fn tokens(value: &Value) -> usize {
    tiktoken_rs::o200k_base_singleton()
        .encode_ordinary(&canonical(value))
        .len()
}

/// The tokens of the output a model receives: value, logs and error.
fn output_tokens(out: &Value) -> usize {
    ["value", "logs", "error"]
        .iter()
        .filter_map(|k| out.get(*k))
        .map(tokens)
        .sum()
}

/// An artifact as stored, read on a thread of its own: callers are sync and async alike.
fn stored(store: &SqliteStore, id: &str) -> StoredArtifact {
    std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            rt.block_on(store.artifact(id))
                .unwrap()
                .expect("the artifact is stored")
        })
        .join()
        .unwrap()
    })
}

/// The fields a page holds its body in, one per page.
const BODIES: [&str; 4] = ["items", "entries", "text", "json"];

/// Every page of an artifact as `artifact --page N` gives it, each checked against its budget
/// (which is within the run's) and against a quarter of it; the value they stand for, put
/// together as docs/results.md says: items concatenated, entries merged, text concatenated,
/// JSON text concatenated and parsed.
fn all_pages(store: &SqliteStore, id: &str, budget: usize) -> Value {
    let stored = stored(store, id);
    let text = String::from_utf8(stored.content).unwrap();
    let page_tokens = stored.page_tokens.max(toolscript::MIN_PAGE_TOKENS);
    assert!(
        page_tokens < budget,
        "{page_tokens} for a budget of {budget}"
    );
    let all: Vec<Value> = artifact_pages(&text, stored.page_tokens)
        .unwrap()
        .iter()
        .map(|p| serde_json::to_value(p).unwrap())
        .collect();
    let pages = all.len();
    // One page as `artifact --page N` and `ts_artifact` give it: the same as in the list.
    let last = artifact_page(&text, stored.page_tokens, pages - 1).unwrap();
    assert_eq!(last["pages"], json!(pages));
    assert_eq!(Some(&last), all.last());
    let kind = BODIES.iter().find(|k| all[0].get(**k).is_some()).unwrap();
    let (mut items, mut entries, mut joined) = (Vec::new(), serde_json::Map::new(), String::new());
    for (n, page) in all.into_iter().enumerate() {
        assert_eq!(page["page"], json!(n));
        let body = &page[*kind];
        let t = tokens(body);
        assert!(
            t <= page_tokens,
            "page {n} of {pages} is {t} tokens, over {page_tokens}"
        );
        assert!(
            n + 1 == pages || t >= page_tokens / 4,
            "page {n} of {pages} is {t} tokens, under a quarter of {page_tokens}"
        );
        match body {
            Value::Array(a) => items.extend(a.iter().cloned()),
            Value::Object(m) => {
                for (k, v) in m {
                    assert!(entries.insert(k.clone(), v.clone()).is_none(), "{k} twice");
                }
            }
            Value::String(s) => joined.push_str(s),
            other => panic!("a page is items, entries or text, not {other}"),
        }
    }
    assert!(artifact_page(&text, stored.page_tokens, pages).is_err());
    match *kind {
        "items" => Value::Array(items),
        "entries" => Value::Object(entries),
        "text" => Value::String(joined),
        _ => serde_json::from_str(&joined).unwrap(),
    }
}

fn bounded_runtime(dir: &TempDir, tools: Vec<Tool>, budget: usize) -> (Runtime, Arc<SqliteStore>) {
    let store = Arc::new(SqliteStore::open(&dir.path().join("store.sqlite3")).unwrap());
    let mut limits = Limits::default();
    limits.max_inline_tokens = budget;
    // Rhai measures a container whole after every change when its sizes are set (quadratic
    // for a large result): they are off by default in favour of the memory budget, which is
    // checked where allocations are counted, as the command line counts them. Without the
    // probe the engine would fall back to sizes.
    toolscript::set_memory_probe(|| crate::ALLOCATOR.allocated());
    limits.max_operations = 50_000_000;
    let runtime = Runtime::builder(Registry::builder().tools(tools).build().unwrap())
        .limits(limits)
        .store(Arc::clone(&store) as Arc<dyn Store>)
        .build();
    (runtime, store)
}

/// A tool that returns `value`, with `policy`.
fn giving(value: Value, policy: ResultPolicy) -> Tool {
    Tool::builder("give", Effect::Read)
        .result_policy(policy)
        .handler(move |_| {
            let value = value.clone();
            async move { Ok(value) }
        })
}

fn artifact_of(outcome: &RunOutcome) -> String {
    assert_eq!(outcome.artifacts.len(), 1, "{:?}", outcome.artifacts);
    outcome.artifacts[0].id.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_100000_item_array_is_paged_and_kept_whole() {
    let dir = TempDir::new().unwrap();
    let (runtime, store) = bounded_runtime(&dir, vec![], 1200);
    let outcome = runtime
        .run("let xs = []; for i in 0..100000 { xs.push(#{id: i, name: `user${i}`}); } xs")
        .await;
    let whole: Value = (0..100_000)
        .map(|i| json!({"id": i, "name": format!("user{i}")}))
        .collect();
    assert_eq!(
        outcome.result.as_ref().unwrap(),
        &whole,
        "the library gets it whole"
    );
    let out = outcome.to_json();
    assert!(
        output_tokens(&out) <= 1200,
        "{} tokens",
        output_tokens(&out)
    );
    let value = &out["value"];
    assert_eq!(value["policy"], "page");
    assert_eq!(value["page"], 0);
    assert!(value["items"].as_array().unwrap().len() > 5);
    let id = artifact_of(&outcome);
    assert_eq!(value["artifact"], json!(id));
    let stored = stored(&store, &id);
    assert_eq!(
        sha256(std::str::from_utf8(&stored.content).unwrap()),
        sha256(&canonical(&whole))
    );
    assert_eq!(outcome.artifacts[0].sha256, sha256(&canonical(&whole)));
    assert_eq!(all_pages(&store, &id, 1200), whole);
    assert_eq!(value["pages"].as_u64(), Some(outcome.artifacts[0].pages));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deep_map_is_summarised_deterministically() {
    let dir = TempDir::new().unwrap();
    let (runtime, store) = bounded_runtime(&dir, vec![], 300);
    let script = r#"
        let m = #{};
        for i in 0..200 {
            m[`k${i}`] = #{ a: #{ b: #{ c: #{ d: [i, i + 1, `${i} deep`] } } }, text: `value number ${i}` };
        }
        m
    "#;
    let outcome = runtime.run(script).await;
    let out = outcome.to_json();
    assert!(output_tokens(&out) <= 300, "{} tokens", output_tokens(&out));
    assert_eq!(out["value"]["policy"], "compress");
    assert!(out["value"]["summary"].is_object(), "{:#}", out["value"]);
    let again = runtime.run(script).await.to_json();
    assert_eq!(
        again["value"], out["value"],
        "the same value, the same summary"
    );
    let id = artifact_of(&outcome);
    let stored = stored(&store, &id);
    assert_eq!(
        stored.content,
        canonical(outcome.result.as_ref().unwrap()).into_bytes()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inline_tool_over_the_cap_fails_the_run_instead_of_cutting_it() {
    let dir = TempDir::new().unwrap();
    let big: Value = (0..2000).map(|i| json!({"line": i})).collect();
    let (runtime, _) = bounded_runtime(&dir, vec![giving(big.clone(), ResultPolicy::Inline)], 1200);
    let outcome = runtime.run("give()").await;
    let error = outcome.result.as_ref().unwrap_err();
    assert_eq!(error.kind_name(), "limit_exceeded");
    assert!(
        error.message.contains("`give`") && error.message.contains("1200"),
        "{}",
        error.message
    );
    let out = outcome.to_json();
    assert!(output_tokens(&out) <= 1200);
    // Under the cap, an inline result is the value itself.
    let small = runtime.run("give().extract(0, 3)").await;
    assert_eq!(
        small.result.unwrap(),
        json!([{"line": 0}, {"line": 1}, {"line": 2}])
    );
    // A page policy on the tool applies when the run's value is its result.
    let (paged, _) = bounded_runtime(&dir, vec![giving(big, ResultPolicy::Page)], 1200);
    let out = paged.run("give()").await.to_json();
    assert_eq!(out["value"]["policy"], "page");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_store_the_output_is_bounded_and_says_the_rest_was_not_kept() {
    let mut limits = Limits::default();
    limits.max_inline_tokens = 400;
    let runtime = Runtime::builder(Registry::builder().build().unwrap())
        .limits(limits)
        .build();
    let outcome = runtime
        .run("let xs = []; for i in 0..5000 { xs.push(i); } xs")
        .await;
    let out = outcome.to_json();
    assert!(output_tokens(&out) <= 400);
    assert_eq!(out["value"]["artifact"], Value::Null);
    assert!(out["value"]["rest"].as_str().unwrap().contains("not kept"));
    assert!(out.get("artifacts").is_none());
    // `exact` loses nothing: with no store it fails rather than replace the value.
    let exact = runtime
        .run_with(
            "let xs = []; for i in 0..5000 { xs.push(i); } xs",
            RunOptions::default().result_policy(ResultPolicy::Exact),
        )
        .await;
    assert_eq!(exact.result.unwrap_err().kind_name(), "limit_exceeded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_error_message_keeps_its_kind_and_start() {
    let dir = TempDir::new().unwrap();
    let (runtime, _) = bounded_runtime(&dir, vec![], 400);
    let outcome = runtime
        .run(r#"let s = ""; for i in 0..20000 { s += `${i} `; } throw #{kind: "failed", message: s};"#)
        .await;
    let out = outcome.to_json();
    assert!(output_tokens(&out) <= 400, "{}", output_tokens(&out));
    assert_eq!(out["error"]["kind"], "failed");
    let message = out["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("0 1 2 3"), "{message}");
    assert!(message.contains("artifact"), "{message}");
}

// ---- The command line ----

fn toolscript(args: &[&str], store: &Path) -> (i32, Vec<u8>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_toolscript"))
        .args(args)
        .arg("--store")
        .arg(store)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_1_mb_string_and_10000_printed_lines_stay_within_the_budget_on_stdout() {
    let dir = TempDir::new().unwrap();
    let store_path = dir.path().join("store.sqlite3");
    let script = dir.path().join("big.rhai");
    std::fs::write(
        &script,
        r#"let s = ""; for i in 0..205000 { s += `w${i % 1000} `; }
           for i in 0..10000 { print(`line ${i}`); }
           s"#,
    )
    .unwrap();
    let (code, stdout, stderr) = toolscript(
        &[
            "run",
            script.to_str().unwrap(),
            "--json",
            "--max-inline-tokens",
            "1200",
        ],
        &store_path,
    );
    assert_eq!(code, 0, "{stderr}");
    let out: Value = serde_json::from_slice(&stdout).unwrap();
    assert!(
        output_tokens(&out) <= 1200,
        "{} tokens",
        output_tokens(&out)
    );
    let whole: String = (0..205_000).map(|i| format!("w{} ", i % 1000)).collect();
    assert!(whole.len() > 1_000_000);
    let lines: Vec<String> = (0..10_000).map(|i| format!("line {i}")).collect();
    // The logs: the oldest and newest lines, and where the middle went.
    let logs = out["logs"].as_array().unwrap();
    assert_eq!(logs[0], "line 0");
    assert_eq!(logs[logs.len() - 1], "line 9999");
    let artifacts = out["artifacts"].as_array().unwrap();
    assert_eq!(artifacts.len(), 2, "{artifacts:?}");
    let store = SqliteStore::open(&store_path).unwrap();
    for (artifact, expected) in artifacts.iter().zip([json!(whole), json!(lines)]) {
        let id = artifact["id"].as_str().unwrap();
        // `toolscript artifact ID` prints exactly the stored bytes: their hash is the id.
        let (code, printed, stderr) = toolscript(&["artifact", id], &store_path);
        assert_eq!(code, 0, "{stderr}");
        let printed = String::from_utf8(printed).unwrap();
        assert_eq!(sha256(&printed), artifact["sha256"].as_str().unwrap());
        assert_eq!(
            printed,
            canonical(&expected),
            "byte-identical to the unbounded value"
        );
        assert_eq!(all_pages(&store, id, 1200), expected);
        let (code, page, _) = toolscript(&["artifact", id, "--page", "1"], &store_path);
        assert_eq!(code, 0);
        let page: Value = serde_json::from_slice(&page).unwrap();
        assert_eq!(page["page"], 1);
    }
    let value = &out["value"];
    assert_eq!(value["policy"], "page");
    assert!(whole.starts_with(value["text"].as_str().unwrap()));
}

#[test]
fn an_unknown_artifact_is_a_clear_error() {
    let dir = TempDir::new().unwrap();
    let (code, _, stderr) = toolscript(&["artifact", "nope"], &dir.path().join("s.sqlite3"));
    assert_eq!(code, 2);
    assert!(stderr.contains("no artifact `nope`"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_script_reads_an_artifact_page_by_page() {
    let dir = TempDir::new().unwrap();
    let (runtime, _) = bounded_runtime(&dir, vec![], 300);
    let first = runtime
        .run("let xs = []; for i in 0..3000 { xs.push(i); } xs")
        .await;
    let out = first.to_json();
    let id = out["value"]["artifact"].as_str().unwrap().to_string();
    let pages = out["value"]["pages"].as_u64().unwrap();
    let script = format!(
        r#"let all = []; for p in 0..{pages} {{ all += ts_artifact(#{{id: "{id}", page: p}}).items; }} all.len()"#
    );
    let second = runtime.run(&script).await;
    assert_eq!(second.result.unwrap(), json!(3000));
    // Without a page, page 0: never the whole of something too large for an answer.
    let first = runtime
        .run(&format!(
            r#"let p = ts_artifact(#{{id: "{id}"}}); [p.page, p.pages]"#
        ))
        .await;
    assert_eq!(first.result.unwrap(), json!([0, pages]));
}

/// The script of about 11 KB the smallest budget is measured with: a map of 40 records, each
/// printed as it is made.
const RECORDS_AND_LOGS: &str = r#"
    let m = #{};
    for i in 0..40 {
        m[`record${i}`] = #{id: i, name: `user number ${i}`, email: `user${i}@example.com`,
            role: "reader", note: `record ${i} of the forty, with a sentence of text in it`,
            tags: ["alpha", "beta", `t${i}`], active: i % 2 == 0};
        print(`log line ${i}: record${i} was written, with some words after it`);
    }
    m
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_smallest_budget_an_11_kb_value_and_its_logs_have_few_pages() {
    let dir = TempDir::new().unwrap();
    let budget = toolscript::MIN_INLINE_TOKENS;
    let (runtime, store) = bounded_runtime(&dir, vec![], budget);
    for policy in [ResultPolicy::Page, ResultPolicy::Auto] {
        let outcome = runtime
            .run_with(
                RECORDS_AND_LOGS,
                RunOptions::default().result_policy(policy),
            )
            .await;
        let out = outcome.to_json();
        assert!(
            output_tokens(&out) <= budget,
            "{} tokens",
            output_tokens(&out)
        );
        let value = outcome.result.clone().unwrap();
        let logs = json!(outcome.logs);
        assert_eq!(outcome.artifacts.len(), 2, "{:?}", outcome.artifacts);
        assert!(canonical(&value).len() + canonical(&logs).len() > 10_000);
        for artifact in &outcome.artifacts {
            assert!(artifact.pages <= 60, "{} pages", artifact.pages);
            let whole = all_pages(&store, &artifact.id, budget);
            assert!(whole == value || whole == logs, "{whole}");
        }
        assert_eq!(
            out["value"]["pages"].as_u64(),
            Some(outcome.artifacts[0].pages)
        );
    }
    // An 11 KB string without a newline.
    let outcome = runtime
        .run(r#"let s = ""; for i in 0..1400 { s += `word${i % 10}é `; } s"#)
        .await;
    let artifact = &outcome.artifacts[0];
    assert!(artifact.bytes > 11_000, "{} bytes", artifact.bytes);
    assert!(artifact.pages <= 60, "{} pages", artifact.pages);
    assert_eq!(
        &all_pages(&store, &artifact.id, budget),
        outcome.result.as_ref().unwrap()
    );
}

/// An artifact stored before pages had a floor (a page budget of one token) still reads, in
/// pages of the floor; a run that stores the same bytes again makes an artifact of its own,
/// whose pages it announces.
#[test]
fn an_artifact_stored_with_a_tiny_page_budget_reads_in_pages_of_the_floor() {
    let dir = TempDir::new().unwrap();
    let store_path = dir.path().join("store.sqlite3");
    let store = SqliteStore::open(&store_path).unwrap();
    let value: Value = (0..300)
        .map(|i| json!({"n": i, "word": "é".repeat(i % 7)}))
        .collect();
    let content = canonical(&value);
    let id = sha256(&content)[..32].to_string();
    let old = StoredArtifact::new(content.clone().into_bytes(), 1, "page", "an-old-run");
    std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            rt.block_on(store.put_artifact(&id, old)).unwrap();
        });
    });
    let pages = artifact_pages(&content, 1).unwrap();
    assert!(pages.len() < 60, "{} pages", pages.len());
    assert_eq!(all_pages(&store, &id, 1200), value);
    let (code, page, stderr) = toolscript(&["artifact", &id, "--page", "1"], &store_path);
    assert_eq!(code, 0, "{stderr}");
    let page: Value = serde_json::from_slice(&page).unwrap();
    assert_eq!(page["pages"], json!(pages.len()), "{page}");
    assert!(page["items"].is_array(), "{page}");

    let (runtime, _) = bounded_runtime(&dir, vec![giving(value.clone(), ResultPolicy::Page)], 1200);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let outcome = rt.block_on(runtime.run("give()"));
    // The same bytes for another page budget are another artifact, cut for this run; the old
    // one still reads as it did.
    let made = artifact_of(&outcome);
    assert_eq!(made[..32], id, "{made}");
    assert_ne!(made, id);
    let stored_pages = artifact_pages(&content, stored(&store, &made).page_tokens).unwrap();
    assert_eq!(outcome.artifacts[0].pages, stored_pages.len() as u64);
    assert_eq!(
        outcome.to_json()["value"]["pages"],
        json!(stored_pages.len())
    );
    assert_eq!(all_pages(&store, &made, 1200), value);
    assert_eq!(all_pages(&store, &id, 1200), value);
}

/// Random JSON: the shapes a tool returns.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        "[a-z é0-9]{0,300}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 2000, 200, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..200).prop_map(Value::Array),
            prop::collection::btree_map("[a-z]{1,8}", inner, 0..40)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

#[test]
fn random_values_and_budgets_are_bounded_and_restored_exactly() {
    let cases = std::env::var("TOOLSCRIPT_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let dir = TempDir::new().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(value in json_value(), budget in 200usize..700, policy in prop_oneof![
        Just(ResultPolicy::Auto), Just(ResultPolicy::Page), Just(ResultPolicy::Compress), Just(ResultPolicy::Exact)
    ])| {
        let (runtime, store) = bounded_runtime(&dir, vec![giving(value.clone(), policy)], budget);
        let outcome = rt.block_on(runtime.run("give()"));
        let out = outcome.to_json();
        prop_assert!(output_tokens(&out) <= budget, "{} tokens over {budget}: {out}", output_tokens(&out));
        match outcome.artifacts.first() {
            None => prop_assert_eq!(&out["value"], &value),
            Some(artifact) => {
                let stored = stored(&store, &artifact.id);
                prop_assert_eq!(stored.content, canonical(&value).into_bytes());
                // Pages of any policy's artifact: `compress` keeps one too.
                prop_assert_eq!(all_pages(&store, &artifact.id, budget), value);
            }
        }
    });
}

/// An outcome's JSON is its report serialised, and reads back into the same report: a run with
/// artifacts, a failed run with a cut message, and one that never ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outcome_json_reads_back_into_its_report() {
    let dir = TempDir::new().unwrap();
    let (runtime, _store) = bounded_runtime(&dir, vec![], 300);
    let scripts = [
        "print(\"a\"); let xs = []; for i in 0..2000 { xs.push(i) } xs",
        "let s = \"\"; for i in 0..3000 { s += \"word \"; } throw s",
        "let x = ;",
    ];
    for script in scripts {
        let outcome = runtime.run(script).await;
        let json = outcome.to_json();
        let report: toolscript::RunReport =
            serde_json::from_value(json.clone()).unwrap_or_else(|e| panic!("{script}: {e}"));
        // The interpreter's operation counts are not in the JSON.
        let mut expected = outcome.report();
        if let Some(stats) = expected.stats.as_mut() {
            stats.script_operations = 0;
            stats.scout_operations = 0;
        }
        assert_eq!(report, expected, "{script}");
        assert_eq!(report.to_json(), json, "{script}");
    }
}
