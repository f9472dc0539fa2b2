//! Receipts are RFC 8785 (JCS): an independent implementation in another language (Python's
//! `rfc8785`, from Trail of Bits, in the venv `.ci/setup` makes) recomputes every `hash` of a
//! receipts file, and the `args_sha256` and `result_sha256` of every call, from values chosen
//! where JCS differs from a plain sorted dump: keys whose UTF-16 and UTF-8 orders differ, integral
//! and extreme floats, negative zero, integers beyond 2^53.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use toolscript::receipts::{verify_receipts, Receipt};
use toolscript::{Effect, Mode, Registry, RunOptions, Runtime, Tool};

use crate::support::sha256;

/// Keys sorted differently by UTF-16 code units (JCS) and by UTF-8 bytes: an astral-plane
/// character (a surrogate pair, 0xD83D…) against characters of the upper BMP (0xE000, 0xFF61),
/// and RFC 8785's own example of property sorting.
const KEYS: &str = r#"#{"😀": 1, "｡": 2, "": 3, "𐀀": 4, "€": 5, "\r": 6, "1": 7, "</script>": 8, "ö": 9, "דּ": 10, "z": 11, "Z": 12, "": 13}"#;

/// What a call returns besides its arguments: values whose JCS text is not serde_json's.
fn tricky() -> Value {
    json!({
        "😀": {"｡": [1e21, 1e-7, 0.1, -0.0, 3.0, 5e-324, 1.7976931348623157e308, 123456789.125]},
        "\u{e000}": "tab\t nul\u{0} unit\u{1f} del\u{7f} quote\" back\\ </script> ✓ 😀",
        "\u{10000}": [u64::MAX, i64::MIN, 9_007_199_254_740_993_u64, -9_007_199_254_740_993_i64],
        "ö": [true, false, null, [], {}],
    })
}

/// The script: every tricky argument goes through a tool; `echo` returns its arguments and
/// [`tricky`]. Two integers that round to the same double are passed apart (2^53, 2^53 + 1).
const SCRIPT: &str = r#"
echo(KEYS);
echo(#{floats: [1.0e21, 0.1, -0.0, 3.0, 1.0e-7, 5.0e-324, 1.7976931348623157e308, 0.000001, 1.0e20, 123456789.125]});
echo(#{n: 9007199254740992});
echo(#{n: 9007199254740993});
echo(#{big: [9223372036854775807, -9223372036854775807 - 1, -9007199254740993, 2 ** 60 + 1]});
echo(#{nested: [KEYS, #{"ａ": "b", "a": "ｂ"}]});
"done"
"#;

/// Recomputes, with `rfc8785`, the hash of every receipt in the file `argv[1]` and the
/// `args_sha256` and `result_sha256` of each call in `argv[2]` (JSON Lines of `{args, result,
/// args_sha256, result_sha256}`). The receipts' one exception to JCS, an integer beyond 2^53
/// written as its exact digits, is applied around the library: such an integer is swapped for a
/// marker string, and the marker's JSON text for the digits. Prints the counts checked and every
/// mismatch as JSON; exits 1 on a mismatch.
const CHECK: &str = r#"
import hashlib, json, sys
import rfc8785

def canonical(value):
    exact = {}
    def swap(v):
        if isinstance(v, bool):
            return v
        if isinstance(v, int) and abs(v) >= 2 ** 53:
            marker = "\u0000exact-%d\u0000" % len(exact)
            exact[marker] = str(v)
            return marker
        if isinstance(v, list):
            return [swap(x) for x in v]
        if isinstance(v, dict):
            return {k: swap(x) for k, x in v.items()}
        return v
    text = rfc8785.dumps(swap(value)).decode("utf-8")
    for marker, digits in exact.items():
        text = text.replace(rfc8785.dumps(marker).decode("utf-8"), digits)
    return text

def digest(value):
    return hashlib.sha256(canonical(value).encode("utf-8")).hexdigest()

counts = {"hash": 0, "args_sha256": 0, "result_sha256": 0}
bad = []
with open(sys.argv[1], encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
        receipt = json.loads(line)
        claimed = receipt.pop("hash")
        if digest(receipt) != claimed:
            bad.append({"line": number, "field": "hash", "text": canonical(receipt)})
        counts["hash"] += 1
with open(sys.argv[2], encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
        call = json.loads(line)
        for field, value in (("args_sha256", call["args"]), ("result_sha256", call["result"])):
            if digest(value) != call[field]:
                bad.append({"call": number, "field": field, "text": canonical(value)})
            counts[field] += 1
print(json.dumps({"counts": counts, "bad": bad}))
sys.exit(1 if bad else 0)
"#;

/// The venv's interpreter: `$TOOLSCRIPT_PYTHON`, else `.venv/bin/python` in the repository. A
/// missing one fails the test (a set-up step left out), saying how to make it.
fn python() -> PathBuf {
    let path = std::env::var_os("TOOLSCRIPT_PYTHON").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python"),
        PathBuf::from,
    );
    assert!(
        path.exists(),
        "{} is missing: the JCS cross-check needs Python's `rfc8785`; run `bash .ci/setup` \
         (it makes .venv and installs tests/http/requirements.txt), or set TOOLSCRIPT_PYTHON \
         to a Python with `rfc8785==0.1.4`",
        path.display()
    );
    path
}

/// Runs [`SCRIPT`] sequentially with receipts written to a file; returns the receipts, the
/// file, and each call's arguments and result as the tool saw and gave them, in call order.
async fn run_tricky(dir: &Path) -> (Vec<Receipt>, PathBuf, Vec<(Value, Value)>) {
    let calls: Arc<Mutex<Vec<(Value, Value)>>> = Arc::default();
    let seen = Arc::clone(&calls);
    let echo = Tool::builder("echo", Effect::Read).handler(move |args: Value| {
        let seen = Arc::clone(&seen);
        async move {
            let result = json!({"args": args.clone(), "tricky": tricky()});
            seen.lock().unwrap().push((args, result.clone()));
            Ok(result)
        }
    });
    let runtime = Runtime::new(Registry::builder().tool(echo).build().unwrap());
    let path = dir.join("receipts.jsonl");
    let options = RunOptions::with_mode(Mode::Sequential)
        .receipts(&path)
        .unwrap();
    let outcome = runtime
        .run_with(&SCRIPT.replace("KEYS", KEYS), options)
        .await;
    assert_eq!(outcome.result, Ok(json!("done")), "{:?}", outcome.logs);
    let calls = calls.lock().unwrap().clone();
    assert_eq!(outcome.receipts.len(), calls.len());
    (outcome.receipts, path, calls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_independent_jcs_implementation_recomputes_every_receipt_hash() {
    let dir = tempfile::tempdir().unwrap();
    let (receipts, path, calls) = run_tricky(dir.path()).await;
    assert_eq!(verify_receipts(&path).unwrap(), receipts.len());

    let expected = dir.path().join("calls.jsonl");
    let lines: String = receipts
        .iter()
        .zip(&calls)
        .map(|(receipt, (args, result))| {
            json!({
                "args": args,
                "result": result,
                "args_sha256": receipt.args_sha256,
                "result_sha256": receipt.result_sha256,
            })
            .to_string()
                + "\n"
        })
        .collect();
    std::fs::write(&expected, lines).unwrap();

    let output = std::process::Command::new(python())
        .arg("-c")
        .arg(CHECK)
        .arg(&path)
        .arg(&expected)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "rfc8785 disagrees with the receipts: {stdout}\n{stderr}"
    );
    let report: Value = serde_json::from_str(stdout.trim()).unwrap();
    let n = receipts.len();
    assert_eq!(n, 6);
    assert_eq!(
        report["counts"],
        json!({"hash": n, "args_sha256": n, "result_sha256": n}),
        "every hash was recomputed: {report}"
    );
}

/// An integer beyond 2^53 is hashed as its exact digits: 2^53 and 2^53 + 1, one double apart
/// from nothing, give different digests, each that of its own digits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn integers_beyond_2_pow_53_are_hashed_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let (receipts, _, calls) = run_tricky(dir.path()).await;
    assert_eq!(calls[2].0, json!({"n": 9_007_199_254_740_992_u64}));
    assert_eq!(calls[3].0, json!({"n": 9_007_199_254_740_993_u64}));
    assert_ne!(receipts[2].args_sha256, receipts[3].args_sha256);
    assert_eq!(receipts[2].args_sha256, sha256(r#"{"n":9007199254740992}"#));
    assert_eq!(receipts[3].args_sha256, sha256(r#"{"n":9007199254740993}"#));
    assert_eq!(
        receipts[4].args_sha256,
        sha256(
            r#"{"big":[9223372036854775807,-9223372036854775808,-9007199254740993,1152921504606846977]}"#
        )
    );
    // Within ±2^53 the digits are what JCS writes, and floats are always JCS's.
    assert_eq!(
        receipts[1].args_sha256,
        sha256(
            r#"{"floats":[1e+21,0.1,0,3,1e-7,5e-324,1.7976931348623157e+308,0.000001,100000000000000000000,123456789.125]}"#
        )
    );
}
