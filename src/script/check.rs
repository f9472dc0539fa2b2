//! Static checks of a compiled script, without running a tool: calls to functions that exist
//! nowhere, `tool("...")` with an unknown literal name, and tool functions given more than their
//! one argument.

use std::collections::HashSet;

use rhai::{ASTNode, Engine, Expr, FnCallExpr, Position, Stmt, AST};
use serde::Serialize;

use crate::engine;
use crate::tool::{RegisteredTool, Registry};

/// A problem `check` found, at a place in the script.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub struct Problem {
    /// 1-based line.
    pub line: Option<usize>,
    /// 1-based column.
    pub column: Option<usize>,
    /// What is wrong, for a person or a model.
    pub message: String,
}

/// Names of every function a script can call: the engine's (tools included) and the script's own.
pub(crate) fn known_functions(engine: &Engine, ast: &AST) -> HashSet<String> {
    let mut known: HashSet<String> = engine
        .gen_fn_signatures(true)
        .iter()
        .filter_map(|sig| signature_name(sig))
        .collect();
    known.insert("tool".to_string());
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
    ast.walk(&mut |path: &[ASTNode]| {
        if let Some(ASTNode::Stmt(Stmt::Var(var, _, _))) = path.last() {
            known.insert(var.0.name.to_string());
        }
        true
    });

    let mut problems = Vec::new();
    let mut report = |position: Position, message: String| {
        let (line, column) = engine::line_column(position);
        problems.push(Problem {
            line,
            column,
            message,
        });
    };
    ast.walk(&mut |path: &[ASTNode]| {
        let (call, position, method) = match path.last() {
            Some(ASTNode::Expr(Expr::FnCall(call, pos))) => (call, *pos, false),
            Some(ASTNode::Stmt(Stmt::FnCall(call, pos))) => (call, *pos, false),
            Some(ASTNode::Expr(Expr::MethodCall(call, pos))) => (call, *pos, true),
            _ => return true,
        };
        if call.is_operator_call() || !call.namespace.is_empty() {
            return true;
        }
        let name = call.name.as_str();
        if !method && tools.contains(name) {
            if call.args.len() > 1 {
                report(
                    position,
                    format!("`{name}` takes one object map, as in {name}(#{{...}}); it is given {} arguments", call.args.len()),
                );
            } else if let (Some(tool), Some(args)) = (registry.get(name), call.args.first()) {
                check_constant_args(tool, args, position, &mut report);
            }
        } else if !method && name == "tool" {
            check_generic(call, registry, position, &mut report);
            if let (Some(Expr::StringConstant(tool, _)), Some(args)) = (call.args.first(), call.args.get(1)) {
                if let Some(tool) = registry.get(tool) {
                    check_constant_args(tool, args, position, &mut report);
                }
            }
        } else if !known.contains(name) {
            let what = if method { "method" } else { "function" };
            report(position, registry.unknown(name, what).message);
        }
        true
    });
    problems
}

/// Arguments written as a constant map are checked against the tool's input schema, as the
/// dispatch path will check them.
fn check_constant_args(
    tool: &RegisteredTool,
    args: &Expr,
    position: Position,
    report: &mut impl FnMut(Position, String),
) {
    let Some(value) = constant_value(args) else {
        return;
    };
    if let Ok(json) = engine::to_json(&value) {
        if let Err(e) = crate::dispatch::check_input(tool, &json) {
            report(position, e.message);
        }
    }
}

/// The value of an expression made only of constants (a map literal of literals, say).
fn constant_value(expr: &Expr) -> Option<rhai::Dynamic> {
    match expr {
        Expr::DynamicConstant(value, _) => Some((**value).clone()),
        Expr::Map(map, _) => {
            let (items, template) = &**map;
            let mut out = rhai::Map::new();
            for name in template.keys() {
                out.insert(name.clone(), rhai::Dynamic::UNIT);
            }
            for (ident, value) in items {
                out.insert(ident.name.as_str().into(), constant_value(value)?);
            }
            Some(out.into())
        }
        Expr::Array(items, _) => items
            .iter()
            .map(constant_value)
            .collect::<Option<rhai::Array>>()
            .map(Into::into),
        other => other.get_literal_value(None),
    }
}

/// `tool("name", ...)` with a literal name must name a tool.
fn check_generic(
    call: &FnCallExpr,
    registry: &Registry,
    position: Position,
    report: &mut impl FnMut(Position, String),
) {
    if let Some(Expr::StringConstant(name, _)) = call.args.first() {
        if registry.get(name).is_none() {
            report(position, registry.unknown_tool(name).message);
        }
    }
}

/// The function name in a signature such as `len(array: Array) -> int`.
fn signature_name(signature: &str) -> Option<String> {
    let head = signature.split('(').next()?;
    let name = head.rsplit(' ').next()?.trim();
    (!name.is_empty()).then(|| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_signatures() {
        assert_eq!(
            signature_name("len(array: Array) -> int").as_deref(),
            Some("len")
        );
        assert_eq!(
            signature_name("fn abs(x: int) -> int").as_deref(),
            Some("abs")
        );
        assert_eq!(signature_name("get$x(map: Map)").as_deref(), Some("get$x"));
    }
}
