//! What reading one page of a large artifact costs, before and after pages were indexed: a
//! value of about 18 MB (an array of records) is kept as an artifact by a run at the smallest
//! budget, then pages are read the way a reader reads them now (the page's bytes, through its
//! stored index) and the way every read went before (the whole artifact read and cut into
//! pages, counting its tokens). The figures in BENCHMARKS.md come from:
//!
//! ```text
//! cargo run --release --example page_reads
//! ```

use std::sync::Arc;
use std::time::Instant;

use serde_json::json;
use toolscript::{
    artifact_page, stored_artifact_page, Effect, Limits, Registry, Runtime, SqliteStore, Store,
    Tool,
};

#[tokio::main]
async fn main() {
    let records: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(300_000);
    let dir = tempfile::tempdir().expect("a temporary folder");
    let store = Arc::new(SqliteStore::open(&dir.path().join("s.sqlite3")).expect("a store"));
    let tool = Tool::builder("records", Effect::Read).handler(move |_| async move {
        Ok(json!((0..records)
            .map(|i| json!({"id": i, "name": format!("user number {i}"), "note": "a record"}))
            .collect::<Vec<_>>()))
    });
    let mut limits = Limits::default();
    limits.max_inline_tokens = 200;
    limits.max_operations = u64::MAX / 2;
    let runtime = Runtime::builder(Registry::builder().tools(vec![tool]).build().unwrap())
        .limits(limits)
        .store(Arc::clone(&store) as Arc<dyn Store>)
        .build();
    let started = Instant::now();
    let outcome = runtime.run("records()").await;
    let kept = started.elapsed();
    let artifact = outcome
        .artifacts
        .first()
        .expect("the value is an artifact")
        .clone();
    println!(
        "artifact: {} bytes, {} pages; the run that kept it took {:.1} s",
        artifact.bytes,
        artifact.pages,
        kept.as_secs_f64()
    );
    let pages: Vec<usize> = [0, 1, artifact.pages / 2, artifact.pages - 1]
        .iter()
        .map(|&p| p as usize)
        .collect();
    // Now: the page's bytes, through the index.
    let started = Instant::now();
    for &n in &pages {
        let stored = store.artifact_page(&artifact.id, n).await.unwrap().unwrap();
        stored_artifact_page(&stored, n).expect("the page");
    }
    let now = started.elapsed().as_secs_f64() / pages.len() as f64;
    // Before: the whole artifact, cut into pages at every read.
    let started = Instant::now();
    for &n in &pages[..2] {
        let stored = store.artifact(&artifact.id).await.unwrap().unwrap();
        let text = String::from_utf8_lossy(&stored.content);
        artifact_page(&text, stored.page_tokens, n).expect("the page");
    }
    let before = started.elapsed().as_secs_f64() / 2.0;
    println!(
        "a page read: before {:.1} ms, now {:.3} ms ({:.0}x); every page, before: {:.1} h",
        before * 1e3,
        now * 1e3,
        before / now,
        before * artifact.pages as f64 / 3600.0
    );
}
