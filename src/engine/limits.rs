//! The script's limits: one struct, applied to the engine and checked while it runs.

use std::time::Duration;

/// Limits on what a script may do. A script that reaches one fails with `limit_exceeded`; it never
/// hangs or crashes the process.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Limits {
    /// Interpreter operations (a loop iteration, an expression, a call are each one or more).
    pub max_operations: u64,
    /// Depth of nested script function calls.
    pub max_call_depth: usize,
    /// Depth of nested expressions at the top level (function bodies get half).
    pub max_expr_depth: usize,
    /// Bytes in one string.
    pub max_string_size: usize,
    /// Items in one array, nested arrays' items included.
    ///
    /// Rhai re-measures a growing value as a whole, so growing one to `n` items costs about
    /// `n²` work: keep this in the tens of thousands.
    pub max_array_size: usize,
    /// Entries in one object map, nested maps' entries included (measured like arrays).
    pub max_map_size: usize,
    /// Bytes of captured `print`/`debug` output; later lines are dropped and the cut is noted.
    pub max_log_bytes: usize,
    /// Wall-clock time for the whole script.
    pub max_duration: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_operations: 5_000_000,
            max_call_depth: 48,
            max_expr_depth: 64,
            max_string_size: 1 << 20,
            max_array_size: 20_000,
            max_map_size: 20_000,
            max_log_bytes: 1 << 20,
            max_duration: Duration::from_secs(60),
        }
    }
}
