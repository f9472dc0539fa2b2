//! The retry policy of step 8: which failures are retried, how often, and how long to wait
//! between attempts. A value of its own, chosen per tool, so that the dispatch path only asks it.

use std::time::Duration;

use crate::error::ToolError;
use crate::tool::ToolSpec;

/// How a tool's failed attempts are retried: read and idempotent tools with `retries > 0`, on
/// `timeout` and `unavailable` only, with a doubling pause.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RetryPolicy {
    /// Attempts in all, the first included.
    max_attempts: u32,
    /// The pause before the second attempt.
    first_backoff: Duration,
    /// The longest pause.
    max_backoff: Duration,
}

impl RetryPolicy {
    /// The policy of a tool: none for effects that may not be retried.
    pub(crate) fn of(spec: &ToolSpec) -> RetryPolicy {
        let retries = if spec.effect.may_retry() {
            spec.retries
        } else {
            0
        };
        RetryPolicy {
            max_attempts: 1 + retries,
            first_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(2),
        }
    }

    /// Whether attempt `attempt` (from 1) is the last there can be, whatever its outcome.
    pub(crate) fn is_last(&self, attempt: u32) -> bool {
        attempt >= self.max_attempts
    }

    /// The pause before another attempt, after attempt `attempt` (from 1) failed with `error`;
    /// `None` when the failure is final.
    pub(crate) fn retry_after(&self, attempt: u32, error: &ToolError) -> Option<Duration> {
        if attempt >= self.max_attempts || !error.kind.is_retryable() {
            return None;
        }
        let doublings = attempt.saturating_sub(1).min(16);
        Some(
            self.first_backoff
                .saturating_mul(1 << doublings)
                .min(self.max_backoff),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use crate::tool::Effect;

    fn spec(effect: Effect, retries: u32) -> ToolSpec {
        let mut spec = ToolSpec::new("t", effect);
        spec.retries = retries;
        spec
    }

    #[test]
    fn retries_double_their_pause_up_to_a_cap() {
        let policy = RetryPolicy::of(&spec(Effect::Read, 10));
        let timeout = ToolError::new(ErrorKind::Timeout, "slow");
        let pauses: Vec<u64> = (1..=8)
            .map(|a| policy.retry_after(a, &timeout).unwrap().as_millis() as u64)
            .collect();
        assert_eq!(pauses, [50, 100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(policy.retry_after(11, &timeout), None, "attempts run out");
    }

    #[test]
    fn only_transient_failures_of_retryable_effects_are_retried() {
        let read = RetryPolicy::of(&spec(Effect::Read, 2));
        assert!(read
            .retry_after(1, &ToolError::new(ErrorKind::Unavailable, "x"))
            .is_some());
        for kind in [
            ErrorKind::NotFound,
            ErrorKind::Internal,
            ErrorKind::AmbiguousOutcome,
        ] {
            assert_eq!(read.retry_after(1, &ToolError::new(kind, "x")), None);
        }
        let write = RetryPolicy::of(&spec(Effect::Write, 2));
        assert_eq!(
            write.retry_after(1, &ToolError::new(ErrorKind::Timeout, "x")),
            None,
            "a write is never retried, whatever its spec says"
        );
        assert!(RetryPolicy::of(&spec(Effect::Idempotent, 1))
            .retry_after(1, &ToolError::new(ErrorKind::Timeout, "x"))
            .is_some());
    }
}
