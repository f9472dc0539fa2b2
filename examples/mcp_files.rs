//! Tools from an MCP server, through the library.
//!
//! `scripts/mcp_files.toml` declares server-filesystem over the `scripts/` folder; building the
//! manifests starts it, and its tools join the registry like any other (`fs_list_directory`,
//! `fs_read_text_file`, ...), with effects from the server's annotations and the manifest's
//! overrides. The program prints where each tool comes from, runs `scripts/mcp_files.rhai`, and
//! prints the value and the stats. The server stops when the runtime, the last holder of its
//! tools, is dropped.
//!
//! Needs Node.js and the test servers: `npm ci --prefix tests/mcp`, then
//! `cargo run --example mcp_files`.

use std::path::Path;

use serde_json::{json, Value};
use toolscript::{Manifests, Runtime};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let scripts = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts");
    let mut manifests = Manifests::new();
    manifests.load_file(&scripts.join("mcp_files.toml"))?;
    let runtime = Runtime::new(manifests.build().await?);

    println!("== tools ==");
    for spec in runtime.registry().specs() {
        println!(
            "{:<32} {:<10} {}",
            spec.name,
            spec.effect.as_str(),
            spec.origin.as_deref().unwrap_or("")
        );
    }

    let source = std::fs::read_to_string(scripts.join("mcp_files.rhai"))?;
    let outcome = runtime.run(&source).await;
    println!("== value ==");
    match &outcome.result {
        Ok(value) => println!("{}", pretty(value)),
        Err(e) => println!("the run failed: {e}"),
    }
    println!("== stats ==");
    println!("{}", pretty(&json!(outcome.stats)));

    if outcome.result.is_err() {
        std::process::exit(1);
    }
    Ok(())
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}
