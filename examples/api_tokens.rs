//! The size of the API a model reads: the `rhai` catalog of some manifests (the demo catalog
//! without any), in bytes and in o200k tokens, the count every prompt that carries it pays.
//!
//! Run with `cargo run --example api_tokens -- [MANIFEST]...`; `--print` also prints the API.

use std::path::Path;

use toolscript::{demo_catalog, Format, Manifests, Runtime};

#[tokio::main]
async fn main() -> Result<(), toolscript::Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let print = args.iter().any(|a| a == "--print");
    let manifests: Vec<&String> = args.iter().filter(|a| *a != "--print").collect();
    let registry = if manifests.is_empty() {
        demo_catalog()?
    } else {
        let mut loaded = Manifests::new();
        for path in manifests {
            loaded.load_file(Path::new(path))?;
        }
        loaded.build().await?
    };
    let api = Runtime::new(registry).describe(Format::Rhai);
    if print {
        print!("{api}");
    }
    let tokens = tiktoken_rs::o200k_base_singleton()
        .encode_ordinary(&api)
        .len();
    println!("{} bytes, {tokens} tokens", api.len());
    Ok(())
}
