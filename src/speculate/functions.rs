//! Script functions and closures in the scout: their bodies rewritten as the main body is, and
//! run as native functions of the scout's engine.
//!
//! Rhai 1.27 can read a function's body (through [`AST::walk`]) but cannot build a function
//! with a changed one: the body's type is not exported. So the scout keeps the rewritten
//! statements of each body itself, removes the function from the AST it runs, and registers on
//! its engine a native function of the same name and arity that runs those statements with the
//! arguments in a scope of their own. Plain calls, method-style calls without `this`,
//! function pointers and closures (whose names are `anon$…` and whose captured variables come
//! first, as curried arguments) all reach the native as they reached the script function.
//!
//! A body that the scout cannot run that way keeps its script function, run as it is, and the
//! scout simply sees less inside it: one that uses `this` (no native function has a `this`),
//! a function called with `f!(…)` (it reads the caller's scope), a method of a named type, or
//! a body whose statements could not be told apart from the others. So does every body when the
//! script defines more than [`MAX_REWRITTEN`] functions, and a body that needs no wrapper.
//!
//! # Bounds
//!
//! A native function runs its body with a copy of the caller's runtime state one call level
//! deeper, so the engine's call-depth limit applies as it does to script functions (checked
//! here, since Rhai checks it only for script functions), and its deadline and cancellation
//! (`on_progress`) too. Rhai counts operations per runtime state: each body starts from the
//! pass's total so far, and gives what it did back to its caller's tally, so the operation
//! limit bounds a pass as a whole.

use std::any::TypeId;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use rhai::{Dynamic, Engine, EvalAltResult, ImmutableString, NativeCallContext, Scope, AST};

use super::rewrite::{rewrite_body, rewrite_with};
use crate::rhai_ast::{self, Node, Statements};
use crate::sync::lock;

/// At most this many script functions have their bodies rewritten: finding one body clones the
/// AST's function module, so the work grows with the square of their number.
pub(crate) const MAX_REWRITTEN: usize = 200;

/// The script as the scout runs it.
#[derive(Debug)]
pub(crate) struct ScoutScript {
    /// The main body rewritten, with the script functions that run as they are.
    ast: AST,
    /// The functions that run rewritten, as native functions.
    bodies: Vec<Arc<Body>>,
    /// The names of all the script's functions and closures: the scout's fallback for
    /// built-in functions must leave them alone (see `placeholder::register`).
    names: Vec<String>,
}

/// The tools of `pausing` and the script functions of `ast` that may call one, directly or
/// through other script functions: a call of any of them may pause the run.
fn pausing_functions(ast: &AST, pausing: &HashSet<String>) -> HashSet<String> {
    let mut all = pausing.clone();
    let functions = rhai_ast::functions(ast);
    if pausing.is_empty() || functions.len() > MAX_REWRITTEN {
        return all;
    }
    let calls: Vec<(String, HashSet<String>)> = functions
        .iter()
        .filter_map(|def| {
            let body = Statements::of_function(ast, &def.name, def.params.len())?;
            Some((def.name.to_string(), body.called()))
        })
        .collect();
    loop {
        let before = all.len();
        for (name, called) in &calls {
            if !all.contains(name) && called.iter().any(|c| all.contains(c)) {
                all.insert(name.clone());
            }
        }
        if all.len() == before {
            return all;
        }
    }
}

/// A function body rewritten for the scout.
#[derive(Debug)]
struct Body {
    name: ImmutableString,
    params: Vec<ImmutableString>,
    statements: Statements,
}

impl ScoutScript {
    /// Rewrites `ast` for the scout, knowing the functions of non-read tools (`effectful`)
    /// and of the tools whose calls may pause the run (`pausing`).
    pub(crate) fn new(
        ast: &AST,
        effectful: &HashSet<String>,
        pausing: &HashSet<String>,
    ) -> ScoutScript {
        let pausing = &pausing_functions(ast, pausing);
        let mut main = rewrite_with(ast, effectful, pausing);
        let functions = rhai_ast::functions(ast);
        let names: Vec<String> = functions.iter().map(|f| f.name.to_string()).collect();
        let mut bodies = Vec::new();
        if names.len() <= MAX_REWRITTEN {
            let reads_caller_scope = called_with_caller_scope(ast);
            for def in functions {
                if def.is_typed_method || reads_caller_scope.contains(def.name.as_str()) {
                    continue;
                }
                let Some(statements) = Statements::of_function(ast, &def.name, def.params.len())
                else {
                    continue;
                };
                if statements.uses_this() {
                    continue;
                }
                if let Some(rewritten) = rewrite_body(&statements, effectful, pausing) {
                    bodies.push(Arc::new(Body {
                        name: def.name,
                        params: def.params,
                        statements: rewritten,
                    }));
                }
            }
        }
        let rewritten: HashSet<(&str, usize)> = bodies
            .iter()
            .map(|b| (b.name.as_str(), b.params.len()))
            .collect();
        main.retain_functions(|_, _, name, arity| !rewritten.contains(&(name, arity)));
        if !bodies.is_empty() {
            // Rhai keeps a script's top-level constants for `global::` only while it has a
            // script function: one that nothing calls keeps them there.
            static KEEP: std::sync::OnceLock<AST> = std::sync::OnceLock::new();
            main.combine(
                KEEP.get_or_init(|| {
                    Engine::new_raw()
                        .compile("fn __ts_keeps_constants() {}")
                        .expect("a fixed script compiles")
                })
                .clone(),
            );
        }
        ScoutScript {
            ast: main,
            bodies,
            names,
        }
    }

    /// The AST a pass runs (after [`ScoutScript::register`] on its engine).
    pub(crate) fn ast(&self) -> &AST {
        &self.ast
    }

    /// The names of the script's functions and closures.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(String::as_str)
    }

    /// How many functions run rewritten.
    #[cfg(test)]
    pub(crate) fn rewritten(&self) -> usize {
        self.bodies.len()
    }

    /// Registers the rewritten functions on the engine of one pass.
    pub(crate) fn register(&self, engine: &mut Engine) {
        if self.bodies.is_empty() {
            return;
        }
        register_reducers(engine, &self.bodies);
        // What each running body's callees did, innermost last; the first entry is the main
        // body's.
        let owed = Arc::new(Mutex::new(vec![0_u64]));
        for body in &self.bodies {
            let (body, owed) = (Arc::clone(body), Arc::clone(&owed));
            let types = vec![TypeId::of::<Dynamic>(); body.params.len()];
            engine.register_raw_fn(
                body.name.clone(),
                types,
                move |ctx: NativeCallContext, args: &mut [&mut Dynamic]| {
                    run(&ctx, &body, args, &owed)
                },
            );
        }
    }
}

/// Registers `reduce` and `reduce_rev` as Rhai's own, but calling a rewritten closure as Rhai
/// would reach its script function.
///
/// Rhai's array methods first call a closure with the element bound to `this`, then, when no
/// function takes that many arguments, with the element among the arguments. A native function
/// has no `this`: the first attempt reaches it with the element as its first argument. For
/// `map`, `filter` and the like, where the element comes first in the second attempt too, that
/// is the same; `reduce` passes `(accumulator, element)`, so its first attempt would bind them
/// the wrong way round. A rewritten body never uses `this`, so for it the first attempt is skipped.
fn register_reducers(engine: &mut Engine, bodies: &[Arc<Body>]) {
    let ours: Arc<HashSet<ImmutableString>> =
        Arc::new(bodies.iter().map(|b| b.name.clone()).collect());
    for (name, rev) in [("reduce", false), ("reduce_rev", true)] {
        let with_initial = [
            TypeId::of::<rhai::Array>(),
            TypeId::of::<rhai::FnPtr>(),
            TypeId::of::<Dynamic>(),
        ];
        for types in [&with_initial[..2], &with_initial[..]] {
            let ours = Arc::clone(&ours);
            engine.register_raw_fn(
                name,
                types,
                move |ctx: NativeCallContext, args: &mut [&mut Dynamic]| {
                    let reducer = args[1].clone().cast::<rhai::FnPtr>();
                    let initial = args.get(2).map(|a| (**a).clone()).unwrap_or(Dynamic::UNIT);
                    let skip_this = ours.contains(reducer.fn_name());
                    let mut array = args[0].write_lock::<rhai::Array>().ok_or("not an array")?;
                    let mut acc = initial;
                    let len = array.len();
                    let order: Box<dyn Iterator<Item = usize>> = if rev {
                        Box::new((0..len).rev())
                    } else {
                        Box::new(0..len)
                    };
                    for i in order {
                        acc = reduce_step(&ctx, &reducer, &mut array[i], acc, i, skip_this)?;
                    }
                    Ok(acc)
                },
            );
        }
    }
}

/// One step of `reduce`, with Rhai's attempts: the element as `this` (unless `skip_this`), then
/// `(accumulator, element)`, then `(accumulator, element, index)`.
fn reduce_step(
    ctx: &NativeCallContext,
    reducer: &rhai::FnPtr,
    item: &mut Dynamic,
    acc: Dynamic,
    index: usize,
    skip_this: bool,
) -> Result<Dynamic, Box<EvalAltResult>> {
    let not_found = |err: &EvalAltResult| matches!(err, EvalAltResult::ErrorFunctionNotFound(sig, _) if sig.starts_with(reducer.fn_name()));
    if !skip_this {
        match reducer.call_raw(ctx, Some(item), [acc.clone()]) {
            Err(err) if not_found(&err) => {}
            other => return other,
        }
    }
    match reducer.call_raw(ctx, None, [acc.clone(), item.clone()]) {
        Err(err) if not_found(&err) => {}
        other => return other,
    }
    let index = rhai::INT::try_from(index).unwrap_or(rhai::INT::MAX);
    reducer.call_raw(ctx, None, [acc, item.clone(), Dynamic::from(index)])
}

/// Runs a rewritten body for one call.
fn run(
    ctx: &NativeCallContext,
    body: &Body,
    args: &mut [&mut Dynamic],
    owed: &Mutex<Vec<u64>>,
) -> Result<Dynamic, Box<EvalAltResult>> {
    // Arguments are copied, never taken: the first may be the caller's variable itself (Rhai
    // passes it by reference), and a closure's captured variables are its function pointer's
    // curried values (shared, so that the body writes through to them as the original does).
    let mut scope = Scope::new();
    for (name, arg) in body.params.iter().zip(args.iter()) {
        scope.push_dynamic(name.clone(), (**arg).clone());
    }
    let start = rhai_ast::operations_so_far(ctx) + lock(owed).last().copied().unwrap_or_default();
    lock(owed).push(0);
    let (result, end) = rhai_ast::run_nested(ctx, &body.statements, &mut scope, start);
    let mut owed = lock(owed);
    let inner = owed.pop().unwrap_or_default();
    if let Some(callers) = owed.last_mut() {
        *callers += end.saturating_sub(start) + inner;
    }
    result
}

/// The names of the functions that some call gives the caller's scope (`f!(…)`).
fn called_with_caller_scope(ast: &AST) -> HashSet<String> {
    let mut names = HashSet::new();
    rhai_ast::visit(ast, |node| {
        if let Node::Call(call) = node {
            if call.captures_scope() && !call.is_method() {
                names.insert(call.name().to_string());
            }
        }
        true
    });
    names
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::{Arc, Mutex};

    use rhai::{Dynamic, Engine};

    use super::ScoutScript;

    /// Scripts whose functions and closures have sites to rewrite, each giving a value that shows
    /// what ran: Rhai semantics the native functions must keep. `log(x)` records `x`.
    const CORPUS: &[&str] = &[
        // A helper with a branch, called in a loop; early returns.
        r#"
        fn pick(x) { if x > 2 { "big" } else { "small" } }
        fn first_over(xs, n) { for x in xs { if x > n { return x; } } () }
        let out = [];
        for i in 0..5 { out.push(pick(i)); }
        [out, first_over([1, 5, 9], 4), first_over([1], 4)]
        "#,
        // A function calling a function, recursion, overloads by arity.
        r#"
        fn fact(n) { if n <= 1 { 1 } else { n * fact(n - 1) } }
        fn twice(n) { if n > 0 { fact(n) * 2 } else { 0 } }
        fn f(a) { if a > 0 { a } else { -a } }
        fn f(a, b) { if a > b { f(a) } else { f(b) } }
        [fact(10), twice(4), f(-3), f(-7, 2)]
        "#,
        // Closures capturing variables, reading and writing them; closures calling functions.
        r#"
        fn sq(x) { if x < 0 { -x * -x } else { x * x } }
        let k = 3; let count = 0;
        let f = |x| { count += 1; if x > k { sq(x) } else { k } };
        let r = [f.call(1), f.call(5), f.call(4)];
        k = 10;
        [r, f.call(5), count, k]
        "#,
        // Closures passed to map, filter, reduce (with and without the index), all, some, sort.
        r#"
        let t = 2;
        let xs = [5, 1, 4, 2, 3];
        [xs.map(|x| if x > t { x * 10 } else { x }),
         xs.filter(|x| x > t && x < 5),
         xs.map(|x, i| if i % 2 == 0 { x } else { -x }),
         xs.reduce(|acc, x| if x > t { acc + x } else { acc }, 0),
         xs.reduce(|acc, x, i| if i > 0 { acc + x * i } else { acc }, 100),
         xs.all(|x| x > 0 || x == -1), xs.some(|x| x == t ?? 0),
         xs.sort(|a, b| if a < b { -1 } else if a > b { 1 } else { 0 })]
        "#,
        // A closure made inside a function, returned, called later; nested closures.
        r#"
        fn adder(n) { let m = if n > 1 { n } else { 1 }; |x| if x > 0 { x + m } else { m } }
        let add = adder(5);
        let outer = |a| { let inner = |b| if b > a { b } else { a }; inner.call(a + 1) + inner.call(0) };
        [add.call(1), add.call(-1), outer.call(2)]
        "#,
        // Function pointers by name, curried. (Rhai calls `v.neg()` only with `this` bound, so
        // there the original fails where the scout's native function is found: the scout sees
        // more, never less.)
        r#"
        fn scale(k, x) { if k > 0 { k * x } else { x } }
        fn neg(x) { if x > 0 { -x } else { x } }
        let p = Fn("scale").curry(3);
        let q = Fn("neg");
        let v = 4;
        [p.call(2), q.call(5), call(q, 1), scale(0, 9), q.call(v)]
        "#,
        // Methods with `this` keep their script function; a rewritten one calls them.
        r#"
        fn bump(n) { if n > 1 { this.v += n; } else { this.v -= 1; } }
        fn push_on(o) { if o.v > 0 { o.bump(5); } o }
        let o = #{v: 1};
        o.bump(2); o.bump(0);
        [o, push_on(#{v: 1}), push_on(#{v: -1})]
        "#,
        // Global constants, `??`, `switch`, `type_of`, indexes inside bodies.
        r#"
        const LIMIT = 3;
        fn cap(x) { if x > global::LIMIT { global::LIMIT } else { x } }
        fn kind(x) { switch type_of(x) { "i64" if x > 0 => "pos", "i64" => "int", _ => "other" } }
        fn at(xs, i) { xs[i] ?? "none" }
        [cap(1), cap(9), kind(2), kind(-2), kind("s"), at([1, ()], 1), at([1, 2], 0)]
        "#,
        // Loops, break and continue, try/catch and throw inside bodies.
        r#"
        fn sum_odd(xs) { let s = 0; for x in xs { if x % 2 == 0 { continue; } if x > 7 { break; } s += x; } s }
        fn safe(x) { try { if x == 0 { throw "zero"; } 10 / x } catch (e) { log(e); -1 } }
        fn count_down(n) { let out = []; while n > 0 { out.push(n); n -= 1; } out }
        [sum_odd([1, 2, 3, 9, 5]), safe(2), safe(0), count_down(3)]
        "#,
        // Arguments are values: a function changing its parameter leaves the caller's alone.
        r#"
        fn grow(a) { if a.len() < 3 { a.push(0); } a.len() }
        let xs = [1];
        let n = grow(xs); let m = grow(xs);
        [xs, n, m]
        "#,
    ];

    /// An engine with the wrappers registered as their plain meaning, and `log`.
    fn plain_engine(log: Arc<Mutex<Vec<String>>>) -> Engine {
        let mut engine = crate::speculate::rewrite::tests::plain_engine(log);
        // Debug builds allow 8 levels by default; the scout's engine allows `max_call_depth`.
        engine.set_max_call_levels(48);
        engine
    }

    /// A run's value (or error) and what it logged.
    type Run = (String, Vec<String>);

    /// The original's run and the scout script's (on plain wrappers), and how many functions
    /// ran rewritten.
    fn both(script: &str) -> (Run, Run, usize) {
        let run = |scout: bool| {
            let log = Arc::new(Mutex::new(Vec::new()));
            let mut engine = plain_engine(Arc::clone(&log));
            let ast = engine.compile(script).unwrap();
            let (value, rewritten) = if scout {
                let scout = ScoutScript::new(&ast, &HashSet::new(), &HashSet::new());
                scout.register(&mut engine);
                (engine.eval_ast::<Dynamic>(scout.ast()), scout.rewritten())
            } else {
                (engine.eval_ast::<Dynamic>(&ast), 0)
            };
            let value = match value {
                Ok(v) => format!("{v:?}"),
                Err(e) => format!("error: {e}"),
            };
            let log = log.lock().unwrap().clone();
            ((value, log), rewritten)
        };
        let (original, _) = run(false);
        let (scout, rewritten) = run(true);
        (original, scout, rewritten)
    }

    #[test]
    fn rewritten_functions_and_closures_keep_their_meaning() {
        for script in CORPUS {
            let (original, scout, rewritten) = both(script);
            assert!(!original.0.starts_with("error"), "{script}: {original:?}");
            assert_eq!(scout, original, "{script}");
            assert!(rewritten > 0, "nothing rewritten in {script}");
        }
    }

    /// Runaway recursion and loops spread over many calls end as they do in the original: at
    /// the call-depth limit and at the operation limit of the whole run.
    #[test]
    fn limits_bound_the_rewritten_functions_as_a_whole() {
        let (original, scout, _) = both("fn f(n) { if n > 0 { f(n + 1) } else { 0 } } f(1)");
        assert!(original.0.contains("Stack overflow"), "{original:?}");
        assert!(scout.0.contains("Stack overflow"), "{scout:?}");

        let script = "fn spin(n) { let i = 0; while i < n { i += 1; } i }\n\
                      let t = 0; for k in 0..100 { t += spin(1000); } t";
        let run = |scout: bool| {
            let mut engine = plain_engine(Arc::default());
            engine.set_max_operations(20_000);
            let ast = engine.compile(script).unwrap();
            if scout {
                let scout = ScoutScript::new(&ast, &HashSet::new(), &HashSet::new());
                assert_eq!(scout.rewritten(), 1);
                scout.register(&mut engine);
                engine.eval_ast::<Dynamic>(scout.ast())
            } else {
                engine.eval_ast::<Dynamic>(&ast)
            }
            .map_err(|e| e.to_string())
        };
        for scout in [false, true] {
            let err = run(scout).unwrap_err();
            assert!(err.contains("Too many operations"), "{scout}: {err}");
        }
    }

    /// What the scout cannot run rewritten keeps its script function: a body using `this`, a
    /// function called with the caller's scope, a body with nothing to rewrite.
    #[test]
    fn what_cannot_be_rewritten_runs_as_it_is() {
        let rewritten = |script: &str| {
            let ast = Engine::new().compile(script).unwrap();
            let scout = ScoutScript::new(&ast, &HashSet::new(), &HashSet::new());
            (scout.rewritten(), scout.ast().iter_functions().count())
        };
        assert_eq!(
            rewritten("fn f(x) { if x { 1 } else { 2 } } f(true)"),
            (1, 1)
        );
        assert_eq!(
            rewritten("fn f(x) { if x { this.a = 1 } } let m = #{}; m.f(true)"),
            (0, 1)
        );
        assert_eq!(
            rewritten("fn f(x) { if x { y } else { 0 } } let y = 1; f!(true)"),
            (0, 1)
        );
        assert_eq!(rewritten("fn f(x) { x + 1 } f(1)"), (0, 1));
        assert_eq!(
            rewritten("let g = |x| if x { 1 } else { 2 }; g.call(true)"),
            (1, 1)
        );
    }
}
