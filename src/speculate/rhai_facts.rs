//! Rhai 1.27 behaviour the scout's deferred values rely on, measured on a small custom type.
//! If a Rhai upgrade changes one of these, the scout may stop earlier or guess worse; these
//! tests say which assumption broke.

use std::sync::{Arc, Mutex};

use rhai::{Dynamic, Engine, EvalAltResult, ImmutableString};

/// A stand-in for the placeholder: a custom type with a `to_string` and indexers.
#[derive(Clone, Debug)]
struct Opaque(i64);

fn engine() -> (Engine, Arc<Mutex<Vec<String>>>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut engine = Engine::new();
    engine.register_type_with_name::<Opaque>("Opaque");
    engine.register_fn("opaque", Opaque);
    engine.register_fn("to_string", |o: &mut Opaque| format!("<{}>", o.0));
    let l = Arc::clone(&log);
    engine.register_indexer_set(move |o: &mut Opaque, k: Opaque, v: Dynamic| {
        l.lock()
            .unwrap()
            .push(format!("set {} [{}] = {v}", o.0, k.0));
    });
    engine.register_indexer_get(|o: &mut Opaque, k: Opaque| o.0 * 100 + k.0);
    let l = Arc::clone(&log);
    engine.register_indexer_set(move |o: &mut Opaque, k: ImmutableString, v: Dynamic| {
        l.lock().unwrap().push(format!("set {} .{k} = {v}", o.0));
    });
    // Replaces its first argument, passed by reference when it is a variable.
    engine.register_fn("swap_in", |target: &mut Dynamic, key: Dynamic| {
        *target = Dynamic::from(Opaque(7));
        key
    });
    (engine, log)
}

fn eval(engine: &Engine, script: &str) -> Result<Dynamic, Box<EvalAltResult>> {
    engine.eval::<Dynamic>(script)
}

/// (That Rhai parses an interpolation as one expression of its pieces is checked where the AST
/// is read: `rhai_ast::tests::interpolation_is_one_expression_of_its_pieces`.)
#[test]
fn interpolation_calls_to_string_per_piece() {
    let (engine, _) = engine();
    // The custom type's `to_string` is used, and its result is a string: no placeholder can
    // come out of an interpolation unless the whole expression is replaced.
    let s = eval(&engine, "let o = opaque(3); `a${o}b`").unwrap();
    assert_eq!(s.into_string().unwrap(), "a<3>b");
}

#[test]
fn a_custom_type_key_on_a_map_is_an_error_and_on_a_custom_type_reaches_its_indexer() {
    let (engine, log) = engine();
    let err = eval(&engine, "let m = #{}; m[opaque(1)] = 2; m").unwrap_err();
    assert!(err.to_string().contains("Opaque"), "{err}");
    let err = eval(&engine, "let m = #{}; m[opaque(1)]").unwrap_err();
    assert!(err.to_string().contains("Opaque"), "{err}");
    engine
        .run("let o = opaque(1); o[opaque(2)] = 3; o.x = 4;")
        .unwrap();
    // A compound assignment reads through the getter, then writes through the setter.
    engine.run("let o = opaque(1); o[opaque(2)] += 5;").unwrap();
    assert_eq!(
        *log.lock().unwrap(),
        ["set 1 [2] = 3", "set 1 .x = 4", "set 1 [2] = 107"]
    );
}

#[test]
fn in_on_a_map_with_a_custom_type_key_is_a_missing_contains() {
    let (mut engine, _) = engine();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = Arc::clone(&seen);
    #[allow(deprecated)]
    engine.on_missing_function(move |name, args, _, _| {
        s.lock()
            .unwrap()
            .push(format!("{name}/{}:{}", args.len(), args[0].type_name()));
        Ok(Some(Dynamic::from(true)))
    });
    assert!(eval(&engine, "let m = #{a: 1}; opaque(1) in m")
        .unwrap()
        .as_bool()
        .unwrap());
    // The map comes first: `x in m` is `contains(m, x)`.
    assert_eq!(seen.lock().unwrap()[0], "contains/2:map");
}

#[test]
fn a_function_can_replace_a_variable_passed_first_and_keys_are_evaluated_before_the_root() {
    let (engine, log) = engine();
    let v = eval(&engine, "let m = #{}; swap_in(m, 1); type_of(m)").unwrap();
    assert_eq!(v.into_string().unwrap(), "Opaque");
    // Not a constant: it is passed by value.
    let v = eval(&engine, "const m = #{}; swap_in(m, 1); type_of(m)").unwrap();
    assert_eq!(v.into_string().unwrap(), "map");
    // In `m[key] = v` the key is evaluated before the root is looked up, so the key may replace
    // the root, and the write goes to the replacement's indexer.
    engine
        .run("let m = #{}; m[swap_in(m, opaque(2))] = 9;")
        .unwrap();
    assert_eq!(*log.lock().unwrap(), ["set 7 [2] = 9"]);
}

#[test]
fn display_of_a_scalar_is_what_interpolation_writes() {
    let engine = Engine::new();
    for (script, value) in [
        ("42", Dynamic::from(42_i64)),
        ("-7", Dynamic::from(-7_i64)),
        ("1.5", Dynamic::from(1.5_f64)),
        ("2.0", Dynamic::from(2.0_f64)),
        ("1e20", Dynamic::from(1e20_f64)),
        ("0.1 + 0.2", Dynamic::from(0.1_f64 + 0.2)),
        ("true", Dynamic::from(true)),
        ("()", Dynamic::UNIT),
        ("\"sé\"", Dynamic::from("sé")),
    ] {
        let expected: String = engine.eval(&format!("let x = {script}; `${{x}}`")).unwrap();
        assert_eq!(value.to_string(), expected, "{script}");
        let plus: String = engine
            .eval(&format!("let x = {script}; \"a\" + x"))
            .unwrap();
        assert_eq!(format!("a{value}"), plus, "{script}");
        let plus: String = engine
            .eval(&format!("let x = {script}; x + \"a\""))
            .unwrap();
        assert_eq!(format!("{value}a"), plus, "{script}");
    }
}

/// What comparisons and `!` give between scalars of the kinds a read's field can be (and
/// characters): numbers compare across `INT` and `FLOAT`, a character as a one-character
/// string; between other kinds `==` and every ordering is `false` and `!=` `true`, with no
/// error (booleans have no order either); `!` of anything but a boolean is an error. The
/// scout's deferred operators
/// compute with an engine built as the executor's, and rely on these being the built-in
/// operators rather than anything the standard library adds.
#[test]
fn comparisons_between_scalars() {
    let engine = Engine::new();
    let show = |script: &str| match eval(&engine, script) {
        Ok(v) => v.to_string(),
        Err(_) => "error".to_string(),
    };
    #[rustfmt::skip]
    let cases: &[(&str, &str)] = &[
        ("1 == 1.0", "true"), ("1 < 1.5", "true"), ("2.0 >= 2", "true"), ("1 != 1.0", "false"),
        ("\"a\" < \"b\"", "true"), ("\"B\" < \"a\"", "true"), ("\"ab\" > \"a\"", "true"),
        ("'a' == \"a\"", "true"), ("\"a\" == 'a'", "true"), ("'a' < 'b'", "true"),
        ("1 == \"1\"", "false"), ("1 != \"1\"", "true"), ("() == ()", "true"), ("() != ()", "false"),
        ("() == 0", "false"), ("true == 1", "false"), ("true == true", "true"),
        ("1 < \"a\"", "false"), ("() < 1", "false"), ("true < false", "false"),
        ("!true", "false"), ("!1", "error"), ("!()", "error"),
    ];
    for (script, expected) in cases {
        assert_eq!(show(script), *expected, "{script}");
    }
}
