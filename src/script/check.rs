//! Static checks of a compiled script, without running a tool: calls to functions that exist
//! nowhere, `tool("...")` with an unknown literal name, tool functions given more than their
//! one argument, constant arguments that break a tool's schema, and names from other languages
//! that no script declares (`console`, `None`, `undefined`). Each is reported with the kind,
//! message, position and next action the run reports when it reaches it: both take them from
//! `engine::diagnose` and the dispatch path's own checks.
//!
//! Three warnings point at scripts that run but most likely do not do what was meant: a last
//! statement that has no value (a `try`, a loop, a `let`, an `if` without `else`: the script's
//! value is then `()`), `${...}` in a string that is not a backtick string (it is printed as
//! written), and a read of a field that a tool's output schema does not declare, next to one it
//! does (`c.emial` where the schema has `email`: the read gives `()`).

use std::collections::HashSet;

use rhai::{Dynamic, Engine, Position, AST};
use serde::Serialize;

use crate::engine::{self, diagnose};
use crate::error::ErrorKind;
use crate::rhai_ast::{self, Call, Ending, Node};
use crate::tool::{RegisteredTool, Registry};

/// How sure `check` is that a problem is one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Severity {
    /// The run fails here when it gets here, with this error.
    Error,
    /// The script runs, but most likely not as meant.
    Warning,
}

/// A problem `check` found, at a place in the script.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Problem {
    /// Whether the run would fail here.
    pub severity: Severity,
    /// The error's kind, as the run reports it (`unknown_tool`, `invalid_input`, ...); for a
    /// warning, `script_error`.
    pub kind: String,
    /// 1-based line.
    pub line: Option<usize>,
    /// 1-based column.
    pub column: Option<usize>,
    /// What is wrong, for a person or a model.
    pub message: String,
    /// What to write instead.
    pub suggested_next_action: Option<String>,
}

/// Names from other languages that Rhai does not have: used but never declared, each is the
/// run's `Variable not found`.
const FOREIGN_NAMES: &[&str] = &[
    "undefined",
    "None",
    "NULL",
    "Null",
    "True",
    "False",
    "TRUE",
    "FALSE",
    "console",
    "JSON",
    "Object",
    "Math",
];

/// Names of every function a script can call: the engine's (tools included) and the script's own.
pub(crate) fn known_functions(engine: &Engine, ast: &AST) -> HashSet<String> {
    let mut known: HashSet<String> = engine
        .gen_fn_signatures(true)
        .iter()
        .filter_map(|sig| diagnose::signature_name(sig))
        .collect();
    known.insert("tool".to_string());
    known.extend(diagnose::KEYWORD_FUNCTIONS.iter().map(|f| f.to_string()));
    known.extend(ast.iter_functions().map(|f| f.name.to_string()));
    known
}

pub(crate) fn check(engine: &Engine, ast: &AST, registry: &Registry) -> Vec<Problem> {
    let tools: HashSet<&str> = registry.iter().map(|t| t.function_name()).collect();
    let mut known = known_functions(engine, ast);
    for f in ast.iter_functions() {
        known.extend(f.params.iter().map(|p| p.to_string()));
    }
    // A variable may hold a function pointer called like a function.
    rhai_ast::visit(ast, |node| {
        if let Node::Let(name) = node {
            known.insert(name.to_string());
        }
        true
    });

    let mut problems = Vec::new();
    let mut report = |position: Position, hint: diagnose::Hint| {
        let (line, column) = engine::line_column(position);
        problems.push(Problem {
            severity: Severity::Error,
            kind: hint.kind.as_str().to_string(),
            line,
            column,
            message: hint.message,
            suggested_next_action: hint.action,
        });
    };
    rhai_ast::visit(ast, |node| {
        let Node::Call(call) = node else {
            return true;
        };
        if call.is_operator() || call.is_qualified() {
            return true;
        }
        let (name, position, method) = (call.name(), call.position(), call.is_method());
        if !method && tools.contains(name) {
            if call.arity() > 1 {
                if let Some(tool) = registry.get(name) {
                    report(position, diagnose::positional_call(tool, call.arity()));
                }
            } else if let (Some(tool), Some(args)) = (registry.get(name), call.constant_arg(0)) {
                check_constant_args(tool, &args, position, &mut report);
            }
        } else if !method && name == "tool" {
            check_generic(&call, registry, position, &mut report);
            if let (Some(tool), Some(args)) = (call.text_arg(0), call.constant_arg(1)) {
                if let Some(tool) = registry.get(tool) {
                    check_constant_args(tool, &args, position, &mut report);
                }
            }
        } else if !known.contains(name) {
            report(position, diagnose::unknown_function(name, Some(registry)));
        }
        true
    });
    // Names from other languages, where the script declares no such variable.
    rhai_ast::visit(ast, |node| {
        if let Node::Variable(name, position) = node {
            if FOREIGN_NAMES.contains(&name) && !known.contains(name) {
                report(position, diagnose::variable_not_found(name));
            }
        }
        true
    });
    problems.sort_by_key(|p| (p.line, p.column));
    problems.extend(warnings(ast));
    let mut fields = missing_fields(ast, registry);
    fields.sort_by_key(|p| (p.line, p.column));
    problems.extend(fields);
    problems
}

/// Reads of a field that a tool's output schema does not declare, where the schema declares
/// the fields of that map and one of them is close to the name read (a likely slip; a field
/// the schema leaves open is read on purpose).
fn missing_fields(ast: &AST, registry: &Registry) -> Vec<Problem> {
    let mut out = Vec::new();
    for read in rhai_ast::fields::result_reads(ast) {
        let Some(tool) = registry.get(&read.origin.function) else {
            continue;
        };
        let Some(mut schema) = tool.spec.output_schema.as_ref() else {
            continue;
        };
        if read.origin.each {
            match schema.get("items") {
                Some(items) => schema = items,
                None => continue,
            }
        }
        let mut found = true;
        for field in &read.origin.path {
            match schema.get("properties").and_then(|p| p.get(field)) {
                Some(inner) => schema = inner,
                None => found = false,
            }
        }
        let properties = match schema.get("properties").and_then(|p| p.as_object()) {
            Some(properties) if found && schema.get("patternProperties").is_none() => properties,
            _ => continue,
        };
        let name = &read.site.name;
        if properties.contains_key(name) {
            continue;
        }
        let Some(near) = super::warnings::closest(name, properties.keys().map(String::as_str))
        else {
            continue;
        };
        let (line, column) = engine::line_column(read.site.position);
        let mut warning = super::warnings::missing_field(
            name,
            properties.keys().map(String::as_str),
            line,
            column,
        );
        let what = if read.origin.each {
            format!("an item of `{}`'s result", tool.spec.name)
        } else {
            format!("`{}`'s result", tool.spec.name)
        };
        warning.message = format!(
            "{what} has no field `{name}` (its output schema declares {}), so it reads as (); did you mean `{near}`?",
            warning.fields.iter().map(|f| format!("`{f}`")).collect::<Vec<_>>().join(", ")
        );
        out.push(Problem {
            severity: Severity::Warning,
            kind: ErrorKind::ScriptError.as_str().to_string(),
            line,
            column,
            message: warning.message,
            suggested_next_action: Some(format!(
                "read `{near}`, or write `?? default` after the read if `{name}` may be missing"
            )),
        });
    }
    out
}

/// The warnings: a last statement without a value, `${...}` outside a backtick string.
fn warnings(ast: &AST) -> Vec<Problem> {
    let mut out = Vec::new();
    let mut warn = |position: Position, message: String, action: String| {
        let (line, column) = engine::line_column(position);
        out.push(Problem {
            severity: Severity::Warning,
            kind: ErrorKind::ScriptError.as_str().to_string(),
            line,
            column,
            message,
            suggested_next_action: Some(action),
        });
    };
    if let Some((ending, position)) = rhai_ast::last_statement(ast) {
        let what = match ending {
            Ending::Try => "a `try` is a statement",
            Ending::For => "a `for` loop is a statement",
            Ending::While => "a `while` or `loop` is a statement",
            Ending::Do => "a `do` loop is a statement",
            Ending::Let(_) => "a `let` is a statement",
            Ending::Assignment => "an assignment is a statement",
            Ending::IfWithoutElse => "an `if` without `else` gives () when its condition is false",
        };
        let action = match &ending {
            Ending::Let(name) => format!("end the script with the value: write `{name}` as its last line"),
            Ending::Try => "declare the result before the `try` (`let result = ();`), assign it in both blocks, and end the script with `result`".to_string(),
            Ending::IfWithoutElse => "add an `else` branch with the value for the other case, or end the script with a variable".to_string(),
            _ => "collect what you need in a variable declared before it, and end the script with that variable".to_string(),
        };
        warn(
            position,
            format!("the script's last statement has no value, so the script returns (): {what}"),
            action,
        );
    }
    rhai_ast::visit(ast, |node| {
        if let Node::Text(text, position) = node {
            if has_interpolation(text) {
                warn(
                    position,
                    format!(
                        "\"{text}\" is not interpolated: `${{...}}` works only in backtick strings"
                    ),
                    format!("use backticks: `{text}`"),
                );
            }
        }
        true
    });
    out
}

/// Whether `text` holds `${name...}`, which only a backtick string interpolates.
fn has_interpolation(text: &str) -> bool {
    text.split("${")
        .skip(1)
        .any(|rest| rest.contains('}') && rest.starts_with(|c: char| c.is_alphabetic() || c == '_'))
}

/// Arguments written as a constant (a map literal of literals) are checked against the tool's input schema, as the
/// dispatch path will check them.
fn check_constant_args(
    tool: &RegisteredTool,
    value: &Dynamic,
    position: Position,
    report: &mut impl FnMut(Position, diagnose::Hint),
) {
    if let Ok(json) = engine::to_json(value) {
        if let Err(e) = crate::dispatch::check_input(tool, &json) {
            report(position, diagnose::Hint::from_tool(e));
        }
    }
}

/// `tool("name", ...)` with a literal name must name a tool.
fn check_generic(
    call: &Call<'_>,
    registry: &Registry,
    position: Position,
    report: &mut impl FnMut(Position, diagnose::Hint),
) {
    if let Some(name) = call.text_arg(0) {
        if registry.get(name).is_none() {
            report(
                position,
                diagnose::Hint::from_tool(registry.unknown_tool(name)),
            );
        }
    }
}
