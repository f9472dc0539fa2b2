//! Receipts: one per dispatch, hash-chained, verifiable; tampering is caught at the first bad line.

use serde_json::{json, Value};
use toolscript::receipts::{
    canonical_json, canonical_sha256, verify_receipts, write_receipts, Status, RECEIPT_VERSION,
};
use toolscript::{Effect, Error, Mode};

use crate::support::{fixture_runtime, run_in, sha256, Probe};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_receipt_per_dispatch_chained_by_hash() {
    let runtime = fixture_runtime(&Probe::default());
    let outcome = run_in(
        &runtime,
        "let u = get_user(#{id: 3});\nlet again = get_user(#{id: 3});\ncreate_order(#{user: 3});\ntry { get_user(#{id: \"x\"}); } catch {}\ntry { tool(\"nope\"); } catch {}\nu.name",
        Mode::Sequential,
    )
    .await;
    assert!(outcome.result.is_ok());
    let receipts = &outcome.receipts;
    // The deduplicated read and the unknown tool are not dispatches of a tool.
    assert_eq!(receipts.len(), 3);
    assert_eq!(
        receipts.iter().map(|r| r.tool.as_str()).collect::<Vec<_>>(),
        ["get_user", "create_order", "get_user"]
    );
    assert_eq!(receipts[0].effect, Effect::Read);
    assert_eq!(receipts[1].effect, Effect::Write);
    for (i, r) in receipts.iter().enumerate() {
        assert_eq!(r.v, RECEIPT_VERSION);
        assert_eq!(r.seq, i as u64);
        assert_eq!(r.run_id, outcome.run_id);
        assert_eq!(r.parent, None);
        assert!(!r.speculative && !r.claimed);
        assert_eq!(r.hash, r.compute_hash());
        let prev = if i == 0 {
            None
        } else {
            Some(receipts[i - 1].hash.clone())
        };
        assert_eq!(r.prev, prev);
    }
    assert_eq!(receipts[0].args_sha256, sha256(r#"{"id":3}"#));
    assert_eq!(
        receipts[0].result_sha256.as_deref(),
        Some(canonical_sha256(&json!({"id": 3, "name": "user3", "active": false})).as_str())
    );
    assert_eq!(receipts[0].status, Status::Ok);
    assert_eq!(receipts[0].attempt, 1);
    assert_eq!(receipts[2].status, Status::Error);
    assert_eq!(receipts[2].error_kind.as_deref(), Some("invalid_input"));
    assert_eq!(receipts[2].result_sha256, None);
    assert_eq!(receipts[2].attempt, 0);
    assert!(receipts[1].started_ms >= receipts[0].started_ms);
}

fn write_and_read(
    receipts: &[toolscript::receipts::Receipt],
) -> (tempfile::TempDir, std::path::PathBuf, Vec<Value>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("receipts.jsonl");
    write_receipts(&path, receipts).unwrap();
    let lines = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (dir, path, lines)
}

fn rewrite(path: &std::path::Path, lines: &[Value]) {
    let text: String = lines
        .iter()
        .map(|l| canonical_json(l).unwrap() + "\n")
        .collect();
    std::fs::write(path, text).unwrap();
}

fn first_bad_line(path: &std::path::Path) -> (usize, String) {
    match verify_receipts(path) {
        Err(Error::Receipt { line, message, .. }) => (line, message),
        other => panic!("expected a verification failure, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_accepts_a_run_and_names_the_first_tampered_line() {
    let runtime = fixture_runtime(&Probe::default());
    let outcome = runtime
        .run("for i in 1..=4 { get_user(#{id: i}); }\ncreate_order(#{user: 1})")
        .await;
    let (_dir, path, lines) = write_and_read(&outcome.receipts);
    assert_eq!(verify_receipts(&path).unwrap(), 5);

    // A changed field breaks that line's hash.
    let mut tampered = lines.clone();
    tampered[2]["status"] = json!("error");
    rewrite(&path, &tampered);
    let (line, message) = first_bad_line(&path);
    assert_eq!(line, 3);
    assert!(message.contains("hash"), "{message}");

    // A changed field with a recomputed hash breaks the next line's chain.
    let mut tampered = lines.clone();
    tampered[1]["tool"] = json!("create_order");
    let mut object = tampered[1].as_object().unwrap().clone();
    object.remove("hash");
    tampered[1]["hash"] = json!(sha256(&canonical_json(&Value::Object(object)).unwrap()));
    rewrite(&path, &tampered);
    let (line, message) = first_bad_line(&path);
    assert_eq!(line, 3);
    assert!(message.contains("chain"), "{message}");

    // A removed line breaks the chain where it was.
    let mut shortened = lines.clone();
    shortened.remove(1);
    rewrite(&path, &shortened);
    assert_eq!(first_bad_line(&path).0, 2);

    // Swapped lines too.
    let mut swapped = lines.clone();
    swapped.swap(0, 1);
    rewrite(&path, &swapped);
    assert_eq!(first_bad_line(&path).0, 1);

    // Garbage is named as such.
    std::fs::write(&path, "not json\n").unwrap();
    let (line, message) = first_bad_line(&path);
    assert_eq!(line, 1);
    assert!(message.contains("not JSON"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speculative_receipts_say_whether_they_were_claimed() {
    let runtime = fixture_runtime(&Probe::default());
    // The scout guesses `u.active` true for every user and starts their orders; only the
    // active users' orders are claimed.
    let outcome = run_in(
        &runtime,
        "let n = 0;\nfor id in 1..=6 {\n  let u = lookup(#{id: id});\n  if u.active { n += orders_of(#{id: u.id}).len(); }\n}\nn",
        Mode::Speculative,
    )
    .await;
    assert_eq!(outcome.result, Ok(json!(6)));
    let speculative: Vec<_> = outcome.receipts.iter().filter(|r| r.speculative).collect();
    assert!(
        speculative.len() >= 6,
        "the six lookups were started early: {speculative:?}"
    );
    let claimed = speculative.iter().filter(|r| r.claimed).count() as u64;
    assert_eq!(claimed, outcome.stats.speculative_claimed);
    assert_eq!(
        speculative.len() as u64 - claimed,
        outcome.stats.speculative_wasted
    );
    assert!(outcome.receipts.iter().all(|r| r.speculative || !r.claimed));
    let (_dir, path, _) = write_and_read(&outcome.receipts);
    assert_eq!(verify_receipts(&path).unwrap(), outcome.receipts.len());
}
