//! Steps 6 and 10: the per-tool circuit breaker, shared by all runs of one runtime.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{ErrorKind, ToolError};
use crate::sync::lock;

/// When a tool's breaker opens and how long it stays open.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct BreakerConfig {
    /// Consecutive failures (timeouts, internal errors, invalid output, `unavailable`) that open it.
    pub failure_threshold: u32,
    /// How long it stays open before one probe call is let through (half-open).
    pub cooldown: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            failure_threshold: 5,
            cooldown: Duration::from_secs(30),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Circuit {
    Closed {
        failures: u32,
    },
    Open {
        until: Instant,
    },
    /// One probe is running; it started at `since`. A probe that never reports (its call was
    /// cancelled) is replaced by a new one after another cool-down.
    HalfOpen {
        since: Instant,
    },
}

/// Whether a call was let through normally or as the half-open probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    Normal,
    Probe,
}

/// What a call told the breaker about the tool's health.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Health {
    /// The tool answered (with a result or a caller's error).
    Answered,
    /// The tool failed in a way that counts.
    Failed,
    /// The call never reached the tool (its input was invalid): nothing learned.
    Unknown,
}

impl Health {
    pub(crate) fn of<T>(result: &Result<T, ToolError>) -> Health {
        match result {
            Err(e) if e.kind.counts_as_failure() => Health::Failed,
            Err(e) if e.kind == ErrorKind::Cancelled => Health::Unknown,
            _ => Health::Answered,
        }
    }
}

/// A tool's circuit until it fails: closed, with no failure counted. A tool with no circuit
/// yet is in it.
const HEALTHY: Circuit = Circuit::Closed { failures: 0 };

/// The breakers of all tools of one runtime.
#[derive(Debug, Default)]
pub(crate) struct Breakers {
    config: BreakerConfig,
    states: Mutex<crate::sync::FastMap<String, Circuit>>,
    /// How many circuits are not [`HEALTHY`], changed under `states`' lock: while none is,
    /// every call is admitted and an answer changes nothing, which a call then learns
    /// without the lock (as if it came just before a failure recorded meanwhile).
    troubled: AtomicUsize,
}

impl Breakers {
    pub(crate) fn new(config: BreakerConfig) -> Breakers {
        Breakers {
            config,
            states: Mutex::default(),
            troubled: AtomicUsize::new(0),
        }
    }

    /// Every circuit is [`HEALTHY`].
    fn all_healthy(&self) -> bool {
        self.troubled.load(Ordering::Acquire) == 0
    }

    /// Counts a circuit's change from `was` to `is` (under `states`' lock).
    fn changed(&self, was: Circuit, is: Circuit) {
        match (was == HEALTHY, is == HEALTHY) {
            (true, false) => {
                self.troubled.fetch_add(1, Ordering::Release);
            }
            (false, true) => {
                self.troubled.fetch_sub(1, Ordering::Release);
            }
            _ => {}
        }
    }

    /// When these breakers open and how long they stay open.
    pub(crate) fn config(&self) -> &BreakerConfig {
        &self.config
    }

    /// Lets a call through, or fails it fast with `circuit_open`.
    pub(crate) fn admit(&self, tool: &str, now: Instant) -> Result<Admission, ToolError> {
        if self.all_healthy() {
            return Ok(Admission::Normal);
        }
        let mut states = self.lock();
        let Some(circuit) = states.get_mut(tool) else {
            return Ok(Admission::Normal);
        };
        let was = *circuit;
        let admitted = self.admit_in(circuit, tool, now);
        let is = *circuit;
        self.changed(was, is);
        admitted
    }

    /// Fails fast if the breaker is open, without admitting a call: a speculative read is
    /// neither a probe nor counted (the executor's claim of its outcome is, as in a sequential run).
    pub(crate) fn check(&self, tool: &str, now: Instant) -> Result<(), ToolError> {
        if self.all_healthy() {
            return Ok(());
        }
        let states = self.lock();
        match states.get(tool) {
            Some(Circuit::Open { until }) if now < *until => {
                Err(open(tool, Some(self.config.cooldown)))
            }
            Some(Circuit::HalfOpen { .. }) => Err(open(tool, None)),
            _ => Ok(()),
        }
    }

    /// Records what an admitted call found out.
    pub(crate) fn record(&self, tool: &str, admission: Admission, health: Health, now: Instant) {
        if health == Health::Answered && admission == Admission::Normal && self.all_healthy() {
            return;
        }
        let mut states = self.lock();
        // Looked up before it is inserted: a tool's name is copied once, when it first fails.
        let circuit = match states.get_mut(tool) {
            Some(circuit) => circuit,
            None => states.entry(tool.to_string()).or_insert(HEALTHY),
        };
        let was = *circuit;
        self.record_in(circuit, tool, admission, health, now);
        let is = *circuit;
        self.changed(was, is);
    }

    /// Replays, at once, what a sequential call of `tool` would have done to the breakers: admit
    /// it, admit and record each of its nested calls in order (`None` for one that stopped
    /// before the breaker step), record its own health. Nothing changes unless every nested
    /// call would have been admitted; the first refusal is returned instead.
    ///
    /// # Errors
    ///
    /// [`Replay::Refused`] when `tool` itself is not admitted (as the sequential call would
    /// have been refused); [`Replay::Diverged`] when a nested call would have been refused,
    /// so the sequential run would have seen another outcome than the speculative one.
    pub(crate) fn replay(
        &self,
        tool: &str,
        health: Option<Health>,
        nested: &[(String, Option<Health>)],
        now: Instant,
    ) -> Result<(), Replay> {
        let mut states = self.lock();
        let mut scratch: HashMap<&str, Circuit> = HashMap::new();
        let circuit_of = |name: &str, scratch: &mut HashMap<&str, Circuit>| {
            scratch
                .get(name)
                .or_else(|| states.get(name))
                .copied()
                .unwrap_or(HEALTHY)
        };
        let mut own = circuit_of(tool, &mut scratch);
        let admission = self
            .admit_in(&mut own, tool, now)
            .map_err(Replay::Refused)?;
        for (name, health) in nested {
            let Some(health) = health else { continue };
            let mut circuit = circuit_of(name, &mut scratch);
            let Ok(nested_admission) = self.admit_in(&mut circuit, name, now) else {
                return Err(Replay::Diverged);
            };
            self.record_in(&mut circuit, name, nested_admission, *health, now);
            scratch.insert(name, circuit);
        }
        // A composite never nests itself (the registry forbids it), so its own circuit is
        // the one admitted above.
        if let Some(health) = health {
            self.record_in(&mut own, tool, admission, health, now);
        }
        for (name, circuit) in scratch.into_iter().chain([(tool, own)]) {
            let was = states.insert(name.to_string(), circuit).unwrap_or(HEALTHY);
            self.changed(was, circuit);
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, crate::sync::FastMap<String, Circuit>> {
        lock(&self.states)
    }

    fn admit_in(
        &self,
        circuit: &mut Circuit,
        tool: &str,
        now: Instant,
    ) -> Result<Admission, ToolError> {
        match *circuit {
            Circuit::Closed { .. } => Ok(Admission::Normal),
            Circuit::Open { until } if now >= until => {
                *circuit = Circuit::HalfOpen { since: now };
                Ok(Admission::Probe)
            }
            Circuit::HalfOpen { since } if now >= since + self.config.cooldown => {
                *circuit = Circuit::HalfOpen { since: now };
                Ok(Admission::Probe)
            }
            Circuit::Open { .. } => Err(open(tool, Some(self.config.cooldown))),
            Circuit::HalfOpen { .. } => Err(open(tool, None)),
        }
    }

    fn record_in(
        &self,
        circuit: &mut Circuit,
        tool: &str,
        admission: Admission,
        health: Health,
        now: Instant,
    ) {
        let reopened = Circuit::Open {
            until: now + self.config.cooldown,
        };
        *circuit = match (admission, *circuit, health) {
            (Admission::Probe, _, Health::Answered) => Circuit::Closed { failures: 0 },
            (Admission::Probe, _, Health::Failed) => reopened,
            // A probe that never reached the tool leaves the next call to probe.
            (Admission::Probe, _, Health::Unknown) => Circuit::Open { until: now },
            (Admission::Normal, Circuit::Closed { failures }, Health::Failed) => {
                if failures + 1 >= self.config.failure_threshold {
                    tracing::warn!(tool, failures = failures + 1, "circuit breaker opened");
                    reopened
                } else {
                    Circuit::Closed {
                        failures: failures + 1,
                    }
                }
            }
            (Admission::Normal, Circuit::Closed { .. }, Health::Answered) => {
                Circuit::Closed { failures: 0 }
            }
            // Late outcomes of calls admitted before the breaker opened change nothing.
            (Admission::Normal, other, _) => other,
        };
    }
}

/// Why a claim's replay on the breakers changed nothing.
#[derive(Debug)]
pub(crate) enum Replay {
    /// The call itself would have been refused, with this error.
    Refused(ToolError),
    /// One of its nested calls would have been refused.
    Diverged,
}

/// The error of a call the breaker refuses. An open breaker's message names its cool-down,
/// not the time left of it: the time left depends on when the call came, and a run's errors
/// are the same whichever way it runs.
fn open(tool: &str, cooldown: Option<Duration>) -> ToolError {
    let message = match cooldown {
        None => format!("`{tool}` failed repeatedly; a probe call is testing whether it recovered"),
        Some(cooldown) => format!(
            "`{tool}` failed repeatedly; calls fail fast until {} s after it opened",
            cooldown.as_secs_f64()
        ),
    };
    ToolError::new(ErrorKind::CircuitOpen, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breakers() -> Breakers {
        Breakers::new(BreakerConfig {
            failure_threshold: 3,
            cooldown: Duration::from_secs(10),
        })
    }

    fn fail(b: &Breakers, now: Instant) {
        let a = b.admit("t", now).unwrap();
        b.record("t", a, Health::Failed, now);
    }

    #[test]
    fn opens_after_consecutive_failures() {
        let b = breakers();
        let now = Instant::now();
        fail(&b, now);
        fail(&b, now);
        assert!(b.admit("t", now).is_ok());
        fail(&b, now);
        let e = b.admit("t", now).unwrap_err();
        assert_eq!(e.kind, ErrorKind::CircuitOpen);
        assert!(b.admit("other", now).is_ok(), "breakers are per tool");
    }

    #[test]
    fn a_success_resets_the_count() {
        let b = breakers();
        let now = Instant::now();
        fail(&b, now);
        fail(&b, now);
        let a = b.admit("t", now).unwrap();
        b.record("t", a, Health::Answered, now);
        fail(&b, now);
        fail(&b, now);
        assert!(b.admit("t", now).is_ok());
    }

    #[test]
    fn half_opens_after_cooldown_with_one_probe() {
        let b = breakers();
        let now = Instant::now();
        (0..3).for_each(|_| fail(&b, now));
        let later = now + Duration::from_secs(10);
        assert_eq!(b.admit("t", later).unwrap(), Admission::Probe);
        assert!(b.admit("t", later).is_err(), "only one probe at a time");
        b.record("t", Admission::Probe, Health::Answered, later);
        assert_eq!(b.admit("t", later).unwrap(), Admission::Normal);
    }

    #[test]
    fn a_failed_probe_reopens() {
        let b = breakers();
        let now = Instant::now();
        (0..3).for_each(|_| fail(&b, now));
        let later = now + Duration::from_secs(10);
        assert_eq!(b.admit("t", later).unwrap(), Admission::Probe);
        b.record("t", Admission::Probe, Health::Failed, later);
        assert!(b.admit("t", later + Duration::from_secs(9)).is_err());
        assert!(b.admit("t", later + Duration::from_secs(10)).is_ok());
    }

    #[test]
    fn an_abandoned_probe_is_replaced_after_a_cooldown() {
        let b = breakers();
        let now = Instant::now();
        (0..3).for_each(|_| fail(&b, now));
        let t1 = now + Duration::from_secs(10);
        assert_eq!(b.admit("t", t1).unwrap(), Admission::Probe);
        assert_eq!(
            b.admit("t", t1 + Duration::from_secs(10)).unwrap(),
            Admission::Probe
        );
    }

    #[test]
    fn a_check_admits_nothing() {
        let b = breakers();
        let now = Instant::now();
        assert!(b.check("t", now).is_ok());
        (0..3).for_each(|_| fail(&b, now));
        assert!(b.check("t", now).is_err());
        let later = now + Duration::from_secs(10);
        assert!(b.check("t", later).is_ok(), "cooled down");
        assert_eq!(
            b.admit("t", later).unwrap(),
            Admission::Probe,
            "the check took no probe"
        );
    }

    #[test]
    fn a_replay_applies_all_or_nothing() {
        let b = breakers();
        let now = Instant::now();
        // A composite `c` whose nested call of `n` failed, claimed three times: `n` opens.
        let nested = [("n".to_string(), Some(Health::Failed))];
        for _ in 0..3 {
            b.replay("c", Some(Health::Answered), &nested, now).unwrap();
        }
        assert!(b.admit("n", now).is_err(), "the nested failures counted");
        assert!(b.admit("c", now).is_ok());
        // Another claim would have met `n` open inside its body: it diverges and changes
        // nothing, not even `c`'s count.
        (0..2).for_each(|_| fail(&b, now));
        let before = b.lock().get("t").copied();
        assert!(matches!(
            b.replay("t", Some(Health::Failed), &nested, now),
            Err(Replay::Diverged)
        ));
        assert_eq!(b.lock().get("t").copied(), before);
        // A call whose own breaker is open is refused, as it would have been.
        fail(&b, now);
        assert!(matches!(
            b.replay("t", Some(Health::Answered), &[], now),
            Err(Replay::Refused(e)) if e.kind == ErrorKind::CircuitOpen
        ));
        // A nested call that stopped before its breaker step is not admitted at all.
        let later = now + Duration::from_secs(10);
        b.replay("c", None, &[("n".to_string(), None)], later)
            .unwrap();
        assert_eq!(
            b.admit("n", later).unwrap(),
            Admission::Probe,
            "no probe was taken"
        );
    }

    /// Whatever the calls, their outcomes and the claims' replays, the breakers count their
    /// troubled circuits right (so that their lock-free answers are the locked ones), and
    /// answer as breakers that always take the lock.
    #[test]
    fn the_troubled_count_follows_every_change() {
        use proptest::prelude::*;
        #[derive(Clone, Debug)]
        enum Op {
            Call(usize, Health, u64),
            Check(usize, u64),
            Replay(usize, Option<Health>, Vec<(usize, Option<Health>)>, u64),
        }
        let health = || {
            prop_oneof![
                Just(Health::Answered),
                Just(Health::Failed),
                Just(Health::Unknown)
            ]
        };
        let op = prop_oneof![
            (0..3usize, health(), 0..30u64).prop_map(|(t, h, s)| Op::Call(t, h, s)),
            (0..3usize, 0..30u64).prop_map(|(t, s)| Op::Check(t, s)),
            (
                0..3usize,
                proptest::option::of(health()),
                proptest::collection::vec((3..5usize, proptest::option::of(health())), 0..3),
                0..30u64
            )
                .prop_map(|(t, h, n, s)| Op::Replay(t, h, n, s)),
        ];
        let names = ["a", "b", "c", "n1", "n2"];
        let start = Instant::now();
        proptest!(ProptestConfig::with_cases(300), |(ops in proptest::collection::vec(op, 1..60))| {
            let (fast, locked) = (breakers(), breakers());
            // The second is never found healthy: every answer of its is the lock's.
            locked.troubled.store(usize::MAX / 2, Ordering::SeqCst);
            let mut now = start;
            for op in ops {
                match op {
                    Op::Call(t, health, step) => {
                        now += Duration::from_secs(step);
                        let admitted = fast.admit(names[t], now);
                        let expected = locked.admit(names[t], now);
                        prop_assert_eq!(
                            admitted.as_ref().map_err(|e| &e.message),
                            expected.as_ref().map_err(|e| &e.message)
                        );
                        if let Ok(admission) = admitted {
                            fast.record(names[t], admission, health, now);
                            locked.record(names[t], admission, health, now);
                        }
                    }
                    Op::Check(t, step) => {
                        now += Duration::from_secs(step);
                        prop_assert_eq!(
                            fast.check(names[t], now).map_err(|e| e.message),
                            locked.check(names[t], now).map_err(|e| e.message)
                        );
                    }
                    Op::Replay(t, health, nested, step) => {
                        now += Duration::from_secs(step);
                        let nested: Vec<_> =
                            nested.into_iter().map(|(n, h)| (names[n].to_string(), h)).collect();
                        let replayed = fast.replay(names[t], health, &nested, now);
                        let expected = locked.replay(names[t], health, &nested, now);
                        prop_assert_eq!(format!("{replayed:?}"), format!("{expected:?}"));
                    }
                }
                let troubled = fast.lock().values().filter(|c| **c != HEALTHY).count();
                prop_assert_eq!(fast.troubled.load(Ordering::SeqCst), troubled);
                for name in names {
                    let state = |b: &Breakers| b.lock().get(name).copied().unwrap_or(HEALTHY);
                    prop_assert_eq!(state(&fast), state(&locked));
                }
            }
        });
    }

    #[test]
    fn caller_errors_do_not_count() {
        let e = ToolError::new(ErrorKind::NotFound, "x");
        assert_eq!(Health::of::<()>(&Err(e)), Health::Answered);
        let e = ToolError::new(ErrorKind::Timeout, "x");
        assert_eq!(Health::of::<()>(&Err(e)), Health::Failed);
    }
}
