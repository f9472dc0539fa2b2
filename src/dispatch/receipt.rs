//! Step 11: receipts, one per dispatch, chained by hash; and their verification.
//!
//! # Format
//!
//! A receipts file is JSON Lines, one receipt a line. A receipt's `hash` is the SHA-256 of the
//! canonical JSON of every field the line has except `hash` itself — fields a later version
//! adds included — and its `prev` is the previous line's `hash`. The canonical form depends on
//! the receipt's version, `v`:
//!
//! - **2** (written now): RFC 8785, the JSON Canonicalization Scheme (keys sorted by UTF-16
//!   code units, numbers in ECMAScript's shortest form), so that any JCS implementation
//!   recomputes the hashes. `args_sha256` and `result_sha256` are digests of the arguments
//!   and the result in the same form. One exception, for exactness: an integer beyond ±2^53
//!   (where a double cannot hold every integer, and JCS would write the nearest double) is
//!   written as its exact decimal digits, so that two calls whose arguments differ only there
//!   never share a digest. Within ±2^53 the digits are what JCS writes; floats are always
//!   written as JCS says.
//! - **1** (written before): keys sorted by their UTF-8 bytes, numbers as `serde_json` writes
//!   them (`3.0` stays `3.0`). Still verified, so that old files stay checkable.
//!
//! A chain may go from version 1 to version 2 (a run paused before the upgrade and resumed
//! after it appends v2 receipts to its v1 file, the first `prev` being the last v1 `hash`),
//! never back. The line itself need not be canonical: `verify` parses it and recomputes.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use smallvec::SmallVec;

use crate::error::Error;
use crate::json::{
    jcs_sha256, jcs_value_sha256, key_json, push_jcs_hex, push_jcs_string, push_jcs_thousandths,
    sha256_digest, sha256_hex, DraftDigest, Hex,
};
use crate::sync::lock;
use crate::tool::Effect;

/// The receipt format version written: 2, RFC 8785 canonical JSON (see the module's docs).
pub const RECEIPT_VERSION: u32 = 2;

/// The first receipt format: its canonical JSON is the key form (UTF-8 key order,
/// `serde_json`'s numbers). Verified, no longer written.
const RECEIPT_VERSION_1: u32 = 1;

/// Whether a call succeeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Status {
    /// The call returned a result.
    Ok,
    /// The call failed; `error_kind` says how.
    Error,
    /// The fixture sandbox refused the call before it reached its tool (`error_kind`:
    /// `side_effect_blocked`).
    Blocked,
    /// A plan recorded the call instead of making it (see docs/plans.md).
    Planned,
}

/// The record of one dispatch. Serialised as one line of a JSON Lines receipts file.
///
/// Its serde derive is the format's one definition: a line is the receipt written by it, and
/// the text its `hash` covers is the receipt written by it through the JCS formatter while
/// `hash` is empty (an empty `hash` is left out). Its fields are declared in JCS order (sorted
/// by name), so that the formatter writes them as they come, straight into the hasher, without
/// sorting (`tests::a_receipt_streams_in_jcs_order`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Receipt {
    /// SHA-256 of the arguments' canonical JSON (RFC 8785, exact integers).
    pub args_sha256: Hex,
    /// Attempts made (0 when the call was refused before its body ran, or the cache answered
    /// it).
    pub attempt: u32,
    /// The cache of reads across runs answered the call: its tool was not reached.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cached: bool,
    /// The age of the cached entry that answered it, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_age_ms: Option<f64>,
    /// This call's id within its run.
    pub call_id: u64,
    /// A speculative call later claimed by the executor.
    pub claimed: bool,
    /// Duration in milliseconds, all attempts included.
    #[serde(serialize_with = "finite")]
    pub duration_ms: f64,
    /// The tool's effect.
    pub effect: Effect,
    /// The error's kind, on error.
    pub error_kind: Option<String>,
    /// SHA-256 of this receipt's canonical JSON without `hash`.
    #[serde(skip_serializing_if = "Hex::is_empty")]
    pub hash: Hex,
    /// The composite call this one is nested in.
    pub parent: Option<u64>,
    /// The previous receipt's `hash`; `None` for the first.
    pub prev: Option<Hex>,
    /// SHA-256 of the result's canonical JSON (RFC 8785, exact integers); `None` on error.
    pub result_sha256: Option<Hex>,
    /// The run this call belongs to.
    pub run_id: String,
    /// The receipt's position in its run, from 0.
    pub seq: u64,
    /// Started by the scout rather than the executor.
    pub speculative: bool,
    /// Start, in milliseconds from the run's start.
    #[serde(serialize_with = "finite")]
    pub started_ms: f64,
    /// Whether the call succeeded.
    pub status: Status,
    /// The tool called.
    pub tool: String,
    /// Format version, [`RECEIPT_VERSION`].
    pub v: u32,
}

/// A float as JSON allows it: `null` when it is not finite (no duration is, but JCS would
/// refuse the receipt whole).
fn finite<S: serde::Serializer>(x: &f64, serializer: S) -> Result<S::Ok, S::Error> {
    if x.is_finite() {
        serializer.serialize_f64(*x)
    } else {
        serializer.serialize_none()
    }
}

impl Receipt {
    /// Appends this receipt's JCS text (RFC 8785), `hash` left out when it is empty, written
    /// field by field in JCS order: a receipt is written once per call, and a general writer
    /// checks and dispatches more than the text costs. `false` for a time that is not a whole
    /// number of thousandths, which only the general writer takes (`out` then holds a part).
    /// `tests::the_hand_written_text_is_the_general_writer_s` holds it to the general writer.
    fn push_jcs(&self, out: &mut Vec<u8>) -> bool {
        fn integer(n: impl itoa::Integer, out: &mut Vec<u8>) {
            out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        }
        fn optional(hex: Option<&Hex>, out: &mut Vec<u8>) {
            match hex {
                Some(hex) => push_jcs_hex(hex, out),
                None => out.extend_from_slice(b"null"),
            }
        }
        fn millis(ms: f64, out: &mut Vec<u8>) -> bool {
            if ms.is_finite() {
                push_jcs_thousandths(ms, out)
            } else {
                out.extend_from_slice(b"null");
                true
            }
        }
        fn boolean(b: bool, out: &mut Vec<u8>) {
            out.extend_from_slice(if b { b"true" } else { b"false" });
        }
        out.extend_from_slice(b"{\"args_sha256\":");
        push_jcs_hex(&self.args_sha256, out);
        out.extend_from_slice(b",\"attempt\":");
        integer(self.attempt, out);
        if self.cached {
            out.extend_from_slice(b",\"cached\":true");
        }
        if let Some(age) = self.cached_age_ms {
            out.extend_from_slice(b",\"cached_age_ms\":");
            if !millis(age, out) {
                return false;
            }
        }
        out.extend_from_slice(b",\"call_id\":");
        integer(self.call_id, out);
        out.extend_from_slice(b",\"claimed\":");
        boolean(self.claimed, out);
        out.extend_from_slice(b",\"duration_ms\":");
        if !millis(self.duration_ms, out) {
            return false;
        }
        out.extend_from_slice(b",\"effect\":\"");
        out.extend_from_slice(self.effect.as_str().as_bytes());
        out.extend_from_slice(b"\",\"error_kind\":");
        match &self.error_kind {
            Some(kind) => push_jcs_string(kind, out),
            None => out.extend_from_slice(b"null"),
        }
        if !self.hash.is_empty() {
            out.extend_from_slice(b",\"hash\":");
            push_jcs_hex(&self.hash, out);
        }
        out.extend_from_slice(b",\"parent\":");
        match self.parent {
            Some(parent) => integer(parent, out),
            None => out.extend_from_slice(b"null"),
        }
        out.extend_from_slice(b",\"prev\":");
        optional(self.prev.as_ref(), out);
        out.extend_from_slice(b",\"result_sha256\":");
        optional(self.result_sha256.as_ref(), out);
        out.extend_from_slice(b",\"run_id\":");
        push_jcs_string(&self.run_id, out);
        out.extend_from_slice(b",\"seq\":");
        integer(self.seq, out);
        out.extend_from_slice(b",\"speculative\":");
        boolean(self.speculative, out);
        out.extend_from_slice(b",\"started_ms\":");
        if !millis(self.started_ms, out) {
            return false;
        }
        out.extend_from_slice(match self.status {
            Status::Ok => b",\"status\":\"ok\",\"tool\":".as_slice(),
            Status::Error => b",\"status\":\"error\",\"tool\":".as_slice(),
            Status::Blocked => b",\"status\":\"blocked\",\"tool\":".as_slice(),
            Status::Planned => b",\"status\":\"planned\",\"tool\":".as_slice(),
        });
        push_jcs_string(&self.tool, out);
        out.extend_from_slice(b",\"v\":");
        integer(self.v, out);
        out.push(b'}');
        true
    }

    /// The hash this receipt should carry, in its own version's canonical form.
    pub fn compute_hash(&self) -> String {
        let unsealed = Receipt {
            hash: Hex::default(),
            ..self.clone()
        };
        if self.v == RECEIPT_VERSION_1 {
            match serde_json::to_value(&unsealed) {
                Ok(value) => sha256_hex(key_json(&value)),
                Err(e) => format!("unhashable: {e}"),
            }
        } else {
            jcs_sha256(&unsealed)
        }
    }
}

/// The hash a receipts line should carry: the canonical JSON of its every field but `hash`, in
/// the form of its version.
fn hash_of_line(version: u32, value: &mut Value) -> String {
    if let Some(map) = value.as_object_mut() {
        map.remove("hash");
    }
    if version == RECEIPT_VERSION_1 {
        sha256_hex(key_json(value))
    } else {
        jcs_value_sha256(value)
    }
}

/// The fields of a receipt that its call knows; the log adds position and chain.
#[derive(Debug)]
pub(crate) struct Draft {
    pub(crate) call_id: u64,
    pub(crate) parent: Option<u64>,
    pub(crate) tool: Arc<str>,
    pub(crate) effect: Effect,
    pub(crate) speculative: bool,
    /// Set by the executor when it claims a speculative outcome, possibly after the call ended.
    pub(crate) claimed: Option<Arc<AtomicBool>>,
    pub(crate) args_sha256: DraftDigest,
    pub(crate) result_sha256: Option<DraftDigest>,
    pub(crate) error_kind: Option<String>,
    pub(crate) started_ms: f64,
    pub(crate) duration_ms: f64,
    pub(crate) attempt: u32,
    /// For a call the cache answered: the entry's age, in milliseconds.
    pub(crate) cached_age_ms: Option<f64>,
    /// The fixture sandbox refused the call: its status is [`Status::Blocked`].
    pub(crate) blocked: bool,
    /// A plan recorded it instead of making it.
    pub(crate) planned: bool,
}

/// One run's receipts, placed in the chain as each becomes final: an executor's (or a
/// composite's) receipt when its call finishes, a speculative one when the executor claims it or
/// when the run ends (only then is it known whether it was claimed). With a sink, each is hashed
/// and appended to the receipts file at that moment, so that a run killed midway leaves the
/// receipts of every call it finished. Without one, nothing reads a hash before the run ends:
/// receipts are hashed in batches, in their order, by the process's [`Hasher`] (on another
/// core, beside the script), and the rest when the run takes them.
#[derive(Debug)]
pub(crate) struct ReceiptLog {
    run_id: String,
    chain: Mutex<Chain>,
    /// Without a sink: the receipts placed, hashed later.
    deferred: Option<Arc<Deferred>>,
    /// Speculative receipts not yet final, under a lock of their own: the scout's calls leave
    /// theirs here while the executor seals, and never wait for it. Taken after `chain` when
    /// both are, never the other way round.
    pending: Mutex<Pending>,
    /// Set once the sink failed: read at every call, without the chain's lock.
    broken: AtomicBool,
}

#[derive(Debug, Default)]
struct Chain {
    /// The receipts hashed (with a sink; without one they are in [`Deferred`]).
    receipts: Vec<Receipt>,
    /// Receipts placed so far: the next one's `seq`, from the base's.
    placed: u64,
    /// The chain this run's receipts continue (a resumed run's file): its last hash and the
    /// next receipt's `seq`.
    base: Option<(Hex, u64)>,
    sink: Option<Sink>,
    /// Why the sink failed, once it has: the run makes no further call.
    failed: Option<String>,
    /// The buffer receipts' lines are written into to be appended, reused from one to the
    /// next.
    line: Vec<u8>,
    /// The buffer a receipt's JCS text is written into to be hashed, reused likewise.
    text: Vec<u8>,
}

/// How many receipts placed without a sink wait before the hasher is asked for them: asking
/// costs a wake of its thread, shared by the batch.
const BATCH: usize = 32;

/// How long the hasher, having hashed all a run placed, watches for more before it lets the run
/// ask again: a run of quick calls (a native tool's) then asks once, not at every batch, and
/// has few receipts left to hash when it ends.
const LINGER: std::time::Duration = std::time::Duration::from_micros(50);

/// The receipts of a run without a sink, placed in order and hashed later: by the process's
/// [`Hasher`] while the run goes on, and the rest by [`ReceiptLog::take`].
#[derive(Debug, Default)]
struct Deferred {
    /// The run's id, which each receipt is given when it is made.
    run_id: String,
    /// The receipts placed, not yet hashed.
    queue: Mutex<Queue>,
    /// How many receipts `queue` holds, read without its lock by the hasher that watches it.
    queued: AtomicUsize,
    /// The run is taking its receipts: the hasher stops watching for more.
    taken: AtomicBool,
    /// The receipts hashed, in order, and the buffer their text is written into. Held by
    /// whoever hashes, so that batches are hashed one at a time, in order. Taken before
    /// `queue` when both are.
    hashed: Mutex<(Vec<Receipt>, Vec<u8>)>,
}

/// A [`Deferred`]'s receipts to hash.
#[derive(Debug, Default)]
struct Queue {
    /// Placed, not yet hashed, in order. A draft waits here, not the receipt made from it: it
    /// is smaller, and the receipt (and its copy of the run's id) is made by whoever hashes it.
    placed: Vec<Placed>,
    /// The hasher was asked for them and is not done.
    asked: bool,
    /// The room of a batch already hashed, for the next: a hasher that keeps up takes the
    /// receipts a few at a time, and would otherwise allocate room for a whole batch (some
    /// kilobytes) at each, which the run's thread then writes into cold.
    spare: Vec<Placed>,
}

impl Deferred {
    /// Queues `placed`; `true` when the hasher should be asked for the queue.
    fn place(&self, placed: Placed) -> bool {
        let mut queue = lock(&self.queue);
        queue.placed.push(placed);
        self.queued.store(queue.placed.len(), Ordering::Release);
        let ask = queue.placed.len() >= BATCH && !queue.asked;
        queue.asked |= ask;
        ask
    }

    /// Hashes every receipt placed so far, and those placed meanwhile.
    fn hash_all(&self) {
        let mut hashed = lock(&self.hashed);
        loop {
            let mut batch = {
                let mut queue = lock(&self.queue);
                if queue.placed.is_empty() {
                    return;
                }
                self.queued.store(0, Ordering::Release);
                // Room for the next batch, so that it never grows by copying.
                let mut room = std::mem::take(&mut queue.spare);
                room.reserve(BATCH);
                std::mem::replace(&mut queue.placed, room)
            };
            let (receipts, text) = &mut *hashed;
            receipts.reserve(batch.len());
            for placed in batch.drain(..) {
                chain_onto(receipts, None, text, placed.receipt(&self.run_id));
            }
            // Kept unless a run's burst grew it beyond a few batches.
            if batch.capacity() <= 4 * BATCH {
                lock(&self.queue).spare = batch;
            }
        }
    }

    /// The hasher's turn at this run: hashes what is placed, and what comes while it watches
    /// (up to [`LINGER`] after the last, until the run takes its receipts or `others` says
    /// another run waits); then says it is done, with nothing left in the queue.
    fn hash_lingering(&self, others: &AtomicUsize) {
        loop {
            self.hash_all();
            let since = std::time::Instant::now();
            while self.queued.load(Ordering::Acquire) == 0
                && !self.taken.load(Ordering::Relaxed)
                && others.load(Ordering::Relaxed) == 0
                && since.elapsed() < LINGER
            {
                for _ in 0..32 {
                    std::hint::spin_loop();
                }
            }
            let mut queue = lock(&self.queue);
            if queue.placed.is_empty() {
                queue.asked = false;
                return;
            }
        }
    }
}

/// The thread that hashes the receipts of runs without a sink, one for the process, started
/// at its first run's first full batch: beside the script's thread, on another core, and never
/// on one of the async runtime's workers (its watching would hold one up).
struct Hasher {
    /// Runs that asked, in turn.
    runs: Mutex<std::collections::VecDeque<Arc<Deferred>>>,
    /// How many runs `runs` holds, read without its lock.
    waiting: AtomicUsize,
    asked: std::sync::Condvar,
}

impl Hasher {
    /// The process's hasher; `None` where the process may use one core only (there, hashing
    /// beside the script would take the script's core), or if its thread could not be started:
    /// each run then hashes its receipts when it takes them.
    fn get() -> Option<&'static Hasher> {
        static HASHER: std::sync::OnceLock<Option<&'static Hasher>> = std::sync::OnceLock::new();
        *HASHER.get_or_init(|| {
            if std::thread::available_parallelism().map_or(true, |n| n.get() < 2) {
                return None;
            }
            let hasher: &'static Hasher = Box::leak(Box::new(Hasher {
                runs: Mutex::default(),
                waiting: AtomicUsize::new(0),
                asked: std::sync::Condvar::new(),
            }));
            std::thread::Builder::new()
                .name("toolscript-receipts".into())
                .spawn(move || hasher.serve())
                .ok()
                .map(|_| hasher)
        })
    }

    /// Asks for `run`'s queue to be hashed.
    fn ask(&self, run: Arc<Deferred>) {
        lock(&self.runs).push_back(run);
        self.waiting.fetch_add(1, Ordering::Relaxed);
        self.asked.notify_one();
    }

    fn serve(&self) {
        // Under load, the threads of the runs go first; a run hashes what is left when it ends.
        crate::sync::run_behind();
        loop {
            let run = {
                let mut runs = lock(&self.runs);
                loop {
                    if let Some(run) = runs.pop_front() {
                        break run;
                    }
                    runs = self
                        .asked
                        .wait(runs)
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                }
            };
            self.waiting.fetch_sub(1, Ordering::Relaxed);
            // A panic leaves the rest of the queue to `take`.
            let turn = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run.hash_lingering(&self.waiting);
            }));
            if turn.is_err() {
                lock(&run.queue).asked = false;
            }
        }
    }
}

/// A receipt's draft given its place in the chain: its `seq`, and whether the executor claimed
/// it.
#[derive(Debug)]
struct Placed {
    seq: u64,
    claimed: bool,
    draft: Draft,
}

impl Placed {
    /// The receipt, unhashed, of the run `run_id`.
    fn receipt(self, run_id: &str) -> Receipt {
        let Placed {
            seq,
            claimed,
            draft,
        } = self;
        Receipt {
            v: RECEIPT_VERSION,
            run_id: run_id.to_string(),
            seq,
            call_id: draft.call_id,
            parent: draft.parent,
            tool: draft.tool.to_string(),
            effect: draft.effect,
            speculative: draft.speculative,
            claimed,
            args_sha256: draft.args_sha256.into_hex(),
            status: match (draft.blocked, &draft.error_kind) {
                _ if draft.planned && draft.error_kind.is_none() => Status::Planned,
                (true, _) => Status::Blocked,
                (false, None) => Status::Ok,
                (false, Some(_)) => Status::Error,
            },
            result_sha256: draft.result_sha256.map(DraftDigest::into_hex),
            error_kind: draft.error_kind,
            started_ms: round_ms(draft.started_ms),
            duration_ms: round_ms(draft.duration_ms),
            attempt: draft.attempt,
            cached: draft.cached_age_ms.is_some(),
            cached_age_ms: draft.cached_age_ms.map(round_ms),
            prev: None,
            hash: Hex::default(),
        }
    }
}

/// Gives `receipt` the hash of the chain's last receipt (`receipts`' last, else `base`) as its
/// `prev`, and its own hash; and appends it.
fn chain_onto(
    receipts: &mut Vec<Receipt>,
    base: Option<&Hex>,
    text: &mut Vec<u8>,
    mut receipt: Receipt,
) {
    receipt.prev = receipts.last().map(|last| &last.hash).or(base).cloned();
    // The hash covers the receipt as it is now, without a hash, written as JCS.
    text.clear();
    receipt.hash = if receipt.push_jcs(text) {
        sha256_digest(&*text)
    } else {
        Hex::from(jcs_sha256(&receipt))
    };
    receipts.push(receipt);
}

/// Speculative receipts not yet final, by their claim flag (a speculative call and the calls
/// nested in it share one; most have one receipt, kept without an allocation of its own), each
/// with its place in the order of arrival.
#[derive(Debug, Default)]
struct Pending {
    by_flag: std::collections::HashMap<usize, SmallVec<[(u64, Draft); 1]>>,
    arrivals: u64,
}

/// Where receipts are appended as they become final.
#[derive(Debug)]
pub(crate) struct Sink {
    path: std::path::PathBuf,
    file: std::fs::File,
    /// The chain the file already holds: its last hash and the next `seq`.
    base: Option<(Hex, u64)>,
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
            deferred: sink.is_none().then(|| {
                Arc::new(Deferred {
                    run_id: run_id.clone(),
                    ..Deferred::default()
                })
            }),
            run_id,
            chain: Mutex::new(Chain {
                base: sink.as_ref().and_then(|s| s.base.clone()),
                sink,
                ..Chain::default()
            }),
            pending: Mutex::default(),
            broken: AtomicBool::new(false),
        }
    }

    pub(crate) fn run_id(&self) -> &str {
        &self.run_id
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Chain> {
        lock(&self.chain)
    }

    /// A call's receipt: sealed now, or, for a speculative call not yet claimed, when the
    /// executor claims it or the run ends.
    pub(crate) fn append(&self, draft: Draft) {
        if let Some(claimed) = draft.claimed.clone() {
            // The flag is looked at under the lock `release` takes after setting it: a receipt
            // is either sealed here or found there, never left behind.
            let mut pending = lock(&self.pending);
            if !claimed.load(Ordering::SeqCst) {
                let arrival = pending.arrivals;
                pending.arrivals += 1;
                let key = Arc::as_ptr(&claimed) as usize;
                pending
                    .by_flag
                    .entry(key)
                    .or_default()
                    .push((arrival, draft));
                return;
            }
        }
        self.seal(&mut self.lock(), draft);
    }

    /// The executor claimed the speculative call(s) whose flag is `claimed` (set before this is
    /// called): their receipts are final.
    pub(crate) fn release(&self, claimed: &Arc<AtomicBool>) {
        // The chain first, as `take` does: the released receipts are sealed before any that
        // became final after them (a nested call of the claimed composite ending now).
        let mut chain = self.lock();
        let released = lock(&self.pending)
            .by_flag
            .remove(&(Arc::as_ptr(claimed) as usize));
        for (_, draft) in released.into_iter().flatten() {
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

    /// The run's receipts, every pending one sealed, every one hashed.
    pub(crate) fn take(&self) -> Vec<Receipt> {
        let mut chain = self.lock();
        let pending = std::mem::take(&mut lock(&self.pending).by_flag);
        let mut pending: Vec<(u64, Draft)> = pending.into_values().flatten().collect();
        pending.sort_by_key(|(arrival, _)| *arrival);
        for (_, draft) in pending {
            self.seal(&mut chain, draft);
        }
        let Some(deferred) = &self.deferred else {
            return std::mem::take(&mut chain.receipts);
        };
        drop(chain);
        // After the hasher's batch, if it is hashing one now.
        deferred.taken.store(true, Ordering::Relaxed);
        deferred.hash_all();
        std::mem::take(&mut lock(&deferred.hashed).0)
    }

    /// Gives `draft` its place in the chain: hashed and appended to the sink at once, or
    /// queued to be hashed later when there is no sink.
    fn seal(&self, chain: &mut Chain, mut draft: Draft) {
        let placed = Placed {
            seq: chain.base.as_ref().map_or(0, |(_, next)| *next) + chain.placed,
            // Read now: the flag is final once the receipt is.
            claimed: draft
                .claimed
                .take()
                .is_some_and(|c| c.load(Ordering::SeqCst)),
            draft,
        };
        chain.placed += 1;
        if let Some(deferred) = &self.deferred {
            // Under the chain's lock: queued in the order placed.
            if deferred.place(placed) {
                // Without a hasher, the run is never asked again: `take` hashes it all.
                if let Some(hasher) = Hasher::get() {
                    hasher.ask(Arc::clone(deferred));
                }
            }
            return;
        }
        let Chain {
            receipts,
            base,
            sink,
            failed,
            line,
            text,
            ..
        } = chain;
        let receipt = placed.receipt(&self.run_id);
        chain_onto(receipts, base.as_ref().map(|(hash, _)| hash), text, receipt);
        if let Some(file) = sink {
            use std::io::Write;
            let receipt = receipts.last().expect("just appended");
            // The line, into a buffer kept from one receipt to the next.
            line.clear();
            let written = write_line(receipt, line).and_then(|()| file.file.write_all(line));
            if let Err(e) = written {
                *failed = Some(format!("{}: {e}", file.path.display()));
                *sink = None;
                self.broken.store(true, Ordering::SeqCst);
            }
        }
    }
}

/// Appends `receipt` to `out` as one line of a receipts file: compact JSON, its fields sorted
/// by name. `verify` does not rely on the line's form: it recomputes the canonical one.
fn write_line(receipt: &Receipt, out: &mut Vec<u8>) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, receipt)?;
    out.push(b'\n');
    Ok(())
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
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut text = Vec::with_capacity(receipts.len() * 512);
    for receipt in receipts {
        write_line(receipt, &mut text).map_err(io)?;
    }
    std::fs::write(path, text).map_err(io)
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
    let mut prev: Option<Hex> = None;
    let mut count = 0;
    // The version of the last receipt: a chain may move from version 1 to 2, never back.
    let mut version = RECEIPT_VERSION_1;
    for (i, line) in text.lines().enumerate() {
        let number = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let mut value: Value =
            serde_json::from_str(line).map_err(|e| bad(number, format!("not JSON: {e}")))?;
        let receipt: Receipt = serde_json::from_value(value.clone())
            .map_err(|e| bad(number, format!("not a receipt: {e}")))?;
        if receipt.v != RECEIPT_VERSION && receipt.v != RECEIPT_VERSION_1 {
            return Err(bad(
                number,
                format!("unknown receipt version {}", receipt.v),
            ));
        }
        if receipt.v < version {
            return Err(bad(
                number,
                format!(
                    "a version {} receipt after a version {version} one: a chain only moves to newer versions",
                    receipt.v
                ),
            ));
        }
        version = receipt.v;
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
        if hash_of_line(receipt.v, &mut value) != receipt.hash {
            return Err(bad(
                number,
                "the hash does not match the receipt's contents".to_string(),
            ));
        }
        prev = Some(receipt.hash);
        count += 1;
    }
    Ok((count, prev.map(String::from)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Outcome;
    use proptest::prelude::*;

    /// Receipts with every field at its edges: text needing escapes and beyond ASCII (astral
    /// too), absent options, integers to `u64::MAX`, floats large, small, integral, negative,
    /// zero and not finite.
    fn any_receipt() -> impl Strategy<Value = Receipt> {
        let text = || "[a-z0-9 \"\\\\\n\t\u{1}\u{7f}é✓😀\u{ff61}]{0,12}";
        let float = || {
            prop_oneof![
                (0u64..10_000_000).prop_map(|us| us as f64 / 1000.0),
                Just(0.0),
                Just(-0.0),
                Just(3.0),
                Just(f64::NAN),
                Just(f64::INFINITY),
                Just(1e21),
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
        let status = prop_oneof![Just(Status::Ok), Just(Status::Error), Just(Status::Blocked)];
        (
            (
                prop_oneof![Just(RECEIPT_VERSION_1), Just(RECEIPT_VERSION)],
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
            (float(), float(), any::<u32>(), proptest::option::of(text())),
            (any::<bool>(), proptest::option::of(float())),
        )
            .prop_map(
                |(
                    (v, run_id, seq, call_id, parent),
                    (tool, effect, speculative, claimed, args_sha256),
                    (result_sha256, status, error_kind),
                    (started_ms, duration_ms, attempt, prev),
                    (cached, cached_age_ms),
                )| {
                    let mut receipt = Receipt {
                        v,
                        run_id,
                        seq,
                        call_id,
                        parent,
                        tool,
                        effect,
                        speculative,
                        claimed,
                        args_sha256: args_sha256.into(),
                        result_sha256: result_sha256.map(Hex::from),
                        status,
                        error_kind,
                        started_ms,
                        duration_ms,
                        attempt,
                        cached,
                        cached_age_ms,
                        prev: prev.map(Hex::from),
                        hash: Hex::default(),
                    };
                    receipt.hash = receipt.compute_hash().into();
                    receipt
                },
            )
    }

    proptest! {
        /// The text a receipt is hashed from, written by hand, is the general JCS writer's
        /// text of the receipt's value: any strings, floats, options, with a hash or without.
        #[test]
        fn the_hand_written_text_is_the_general_writer_s(receipt in any_receipt()) {
            for receipt in [Receipt { hash: Hex::default(), ..receipt.clone() }, receipt] {
                let general = crate::json::jcs(&serde_json::to_value(&receipt).unwrap()).unwrap();
                let mut text = Vec::new();
                if receipt.push_jcs(&mut text) {
                    prop_assert_eq!(String::from_utf8(text).unwrap(), general);
                } else {
                    let whole = |ms: f64| !ms.is_finite() || push_jcs_thousandths(ms, &mut Vec::new());
                    prop_assert!(
                        !whole(receipt.started_ms)
                            || !whole(receipt.duration_ms)
                            || receipt.cached_age_ms.is_some_and(|ms| !whole(ms))
                    );
                }
            }
        }

        /// The hash a receipt is sealed with is the one `verify` recomputes from its line: the
        /// line is the receipt, and the hash covers every field of it but `hash`, in its
        /// version's form.
        #[test]
        fn the_line_gives_back_the_hash(receipt in any_receipt()) {
            let mut line = Vec::new();
            write_line(&receipt, &mut line).unwrap();
            let mut value: Value = serde_json::from_slice(&line).unwrap();
            prop_assert_eq!(value["hash"].as_str(), Some(receipt.hash.as_str()));
            prop_assert_eq!(hash_of_line(receipt.v, &mut value), receipt.hash.clone());
            prop_assert!(!receipt.hash.starts_with("unhashable"));
        }
    }

    /// A version 2 receipt is hashed as RFC 8785 writes it: keys in UTF-16 order, integral
    /// floats without a fraction, `-0` as `0`; a version 1 receipt as it always was.
    #[test]
    fn version_2_hashes_the_jcs_text_and_version_1_the_old_one() {
        let receipt = Receipt {
            v: RECEIPT_VERSION,
            run_id: "r".into(),
            seq: 0,
            call_id: 1,
            parent: None,
            tool: "t".into(),
            effect: Effect::Read,
            speculative: false,
            claimed: false,
            args_sha256: "a".into(),
            result_sha256: None,
            status: Status::Ok,
            error_kind: None,
            started_ms: -0.0,
            duration_ms: 2.0,
            attempt: 1,
            cached: false,
            cached_age_ms: None,
            prev: None,
            hash: Hex::default(),
        };
        let jcs = r#"{"args_sha256":"a","attempt":1,"call_id":1,"claimed":false,"duration_ms":2,"effect":"read","error_kind":null,"parent":null,"prev":null,"result_sha256":null,"run_id":"r","seq":0,"speculative":false,"started_ms":0,"status":"ok","tool":"t","v":2}"#;
        assert_eq!(receipt.compute_hash(), sha256_hex(jcs));
        let old = Receipt {
            v: RECEIPT_VERSION_1,
            ..receipt
        };
        let v1 = jcs
            .replace(r#""duration_ms":2"#, r#""duration_ms":2.0"#)
            .replace(r#""started_ms":0"#, r#""started_ms":-0.0"#)
            .replace(r#""v":2"#, r#""v":1"#);
        assert_eq!(old.compute_hash(), sha256_hex(v1));
    }

    /// The fields are declared in JCS order: the hash is streamed, never sorted in a buffer.
    #[test]
    fn a_receipt_streams_in_jcs_order() {
        let log = ReceiptLog::new("run".into(), None);
        log.append(Draft {
            parent: Some(1),
            error_kind: Some("timeout".into()),
            ..draft(2)
        });
        let receipt = log.take().remove(0);
        assert!(crate::json::streams_in_jcs_order(&receipt));
        // So the hash written without checking the order is the checked one.
        assert_eq!(receipt.compute_hash(), receipt.hash);
        assert!(crate::json::streams_in_jcs_order(&Receipt {
            hash: Hex::default(),
            ..receipt
        }));
    }

    /// Two receipts written by version 1 (hashes recomputed by an independent tool, Python's
    /// `json.dumps(sort_keys=True)`, in the old form: the first has integral floats, whose text
    /// differs from JCS).
    fn v1_file() -> String {
        format!("{V1_LINE_0}\n{V1_LINE_1}\n")
    }
    const V1_LINE_0: &str = r#"{"args_sha256":"a22883e93273fa52419f3f34bb7e1125f2cd14a1f32561e419adc15324916c4b","attempt":1,"call_id":1,"claimed":false,"duration_ms":2.0,"effect":"read","error_kind":null,"hash":"e00ae1f09c95c6f52fa447f40d4c44fe330bd6dbc0f12f8e035b90135de57fa1","parent":null,"prev":null,"result_sha256":"caf236577ecdbea155962bde3647d9e111f4e321a55ba5cee7b4c734a7eb666b","run_id":"239aa3396eb6c00a","seq":0,"speculative":false,"started_ms":0.0,"status":"ok","tool":"get_customer","v":1}"#;
    const V1_LINE_1: &str = r#"{"args_sha256":"afee4cb27e6633b28d2f1d46d22157a1a1c9e9fe36e2056d771090d5b54be844","attempt":1,"call_id":2,"claimed":false,"duration_ms":38.614,"effect":"read","error_kind":null,"hash":"c692f36eaabb13e35163f2d336b410d7cf0a5a19666a7b9c56fcdcfc268f0277","parent":null,"prev":"e00ae1f09c95c6f52fa447f40d4c44fe330bd6dbc0f12f8e035b90135de57fa1","result_sha256":"daf5e00b733f7abc74fe3c39e029a01a8cefa447a36e3a4394730bc2fb53461f","run_id":"239aa3396eb6c00a","seq":1,"speculative":false,"started_ms":30.527,"status":"ok","tool":"list_orders","v":1}"#;

    fn file_of(dir: &tempfile::TempDir, text: &str) -> std::path::PathBuf {
        let path = dir.path().join("r.jsonl");
        std::fs::write(&path, text).unwrap();
        path
    }

    fn first_bad_line(path: &Path) -> (usize, String) {
        match verify_receipts(path) {
            Err(Error::Receipt { line, message, .. }) => (line, message),
            other => panic!("expected a bad receipt, got {other:?}"),
        }
    }

    #[test]
    fn a_version_1_file_still_verifies() {
        let dir = tempfile::tempdir().unwrap();
        let path = file_of(&dir, &v1_file());
        assert_eq!(verify_receipts(&path).unwrap(), 2);
        // Its first line's hash is not that of its JCS text: the old form is what checks it.
        let mut first: Value = serde_json::from_str(V1_LINE_0).unwrap();
        let hash = first["hash"].as_str().unwrap().to_owned();
        assert_ne!(hash_of_line(RECEIPT_VERSION, &mut first), hash);
        // A tampered version 1 line is named.
        let path = file_of(&dir, &v1_file().replace("\"attempt\":1", "\"attempt\":2"));
        let (line, message) = first_bad_line(&path);
        assert_eq!(line, 1);
        assert!(message.contains("hash"), "{message}");
    }

    /// A run resumed onto a version 1 file appends version 2 receipts chained to its last one;
    /// `verify` follows the chain across the versions, and names a tampered line on either side.
    #[test]
    fn a_version_1_chain_goes_on_in_version_2() {
        let dir = tempfile::tempdir().unwrap();
        let path = file_of(&dir, &v1_file());
        let log = ReceiptLog::new("resumed".into(), Some(Sink::append(&path).unwrap()));
        log.append(draft(7));
        log.append(draft(8));
        let receipts = log.take();
        assert!(log.failure().is_none());
        let last_v1: Value = serde_json::from_str(V1_LINE_1).unwrap();
        assert_eq!(receipts[0].prev.as_deref(), last_v1["hash"].as_str());
        assert_eq!((receipts[0].v, receipts[0].seq), (RECEIPT_VERSION, 2));
        assert_eq!(verify_receipts(&path).unwrap(), 4);
        assert_eq!(verify_receipts_to(&path, &receipts[1].hash).unwrap(), 4);

        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (at, from, to) in [
            (1, "\"attempt\":1", "\"attempt\":3"),
            (3, "\"call_id\":7", "\"call_id\":9"),
            (4, "\"duration_ms\":2.0", "\"duration_ms\":2.5"),
        ] {
            let mut tampered = lines.clone();
            let changed = tampered[at - 1].replacen(from, to, 1);
            assert_ne!(changed, tampered[at - 1], "{from} is in line {at}");
            tampered[at - 1] = &changed;
            let path = file_of(&dir, &(tampered.join("\n") + "\n"));
            let (line, message) = first_bad_line(&path);
            assert_eq!(line, at, "{message}");
            assert!(message.contains("hash"), "{message}");
        }

        // A chain never goes back from version 2 to version 1, even with every hash right.
        let log = ReceiptLog::new("run".into(), None);
        log.append(draft(1));
        let newer = log.take().remove(0);
        let mut older = Receipt {
            v: RECEIPT_VERSION_1,
            seq: 1,
            prev: Some(newer.hash.clone()),
            ..newer.clone()
        };
        older.hash = older.compute_hash().into();
        let path = dir.path().join("back.jsonl");
        write_receipts(&path, &[newer, older]).unwrap();
        let (line, message) = first_bad_line(&path);
        assert_eq!(line, 2);
        assert!(
            message.contains("version 1 receipt after a version 2"),
            "{message}"
        );
    }

    /// Fields a later version adds are covered by the hash: `verify` recomputes over every field
    /// of the line but `hash`, and changing an unknown field breaks the hash.
    #[test]
    fn fields_this_version_does_not_know_are_covered_by_the_hash() {
        let dir = tempfile::tempdir().unwrap();
        let log = ReceiptLog::new("run".into(), None);
        log.append(draft(1));
        let receipt = log.take().remove(0);
        let mut value = serde_json::to_value(&receipt).unwrap();
        value["cached"] = Value::Bool(true);
        value["ünknown"] = serde_json::json!({"😀": 1, "\u{ff61}": [1.0, 1e21]});
        let hash = {
            let mut body = value.clone();
            hash_of_line(RECEIPT_VERSION, &mut body)
        };
        assert_ne!(hash, receipt.hash, "the new fields are hashed");
        value["hash"] = Value::String(hash);
        let path = file_of(&dir, &format!("{value}\n"));
        assert_eq!(verify_receipts(&path).unwrap(), 1);
        value["cached"] = Value::Bool(false);
        let path = file_of(&dir, &format!("{value}\n"));
        let (line, message) = first_bad_line(&path);
        assert_eq!(line, 1);
        assert!(message.contains("hash"), "{message}");
    }

    fn draft(call_id: u64) -> Draft {
        Draft {
            call_id,
            parent: None,
            tool: "t".into(),
            effect: Effect::Read,
            speculative: false,
            claimed: None,
            args_sha256: sha256_digest("{}").into(),
            result_sha256: Some(sha256_digest("1").into()),
            error_kind: None,
            started_ms: 1.23456,
            duration_ms: 2.0,
            attempt: 1,
            cached_age_ms: None,
            blocked: false,
            planned: false,
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

    /// Without a sink, receipts are hashed later: in batches by the process's hasher while
    /// more are placed, the rest when the run takes them. The chain is the one a sink's
    /// receipts, hashed at once, make, speculative ones among them; whether the run is taken
    /// after the hasher hashed some or while it hashes.
    #[test]
    fn receipts_hashed_later_chain_as_receipts_hashed_at_once() {
        // Digests the draft leaves to whoever makes the receipt (the arguments' JCS text, the
        // outcome whose value's JCS is hashed), or takes at once (`digested`).
        let shared = |id: u64, digested: bool| {
            let args: Arc<str> = format!(r#"{{"i":{id}}}"#).into();
            let outcome: Outcome = Arc::new(Ok(serde_json::json!({"i": id, "s": "é\n"})));
            let (args, result) = if digested {
                let value = outcome.as_ref().as_ref().unwrap();
                (
                    sha256_digest(&*args).into(),
                    sha256_digest(crate::json::jcs(value).unwrap()).into(),
                )
            } else {
                (DraftDigest::OfText(args), DraftDigest::OfValue(outcome))
            };
            Draft {
                args_sha256: args,
                result_sha256: Some(result),
                ..draft(id)
            }
        };
        // Taken once the hasher has hashed some, and taken at once, racing it.
        for wait_for_the_hasher in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("r.jsonl");
            let at_once = ReceiptLog::new("run".into(), Some(Sink::create(&path).unwrap()));
            let later = ReceiptLog::new("run".into(), None);
            let digested = ReceiptLog::new("run".into(), None);
            let claimed = Arc::new(AtomicBool::new(false));
            let count = BATCH as u64 * 5 + 3;
            for id in 0..count {
                for log in [&at_once, &later, &digested] {
                    let is_digested = std::ptr::eq(log, &digested);
                    log.append(match id % 10 {
                        3 => Draft {
                            speculative: true,
                            claimed: Some(Arc::clone(&claimed)),
                            ..draft(id)
                        },
                        5 | 6 => shared(id, is_digested),
                        _ => draft(id),
                    });
                }
                if id == BATCH as u64 * 3 {
                    claimed.store(true, Ordering::SeqCst);
                    for log in [&at_once, &later, &digested] {
                        log.release(&claimed);
                    }
                }
            }
            // (A process that may use one core has no hasher.)
            if wait_for_the_hasher && Hasher::get().is_some() {
                // The hasher hashes the full batches while the log waits to be taken.
                let deferred = later.deferred.as_ref().unwrap();
                let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
                while lock(&deferred.hashed).0.len() < BATCH && std::time::Instant::now() < until {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                assert!(
                    lock(&deferred.hashed).0.len() >= BATCH,
                    "the hasher hashed a batch"
                );
            }
            let (a, b) = (at_once.take(), later.take());
            assert_eq!(a.len() as u64, count);
            assert_eq!(a, b);
            assert_eq!(
                a,
                digested.take(),
                "digests taken later are those taken at once"
            );
            assert_eq!(verify_receipts(&path).unwrap(), a.len());
        }
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
