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
    /// Wall-clock time for the whole run: the script, its calls and the scout (the run's one
    /// deadline is the smaller of this and [`Budget::wall_clock`](crate::Budget)).
    pub max_duration: Duration,
    /// Bytes of script source: compiling is done before any deadline can run, so its size is
    /// what bounds it.
    pub max_script_bytes: usize,
    /// Functions (`fn` and closures) one script may define: Rhai's parser takes time quadratic
    /// in their number.
    pub max_functions: usize,
    /// Variables in scope at any instant.
    pub max_variables: usize,
    /// Mebibytes the process may hold while the script runs, checked where the process counts
    /// its allocations (see [`set_memory_probe`](crate::set_memory_probe); the command line
    /// does): past it the run ends with `limit_exceeded`.
    pub max_memory_mb: u64,
    /// Tokens (o200k_base) the run's output may hand a model: its value, logs and error
    /// together, as canonical JSON. What does not fit becomes an artifact (see
    /// [`ResultPolicy`](crate::ResultPolicy)). At least 200.
    pub max_inline_tokens: usize,
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
            max_script_bytes: 256 << 10,
            max_functions: 1_000,
            max_variables: 5_000,
            max_memory_mb: 2_048,
            max_inline_tokens: 1_200,
        }
    }
}
