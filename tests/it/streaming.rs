//! Streamed runs (`Runtime::run_streaming`, `run - --stream`, `POST /v1/stream`): the outcome
//! is the whole text's run's, whatever the chunks; reads start while the text arrives; the
//! streaming phase has its own bound; a prefix whose meaning the rest changed wastes its reads.

use std::convert::Infallible;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{json, Value};
use toolscript::bench::observable;
use toolscript::{
    demo_catalog, ErrorKind, Limits, Manifests, Mode, RunOptions, RunOutcome, Runtime, SqliteStore,
};

use crate::support::{fixture_registry, Probe};

/// `text` cut at `cuts` (byte offsets, any order), as a stream; after each chunk that ends a
/// line it waits `pause`, as a model's output does now and then.
fn chunked(
    text: &str,
    cuts: &[usize],
    pause: Duration,
) -> impl Stream<Item = Result<Vec<u8>, Infallible>> + Send + 'static {
    let mut at: Vec<usize> = cuts
        .iter()
        .copied()
        .filter(|&c| c > 0 && c < text.len())
        .collect();
    at.sort_unstable();
    at.dedup();
    let bytes = text.as_bytes();
    let mut chunks = Vec::new();
    let mut start = 0;
    for end in at.into_iter().chain([text.len()]) {
        chunks.push(bytes[start..end].to_vec());
        start = end;
    }
    futures::stream::iter(chunks).then(move |chunk| async move {
        if chunk.contains(&b'\n') && !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        Ok(chunk)
    })
}

/// Cuts every `size` bytes.
fn every(text: &str, size: usize) -> Vec<usize> {
    (size..text.len()).step_by(size).collect()
}

/// What must be the same in a streamed run and a whole one: value or error, logs, effects,
/// warnings, and the receipts of the calls the run made (claimed or its own), in a stable order.
fn seen(outcome: &RunOutcome) -> Value {
    let mut made: Vec<Value> = outcome
        .receipts
        .iter()
        .filter(|r| !r.speculative || r.claimed)
        .map(|r| {
            json!([
                r.tool,
                r.args_sha256,
                r.status,
                r.error_kind,
                r.effect,
                r.result_sha256
            ])
        })
        .collect();
    made.sort_by_key(|v| v.to_string());
    json!({"observable": observable(outcome), "made": made})
}

async fn whole(runtime: &Runtime, script: &str) -> RunOutcome {
    runtime
        .run_with(script, RunOptions::with_mode(Mode::Speculative))
        .await
}

async fn streamed(runtime: &Runtime, script: &str, cuts: &[usize], pause: Duration) -> RunOutcome {
    let run = runtime.run_streaming(
        chunked(script, cuts, pause),
        RunOptions::with_mode(Mode::Speculative),
    );
    let id = run.run_id().to_string();
    let outcome = run.outcome().await;
    assert_eq!(
        outcome.run_id, id,
        "the run keeps the id it had from the first byte"
    );
    outcome
}

fn bench_catalog(latency_ms: u64) -> Runtime {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/bench/catalog.toml");
    let text = std::fs::read_to_string(path)
        .unwrap()
        .replace("latency_ms = 20", &format!("latency_ms = {latency_ms}"));
    let mut manifests = Manifests::new();
    manifests.load_str(Path::new(path), &text).unwrap();
    Runtime::new(manifests.into_registry().unwrap())
}

/// The model-style corpus and the demo, each streamed in chunks of 1, 2, 7 and 64 bytes and
/// whole, give what the whole text gives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_scripts_of_the_corpus_give_what_the_whole_text_gives() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts");
    let mut checked = 0;
    let mut names: Vec<_> = std::fs::read_dir(format!("{dir}/bench/model"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            !p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("fanout_1000")
        })
        .collect();
    names.sort();
    for path in names {
        let script = std::fs::read_to_string(&path).unwrap();
        let expected = seen(&whole(&bench_catalog(1), &script).await);
        for size in [1, 2, 7, 64, script.len()] {
            let got = streamed(
                &bench_catalog(1),
                &script,
                &every(&script, size),
                Duration::ZERO,
            )
            .await;
            assert_eq!(
                seen(&got),
                expected,
                "{} in chunks of {size}",
                path.display()
            );
        }
        checked += 1;
    }
    assert!(checked >= 25, "only {checked} scripts");
    let demo = std::fs::read_to_string(format!("{dir}/demo.rhai")).unwrap();
    let make = || Runtime::new(demo_catalog().unwrap());
    let expected = seen(&whole(&make(), &demo).await);
    for size in [1, 5, demo.len()] {
        let got = streamed(
            &make(),
            &demo,
            &every(&demo, size),
            Duration::from_millis(1),
        )
        .await;
        assert_eq!(seen(&got), expected, "the demo in chunks of {size}");
    }
}

/// Scripts with writes, failures, retries, missing fields and syntax errors on the fixture
/// catalog, and the model-style corpus on the bench catalog: random chunkings (cutting tokens,
/// strings and comments), paced or at once.
#[test]
fn random_chunkings_give_what_the_whole_text_gives() {
    const SCRIPTS: &[&str] = &[
        "let u = get_user(#{id: 1}); // a comment; with } in it\nlet o = create_order(#{user: u.id});\n`${u.name}: ${o}`",
        "let kinds = [];\nfor i in 0..5 {\n  try { flaky(#{i: i}); } catch (e) { kinds.push(e.kind); }\n}\n/* a block; } comment */ kinds",
        "fn lookup(id) {\n    get_user(#{id: id})\n}\nlet a = lookup(1);\nlet s = \"a string; with } and { in it\";\nlookup(1000)",
        "get_user(#{id: 1});\ncreate_order(#{user: 1});\nget_user(#{id: 1});\nnotify(#{});\nget_user(#{id: 2}).name",
        "let a = get_user(#{id: 1});\nlet b = get_user(#{id: 2});\nif a.id < b.id { print(`${a.name} first`); }\n[a.name, b.name, get_user(#{id: 3}).nmae]",
        "let a = get_user(#{id: 1});\nlet b = (;\nb",
        "let xs = [];\nfor id in 1..=4 { xs.push(get_user(#{id: id}).name); }\nthrow #{kind: \"rate_limited\", message: `${xs.len()} users`}",
    ];
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let cases = std::env::var("TOOLSCRIPT_STREAM_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(48);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    // (script, whether it runs on the bench catalog rather than the fixture one)
    let mut scripts: Vec<(String, bool)> = SCRIPTS.iter().map(|s| (s.to_string(), false)).collect();
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/bench/model");
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if !path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("fanout_1000")
        {
            scripts.push((std::fs::read_to_string(&path).unwrap(), true));
        }
    }
    let strategy = (
        prop::sample::select(scripts),
        prop::collection::vec(0usize..1_500, 0..60),
        prop::bool::ANY,
    );
    runner
        .run(&strategy, |((script, bench), cuts, paced)| {
            let pause = if paced {
                Duration::from_millis(2)
            } else {
                Duration::ZERO
            };
            let make = || {
                if bench {
                    bench_catalog(1)
                } else {
                    Runtime::new(fixture_registry(&Probe::default()))
                }
            };
            let (expected, got) = runtime.block_on(async {
                let expected = seen(&whole(&make(), &script).await);
                let got = seen(&streamed(&make(), &script, &cuts, pause).await);
                (expected, got)
            });
            prop_assert_eq!(got, expected, "{} cut at {:?}", script, cuts);
            Ok(())
        })
        .unwrap();
}

/// A stream whose first statement arrives, then nothing for `hold`, then the rest.
fn held(
    first: &str,
    hold: Duration,
    rest: &str,
) -> impl Stream<Item = Result<String, Infallible>> + Send + 'static {
    let (first, rest) = (first.to_string(), rest.to_string());
    futures::stream::iter([(first, Duration::ZERO), (rest, hold)]).then(|(text, wait)| async move {
        tokio::time::sleep(wait).await;
        Ok(text)
    })
}

/// Reads of the first statements start while the rest is still being written, and the run
/// claims them: the run's own time is shorter than the reads'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_start_before_the_text_ends_and_are_claimed() {
    let runtime = Runtime::new(demo_catalog().unwrap());
    let first = "let c = get_customer(#{id: 3});\nlet p = refund_policy();\n";
    let rest = "[c.id, p.window_days]";
    let started = Instant::now();
    let outcome = runtime
        .run_streaming(
            held(first, Duration::from_millis(300), rest),
            RunOptions::default(),
        )
        .outcome()
        .await;
    let total = started.elapsed();
    let expected = whole(
        &Runtime::new(demo_catalog().unwrap()),
        &format!("{first}{rest}"),
    )
    .await;
    assert_eq!(seen(&outcome), seen(&expected));
    assert!(outcome.result.is_ok(), "{:?}", outcome.result);
    assert_eq!(outcome.stats.speculative_claimed, 2, "{:?}", outcome.stats);
    // The reads landed while the text was held back: the run after it takes less time than
    // the whole text's run, which waits for them (the demo's reads take 20-80 ms each).
    assert!(
        outcome.stats.wall_ms < expected.stats.wall_ms,
        "{:?} against {:?}",
        outcome.stats,
        expected.stats
    );
    assert!(total >= Duration::from_millis(300));
    let claimed_receipts = outcome
        .receipts
        .iter()
        .filter(|r| r.speculative && r.claimed)
        .count();
    assert_eq!(
        claimed_receipts, 2,
        "the reads made while streaming have receipts"
    );
}

/// A read started on a prefix that the later text changes the meaning of (a function defined
/// after, named as the tool) is never claimed: it is counted as wasted, and the outcome is the
/// whole text's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_started_on_a_prefix_whose_meaning_changed_is_not_claimed() {
    let probe = Probe::default();
    let runtime = Runtime::new(fixture_registry(&probe));
    let first = "let u = get_user(#{id: 1});\n";
    let rest = "fn get_user(args) { #{name: \"local\", id: args.id} }\nu.name";
    let outcome = runtime
        .run_streaming(
            held(first, Duration::from_millis(200), rest),
            RunOptions::default(),
        )
        .outcome()
        .await;
    let expected = whole(
        &Runtime::new(fixture_registry(&Probe::default())),
        &format!("{first}{rest}"),
    )
    .await;
    assert_eq!(seen(&outcome), seen(&expected));
    assert_eq!(outcome.result.as_ref().ok(), Some(&json!("local")));
    assert_eq!(outcome.stats.speculative_launched, 1, "{:?}", outcome.stats);
    assert_eq!(outcome.stats.speculative_claimed, 0);
    assert_eq!(outcome.stats.speculative_wasted, 1);
    assert_eq!(
        Probe::count(&probe.user_calls),
        1,
        "the prefix's read was made"
    );
}

/// A text that never parses fails as `run` fails; the reads its prefix started are wasted
/// and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_text_that_never_parses_fails_as_run_does_and_wastes_its_reads() {
    let runtime = Runtime::new(fixture_registry(&Probe::default()));
    let first = "let u = get_user(#{id: 1});\nlet v = get_user(#{id: 2});\n";
    let rest = "let w = (u.id +;\nw";
    let outcome = runtime
        .run_streaming(
            held(first, Duration::from_millis(150), rest),
            RunOptions::default(),
        )
        .outcome()
        .await;
    let expected = whole(&runtime, &format!("{first}{rest}")).await;
    assert_eq!(observable(&outcome), observable(&expected));
    assert_eq!(
        outcome.result.as_ref().unwrap_err().kind,
        ErrorKind::InvalidScript
    );
    assert_eq!(outcome.stats.speculative_launched, 2, "{:?}", outcome.stats);
    assert_eq!(outcome.stats.speculative_wasted, 2);
    assert!(outcome.receipts.iter().all(|r| r.speculative && !r.claimed));
}

/// A stream that stops sending fails after `stream_timeout_s` with `limit_exceeded` naming it,
/// its reads cancelled; the run's own deadline starts only when the text is complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_has_a_bound_of_its_own_and_the_run_s_deadline_starts_at_its_end() {
    let mut limits = Limits::default();
    limits.set("stream_timeout_s", 0.3).unwrap();
    limits.set("timeout_s", 0.5).unwrap();
    let runtime = Runtime::builder(fixture_registry(&Probe::default()))
        .limits(limits)
        .build();
    let hung = futures::stream::iter([Ok::<_, Infallible>(
        "let u = get_user(#{id: 1});\n".to_string(),
    )])
    .chain(futures::stream::pending());
    let started = Instant::now();
    let outcome = runtime
        .run_streaming(hung, RunOptions::default())
        .outcome()
        .await;
    let took = started.elapsed();
    let error = outcome.result.as_ref().unwrap_err();
    assert_eq!(error.kind, ErrorKind::LimitExceeded, "{error:?}");
    assert!(
        error.message.contains("stream_timeout_s"),
        "{}",
        error.message
    );
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert_eq!(outcome.stats.speculative_claimed, 0);
    // A text that takes longer than `timeout_s` to arrive, but within its bound, runs.
    let slow = held(
        "let u = get_user(#{id: 1});\n",
        Duration::from_millis(200),
        "sleep(0.35); u.name",
    );
    let mut limits = Limits::default();
    limits.set("stream_timeout_s", 5.0).unwrap();
    limits.set("timeout_s", 0.5).unwrap();
    let runtime = Runtime::builder(fixture_registry(&Probe::default()))
        .limits(limits)
        .build();
    let outcome = runtime
        .run_streaming(slow, RunOptions::default())
        .outcome()
        .await;
    assert!(outcome.result.is_ok(), "{:?}", outcome.result);
}

/// A stream cut off (an error item) ends the run `cancelled` without running it, and cancels
/// the reads started; so does dropping the run's future.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_off_cancels_the_reads_and_runs_nothing() {
    let runtime = Runtime::new(demo_catalog().unwrap());
    let cut = futures::stream::iter([
        Ok("let t = get_ticket(#{id: 101});\n".to_string()),
        Err("the client went away"),
    ])
    .then(|item| async move {
        tokio::time::sleep(Duration::from_millis(5)).await;
        item
    });
    let outcome = runtime
        .run_streaming(cut, RunOptions::default())
        .outcome()
        .await;
    let error = outcome.result.as_ref().unwrap_err();
    assert_eq!(error.kind, ErrorKind::Cancelled, "{error:?}");
    assert!(
        error.message.contains("the client went away"),
        "{}",
        error.message
    );
    assert!(outcome.effects.is_empty());
    assert!(
        outcome.receipts.iter().all(|r| r.speculative && !r.claimed),
        "{:?}",
        outcome.receipts
    );
    // The read (20-80 ms) was still running when the stream was cut off: it was cancelled.
    assert!(
        outcome
            .receipts
            .iter()
            .any(|r| r.error_kind.as_deref() == Some("cancelled")),
        "{:?}",
        outcome.receipts
    );
}

/// No non-read call starts before the text is complete, even one the prefix reaches; the
/// reads before it do start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_write_starts_before_the_text_is_complete() {
    let probe = Probe::default();
    let runtime = Runtime::new(fixture_registry(&probe));
    let first = "let u = get_user(#{id: 1});\nlet o = create_order(#{user: u.id});\nlet v = get_user(#{id: 2});\n";
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<String, Infallible>>(4);
    let chunks =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) });
    let run = runtime.run_streaming(chunks, RunOptions::default());
    let watched = {
        let probe = probe.clone();
        async move {
            tx.send(Ok(first.to_string())).await.unwrap();
            tokio::time::sleep(Duration::from_millis(200)).await;
            let before = (
                Probe::count(&probe.user_calls),
                Probe::count(&probe.order_calls),
                Probe::count(&probe.write_calls),
            );
            tx.send(Ok("[u.id, v.id]".to_string())).await.unwrap();
            before
        }
    };
    let (outcome, (users, orders, writes)) = tokio::join!(run.outcome(), watched);
    assert_eq!(
        users, 1,
        "the read before the write started while the text streamed"
    );
    assert_eq!(
        (orders, writes),
        (0, 0),
        "no write started before the text was complete"
    );
    assert!(outcome.result.is_ok(), "{:?}", outcome.result);
    assert_eq!(outcome.effects.len(), 1);
}

/// Text that is not UTF-8, or longer than `max_script_bytes`, fails as `run` fails on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_text_and_too_much_text_fail_as_run_does() {
    let runtime = Runtime::new(fixture_registry(&Probe::default()));
    let bytes = vec![
        Ok::<_, Infallible>(b"let a = \"".to_vec()),
        Ok(vec![0xff, 0xfe]),
        Ok(b"\";".to_vec()),
    ];
    let outcome = runtime
        .run_streaming(futures::stream::iter(bytes), RunOptions::default())
        .outcome()
        .await;
    let error = outcome.result.as_ref().unwrap_err();
    assert_eq!(error.kind, ErrorKind::InvalidScript, "{error:?}");
    assert!(error.message.contains("UTF-8"), "{}", error.message);
    // A character split across chunks is whole again.
    let split = "let s = \"é\"; s".as_bytes().to_vec();
    let cut = split.iter().position(|&b| b >= 0x80).unwrap() + 1;
    let parts = vec![
        Ok::<_, Infallible>(split[..cut].to_vec()),
        Ok(split[cut..].to_vec()),
    ];
    let outcome = runtime
        .run_streaming(futures::stream::iter(parts), RunOptions::default())
        .outcome()
        .await;
    assert_eq!(outcome.result.as_ref().ok(), Some(&json!("é")));
    let mut limits = Limits::default();
    limits.set("max_script_bytes", 100.0).unwrap();
    let small = Runtime::builder(fixture_registry(&Probe::default()))
        .limits(limits)
        .build();
    let text = "let x = 1;\n".repeat(30);
    let expected = whole(&small, &text).await;
    let got = streamed(&small, &text, &every(&text, 7), Duration::ZERO).await;
    assert_eq!(observable(&got), observable(&expected));
    assert_eq!(
        got.result.as_ref().unwrap_err().kind,
        ErrorKind::LimitExceeded
    );
}

/// A streamed run with a store is durable: it pauses for an approval, and resumes, as a whole
/// run does; the store keeps the whole text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_run_pauses_and_resumes_like_a_whole_one() {
    let dir = tempfile::TempDir::new().unwrap();
    let store = Arc::new(SqliteStore::open(&dir.path().join("store.sqlite3")).unwrap());
    let mut manifests = Manifests::new();
    manifests
        .load_str(Path::new("m.toml"), crate::support::APPROVAL_MANIFEST)
        .unwrap();
    let registry = manifests.into_registry().unwrap();
    let runtime = Runtime::builder(registry).store(store).build();
    let script = "let c = charge(#{amount: 5});\nc.charged + 1";
    let outcome = runtime
        .run_streaming(
            chunked(script, &every(script, 3), Duration::ZERO),
            RunOptions::default(),
        )
        .outcome()
        .await;
    assert_eq!(
        outcome.status(),
        toolscript::RunStatus::Paused,
        "{:?}",
        outcome.result
    );
    let resumed = runtime
        .resume(
            &outcome.run_id,
            Some(toolscript::Decision::Approve),
            RunOptions::default(),
        )
        .await
        .unwrap();
    assert_eq!(
        resumed.result.as_ref().ok(),
        Some(&json!(6)),
        "{:?}",
        resumed.result
    );
}

/// A sequential streamed run starts nothing before the text is complete, and gives what the
/// whole text gives sequentially.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sequential_streamed_run_speculates_nothing() {
    let probe = Probe::default();
    let runtime = Runtime::new(fixture_registry(&probe));
    let script = "let a = get_user(#{id: 1});\nlet b = get_user(#{id: 2});\n[a.name, b.name]";
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<String, Infallible>>(4);
    let chunks =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) });
    let run = runtime.run_streaming(chunks, RunOptions::with_mode(Mode::Sequential));
    let feed = async {
        let (first, rest) = script.split_at(script.find("[a").unwrap());
        tx.send(Ok(first.to_string())).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let before = Probe::count(&probe.user_calls);
        tx.send(Ok(rest.to_string())).await.unwrap();
        drop(tx);
        before
    };
    let (outcome, before) = tokio::join!(run.outcome(), feed);
    assert_eq!(before, 0, "nothing ran while the text streamed");
    let expected = Runtime::new(fixture_registry(&Probe::default()))
        .run_with(script, RunOptions::with_mode(Mode::Sequential))
        .await;
    assert_eq!(seen(&outcome), seen(&expected));
    assert_eq!(outcome.stats.speculative_launched, 0);
}
