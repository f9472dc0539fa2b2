//! The library with no feature at all (`--no-default-features`): no SQLite, no BPE, no MCP, no
//! TOML, no command line. A script runs over two Rust tools with speculation, its receipts are
//! written to a file and verified, and the run's stats say that the reads ran early. CI builds
//! and runs it in that configuration:
//!
//! ```text
//! cargo run --no-default-features --example embed_minimal
//! ```
//!
//! It exits with an error (and a message saying what) if anything is not as it should be.

use std::time::Duration;

use serde_json::{json, Value};
use toolscript::receipts::{verify_receipts, verify_receipts_to};
use toolscript::{Effect, Mode, Registry, RunOptions, Runtime, Tool};

/// Ten independent reads and a write over their sum: the scout starts the reads together.
const SCRIPT: &str = r#"
let total = 0;
for id in 0..10 {
    total += price(#{id: id}).cents;
}
let saved = save(#{total: total});
#{total: total, saved: saved.ok}
"#;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let price = Tool::builder("price", Effect::Read)
        .description("The price of an item, in cents.")
        .input_schema(json!({
            "type": "object",
            "properties": {"id": {"type": "integer"}},
            "required": ["id"]
        }))
        .handler(|args: Value| async move {
            // A little latency, so that speculation has something to win.
            tokio::time::sleep(Duration::from_millis(5)).await;
            let id = args["id"].as_i64().unwrap_or(0);
            Ok(json!({"id": id, "cents": 100 + id}))
        });
    let save = Tool::builder("save", Effect::Write)
        .description("Saves a total.")
        .handler(|args: Value| async move { Ok(json!({"ok": true, "total": args["total"]})) });
    let registry = Registry::builder().tool(price).tool(save).build()?;
    let runtime = Runtime::new(registry);

    let dir = std::env::temp_dir().join(format!("toolscript-embed-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let receipts = dir.join("receipts.jsonl");
    let options = RunOptions::with_mode(Mode::Speculative).receipts(&receipts)?;
    let outcome = runtime.run_with(SCRIPT, options).await;

    let value = outcome
        .result
        .clone()
        .map_err(|e| format!("the run failed: {e}"))?;
    let expected = json!({"total": 1045, "saved": true});
    check(
        value == expected,
        format!("the value is {value}, not {expected}"),
    )?;
    let stats = &outcome.stats;
    check(
        stats.speculative_launched > 0 && stats.speculative_claimed > 0,
        format!("the scout started no read the executor used: {stats:?}"),
    )?;
    let head = outcome
        .receipts
        .last()
        .map(|r| r.hash.clone())
        .ok_or("the run has no receipt")?;
    let verified = verify_receipts_to(&receipts, &head)?;
    check(
        verified == outcome.receipts.len() && verified == verify_receipts(&receipts)?,
        format!(
            "{verified} receipts verified in the file, {} in the outcome",
            outcome.receipts.len()
        ),
    )?;
    std::fs::remove_dir_all(&dir)?;
    println!(
        "ok: {value}; {} reads started early, {} claimed; {verified} receipts verified",
        stats.speculative_launched, stats.speculative_claimed
    );
    Ok(())
}

fn check(ok: bool, why: String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(why)
    }
}
