//! Placeholders, deferred values, a pass's log and the scout's overloads, tested alone and
//! through an engine that has them registered.

use rhai::Engine;

use super::pass::{GUESSES_PER_CALL, GUESSES_PER_CELL};
use super::*;
use crate::speculate::rewrite::{COND, COND_LOOSE, INDEX, UNLIKELY};
use deferred::{MAX_LOOKUP_ITEMS, MAX_PIECES};
use serde_json::json;

/// `super::resolve_deep` outside a pass: with a log nobody reads.
fn resolve_deep(value: &Dynamic) -> Resolution {
    super::resolve_deep(value, &PassLog::default())
}

/// `super::derive` outside a pass.
fn derive(p: &Placeholder, key: &Dynamic) -> Dynamic {
    super::derive(p, key, &PassLog::default())
}

/// `super::index_known` outside a pass.
fn index_known(container: &Dynamic, key: &Dynamic) -> Dynamic {
    super::index_known(container, key, &PassLog::default())
}

/// `deferred::lookup` outside a pass.
fn lookup(container: &Dynamic, key: Dynamic) -> Dynamic {
    deferred::lookup(container, key, &PassLog::default())
}

/// `overloads::assignment_key` outside a pass.
fn assignment_key(container: &mut Dynamic, key: Dynamic) -> Dynamic {
    overloads::assignment_key(container, key, &PassLog::default())
}

/// Registers the scout's functions on `engine` for a pass whose log is returned.
fn register(engine: &mut Engine, reserved: Arc<[String]>) -> Arc<PassLog> {
    let log = Arc::new(PassLog::default());
    super::register(engine, reserved, &log);
    log
}

fn resolved(value: Value) -> Placeholder {
    let cell = OutcomeSlot::new();
    cell.set(Ok(value));
    Placeholder::of(cell)
}

#[test]
fn paths_walk_the_resolved_value() {
    let p = resolved(json!({"a": [10, {"b": "x"}]}));
    let d = derive(&p, &Dynamic::from(ImmutableString::from("a")));
    let d = index_known(&d, &Dynamic::from(-1 as INT));
    let d = index_known(&d, &Dynamic::from(ImmutableString::from("b")));
    assert_eq!(d.into_string().unwrap(), "x");
}

#[test]
fn pending_values_are_noted_and_resolve_later() {
    let cell = OutcomeSlot::new();
    let p = Placeholder::of(Arc::clone(&cell));
    let child = derive(&p, &Dynamic::from(ImmutableString::from("id")));
    let log = PassLog::default();
    assert!(log.known(&child).is_err());
    let args = {
        let mut m = Map::new();
        m.insert("id".into(), child.clone());
        Dynamic::from_map(m)
    };
    assert!(matches!(super::resolve_deep(&args, &log), Resolution::Pending(c) if c.len() == 1));
    assert_eq!(log.take_pending().len(), 1);
    cell.set(Ok(json!({"id": 7})));
    assert!(matches!(resolve_deep(&args), Resolution::Ready(v) if v == json!({"id": 7})));
    cell.set(Ok(json!(null)));
}

fn pending() -> (Arc<OutcomeSlot>, Dynamic) {
    let cell = OutcomeSlot::new();
    let p = Dynamic::from(Placeholder::of(Arc::clone(&cell)));
    (cell, p)
}

fn field(p: &Dynamic, name: &str) -> Dynamic {
    index_known(p, &Dynamic::from(ImmutableString::from(name)))
}

#[test]
fn a_deferred_string_is_joined_once_its_pieces_land() {
    let (a, pa) = pending();
    let (b, pb) = pending();
    let inner = Placeholder::text(vec!["id-".into(), field(&pa, "id")]);
    let text = Placeholder::text(vec![inner, "/".into(), field(&pb, "n")]);
    let args = Dynamic::from_map(Map::from_iter([("name".into(), text.clone())]));
    assert!(matches!(resolve_deep(&args), Resolution::Pending(c) if c.len() == 2));
    a.set(Ok(json!({"id": 7})));
    assert!(matches!(resolve_deep(&args), Resolution::Pending(c) if c.len() == 1));
    b.set(Ok(json!({"n": 1.5})));
    assert!(
        matches!(resolve_deep(&args), Resolution::Ready(v) if v == json!({"name": "id-7/1.5"}))
    );
    // A container has no text the scout rebuilds: never known.
    let (c, pc) = pending();
    let text = Placeholder::text(vec!["x".into(), pc]);
    c.set(Ok(json!([1])));
    assert!(matches!(resolve_deep(&text), Resolution::Never));
    let long = Placeholder::text(vec![pa; MAX_PIECES + 1]);
    assert!(matches!(resolve_deep(&long), Resolution::Never));
}

#[test]
fn a_lookup_by_a_pending_key_resolves_as_rhai_indexes() {
    let (cell, p) = pending();
    let map = Dynamic::from_map(Map::from_iter([
        ("u1".into(), Dynamic::from("red")),
        (
            "u2".into(),
            Dynamic::from_map(Map::from_iter([("n".into(), Dynamic::from(7_i64))])),
        ),
    ]));
    let array = Dynamic::from_array(vec![Dynamic::from(10_i64), Dynamic::from(20_i64)]);
    let team = lookup(&map, field(&p, "name"));
    let nested = field(&lookup(&map, field(&p, "other")), "n");
    let item = lookup(&array, field(&p, "i"));
    let missing = lookup(&map, field(&p, "none"));
    let beyond = lookup(&array, field(&p, "far"));
    for value in [&team, &nested, &item] {
        assert!(matches!(resolve_deep(value), Resolution::Pending(_)));
    }
    cell.set(Ok(
        json!({"name": "u1", "other": "u2", "i": -1, "none": "u9", "far": 5}),
    ));
    assert!(matches!(resolve_deep(&team), Resolution::Ready(v) if v == json!("red")));
    assert!(matches!(resolve_deep(&nested), Resolution::Ready(v) if v == json!(7)));
    // A negative index counts from the end, a missing map key is `()`, as in Rhai; an index
    // out of bounds is an error there, and never known here.
    assert!(matches!(resolve_deep(&item), Resolution::Ready(v) if v == json!(20)));
    assert!(matches!(resolve_deep(&missing), Resolution::Ready(v) if v == json!(null)));
    assert!(matches!(resolve_deep(&beyond), Resolution::Never));
    // A large container, or a key that can never be known, is an unknown at once.
    let large = Dynamic::from_array(vec![Dynamic::UNIT; MAX_LOOKUP_ITEMS + 1]);
    let (_cell, q) = pending();
    assert!(matches!(
        resolve_deep(&lookup(&large, q)),
        Resolution::Never
    ));
    assert!(matches!(
        resolve_deep(&lookup(&map, Placeholder::unknown())),
        Resolution::Never
    ));
}

/// Through the scout's own indexing function, as the rewritten script calls it.
#[test]
fn the_scouts_index_defers_a_lookup_by_a_pending_key() {
    let mut engine = Engine::new_raw();
    register(&mut engine, Arc::from(Vec::<String>::new()));
    let (cell, u) = pending();
    let mut scope = rhai::Scope::new();
    scope.push("u", u);
    scope.push(
        "m",
        Dynamic::from_map(Map::from_iter([("u1".into(), Dynamic::from("red"))])),
    );
    let team: Dynamic = engine
        .eval_with_scope(&mut scope, &format!("{INDEX}(m, u.name)"))
        .unwrap();
    assert!(matches!(resolve_deep(&team), Resolution::Pending(_)));
    cell.set(Ok(json!({"name": "u1"})));
    assert!(matches!(resolve_deep(&team), Resolution::Ready(v) if v == json!("red")));
}

/// The scout's `sort` with a comparator sorts known values as Rhai does (an int or a bool
/// from the comparator, anything else by type), and leaves no guessed order: over a value
/// not known yet every item becomes an unknown.
#[test]
fn a_sort_over_values_not_known_yet_orders_nothing() {
    let scripts = [
        "let a = [3, 1, 2]; a.sort(|x, y| x - y); a",
        "let a = [3, 1, 2]; a.sort(|x, y| x > y); a",
        "let a = [#{n: 2}, #{n: 1}]; a.sort(|x, y| x.n - y.n); a",
        "let a = [1, \"b\", 2.5, ()]; a.sort(|x, y| \"no\"); a",
        "let a = [2, 1]; a.sort(|x, y| x.missing - y); a",
    ];
    let mut scout = Engine::new();
    register(&mut scout, Arc::from(Vec::<String>::new()));
    let plain = Engine::new();
    for script in scripts {
        let ours = format!(
            "{:?}",
            scout.eval::<Dynamic>(script).map_err(|e| e.to_string())
        );
        let rhai = format!(
            "{:?}",
            plain.eval::<Dynamic>(script).map_err(|e| e.to_string())
        );
        assert_eq!(ours, rhai, "{script}");
    }
    let (cell, p) = pending();
    let mut scope = rhai::Scope::new();
    scope.push("p", p);
    let sorted: Array = scout
        .eval_with_scope(
            &mut scope,
            "let a = [p, #{n: 1}]; a.sort(|x, y| x.n - y.n); a",
        )
        .unwrap();
    assert!(sorted
        .iter()
        .all(|item| matches!(resolve_deep(item), Resolution::Never)));
    cell.set(Ok(json!({"n": 2})));
    let sorted: Array = scout
        .eval_with_scope(
            &mut scope,
            "let a = [p, #{n: 1}]; a.sort(|x, y| x.n - y.n); a",
        )
        .unwrap();
    let sorted: Vec<Value> = sorted
        .iter()
        .map(|item| match resolve_deep(item) {
            Resolution::Ready(v) => v,
            _ => panic!("known once its read landed"),
        })
        .collect();
    assert_eq!(sorted, vec![json!({"n": 1}), json!({"n": 2})]);
}

#[test]
fn a_map_given_a_pending_key_keeps_its_writes_in_order() {
    let (cell, p) = pending();
    let mut map = Dynamic::from_map(Map::from_iter([("a".into(), Dynamic::from(1_i64))]));
    let key = assignment_key(&mut map, field(&p, "name"));
    assert!(is_placeholder(&map), "the map became a deferred value");
    map.write_lock::<Placeholder>()
        .unwrap()
        .write(key.clone(), Dynamic::from(2_i64));
    map.write_lock::<Placeholder>()
        .unwrap()
        .write(ImmutableString::from("b").into(), field(&p, "n"));
    map.write_lock::<Placeholder>()
        .unwrap()
        .write(key, Dynamic::from(3_i64));
    assert!(matches!(resolve_deep(&map), Resolution::Pending(c) if c.len() == 1));
    // A field read of the deferred map waits for it too.
    let b = field(&map, "b");
    assert!(matches!(resolve_deep(&b), Resolution::Pending(_)));
    cell.set(Ok(json!({"name": "x", "n": 9})));
    assert!(matches!(
        resolve_deep(&map),
        Resolution::Ready(v) if v == json!({"a": 1, "b": 9, "x": 3})
    ));
    assert!(matches!(resolve_deep(&b), Resolution::Ready(v) if v == json!(9)));
    // A known key passes through; a key of the wrong type never resolves.
    let mut plain = Dynamic::from_map(Map::new());
    assert_eq!(
        assignment_key(&mut plain, "k".into())
            .into_string()
            .unwrap(),
        "k"
    );
    assert!(plain.is_map());
    let (cell, p) = pending();
    let key = assignment_key(&mut plain, p);
    plain
        .write_lock::<Placeholder>()
        .unwrap()
        .write(key, Dynamic::UNIT);
    cell.set(Ok(json!(1)));
    assert!(matches!(resolve_deep(&plain), Resolution::Never));
}

#[test]
fn writes_into_a_pending_read_are_applied_to_its_value() {
    let (cell, p) = pending();
    let mut edited = p.clone();
    edited
        .write_lock::<Placeholder>()
        .unwrap()
        .write(ImmutableString::from("x").into(), Dynamic::from(5_i64));
    let x = field(&edited, "x");
    let mut items = Dynamic::from_array(vec![Dynamic::from(1_i64), p]);
    let key = assignment_key(&mut items, field(&x, "nothing"));
    items
        .write_lock::<Placeholder>()
        .unwrap()
        .write(key, Dynamic::UNIT);
    cell.set(Ok(json!({"x": 1, "y": 2})));
    assert!(matches!(resolve_deep(&x), Resolution::Ready(v) if v == json!(5)));
    assert!(matches!(
        resolve_deep(&edited),
        Resolution::Ready(v) if v == json!({"x": 5, "y": 2})
    ));
    // `5.nothing` does not exist: the array's key never resolves.
    assert!(matches!(resolve_deep(&items), Resolution::Never));
}

#[test]
fn a_deferred_value_never_misses_a_change_made_by_a_function() {
    let mut engine = Engine::new();
    register(&mut engine, Arc::from(Vec::new()));
    let (cell, p) = pending();
    let mut scope = rhai::Scope::new();
    scope.push("u", p);
    let script = r#"
        let m = #{a: 1}; m[__ts_key(m, u.name)] = 2;
        let before = m; let n = m.len();
        m.remove("a");
        [before, m, n]
    "#;
    let out: Array = engine.eval_with_scope(&mut scope, script).unwrap();
    // `len` changes nothing; `remove` on a value not known yet makes it an unknown.
    assert!(is_placeholder(&out[0]) && is_placeholder(&out[1]) && is_placeholder(&out[2]));
    cell.set(Ok(json!({"name": "x"})));
    assert!(matches!(resolve_deep(&out[0]), Resolution::Ready(v) if v == json!({"a": 1, "x": 2})));
    assert!(matches!(resolve_deep(&out[1]), Resolution::Never));
    // Once known, the function runs on the value, and the variable becomes the result.
    let mut scope = rhai::Scope::new();
    scope.push("m", out[0].clone());
    let out: Array = engine
        .eval_with_scope(&mut scope, r#"let r = m.remove("a"); [r, m]"#)
        .unwrap();
    assert_eq!(out[0].as_int().unwrap(), 1);
    assert!(out[1].is_map(), "{:?}", out[1]);
    assert!(matches!(resolve_deep(&out[1]), Resolution::Ready(v) if v == json!({"x": 2})));
}

/// An engine with the scout's placeholder functions, and a scope holding `u`, a read in
/// flight.
fn scout_engine() -> (Engine, rhai::Scope<'static>, Arc<OutcomeSlot>, Arc<PassLog>) {
    let mut engine = Engine::new();
    let log = register(&mut engine, Arc::from(Vec::new()));
    let (cell, p) = pending();
    let mut scope = rhai::Scope::new();
    scope.push("u", p);
    (engine, scope, cell, log)
}

#[test]
fn deferred_comparisons_resolve_to_what_the_run_computes() {
    let fields = [
        json!(1),
        json!(2.5),
        json!("b"),
        json!(true),
        json!(null),
        json!([1]),
    ];
    let others = [
        "1", "2.5", "2", "\"a\"", "\"b\"", "'b'", "true", "false", "()",
    ];
    let plain = Engine::new();
    for field in &fields {
        for other in others {
            for op in ["==", "!=", "<", "<=", ">", ">="] {
                for script in [format!("u.v {op} {other}"), format!("{other} {op} u.v")] {
                    let (engine, mut scope, cell, _) = scout_engine();
                    let deferred: Dynamic = engine.eval_with_scope(&mut scope, &script).unwrap();
                    let negated: Dynamic = engine
                        .eval_with_scope(&mut scope, &format!("!({script})"))
                        .unwrap();
                    assert!(
                        is_placeholder(&deferred) && is_placeholder(&negated),
                        "{script}"
                    );
                    cell.set(Ok(json!({ "v": field })));
                    let mut scope = rhai::Scope::new();
                    scope.push("u", to_dynamic(&json!({ "v": field })));
                    let expected = plain.eval_with_scope::<Dynamic>(&mut scope, &script);
                    match (resolve_deep(&deferred), expected) {
                        // Only scalars are computed: a container's comparison stays unknown.
                        (Resolution::Never, _) if field.is_array() => {}
                        (Resolution::Ready(v), Ok(e)) => {
                            assert_eq!(v, json!(e.as_bool().unwrap()), "{script} on {field}");
                            let not = resolve_deep(&negated);
                            assert!(
                                matches!(not, Resolution::Ready(n) if n == json!(!e.as_bool().unwrap())),
                                "!({script}) on {field}"
                            );
                        }
                        (got, e) => panic!(
                            "{script} on {field}: {:?} against {e:?}",
                            matches!(got, Resolution::Ready(_))
                        ),
                    }
                }
            }
        }
    }
    // `!` of a non-boolean is Rhai's error: never known. Arithmetic stays an unknown.
    let (engine, mut scope, cell, _) = scout_engine();
    let not: Dynamic = engine.eval_with_scope(&mut scope, "!u.n").unwrap();
    let sum: Dynamic = engine.eval_with_scope(&mut scope, "u.n + 1 > 2").unwrap();
    cell.set(Ok(json!({"n": 5})));
    assert!(matches!(resolve_deep(&not), Resolution::Never));
    assert!(matches!(resolve_deep(&sum), Resolution::Never));
}

/// Every pass's engine shares one module of the placeholder functions, built once, and each
/// pass's functions still report to that pass's log: two passes on two threads, both engines
/// made before either runs, each guessing on its own read.
#[test]
fn passes_on_two_threads_at_once_report_to_their_own_logs() {
    let made = Arc::new(std::sync::Barrier::new(2));
    let passes: Vec<_> = [1, 3]
        .into_iter()
        .map(|n| {
            let made = Arc::clone(&made);
            std::thread::spawn(move || {
                let (engine, mut scope, cell, log) = scout_engine();
                made.wait();
                for _ in 0..n {
                    let script = format!("if {COND}(u.a) {{}}");
                    engine.run_with_scope(&mut scope, &script).unwrap();
                }
                made.wait();
                (n, log.guesses_over(std::slice::from_ref(&cell)).len())
            })
        })
        .collect();
    for pass in passes {
        let (made, logged) = pass.join().unwrap();
        assert_eq!(logged, made);
    }
}

#[test]
fn a_decisive_guess_is_kept_by_the_reads_it_waited_for_until_it_is_proved() {
    let (engine, mut scope, cell, log) = scout_engine();
    let (other, q) = pending();
    scope.push("q", q);
    // Decisive: a condition of its own, a guard guessed not taken, `&&` operands guessed
    // true. Loose: `||` operands guessed true. Another read's guess is not `u`'s.
    let script = format!(
        "if {COND}(u.active) {{ 1 }}; if {UNLIKELY}(!u.active) {{ 2 }}; \
         if {COND}(u.n > 2) && {COND}(u.n < 9) {{ 3 }}; if {COND_LOOSE}(u.team == 0) {{ 4 }}; \
         if {COND}(q.active) {{ 5 }}"
    );
    engine.run_with_scope(&mut scope, &script).unwrap();
    let guesses = log.guesses_over(std::slice::from_ref(&cell));
    assert_eq!(guesses.len(), 4, "{guesses:?}");
    assert_eq!(log.guesses_over(std::slice::from_ref(&other)).len(), 1);
    assert!(guesses.iter().all(|g| !g.proved_wrong()), "still unknown");
    // Guessed right: active, and 2 < n < 9.
    cell.set(Ok(json!({"active": true, "n": 5, "team": 1})));
    assert!(guesses.iter().all(|g| !g.proved_wrong()));
    let (engine, mut scope, cell, log) = scout_engine();
    engine
        .run_with_scope(&mut scope, &script.replace("q.", "u."))
        .unwrap();
    let guesses = log.guesses_over(std::slice::from_ref(&cell));
    // `u.active` guessed true, then `!u.active` false: both wrong for an inactive user.
    cell.set(Ok(json!({"active": false, "n": 5})));
    assert_eq!(guesses.iter().filter(|g| g.proved_wrong()).count(), 3);
    // A new pass (a new log) starts with no guesses; a read keeps only its latest ones.
    let (engine, mut scope, cell, log) = scout_engine();
    assert!(log.guesses_over(std::slice::from_ref(&cell)).is_empty());
    for _ in 0..2 * GUESSES_PER_CALL {
        engine
            .run_with_scope(&mut scope, &format!("if {COND}(u.a) {{}}"))
            .unwrap();
    }
    assert_eq!(
        log.guesses_over(std::slice::from_ref(&cell)).len(),
        GUESSES_PER_CELL
    );
}

#[test]
fn failures_and_pending_text_never_resolve() {
    let cell = OutcomeSlot::new();
    cell.set(Err(crate::error::ToolError::not_found("x")));
    assert!(matches!(
        Placeholder::of(cell).state(&PassLog::default()),
        Resolved::Never
    ));
    let text = Dynamic::from(format!("id-{PENDING_TEXT}"));
    assert!(matches!(resolve_deep(&text), Resolution::Never));
}
