//! A run's limits and budgets: one struct, one name for each, whether it is set in the library, in
//! a manifest's `[limits]` table or by a command-line flag (`max_calls` is `--max-calls`).

use std::time::Duration;

use crate::error::Error;

/// What one run may do and spend. A script that reaches a limit fails with `limit_exceeded`, a
/// call past a budget with `budget_exceeded`; both name the limit and its value. Nothing hangs
/// or crashes the process.
///
/// Every field has a key (its name; `timeout` is `timeout_s`, in seconds) that
/// [`Limits::set`] takes, as a manifest's `[limits]` table and the command line's flags do.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Limits {
    /// Tool calls one run may make: the calls a sequential run would make (a speculative read
    /// counts when the executor claims it; a composite's nested calls count too).
    pub max_calls: u64,
    /// Reads the scout may start in one run, claimed or not.
    pub max_speculative_calls: u64,
    /// Calls of the executor (and the composites it calls) running at once.
    pub max_in_flight: u64,
    /// The run's one deadline, from its start (key `timeout_s`): it ends the script, the scout
    /// and every call alike.
    pub timeout: Duration,
    /// Interpreter operations (a loop iteration, an expression, a call are each one or more).
    pub max_operations: u64,
    /// Depth of nested script function calls.
    pub max_call_depth: usize,
    /// Depth of nested expressions at the top level (function bodies get half).
    pub max_expr_depth: usize,
    /// Bytes in one string; 0 for no limit but the memory budget.
    ///
    /// Any of `max_string_bytes`, `max_array_items` and `max_map_items` set makes Rhai
    /// re-measure a value, nested items included, every time it grows, so that building a value
    /// of `n` items costs about `n²` work. They are 0 by default, and `max_memory_mb` bounds
    /// what a script holds; without a memory probe (see [`set_memory_probe`]), where that
    /// budget cannot be checked, the engine applies [`Limits::FALLBACK_SIZES`] instead.
    ///
    /// [`set_memory_probe`]: crate::set_memory_probe
    pub max_string_bytes: usize,
    /// Items in one array, nested arrays' items included; 0 for no limit but the memory budget.
    pub max_array_items: usize,
    /// Entries in one object map, nested maps' entries included; 0 for no limit but the memory
    /// budget.
    pub max_map_items: usize,
    /// Bytes of captured `print`/`debug` output; later lines are dropped and the cut is noted.
    pub max_log_bytes: usize,
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
    /// How long a plan may wait to be applied (key `plan_ttl_s`): apply refuses it afterwards
    /// (see docs/plans.md).
    pub plan_ttl: Duration,
    /// How long a streamed script may take to arrive, from its first byte to its last (key
    /// `stream_timeout_s`; see docs/streaming.md). The run's own deadline (`timeout_s`) starts
    /// when the text is complete.
    pub stream_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_calls: 10_000,
            max_speculative_calls: 10_000,
            max_in_flight: 64,
            timeout: Duration::from_secs(60),
            max_operations: 20_000_000,
            max_call_depth: 48,
            max_expr_depth: 64,
            max_string_bytes: 0,
            max_array_items: 0,
            max_map_items: 0,
            max_log_bytes: 1 << 20,
            max_script_bytes: 256 << 10,
            max_functions: 1_000,
            max_variables: 5_000,
            max_memory_mb: 2_048,
            max_inline_tokens: 1_200,
            plan_ttl: Duration::from_secs(3_600),
            stream_timeout: Duration::from_secs(120),
        }
    }
}

/// A field of [`Limits`], by the kind of number it holds.
enum Slot<'a> {
    Count(&'a mut u64),
    Size(&'a mut usize),
    Seconds(&'a mut Duration),
}

/// One settable limit: its key, what it bounds, and its value's range.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct LimitKey {
    /// The key: a field of [`Limits`], in a `[limits]` table and (with dashes) a flag.
    pub name: &'static str,
    /// What it bounds, in a few words.
    pub what: &'static str,
    /// The smallest value it takes.
    pub min: f64,
    /// The largest value it takes: what the process can honour without crashing.
    pub max: f64,
    /// Why the maximum is what it is, in a few words.
    pub max_reason: &'static str,
}

/// The largest whole number an `f64` holds exactly: the maximum of a count with no other bound.
const WHOLE: f64 = 9_007_199_254_740_992.0;
const WHOLE_REASON: &str = "the largest whole number a limit's value (an f64) holds exactly";

const fn key(name: &'static str, what: &'static str, min: f64) -> LimitKey {
    LimitKey {
        name,
        what,
        min,
        max: WHOLE,
        max_reason: WHOLE_REASON,
    }
}

const fn capped(
    name: &'static str,
    what: &'static str,
    min: f64,
    max: f64,
    max_reason: &'static str,
) -> LimitKey {
    LimitKey {
        name,
        what,
        min,
        max,
        max_reason,
    }
}

impl Limits {
    /// The per-container sizes applied when no memory probe is installed (strings, array items,
    /// map entries), so that a script cannot exhaust memory where its budget cannot be checked.
    pub const FALLBACK_SIZES: (usize, usize, usize) = (16 << 20, 1_000_000, 1_000_000);

    /// The largest `max_call_depth`: the deepest recursion that still runs on a script thread's
    /// 64 MiB stack with room to spare, whatever the functions' bodies. Measured in a debug
    /// build (whose frames are the largest), with bodies nested as deep as `MAX_EXPR_DEPTH`
    /// lets them (half of it): 512 levels run, 1,024 overflow the stack (docs/limits.md).
    pub const MAX_CALL_DEPTH: usize = 256;

    /// The largest `max_expr_depth`: compiling nests the parser as deep as the expression, on
    /// whatever thread compiles, so it must survive a 2 MiB stack (an async worker's, the
    /// smallest a script is compiled on). Measured in a debug build: nesting of 1,200 levels
    /// compiles on 2 MiB, 2,400 overflows it (docs/limits.md).
    pub const MAX_EXPR_DEPTH: usize = 512;

    /// The largest `timeout_s`, in seconds: a year, longer than any run; a far longer deadline
    /// is no deadline at all.
    pub const MAX_TIMEOUT_S: f64 = 365.0 * 86_400.0;

    /// Every key [`Limits::set`] takes, in the order `--help` and the README list them.
    pub const KEYS: &'static [LimitKey] = &[
        key("max_calls", "tool calls a run may make", 0.0),
        key(
            "max_speculative_calls",
            "reads the scout may start early",
            0.0,
        ),
        key("max_in_flight", "calls running at once", 1.0),
        capped(
            "timeout_s",
            "seconds a run may take, all told",
            0.001,
            Limits::MAX_TIMEOUT_S,
            "a year: longer than any run",
        ),
        key("max_operations", "interpreter operations", 1.0),
        capped(
            "max_call_depth",
            "depth of nested function calls",
            1.0,
            Limits::MAX_CALL_DEPTH as f64,
            "deeper recursion could overflow a script thread's stack",
        ),
        capped(
            "max_expr_depth",
            "depth of nested expressions",
            8.0,
            Limits::MAX_EXPR_DEPTH as f64,
            "deeper nesting could overflow the stack of the thread compiling it",
        ),
        key(
            "max_string_bytes",
            "bytes in one string (0: bounded by memory)",
            0.0,
        ),
        key(
            "max_array_items",
            "items in one array, nested (0: bounded by memory)",
            0.0,
        ),
        key(
            "max_map_items",
            "entries in one map, nested (0: bounded by memory)",
            0.0,
        ),
        key("max_log_bytes", "bytes of print/debug output kept", 0.0),
        key("max_script_bytes", "bytes of script source", 1.0),
        key("max_functions", "functions a script may define", 0.0),
        key("max_variables", "variables in scope at once", 1.0),
        key("max_memory_mb", "MiB the process may hold", 1.0),
        key(
            "max_inline_tokens",
            "tokens of output handed back inline",
            crate::policy::MIN_INLINE_TOKENS as f64,
        ),
        capped(
            "plan_ttl_s",
            "seconds a plan may wait to be applied",
            0.001,
            Limits::MAX_TIMEOUT_S,
            "a year: a plan that old shows a world long gone",
        ),
        capped(
            "stream_timeout_s",
            "seconds a streamed script may take to arrive",
            0.001,
            Limits::MAX_TIMEOUT_S,
            "a year: the longest deadline a run has",
        ),
    ];

    /// Sets the limit called `name` (a key of [`Limits::KEYS`]) to `value`: a whole number,
    /// but for `timeout_s`, which takes fractions of a second.
    ///
    /// # Errors
    ///
    /// [`Error::Limit`] for an unknown key (naming the keys), or a value that is negative, not
    /// a number, not whole where it must be, below the key's minimum or above its maximum
    /// (naming the key, the value and the maximum).
    pub fn set(&mut self, name: &str, value: f64) -> Result<(), Error> {
        let Some(key) = Self::KEYS.iter().find(|k| k.name == name) else {
            let known: Vec<&str> = Self::KEYS.iter().map(|k| k.name).collect();
            return Err(Error::Limit(format!(
                "unknown limit `{name}`: the limits are {}",
                known.join(", ")
            )));
        };
        if !value.is_finite() || value < key.min {
            return Err(Error::Limit(format!(
                "`{name}` must be at least {}, not {value}",
                key.min
            )));
        }
        if value > key.max {
            return Err(Error::Limit(format!(
                "`{name}` must be at most {}, not {value}: {}",
                key.max, key.max_reason
            )));
        }
        if !matches!(name, "timeout_s" | "plan_ttl_s" | "stream_timeout_s") && value.fract() != 0.0
        {
            return Err(Error::Limit(format!(
                "`{name}` takes a whole number, not {value}"
            )));
        }
        match self.slot(name) {
            Slot::Count(count) => *count = value as u64,
            Slot::Size(size) => *size = usize::try_from(value as u64).unwrap_or(usize::MAX),
            Slot::Seconds(timeout) => {
                *timeout = Duration::try_from_secs_f64(value)
                    .map_err(|_| Error::Limit(format!("`{name}` of {value} is too long")))?;
            }
        }
        Ok(())
    }

    /// The value of the limit called `name`, as [`Limits::set`] takes it.
    pub fn get(&self, name: &str) -> Option<f64> {
        Self::KEYS.iter().find(|k| k.name == name)?;
        // `slot` takes `&mut self`; a copy answers for `&self`.
        Some(match self.clone().slot(name) {
            Slot::Count(count) => *count as f64,
            Slot::Size(size) => *size as f64,
            Slot::Seconds(timeout) => timeout.as_secs_f64(),
        })
    }

    /// The field of a key of [`Limits::KEYS`].
    fn slot(&mut self, name: &str) -> Slot<'_> {
        match name {
            "max_calls" => Slot::Count(&mut self.max_calls),
            "max_speculative_calls" => Slot::Count(&mut self.max_speculative_calls),
            "max_in_flight" => Slot::Count(&mut self.max_in_flight),
            "timeout_s" => Slot::Seconds(&mut self.timeout),
            "max_operations" => Slot::Count(&mut self.max_operations),
            "max_call_depth" => Slot::Size(&mut self.max_call_depth),
            "max_expr_depth" => Slot::Size(&mut self.max_expr_depth),
            "max_string_bytes" => Slot::Size(&mut self.max_string_bytes),
            "max_array_items" => Slot::Size(&mut self.max_array_items),
            "max_map_items" => Slot::Size(&mut self.max_map_items),
            "max_log_bytes" => Slot::Size(&mut self.max_log_bytes),
            "max_script_bytes" => Slot::Size(&mut self.max_script_bytes),
            "max_functions" => Slot::Size(&mut self.max_functions),
            "max_variables" => Slot::Size(&mut self.max_variables),
            "max_memory_mb" => Slot::Count(&mut self.max_memory_mb),
            "max_inline_tokens" => Slot::Size(&mut self.max_inline_tokens),
            "plan_ttl_s" => Slot::Seconds(&mut self.plan_ttl),
            "stream_timeout_s" => Slot::Seconds(&mut self.stream_timeout),
            _ => unreachable!("every key of KEYS has a field"),
        }
    }

    /// The sizes the engine enforces for strings, arrays and maps (0: none): the set ones, or
    /// [`Limits::FALLBACK_SIZES`] where none is set and no memory probe is installed.
    pub(crate) fn container_sizes(&self) -> (usize, usize, usize) {
        let set = (
            self.max_string_bytes,
            self.max_array_items,
            self.max_map_items,
        );
        if set == (0, 0, 0) && super::memory::allocated().is_none() {
            return Self::FALLBACK_SIZES;
        }
        set
    }
}

#[cfg(test)]
mod tests {
    use super::Limits;

    #[test]
    fn every_key_round_trips_and_bad_values_are_refused() {
        for key in Limits::KEYS {
            let mut limits = Limits::default();
            let value = key.min.max(1.0) + 7.0;
            limits.set(key.name, value).expect(key.name);
            assert_eq!(limits.get(key.name), Some(value), "{}", key.name);
            assert!(limits.set(key.name, -1.0).is_err(), "{}", key.name);
            assert!(limits.set(key.name, f64::NAN).is_err(), "{}", key.name);
        }
        let mut limits = Limits::default();
        assert!(limits.set("max_calls", 1.5).is_err());
        limits.set("timeout_s", 1.5).unwrap();
        assert_eq!(limits.timeout.as_millis(), 1500);
        let e = limits.set("max_tool_calls", 5.0).unwrap_err().to_string();
        assert!(
            e.contains("unknown limit `max_tool_calls`") && e.contains("max_calls"),
            "{e}"
        );
    }

    #[test]
    fn every_key_takes_its_maximum_and_refuses_past_it_naming_key_value_and_maximum() {
        for key in Limits::KEYS {
            assert!(key.max >= key.min.max(1.0), "{}", key.name);
            let mut limits = Limits::default();
            limits.set(key.name, key.max).expect(key.name);
            assert_eq!(limits.get(key.name), Some(key.max), "{}", key.name);
            let past = if key.max < 2f64.powi(53) {
                key.max + 1.0
            } else {
                2f64.powi(54)
            };
            let e = limits.set(key.name, past).unwrap_err().to_string();
            assert!(
                e.contains(key.name)
                    && e.contains(&format!("{past}"))
                    && e.contains(&format!("{}", key.max)),
                "{e}"
            );
            assert_eq!(
                limits.get(key.name),
                Some(key.max),
                "a refused value changes nothing"
            );
            for bad in [
                f64::INFINITY,
                f64::NEG_INFINITY,
                f64::NAN,
                1e19,
                f64::MAX,
                -0.5,
            ] {
                assert!(limits.set(key.name, bad).is_err(), "{} = {bad}", key.name);
            }
        }
    }

    #[test]
    fn the_stack_bound_maximums_are_the_documented_ones() {
        let max = |name: &str| Limits::KEYS.iter().find(|k| k.name == name).unwrap().max;
        assert_eq!(max("max_call_depth"), Limits::MAX_CALL_DEPTH as f64);
        assert_eq!(max("max_expr_depth"), Limits::MAX_EXPR_DEPTH as f64);
        assert_eq!(max("timeout_s"), Limits::MAX_TIMEOUT_S);
        let mut limits = Limits::default();
        let e = limits
            .set("max_call_depth", 8_000.0)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`max_call_depth` must be at most 256, not 8000"),
            "{e}"
        );
        let e = limits.set("timeout_s", 1e19).unwrap_err().to_string();
        assert!(e.contains("`timeout_s` must be at most 31536000"), "{e}");
        // 2^53 + 1 is 2^53 as an f64: a count takes it.
        limits
            .set("max_operations", 9_007_199_254_740_993.0)
            .unwrap();
        assert_eq!(limits.max_operations, 1 << 53);
    }
}
