//! Rhai's syntax tree: the one module that reads or edits the AST Rhai exports behind its
//! `internals` feature (`Stmt`, `Expr`, `FnCallExpr`, `ASTNode`, …) or runs statements in a
//! caller's runtime state (`eval_statements_raw`, `GlobalRuntimeState`). Those items are
//! volatile across Rhai releases; keeping them here makes an upgrade one module's work.
//! `layering::rhai_internals_stay_in_rhai_ast` fails on any other file that names them.
//!
//! | item | for |
//! |---|---|
//! | [`visit`], [`Node`], [`Call`] | reading a script: its calls, `let`s, variables, string literals, `this` (`check`, the scout's choice of functions) |
//! | [`last_statement`], [`Ending`] | what kind of statement ends the main body (`check`'s warnings) |
//! | [`functions`], [`Statements`], [`run_nested`] | a function's or closure's body as statements, and running them as a call one level deeper (the scout's rewritten functions) |
//! | [`sites`] | the scout's rewrite: wrapping the sites Rhai decides on without calling a registered function |
//! | [`catches`] | the rewrite of `catch` blocks and `throw`s into calls of the engine's functions |
//! | [`fields`] | field reads that do not handle a missing field's `()`, and the hook that reports one missing at run time |
//!
//! Every edit builds its wrapper calls by compiling a one-call template on a raw engine, since
//! Rhai does not export the hash of a call; a call's hashes depend only on its name and arity,
//! not on the engine that runs it.

pub(crate) mod catches;
pub(crate) mod fields;
mod functions;
pub(crate) mod sites;
mod strings;

use rhai::{ASTNode, Dynamic, Engine, Expr, FnCallExpr, Position, Stmt, AST};

pub(crate) use functions::{functions, operations_so_far, run_nested, Statements};
pub(crate) use strings::{decode_marked_strings, mark_escapes};

/// A node of a script, as the checks and the scout look at it: the kinds of node they need,
/// each seen through a view that names no Rhai internals.
pub(crate) enum Node<'a> {
    /// A function call, method call or operator.
    Call(Call<'a>),
    /// The variable a `let` or `const` declares.
    Let(&'a str),
    /// A variable read (or written), and where.
    Variable(&'a str, Position),
    /// A string literal, and where.
    Text(&'a str, Position),
    /// `this`.
    This,
}

/// A call in a script: a function call (`f(x)`, also an operator's) or a method call
/// (`x.f()`).
pub(crate) struct Call<'a> {
    call: &'a FnCallExpr,
    position: Position,
    method: bool,
}

impl<'a> Call<'a> {
    /// The function's name.
    pub(crate) fn name(&self) -> &'a str {
        self.call.name.as_str()
    }

    /// Where the call is.
    pub(crate) fn position(&self) -> Position {
        self.position
    }

    /// Whether it is a method call (`x.f()`).
    pub(crate) fn is_method(&self) -> bool {
        self.method
    }

    /// Whether it is an operator (`a + b`, `!a`) rather than a call written as one.
    pub(crate) fn is_operator(&self) -> bool {
        self.call.is_operator_call()
    }

    /// Whether the name is qualified by a module (`m::f()`).
    pub(crate) fn is_qualified(&self) -> bool {
        self.call.is_qualified()
    }

    /// Whether the call gives the function the caller's scope (`f!(…)`).
    pub(crate) fn captures_scope(&self) -> bool {
        self.call.capture_parent_scope
    }

    /// How many arguments it is given.
    pub(crate) fn arity(&self) -> usize {
        self.call.args.len()
    }

    /// The argument at `index` when it is a string literal.
    pub(crate) fn text_arg(&self, index: usize) -> Option<&'a str> {
        match self.call.args.get(index) {
            Some(Expr::StringConstant(text, _)) => Some(text.as_str()),
            _ => None,
        }
    }

    /// The value of the argument at `index` when it is made only of constants (a map literal
    /// of literals, say).
    pub(crate) fn constant_arg(&self, index: usize) -> Option<Dynamic> {
        self.call.args.get(index).and_then(constant_value)
    }
}

/// Calls `on` for every node of `ast` — the main body, then every function and closure body —
/// that is one of the kinds [`Node`] names, in Rhai's walking order, until `on` returns `false`.
pub(crate) fn visit(ast: &AST, mut on: impl FnMut(Node<'_>) -> bool) {
    ast.walk(&mut |path: &[ASTNode]| path.last().and_then(node).is_none_or(&mut on));
}

/// As [`visit`], over a statement list.
fn visit_statements(statements: &[Stmt], mut on: impl FnMut(Node<'_>) -> bool) {
    for stmt in statements {
        let mut more = true;
        stmt.walk(&mut Vec::new(), &mut |path: &[ASTNode]| {
            more = path.last().and_then(node).is_none_or(&mut on);
            more
        });
        if !more {
            return;
        }
    }
}

/// The view of one AST node, for the kinds [`Node`] names.
fn node<'a>(node: &ASTNode<'a>) -> Option<Node<'a>> {
    match *node {
        ASTNode::Expr(Expr::FnCall(call, pos)) | ASTNode::Stmt(Stmt::FnCall(call, pos)) => {
            Some(Node::Call(Call {
                call,
                position: *pos,
                method: false,
            }))
        }
        ASTNode::Expr(Expr::MethodCall(call, pos)) => Some(Node::Call(Call {
            call,
            position: *pos,
            method: true,
        })),
        ASTNode::Stmt(Stmt::Var(var, ..)) => Some(Node::Let(var.0.name.as_str())),
        ASTNode::Expr(Expr::Variable(var, _, pos)) => Some(Node::Variable(var.1.as_str(), *pos)),
        ASTNode::Expr(Expr::StringConstant(text, pos)) => Some(Node::Text(text.as_str(), *pos)),
        ASTNode::Expr(Expr::ThisPtr(..)) => Some(Node::This),
        _ => None,
    }
}

/// Whether `ast` (its main body, functions or closures) calls a function `is_named` names, or
/// holds a string that names one (`Fn("name")`, `call("name")`).
pub(crate) fn names_one_of(ast: &AST, is_named: impl Fn(&str) -> bool) -> bool {
    let mut found = false;
    ast.walk(&mut |path: &[ASTNode]| {
        found = match path.last() {
            // `Fn("name")` is a function pointer from the parser on.
            Some(ASTNode::Expr(Expr::DynamicConstant(value, _))) => value
                .read_lock::<rhai::FnPtr>()
                .is_some_and(|f| is_named(f.fn_name())),
            Some(other) => match node(other) {
                Some(Node::Call(call)) => is_named(call.name()),
                Some(Node::Text(text, _)) => is_named(text),
                _ => false,
            },
            None => false,
        };
        !found
    });
    found
}

/// The names of the functions `ast` calls (methods and operators included), in walking order.
#[cfg(test)]
pub(crate) fn called_functions(ast: &AST) -> Vec<String> {
    let mut names = Vec::new();
    visit(ast, |node| {
        if let Node::Call(call) = node {
            names.push(call.name().to_string());
        }
        true
    });
    names
}

/// What kind of statement ends a script's main body, for the statements whose value is `()`.
pub(crate) enum Ending {
    /// `try { … } catch { … }`.
    Try,
    /// A `for` loop.
    For,
    /// A `while` or `loop`.
    While,
    /// A `do` loop.
    Do,
    /// A `let` or `const`, declaring this variable.
    Let(String),
    /// An assignment.
    Assignment,
    /// An `if` without `else`.
    IfWithoutElse,
}

/// The last statement of the main body, when it is one of those [`Ending`] names, and where
/// it is.
pub(crate) fn last_statement(ast: &AST) -> Option<(Ending, Position)> {
    let last = ast.statements().last()?;
    let ending = match last {
        Stmt::TryCatch(..) => Ending::Try,
        Stmt::For(..) => Ending::For,
        Stmt::While(..) => Ending::While,
        Stmt::Do(..) => Ending::Do,
        Stmt::Var(var, ..) => Ending::Let(var.0.name.to_string()),
        Stmt::Assignment(..) => Ending::Assignment,
        Stmt::If(flow, ..) if flow.branch.is_empty() => Ending::IfWithoutElse,
        _ => return None,
    };
    Some((ending, last.position()))
}

/// The value of an expression made only of constants (a map literal of literals, say).
fn constant_value(expr: &Expr) -> Option<Dynamic> {
    match expr {
        Expr::DynamicConstant(value, _) => Some((**value).clone()),
        Expr::Map(map, _) => {
            let (items, template) = &**map;
            let mut out = rhai::Map::new();
            for name in template.keys() {
                out.insert(name.clone(), Dynamic::UNIT);
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

/// The call in a one-call template script, compiled by `engine`.
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

/// `ast` with its main body replaced by `statements`, keeping its functions, source,
/// documentation and any embedded module resolver (which `AST::new` alone would drop).
fn with_main_body(ast: &AST, statements: Vec<Stmt>) -> AST {
    let mut rewritten = ast.clone_functions_only();
    rewritten.combine(AST::new(statements, rhai::Module::new()));
    rewritten
}

#[cfg(test)]
mod tests {
    use rhai::{Engine, Expr, Stmt};

    use super::{called_functions, last_statement, visit, Ending, Node};

    /// The rewrite of interpolated strings relies on Rhai parsing one as a single expression of
    /// its pieces, and a backtick string without `${}` as a plain constant.
    #[test]
    fn interpolation_is_one_expression_of_its_pieces() {
        let engine = Engine::new();
        let ast = engine.compile("let x = 1; `a${x}b`").unwrap();
        let Some(Stmt::Expr(expr)) = ast.statements().last() else {
            panic!("{:?}", ast.statements());
        };
        let Expr::InterpolatedString(items, ..) = &**expr else {
            panic!("{expr:?}");
        };
        assert_eq!(items.len(), 3, "{items:?}");
        let ast = engine.compile("`plain`").unwrap();
        assert!(
            matches!(ast.statements().last(), Some(Stmt::Expr(e)) if matches!(**e, Expr::StringConstant(..)))
        );
    }

    #[test]
    fn the_walk_sees_calls_lets_variables_text_and_this_in_bodies_too() {
        let ast = Engine::new_raw()
            .compile(r#"fn f(x) { this.y + x } let a = "t"; a.len(); g!(a, #{k: 1}) + 1"#)
            .unwrap();
        let mut seen = Vec::new();
        visit(&ast, |node| {
            seen.push(match node {
                Node::Call(call) => format!(
                    "call {} {} {} {} {}",
                    call.name(),
                    call.arity(),
                    call.is_method(),
                    call.is_operator(),
                    call.captures_scope()
                ),
                Node::Let(name) => format!("let {name}"),
                Node::Variable(name, _) => format!("var {name}"),
                Node::Text(text, _) => format!("text {text}"),
                Node::This => "this".to_string(),
            });
            true
        });
        for expected in [
            "let a",
            "text t",
            "call len 0 true false false",
            "call g 2 false false true",
            "call + 2 false true false",
            "var a",
            "this",
            "var x",
        ] {
            assert!(seen.iter().any(|s| s == expected), "{expected}: {seen:?}");
        }
        assert!(called_functions(&ast).contains(&"g".to_string()));
    }

    #[test]
    fn constant_arguments_are_values() {
        let ast = Engine::new_raw()
            .compile(r#"f(#{a: 1, b: [true, "x"]}, "name", y)"#)
            .unwrap();
        let mut found = 0;
        visit(&ast, |node| {
            if let Node::Call(call) = node {
                let value = call.constant_arg(0).unwrap();
                assert_eq!(value.to_string(), r#"#{"a": 1, "b": [true, "x"]}"#);
                assert_eq!(call.text_arg(1), Some("name"));
                assert!(call.constant_arg(2).is_none());
                found += 1;
            }
            true
        });
        assert_eq!(found, 1);
    }

    #[test]
    fn the_last_statement_is_named() {
        let ending = |script: &str| {
            last_statement(&Engine::new_raw().compile(script).unwrap()).map(|(e, _)| match e {
                Ending::Let(name) => format!("let {name}"),
                Ending::IfWithoutElse => "if".to_string(),
                Ending::Try => "try".to_string(),
                _ => "other".to_string(),
            })
        };
        assert_eq!(ending("let x = 1;").as_deref(), Some("let x"));
        assert_eq!(ending("let c = 1; if c > 0 { 1 }").as_deref(), Some("if"));
        assert_eq!(
            ending("try { g(); } catch { h(); }").as_deref(),
            Some("try")
        );
        assert_eq!(ending("let c = 1; if c > 0 { 1 } else { 2 }"), None);
        assert_eq!(ending("1 + 2"), None);
    }
}
