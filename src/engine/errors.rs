//! Errors crossing the script boundary: a [`ToolError`] becomes a catchable Rhai error whose
//! value is an object map, and whatever ends a script becomes a [`RunError`].

use rhai::{Dynamic, EvalAltResult, Map, ParseError, Position};
use serde_json::Value;

use super::{to_dynamic, Limits, DEADLINE};
use crate::error::{ErrorKind, RunError, ToolError};

/// The catchable error a failed call throws: `#{kind, message, tool, recoverable,
/// suggested_next_action}`, at the call site.
pub(crate) fn to_rhai(e: ToolError, position: Position) -> Box<EvalAltResult> {
    let mut map = Map::new();
    map.insert("kind".into(), e.kind.as_str().into());
    map.insert("message".into(), e.message.into());
    map.insert("tool".into(), e.tool.map_or(Dynamic::UNIT, Into::into));
    map.insert("recoverable".into(), e.recoverable.into());
    map.insert(
        "suggested_next_action".into(),
        e.suggested_next_action.map_or(Dynamic::UNIT, Into::into),
    );
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
    let Some(kind) = ErrorKind::parse(&kind) else {
        return Thrown::MalformedKind(kind);
    };
    let mut error = ToolError::new(kind, message);
    error.tool = text("tool");
    if let Some(recoverable) = map.get("recoverable").and_then(|v| v.as_bool().ok()) {
        error.recoverable = recoverable;
    }
    if let Some(action) = text("suggested_next_action") {
        error.suggested_next_action = Some(action);
    }
    Thrown::Structured(error)
}

/// A compile error: `invalid_script` with its line and column.
pub(crate) fn from_parse(e: &ParseError) -> RunError {
    let (line, column) = line_column(e.position());
    RunError {
        line,
        column,
        ..RunError::new(ErrorKind::InvalidScript, e.err_type().to_string())
    }
}

/// Whatever ended the script, as the run's error.
pub(crate) fn from_rhai(e: EvalAltResult, limits: &Limits) -> RunError {
    let position = e.position();
    let (line, column) = line_column(position);
    let at = |error: RunError| RunError {
        line,
        column,
        ..error
    };
    match e {
        // An error inside a script function: report where it happened, not the outer call.
        EvalAltResult::ErrorInFunctionCall(_, _, inner, _) => {
            let inner = from_rhai(*inner, limits);
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
        EvalAltResult::ErrorRuntime(value, _) => at(thrown(value)),
        EvalAltResult::ErrorTooManyOperations(_) => at(RunError::new(
            ErrorKind::LimitExceeded,
            format!(
                "the script ran more than {} operations",
                limits.max_operations
            ),
        )),
        EvalAltResult::ErrorStackOverflow(_) => at(RunError::new(
            ErrorKind::LimitExceeded,
            format!(
                "function calls nested deeper than {} levels",
                limits.max_call_depth
            ),
        )),
        EvalAltResult::ErrorDataTooLarge(what, _) => at(RunError::new(
            ErrorKind::LimitExceeded,
            format!("{what} exceeds its limit"),
        )),
        EvalAltResult::ErrorTerminated(token, _) => {
            let token = token.clone().into_string().unwrap_or_default();
            if let Some(why) = token.strip_prefix(super::STOPPED) {
                let error = ToolError::internal(why).with_recoverable(false);
                return at(RunError::from_tool(error, None, None));
            }
            if token == super::MEMORY {
                let message = format!(
                    "the process holds more than the run's memory budget of {} MiB",
                    limits.max_memory_mb
                );
                return at(RunError::new(ErrorKind::LimitExceeded, message));
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
        mut other => {
            let _ = other.take_position();
            at(RunError::new(ErrorKind::ScriptError, other.to_string()))
        }
    }
}

/// A thrown value that ends the script: a structured error keeps its fields; anything else is a
/// `script_error`.
fn thrown(value: Dynamic) -> RunError {
    match thrown_error(&value) {
        Thrown::Structured(error) => RunError::from_tool(error, None, None),
        Thrown::MalformedKind(_) | Thrown::Plain => RunError::new(
            ErrorKind::ScriptError,
            format!("uncaught exception: {value}"),
        ),
    }
}

pub(crate) fn line_column(position: Position) -> (Option<usize>, Option<usize>) {
    (position.line(), position.position())
}
