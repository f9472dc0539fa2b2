//! One shape for every caught error: the rewrite of `catch` blocks and `throw` statements that
//! makes what `catch (e)` sees the map a tool error is, whatever was thrown.
//!
//! Rhai builds the value of a catch variable itself: the thrown value for a `throw` (and for a
//! tool's error, which is thrown as a map), and for its own errors a map of its own
//! (`#{error: "ErrorDotExpr", message, line, position, ...}`). No hook sees that value before
//! the block does, so [`rewrite`] changes the script instead:
//!
//! | site | becomes |
//! |---|---|
//! | `catch (e) { body }` | `catch (e) { e = __ts_caught(e); body }` |
//! | `throw x` | `throw __ts_thrown(x)` |
//!
//! `__ts_thrown` keeps a map as thrown (the script's own structured error) and turns any other
//! value into `#{kind: "script_error", message: <the value as text>, value: <the value>, line,
//! column, ...}` at the `throw`. `__ts_caught` keeps a map with a `kind` and puts Rhai's own
//! error maps into the one shape, diagnosed as an uncaught error would be
//! ([`super::diagnose`]).
//!
//! # What is not rewritten
//!
//! The bodies of script functions and closures: Rhai 1.27 does not export the type of a
//! function's body, so a changed function cannot be built (see `speculate/rewrite.rs`). A
//! `catch` inside a function still gets the one shape for tool errors; for Rhai's own errors
//! and thrown strings it gets Rhai's value. A `throw "text"` inside a function caught outside
//! it gets the one shape without a line.

use std::sync::OnceLock;

use rhai::{Dynamic, Engine, Map, Module, NativeCallContext, Position, Shared, AST};

use super::diagnose::{Fault, Known};
use super::errors::error_map;
use crate::error::{ErrorKind, RunError};
use crate::rhai_ast::catches::CatchRewrite;
use crate::tool::Registry;

/// The function a rewritten `catch` block calls on its variable first.
pub(crate) const CAUGHT: &str = "__ts_caught";
/// The function a rewritten `throw` calls on the thrown value.
pub(crate) const THROWN: &str = "__ts_thrown";

/// Returns `ast` with every `catch` block of its main body normalising its variable and every
/// `throw` wrapped (see the module documentation). Functions, the source and the
/// documentation are kept. No variable is added: the assignment is to the catch variable.
pub(crate) fn rewrite(ast: AST) -> AST {
    static REWRITE: OnceLock<CatchRewrite> = OnceLock::new();
    REWRITE
        .get_or_init(|| CatchRewrite::new(CAUGHT, THROWN))
        .apply(ast)
}

/// The value a rewritten `throw` throws: a map as it is, anything else in the one shape.
fn thrown(position: Position, value: Dynamic) -> Dynamic {
    if value.is_map() {
        return value;
    }
    let (line, column) = super::line_column(position);
    plain(value, line, column).into()
}

/// A thrown value that is not a map, in the one shape: its text is the message, and `value`
/// keeps it.
fn plain(value: Dynamic, line: Option<usize>, column: Option<usize>) -> Map {
    let message = match value.clone().into_immutable_string() {
        Ok(s) => s.to_string(),
        Err(_) => value.to_string(),
    };
    let mut error = RunError::new(ErrorKind::ScriptError, message);
    error.line = line;
    error.column = column;
    error.suggested_next_action = Some(super::errors::UNCAUGHT.to_string());
    let mut map = error_map(&error);
    map.insert("value".into(), value);
    map
}

/// The value a rewritten `catch` block works with (see the module documentation).
fn caught(ctx: &NativeCallContext, registry: Option<&Registry>, value: Dynamic) -> Dynamic {
    let Some(map) = value.read_lock::<Map>().map(|m| m.clone()) else {
        return plain(value, None, None).into();
    };
    if map.contains_key("kind") {
        return value;
    }
    let Some(fault) = Fault::of_caught(&map) else {
        return value;
    };
    let int = |key: &str| {
        map.get(key)
            .and_then(|v| v.as_int().ok())
            .and_then(|n| usize::try_from(n).ok())
            .filter(|n| *n > 0)
    };
    let functions = |name: &str| {
        super::diagnose::engine_functions().contains(name)
            || registry.is_some_and(|r| r.iter().any(|t| t.function_name() == name))
            || ctx
                .iter_namespaces()
                .any(|m| (0..=16).any(|n| m.get_script_fn(name, n).is_some()))
    };
    let known = Known {
        registry,
        functions: &functions,
    };
    // An error inside a function: where it happened is in Rhai's text.
    let inner = map
        .get("message")
        .and_then(|m| m.clone().into_immutable_string().ok())
        .filter(|_| !matches!(fault, Fault::Other(_)))
        .and_then(|m| Fault::position_in_text(&m));
    let (line, column) = match inner {
        Some((line, column)) => (Some(line), Some(column)),
        None => (int("line"), int("position")),
    };
    let error = fault.diagnose(&known).at(line, column);
    error_map(&error).into()
}

/// [`CAUGHT`] and [`THROWN`], as a module every engine shares (so that `check` knows them),
/// built once: a diagnosis of [`CAUGHT`] there names no tool. An engine that calls tools
/// registers [`CAUGHT`] again with its registry ([`register`]), on itself, where it comes
/// before the module's.
pub(crate) fn module() -> Shared<Module> {
    static MODULE: OnceLock<Shared<Module>> = OnceLock::new();
    MODULE
        .get_or_init(|| {
            let mut module = Module::new();
            super::set(
                &mut module,
                THROWN,
                |ctx: NativeCallContext, value: Dynamic| thrown(ctx.call_position(), value),
            );
            super::set(
                &mut module,
                CAUGHT,
                |ctx: NativeCallContext, value: Dynamic| caught(&ctx, None, value),
            );
            module.into()
        })
        .clone()
}

/// Registers [`CAUGHT`] on an engine that calls `registry`'s tools: a diagnosis names them.
pub(crate) fn register(engine: &mut Engine, registry: Registry) {
    engine.register_fn(CAUGHT, move |ctx: NativeCallContext, value: Dynamic| {
        caught(&ctx, Some(&registry), value)
    });
}
