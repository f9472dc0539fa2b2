//! Streamed runs: the script arrives in chunks, as a model writes it, and the scout starts the
//! reads it can derive from the text so far before the text is complete (docs/streaming.md).
//!
//! The run exists from the first byte: its id, its context (budget, receipts) and its ledger.
//! While the text streams, a scout runs over the longest prefix that parses as whole statements,
//! into that ledger; a longer prefix halts the previous scout (the reads it started stay in the
//! ledger) and starts its own. When the text is complete it is compiled as `run` compiles it,
//! and the run starts with the same context and ledger: it claims what the prefixes' scouts
//! started exactly as it claims any speculative read. A read started on a prefix whose meaning
//! the later text changed matches no call of the run, and is counted as wasted.

use std::fmt::Display;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};

use super::{new_run_id, Prepared, Run, RunOptions, RunOutcome, Runtime, SETTLE};
use crate::engine;
use crate::error::{ErrorKind, RunError};
use crate::ledger::RunLedger;
use crate::report::Mode;
use crate::speculate::Scout;

/// The least text a new attempt at parsing a prefix waits for after the last, in bytes; see
/// [`Throttle`].
const MIN_GROWTH: usize = 64;

/// A run whose script is still arriving: its id at once, its outcome when the text is complete
/// and the run has ended. Made by [`Runtime::run_streaming`].
///
/// Dropping it (or its [`StreamedRun::outcome`] future) before the outcome is there cancels
/// the run: the reads started while the text streamed, and the run itself once it started.
#[must_use = "a streamed run does nothing until its outcome is awaited"]
pub struct StreamedRun<'a> {
    run_id: String,
    outcome: futures::future::BoxFuture<'a, RunOutcome>,
}

impl std::fmt::Debug for StreamedRun<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamedRun")
            .field("run_id", &self.run_id)
            .finish_non_exhaustive()
    }
}

impl<'a> StreamedRun<'a> {
    /// The run's id, as in its receipts and the store: it exists from the first byte.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Reads the stream to its end and runs the script: the same outcome as
    /// [`Runtime::run_with`] on the whole text, with the same run id as
    /// [`StreamedRun::run_id`].
    pub async fn outcome(self) -> RunOutcome {
        self.outcome.await
    }
}

impl Runtime {
    /// Runs a script that arrives as a stream of chunks of text (a model's output as it is
    /// written). Each item is a chunk of the script's UTF-8 text (`String`, `Vec<u8>`, bytes:
    /// a chunk may end inside a character), or an error: the stream was cut off (a client went
    /// away), which cancels the reads started and ends the run `cancelled` without running it.
    /// The stream's end is the end of the script.
    ///
    /// In speculative mode, while the text streams, the scout starts the reads it can derive
    /// from the longest prefix that parses as whole statements; the run claims them once the
    /// text is complete, exactly as it claims any speculative read. The outcome is the one
    /// [`Runtime::run_with`] gives for the whole text. The run's deadline (`timeout_s`) starts
    /// when the text is complete; the text must be complete within `stream_timeout_s` of the
    /// call, or the run fails with `limit_exceeded` naming that limit.
    ///
    /// Must be called within a tokio runtime. See docs/streaming.md.
    pub fn run_streaming<'a, S, C, E>(&'a self, chunks: S, options: RunOptions) -> StreamedRun<'a>
    where
        S: Stream<Item = Result<C, E>> + Send + 'a,
        C: AsRef<[u8]> + Send + 'a,
        E: Display + Send + 'a,
    {
        let run_id = new_run_id();
        let outcome = Box::pin(self.stream_then_run(chunks, options, run_id.clone()));
        StreamedRun { run_id, outcome }
    }

    async fn stream_then_run<S, C, E>(
        &self,
        chunks: S,
        options: RunOptions,
        run_id: String,
    ) -> RunOutcome
    where
        S: Stream<Item = Result<C, E>> + Send,
        C: AsRef<[u8]> + Send,
        E: Display + Send,
    {
        if let Err(why) = self.room_for_a_run() {
            return with_id(RunOutcome::before_running(why), &run_id);
        }
        let prepared = Run::prepare(self, &options, &run_id, None);
        // Until the text is complete, the budget's deadline is the streaming phase's bound.
        prepared.ctx.restart_deadline(self.limits.stream_timeout);
        let mut phase = Streaming {
            prepared: Some(prepared),
            scouts: Vec::new(),
            speculate: options.mode == Mode::Speculative,
        };
        let text = match self.receive(chunks, &mut phase).await {
            Ok(text) => text,
            Err(why) => return phase.fail(why, &run_id).await,
        };
        let script = match self.compile(&text) {
            Ok(script) => script,
            Err(e) => return phase.fail(e, &run_id).await,
        };
        phase.halt_scouts();
        let Some(prepared) = phase.prepared.take() else {
            unreachable!("the run is prepared until it starts");
        };
        let held = match (&self.store, options.no_store) {
            (Some(store), false) => {
                match self.record_run(store, &script, &options, &run_id).await {
                    Ok(held) => Some(held),
                    Err(e) => {
                        phase.prepared = Some(prepared);
                        let why = RunError::new(
                            ErrorKind::Internal,
                            format!("the run could not be recorded: {}", e.report()),
                        );
                        return phase.fail(why, &run_id).await;
                    }
                }
            }
            _ => None,
        };
        if let Some(journal) = held.as_ref().and_then(|h| h.journal.as_ref()) {
            prepared.ctx.journal.set(Arc::clone(journal));
        }
        // The run's own deadline starts now, as a run of the whole text's would.
        prepared.ctx.restart_deadline(self.limits.timeout);
        let mut run = Run::start(self, &script, options, run_id, held, Some(prepared));
        let joined = run.join().await;
        let outcome = run.finish(self, joined).await;
        phase.finish_scouts().await;
        outcome
    }

    /// Reads the stream to its end within `stream_timeout_s`, starting a scout on each longer
    /// prefix that parses; the whole text, or why the run cannot start.
    async fn receive<S, C, E>(&self, chunks: S, phase: &mut Streaming) -> Result<String, RunError>
    where
        S: Stream<Item = Result<C, E>> + Send,
        C: AsRef<[u8]> + Send,
        E: Display + Send,
    {
        let started = Instant::now();
        let until = tokio::time::Instant::from_std(crate::sync::deadline_after(
            started,
            self.limits.stream_timeout,
        ));
        let max = self.limits.max_script_bytes;
        let mut text: Vec<u8> = Vec::new();
        // Bytes past `max_script_bytes`: counted, not kept, so that the error names the size
        // of the whole text, as `run`'s does.
        let mut overflow = 0usize;
        let mut lexer = Boundaries::default();
        let mut throttle = Throttle::default();
        let mut chunks = std::pin::pin!(chunks);
        loop {
            let next = match tokio::time::timeout_at(until, chunks.next()).await {
                Ok(next) => next,
                Err(_) => return Err(self.stream_too_slow()),
            };
            let chunk = match next {
                None => break,
                Some(Ok(chunk)) => chunk,
                Some(Err(e)) => {
                    let mut why = RunError::new(
                        ErrorKind::Cancelled,
                        format!("the script's stream was cut off before it ended ({e}); nothing ran, and the reads started were cancelled"),
                    );
                    why.recoverable = true;
                    return Err(why);
                }
            };
            let bytes = chunk.as_ref();
            if overflow > 0 || text.len() + bytes.len() > max {
                overflow += bytes.len();
                continue;
            }
            lexer.scan(bytes, text.len());
            text.extend_from_slice(bytes);
            if phase.speculate && throttle.due(lexer.last) {
                let tried = Instant::now();
                self.scout_prefix(&text[..lexer.last], phase, started);
                throttle.tried(lexer.last, tried.elapsed());
            }
        }
        if overflow > 0 {
            let message = format!(
                "the script is {} bytes; at most {max} may be compiled",
                text.len() + overflow,
            );
            return Err(engine::limit_exceeded(
                message,
                "max_script_bytes",
                &self.limits,
            ));
        }
        String::from_utf8(text).map_err(|e| {
            RunError::new(
                ErrorKind::InvalidScript,
                format!("the script is not UTF-8 text (byte {} is not part of a character): send the script's text as UTF-8", e.utf8_error().valid_up_to()),
            )
        })
    }

    /// Starts a scout over `prefix` when it parses as whole statements, halting the scout of
    /// the shorter prefix before it.
    fn scout_prefix(&self, prefix: &[u8], phase: &mut Streaming, started: Instant) {
        let Ok(prefix) = std::str::from_utf8(prefix) else {
            return;
        };
        let Ok(script) = self.compile(prefix) else {
            return;
        };
        if !script.scouted {
            return;
        }
        let Some(Prepared { ctx, ledger }) = &phase.prepared else {
            return;
        };
        let (ctx, ledger) = (Arc::clone(ctx), Arc::clone(ledger));
        phase.halt_scouts();
        let scout = Scout::new(
            ctx,
            ledger,
            Arc::clone(&script.scout),
            self.limits.clone(),
            crate::sync::deadline_after(started, self.limits.stream_timeout),
            tokio::runtime::Handle::current(),
        );
        let driver = tokio::spawn(Arc::clone(&scout).drive_until_halted());
        phase.scouts.push((scout, Some(driver)));
    }

    fn stream_too_slow(&self) -> RunError {
        let message = format!(
            "the script's text did not end within stream_timeout_s ({} s) of its first byte; nothing ran",
            crate::json::seconds(self.limits.stream_timeout)
        );
        engine::limit_exceeded(message, "stream_timeout_s", &self.limits)
    }
}

/// The streaming phase of a run: its context and ledger until the run takes them, and the
/// scouts of the prefixes. Dropped before the run started (the caller went away), it cancels
/// every read started.
struct Streaming {
    prepared: Option<Prepared>,
    scouts: Vec<(Arc<Scout>, Option<tokio::task::JoinHandle<u64>>)>,
    speculate: bool,
}

impl Streaming {
    /// Halts the passes of every scout (their reads stay in the ledger for the run).
    fn halt_scouts(&mut self) {
        for (scout, driver) in &mut self.scouts {
            scout.halt();
            if let Some(driver) = driver.take() {
                driver.abort();
            }
        }
    }

    /// Ends the scouts of the prefixes: their deferred calls aborted, their reads awaited
    /// (the run's end cancelled those still running).
    async fn finish_scouts(&mut self) {
        self.halt_scouts();
        for (scout, _) in std::mem::take(&mut self.scouts) {
            scout.finish().await;
        }
    }

    /// The outcome of a streamed run that never started: `why`, under the run's id, with the
    /// reads started while streaming cancelled, counted as wasted, and their receipts.
    async fn fail(&mut self, why: RunError, run_id: &str) -> RunOutcome {
        let mut outcome = with_id(RunOutcome::before_running(why), run_id);
        let Some(Prepared { ctx, ledger }) = self.prepared.take() else {
            return outcome;
        };
        stop(&ctx, &ledger);
        self.finish_scouts().await;
        ctx.settled(SETTLE).await;
        let (launched, claimed) = ledger.counts();
        outcome.stats.mode = ledger_mode(self.speculate);
        outcome.stats.speculative_launched = launched;
        outcome.stats.speculative_claimed = claimed;
        outcome.stats.speculative_wasted = launched - claimed;
        outcome.stats.dispatched = ctx.dispatched();
        outcome.receipts = ctx.take_receipts();
        outcome
    }
}

impl Drop for Streaming {
    fn drop(&mut self) {
        if let Some(Prepared { ctx, ledger }) = &self.prepared {
            stop(ctx, ledger);
        }
        for (scout, driver) in &self.scouts {
            scout.stop();
            if let Some(driver) = driver {
                driver.abort();
            }
        }
    }
}

fn ledger_mode(speculate: bool) -> Mode {
    if speculate {
        Mode::Speculative
    } else {
        Mode::Sequential
    }
}

/// Cancels every call of a run that will not start, and closes its ledger to new reads.
fn stop(ctx: &crate::dispatch::RunContext, ledger: &RunLedger) {
    ctx.cancel.cancel();
    ledger.close();
}

fn with_id(mut outcome: RunOutcome, run_id: &str) -> RunOutcome {
    outcome.run_id = run_id.to_string();
    outcome
}

/// When to try parsing a longer prefix: only when the text has a new statement boundary, and
/// then only when the text grew by a quarter since the last try (at least [`MIN_GROWTH`]
/// bytes), or when the time since the last try is eight times what that try took. The first
/// rule keeps the parsing of a text arriving at once linear in its length (the tries grow
/// geometrically); the second keeps the parsing of a text arriving slowly (a model writing)
/// under about a ninth of the time it takes to arrive, whatever the size of its chunks.
#[derive(Default)]
struct Throttle {
    /// The end of the prefix last tried.
    tried_at: usize,
    /// When it was tried, and how long it took.
    last: Option<(Instant, Duration)>,
}

impl Throttle {
    fn due(&self, boundary: usize) -> bool {
        if boundary <= self.tried_at {
            return false;
        }
        let grown = boundary - self.tried_at >= (self.tried_at / 4).max(MIN_GROWTH);
        let rested = match self.last {
            None => true,
            Some((at, took)) => at.elapsed() >= took * 8,
        };
        grown || rested
    }

    fn tried(&mut self, boundary: usize, took: Duration) {
        self.tried_at = boundary;
        self.last = Some((Instant::now(), took));
    }
}

/// Where the text so far can be cut into whole statements: after a `;` or a `}` outside any
/// bracket, string or comment. Scanned once, chunk by chunk (a chunk may end anywhere, inside
/// a token too). It only proposes a cut: the prefix must still parse to be scouted, so a
/// wrong guess costs a parse and nothing else.
#[derive(Default)]
struct Boundaries {
    /// The end of the last boundary, in bytes.
    last: usize,
    /// What the scanner is in: code (with its bracket depth) or template strings' code, the
    /// innermost last; empty means the top-level code.
    frames: Vec<Frame>,
    depth: u32,
    state: Lex,
    /// The byte before, for two-byte tokens (`//`, `/*`, `*/`, `${`); 0 after one was taken.
    prev: u8,
}

#[derive(Default, Clone, Copy, PartialEq, Debug)]
enum Lex {
    #[default]
    Code,
    LineComment,
    /// A block comment, nested this deep.
    Block(u32),
    /// A string in `"`, or a character in `'`; `true` after a backslash.
    Quoted(u8, bool),
    Template,
}

/// A template string (`` `...${code}...` ``) opened in code of bracket depth `outer`.
#[derive(Clone, Copy, Debug)]
enum Frame {
    /// Inside the template's text.
    Template { outer: u32 },
    /// Inside one of its `${...}`.
    Code { outer: u32 },
}

impl Boundaries {
    /// Scans `bytes`, which start at byte `at` of the text.
    fn scan(&mut self, bytes: &[u8], at: usize) {
        for (i, &b) in bytes.iter().enumerate() {
            let prev = std::mem::replace(&mut self.prev, b);
            match self.state {
                Lex::Code => self.code(prev, b, at + i + 1),
                Lex::LineComment => {
                    if b == b'\n' {
                        self.state = Lex::Code;
                    }
                }
                Lex::Block(n) => match (prev, b) {
                    (b'*', b'/') => {
                        self.state = if n == 1 { Lex::Code } else { Lex::Block(n - 1) };
                        self.prev = 0;
                    }
                    (b'/', b'*') => {
                        self.state = Lex::Block(n + 1);
                        self.prev = 0;
                    }
                    _ => {}
                },
                Lex::Quoted(quote, escaped) => {
                    self.state = match b {
                        _ if escaped => Lex::Quoted(quote, false),
                        b'\\' => Lex::Quoted(quote, true),
                        _ if b == quote => Lex::Code,
                        _ => Lex::Quoted(quote, false),
                    };
                }
                Lex::Template => match (prev, b) {
                    (_, b'`') => {
                        if let Some(Frame::Template { outer }) = self.frames.pop() {
                            self.depth = outer;
                        }
                        self.state = Lex::Code;
                    }
                    (b'$', b'{') => {
                        let outer = match self.frames.pop() {
                            Some(Frame::Template { outer }) => outer,
                            _ => 0,
                        };
                        self.frames.push(Frame::Code { outer });
                        self.depth = 0;
                        self.state = Lex::Code;
                        self.prev = 0;
                    }
                    _ => {}
                },
            }
        }
    }

    /// A byte of code; `end` is the offset just after it.
    fn code(&mut self, prev: u8, b: u8, end: usize) {
        match (prev, b) {
            (b'/', b'/') => {
                self.state = Lex::LineComment;
                self.prev = 0;
            }
            (b'/', b'*') => {
                self.state = Lex::Block(1);
                self.prev = 0;
            }
            (_, b'"') | (_, b'\'') => self.state = Lex::Quoted(b, false),
            (_, b'`') => {
                self.frames.push(Frame::Template { outer: self.depth });
                self.state = Lex::Template;
            }
            (_, b'(' | b'[' | b'{') => self.depth += 1,
            (_, b')' | b']') => self.depth = self.depth.saturating_sub(1),
            (_, b'}') => {
                if self.depth == 0 {
                    // The end of a template's `${...}`: back in the template's text.
                    if let Some(Frame::Code { outer }) = self.frames.pop() {
                        self.frames.push(Frame::Template { outer });
                        self.state = Lex::Template;
                    }
                    return;
                }
                self.depth -= 1;
                self.boundary(end);
            }
            (_, b';') => self.boundary(end),
            _ => {}
        }
    }

    fn boundary(&mut self, end: usize) {
        if self.depth == 0 && self.frames.is_empty() {
            self.last = end;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The boundaries of `text` scanned in chunks of `size` bytes.
    fn cuts(text: &str, size: usize) -> Vec<usize> {
        let mut lexer = Boundaries::default();
        let mut out = Vec::new();
        for (i, chunk) in text.as_bytes().chunks(size).enumerate() {
            for (j, _) in chunk.iter().enumerate() {
                let at = i * size + j;
                lexer.scan(&chunk[j..=j], at);
                if lexer.last == at + 1 {
                    out.push(at + 1);
                }
            }
        }
        out
    }

    #[test]
    fn statements_end_at_semicolons_and_blocks_outside_strings_and_comments() {
        let text = "let a = f(\"x;}\"); // c; }\nif a { g(1); }\n/* x; /* y; */ } */let t = `a${ {b:1}.b }c;`;";
        for size in [1, 2, 3, 7, text.len()] {
            let got = cuts(text, size);
            let ends: Vec<&str> = got.iter().map(|&e| &text[..e]).collect();
            assert_eq!(got.len(), 3, "chunks of {size}: {ends:?}");
            assert!(ends[0].ends_with("f(\"x;}\");"), "{ends:?}");
            assert!(ends[1].ends_with("g(1); }"), "{ends:?}");
            assert!(ends[2].ends_with("}c;`;"), "{ends:?}");
        }
    }

    #[test]
    fn nothing_inside_brackets_is_a_boundary() {
        assert!(cuts("let x = [1, {a: 2};", 1).is_empty());
        assert_eq!(cuts("let f = |x| { x; };", 1), vec![18, 19]);
        assert_eq!(cuts("let c = '\\'';", 1), vec![13]);
    }

    #[test]
    fn the_throttle_grows_geometrically_when_text_arrives_at_once() {
        let mut throttle = Throttle::default();
        let mut tries = 0;
        for end in 1..=1_000_000usize {
            if throttle.due(end) {
                tries += 1;
                // A try that takes a long time: only growth makes the next one due.
                throttle.tried(end, Duration::from_secs(3_600));
            }
        }
        assert!(
            tries < 120,
            "{tries} tries for 1 MB arriving a byte at a time"
        );
    }
}
