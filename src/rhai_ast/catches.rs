//! The rewrite of `catch` blocks and `throw` statements into calls of two functions whose
//! names the caller gives: `catch (e) { body }` becomes `catch (e) { e = caught(e); body }` and
//! `throw x` becomes `throw thrown(x)`. What the functions do is the caller's
//! (`engine::catch`). Only the main body is rewritten: Rhai 1.27 cannot build a function with a
//! changed body.

use std::sync::OnceLock;

use rhai::{Engine, Expr, FnCallExpr, Stmt, StmtBlock, AST};

use super::{template, with_main_body};

/// The rewrite, with its `thrown` call compiled once.
pub(crate) struct CatchRewrite {
    /// The function a rewritten `catch` block calls on its variable first.
    caught: &'static str,
    /// A call of the function a rewritten `throw` calls on the thrown value.
    thrown: FnCallExpr,
}

/// A raw engine for the templates: no custom syntax, no functions the optimizer could fold.
fn template_engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(Engine::new_raw)
}

impl CatchRewrite {
    /// The rewrite into calls of `caught` and `thrown`.
    pub(crate) fn new(caught: &'static str, thrown: &'static str) -> CatchRewrite {
        CatchRewrite {
            caught,
            thrown: template(template_engine(), &format!("{thrown}(x)")),
        }
    }

    /// Returns `ast` with every `catch` block of its main body calling `caught` on its variable
    /// first and every `throw` wrapped in `thrown`; `ast` itself when it has neither. Functions,
    /// the source and the documentation are kept. No variable is added: the assignment is to
    /// the catch variable.
    pub(crate) fn apply(&self, ast: AST) -> AST {
        let mut changed = false;
        let statements: Vec<Stmt> = ast
            .statements()
            .iter()
            .map(|stmt| {
                let mut stmt = stmt.clone();
                changed |= self.stmt(&mut stmt);
                stmt
            })
            .collect();
        if !changed {
            return ast;
        }
        with_main_body(&ast, statements)
    }

    /// `name = caught(name);`
    fn caught_statement(&self, name: &str) -> Option<Stmt> {
        let ast = template_engine()
            .compile(format!("{name} = {}({name});", self.caught))
            .ok()?;
        ast.statements().first().cloned()
    }

    fn block(&self, block: &mut StmtBlock) -> bool {
        let mut changed = false;
        for stmt in block.statements_mut().iter_mut() {
            changed |= self.stmt(stmt);
        }
        changed
    }

    fn stmt(&self, stmt: &mut Stmt) -> bool {
        match stmt {
            Stmt::If(flow, ..) => {
                let a = self.expr(&mut flow.expr);
                let b = self.block(&mut flow.body);
                self.block(&mut flow.branch) | a | b
            }
            Stmt::While(flow, ..) | Stmt::Do(flow, ..) => {
                self.expr(&mut flow.expr) | self.block(&mut flow.body)
            }
            Stmt::For(for_loop, ..) => {
                let flow = &mut for_loop.2;
                self.expr(&mut flow.expr) | self.block(&mut flow.body)
            }
            Stmt::Switch(switch, ..) => {
                let (subject, cases) = &mut **switch;
                let mut changed = self.expr(subject);
                for case in cases.expressions.iter_mut() {
                    changed |= self.expr(&mut case.lhs);
                    changed |= self.expr(&mut case.rhs);
                }
                changed
            }
            Stmt::Var(var, ..) => self.expr(&mut var.1),
            Stmt::Assignment(assignment) => {
                self.expr(&mut assignment.1.lhs) | self.expr(&mut assignment.1.rhs)
            }
            Stmt::FnCall(call, ..) => call.args.iter_mut().fold(false, |c, a| self.expr(a) | c),
            Stmt::Block(block) => self.block(block),
            Stmt::TryCatch(flow, ..) => {
                self.block(&mut flow.body);
                self.block(&mut flow.branch);
                if let Expr::Variable(var, ..) = &flow.expr {
                    if let Some(first) = self.caught_statement(var.1.as_str()) {
                        flow.branch.statements_mut().insert(0, first);
                    }
                }
                true
            }
            Stmt::Expr(expr) => self.expr(expr),
            Stmt::Return(value, flags, pos) if flags.contains(rhai::ASTFlags::BREAK) => {
                let thrown = value.as_mut().map_or(Expr::Unit(*pos), |v| {
                    self.expr(v);
                    v.take()
                });
                let mut call = self.thrown.clone();
                call.args.clear();
                call.args.push(thrown);
                *value = Some(Box::new(Expr::FnCall(Box::new(call), *pos)));
                true
            }
            Stmt::Return(Some(expr), ..) | Stmt::BreakLoop(Some(expr), ..) => self.expr(expr),
            _ => false,
        }
    }

    fn expr(&self, expr: &mut Expr) -> bool {
        match expr {
            Expr::InterpolatedString(items, ..) | Expr::Array(items, ..) => {
                items.iter_mut().fold(false, |c, item| self.expr(item) | c)
            }
            Expr::Map(map, ..) => map
                .0
                .iter_mut()
                .fold(false, |c, (_, item)| self.expr(item) | c),
            Expr::Stmt(block) => self.block(block),
            Expr::FnCall(call, ..) | Expr::MethodCall(call, ..) => {
                call.args.iter_mut().fold(false, |c, a| self.expr(a) | c)
            }
            Expr::And(operands, ..) | Expr::Or(operands, ..) | Expr::Coalesce(operands, ..) => {
                operands.iter_mut().fold(false, |c, o| self.expr(o) | c)
            }
            Expr::Index(chain, ..) | Expr::Dot(chain, ..) => {
                self.expr(&mut chain.lhs) | self.expr(&mut chain.rhs)
            }
            _ => false,
        }
    }
}
