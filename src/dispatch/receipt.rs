//! Step 11: receipts, one per dispatch, chained by hash; and their verification.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::Error;
use crate::json::{canonical, sha256_hex, write_string};
use crate::sync::lock;
use crate::tool::Effect;

/// The receipt format version.
pub const RECEIPT_VERSION: u32 = 1;

/// Whether a call succeeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Status {
    /// The call returned a result.
    Ok,
    /// The call failed; `error_kind` says how.
    Error,
}

/// The record of one dispatch. Serialised as one line of a JSON Lines receipts file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Receipt {
    /// Format version, [`RECEIPT_VERSION`].
    pub v: u32,
    /// The run this call belongs to.
    pub run_id: String,
    /// The receipt's position in its run, from 0.
    pub seq: u64,
    /// This call's id within its run.
    pub call_id: u64,
    /// The composite call this one is nested in.
    pub parent: Option<u64>,
    /// The tool called.
    pub tool: String,
    /// The tool's effect.
    pub effect: Effect,
    /// Started by the scout rather than the executor.
    pub speculative: bool,
    /// A speculative call later claimed by the executor.
    pub claimed: bool,
    /// SHA-256 of the canonical JSON arguments.
    pub args_sha256: String,
    /// SHA-256 of the canonical JSON result; `None` on error.
    pub result_sha256: Option<String>,
    /// Whether the call succeeded.
    pub status: Status,
    /// The error's kind, on error.
    pub error_kind: Option<String>,
    /// Start, in milliseconds from the run's start.
    pub started_ms: f64,
    /// Duration in milliseconds, all attempts included.
    pub duration_ms: f64,
    /// Attempts made (0 when the call was refused before its body ran).
    pub attempt: u32,
    /// The previous receipt's `hash`; `None` for the first.
    pub prev: Option<String>,
    /// SHA-256 of this receipt's canonical JSON without `hash`.
    pub hash: String,
}

impl Receipt {
    /// The hash this receipt should carry.
    pub fn compute_hash(&self) -> String {
        let mut text = String::with_capacity(CANONICAL_CAPACITY);
        self.write_canonical(false, &mut text);
        sha256_hex(text)
    }

    /// Writes the receipt's canonical JSON — the text `canonical(&serde_json::to_value(self))`
    /// gives — with its `hash` or without it (the text the hash covers). Written field by
    /// field, in the sorted order of their names, because every call seals a receipt and
    /// building a JSON map for it cost more than the rest of the call;
    /// `tests::the_canonical_text_is_that_of_the_json_value` holds the two texts equal.
    fn write_canonical(&self, with_hash: bool, out: &mut String) {
        out.push_str("{\"args_sha256\":");
        write_string(&self.args_sha256, out);
        out.push_str(",\"attempt\":");
        write_integer(u64::from(self.attempt), out);
        out.push_str(",\"call_id\":");
        write_integer(self.call_id, out);
        out.push_str(",\"claimed\":");
        out.push_str(if self.claimed { "true" } else { "false" });
        out.push_str(",\"duration_ms\":");
        write_float(self.duration_ms, out);
        out.push_str(",\"effect\":");
        write_string(self.effect.as_str(), out);
        out.push_str(",\"error_kind\":");
        write_optional_string(self.error_kind.as_deref(), out);
        if with_hash {
            out.push_str(",\"hash\":");
            write_string(&self.hash, out);
        }
        out.push_str(",\"parent\":");
        match self.parent {
            Some(parent) => write_integer(parent, out),
            None => out.push_str("null"),
        }
        out.push_str(",\"prev\":");
        write_optional_string(self.prev.as_deref(), out);
        out.push_str(",\"result_sha256\":");
        write_optional_string(self.result_sha256.as_deref(), out);
        out.push_str(",\"run_id\":");
        write_string(&self.run_id, out);
        out.push_str(",\"seq\":");
        write_integer(self.seq, out);
        out.push_str(",\"speculative\":");
        out.push_str(if self.speculative { "true" } else { "false" });
        out.push_str(",\"started_ms\":");
        write_float(self.started_ms, out);
        out.push_str(",\"status\":");
        out.push_str(match self.status {
            Status::Ok => "\"ok\"",
            Status::Error => "\"error\"",
        });
        out.push_str(",\"tool\":");
        write_string(&self.tool, out);
        out.push_str(",\"v\":");
        write_integer(u64::from(self.v), out);
        out.push('}');
    }
}

/// Room for a receipt's canonical JSON: three digests and the rest (about 450 bytes).
const CANONICAL_CAPACITY: usize = 640;

/// An integer's decimal digits, without the formatting machinery (five a receipt).
fn write_integer(mut n: u64, out: &mut String) {
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.push_str(std::str::from_utf8(&digits[start..]).expect("decimal digits are ASCII"));
}

/// A float as serde_json writes it: the shortest text that reads back the same, `null` when it
/// is not finite.
fn write_float(x: f64, out: &mut String) {
    use std::fmt::Write;
    match serde_json::Number::from_f64(x) {
        Some(number) => {
            let _ = write!(out, "{number}");
        }
        None => out.push_str("null"),
    }
}

fn write_optional_string(text: Option<&str>, out: &mut String) {
    match text {
        Some(text) => write_string(text, out),
        None => out.push_str("null"),
    }
}

fn hash_without_field(value: &mut Value) -> String {
    if let Some(map) = value.as_object_mut() {
        map.remove("hash");
    }
    sha256_hex(canonical(value))
}

/// The fields of a receipt that its call knows; the log adds position and chain.
#[derive(Debug)]
pub(crate) struct Draft {
    pub(crate) call_id: u64,
    pub(crate) parent: Option<u64>,
    pub(crate) tool: String,
    pub(crate) effect: Effect,
    pub(crate) speculative: bool,
    /// Set by the executor when it claims a speculative outcome, possibly after the call ended.
    pub(crate) claimed: Option<Arc<AtomicBool>>,
    pub(crate) args_sha256: String,
    pub(crate) result_sha256: Option<String>,
    pub(crate) error_kind: Option<String>,
    pub(crate) started_ms: f64,
    pub(crate) duration_ms: f64,
    pub(crate) attempt: u32,
}

/// One run's receipts, chained by hash as each becomes final: an executor's (or a composite's)
/// receipt when its call finishes, a speculative one when the executor claims it or when the run
/// ends (only then is it known whether it was claimed). With a sink, each is appended to the
/// receipts file at that moment, so that a run killed midway leaves the receipts of every call
/// it finished.
#[derive(Debug)]
pub(crate) struct ReceiptLog {
    run_id: String,
    chain: Mutex<Chain>,
    /// Set once the sink failed: read at every call, without the chain's lock.
    broken: AtomicBool,
}

#[derive(Debug, Default)]
struct Chain {
    receipts: Vec<Receipt>,
    /// The chain this run's receipts continue (a resumed run's file): its last hash and the
    /// next receipt's `seq`.
    base: Option<(String, u64)>,
    /// Speculative receipts not yet final, by their claim flag (a speculative call and the
    /// calls nested in it share one), each with its place in the order of arrival.
    pending: std::collections::HashMap<usize, Vec<(u64, Draft)>>,
    arrivals: u64,
    sink: Option<Sink>,
    /// Why the sink failed, once it has: the run makes no further call.
    failed: Option<String>,
    /// The buffer receipts are written into to be hashed and appended, reused from one to the
    /// next.
    text: String,
}

/// Where receipts are appended as they become final.
#[derive(Debug)]
pub(crate) struct Sink {
    path: std::path::PathBuf,
    file: std::fs::File,
    /// The chain the file already holds: its last hash and the next `seq`.
    base: Option<(String, u64)>,
}

impl Sink {
    /// Creates (or truncates) the receipts file at `path`.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when it cannot be created.
    pub(crate) fn create(path: &Path) -> Result<Sink, Error> {
        let file = std::fs::File::create(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Sink {
            path: path.to_path_buf(),
            file,
            base: None,
        })
    }

    /// Opens the receipts file at `path` to continue its chain (creating it if missing). A
    /// last line without its newline — a write a crash cut short — is cut off.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when it cannot be opened, read or cut; [`Error::Receipt`] when its last
    /// line is not a receipt.
    pub(crate) fn append(path: &Path) -> Result<Sink, Error> {
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(path)
            .map_err(io)?;
        let text = std::fs::read(path).map_err(io)?;
        let whole = text.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        if whole < text.len() {
            file.set_len(whole as u64).map_err(io)?;
        }
        let text = String::from_utf8_lossy(&text[..whole]);
        let lines = text.lines().filter(|l| !l.trim().is_empty()).count();
        let base = match text.lines().rev().find(|l| !l.trim().is_empty()) {
            None => None,
            Some(line) => {
                let receipt: Receipt = serde_json::from_str(line).map_err(|e| Error::Receipt {
                    file: path.to_path_buf(),
                    line: lines,
                    message: format!("the last receipt cannot be read: {e}"),
                })?;
                Some((receipt.hash, receipt.seq + 1))
            }
        };
        Ok(Sink {
            path: path.to_path_buf(),
            file,
            base,
        })
    }
}

impl ReceiptLog {
    pub(crate) fn new(run_id: String, sink: Option<Sink>) -> ReceiptLog {
        ReceiptLog {
            run_id,
            chain: Mutex::new(Chain {
                base: sink.as_ref().and_then(|s| s.base.clone()),
                sink,
                ..Chain::default()
            }),
            broken: AtomicBool::new(false),
        }
    }

    pub(crate) fn run_id(&self) -> &str {
        &self.run_id
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Chain> {
        lock(&self.chain)
    }

    pub(crate) fn append(&self, draft: Draft) {
        let mut chain = self.lock();
        let unsettled = draft
            .claimed
            .as_ref()
            .is_some_and(|claimed| !claimed.load(Ordering::SeqCst));
        if let (true, Some(claimed)) = (unsettled, &draft.claimed) {
            let key = Arc::as_ptr(claimed) as usize;
            let arrival = chain.arrivals;
            chain.arrivals += 1;
            chain.pending.entry(key).or_default().push((arrival, draft));
        } else {
            self.seal(&mut chain, draft);
        }
    }

    /// The executor claimed the speculative call(s) whose flag is `claimed`: their receipts are
    /// final.
    pub(crate) fn release(&self, claimed: &Arc<AtomicBool>) {
        let mut chain = self.lock();
        let released = chain.pending.remove(&(Arc::as_ptr(claimed) as usize));
        for (_, draft) in released.unwrap_or_default() {
            self.seal(&mut chain, draft);
        }
    }

    /// Why appending to the receipts file failed, if it did.
    pub(crate) fn failure(&self) -> Option<String> {
        if !self.broken.load(Ordering::SeqCst) {
            return None;
        }
        self.lock().failed.clone()
    }

    /// The run's receipts, every pending one sealed.
    pub(crate) fn take(&self) -> Vec<Receipt> {
        let mut chain = self.lock();
        let mut pending: Vec<(u64, Draft)> = std::mem::take(&mut chain.pending)
            .into_values()
            .flatten()
            .collect();
        pending.sort_by_key(|(arrival, _)| *arrival);
        for (_, draft) in pending {
            self.seal(&mut chain, draft);
        }
        std::mem::take(&mut chain.receipts)
    }

    /// Gives `draft` its place and hash in the chain, and appends it to the sink.
    fn seal(&self, chain: &mut Chain, draft: Draft) {
        let mut receipt = Receipt {
            v: RECEIPT_VERSION,
            run_id: self.run_id.clone(),
            seq: chain.base.as_ref().map_or(0, |(_, next)| *next) + chain.receipts.len() as u64,
            call_id: draft.call_id,
            parent: draft.parent,
            tool: draft.tool,
            effect: draft.effect,
            speculative: draft.speculative,
            claimed: draft.claimed.is_some_and(|c| c.load(Ordering::SeqCst)),
            args_sha256: draft.args_sha256,
            status: if draft.error_kind.is_none() {
                Status::Ok
            } else {
                Status::Error
            },
            result_sha256: draft.result_sha256,
            error_kind: draft.error_kind,
            started_ms: round_ms(draft.started_ms),
            duration_ms: round_ms(draft.duration_ms),
            attempt: draft.attempt,
            prev: match chain.receipts.last() {
                Some(last) => Some(last.hash.clone()),
                None => chain.base.as_ref().map(|(hash, _)| hash.clone()),
            },
            hash: String::new(),
        };
        // The text the hash covers, then (with a sink) the receipt's line: one buffer, kept.
        let mut text = std::mem::take(&mut chain.text);
        text.clear();
        receipt.write_canonical(false, &mut text);
        receipt.hash = sha256_hex(&text);
        if let Some(sink) = &mut chain.sink {
            use std::io::Write;
            text.clear();
            receipt.write_canonical(true, &mut text);
            text.push('\n');
            if let Err(e) = sink.file.write_all(text.as_bytes()) {
                chain.failed = Some(format!("{}: {e}", sink.path.display()));
                chain.sink = None;
                self.broken.store(true, Ordering::SeqCst);
            }
        }
        chain.text = text;
        chain.receipts.push(receipt);
    }
}

/// A receipt as one line of a receipts file.
fn receipt_line(receipt: &Receipt) -> String {
    let mut line = String::with_capacity(CANONICAL_CAPACITY);
    receipt.write_canonical(true, &mut line);
    line.push('\n');
    line
}

/// Microsecond precision is plenty, and keeps receipts short.
fn round_ms(ms: f64) -> f64 {
    (ms * 1000.0).round() / 1000.0
}

/// Writes receipts as JSON Lines.
///
/// # Errors
///
/// [`Error::Io`] when the file cannot be written.
pub fn write_receipts(path: &Path, receipts: &[Receipt]) -> Result<(), Error> {
    let text: String = receipts.iter().map(receipt_line).collect();
    std::fs::write(path, text).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Checks every receipt's hash and the chain of a JSON Lines receipts file; returns how many
/// receipts it holds.
///
/// # Errors
///
/// [`Error::Receipt`] naming the first bad line: not JSON, not a receipt, an unknown version, a
/// hash that does not match its contents, or a `prev` that is not the previous line's hash.
/// [`Error::Io`] when the file cannot be read.
pub fn verify_receipts(path: &Path) -> Result<usize, Error> {
    verify(path).map(|(count, _)| count)
}

/// As [`verify_receipts`], and checks that the chain ends at `head`, the hash of the run's last
/// receipt (as `run --json` reports it): a file whose last lines were cut off fails.
///
/// # Errors
///
/// As [`verify_receipts`]; and [`Error::Receipt`] naming the line after the last one when the
/// chain ends elsewhere.
pub fn verify_receipts_to(path: &Path, head: &str) -> Result<usize, Error> {
    let (count, last) = verify(path)?;
    if last.as_deref() != Some(head) {
        return Err(Error::Receipt {
            file: path.to_path_buf(),
            line: count + 1,
            message: format!(
                "the chain ends at {} after {count} receipts, not at the expected head {head}: receipts are missing",
                last.as_deref().unwrap_or("nothing")
            ),
        });
    }
    Ok(count)
}

/// The number of receipts and the last one's hash.
fn verify(path: &Path) -> Result<(usize, Option<String>), Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let bad = |line: usize, message: String| Error::Receipt {
        file: path.to_path_buf(),
        line,
        message,
    };
    let mut prev: Option<String> = None;
    let mut count = 0;
    for (i, line) in text.lines().enumerate() {
        let number = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let mut value: Value =
            serde_json::from_str(line).map_err(|e| bad(number, format!("not JSON: {e}")))?;
        let receipt: Receipt = serde_json::from_value(value.clone())
            .map_err(|e| bad(number, format!("not a receipt: {e}")))?;
        if receipt.v != RECEIPT_VERSION {
            return Err(bad(
                number,
                format!("unknown receipt version {}", receipt.v),
            ));
        }
        if receipt.prev != prev {
            return Err(bad(
                number,
                "the chain is broken: `prev` is not the previous receipt's hash".to_string(),
            ));
        }
        if receipt.seq != count as u64 {
            return Err(bad(
                number,
                format!("`seq` is {}, expected {count}", receipt.seq),
            ));
        }
        if hash_without_field(&mut value) != receipt.hash {
            return Err(bad(
                number,
                "the hash does not match the receipt's contents".to_string(),
            ));
        }
        prev = Some(receipt.hash);
        count += 1;
    }
    Ok((count, prev))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Receipts with every field at its edges: text needing escapes and beyond ASCII, absent
    /// options, integers to `u64::MAX`, floats large, small, negative, zero and not finite.
    fn any_receipt() -> impl Strategy<Value = Receipt> {
        let text = || "[a-z0-9 \"\\\\\n\t\u{1}\u{7f}é✓]{0,12}";
        let float = || {
            prop_oneof![
                any::<f64>(),
                (0u64..10_000_000).prop_map(|us| us as f64 / 1000.0),
                Just(0.0),
                Just(-0.0),
                Just(f64::NAN),
                Just(f64::INFINITY),
                Just(1e300),
                Just(5e-324),
            ]
        };
        let effect = prop_oneof![
            Just(Effect::Read),
            Just(Effect::Write),
            Just(Effect::Idempotent),
            Just(Effect::External),
        ];
        let status = prop_oneof![Just(Status::Ok), Just(Status::Error)];
        (
            (
                any::<u32>(),
                text(),
                any::<u64>(),
                any::<u64>(),
                any::<Option<u64>>(),
            ),
            (text(), effect, any::<bool>(), any::<bool>(), text()),
            (
                proptest::option::of(text()),
                status,
                proptest::option::of(text()),
            ),
            (
                float(),
                float(),
                any::<u32>(),
                proptest::option::of(text()),
                text(),
            ),
        )
            .prop_map(
                |(
                    (v, run_id, seq, call_id, parent),
                    (tool, effect, speculative, claimed, args_sha256),
                    (result_sha256, status, error_kind),
                    (started_ms, duration_ms, attempt, prev, hash),
                )| Receipt {
                    v,
                    run_id,
                    seq,
                    call_id,
                    parent,
                    tool,
                    effect,
                    speculative,
                    claimed,
                    args_sha256,
                    result_sha256,
                    status,
                    error_kind,
                    started_ms,
                    duration_ms,
                    attempt,
                    prev,
                    hash,
                },
            )
    }

    proptest! {
        /// The receipt's text, written field by field, is the canonical JSON of its serde
        /// value, with its hash and without: hashes and receipts files are what they were when
        /// receipts were written through a JSON value.
        #[test]
        fn the_canonical_text_is_that_of_the_json_value(receipt in any_receipt()) {
            let mut value = serde_json::to_value(&receipt).unwrap();
            prop_assert_eq!(receipt_line(&receipt), canonical(&value) + "\n");
            let mut text = String::new();
            receipt.write_canonical(false, &mut text);
            value.as_object_mut().unwrap().remove("hash");
            prop_assert_eq!(&text, &canonical(&value));
            prop_assert_eq!(receipt.compute_hash(), hash_without_field(&mut value));
        }
    }

    fn draft(call_id: u64) -> Draft {
        Draft {
            call_id,
            parent: None,
            tool: "t".into(),
            effect: Effect::Read,
            speculative: false,
            claimed: None,
            args_sha256: sha256_hex("{}"),
            result_sha256: Some(sha256_hex("1")),
            error_kind: None,
            started_ms: 1.23456,
            duration_ms: 2.0,
            attempt: 1,
        }
    }

    /// A speculative receipt waits until it is claimed or the run ends; a sink gets every
    /// receipt the moment it is final.
    #[test]
    fn receipts_are_sealed_when_final_and_streamed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.jsonl");
        let log = ReceiptLog::new("run".into(), Some(Sink::create(&path).unwrap()));
        let claimed = Arc::new(AtomicBool::new(false));
        let speculative = |id| Draft {
            speculative: true,
            claimed: Some(Arc::clone(&claimed)),
            ..draft(id)
        };
        log.append(speculative(1));
        log.append(draft(2));
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 1);
        claimed.store(true, Ordering::SeqCst);
        log.release(&claimed);
        assert_eq!(verify_receipts(&path).unwrap(), 2, "streamed, chained");
        let receipts = log.take();
        assert_eq!(receipts[1].call_id, 1);
        assert!(receipts[1].claimed);
        assert!(log.failure().is_none());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_failing_sink_is_reported() {
        let log = ReceiptLog::new(
            "run".into(),
            Some(Sink::create(Path::new("/dev/full")).unwrap()),
        );
        log.append(draft(1));
        let failure = log.failure().expect("writing to /dev/full fails");
        assert!(failure.contains("/dev/full"), "{failure}");
        assert_eq!(log.take().len(), 1, "the receipt is still kept in memory");
    }

    #[test]
    fn receipts_chain_and_verify() {
        let log = ReceiptLog::new("run".into(), None);
        log.append(draft(1));
        log.append(draft(2));
        let receipts = log.take();
        assert_eq!(receipts.len(), 2);
        assert_eq!(receipts[0].prev, None);
        assert_eq!(receipts[1].prev.as_deref(), Some(receipts[0].hash.as_str()));
        assert_eq!(receipts[0].started_ms, 1.235);
        assert_eq!(receipts[1].hash, receipts[1].compute_hash());

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.jsonl");
        write_receipts(&path, &receipts).unwrap();
        assert_eq!(verify_receipts(&path).unwrap(), 2);
        assert_eq!(verify_receipts_to(&path, &receipts[1].hash).unwrap(), 2);
        assert!(
            verify_receipts_to(&path, &receipts[0].hash).is_err(),
            "a chain cut short is found with its head"
        );

        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("\"attempt\":1", "\"attempt\":2")).unwrap();
        match verify_receipts(&path) {
            Err(Error::Receipt { line, message, .. }) => {
                assert_eq!(line, 1);
                assert!(message.contains("hash"), "{message}");
            }
            other => panic!("expected a bad receipt, got {other:?}"),
        }
    }
}
