//! Errors crossing the script boundary: a [`ToolError`] becomes a catchable Rhai error whose
//! value is an object map, and whatever ends a script becomes a [`RunError`].
//!
//! # One shape
//!
//! What a `catch (e)` block sees and what a run that ends in an error reports have the same
//! fields: `kind`, `message`, `line`, `column`, `tool` (`()` when no tool failed),
//! `recoverable` and `suggested_next_action`, and `limit` (`#{key, value}`) for an error of a
//! limit the run reached ([`error_map`], [`RunError::to_json`]). A tool's
//! error is built in that shape at the call site; Rhai's own errors (a property of `()`, an
//! index out of bounds) are put in it by the catch rewrite ([`super::catch`]); a thrown value
//! that is not a map becomes a `script_error` whose `message` is the value as text and whose
//! `value` is the value itself; a thrown map is the script's own and stays as thrown.

use rhai::{Dynamic, EvalAltResult, Map, ParseError, Position};
use serde_json::Value;

use super::diagnose::{Fault, Known};
use super::{to_dynamic, Limits, DEADLINE};
use crate::error::{ErrorKind, LimitReached, RunError, ToolError};

/// An error as a script sees it in `catch (e)`: `#{kind, message, line, column, tool,
/// recoverable, suggested_next_action}`, absent values as `()`.
pub(crate) fn error_map(e: &RunError) -> Map {
    let unit_or = |v: Option<Dynamic>| v.unwrap_or(Dynamic::UNIT);
    let int = |v: Option<usize>| unit_or(v.map(|n| Dynamic::from(n as i64)));
    let mut map = Map::new();
    map.insert("kind".into(), e.kind_name().into());
    map.insert("message".into(), e.full_message().into());
    map.insert("line".into(), int(e.line));
    map.insert("column".into(), int(e.column));
    map.insert("tool".into(), unit_or(e.tool.clone().map(Into::into)));
    map.insert("recoverable".into(), e.recoverable.into());
    map.insert(
        "suggested_next_action".into(),
        unit_or(e.suggested_next_action.clone().map(Into::into)),
    );
    if let Some(limit) = &e.limit {
        let mut reached = Map::new();
        reached.insert("key".into(), limit.key.into());
        reached.insert("value".into(), number(limit.value));
        map.insert("limit".into(), reached.into());
    }
    map
}

/// A limit's value for a script: an integer when it is whole (`max_calls`), else a float
/// (`timeout_s`).
fn number(value: f64) -> Dynamic {
    if value.fract() == 0.0 && value.abs() < 2f64.powi(53) {
        Dynamic::from(value as i64)
    } else {
        Dynamic::from(value)
    }
}

/// The limit a thrown map says its error reached: `limit: #{key, value}` with a key of
/// [`Limits::KEYS`] (the map a caught limit error is, thrown again).
fn limit_of(map: &Map) -> Option<LimitReached> {
    let reached = map.get("limit")?.read_lock::<Map>()?;
    let key = reached.get("key")?.clone().into_immutable_string().ok()?;
    let key = Limits::KEYS.iter().find(|k| k.name == key.as_str())?.name;
    let value = reached.get("value")?;
    let value = value
        .as_int()
        .map(|n| n as f64)
        .or_else(|_| value.as_float())
        .ok()?;
    Some(LimitReached { key, value })
}

/// The catchable error a failed call throws, at the call site, in the one shape.
pub(crate) fn to_rhai(e: ToolError, position: Position) -> Box<EvalAltResult> {
    let (line, column) = line_column(position);
    let map = error_map(&RunError::from_tool(e, line, column));
    Box::new(EvalAltResult::ErrorRuntime(map.into(), position))
}

/// A call's outcome as the script sees it: the value, or the catchable error thrown at the
/// call site.
pub(crate) fn outcome_to_rhai(
    outcome: &Result<Value, ToolError>,
    position: Position,
) -> Result<Dynamic, Box<EvalAltResult>> {
    match outcome {
        Ok(value) => Ok(to_dynamic(value)),
        Err(e) => Err(to_rhai(e.clone(), position)),
    }
}

/// What a thrown value says about an error.
pub(crate) enum Thrown {
    /// A map with `kind` and `message`, whose kind is well formed: a caught tool error thrown
    /// again, a script's own structured error, a script tool's error. `tool`, `recoverable` and
    /// `suggested_next_action` are kept when present.
    Structured(ToolError),
    /// A map with `kind` and `message` whose kind is not a lowercase identifier.
    #[cfg_attr(not(feature = "manifest"), allow(dead_code))]
    MalformedKind(String),
    /// Anything else.
    Plain,
}

/// The one rule for turning a thrown value into an error, for scripts and script tools alike.
pub(crate) fn thrown_error(value: &Dynamic) -> Thrown {
    let Some(map) = value.read_lock::<Map>() else {
        return Thrown::Plain;
    };
    let text = |key: &str| {
        map.get(key)
            .filter(|v| !v.is_unit())
            .map(|v| match v.clone().into_immutable_string() {
                Ok(s) => s.to_string(),
                Err(_) => v.to_string(),
            })
    };
    let (Some(kind), Some(message)) = (text("kind"), text("message")) else {
        return Thrown::Plain;
    };
    // A caught limit error thrown again keeps its limit as data, and its message as it was
    // before the library named the limit in it.
    let limit = limit_of(&map);
    let message = match &limit {
        Some(limit) => message
            .strip_suffix(limit.named_in_message().as_str())
            .map_or(message.clone(), str::to_string),
        None => message,
    };
    let Some(mut error) = ToolError::with_kind_name(&kind, message) else {
        return Thrown::MalformedKind(kind);
    };
    error.limit = limit;
    error.tool = text("tool");
    if let Some(recoverable) = map.get("recoverable").and_then(|v| v.as_bool().ok()) {
        error.recoverable = recoverable;
    }
    if let Some(action) = text("suggested_next_action") {
        error.suggested_next_action = Some(action);
    }
    Thrown::Structured(error)
}

/// A compile error: `invalid_script` with its line and column, and what to write instead when
/// the script's text shows a known mistake.
pub(crate) fn from_parse(source: &str, e: &ParseError, limits: &Limits) -> RunError {
    use rhai::ParseErrorType;
    let (message, key) = match e.err_type() {
        ParseErrorType::TooManyFunctions => (
            format!(
                "the script defines more than the {} functions it may",
                limits.max_functions
            ),
            "max_functions",
        ),
        ParseErrorType::ExprTooDeep => (
            format!(
                "an expression nests deeper than {} levels (function bodies: half)",
                limits.max_expr_depth.min(Limits::MAX_EXPR_DEPTH)
            ),
            "max_expr_depth",
        ),
        _ => return super::diagnose::parse_error(source, e),
    };
    let (line, column) = line_column(e.position());
    RunError {
        line,
        column,
        ..limit_exceeded(message, key, limits)
    }
}

/// A `limit_exceeded` error of the limit `key` (one of [`Limits::KEYS`]): `message` says what
/// the script may do; the key and its value go with it as data, for each front end to name.
pub(crate) fn limit_exceeded(message: String, key: &'static str, limits: &Limits) -> RunError {
    let value = limits.get(key).unwrap_or_default();
    limit_exceeded_at(message, LimitReached { key, value })
}

/// As [`limit_exceeded`], for a limit whose value in force is not the one set (the fallback
/// sizes of containers).
fn limit_exceeded_at(message: String, limit: LimitReached) -> RunError {
    RunError::from_tool(
        ToolError::limit(ErrorKind::LimitExceeded, message, limit),
        None,
        None,
    )
}

/// Whatever ended the script, as the run's error.
#[cfg_attr(not(feature = "manifest"), allow(dead_code))]
pub(crate) fn from_rhai(e: EvalAltResult, limits: &Limits) -> RunError {
    from_rhai_with(e, limits, None)
}

/// As [`from_rhai`], with what the diagnosis may know of the script's tools and functions.
pub(crate) fn from_rhai_with(
    e: EvalAltResult,
    limits: &Limits,
    known: Option<&Known<'_>>,
) -> RunError {
    let position = e.position();
    let (line, column) = line_column(position);
    let at = |error: RunError| RunError {
        line,
        column,
        ..error
    };
    let limit = |what: &str, value: String, key: &'static str| {
        at(limit_exceeded(format!("{what} {value}"), key, limits))
    };
    let limit_at = |what: &str, text: String, key: &'static str, value: usize| {
        let reached = LimitReached {
            key,
            value: value as f64,
        };
        at(limit_exceeded_at(format!("{what} {text}"), reached))
    };
    match e {
        // An error inside a script function: report where it happened, not the outer call.
        EvalAltResult::ErrorInFunctionCall(_, _, inner, _) => {
            let inner = from_rhai_with(*inner, limits, known);
            if inner.line.is_some() {
                inner
            } else {
                RunError {
                    line,
                    column,
                    ..inner
                }
            }
        }
        EvalAltResult::ErrorRuntime(value, _) => {
            let error = thrown(&value);
            if error.line.is_some() {
                error
            } else {
                at(error)
            }
        }
        EvalAltResult::ErrorTooManyOperations(_) => limit(
            "the script ran more than the",
            format!("{} operations it may run", limits.max_operations),
            "max_operations",
        ),
        EvalAltResult::ErrorTooManyVariables(_) => limit(
            "the script may hold at most",
            format!("{} variables in scope at once", limits.max_variables),
            "max_variables",
        ),
        EvalAltResult::ErrorStackOverflow(_) => limit(
            "function calls nested deeper than",
            format!(
                "{} levels",
                limits.max_call_depth.min(Limits::MAX_CALL_DEPTH)
            ),
            "max_call_depth",
        ),
        // A built-in that would allocate past the memory budget says so itself.
        EvalAltResult::ErrorDataTooLarge(what, _) if what.ends_with(super::memory::OVER_BUDGET) => {
            let message = what
                .trim_end_matches(super::memory::OVER_BUDGET)
                .to_string()
                + ")";
            at(limit_exceeded(message, "max_memory_mb", limits))
        }
        EvalAltResult::ErrorDataTooLarge(what, _) => {
            // The sizes the engine enforced: the set ones, or the fallback without a probe.
            let (strings, arrays, maps) = limits.container_sizes();
            let (what, text, key, value) = if what.contains("string") {
                (
                    "the script's strings may hold at most",
                    format!("{strings} bytes"),
                    "max_string_bytes",
                    strings,
                )
            } else if what.contains("array") || what.contains("BLOB") {
                (
                    "the script's arrays may hold at most",
                    format!("{arrays} items, nested ones included"),
                    "max_array_items",
                    arrays,
                )
            } else if what.contains("map") {
                (
                    "the script's object maps may hold at most",
                    format!("{maps} items, nested ones included"),
                    "max_map_items",
                    maps,
                )
            } else {
                return at(RunError::new(
                    ErrorKind::LimitExceeded,
                    format!("{what} exceeds its limit"),
                ));
            };
            limit_at(what, text, key, value)
        }
        EvalAltResult::ErrorTerminated(token, _) => {
            let token = token.clone().into_string().unwrap_or_default();
            if let Some(why) = token.strip_prefix(super::STOPPED) {
                let error = ToolError::internal(why).with_recoverable(false);
                return at(RunError::from_tool(error, None, None));
            }
            if token == super::MEMORY {
                // The budget is the process's: where other runs share it, say so.
                let runs = super::memory::runs();
                let shared = if runs > 1 {
                    format!(", shared by the {runs} runs going on in this process")
                } else {
                    String::new()
                };
                return limit(
                    "the process holds more than the run's memory budget of",
                    format!("{} MiB{shared}", limits.max_memory_mb),
                    "max_memory_mb",
                );
            }
            if token == DEADLINE {
                let e = crate::dispatch::deadline_passed(limits.timeout);
                at(RunError::from_tool(e, None, None))
            } else {
                at(RunError::new(
                    ErrorKind::LimitExceeded,
                    "the run was cancelled",
                ))
            }
        }
        EvalAltResult::ErrorParsing(kind, _) => {
            at(RunError::new(ErrorKind::InvalidScript, kind.to_string()))
        }
        mut other => match Fault::of(&other) {
            Some(fault) => {
                let functions = |name: &str| super::diagnose::engine_functions().contains(name);
                let fallback = Known {
                    registry: None,
                    functions: &functions,
                };
                fault.diagnose(known.unwrap_or(&fallback)).at(line, column)
            }
            None => {
                let _ = other.take_position();
                at(RunError::new(ErrorKind::ScriptError, other.to_string()))
            }
        },
    }
}

/// A thrown value that ends the script: a structured error keeps its fields (and its line and
/// column, when it has them: a caught error thrown again is reported where it first happened);
/// anything else is a `script_error`.
fn thrown(value: &Dynamic) -> RunError {
    match thrown_error(value) {
        Thrown::Structured(error) => {
            let (line, column) = value
                .read_lock::<Map>()
                .map(|map| {
                    let int = |key: &str| {
                        map.get(key)
                            .and_then(|v| v.as_int().ok())
                            .and_then(|n| usize::try_from(n).ok())
                    };
                    (int("line"), int("column"))
                })
                .unwrap_or_default();
            let mut error = RunError::from_tool(error, line, column);
            if error.suggested_next_action.is_none() {
                error.suggested_next_action = Some(UNCAUGHT.to_string());
            }
            error
        }
        Thrown::MalformedKind(_) | Thrown::Plain => {
            let mut error = RunError::new(
                ErrorKind::ScriptError,
                format!("uncaught exception: {value}"),
            );
            error.suggested_next_action = Some(UNCAUGHT.to_string());
            error
        }
    }
}

/// The next action of an error a script throws itself, or a function stops it with: the
/// same caught and uncaught.
pub(crate) const UNCAUGHT: &str = "catch it where the script can go on (`try { ... } catch (e) { ... }`), or check first the values that make it fail";

pub(crate) fn line_column(position: Position) -> (Option<usize>, Option<usize>) {
    (position.line(), position.position())
}
