//! Script functions' and closures' bodies as statement lists, and running such a list as a call
//! one level deeper than its caller.
//!
//! Rhai 1.27 can read a function's body (through `AST::walk`) but cannot build a function with
//! a changed one: the body's type is not exported. A body is found by walking an AST that
//! holds that function alone: the walk visits its top-level statements at path length 1.

use rhai::{
    ASTNode, Caches, Dynamic, EvalAltResult, ImmutableString, NativeCallContext, Scope, Stmt, AST,
};

use super::Node;

/// A script function or closure of an AST (closures are named `anon$…`).
pub(crate) struct Function {
    /// Its name.
    pub(crate) name: ImmutableString,
    /// Its parameters' names, in order.
    pub(crate) params: Vec<ImmutableString>,
    /// Whether it is a method of a named type (`fn T.f()`), which only values of that type call.
    pub(crate) is_typed_method: bool,
}

/// The script functions and closures of `ast`.
pub(crate) fn functions(ast: &AST) -> Vec<Function> {
    ast.iter_fn_def()
        .map(|def| Function {
            name: def.name.clone(),
            params: def.params.iter().cloned().collect(),
            is_typed_method: def.this_type.is_some(),
        })
        .collect()
}

/// A list of statements: a function's body, possibly rewritten.
#[derive(Debug)]
pub(crate) struct Statements(pub(super) Box<[Stmt]>);

impl Statements {
    /// The top-level statements of the body of the function `name` of `arity` parameters;
    /// `None` when `ast` has no such function, or several.
    pub(crate) fn of_function(ast: &AST, name: &str, arity: usize) -> Option<Statements> {
        let mut alone = ast.clone_functions_only();
        alone.retain_functions(|_, _, n, a| n == name && a == arity);
        if alone.iter_fn_def().count() != 1 {
            return None;
        }
        let mut statements = Vec::new();
        alone.walk(&mut |path: &[ASTNode]| {
            if let [ASTNode::Stmt(stmt)] = path {
                statements.push((*stmt).clone());
            }
            true
        });
        Some(Statements(statements.into()))
    }

    /// The names of the functions the statements call (methods and operators included).
    pub(crate) fn called(&self) -> std::collections::HashSet<String> {
        let mut names = std::collections::HashSet::new();
        super::visit_statements(&self.0, |node| {
            if let Node::Call(call) = node {
                names.insert(call.name().to_string());
            }
            true
        });
        names
    }

    /// Whether a statement reads or writes `this`.
    pub(crate) fn uses_this(&self) -> bool {
        let mut found = false;
        super::visit_statements(&self.0, |node| {
            found |= matches!(node, Node::This);
            !found
        });
        found
    }
}

/// Runs `statements` for a native function called through `ctx`, as a script function's body
/// runs: in `scope`, one call level deeper than the caller (an error past the engine's call
/// levels), with the caller's deadline and cancellation, counting operations from
/// `operations` (what the caller's tally is, with what earlier callees did). Returns the result
/// and the operations count the body ended at.
///
/// `Engine::eval_statements_raw` is deprecated (since Rhai 1.12, with no replacement named),
/// and it is the only way Rhai 1.27 offers to run statements in a given runtime state: the
/// public `eval_ast_with_scope` starts a fresh one, which would reset the call level (no
/// call-depth limit on recursion through rewritten bodies), the operations count (no operation
/// limit over a pass as a whole) and the script's `global::` constants. So it is kept, here.
pub(crate) fn run_nested(
    ctx: &NativeCallContext,
    statements: &Statements,
    scope: &mut Scope,
    operations: u64,
) -> (Result<Dynamic, Box<EvalAltResult>>, u64) {
    let engine = ctx.engine();
    let caller = ctx.global_runtime_state();
    let mut global = caller.clone();
    global.level = caller.level + 1;
    if global.level > engine.max_call_levels() {
        let overflow = EvalAltResult::ErrorStackOverflow(ctx.call_position());
        return (Err(overflow.into()), operations);
    }
    global.num_operations = operations;
    #[allow(deprecated)] // See above: no other way to run statements in a runtime state.
    let result = engine.eval_statements_raw(&mut global, &mut Caches::new(), scope, &statements.0);
    (result, global.num_operations())
}

/// The operations the runtime state of the call through `ctx` has counted.
pub(crate) fn operations_so_far(ctx: &NativeCallContext) -> u64 {
    ctx.global_runtime_state().num_operations()
}
