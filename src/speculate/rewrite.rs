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
//! [`rewrite`] therefore wraps each such site in a call to a function that the scout registers
//! (the edit of Rhai's AST itself is `rhai_ast::sites`; this module names the wrappers and the
//! tools where a pass stops):
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

use std::collections::HashSet;
use std::sync::OnceLock;

use rhai::AST;

use crate::rhai_ast::sites::{self, Templates, Wrappers};
use crate::rhai_ast::Statements;

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

/// The wrappers by the names above.
const WRAPPERS: Wrappers = Wrappers {
    cond: COND,
    unlikely: UNLIKELY,
    cond_loose: COND_LOOSE,
    unlikely_loose: UNLIKELY_LOOSE,
    value: VALUE,
    index: INDEX,
    interpolate: INTERPOLATE,
    key: KEY,
    mark: MARK,
    settle: SETTLE,
};

/// The wrapper calls, compiled once per process: a call's hashes depend only on its name and
/// arity (and on Rhai's process-wide hashing seed), not on the engine that will run it.
fn templates() -> &'static Templates {
    static TEMPLATES: OnceLock<Templates> = OnceLock::new();
    TEMPLATES.get_or_init(|| Templates::new(WRAPPERS))
}

/// Returns a new AST in which the sites that Rhai evaluates without calling a registered function
/// call [`COND`], [`VALUE`], [`INDEX`] and the other wrappers instead (see the module
/// documentation).
///
/// The result has the same meaning as `ast` when the wrappers are their plain meaning. Only the
/// main body is rewritten; functions, the source name and the documentation are kept. The
/// rewrite adds no variables and moves no statements, so the variable offsets that Rhai cached
/// in the AST stay valid.
#[cfg(test)]
pub(crate) fn rewrite(ast: &AST) -> AST {
    rewrite_with(ast, &HashSet::new(), &HashSet::new())
}

/// As [`rewrite`], knowing which functions are non-read tools (`effectful`) and which may
/// pause the run (`pausing`): a branch that calls a non-read tool is, like one that throws,
/// returns or breaks, a branch where a pass would stop, and its guard is guessed not taken;
/// but a branch that may pause is always the one guessed, so that a pass stops at the call and
/// starts nothing past it before a person decides.
pub(crate) fn rewrite_with(
    ast: &AST,
    effectful: &HashSet<String>,
    pausing: &HashSet<String>,
) -> AST {
    sites::rewrite_main(ast, templates(), effectful, pausing)
}

/// Rewrites the statements of a function or closure body as the main body is rewritten (with
/// the non-read tools `effectful`); `None` when no site in them needs a wrapper, so that the
/// body can run as it is.
pub(crate) fn rewrite_body(
    body: &Statements,
    effectful: &HashSet<String>,
    pausing: &HashSet<String>,
) -> Option<Statements> {
    sites::rewrite_body(body, templates(), effectful, pausing)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use rhai::{
        Dynamic, Engine, EvalAltResult, NativeCallContext, OptimizationLevel, Position, Scope, AST,
    };

    use crate::rhai_ast::called_functions;

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
                        called_functions(&rewritten),
                        called_functions(&ast),
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
        assert!(called_functions(&rewritten).iter().any(|n| n == COND));
        assert!(!called_functions(&ast).iter().any(|n| n == COND));
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
        called_functions(&rewrite(&ast))
    }

    /// A guard whose branch leaves (throws, returns, breaks, continues) is guessed not taken; a branch
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
        // `continue` skips the rest of the round, as `break` skips the rest of the loop: the
        // rounds that go on are the ones worth starting reads for.
        assert_eq!(
            unlikely("let i = 0; while i < 3 { i += 1; if i == 2 { continue; } }"),
            1
        );
        // A branch that makes a write, once the rewrite knows which tools write.
        let ast = Engine::new_raw()
            .compile("fn save(x) { x } let x = 1; if x > 0 { let y = [save(x)]; }")
            .unwrap();
        let effectful = HashSet::from(["save".to_string()]);
        let names = called_functions(&super::rewrite_with(&ast, &effectful, &HashSet::new()));
        assert!(names.iter().any(|n| n == UNLIKELY), "{names:?}");
    }

    /// Which conditions of `script` are guessed not taken, when `save` is a non-read tool.
    fn unlikely_with_a_write(script: &str) -> usize {
        let ast = Engine::new_raw()
            .compile(format!("fn save(x) {{ x }} {script}"))
            .unwrap();
        let effectful = HashSet::from(["save".to_string()]);
        called_functions(&super::rewrite_with(&ast, &effectful, &HashSet::new()))
            .iter()
            .filter(|n| *n == UNLIKELY || *n == UNLIKELY_LOOSE)
            .count()
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

    /// A branch that may pause is the one guessed, whichever it is and whatever the other
    /// does: so a pass stops at its call.
    #[test]
    fn a_branch_that_may_pause_is_the_one_guessed() {
        let unlikely = |script: &str| {
            let ast = Engine::new_raw()
                .compile(format!("fn save(x) {{ x }} fn ask(x) {{ x }} {script}"))
                .unwrap();
            let effectful = HashSet::from(["save".to_string(), "ask".to_string()]);
            let pausing = HashSet::from(["ask".to_string()]);
            called_functions(&super::rewrite_with(&ast, &effectful, &pausing))
                .iter()
                .filter(|n| *n == UNLIKELY || *n == UNLIKELY_LOOSE)
                .count()
        };
        // Always writes or leaves, but may pause: guessed taken.
        assert_eq!(unlikely("let x = 1; if x > 0 { ask(x); }"), 0);
        assert_eq!(unlikely("let x = 1; if x > 0 { ask(x); return 1; }"), 0);
        // The `else` may pause: guessed not taken, though the `if` goes on.
        assert_eq!(
            unlikely("let x = 1; if x > 0 { x += 1; } else { ask(x); }"),
            1
        );
        // Down an `else if` chain: away from the first branch, towards the one that asks.
        assert_eq!(
            unlikely("let x = 1; if x > 0 { x += 1; } else if x < -3 { ask(x); }"),
            1
        );
        // A write that does not pause keeps the usual guess.
        assert_eq!(unlikely("let x = 1; if x > 0 { save(x); }"), 1);
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
