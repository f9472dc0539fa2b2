//! The scout's rewrite: the sites Rhai decides on without calling a registered function,
//! wrapped in calls of functions whose names the caller gives ([`Wrappers`]).
//!
//! Rhai reads branch and loop conditions, `&&`/`||` operands and switch guards with `as_bool`
//! directly, takes `??`, `switch` and `type_of` at face value, rejects a custom type as an
//! array index before any function runs, and builds interpolated strings itself. This module
//! knows where those sites are in Rhai's AST and how to wrap one without changing what the
//! script means when the wrappers are the identity (or indexing, or joining); what the
//! wrappers do is the caller's (`speculate::rewrite` describes the table of sites and
//! wrappers).
//!
//! The rewrite adds no variables and moves no statements, so the variable offsets Rhai cached
//! in the AST stay valid. Literal constants are never wrapped; custom syntax is left alone.
//!
//! # Order of evaluation
//!
//! Rhai evaluates the index keys of a chain before its root; an index wrapper `index(root,
//! key)` evaluates a root that is not a plain variable before the key. The two differ only when
//! both the root and the key have side effects, as in `f()[g()]`.

use std::cell::Cell;
use std::collections::HashSet;

use rhai::{
    ASTFlags, ASTNode, BinaryExpr, Engine, Expr, FnCallExpr, Position, Stmt, StmtBlock, AST,
};

use super::{template, with_main_body, Statements};

/// The names of the wrapper functions, each with the arguments it is called with.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Wrappers {
    /// `(x) -> bool`: a branch or loop condition, a decisive `&&`/`||` operand, a case guard.
    pub(crate) cond: &'static str,
    /// As `cond`, for the guard of a branch that leaves while the other may not.
    pub(crate) unlikely: &'static str,
    /// As `cond`, for a guess that does not alone decide its condition.
    pub(crate) cond_loose: &'static str,
    /// As `unlikely`, for a guess that does not alone decide its condition.
    pub(crate) unlikely_loose: &'static str,
    /// `(x) -> x`: a `??` operand but the last, a switch subject, `type_of`'s argument, a key
    /// inside a chain.
    pub(crate) value: &'static str,
    /// `(container, key) -> container[key]`: an index chain read as a value.
    pub(crate) index: &'static str,
    /// `(pieces) -> string`: an interpolated string.
    pub(crate) interpolate: &'static str,
    /// `(variable, key) -> key`: the key of an assignment to a variable's element.
    pub(crate) key: &'static str,
    /// `() -> mark`: taken before a `&&` or `||` kept as a value.
    pub(crate) mark: &'static str,
    /// `(mark, value) -> value`: a `&&` or `||` kept as a value.
    pub(crate) settle: &'static str,
}

/// The wrapper calls, each compiled once with its precomputed hashes, ready to be cloned
/// around an expression. Build one per process (they cost a compilation each).
pub(crate) struct Templates {
    names: Wrappers,
    cond: FnCallExpr,
    unlikely: FnCallExpr,
    cond_loose: FnCallExpr,
    unlikely_loose: FnCallExpr,
    value: FnCallExpr,
    index: FnCallExpr,
    interpolate: FnCallExpr,
    key: FnCallExpr,
    mark: FnCallExpr,
    settle: FnCallExpr,
}

impl Templates {
    /// Compiles the calls of `names`.
    pub(crate) fn new(names: Wrappers) -> Templates {
        // A raw engine has no custom syntax, disabled symbols or strict variables that could
        // make a template fail, and no registered functions that the optimizer could fold.
        let engine = Engine::new_raw();
        let one = |name: &str| template(&engine, &format!("{name}(x)"));
        let two = |name: &str| template(&engine, &format!("{name}(x, k)"));
        Templates {
            names,
            cond: one(names.cond),
            unlikely: one(names.unlikely),
            cond_loose: one(names.cond_loose),
            unlikely_loose: one(names.unlikely_loose),
            value: one(names.value),
            index: two(names.index),
            interpolate: one(names.interpolate),
            key: two(names.key),
            mark: template(&engine, &format!("{}()", names.mark)),
            settle: two(names.settle),
        }
    }
}

/// Returns `ast` with its main body's sites wrapped; functions, the source and the
/// documentation are kept. `stops` names the functions where the caller's run would stop (a
/// branch that calls one is, like one that throws, returns or breaks, a branch that leaves).
pub(crate) fn rewrite_main(
    ast: &AST,
    templates: &Templates,
    stops: &HashSet<String>,
    pauses: &HashSet<String>,
) -> AST {
    let rewriter = Rewriter::new(templates, stops, pauses);
    with_main_body(ast, rewriter.statements(ast.statements()))
}

/// A function body's statements with their sites wrapped as [`rewrite_main`] wraps them;
/// `None` when no site needed a wrapper, so that the body can run as it is.
pub(crate) fn rewrite_body(
    body: &Statements,
    templates: &Templates,
    stops: &HashSet<String>,
    pauses: &HashSet<String>,
) -> Option<Statements> {
    let rewriter = Rewriter::new(templates, stops, pauses);
    let rewritten = rewriter.statements(&body.0);
    (rewriter.wrapped.get() > 0).then(|| Statements(rewritten.into()))
}

/// One rewrite: the templates, the functions where a run stops and those where it may pause,
/// and the wrappers made so far.
struct Rewriter<'a> {
    templates: &'a Templates,
    stops: &'a HashSet<String>,
    pauses: &'a HashSet<String>,
    /// Wrapper calls made, so that [`rewrite_body`] can tell a body that needs none.
    wrapped: Cell<u64>,
}

impl<'a> Rewriter<'a> {
    fn new(
        templates: &'a Templates,
        stops: &'a HashSet<String>,
        pauses: &'a HashSet<String>,
    ) -> Self {
        Rewriter {
            templates,
            stops,
            pauses,
            wrapped: Cell::new(0),
        }
    }

    /// A rewritten copy of `statements`.
    fn statements(&self, statements: &[Stmt]) -> Vec<Stmt> {
        statements
            .iter()
            .map(|stmt| {
                let mut stmt = stmt.clone();
                self.stmt(&mut stmt);
                stmt
            })
            .collect()
    }

    /// Rewrites one statement in place.
    fn stmt(&self, stmt: &mut Stmt) {
        match stmt {
            Stmt::If(flow, ..) => {
                self.cond(&mut flow.expr);
                // The guess goes towards a branch that may pause (a pass stops at its call);
                // else away from a branch that always leaves or writes.
                let (body, branch) = (flow.body.statements(), flow.branch.statements());
                let unlikely = if self.may_pause(body) {
                    false
                } else {
                    self.may_pause(branch) || (!self.may_stay(body) && self.may_stay(branch))
                };
                if unlikely {
                    self.make_unlikely(&mut flow.expr);
                }
                self.loosen(&mut flow.expr, true, true);
                self.block(&mut flow.body);
                self.block(&mut flow.branch);
            }
            // `loop` is a `while` whose condition is `()`: it has no condition to wrap.
            Stmt::While(flow, ..) | Stmt::Do(flow, ..) => {
                if !flow.expr.is_unit() {
                    self.cond(&mut flow.expr);
                    self.loosen(&mut flow.expr, true, true);
                }
                self.block(&mut flow.body);
            }
            Stmt::For(for_loop, ..) => {
                let flow = &mut for_loop.2;
                self.expr(&mut flow.expr);
                self.block(&mut flow.body);
            }
            Stmt::Switch(switch, ..) => {
                let (subject, cases) = &mut **switch;
                self.expr(subject);
                self.wrap_value(subject);
                // Each case is a guard (`true` when there is none) and the case's expression.
                for case in cases.expressions.iter_mut() {
                    self.cond(&mut case.lhs);
                    self.loosen(&mut case.lhs, true, true);
                    self.expr(&mut case.rhs);
                }
            }
            Stmt::Var(var, ..) => self.expr(&mut var.1),
            Stmt::Assignment(assignment) => {
                let BinaryExpr { lhs, rhs } = &mut assignment.1;
                if !self.element_key(lhs) {
                    self.target(lhs);
                }
                self.expr(rhs);
            }
            Stmt::FnCall(call, ..) => self.call(call),
            Stmt::Block(block) => self.block(block),
            // The try-catch expression is the catch variable, not a value.
            Stmt::TryCatch(flow, ..) => {
                self.block(&mut flow.body);
                self.block(&mut flow.branch);
            }
            Stmt::Expr(expr) => self.expr(expr),
            Stmt::BreakLoop(Some(expr), ..) | Stmt::Return(Some(expr), ..) => self.expr(expr),
            Stmt::Import(import, ..) => self.expr(&mut import.0),
            _ => {}
        }
    }

    /// Rewrites every statement of a block in place.
    fn block(&self, block: &mut StmtBlock) {
        for stmt in block.statements_mut().iter_mut() {
            self.stmt(stmt);
        }
    }

    /// Rewrites an expression that is evaluated as a value, in place.
    fn expr(&self, expr: &mut Expr) {
        match expr {
            Expr::InterpolatedString(..) if !expr.is_constant() => {
                let pos = expr.position();
                let Expr::InterpolatedString(mut items, _) = expr.take() else {
                    unreachable!("matched above");
                };
                for item in items.iter_mut() {
                    self.expr(item);
                }
                *expr = self.wrapped(&self.templates.interpolate, [Expr::Array(items, pos)], pos);
            }
            Expr::InterpolatedString(items, ..) | Expr::Array(items, ..) => {
                for item in items.iter_mut() {
                    self.expr(item);
                }
            }
            Expr::Map(map, ..) => {
                for (_, item) in map.0.iter_mut() {
                    self.expr(item);
                }
            }
            Expr::Stmt(block) => self.block(block),
            Expr::FnCall(call, ..) => self.call(call),
            Expr::MethodCall(call, ..) => {
                for arg in call.args.iter_mut() {
                    self.expr(arg);
                }
            }
            Expr::And(..) | Expr::Or(..) => {
                self.cond(expr);
                self.loosen(expr, false, false);
                let pos = expr.position();
                let mark = self.wrapped(&self.templates.mark, [], pos);
                *expr = self.wrapped(&self.templates.settle, [mark, expr.take()], pos);
            }
            Expr::Coalesce(operands, ..) => {
                let last = operands.len().saturating_sub(1);
                for (i, operand) in operands.iter_mut().enumerate() {
                    self.expr(operand);
                    if i < last {
                        self.wrap_value(operand);
                    }
                }
            }
            Expr::Index(..) if is_plain_index_chain(expr) => {
                let chain = expr.take();
                *expr = self.index_calls(chain);
            }
            // Other chains are rewritten as an assignment target is: keys only.
            Expr::Index(..) | Expr::Dot(..) => self.target(expr),
            _ => {}
        }
    }

    /// Rewrites an expression that is decided on (a branch or loop condition, a case guard, an
    /// operand of `&&` or `||` in one), in place.
    fn cond(&self, expr: &mut Expr) {
        match expr {
            Expr::And(operands, ..) | Expr::Or(operands, ..) => {
                operands.iter_mut().for_each(|operand| self.cond(operand));
            }
            _ => {
                self.expr(expr);
                self.wrap_cond(expr);
            }
        }
    }

    /// Rewrites the target of an assignment in place: only the keys of an index chain, since the
    /// chain must stay a chain for Rhai to write through it.
    fn target(&self, target: &mut Expr) {
        match target {
            Expr::Index(chain, options, ..) => {
                let options = *options;
                self.chain(chain, true, options);
            }
            Expr::Dot(chain, options, ..) => {
                let options = *options;
                self.chain(chain, false, options);
            }
            _ => {}
        }
    }

    /// Rewrites the target `variable[key]` of an assignment (one index step, a key that is not a
    /// constant) to `variable[__ts_key(variable, key)]`; `false` for any other target.
    fn element_key(&self, target: &mut Expr) -> bool {
        let Expr::Index(node, options, ..) = target else {
            return false;
        };
        let single = options.contains(ASTFlags::BREAK)
            || !matches!(node.rhs, Expr::Index(..) | Expr::Dot(..));
        if !single
            || options.contains(ASTFlags::NEGATED)
            || !matches!(node.lhs, Expr::Variable(..))
            || node.rhs.is_constant()
        {
            return false;
        }
        let key = &mut node.rhs;
        self.expr(key);
        let pos = site(key);
        *key = self.wrapped(&self.templates.key, [node.lhs.clone(), key.take()], pos);
        true
    }

    /// Rewrites the arguments of a function call in place, and wraps the argument of `type_of`.
    fn call(&self, call: &mut FnCallExpr) {
        for arg in call.args.iter_mut() {
            self.expr(arg);
        }
        if call.name == "type_of" && call.args.len() == 1 && !call.is_qualified() {
            self.wrap_value(&mut call.args[0]);
        }
    }

    /// Rewrites a dot/index chain in place, keeping it a chain: the root (unless it is a variable
    /// or `this`, which a chain may write through), method call arguments and index keys.
    ///
    /// Rhai binds chains to the right: `a[i].b[j]` is `Index(a, Dot(i, Index(b, j)))`, where the
    /// left side of each inner node is the key or property of the step its parent starts.
    fn chain(&self, chain: &mut BinaryExpr, is_index: bool, options: ASTFlags) {
        if !matches!(chain.lhs, Expr::Variable(..) | Expr::ThisPtr(..)) {
            self.expr(&mut chain.lhs);
        }
        self.chain_rest(&mut chain.rhs, is_index, options);
    }

    /// Rewrites the right side of a chain node: either the last step, or a node whose left side
    /// is the next step and whose right side is the rest of the chain.
    fn chain_rest(&self, rest: &mut Expr, parent_is_index: bool, parent_options: ASTFlags) {
        // A node marked BREAK ends the chain: its right side is a whole key expression even when
        // that expression is itself an index or a dot expression.
        if !parent_options.contains(ASTFlags::BREAK) {
            match rest {
                Expr::Index(node, options, ..) => {
                    let options = *options;
                    self.chain_step(&mut node.lhs, parent_is_index);
                    self.chain_rest(&mut node.rhs, true, options);
                    return;
                }
                Expr::Dot(node, options, ..) => {
                    let options = *options;
                    self.chain_step(&mut node.lhs, parent_is_index);
                    self.chain_rest(&mut node.rhs, false, options);
                    return;
                }
                _ => {}
            }
        }
        self.chain_step(rest, parent_is_index);
    }

    /// Rewrites one step of a chain: an index key, or a property or method call after a dot.
    fn chain_step(&self, step: &mut Expr, is_index: bool) {
        if is_index {
            self.expr(step);
            self.wrap_value(step);
        } else if let Expr::MethodCall(call, ..) = step {
            for arg in call.args.iter_mut() {
                self.expr(arg);
            }
        }
    }

    /// Turns a plain index chain read as a value into nested index-wrapper calls:
    /// `a[i][j]` becomes `__ts_index(__ts_index(a, i), j)`.
    fn index_calls(&self, chain: Expr) -> Expr {
        let Expr::Index(node, mut options, mut pos) = chain else {
            return chain;
        };
        let BinaryExpr { lhs: root, rhs } = *node;
        let mut value = root;
        self.expr(&mut value);
        let mut rest = rhs;
        loop {
            match rest {
                // Each call takes the position of its `[`, where Rhai reports indexing errors.
                Expr::Index(next, next_options, next_pos) if !options.contains(ASTFlags::BREAK) => {
                    let BinaryExpr { lhs: mut key, rhs } = *next;
                    self.expr(&mut key);
                    value = self.wrapped(&self.templates.index, [value, key], pos);
                    rest = rhs;
                    options = next_options;
                    pos = next_pos;
                }
                mut key => {
                    self.expr(&mut key);
                    return self.wrapped(&self.templates.index, [value, key], pos);
                }
            }
        }
    }

    /// Wraps a condition in the condition wrapper, unless it is already a boolean by construction.
    fn wrap_cond(&self, expr: &mut Expr) {
        // `&&` and `||` always give a boolean, and their operands are wrapped themselves.
        if !matches!(expr, Expr::BoolConstant(..) | Expr::And(..) | Expr::Or(..)) {
            let pos = site(expr);
            *expr = self.wrapped(&self.templates.cond, [expr.take()], pos);
        }
    }

    /// Turns the condition-wrapper calls that decide a condition (its own, and its `&&`/`||`
    /// operands') into `unlikely` calls, leaving the calls inside operands as they are.
    fn make_unlikely(&self, expr: &mut Expr) {
        match expr {
            Expr::FnCall(call, _) if call.name.as_str() == self.templates.names.cond => {
                let args = std::mem::take(&mut call.args);
                let mut unlikely = self.templates.unlikely.clone();
                unlikely.args = args;
                **call = unlikely;
            }
            Expr::And(operands, ..) | Expr::Or(operands, ..) => {
                operands
                    .iter_mut()
                    .for_each(|operand| self.make_unlikely(operand));
            }
            _ => {}
        }
    }

    /// Turns the guesses of a rewritten condition that do not decide it alone into loose ones
    /// (`cond_loose`, `unlikely_loose`): a guess decides the condition when proving it
    /// wrong proves the condition's value wrong, so a guess of `true` must sit under `&&`s
    /// only (`all_and`), and one of `false` under `||`s only (`all_or`); a guess that
    /// short-circuits an operator leaves the condition to the operands it skipped.
    fn loosen(&self, expr: &mut Expr, all_and: bool, all_or: bool) {
        match expr {
            Expr::FnCall(call, _) => {
                let names = &self.templates.names;
                let loose = match call.name.as_str() {
                    name if name == names.cond && !all_and => &self.templates.cond_loose,
                    name if name == names.unlikely && !all_or => &self.templates.unlikely_loose,
                    _ => return,
                };
                let args = std::mem::take(&mut call.args);
                let mut replaced = loose.clone();
                replaced.args = args;
                **call = replaced;
            }
            Expr::And(operands, ..) => operands
                .iter_mut()
                .for_each(|operand| self.loosen(operand, all_and, false)),
            Expr::Or(operands, ..) => operands
                .iter_mut()
                .for_each(|operand| self.loosen(operand, false, all_or)),
            _ => {}
        }
    }

    /// Wraps a value in the value wrapper, unless it is a literal constant.
    fn wrap_value(&self, expr: &mut Expr) {
        if !expr.is_constant() {
            let pos = site(expr);
            *expr = self.wrapped(&self.templates.value, [expr.take()], pos);
        }
    }

    /// A call of `template`'s function on `args`, at `pos`.
    fn wrapped<const N: usize>(
        &self,
        template: &FnCallExpr,
        args: [Expr; N],
        pos: Position,
    ) -> Expr {
        self.wrapped.set(self.wrapped.get() + 1);
        let mut call = template.clone();
        call.args.clear();
        call.args.extend(args);
        Expr::FnCall(Box::new(call), pos)
    }

    /// Whether a block may run to its end without leaving where it stands: some way through it
    /// neither throws, returns, breaks out of a loop or goes on to its next round nor calls
    /// one of the functions where the run stops (a pass of the scout stops at a non-read tool
    /// until the executor has made the call). An `if` may when one of its branches may, and its
    /// condition calls no such function; a `try` when its body may (its `catch` runs only after
    /// the body failed, past any write it attempted).
    fn may_stay(&self, block: &[Stmt]) -> bool {
        block.iter().all(|stmt| match stmt {
            Stmt::Return(..) => false,
            // `break` and `continue` both skip the rest of the loop's body.
            Stmt::BreakLoop(..) => false,
            Stmt::If(flow, ..) => {
                !self.writes(|on_node| flow.expr.walk(&mut Vec::new(), on_node))
                    && (self.may_stay(flow.body.statements())
                        || self.may_stay(flow.branch.statements()))
            }
            Stmt::TryCatch(flow, ..) => self.may_stay(flow.body.statements()),
            Stmt::Block(block) => self.may_stay(block.statements()),
            other => !self.writes(|on_node| other.walk(&mut Vec::new(), on_node)),
        })
    }

    /// Whether a block calls a function where the run may pause.
    fn may_pause(&self, block: &[Stmt]) -> bool {
        block
            .iter()
            .any(|stmt| calls_one_of(self.pauses, |on_node| stmt.walk(&mut Vec::new(), on_node)))
    }

    /// Whether the nodes that `walk` visits call a function where the run stops.
    fn writes(&self, walk: impl FnOnce(&mut dyn FnMut(&[ASTNode]) -> bool) -> bool) -> bool {
        calls_one_of(self.stops, walk)
    }
}

/// Whether the nodes that `walk` visits call one of the functions `names`.
fn calls_one_of(
    names: &HashSet<String>,
    walk: impl FnOnce(&mut dyn FnMut(&[ASTNode]) -> bool) -> bool,
) -> bool {
    let mut found = false;
    if !names.is_empty() {
        walk(&mut |path: &[ASTNode]| {
            let call = match path.last() {
                Some(ASTNode::Expr(Expr::FnCall(call, _))) => Some(call),
                Some(ASTNode::Stmt(Stmt::FnCall(call, _))) => Some(call),
                _ => None,
            };
            found |= call.is_some_and(|call| names.contains(call.name.as_str()));
            !found
        });
    }
    found
}

/// Whether an index expression is a chain of indexing only (`a[i][j]`): no `.` step, whose
/// method calls might write through the chain, and no `?[`, which the index wrapper does not
/// short-circuit.
fn is_plain_index_chain(mut expr: &Expr) -> bool {
    loop {
        let Expr::Index(node, options, ..) = expr else {
            return false;
        };
        if options.contains(ASTFlags::NEGATED) {
            return false;
        }
        if options.contains(ASTFlags::BREAK) {
            return true;
        }
        match &node.rhs {
            Expr::Index(..) => expr = &node.rhs,
            Expr::Dot(..) => return false,
            _ => return true,
        }
    }
}

/// The position a wrapper call takes: that of the wrapped expression, where Rhai itself reports a
/// wrong type, so that errors in the scout point at the script.
fn site(expr: &Expr) -> Position {
    match expr.position() {
        pos if pos.is_none() => expr.start_position(),
        pos => pos,
    }
}
