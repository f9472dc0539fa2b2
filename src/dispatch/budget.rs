//! Step 5: the run's budget of tool calls, speculative calls, in-flight calls and wall-clock time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{ErrorKind, LimitReached, ToolError};
use crate::sync::lock;

/// What one run may spend on tool calls, from its [`Limits`](crate::Limits). The calls a
/// sequential run would make count against `max_calls` (a speculative outcome is charged when the
/// executor claims it); reads the scout starts count against `max_speculative_calls` alone.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Budget {
    pub(crate) max_calls: u64,
    pub(crate) max_speculative_calls: u64,
    pub(crate) max_in_flight: u64,
}

#[cfg(test)]
impl Default for Budget {
    fn default() -> Budget {
        Budget {
            max_calls: 1_000,
            max_speculative_calls: 1_000,
            max_in_flight: 64,
        }
    }
}

#[derive(Debug, Default)]
struct Spent {
    calls: u64,
    speculative: u64,
    in_flight: u64,
}

/// One run's budget and what it has spent.
#[derive(Debug)]
pub(crate) struct BudgetMeter {
    budget: Budget,
    /// When the meter was made: the deadline is counted from it.
    base: Instant,
    /// The deadline, in nanoseconds after `base` (a streamed run's moves once, when its text
    /// is complete: [`BudgetMeter::restart`]).
    deadline: AtomicU64,
    /// The run's deadline, from its start, in nanoseconds.
    length: AtomicU64,
    spent: Mutex<Spent>,
}

/// Nanoseconds of `d`, saturated.
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl BudgetMeter {
    /// A meter for a run that started at `started` and must end within `deadline` (the run's
    /// one deadline).
    pub(crate) fn new(budget: Budget, started: Instant, deadline: Duration) -> BudgetMeter {
        BudgetMeter {
            base: started,
            deadline: AtomicU64::new(nanos(deadline)),
            length: AtomicU64::new(nanos(deadline)),
            budget,
            spent: Mutex::default(),
        }
    }

    /// Charges one call of the executor (or of a composite it called), or refuses it with
    /// `budget_exceeded`. A charged call is in flight until the returned guard drops.
    pub(crate) fn charge(&self, now: Instant) -> Result<InFlight<'_>, ToolError> {
        self.check_deadline(now)?;
        let mut spent = self.lock();
        self.check_calls(&spent, 1)?;
        if spent.in_flight >= self.budget.max_in_flight {
            return Err(exceeded(
                format!(
                    "at most {} calls may run at once",
                    self.budget.max_in_flight
                ),
                "max_in_flight",
                self.budget.max_in_flight,
            ));
        }
        spent.calls += 1;
        spent.in_flight += 1;
        Ok(InFlight(Some(self)))
    }

    /// A speculative call: only the deadline is checked. It is charged when it is claimed; its
    /// start was counted by [`BudgetMeter::reserve_speculative`] (a nested call of a
    /// speculative composite by its composite's).
    pub(crate) fn charge_speculative(&self, now: Instant) -> Result<InFlight<'_>, ToolError> {
        self.check_deadline(now)?;
        Ok(InFlight(None))
    }

    /// Counts one read the scout wants to start against the speculative cap; `false` when the
    /// cap is reached, or when the run's calls are spent. This is the only place the cap is
    /// enforced.
    pub(crate) fn reserve_speculative(&self) -> bool {
        let mut spent = self.lock();
        // Once the run's calls are spent no claim can be charged: a read started now could
        // only be wasted (a retry loop that ran into the budget would have the scout retry on).
        if spent.speculative >= self.budget.max_speculative_calls
            || spent.calls >= self.budget.max_calls
        {
            return false;
        }
        spent.speculative += 1;
        true
    }

    /// Whether `calls` more calls could run at once now, under `max_in_flight`.
    pub(crate) fn fits_in_flight(&self, calls: u64) -> bool {
        self.lock().in_flight + calls <= self.budget.max_in_flight
    }

    /// Whether `calls` more calls fit in the budget now.
    pub(crate) fn has_room(&self, calls: u64, now: Instant) -> Result<(), ToolError> {
        self.check_deadline(now)?;
        self.check_calls(&self.lock(), calls)
    }

    /// Charges the executor's claim of a speculative outcome: the `calls` a sequential run would
    /// have dispatched at this point (a composite and its nested calls), all or none.
    pub(crate) fn charge_claim(&self, calls: u64, now: Instant) -> Result<(), ToolError> {
        self.check_deadline(now)?;
        let mut spent = self.lock();
        self.check_calls(&spent, calls)?;
        spent.calls += calls;
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Spent> {
        lock(&self.spent)
    }

    /// Starts the deadline again, `length` from `now`: a streamed run's, when its text is
    /// complete (until then it was the streaming phase's bound).
    pub(crate) fn restart(&self, now: Instant, length: Duration) {
        let at = nanos(now.saturating_duration_since(self.base)).saturating_add(nanos(length));
        self.length.store(nanos(length), Ordering::Relaxed);
        self.deadline.store(at, Ordering::Release);
    }

    /// The deadline as an instant.
    fn deadline(&self) -> Instant {
        let after = Duration::from_nanos(self.deadline.load(Ordering::Acquire));
        Instant::from_std(crate::sync::deadline_after(self.base.into_std(), after))
    }

    fn check_deadline(&self, now: Instant) -> Result<(), ToolError> {
        if now >= self.deadline() {
            return Err(self.past_deadline());
        }
        Ok(())
    }

    fn check_calls(&self, spent: &Spent, calls: u64) -> Result<(), ToolError> {
        if spent.calls.saturating_add(calls) > self.budget.max_calls {
            return Err(exceeded(
                format!(
                    "the run may make at most {} tool calls",
                    self.budget.max_calls
                ),
                "max_calls",
                self.budget.max_calls,
            ));
        }
        Ok(())
    }

    /// Time left before the wall-clock budget is spent.
    pub(crate) fn remaining(&self, now: Instant) -> Duration {
        self.deadline().saturating_duration_since(now)
    }

    /// The error of work cut off by the run's deadline.
    pub(crate) fn past_deadline(&self) -> ToolError {
        deadline_passed(Duration::from_nanos(self.length.load(Ordering::Relaxed)))
    }

    fn release(&self) {
        let mut spent = self.lock();
        spent.in_flight = spent.in_flight.saturating_sub(1);
    }
}

/// A charged call in flight; dropping it frees its in-flight slot (speculative calls hold none).
#[derive(Debug)]
pub(crate) struct InFlight<'a>(Option<&'a BudgetMeter>);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if let Some(meter) = self.0 {
            meter.release();
        }
    }
}

/// A call refused by the budget of `key` (`max_calls`, `max_in_flight`), whose value is `value`.
fn exceeded(message: String, key: &'static str, value: u64) -> ToolError {
    let limit = LimitReached {
        key,
        value: value as f64,
    };
    ToolError::limit(ErrorKind::BudgetExceeded, message, limit)
}

/// The error of work cut off by a run's deadline of `length`: the same words whether the script,
/// a call, or the start of a call met it.
pub(crate) fn deadline_passed(length: Duration) -> ToolError {
    let limit = LimitReached {
        key: "timeout_s",
        value: length.as_secs_f64(),
    };
    let message = format!(
        "the run's deadline of {} s passed",
        crate::json::seconds(length)
    );
    ToolError::limit(ErrorKind::LimitExceeded, message, limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meter(budget: Budget) -> (BudgetMeter, Instant) {
        meter_until(budget, Duration::from_secs(60))
    }

    fn meter_until(budget: Budget, deadline: Duration) -> (BudgetMeter, Instant) {
        let now = Instant::now();
        (BudgetMeter::new(budget, now, deadline), now)
    }

    #[test]
    fn counts_calls() {
        let (m, now) = meter(Budget {
            max_calls: 2,
            ..Budget::default()
        });
        drop(m.charge(now).unwrap());
        drop(m.charge(now).unwrap());
        let e = m.charge(now).unwrap_err();
        assert_eq!(e.kind, ErrorKind::BudgetExceeded);
        assert_eq!(e.message, "the run may make at most 2 tool calls");
        assert_eq!(
            e.limit,
            Some(LimitReached {
                key: "max_calls",
                value: 2.0
            })
        );
        assert_eq!(
            e.to_string(),
            "budget_exceeded: the run may make at most 2 tool calls (Limits::max_calls)",
            "the library names the field of `Limits`, never a flag"
        );
    }

    #[test]
    fn counts_speculative_calls_apart() {
        let (m, now) = meter(Budget {
            max_speculative_calls: 1,
            ..Budget::default()
        });
        assert!(m.reserve_speculative());
        assert!(!m.reserve_speculative());
        assert!(
            m.charge_speculative(now).is_ok(),
            "only the start is capped"
        );
        assert!(m.charge(now).is_ok(), "the executor's calls are not");
    }

    #[test]
    fn nothing_speculative_starts_once_the_calls_are_spent() {
        let (m, now) = meter(Budget {
            max_calls: 1,
            ..Budget::default()
        });
        assert!(m.reserve_speculative());
        let _charged = m.charge(now).unwrap();
        assert!(
            !m.reserve_speculative(),
            "a read started now could never be claimed"
        );
    }

    #[test]
    fn in_flight_slots_free_on_drop() {
        let (m, now) = meter(Budget {
            max_in_flight: 1,
            ..Budget::default()
        });
        let first = m.charge(now).unwrap();
        assert!(m.charge(now).unwrap_err().message.contains("at once"));
        drop(first);
        assert!(m.charge(now).is_ok());
    }

    #[test]
    fn deadline_refuses_new_calls() {
        let (m, now) = meter_until(Budget::default(), Duration::from_secs(1));
        assert_eq!(m.remaining(now), Duration::from_secs(1));
        let late = now + Duration::from_secs(1);
        assert!(m
            .charge(late)
            .unwrap_err()
            .message
            .contains("deadline of 1 s passed"));
        assert_eq!(m.remaining(late), Duration::ZERO);
    }

    #[test]
    fn claims_are_charged_all_or_none() {
        let (m, now) = meter(Budget {
            max_calls: 3,
            ..Budget::default()
        });
        assert!(m.has_room(3, now).is_ok());
        assert!(m.charge_claim(4, now).is_err());
        m.charge_claim(2, now).unwrap();
        assert!(m.has_room(2, now).is_err());
        m.charge_claim(1, now).unwrap();
        assert!(m.charge(now).is_err(), "the claims were charged");
    }
}
