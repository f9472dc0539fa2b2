//! How many pages an artifact has, at the smallest inline budget and at larger ones: values of
//! about 11 KB (a map of records printed with as many log lines, an array of records, a string
//! of lines and one without a newline) run through a runtime with a store, and each
//! artifact's pages counted and measured in o200k tokens. The figures in docs/results.md come
//! from:
//!
//! ```text
//! cargo run --example page_counts
//! ```

use std::sync::Arc;

use serde_json::Value;
use toolscript::{artifact_pages, Limits, Registry, Runtime, SqliteStore, Store};

/// Scripts whose values are about 11 KB of canonical JSON.
const SCRIPTS: [(&str, &str); 4] = [
    (
        "map of 50 records + 50 log lines",
        r#"let m = #{};
           for i in 0..50 {
               m[`record${i}`] = #{id: i, name: `user number ${i}`, email: `user${i}@example.com`,
                   role: "reader", note: `record ${i} of the fifty, with a sentence in it`,
                   tags: ["alpha", "beta", `t${i}`], active: i % 2 == 0};
               print(`log line ${i}: record${i} was written`);
           }
           m"#,
    ),
    (
        "array of 60 records",
        r#"let a = [];
           for i in 0..60 {
               a.push(#{id: i, name: `user number ${i}`, email: `user${i}@example.com`,
                   role: "reader", note: `record ${i} of the sixty, with a sentence in it`,
                   tags: ["alpha", "beta", `t${i}`], active: i % 2 == 0});
           }
           a"#,
    ),
    (
        "11 KB string of 250 lines",
        r#"let s = ""; for i in 0..250 { s += `line ${i}: some words of a log or a file ok\n`; } s"#,
    ),
    (
        "11 KB string, no newline",
        r#"let s = ""; for i in 0..1400 { s += `word${i % 10}é `; } s"#,
    ),
];

fn tokens(text: &str) -> usize {
    tiktoken_rs::o200k_base_singleton()
        .encode_ordinary(text)
        .len()
}

/// A page's body (its items, entries or text) as JSON: what its budget counts.
fn body(page: &Value) -> Value {
    match page {
        Value::Object(m) if m.contains_key("page") => ["items", "entries", "text", "json"]
            .iter()
            .find_map(|k| m.get(*k).cloned())
            .unwrap_or(Value::Null),
        other => other.clone(),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("toolscript-pages-{}", std::process::id()));
    println!("| budget | value | artifact | bytes | page budget | pages | smallest page but the last (tokens) | largest page (tokens) |");
    println!("|---|---|---|---|---|---|---|---|");
    for budget in [200, 400, 1200] {
        // A store for each budget: the same bytes stored again keep their first page budget.
        std::fs::create_dir_all(&dir)?;
        let store = Arc::new(SqliteStore::open(&dir.join(format!("{budget}.sqlite3")))?);
        let mut limits = Limits::default();
        limits.max_inline_tokens = budget;
        let runtime = Runtime::builder(Registry::builder().build()?)
            .limits(limits)
            .store(Arc::clone(&store) as Arc<dyn Store>)
            .build();
        for (name, script) in SCRIPTS {
            let outcome = runtime.run(script).await;
            for artifact in &outcome.artifacts {
                let stored = store.artifact(&artifact.id).await?.ok_or("not stored")?;
                let text = String::from_utf8(stored.content)?;
                let pages = artifact_pages(&text, stored.page_tokens)?;
                let sizes: Vec<usize> = pages
                    .iter()
                    .map(|p| Ok(tokens(&body(&serde_json::to_value(p)?).to_string())))
                    .collect::<Result<_, serde_json::Error>>()?;
                let what = match serde_json::from_str::<Value>(&text)? {
                    Value::Array(a) if a.iter().all(Value::is_string) && a.len() == 50 => "logs",
                    _ => "value",
                };
                let but_last = &sizes[..sizes.len() - 1];
                println!(
                    "| {budget} | {name} | {what} | {} | {} | {} | {} | {} |",
                    artifact.bytes,
                    stored.page_tokens,
                    artifact.pages,
                    but_last.iter().min().map_or("-".into(), |n| n.to_string()),
                    sizes.iter().max().unwrap_or(&0),
                );
            }
        }
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
