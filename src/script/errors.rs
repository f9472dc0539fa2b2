//! Errors crossing the script boundary: a [`ToolError`] becomes a catchable Rhai error whose
//! value is an object map, and whatever ends a script becomes a [`RunError`].

use rhai::{Dynamic, EvalAltResult, Map, ParseError, Position};

use super::engine::DEADLINE;
use super::Limits;
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

/// The catchable error of a failed call, where no call site is at hand.
pub(crate) fn tool_error_to_rhai(e: ToolError) -> Box<EvalAltResult> {
    to_rhai(e, Position::NONE)
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
            let message = if token.clone().into_string().ok().as_deref() == Some(DEADLINE) {
                format!(
                    "the script ran longer than its {:?} deadline",
                    limits.max_duration
                )
            } else {
                "the run was cancelled".to_string()
            };
            at(RunError::new(ErrorKind::LimitExceeded, message))
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

/// A thrown value: a map with a string `kind` and `message` keeps its fields (a caught tool
/// error thrown again, or the script's own structured error); anything else is a `script_error`.
fn thrown(value: Dynamic) -> RunError {
    if let Some(map) = value.read_lock::<Map>() {
        let text = |key: &str| {
            map.get(key)
                .and_then(|v| v.clone().into_immutable_string().ok())
                .map(|s| s.to_string())
        };
        if let (Some(kind), Some(message)) = (text("kind"), text("message")) {
            if let Some(kind) = ErrorKind::parse(&kind) {
                let mut error = ToolError::new(kind, message);
                error.tool = text("tool");
                if let Some(recoverable) = map.get("recoverable").and_then(|v| v.as_bool().ok()) {
                    error.recoverable = recoverable;
                }
                if let Some(action) = text("suggested_next_action") {
                    error.suggested_next_action = Some(action);
                }
                return RunError::from_tool(error, None, None);
            }
        }
    }
    RunError::new(
        ErrorKind::ScriptError,
        format!("uncaught exception: {value}"),
    )
}

pub(crate) fn line_column(position: Position) -> (Option<usize>, Option<usize>) {
    (position.line(), position.position())
}
