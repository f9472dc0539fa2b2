//! What streaming saves: each script of the demo and of the model-style corpus arrives at 60
//! tokens a second (o200k_base token boundaries), once streamed into `Runtime::run_streaming`
//! and once received whole and then run (`run_with`), both speculative, both on a fresh runtime
//! of their catalog (the demo's tools take 20-80 ms; `scripts/bench/catalog.toml`'s 20 ms). It
//! prints, per script, the time from the first byte to the result in both ways, and the totals.
//!
//! ```sh
//! cargo run --features tokens --example stream_saving [-- TOKENS_PER_SECOND]
//! cargo run --features tokens --example stream_saving -- pathological
//! ```
//!
//! `pathological` measures the cost of parsing prefixes instead: scripts of 1,000 to 16,000
//! one-line statements (`x += 1;`), streamed a byte at a time with nothing between the
//! bytes, against the same text run whole.

use std::convert::Infallible;
use std::path::Path;
use std::time::{Duration, Instant};

use futures::StreamExt;
use toolscript::{demo_catalog, Manifests, Mode, RunOptions, Runtime};

fn bench_catalog() -> Runtime {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/bench/catalog.toml");
    let mut manifests = Manifests::new();
    manifests
        .load_file(Path::new(path))
        .expect("the bench catalog loads");
    Runtime::new(manifests.into_registry().expect("a registry"))
}

/// The script's text cut at its o200k_base token boundaries.
fn tokens(text: &str) -> Vec<Vec<u8>> {
    let bpe = tiktoken_rs::o200k_base_singleton();
    bpe.encode_ordinary(text)
        .into_iter()
        .map(|t| bpe.decode_bytes(&[t]).expect("a token's bytes"))
        .collect()
}

/// The tokens, one every `every`, from now.
fn paced(
    tokens: Vec<Vec<u8>>,
    every: Duration,
) -> impl futures::Stream<Item = Result<Vec<u8>, Infallible>> + Send + 'static {
    let start = tokio::time::Instant::now();
    futures::stream::iter(tokens.into_iter().enumerate()).then(move |(i, token)| async move {
        tokio::time::sleep_until(start + every * i as u32).await;
        Ok(token)
    })
}

/// Seconds from the first byte to the result: (streamed, whole then run, arrival).
async fn measure(make: &dyn Fn() -> Runtime, text: &str, every: Duration) -> (f64, f64, f64) {
    let cut = tokens(text);
    let arrival = every.as_secs_f64() * (cut.len().saturating_sub(1)) as f64;
    let (streamed_runtime, whole_runtime) = (make(), make());
    let streamed = async {
        let started = Instant::now();
        let run = streamed_runtime.run_streaming(
            paced(cut.clone(), every),
            RunOptions::with_mode(Mode::Speculative),
        );
        let outcome = run.outcome().await;
        assert!(outcome.result.is_ok(), "{:?}", outcome.result);
        started.elapsed().as_secs_f64()
    };
    let whole = async {
        let started = Instant::now();
        let mut text = Vec::new();
        let mut chunks = std::pin::pin!(paced(cut.clone(), every));
        while let Some(Ok(chunk)) = chunks.next().await {
            text.extend_from_slice(&chunk);
        }
        let text = String::from_utf8(text).expect("UTF-8");
        let outcome = whole_runtime
            .run_with(&text, RunOptions::with_mode(Mode::Speculative))
            .await;
        assert!(outcome.result.is_ok(), "{:?}", outcome.result);
        started.elapsed().as_secs_f64()
    };
    let (s, w) = tokio::join!(streamed, whole);
    (s, w, arrival)
}

/// Streams scripts of `n` statements a byte at a time, at once: the time against running the
/// whole text, which shows whether parsing prefixes grows faster than the text.
async fn pathological() {
    println!(
        "{:>10} {:>9} {:>10} {:>10} {:>7}",
        "statements", "bytes", "whole ms", "stream ms", "ratio"
    );
    for n in [1_000usize, 2_000, 4_000, 8_000, 16_000] {
        let text = format!("let x = 0;\n{}x", "x += 1;\n".repeat(n));
        let runtime = Runtime::new(demo_catalog().unwrap());
        let started = Instant::now();
        let whole = runtime.run_with(&text, RunOptions::default()).await;
        let whole_ms = started.elapsed().as_secs_f64() * 1e3;
        assert!(whole.result.is_ok(), "{:?}", whole.result);
        let bytes: Vec<Result<Vec<u8>, Infallible>> = text.bytes().map(|b| Ok(vec![b])).collect();
        let started = Instant::now();
        let streamed = runtime
            .run_streaming(futures::stream::iter(bytes), RunOptions::default())
            .outcome()
            .await;
        let streamed_ms = started.elapsed().as_secs_f64() * 1e3;
        assert!(streamed.result.is_ok(), "{:?}", streamed.result);
        println!(
            "{n:>10} {:>9} {whole_ms:>10.1} {streamed_ms:>10.1} {:>7.2}",
            text.len(),
            streamed_ms / whole_ms
        );
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().nth(1).as_deref() == Some("pathological") {
        pathological().await;
        return;
    }
    let rate: f64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(60.0);
    let every = Duration::from_secs_f64(1.0 / rate);
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts");
    let mut scripts: Vec<(String, String, bool)> = vec![(
        "demo.rhai".into(),
        std::fs::read_to_string(format!("{dir}/demo.rhai")).unwrap(),
        true,
    )];
    let mut model: Vec<_> = std::fs::read_dir(format!("{dir}/bench/model"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            !p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("fanout_1000")
        })
        .collect();
    model.sort();
    for path in model {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        scripts.push((name, std::fs::read_to_string(&path).unwrap(), false));
    }
    println!(
        "{:<26} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "script", "tokens", "arrive s", "whole s", "stream s", "after(w)", "after(s)"
    );
    let (mut total_whole, mut total_streamed, mut total_arrival) = (0.0, 0.0, 0.0);
    let (mut after_whole, mut after_streamed) = (0.0, 0.0);
    for (name, text, demo) in &scripts {
        let make: &dyn Fn() -> Runtime = if *demo {
            &|| Runtime::new(demo_catalog().unwrap())
        } else {
            &bench_catalog
        };
        let (streamed, whole, arrival) = measure(make, text, every).await;
        println!(
            "{name:<26} {:>6} {arrival:>9.2} {whole:>9.3} {streamed:>9.3} {:>9.3} {:>9.3}",
            tokens(text).len(),
            whole - arrival,
            streamed - arrival,
        );
        total_whole += whole;
        total_streamed += streamed;
        total_arrival += arrival;
        after_whole += whole - arrival;
        after_streamed += streamed - arrival;
    }
    println!(
        "all {} scripts at {rate} tokens/s: arrival {total_arrival:.2} s; first byte to result {total_whole:.2} s whole-then-run, {total_streamed:.2} s streamed ({:.1}% less); after the last byte {after_whole:.2} s against {after_streamed:.2} s ({:.2}x)",
        scripts.len(),
        100.0 * (1.0 - total_streamed / total_whole),
        after_whole / after_streamed.max(1e-9),
    );
}
