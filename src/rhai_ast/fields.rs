//! Missing fields: where a script reads a map's field without handling the `()` a missing one
//! gives, and the hook that tells the run when such a read finds the field missing.
//!
//! # How a site is known at run time
//!
//! Rhai calls `Engine::on_map_missing_property` with the map and the name only, for reads and
//! for assignments to a new key alike, and the callback replaces Rhai's own handling: it must
//! insert the key for an assignment and give `()` for a read, so it must know which access it
//! is. The name it gets is the string of the AST node itself (a property's name, a literal
//! key), shared, not copied: with the compiler's string interner off (see
//! [`compiler_for_sites`]), each node has a string of its own, and its address names the site.
//!
//! A computed key (`m[k]`) names no site. Its reads need nothing (Rhai gives `()`); its
//! assignments are marked instead: in the main body, the key of such an assignment is wrapped
//! in a call ([`MARK_KEY`]) that hands back a fresh copy of the key and keeps it, and the
//! callback takes a missing key at that address as an assignment. Function and closure bodies
//! cannot be rewritten (Rhai 1.27 does not export the type of a body): a script that assigns to
//! a computed key inside one is not watched at all ([`FieldPlan::new`] gives `None`), so that
//! no assignment is ever taken for a read.
//!
//! # What "handled right there" covers
//!
//! A read is handled, and never reported, when its value goes straight into one of: the left
//! side of `??`, a comparison with `()` (`== ()`, `!= ()`), `type_of(..)` (or `.type_of()`), a
//! `?.` or `?[` that follows it, or a variable (`let v = m.f;`, `v = m.f;`) that the script
//! tests in one of those ways somewhere. `"f" in m` guards are the script's own: a guarded read
//! does not happen when the field is missing.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use rhai::{
    ASTFlags, ASTNode, BinaryExpr, Dynamic, Engine, Expr, FnCallExpr, ImmutableString, Position,
    Stmt, StmtBlock, AST,
};

use super::{template, with_main_body};

/// The function a marked assignment's key goes through.
pub(crate) const MARK_KEY: &str = "__ts_assigned_key";

/// A site that reads a field by name: a property (`m.f`) or a literal key (`m["f"]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FieldSite {
    /// The field's name.
    pub(crate) name: String,
    /// Where the name is written.
    pub(crate) position: Position,
}

/// What an access at a known site is.
#[derive(Clone, Copy, Debug)]
enum Access {
    /// An assignment (`m.f = v`, `m.f += v`, `m["f"] = v`): a missing key is inserted.
    Assign,
    /// A read that is reported when the field is missing: the index of its site.
    Report(u32),
}

/// The sites of a script to watch, and the script to run for it.
#[derive(Debug)]
pub(crate) struct FieldPlan {
    /// Known sites by the address of their name's string.
    by_address: HashMap<usize, Access>,
    /// The reported sites, by index.
    sites: Vec<FieldSite>,
    /// The script with the keys of its computed assignments marked, when it has any.
    marked: Option<AST>,
}

impl FieldPlan {
    /// The plan for `ast`, compiled by an engine from [`compiler_for_sites`]: its unhandled
    /// field reads, but those whose name `exempt` says may be missing. `None` when there is
    /// nothing to report, or when the script cannot be watched exactly (it assigns to a
    /// computed key inside a function or closure).
    pub(crate) fn new(ast: &AST, exempt: &dyn Fn(&str) -> bool) -> Option<FieldPlan> {
        let scan = Scan::of(ast);
        if scan.reads.iter().all(|r| r.handled || exempt(&r.site.name)) {
            return None;
        }
        if scan.computed_assignments_in_functions {
            return None;
        }
        let marked = (scan.computed_assignments_in_main > 0).then(|| mark_main_body(ast));
        if let Some(marked) = &marked {
            // Every computed assignment of the main body must now go through the mark: one
            // that the rewrite missed would be taken for a read and lose its value.
            let rescan = Scan::of(marked);
            if rescan.computed_assignments_in_main > 0 || rescan.computed_assignments_in_functions {
                return None;
            }
        }
        let mut by_address = HashMap::new();
        let mut sites = Vec::new();
        for address in scan.assigned {
            by_address.insert(address, Access::Assign);
        }
        for read in scan.reads {
            if read.handled || exempt(&read.site.name) {
                continue;
            }
            let index = u32::try_from(sites.len()).unwrap_or(u32::MAX);
            by_address.insert(read.address, Access::Report(index));
            sites.push(read.site);
        }
        Some(FieldPlan {
            by_address,
            sites,
            marked,
        })
    }

    /// The script to run instead of the compiled one, when its assignments were marked.
    pub(crate) fn marked(&self) -> Option<&AST> {
        self.marked.as_ref()
    }

    /// The reported site `index`.
    pub(crate) fn site(&self, index: u32) -> Option<&FieldSite> {
        self.sites.get(index as usize)
    }
}

/// A compiler whose AST gives each site a string of its own: `engine` with its string
/// interner off (which only shares equal strings between nodes to save memory).
pub(crate) fn compiler_for_sites(engine: &mut Engine) {
    engine.set_max_strings_interned(0);
}

/// Watches `engine`'s evaluation of the plan's script: `on_missing` is called with the site
/// and the map whenever a reported read finds its field missing. Assignments to a missing key
/// insert it and reads of one give `()`, as without the hook.
pub(crate) fn watch(
    engine: &mut Engine,
    plan: Arc<FieldPlan>,
    on_missing: impl Fn(u32, &rhai::Map) + Send + Sync + 'static,
) {
    // The key of the latest marked assignment, kept alive so that no other string can have
    // its address while it is the mark.
    let mark: Arc<Mutex<Option<ImmutableString>>> = Arc::default();
    let marking = Arc::clone(&mark);
    engine.register_fn(MARK_KEY, move |key: Dynamic| -> Dynamic {
        let fresh = key
            .read_lock::<ImmutableString>()
            .map(|text| ImmutableString::from(text.as_str()));
        match fresh {
            Some(fresh) => {
                *marking.lock().unwrap_or_else(|e| e.into_inner()) = Some(fresh.clone());
                fresh.into()
            }
            None => key,
        }
    });
    engine.on_map_missing_property(move |map, name, _| {
        let address = name.as_ptr() as usize;
        let assign = match plan.by_address.get(&address) {
            Some(Access::Assign) => true,
            Some(Access::Report(site)) => {
                on_missing(*site, map);
                false
            }
            None => mark
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .is_some_and(|m| m.as_ptr() as usize == address),
        };
        if !assign {
            return Ok(rhai::Target::TempValue(Dynamic::UNIT));
        }
        // What Rhai does without the hook: insert `()`, which the assignment then replaces.
        map.insert(name.into(), Dynamic::UNIT);
        match map.get_mut(name) {
            Some(slot) => slot.try_into(),
            None => Ok(rhai::Target::TempValue(Dynamic::UNIT)),
        }
    });
}

/// A field read found by the scan.
struct Read {
    site: FieldSite,
    address: usize,
    handled: bool,
    origin: Option<Origin>,
}

/// Where a read's map comes from, when the script says it plainly: a call's result, read
/// through fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Origin {
    /// The function called: `get_customer` in `let c = get_customer(#{..}); c.email`.
    pub(crate) function: String,
    /// The map is an item of the result (`for c in list_customers() { c.email }`).
    pub(crate) each: bool,
    /// The fields read on the way, before this one (`["address"]` in `c.address.city`).
    pub(crate) path: Vec<String>,
}

/// An unhandled read of a field of a call's result (see [`Origin`]), for `check`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ResultRead {
    pub(crate) site: FieldSite,
    pub(crate) origin: Origin,
}

/// The unhandled reads of fields of calls' results in `ast`: the map is the call itself
/// (`f(x).a`), or a variable bound once in the whole script (and never assigned) to a call
/// (`let v = f(x);`) or to each item of one (`for v in f(x)`).
pub(crate) fn result_reads(ast: &AST) -> Vec<ResultRead> {
    Scan::of(ast)
        .reads
        .into_iter()
        .filter(|r| !r.handled)
        .filter_map(|r| {
            r.origin.map(|origin| ResultRead {
                site: r.site,
                origin,
            })
        })
        .collect()
}

/// The call a plain call expression makes, by name (not a method, not an operator).
fn called(expr: &Expr) -> Option<&str> {
    match expr {
        Expr::FnCall(call, _) if !call.is_operator_call() && !call.is_qualified() => {
            Some(call.name.as_str())
        }
        _ => None,
    }
}

/// What a scan of a script found.
#[derive(Default)]
struct Scan {
    reads: Vec<Read>,
    /// Addresses of the names of assignments to a named field.
    assigned: Vec<usize>,
    /// Assignments to a computed key (or a literal whose string other nodes share) in the
    /// main body, not marked.
    computed_assignments_in_main: usize,
    /// The same inside a function or closure.
    computed_assignments_in_functions: bool,
}

/// One step of a dot/index chain: the node that names what it accesses, and how.
struct Step<'a> {
    node: &'a Expr,
    dot: bool,
    /// The next step is `?.` or `?[`: a `()` here is handled.
    guarded: bool,
}

/// The steps of the chain rooted at `root` (a `Dot` or an `Index`), in order.
fn steps(root: &Expr) -> Vec<Step<'_>> {
    let (chain, flags, dot) = match root {
        Expr::Dot(chain, flags, _) => (chain, *flags, true),
        Expr::Index(chain, flags, _) => (chain, *flags, false),
        _ => return Vec::new(),
    };
    let mut out = Vec::new();
    let (mut rest, mut flags, mut dot) = (&chain.rhs, flags, dot);
    loop {
        if !dot && flags.intersects(ASTFlags::BREAK) {
            out.push(Step {
                node: rest,
                dot,
                guarded: false,
            });
            return out;
        }
        match rest {
            Expr::Dot(next, next_flags, _) | Expr::Index(next, next_flags, _) => {
                out.push(Step {
                    node: &next.lhs,
                    dot,
                    guarded: next_flags.intersects(ASTFlags::NEGATED),
                });
                dot = matches!(rest, Expr::Dot(..));
                flags = *next_flags;
                rest = &next.rhs;
            }
            leaf => {
                out.push(Step {
                    node: leaf,
                    dot,
                    guarded: false,
                });
                return out;
            }
        }
    }
}

/// Whether `expr` continues the chain of `parent` (rather than starting one of its own).
fn continues(parent: &ASTNode<'_>, expr: &Expr) -> bool {
    match parent {
        ASTNode::Expr(Expr::Dot(chain, ..)) => std::ptr::eq(&chain.rhs, expr),
        ASTNode::Expr(Expr::Index(chain, flags, _)) => {
            std::ptr::eq(&chain.rhs, expr) && !flags.intersects(ASTFlags::BREAK)
        }
        _ => false,
    }
}

/// Whether `expr`, a child of `parent`, has its `()` handled there; `tested` are the variables
/// the script tests for `()`.
fn handled_by(parent: Option<&ASTNode<'_>>, expr: &Expr, tested: &HashSet<String>) -> bool {
    match parent {
        Some(ASTNode::Expr(Expr::Coalesce(operands, ..))) => {
            operands.iter().rev().skip(1).any(|o| std::ptr::eq(o, expr))
        }
        Some(ASTNode::Expr(Expr::FnCall(call, _))) => tests_unit(call),
        Some(ASTNode::Stmt(Stmt::Var(var, ..))) => tested.contains(var.0.name.as_str()),
        Some(ASTNode::Stmt(Stmt::Assignment(assignment))) => {
            let BinaryExpr { lhs, rhs } = &assignment.1;
            std::ptr::eq(rhs, expr)
                && !assignment.0.is_op_assignment()
                && matches!(lhs, Expr::Variable(var, ..) if tested.contains(var.1.as_str()))
        }
        _ => false,
    }
}

/// Whether a call tests its operand for `()`: `x == ()`, `() != x`, `type_of(x)`.
fn tests_unit(call: &FnCallExpr) -> bool {
    match (call.name.as_str(), &call.args[..]) {
        ("==" | "!=", [a, b]) => matches!(a, Expr::Unit(..)) || matches!(b, Expr::Unit(..)),
        ("type_of", [_]) => true,
        _ => false,
    }
}

/// Strings a constant holds, by address.
fn constant_strings(value: &Dynamic, out: &mut HashMap<usize, usize>) {
    if let Some(text) = value.read_lock::<ImmutableString>() {
        *out.entry(text.as_ptr() as usize).or_default() += 1;
    } else if let Some(items) = value.read_lock::<rhai::Array>() {
        for item in items.iter() {
            constant_strings(item, out);
        }
    } else if let Some(map) = value.read_lock::<rhai::Map>() {
        for item in map.values() {
            constant_strings(item, out);
        }
    }
}

impl Scan {
    fn of(ast: &AST) -> Scan {
        let main: HashSet<usize> = ast
            .statements()
            .iter()
            .map(|s| s as *const Stmt as usize)
            .collect();
        // First: how many nodes hold each string, and which variables are tested for `()`.
        let mut holders: HashMap<usize, usize> = HashMap::new();
        let mut tested = HashSet::new();
        // Variables by name: how often bound, and to what call when bound once.
        let mut bindings: HashMap<String, (usize, Option<(String, bool)>)> = HashMap::new();
        let mut bind = |name: &str, to: Option<(String, bool)>| {
            let entry = bindings.entry(name.to_string()).or_insert((0, None));
            entry.0 += 1;
            entry.1 = to;
        };
        for def in ast.iter_fn_def() {
            for param in &def.params {
                bind(param, None);
            }
        }
        ast.walk(&mut |path: &[ASTNode]| {
            let parent = path.len().checked_sub(2).and_then(|i| path.get(i));
            match path.last() {
                Some(ASTNode::Stmt(Stmt::Var(var, ..))) => {
                    bind(&var.0.name, called(&var.1).map(|f| (f.to_string(), false)));
                }
                Some(ASTNode::Stmt(Stmt::For(for_loop, ..))) => {
                    let each = called(&for_loop.2.expr).map(|f| (f.to_string(), true));
                    bind(&for_loop.0.name, each);
                    if let Some(counter) = &for_loop.1 {
                        bind(&counter.name, None);
                    }
                }
                Some(ASTNode::Stmt(Stmt::Assignment(assignment))) => {
                    if let Expr::Variable(var, ..) = &assignment.1.lhs {
                        bind(&var.1, None);
                        bind(&var.1, None);
                    }
                }
                Some(ASTNode::Stmt(Stmt::TryCatch(flow, ..))) => {
                    if let Expr::Variable(var, ..) = &flow.expr {
                        bind(&var.1, None);
                    }
                }
                Some(ASTNode::Expr(Expr::StringConstant(text, _))) => {
                    *holders.entry(text.as_ptr() as usize).or_default() += 1;
                }
                Some(ASTNode::Expr(Expr::Property(property, _))) => {
                    *holders.entry(property.2.as_ptr() as usize).or_default() += 1;
                }
                Some(ASTNode::Expr(Expr::DynamicConstant(value, _))) => {
                    constant_strings(value, &mut holders);
                }
                Some(ASTNode::Expr(expr @ Expr::Variable(var, ..))) => {
                    let is_test = match parent {
                        Some(ASTNode::Expr(Expr::Coalesce(operands, ..))) => operands
                            .iter()
                            .rev()
                            .skip(1)
                            .any(|o| std::ptr::eq(o, *expr)),
                        Some(ASTNode::Expr(Expr::FnCall(call, _))) => tests_unit(call),
                        _ => false,
                    };
                    if is_test {
                        tested.insert(var.1.to_string());
                    }
                }
                _ => {}
            }
            true
        });
        let mut scan = Scan::default();
        ast.walk(&mut |path: &[ASTNode]| {
            let Some(ASTNode::Expr(root @ (Expr::Dot(..) | Expr::Index(..)))) = path.last()
            else {
                return true;
            };
            let parent = path.len().checked_sub(2).and_then(|i| path.get(i));
            if parent.is_some_and(|p| continues(p, root)) {
                return true;
            }
            let in_main = path
                .first()
                .is_some_and(|s| matches!(s, ASTNode::Stmt(s) if main.contains(&(*s as *const Stmt as usize))));
            let assigned = matches!(
                parent,
                Some(ASTNode::Stmt(Stmt::Assignment(a))) if std::ptr::eq(&a.1.lhs, *root)
            );
            let handled_value = handled_by(parent, root, &tested);
            let object = match root {
                Expr::Dot(chain, ..) | Expr::Index(chain, ..) => &chain.lhs,
                _ => return true,
            };
            let mut origin = match object {
                Expr::Variable(var, ..) => match bindings.get(var.1.as_str()) {
                    Some((1, Some((function, each)))) => Some(Origin {
                        function: function.clone(),
                        each: *each,
                        path: Vec::new(),
                    }),
                    _ => None,
                },
                other => called(other).map(|f| Origin {
                    function: f.to_string(),
                    each: false,
                    path: Vec::new(),
                }),
            };
            let steps = steps(root);
            let last = steps.len().saturating_sub(1);
            for (i, step) in steps.iter().enumerate() {
                let leaf = i == last;
                let next_is_type_of = matches!(
                    steps.get(i + 1).map(|s| s.node),
                    Some(Expr::MethodCall(call, _)) if call.name == "type_of" && call.args.is_empty()
                );
                let (name, address, position) = match (step.node, step.dot) {
                    (Expr::Property(property, position), true) => {
                        (&property.2, property.2.as_ptr() as usize, *position)
                    }
                    (Expr::StringConstant(text, position), false)
                        if holders.get(&(text.as_ptr() as usize)) == Some(&1) =>
                    {
                        (text, text.as_ptr() as usize, *position)
                    }
                    (Expr::FnCall(call, _), false) if call.name == MARK_KEY => continue,
                    (key, false) if never_a_key(key) => {
                        origin = None;
                        continue;
                    }
                    (Expr::MethodCall(..), _) | (_, true) => {
                        origin = None;
                        continue;
                    }
                    // A computed key, or a literal another node shares (a propagated
                    // constant): it names no site.
                    (_, false) => {
                        origin = None;
                        if leaf && assigned {
                            if in_main {
                                scan.computed_assignments_in_main += 1;
                            } else {
                                scan.computed_assignments_in_functions = true;
                            }
                        }
                        continue;
                    }
                };
                if leaf && assigned {
                    scan.assigned.push(address);
                    continue;
                }
                let handled = step.guarded || next_is_type_of || (leaf && handled_value);
                let read_origin = origin.clone().filter(|_| step.dot);
                if let Some(o) = &mut origin {
                    if step.dot {
                        o.path.push(name.to_string());
                    } else {
                        origin = None;
                    }
                }
                scan.reads.push(Read {
                    site: FieldSite {
                        name: name.to_string(),
                        position,
                    },
                    address,
                    handled,
                    origin: read_origin,
                });
            }
            true
        });
        scan
    }
}

/// The main body with the key of every assignment to a computed key wrapped in [`MARK_KEY`].
fn mark_main_body(ast: &AST) -> AST {
    let engine = Engine::new_raw();
    let call = template(&engine, &format!("{MARK_KEY}(x)"));
    let statements = ast
        .statements()
        .iter()
        .map(|stmt| {
            let mut stmt = stmt.clone();
            mark_stmt(&mut stmt, &call);
            stmt
        })
        .collect();
    with_main_body(ast, statements)
}

fn mark_block(block: &mut StmtBlock, call: &FnCallExpr) {
    for stmt in block.statements_mut().iter_mut() {
        mark_stmt(stmt, call);
    }
}

fn mark_stmt(stmt: &mut Stmt, call: &FnCallExpr) {
    match stmt {
        Stmt::If(flow, ..) | Stmt::While(flow, ..) | Stmt::Do(flow, ..) => {
            mark_expr(&mut flow.expr, call);
            mark_block(&mut flow.body, call);
            mark_block(&mut flow.branch, call);
        }
        Stmt::For(for_loop, ..) => {
            mark_expr(&mut for_loop.2.expr, call);
            mark_block(&mut for_loop.2.body, call);
        }
        Stmt::Switch(switch, ..) => {
            let (subject, cases) = &mut **switch;
            mark_expr(subject, call);
            for case in cases.expressions.iter_mut() {
                mark_expr(&mut case.lhs, call);
                mark_expr(&mut case.rhs, call);
            }
        }
        Stmt::Var(var, ..) => mark_expr(&mut var.1, call),
        Stmt::Assignment(assignment) => {
            mark_expr(&mut assignment.1.rhs, call);
            mark_chain(&mut assignment.1.lhs, call);
        }
        Stmt::FnCall(f, ..) => f.args.iter_mut().for_each(|a| mark_expr(a, call)),
        Stmt::Block(block) => mark_block(block, call),
        Stmt::TryCatch(flow, ..) => {
            mark_block(&mut flow.body, call);
            mark_block(&mut flow.branch, call);
        }
        Stmt::Expr(expr) => mark_expr(expr, call),
        Stmt::Return(Some(expr), ..) | Stmt::BreakLoop(Some(expr), ..) => mark_expr(expr, call),
        _ => {}
    }
}

fn mark_expr(expr: &mut Expr, call: &FnCallExpr) {
    match expr {
        Expr::InterpolatedString(items, ..) | Expr::Array(items, ..) => {
            items.iter_mut().for_each(|e| mark_expr(e, call));
        }
        Expr::Map(map, ..) => map.0.iter_mut().for_each(|(_, e)| mark_expr(e, call)),
        Expr::Stmt(block) => mark_block(block, call),
        Expr::FnCall(f, ..) | Expr::MethodCall(f, ..) => {
            f.args.iter_mut().for_each(|a| mark_expr(a, call));
        }
        Expr::And(operands, ..) | Expr::Or(operands, ..) | Expr::Coalesce(operands, ..) => {
            operands.iter_mut().for_each(|e| mark_expr(e, call));
        }
        Expr::Index(chain, ..) | Expr::Dot(chain, ..) => {
            mark_expr(&mut chain.lhs, call);
            mark_expr(&mut chain.rhs, call);
        }
        _ => {}
    }
}

/// Whether an index is a constant that no map takes as a key (an array's index, say): Rhai
/// refuses it before any hook runs.
fn never_a_key(expr: &Expr) -> bool {
    matches!(
        expr,
        Expr::IntegerConstant(..)
            | Expr::FloatConstant(..)
            | Expr::BoolConstant(..)
            | Expr::CharConstant(..)
            | Expr::Unit(..)
            | Expr::Array(..)
            | Expr::Map(..)
    )
}

/// The left side of an assignment: its last key, unless it is a property or a constant no map
/// takes, goes through the mark; the expressions inside it are visited as any.
fn mark_chain(lhs: &mut Expr, call: &FnCallExpr) {
    let (chain, flags, dot) = match lhs {
        Expr::Dot(chain, flags, _) => (chain, *flags, true),
        Expr::Index(chain, flags, _) => (chain, *flags, false),
        _ => return,
    };
    mark_expr(&mut chain.lhs, call);
    let (mut rest, mut flags, mut dot) = (&mut chain.rhs, flags, dot);
    loop {
        let breaks = !dot && flags.intersects(ASTFlags::BREAK);
        let next_dot = matches!(rest, Expr::Dot(..));
        if !breaks && matches!(rest, Expr::Dot(..) | Expr::Index(..)) {
            let (Expr::Dot(next, next_flags, _) | Expr::Index(next, next_flags, _)) = rest else {
                return;
            };
            mark_expr(&mut next.lhs, call);
            dot = next_dot;
            flags = *next_flags;
            rest = &mut next.rhs;
            continue;
        }
        let leaf = rest;
        mark_expr(leaf, call);
        if !dot && !never_a_key(leaf) {
            let position = leaf.position();
            let mut wrapper = call.clone();
            wrapper.args.clear();
            wrapper.args.push(leaf.take());
            *leaf = Expr::FnCall(Box::new(wrapper), position);
        }
        return;
    }
}
