//! Fuzzing on stable Rust: proptest generates inputs from the grammar's pieces (and raw text),
//! and every input must end in a value or a clear error — never a panic, an abort or a hang —
//! through the parser and `check`, through manifests, and through whole runs in both modes
//! (which must then agree). `TOOLSCRIPT_FUZZ_CASES` sets the number of cases of each target
//! (CI runs the default, a few hundred; long local runs set millions). Every input that ever
//! crashed is kept in `REGRESSIONS` and runs in CI.

use std::path::Path;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use toolscript::bench::observable;
use toolscript::{ErrorKind, Limits, Manifests, Mode, Registry, Runtime};

use crate::support::{fixture_tools, run_in, Probe};

fn cases(default: u32) -> u32 {
    std::env::var("TOOLSCRIPT_FUZZ_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

/// Runs `check` on `cases` inputs of `strategy`; a failure (or a panic) fails the test with the
/// input that caused it.
fn fuzz<S: Strategy>(
    cases: u32,
    strategy: S,
    check: impl Fn(S::Value) -> Result<(), TestCaseError>,
) {
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        // Shrinking a crash of a long run takes long; the input is printed whole anyway.
        max_shrink_iters: 200,
        ..Config::default()
    });
    if let Err(e) = runner.run(&strategy, check) {
        panic!("{e}");
    }
}

/// Pieces of scripts: keywords, operators, literals (odd ones too), the fixture's tools, the
/// built-ins that allocate or sleep.
const SCRIPT_PIECES: &[&str] = &[
    "let ",
    "x",
    "y",
    " = ",
    "1",
    "-1",
    "0.0 / 0.0",
    "1e300",
    "9223372036854775807",
    "\"s\"",
    "`t ${x}`",
    "#{",
    "}",
    "[",
    "]",
    "(",
    ")",
    "{",
    ";",
    ",",
    ".",
    ":",
    " + ",
    " * ",
    " - ",
    " / ",
    " % ",
    " == ",
    " && ",
    " || ",
    " ?? ",
    "!",
    "if ",
    " else ",
    "while ",
    "for ",
    " in ",
    "0..3",
    "loop ",
    "break",
    "continue",
    "return ",
    "throw ",
    "try ",
    " catch (e) ",
    "fn f(a) ",
    "f(",
    "|a| a",
    ".map(",
    ".filter(",
    ".len()",
    ".push(",
    "sleep(",
    "print(",
    "get_user(#{id: 1})",
    "get_user(#{id: x})",
    "lookup(#{id: 2})",
    "create_order(#{user: 1})",
    "notify(#{})",
    "poll()",
    "flaky(#{i: 1})",
    "boom()",
    "bad_output()",
    "tool(\"get_user\", ",
    "e.kind",
    "x.id",
    "x[0]",
    "switch x { 1 => 2, _ => 3 }",
    "type_of(x)",
    ".replace(\"a\", ",
    "\"aaaa\"",
    "s += s",
    "()",
    "true",
    "false",
    "\n",
    "//",
    "/*",
    "*/",
    "'c'",
    "\\",
];

fn script_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        // Grammar pieces in any order: mostly parse errors, some real scripts.
        3 => prop::collection::vec(prop::sample::select(SCRIPT_PIECES), 0..40)
            .prop_map(|pieces| pieces.concat()),
        // Raw text: any characters.
        1 => ".{0,200}",
    ]
}

/// Pieces of manifests.
const MANIFEST_PIECES: &[&str] = &[
    "[[tool]]\n",
    "[[mcp]]\n",
    "name = \"a\"\n",
    "name = \"get-user\"\n",
    "name = \"ts_x\"\n",
    "name = \"\"\n",
    "effect = \"read\"\n",
    "effect = \"write\"\n",
    "effect = \"reed\"\n",
    "script = '''1'''\n",
    "script = \"let = ;\"\n",
    "script = '''throw #{kind: 1}'''\n",
    "nested = [\"a\"]\n",
    "nested = [\"missing\"]\n",
    "retries = 2\n",
    "retries = -1\n",
    "timeout_ms = 0\n",
    "timeout_ms = 18446744073709551615\n",
    "latency_ms = 1\n",
    "input = { type = \"string\" }\n",
    "input = { type = \"object\", properties = { id = { type = \"integer\" } } }\n",
    "output = { pattern = \"(a+)+$\" }\n",
    "output = { \"$ref\" = \"http://x\" }\n",
    "command = []\n",
    "command = [\"definitely-not-a-program\"]\n",
    "colour = 1\n",
    "= \n",
    "[",
    "]",
    "\"",
    "'''",
    "\n",
    "# comment\n",
    "speculate = false\n",
    "allow_repeat = true\n",
];

fn manifest_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::collection::vec(prop::sample::select(MANIFEST_PIECES), 0..24)
            .prop_map(|pieces| pieces.concat()),
        1 => ".{0,200}",
    ]
}

/// Inputs that crashed, hung or aborted the runtime once: they run in every CI.
const REGRESSIONS: &[&str] = &[
    "sleep(1e300)",
    "sleep(0.0 / 0.0); 1",
    "0.0 / 0.0",
    "[1.0 / 0.0]",
    "let t = \"a\"; t.replace(\"a\", \"\"); t",
    "`🕴Ⱥ<V{ x`; %🕴$ {a: 1} ?",
    "let s = \"🕴\"; {a: \"b\"}",
];

#[test]
fn the_parser_and_check_never_panic() {
    let runtime = Runtime::new(
        Registry::builder()
            .tools(fixture_tools(&Probe::default()))
            .build()
            .unwrap(),
    );
    fuzz(cases(2_000), script_strategy(), |source| {
        // Either compiles or says where it does not; `check` never fails on a compiled script.
        if let Err(e) = runtime.check(&source) {
            prop_assert!(
                matches!(e.kind, ErrorKind::InvalidScript | ErrorKind::LimitExceeded),
                "{e:?}"
            );
        }
        Ok(())
    });
}

#[test]
fn manifests_never_panic() {
    fuzz(cases(2_000), manifest_strategy(), |text| {
        let mut manifests = Manifests::new();
        if manifests.load_str(Path::new("fuzz.toml"), &text).is_ok() {
            // Declared MCP servers are not started here: building says so, it does not panic.
            let _ = manifests.into_registry();
        }
        Ok(())
    });
}

/// Small limits, so that a runaway script ends quickly.
fn fuzz_runtime() -> Runtime {
    let mut limits = Limits::default();
    limits.max_operations = 50_000;
    limits.timeout = Duration::from_secs(5);
    Runtime::builder(
        Registry::builder()
            .tools(fixture_tools(&Probe::default()))
            .build()
            .unwrap(),
    )
    .limits(limits)
    .build()
}

/// Whole runs in both modes: no panic, and the same observable result unless the deadline
/// (the one thing that may differ) ended one of them.
#[test]
fn runs_never_panic_and_agree_in_both_modes() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let check = |source: &str| {
        let (sequential, speculative) = rt.block_on(async {
            let sequential = run_in(&fuzz_runtime(), source, Mode::Sequential).await;
            let speculative = run_in(&fuzz_runtime(), source, Mode::Speculative).await;
            (sequential, speculative)
        });
        let deadline = |o: &toolscript::RunOutcome| {
            o.result
                .as_ref()
                .is_err_and(|e| e.message.contains("deadline"))
        };
        if !deadline(&sequential) && !deadline(&speculative) {
            assert_eq!(
                observable(&sequential),
                observable(&speculative),
                "{source}"
            );
        }
    };
    for source in REGRESSIONS {
        check(source);
    }
    fuzz(cases(300), script_strategy(), |source| {
        check(&source);
        Ok(())
    });
}

/// Extreme values for any limit: zero, ones around each key's minimum and maximum, and numbers
/// no limit takes.
fn extreme_value() -> impl Strategy<Value = f64> {
    let key = || prop::sample::select(Limits::KEYS.to_vec());
    prop_oneof![
        prop::sample::select(vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            0.5,
            1e19,
            f64::MAX,
            f64::MIN,
            f64::MIN_POSITIVE,
            f64::EPSILON,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            9_007_199_254_740_993.0,
            9_007_199_254_740_992.0,
            18_446_744_073_709_551_615.0,
        ]),
        key().prop_map(|k| k.min),
        key().prop_map(|k| k.max),
        key().prop_map(|k| k.max + 1.0),
        key().prop_map(|k| k.max * 2.0),
        key().prop_map(|k| k.min - 1.0),
        any::<f64>(),
        any::<u64>().prop_map(|n| n as f64),
    ]
}

#[test]
fn extreme_limits_never_panic() {
    let settings = prop::collection::vec(
        (prop::sample::select(Limits::KEYS.to_vec()), extreme_value()),
        1..6,
    );
    fuzz(cases(2_000), settings, |settings| {
        let mut limits = Limits::default();
        for (key, value) in &settings {
            let before = limits.clone();
            match limits.set(key.name, *value) {
                Ok(()) => {
                    prop_assert!(
                        *value >= key.min && *value <= key.max,
                        "{} = {value} taken",
                        key.name
                    );
                }
                Err(e) => {
                    let e = e.to_string();
                    prop_assert!(e.contains(key.name), "{e}");
                    prop_assert_eq!(&limits, &before, "a refused value changes nothing");
                }
            }
        }
        // The limits build a runtime that compiles (a run is in `extreme_limits_run`).
        let runtime = Runtime::builder(Registry::default()).limits(limits).build();
        let _ = runtime.compile("fn f(n) { if n == 0 { 0 } else { f(n - 1) } } f(3) + ((1))");
        Ok(())
    });
}

#[test]
fn extreme_limits_in_manifests_never_panic() {
    let table = prop::collection::vec(
        (
            prop::sample::select(Limits::KEYS.to_vec()),
            prop_oneof![
                extreme_value().prop_map(|v| format!("{v:?}").replace("NaN", "nan")),
                any::<i64>().prop_map(|n| n.to_string()),
                Just("\"60\"".to_string()),
                Just("[1]".to_string()),
                Just("1979-05-27".to_string()),
            ],
        ),
        0..5,
    );
    fuzz(cases(2_000), table, |table| {
        let mut text = String::from("[limits]\n");
        for (key, value) in &table {
            text.push_str(&format!("{} = {value}\n", key.name));
        }
        let mut manifests = Manifests::new();
        if manifests.load_str(Path::new("limits.toml"), &text).is_ok() {
            let limits = manifests.limits().clone();
            for key in Limits::KEYS {
                let value = limits.get(key.name).unwrap();
                prop_assert!(
                    value >= key.min && value <= key.max,
                    "{} = {value}",
                    key.name
                );
            }
        }
        Ok(())
    });
}

#[test]
fn extreme_limits_run() {
    // Fewer cases: each is a whole run, in both modes.
    let settings = prop::collection::vec(
        (prop::sample::select(Limits::KEYS.to_vec()), extreme_value()),
        1..6,
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    fuzz(cases(64), settings, |settings| {
        let mut limits = Limits::default();
        for (key, value) in &settings {
            let _ = limits.set(key.name, *value);
        }
        // A run ends within 5 s whatever its `timeout_s`.
        limits.timeout = limits.timeout.min(Duration::from_secs(5));
        let runtime = Runtime::builder(Registry::default()).limits(limits).build();
        for mode in [Mode::Sequential, Mode::Speculative] {
            let out = rt.block_on(run_in(
                &runtime,
                "fn f(n) { if n == 0 { 0 } else { 1 + f(n - 1) } } f(20)",
                mode,
            ));
            if let Err(e) = out.result {
                prop_assert!(
                    matches!(
                        e.kind,
                        ErrorKind::LimitExceeded | ErrorKind::BudgetExceeded | ErrorKind::Timeout
                    ),
                    "{e:?}"
                );
            }
        }
        Ok(())
    });
}
