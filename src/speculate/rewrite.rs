//! The AST rewrite that lets the scout see every place where a script decides on a value.
//!
//! The scout runs a script a second time, advisorily, with unresolved tool results standing in as
//! placeholder values. Most of what a script does with a value goes through a registered function
//! (operators, indexers on the placeholder type, `to_string`), so the scout can intercept it. A few
//! sites do not: Rhai reads branch and loop conditions, `&&`/`||` operands and switch guards with
//! `as_bool` directly, takes `??`, `switch` and `type_of` at face value, and rejects a placeholder as
//! an array index before any function runs. At those sites a placeholder would stop the scout (a type
//! error) or, worse, silently steer it the wrong way.
//!
//! [`rewrite`] therefore wraps each such site in a call to a function that the scout registers:
//!
//! | site | becomes |
//! |---|---|
//! | `if c`, `while c`, `do … while c`/`until c`, a switch case guard | `__ts_cond(c)` |
//! | each operand of `&&` and `\|\|` | `__ts_cond(x)` |
//! | each operand of `??` but the last | `__ts_value(x)` |
//! | the subject of `switch` | `__ts_value(x)` |
//! | the argument of a function-style `type_of(x)` | `__ts_value(x)` |
//! | an index chain read as a value, `a[i][j]` | `__ts_index(__ts_index(a, i), j)` |
//! | the key of an assignment to a variable's element, `a[i] = v` | `a[__ts_key(a, i)] = v` |
//! | any other index key (assignment targets, chains with `.`) | `a[__ts_value(i)]` |
//! | an interpolated string `` `a${x}b` `` | `__ts_interpolate(["a", x, "b"])` |
//! | a `&&` or `\|\|` kept as a value, `let ok = a && b` | `__ts_settle(__ts_mark(), a && b)` |
//!
//! A condition whose branch every way writes or leaves, while the other branch may not, calls
//! `__ts_unlikely` instead of `__ts_cond` (guessed not taken). A guess that does not alone decide
//! its condition (one that only short-circuits a `&&` or `||`, or one inside logic kept as a
//! value) calls the `_loose` variant of either, which guesses the same but is not kept for the
//! deferred calls made after it.
//!
//! With `__ts_cond` (and its variants) and `__ts_value` as the identity, `__ts_key(a, i)` as `i`,
//! `__ts_index` as indexing, `__ts_interpolate` as joining its pieces' `to_string`s and
//! `__ts_settle(m, x)` as `x`, the rewritten AST means what the original means; the tests check
//! that on a corpus of scripts.
//!
//! # What is not rewritten
//!
//! - Script function bodies and closure bodies, by [`rewrite_with`]: they live in the AST's
//!   function module as `ScriptFuncDef`s whose body type Rhai 1.27 does not export, so no function
//!   with a changed body can be built. [`rewrite_body`] rewrites a body's statements by the same
//!   rules, and `speculate::functions` runs them as native functions of the scout's engine.
//! - Custom syntax (`Expr::Custom`): its inputs belong to the syntax's own implementation.
//! - Literal constants: a literal condition, key or `??` operand can never be a placeholder, so it
//!   is left as is (this keeps `loop`, `while true` and `a[0]` free of extra calls).
//!
//! # Order of evaluation
//!
//! Rhai evaluates the index keys of a chain before its root; `__ts_index(root, key)` evaluates a
//! root that is not a plain variable before the key. The two differ only when both the root and the
//! key have side effects, as in `f()[g()]`.

use std::sync::OnceLock;

use rhai::{
    ASTFlags, BinaryExpr, Engine, Expr, FnCallExpr, Module, Position, Stmt, StmtBlock, AST,
};

/// The function the rewritten script calls on a branch or loop condition, a `&&` or `||` operand
/// or a switch case guard: `(x) -> bool`.
pub(crate) const COND: &str = "__ts_cond";
/// As [`COND`], for the condition of an `if` whose branch leaves (it throws, returns or breaks)
/// while the other does not: an unknown is guessed false, so that a pass goes on past a guard
/// the run will most likely not take, instead of stopping where the branch leaves.
pub(crate) const UNLIKELY: &str = "__ts_unlikely";
/// As [`COND`], for an operand of `&&` or `||` whose value alone does not decide its condition
/// (it short-circuits an operator above it, or the `&&`/`||` is kept as a value): guessed the
/// same, but the guess is not one a deferred call may be held to.
pub(crate) const COND_LOOSE: &str = "__ts_cond_loose";
/// As [`UNLIKELY`], for an operand as [`COND_LOOSE`] describes.
pub(crate) const UNLIKELY_LOOSE: &str = "__ts_unlikely_loose";
/// The function the rewritten script calls before a `&&` or `||` whose value is kept (assigned,
/// passed, returned) rather than decided on: `() -> INT`, the guesses made so far in the pass.
pub(crate) const MARK: &str = "__ts_mark";
/// The function the rewritten script calls on such a `&&` or `||`, with the [`MARK`] taken
/// before it: `(mark, value) -> Dynamic`. A value that took a guess is an unknown, not the
/// guess: `let ok = a && b;` must not turn a guessed operand into a known `true`.
pub(crate) const SETTLE: &str = "__ts_settle";
/// The function the rewritten script calls on a `??` operand (all but the last), a switch subject,
/// the argument of `type_of` and an index key that stays inside a chain: `(x) -> Dynamic`.
pub(crate) const VALUE: &str = "__ts_value";
/// The function the rewritten script calls instead of reading `container[key]` as a value:
/// `(container, key) -> Dynamic`.
///
/// Rhai passes a variable given as the first argument by reference, so registering the container
/// parameter as `&mut Dynamic` avoids cloning whole arrays on every read.
pub(crate) const INDEX: &str = "__ts_index";
/// The function the rewritten script calls instead of building an interpolated string, on an
/// array of its pieces: `(pieces) -> Dynamic`. Rhai builds the string itself, calling
/// `to_string` on each piece, so a piece the scout does not have yet could only become text.
pub(crate) const INTERPOLATE: &str = "__ts_interpolate";
/// The function the rewritten script calls on the key of `variable[key] = ...` (and of `+=` and
/// the like): `(variable, key) -> key`. It gets the variable by reference (see [`INDEX`]), so
/// that, for a key the scout does not have yet, it can replace a map or an array with a value
/// that keeps the write until the key is known; Rhai looks the variable up after the key.
pub(crate) const KEY: &str = "__ts_key";

/// Returns a new AST in which the sites that Rhai evaluates without calling a registered function
/// call [`COND`], [`VALUE`] or [`INDEX`] instead (see the module documentation).
///
/// The result has the same meaning as `ast` when `COND` and `VALUE` are the identity and `INDEX`
/// is indexing. Only the main body is rewritten; functions, the source name and the documentation
/// are kept. The rewrite adds no variables and moves no statements, so the variable offsets that
/// Rhai cached in the AST stay valid.
///
/// The wrapper calls are built from templates compiled once per process by a raw engine, since a call's hashes depend only on its name and arity (and on Rhai's
/// process-wide hashing seed), not on the engine that will run it.
#[cfg(test)]
pub(crate) fn rewrite(ast: &AST) -> AST {
    rewrite_with(ast, &std::collections::HashSet::new())
}

/// As [`rewrite`], knowing which functions are non-read tools: a branch that calls one is, like
/// one that throws, returns or breaks, a branch where a pass would stop, and its guard is
/// guessed not taken.
pub(crate) fn rewrite_with(ast: &AST, effectful: &std::collections::HashSet<String>) -> AST {
    knowing(effectful, || rewrite_main(ast))
}

/// Rewrites the statements of a function or closure body as the main body is rewritten (with
/// the non-read tools `effectful`); `None` when no site in them needs a wrapper, so that the
/// body can run as it is.
pub(crate) fn rewrite_body(
    statements: &[Stmt],
    effectful: &std::collections::HashSet<String>,
) -> Option<Vec<Stmt>> {
    knowing(effectful, || {
        WRAPPED.with(|w| w.set(0));
        let rewritten = Rewriter::get().statements(statements);
        (WRAPPED.with(std::cell::Cell::get) > 0).then_some(rewritten)
    })
}

/// Runs `rewrite` with the non-read tools' names known to [`may_stay`].
fn knowing<T>(effectful: &std::collections::HashSet<String>, rewrite: impl FnOnce() -> T) -> T {
    EFFECTFUL.with(|e| *e.borrow_mut() = effectful.clone());
    let rewritten = rewrite();
    EFFECTFUL.with(|e| e.borrow_mut().clear());
    rewritten
}

thread_local! {
    /// The non-read tools' function names, for the rewrite running on this thread.
    static EFFECTFUL: std::cell::RefCell<std::collections::HashSet<String>> =
        std::cell::RefCell::new(std::collections::HashSet::new());
    /// Wrapper calls made by the rewrite running on this thread, so that [`rewrite_body`] can
    /// tell a body that needs none.
    static WRAPPED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn rewrite_main(ast: &AST) -> AST {
    let statements = Rewriter::get().statements(ast.statements());
    // `clone_functions_only` keeps the source, the documentation and any embedded module
    // resolver, which `AST::new` would drop.
    let mut rewritten = ast.clone_functions_only();
    rewritten.combine(AST::new(statements, Module::new()));
    rewritten
}

/// The three wrapper calls, each with its precomputed hashes, ready to be cloned around an
/// expression.
struct Rewriter {
    /// A call to [`COND`] with one argument.
    cond: FnCallExpr,
    /// A call to [`UNLIKELY`] with one argument.
    unlikely: FnCallExpr,
    /// A call to [`COND_LOOSE`] with one argument.
    cond_loose: FnCallExpr,
    /// A call to [`UNLIKELY_LOOSE`] with one argument.
    unlikely_loose: FnCallExpr,
    /// A call to [`VALUE`] with one argument.
    value: FnCallExpr,
    /// A call to [`INDEX`] with two arguments.
    index: FnCallExpr,
    /// A call to [`INTERPOLATE`] with one argument.
    interpolate: FnCallExpr,
    /// A call to [`KEY`] with two arguments.
    key: FnCallExpr,
    /// A call to [`MARK`] with no arguments.
    mark: FnCallExpr,
    /// A call to [`SETTLE`] with two arguments.
    settle: FnCallExpr,
}

impl Rewriter {
    /// The process-wide rewriter, built on first use.
    fn get() -> &'static Self {
        static REWRITER: OnceLock<Rewriter> = OnceLock::new();
        REWRITER.get_or_init(|| {
            // A raw engine has no custom syntax, disabled symbols or strict variables that could
            // make a template fail, and no registered functions that the optimizer could fold.
            let engine = Engine::new_raw();
            Self {
                cond: template(&engine, &format!("{COND}(x)")),
                unlikely: template(&engine, &format!("{UNLIKELY}(x)")),
                cond_loose: template(&engine, &format!("{COND_LOOSE}(x)")),
                unlikely_loose: template(&engine, &format!("{UNLIKELY_LOOSE}(x)")),
                value: template(&engine, &format!("{VALUE}(x)")),
                index: template(&engine, &format!("{INDEX}(x, k)")),
                interpolate: template(&engine, &format!("{INTERPOLATE}(x)")),
                key: template(&engine, &format!("{KEY}(x, k)")),
                mark: template(&engine, &format!("{MARK}()")),
                settle: template(&engine, &format!("{SETTLE}(x, k)")),
            }
        })
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
                if !may_stay(flow.body.statements()) && may_stay(flow.branch.statements()) {
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
                *expr = self.wrapped(&self.interpolate, [Expr::Array(items, pos)], pos);
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
                let mark = self.wrapped(&self.mark, [], pos);
                *expr = self.wrapped(&self.settle, [mark, expr.take()], pos);
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
        *key = self.wrapped(&self.key, [node.lhs.clone(), key.take()], pos);
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

    /// Turns a plain index chain read as a value into nested [`INDEX`] calls:
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
                    value = self.wrapped(&self.index, [value, key], pos);
                    rest = rhs;
                    options = next_options;
                    pos = next_pos;
                }
                mut key => {
                    self.expr(&mut key);
                    return self.wrapped(&self.index, [value, key], pos);
                }
            }
        }
    }

    /// Wraps a condition in [`COND`], unless it is already a boolean by construction.
    fn wrap_cond(&self, expr: &mut Expr) {
        // `&&` and `||` always give a boolean, and their operands are wrapped themselves.
        if !matches!(expr, Expr::BoolConstant(..) | Expr::And(..) | Expr::Or(..)) {
            let pos = site(expr);
            *expr = self.wrapped(&self.cond, [expr.take()], pos);
        }
    }

    /// Turns the [`COND`] calls that decide a condition (its own, and its `&&`/`||` operands')
    /// into [`UNLIKELY`] calls, leaving the calls inside operands as they are.
    fn make_unlikely(&self, expr: &mut Expr) {
        match expr {
            Expr::FnCall(call, _) if call.name.as_str() == COND => {
                let args = std::mem::take(&mut call.args);
                let mut unlikely = self.unlikely.clone();
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
    /// ([`COND_LOOSE`], [`UNLIKELY_LOOSE`]): a guess decides the condition when proving it
    /// wrong proves the condition's value wrong, so a guess of `true` must sit under `&&`s
    /// only (`all_and`), and one of `false` under `||`s only (`all_or`); a guess that
    /// short-circuits an operator leaves the condition to the operands it skipped.
    fn loosen(&self, expr: &mut Expr, all_and: bool, all_or: bool) {
        match expr {
            Expr::FnCall(call, _) => {
                let loose = match call.name.as_str() {
                    COND if !all_and => &self.cond_loose,
                    UNLIKELY if !all_or => &self.unlikely_loose,
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

    /// Wraps a value in [`VALUE`], unless it is a literal constant.
    fn wrap_value(&self, expr: &mut Expr) {
        if !expr.is_constant() {
            let pos = site(expr);
            *expr = self.wrapped(&self.value, [expr.take()], pos);
        }
    }

    /// A call of `template`'s function on `args`, at `pos`.
    fn wrapped<const N: usize>(
        &self,
        template: &FnCallExpr,
        args: [Expr; N],
        pos: Position,
    ) -> Expr {
        WRAPPED.with(|w| w.set(w.get() + 1));
        let mut call = template.clone();
        call.args.clear();
        call.args.extend(args);
        Expr::FnCall(Box::new(call), pos)
    }
}

/// Whether a block may run to its end without leaving where it stands, for the scout: some way
/// through it neither throws, returns or breaks out of a loop (a `continue` does not count) nor
/// calls a non-read tool (where a pass stops until the executor has made the call). An `if`
/// may when one of its branches may, and its condition calls no such tool; a `try` when its
/// body may (its `catch` runs only after the body failed, past any write it attempted).
fn may_stay(block: &[Stmt]) -> bool {
    block.iter().all(|stmt| match stmt {
        Stmt::Return(..) => false,
        Stmt::BreakLoop(_, flags, _) => !flags.contains(ASTFlags::BREAK),
        Stmt::If(flow, ..) => {
            !writes(|on_node| flow.expr.walk(&mut Vec::new(), on_node))
                && (may_stay(flow.body.statements()) || may_stay(flow.branch.statements()))
        }
        Stmt::TryCatch(flow, ..) => may_stay(flow.body.statements()),
        Stmt::Block(block) => may_stay(block.statements()),
        other => !writes(|on_node| other.walk(&mut Vec::new(), on_node)),
    })
}

/// Whether the nodes that `walk` visits call a non-read tool.
fn writes(walk: impl FnOnce(&mut dyn FnMut(&[rhai::ASTNode]) -> bool) -> bool) -> bool {
    EFFECTFUL.with(|effectful| {
        let effectful = effectful.borrow();
        let mut found = false;
        if !effectful.is_empty() {
            walk(&mut |path: &[rhai::ASTNode]| {
                let call = match path.last() {
                    Some(rhai::ASTNode::Expr(Expr::FnCall(call, _))) => Some(call),
                    Some(rhai::ASTNode::Stmt(Stmt::FnCall(call, _))) => Some(call),
                    _ => None,
                };
                found |= call.is_some_and(|call| effectful.contains(call.name.as_str()));
                !found
            });
        }
        found
    })
}

/// The call in a one-call template script.
///
/// # Panics
///
/// Panics if `script` is not a single function call; the templates are fixed, so that is a bug.
fn template(engine: &Engine, script: &str) -> FnCallExpr {
    let ast = engine
        .compile(script)
        .unwrap_or_else(|err| panic!("template {script:?} does not compile: {err}"));
    match ast.statements() {
        [Stmt::FnCall(call, ..)] => (**call).clone(),
        [Stmt::Expr(expr)] => match &**expr {
            Expr::FnCall(call, ..) => (**call).clone(),
            other => panic!("template {script:?} is not a call: {other:?}"),
        },
        other => panic!("template {script:?} is not a single call: {other:?}"),
    }
}

/// Whether an index expression is a chain of indexing only (`a[i][j]`): no `.` step, whose method
/// calls might write through the chain, and no `?[`, which [`INDEX`] does not short-circuit.
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

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use rhai::{
        Dynamic, Engine, EvalAltResult, NativeCallContext, OptimizationLevel, Position, Scope, AST,
    };

    use super::{
        rewrite, COND, COND_LOOSE, INDEX, INTERPOLATE, KEY, MARK, SETTLE, UNLIKELY, UNLIKELY_LOOSE,
        VALUE,
    };

    /// Scripts covering every rule, each returning a value that shows what it did. `log(x)`
    /// records `x` and returns it, to show which operands ran and in which order.
    const CORPUS: &[&str] = &[
        // Nested ifs in a loop, else-if chains.
        r#"
        let out = [];
        for i in 0..10 {
            if i % 2 == 0 {
                if i > 4 { out.push(i) } else { out.push(-i) }
            } else if i == 3 { out.push(100) } else { if i > 6 { out.push(log(i)) } }
        }
        out
        "#,
        // While with continue; an if as the last statement of a loop body.
        r#"
        let i = 0; let s = 0;
        while i < 10 { i += 1; if i == 5 { continue; } s += i; }
        s
        "#,
        // Do-while and do-until.
        r#"
        let i = 0; do { i += 2 } while i < 7;
        let j = 10; do { j -= 3 } until j < 0;
        [i, j]
        "#,
        // Loop with a break value, break value from a while.
        r#"
        let i = 0;
        let v = loop { i += 1; if i > 3 { break i * 10; } };
        let w = while i < 100 { i += 7; if i % 5 == 0 { break i; } };
        [v, w, i]
        "#,
        // Short-circuiting && and || with side effects.
        r#"
        let a = log(1) > 0 && log(2) < 0 && log(3) > 0;
        let b = log(4) < 0 || log(5) > 0 || log(6) > 0;
        let c = (log(7) > 0 || log(8) > 0) && !(log(9) < 0 && log(10) > 0);
        [a, b, c]
        "#,
        // ?? chains with side effects.
        r#"
        let a = (); let m = #{x: ()}; let z = 0;
        [a ?? m.x ?? m.y ?? 5, a ?? log(1), m.x ?? log(7), z ?? log(8), a ?? m.x ?? a]
        "#,
        // Switch without guards, as an expression, with ranges and a default.
        r#"
        let out = [];
        for x in [1, 2, 3, 7, "a", 10, 'c'] {
            out.push(switch x { 1 => "one", 2 | 3 => "few", 5..=9 => "some", "a" => "letter", _ => "many" });
        }
        out
        "#,
        // Switch with guards on values and ranges, guards with side effects.
        r#"
        let out = [];
        for x in 0..8 {
            out.push(switch x {
                1 if out.len() > 5 => "never",
                1 if log(x) == 1 => "guarded",
                7 if log(x) > 6 => "big",
                2..5 if x % 2 == 0 => "even-range",
                2..5 => "odd-range",
                _ => x
            });
        }
        out
        "#,
        // Switch as a statement with blocks, on a computed subject, without a default.
        r#"
        let total = 0; let xs = [1, 2, 3];
        for i in 0..4 {
            switch xs.len() - i { 3 => { total += 100; } 1 => { total += 1; if i > 2 { total *= 2; } } }
        }
        total
        "#,
        // type_of in function and method style.
        r#"
        let i = 1; let s = "s"; let a = []; let m = #{}; let u = (); let f = 1.5; let c = 'c';
        [type_of(i), type_of(s), type_of(a), type_of(m), type_of(u), type_of(f), type_of(c),
         a.type_of(), type_of(m.x ?? 1), type_of(m.x)]
        "#,
        // Array reads, negative indices, computed indices.
        r#"
        let a = [1, 2, 3]; let i = 1;
        [a[0], a[i], a[-1], a[i + 1], a[a[0]], [4, 5, 6][i], a[-i]]
        "#,
        // Nested array reads in nested loops.
        r#"
        let g = [[1, 2], [3, 4]]; let s = 0;
        for i in 0..2 { for j in 0..2 { s += g[i][j] * (i + 1) + g[j][i]; } }
        [s, g[1][0], g[g[0][0]][1]]
        "#,
        // Map reads, through indexing and properties.
        r#"
        let m = #{a: 1, b: #{c: [5, 6]}}; let k = "a";
        [m[k], m["b"]["c"][1], m.b.c[0], m.b["c"][1], m["zz"], m[k + ""], m.b.c[m.a]]
        "#,
        // String and bit-field reads.
        r#"
        let s = "héllo"; let i = 1; let n = 10;
        [s[0], s[i], s[-1], n[1], n[0], n[i], "abc"[i]]
        "#,
        // Writes and compound assignments through indexes and properties.
        r#"
        let a = [1, 2, 3]; let i = 0;
        a[i] = 10; a[1] += 5; a[-1] *= 2; a[i + 1] -= a[i];
        let m = #{}; let k = "x";
        m[k] = 1; m[k] += 1; m.y = [1]; m.y[0] = 9; m.y[i] += 1;
        m["z"] = #{w: 1}; m.z.w += 1; m["z"]["w"] += 1; m.z["w"] *= 10;
        let n = 0; n[2] = true; n[i] = true;
        [a, m, n]
        "#,
        // Nested writes in nested loops.
        r#"
        let g = [[0, 0], [0, 0]];
        for i in 0..2 { for j in 0..2 { g[i][j] = i * 2 + j; g[i][j] += 1; g[j][i] *= 2; } }
        g
        "#,
        // Method calls through chains mutate in place; through a call's argument they do not.
        r#"
        let o = #{b: [1, 2]}; let k = 0;
        o.b[k] = 7; o.b.push(3); o.b[k + 1] = o.b[k].to_string();
        let arr = [[1], [2]];
        arr[0].push(5); arr[k].push(6); arr[k + 1].pop();
        push(arr[0], 99); push(arr, [8]);
        [o, arr, arr[0].len(), o.b.len()]
        "#,
        // Compound assignment with index reads on the right.
        r#"
        let a = [1, 2, 3]; let t = 0;
        for i in 0..3 { t += a[i] * a[2 - i]; t -= a[-1]; }
        t
        "#,
        // Try/catch: a throw, a failing index read, a branch in the catch block.
        r#"
        let r = [];
        try { r.push(1); throw 42; r.push(2); } catch (e) { if e == 42 { r.push(e) } else { r.push(0) } }
        try { let a = [1]; let i = 5; r.push(a[i]); } catch { r.push("oob") }
        try { let m = #{}; r.push(m.x ?? "none"); } catch { r.push("never") }
        r
        "#,
        // Closures: capture, branch and index inside (bodies are not rewritten, calls are).
        r#"
        let k = 3;
        let f = |x| if x > k { x } else { k };
        let g = |a, i| a[i];
        let h = |x| x ?? k;
        let r = [f.call(1), f.call(5), g.call([7, 8], 1), h.call(()), h.call(2), [1, 2, 3].filter(|v| v > 1 && v < 3)];
        if r[0] > 2 { r } else { [] }
        "#,
        // Script functions with branches, early return, loops; called from branches.
        r#"
        fn classify(x) {
            if x < 0 { return "neg"; }
            if x == 0 { "zero" } else if x < 10 { "small" } else { "big" }
        }
        fn sum_odd(a) { let s = 0; for v in a { if v % 2 == 0 { continue; } s += v; } s }
        let out = [];
        for x in [-1, 0, 5, 50] { if classify(x) != "big" { out.push(classify(x)) } }
        [out, sum_odd([1, 2, 3, 4, 5]), if sum_odd([1]) == 1 { "one" } else { "other" }]
        "#,
        // Break and continue in nested loops; early return at top level.
        r#"
        let found = ();
        for row in [[1, 2], [3, 4], [5, 6]] {
            for v in row { if v == 2 { continue; } if v == 3 { found = v; break; } }
            if found != () { break; }
        }
        let n = 0;
        for i in 0..10 { if i > 5 && found == 3 { return [found, n]; } n += i; }
        "unreachable"
        "#,
        // Statement expressions, if and switch as values, blocks.
        r#"
        let x = 5;
        let y = if x > 3 { "big" } else { "small" };
        let z = { let t = x * 2; if t > 5 { t } else { 0 } };
        let w = switch y { "big" => { let q = [1, 2]; q[1] } _ => 0 };
        [y, z, w, { x > 1 && z > 1 }]
        "#,
        // Interpolated strings, array and map literals holding reads.
        r#"
        let a = [1, 2]; let m = #{k: "v"}; let i = 1;
        [`${a[i]}-${m["k"]}-${a[0] ?? 0}-${if i > 0 { "p" } else { "n" }}`, #{x: a[0], y: [a[i], m.k, m["k"]]}]
        "#,
        // Element assignments with computed keys (plain and compound), interpolation of every
        // kind of value.
        r#"
        let m = #{}; let a = [1, 2, 3]; let k = "x"; let i = 1;
        m[k] = 1; m[k] += 2; m[`y${i}`] = a[i]; a[i] = 5; a[i - 2] += 1; m[k + "2"] = a;
        m["z"] = `${m[k]}-${a}-${#{q: 1}}-${()}-${1.5}-${'c'}-${k}`;
        [m, a]
        "#,
        // Null-safe access.
        r#"
        let m = #{a: ()}; let n = (); let i = 0;
        [m.a?.b, n?[0], n?[i], m?["a"], m["a"] ?? "d", m?.a ?? "e"]
        "#,
        // Many variables and shadowing, to check cached variable offsets.
        r#"
        let a = 1; let b = [2]; let c = #{d: 3};
        let out = [];
        for i in 0..3 {
            let a = a + i; let e = b[0] + a;
            if e > 3 { let b = [e]; out.push(b[0] + c.d); } else { let c = #{d: e}; out.push(c["d"]); }
            let f = if a > 1 && e < 10 { a } else { e };
            out.push(f);
        }
        let g = a ?? b;
        [out, a, b, c, g]
        "#,
        // Methods with `this`, called through chains.
        r#"
        fn inc(n) { this.v += n; if this.v > 3 { this.v = 0 } }
        let o = #{v: 1}; let os = [#{v: 1}, #{v: 2}]; let i = 1;
        o.inc(2); o.inc(2); os[0].inc(3); os[0].inc(os[0].v); os[i].inc(os[i - 1].v);
        [o, os]
        "#,
        // The `in` operator, comparisons and arithmetic over reads.
        r#"
        let a = [1, 2, 3]; let m = #{k: 1}; let i = 0;
        [a[i] in a, "k" in m, a[i] == m.k, a[i + 1] > a[i] && a[i + 2] > a[i + 1], !(a[0] > 1)]
        "#,
    ];

    /// A test engine with the wrappers registered as their plain meaning, and a `log` function.
    pub(crate) fn plain_engine(log: Arc<Mutex<Vec<String>>>) -> Engine {
        let mut engine = Engine::new();
        for name in [COND, UNLIKELY, COND_LOOSE, UNLIKELY_LOOSE] {
            engine.register_fn(name, |x: Dynamic| -> Result<bool, Box<EvalAltResult>> {
                x.as_bool()
                    .map_err(|typ| format!("condition is {typ}, not bool").into())
            });
        }
        engine.register_fn(VALUE, |x: Dynamic| x);
        // Indexing by Rhai itself, so that arrays, maps, strings, bit fields and errors behave
        // exactly as in the original script.
        let read = Arc::new(Engine::new_raw().compile("c[k]").unwrap());
        engine.register_fn(
            INDEX,
            move |ctx: NativeCallContext,
                  container: Dynamic,
                  key: Dynamic|
                  -> Result<Dynamic, Box<EvalAltResult>> {
                let mut scope = Scope::new();
                scope.push("c", container);
                scope.push("k", key);
                ctx.engine().eval_ast_with_scope(&mut scope, &read)
            },
        );
        engine.register_fn(KEY, |_: &mut Dynamic, key: Dynamic| key);
        engine.register_fn(INTERPOLATE, plain_interpolate);
        engine.register_fn(MARK, || 0 as rhai::INT);
        engine.register_fn(SETTLE, |_: rhai::INT, x: Dynamic| x);
        engine.register_fn("log", move |x: Dynamic| {
            log.lock().unwrap().push(x.to_string());
            x
        });
        engine
    }

    /// Joins an interpolation's pieces as Rhai does: strings as they are, anything else
    /// through `to_string`.
    fn plain_interpolate(ctx: NativeCallContext, items: rhai::Array) -> String {
        items
            .into_iter()
            .map(|mut item| {
                if item.is_string() {
                    return item.to_string();
                }
                ctx.call_native_fn_raw(rhai::FUNC_TO_STRING, true, &mut [&mut item])
                    .map(|s| s.to_string())
                    .unwrap_or_else(|_| item.to_string())
            })
            .collect()
    }

    /// The result (or error) of running `ast` on a fresh engine, and what it logged.
    fn run(ast: &AST) -> (Result<String, String>, Vec<String>) {
        let log = Arc::new(Mutex::new(Vec::new()));
        let engine = plain_engine(log.clone());
        let result = engine
            .eval_ast::<Dynamic>(ast)
            .map(|value| format!("{value:?}"))
            .map_err(|err| err.to_string());
        let log = log.lock().unwrap().clone();
        (result, log)
    }

    #[test]
    fn rewriting_keeps_the_meaning_of_every_corpus_script() {
        for level in [
            OptimizationLevel::None,
            OptimizationLevel::Simple,
            OptimizationLevel::Full,
        ] {
            let mut engine = plain_engine(Arc::default());
            engine.set_optimization_level(level);
            for script in CORPUS {
                let ast = engine.compile(script).unwrap();
                let rewritten = rewrite(&ast);
                // Every script has sites to wrap, so that the comparison below means something
                // (at full optimization, calls of `log` on constants are folded away).
                if level != OptimizationLevel::Full {
                    assert_ne!(
                        format!("{:?}", rewritten.statements()),
                        format!("{:?}", ast.statements()),
                        "{level:?} {script}"
                    );
                }
                let original = run(&ast);
                assert!(original.0.is_ok(), "{level:?} {script}: {original:?}");
                assert_eq!(run(&rewritten), original, "{level:?} {script}");
            }
        }
    }

    #[test]
    fn rewriting_changes_the_ast() {
        let engine = Engine::new();
        let ast = engine.compile("let x = 1; if x > 0 { 1 }").unwrap();
        let rewritten = rewrite(&ast);
        assert!(format!("{:?}", rewritten.statements()).contains(COND));
        assert!(!format!("{:?}", ast.statements()).contains(COND));
    }

    /// How often each wrapper was called while running a rewritten script.
    #[derive(Debug, PartialEq, Eq)]
    struct Calls {
        cond: usize,
        value: usize,
        index: usize,
    }

    /// Runs `script` rewritten on an engine whose wrappers count their calls.
    fn count(script: &str) -> Calls {
        let counters: [Arc<AtomicUsize>; 3] = Default::default();
        let mut engine = Engine::new();
        let [cond, value, index] = counters.clone();
        // An unlikely condition is a condition: counted as one.
        for name in [COND, UNLIKELY, COND_LOOSE, UNLIKELY_LOOSE] {
            let cond = Arc::clone(&cond);
            engine.register_fn(
                name,
                move |x: Dynamic| -> Result<bool, Box<EvalAltResult>> {
                    cond.fetch_add(1, Ordering::Relaxed);
                    x.as_bool()
                        .map_err(|typ| format!("not a bool: {typ}").into())
                },
            );
        }
        let key = Arc::clone(&value);
        engine.register_fn(VALUE, move |x: Dynamic| {
            value.fetch_add(1, Ordering::Relaxed);
            x
        });
        // The key of an element assignment is a value wrapper: counted as one.
        engine.register_fn(KEY, move |_: &mut Dynamic, x: Dynamic| {
            key.fetch_add(1, Ordering::Relaxed);
            x
        });
        engine.register_fn(INTERPOLATE, plain_interpolate);
        engine.register_fn(MARK, || 0 as rhai::INT);
        engine.register_fn(SETTLE, |_: rhai::INT, x: Dynamic| x);
        engine.register_fn(INDEX, move |container: &mut Dynamic, key: Dynamic| {
            index.fetch_add(1, Ordering::Relaxed);
            let array = container.read_lock::<rhai::Array>().expect("an array");
            array[usize::try_from(key.as_int().expect("an integer")).expect("in range")].clone()
        });
        let ast = engine.compile(script).unwrap();
        engine
            .run_ast(&rewrite(&ast))
            .unwrap_or_else(|err| panic!("{script}: {err}"));
        let [cond, value, index] = counters.map(|c| c.load(Ordering::Relaxed));
        Calls { cond, value, index }
    }

    #[test]
    fn each_rule_calls_its_wrapper() {
        #[rustfmt::skip]
        let cases: &[(&str, [usize; 3])] = &[
            // (script, [COND, VALUE, INDEX] calls)
            ("let x = 5; if x > 1 { x }", [1, 0, 0]),
            ("let x = 5; if x > 1 { 1 } else if x > 2 { 2 }", [1, 0, 0]),
            ("let x = 0; if x > 1 { 1 } else if x < 2 { 2 }", [2, 0, 0]),
            ("let i = 0; while i < 3 { i += 1 }", [4, 0, 0]),
            ("let i = 0; do { i += 1 } while i < 3", [3, 0, 0]),
            ("let i = 0; do { i += 1 } until i >= 3", [3, 0, 0]),
            ("let i = 0; loop { i += 1; if i > 2 { break } }", [3, 0, 0]),
            ("let a = true; let b = true; a && b", [2, 0, 0]),
            ("let a = true; let b = false; a || b", [1, 0, 0]),
            ("let a = false; let b = true; a && b", [1, 0, 0]),
            ("let a = true; let b = true; if a && b { 1 }", [2, 0, 0]),
            ("let a = (); let b = (); let c = 3; a ?? b ?? c", [0, 2, 0]),
            ("let a = 1; let b = 2; a ?? b", [0, 1, 0]),
            ("let x = 1; let y = 1; switch x { 1 if y > 0 => 1, _ => 2 }", [1, 1, 0]),
            ("let x = 2; let y = 1; switch x { 1 if y > 0 => 1, _ => 2 }", [0, 1, 0]),
            ("let x = 3; switch x { 1..5 if x > 2 => 1, _ => 2 }", [1, 1, 0]),
            ("let x = 1; type_of(x)", [0, 1, 0]),
            ("let arr = [1, 2]; arr[1] + 0", [0, 0, 1]),
            ("let arr = [[1], [2]]; let i = 1; arr[i][0]", [0, 0, 2]),
            ("let arr = [1, 2]; let i = 1; arr[i] = 5;", [0, 1, 0]),
            ("let arr = [1, 2]; arr[1] = 5;", [0, 0, 0]),
            ("let arr = [1, 2]; let i = 1; arr[i] += 5;", [0, 1, 0]),
            ("let g = [[1]]; let i = 0; g[i][i] = 5;", [0, 2, 0]),
            ("let m = #{b: [1]}; let k = 0; m.b[k]", [0, 1, 0]),
            ("let m = #{b: [1]}; let k = 0; m.b[k] = 2;", [0, 1, 0]),
            ("let arr = [[1]]; let i = 0; arr[i].len()", [0, 1, 0]),
            ("let arr = [1, 2]; let i = 0; arr[arr[i]]", [0, 0, 2]),
            ("let arr = [1, 2]; let i = 0; arr[arr[i]] = 3;", [0, 1, 1]),
            ("let arr = [1, 2]; `${arr[0]}`", [0, 0, 1]),
            ("let arr = [1, 2]; #{a: [arr[0]]}", [0, 0, 1]),
            ("let arr = [1, 2]; let y = 0; for x in 0..3 { if arr[0] > x { y += 1 } }", [3, 0, 3]),
            ("let x = 1; let y = if x > 0 { if x > 1 { 1 } else { 2 } } else { 3 };", [2, 0, 0]),
            ("let r = 0; try { throw 1 } catch (e) { if e == 1 { r = 1 } }", [1, 0, 0]),
            ("let x = 1; fn f(x) { if x > 1 { 1 } else { 2 } } f(x)", [0, 0, 0]),
            ("let k = 1; let f = |x| if x > k { 1 } else { 2 }; f.call(k)", [0, 0, 0]),
        ];
        for (script, [cond, value, index]) in cases {
            let expected = Calls {
                cond: *cond,
                value: *value,
                index: *index,
            };
            assert_eq!(count(script), expected, "{script}");
        }
    }

    /// The names of the functions a rewritten script calls.
    fn called(script: &str) -> Vec<String> {
        let ast = Engine::new_raw().compile(script).unwrap();
        let mut names = Vec::new();
        rewrite(&ast).walk(&mut |path: &[rhai::ASTNode]| {
            if let Some(rhai::ASTNode::Expr(rhai::Expr::FnCall(call, _))) = path.last() {
                names.push(call.name.to_string());
            }
            true
        });
        names
    }

    /// A guard whose branch leaves (throws, returns, breaks) is guessed not taken; a branch
    /// that goes on, or an `if` both of whose branches leave, keeps the usual guess.
    #[test]
    fn guards_that_leave_are_guessed_not_taken() {
        let unlikely = |script: &str| {
            called(script)
                .iter()
                .filter(|n| *n == UNLIKELY || *n == UNLIKELY_LOOSE)
                .count()
        };
        assert_eq!(unlikely("let x = 1; if x == () { throw 1; } x"), 1);
        assert_eq!(
            unlikely("let a = 1; let b = 2; loop { if a > 1 && b > 1 { break; } a += 1; }"),
            2
        );
        assert_eq!(
            unlikely("fn f(x) { x } let x = 1; if f(x) > 0 { return 1; } 2"),
            1
        );
        assert_eq!(unlikely("let x = 1; if x > 0 { x += 1; }"), 0);
        assert_eq!(
            unlikely("let x = 1; if x > 0 { throw 1; } else { throw 2; }"),
            0
        );
        assert_eq!(
            unlikely("let i = 0; while i < 3 { i += 1; if i == 2 { continue; } }"),
            0
        );
        // A branch that makes a write, once the rewrite knows which tools write.
        let ast = Engine::new_raw()
            .compile("fn save(x) { x } let x = 1; if x > 0 { let y = [save(x)]; }")
            .unwrap();
        let effectful = std::collections::HashSet::from(["save".to_string()]);
        let mut names = Vec::new();
        super::rewrite_with(&ast, &effectful).walk(&mut |path: &[rhai::ASTNode]| {
            if let Some(rhai::ASTNode::Expr(rhai::Expr::FnCall(call, _))) = path.last() {
                names.push(call.name.to_string());
            }
            true
        });
        assert!(names.iter().any(|n| n == UNLIKELY), "{names:?}");
    }

    /// Which conditions of `script` are guessed not taken, when `save` is a non-read tool.
    fn unlikely_with_a_write(script: &str) -> usize {
        let ast = Engine::new_raw()
            .compile(format!("fn save(x) {{ x }} {script}"))
            .unwrap();
        let effectful = std::collections::HashSet::from(["save".to_string()]);
        let mut count = 0;
        super::rewrite_with(&ast, &effectful).walk(&mut |path: &[rhai::ASTNode]| {
            if let Some(rhai::ASTNode::Expr(rhai::Expr::FnCall(call, _))) = path.last() {
                count += usize::from(call.name == UNLIKELY || call.name == UNLIKELY_LOOSE);
            }
            true
        });
        count
    }

    /// A branch is the unlikely one when every way through it writes or leaves and some way
    /// through the other does not: a write as a statement, inside `try`, or down an `else if`
    /// chain whose last `else` does nothing.
    #[test]
    fn a_branch_that_always_writes_is_guessed_not_taken_when_the_other_may_not() {
        assert_eq!(unlikely_with_a_write("let x = 1; if x > 0 { save(x); }"), 1);
        assert_eq!(
            unlikely_with_a_write("let x = 1; if x > 0 { try { save(x); } catch { } }"),
            1
        );
        // Both conditions of the chain: the last `else` is the way that does not write.
        assert_eq!(
            unlikely_with_a_write("let x = 1; if x > 2 { save(x); } else if x > 1 { save(1); }"),
            2
        );
        // Every way writes: the usual guess.
        assert_eq!(
            unlikely_with_a_write("let x = 1; if x > 2 { save(x); } else { save(1); }"),
            0
        );
        // A branch that may write (its own `if`) is not the unlikely one; its inner `if` is.
        assert_eq!(
            unlikely_with_a_write("let x = 1; if x > 2 { let y = x; if y > 3 { save(y); } }"),
            1
        );
    }

    /// `&&` and `||` kept as values are settled: a decision inside them is marked, so that a
    /// guessed operand gives an unknown rather than a known `true`; as conditions they are not.
    #[test]
    fn logic_kept_as_a_value_is_settled_and_logic_decided_on_is_not() {
        let names =
            called("let a = 1; let ok = a > 0 && a < 3; if a > 0 || a < 3 { ok } else { false }");
        assert_eq!(names.iter().filter(|n| *n == MARK).count(), 1, "{names:?}");
        assert_eq!(
            names.iter().filter(|n| *n == SETTLE).count(),
            1,
            "{names:?}"
        );
        let conds = names.iter().filter(|n| *n == COND || *n == COND_LOOSE);
        assert_eq!(conds.count(), 4, "{names:?}");
    }

    /// A guess decides its condition when proving it wrong proves the condition wrong: a
    /// condition of its own, or an operand guessed `true` under `&&`s only, or `false` under
    /// `||`s only. Every other guess is loose, and so is every guess in logic kept as a value.
    #[test]
    fn only_guesses_that_decide_their_condition_are_recorded() {
        let kinds = |script: &str| -> Vec<String> {
            called(script)
                .into_iter()
                .filter(|n| [COND, UNLIKELY, COND_LOOSE, UNLIKELY_LOOSE].contains(&n.as_str()))
                .collect()
        };
        let (c, u, cl, ul) = (COND, UNLIKELY, COND_LOOSE, UNLIKELY_LOOSE);
        assert_eq!(kinds("let a = 1; if a > 0 { 1 }"), [c]);
        assert_eq!(
            kinds("let a = 1; let b = 2; if a > 0 && b > 0 { 1 }"),
            [c, c]
        );
        assert_eq!(
            kinds("let a = 1; let b = 2; if a > 0 || b > 0 { 1 }"),
            [cl, cl]
        );
        assert_eq!(
            kinds("let a = 1; let b = 2; let c = 3; if (a > 0 || b > 0) && c > 0 { 1 }"),
            [cl, cl, c]
        );
        assert_eq!(kinds("let a = 1; if a > 0 { return 1; } 2"), [u]);
        assert_eq!(
            kinds("let a = 1; let b = 2; if a > 0 && b > 0 { return 1; } 2"),
            [ul, ul]
        );
        assert_eq!(
            kinds("let a = 1; let b = 2; if a > 0 || b > 0 { return 1; } 2"),
            [u, u]
        );
        assert_eq!(kinds("let a = 1; while a < 3 { a += 1; }"), [c]);
        assert_eq!(
            kinds("let a = 1; let b = 2; let ok = a > 0 && b > 0;"),
            [cl, cl]
        );
    }

    #[test]
    fn wrappers_keep_the_position_of_what_they_wrap() {
        let mut engine = Engine::new();
        for name in [COND, UNLIKELY, COND_LOOSE, UNLIKELY_LOOSE] {
            engine.register_fn(name, |x: Dynamic| -> Result<bool, Box<EvalAltResult>> {
                x.as_bool()
                    .map_err(|typ| format!("not a bool: {typ}").into())
            });
        }
        let ast = engine.compile("let x = 1;\nif x { 1 }").unwrap();
        let original = engine.eval_ast::<Dynamic>(&ast).unwrap_err();
        let rewritten = engine.eval_ast::<Dynamic>(&rewrite(&ast)).unwrap_err();
        assert_eq!(original.position(), Position::new(2, 4));
        assert_eq!(rewritten.position(), original.position());
    }

    #[test]
    fn rewriting_keeps_functions_and_source() {
        let engine = Engine::new();
        let mut ast = engine.compile("fn f(x) { x + 1 } f(1)").unwrap();
        ast.set_source("script.rhai");
        let rewritten = rewrite(&ast);
        assert_eq!(rewritten.source(), Some("script.rhai"));
        assert_eq!(rewritten.iter_functions().count(), 1);
        assert_eq!(engine.eval_ast::<i64>(&rewritten).unwrap(), 2);
    }
}
