//! The list and map helpers models reach for (`sum`, `min`/`max` of an array, `join`, `sort_by`
//! with a key, `group_by`, `unique`, ...): what each gives, that Rhai's own meaning of a shared
//! name stays, that bad input is a placed error, and that a read inside a helper's closure is
//! speculated like a read anywhere else.

use std::time::Duration;

use serde_json::{json, Value};
use toolscript::{Effect, Mode, Registry, Runtime, Tool};

use crate::support::{error_of, fixture_runtime, run_in, value_of, Probe};

/// Each script's value, the same sequentially and speculatively.
const CASES: &[(&str, &str)] = &[
    ("[1, 2, 3].sum()", "6"),
    ("[1, 2.5].sum()", "3.5"),
    ("[].sum()", "0"),
    ("sum([4, 5])", "9"),
    ("[3, 1, 2].min()", "1"),
    ("[3, 1, 2].max()", "3"),
    (r#"["b", "a", "c"].max()"#, r#""c""#),
    ("[2, 1.5].min()", "1.5"),
    ("[].max()", "null"),
    // Rhai's two-number `min` and `max` stay.
    ("min(4, 2) + max(4, 2)", "6"),
    (
        r#"[#{n: "a", v: 3}, #{n: "b", v: 9}].max_by(|x| x.v).n"#,
        r#""b""#,
    ),
    (
        r#"[#{n: "a", v: 3}, #{n: "b", v: 9}].min_by(|x| x.v).n"#,
        r#""a""#,
    ),
    (r#"["a", "b", "c"].join(", ")"#, r#""a, b, c""#),
    (r#"[1, "x", true].join("-")"#, r#""1-x-true""#),
    ("[1, 2].join()", r#""1,2""#),
    (r#"", ".join(["a", "b"])"#, r#""a, b""#),
    // A key: sorted by it, stable, in place and given back.
    (
        r#"let a = [#{n: "x", v: 2}, #{n: "y", v: 1}, #{n: "z", v: 2}]; let s = a.sort_by(|p| p.v); [s.map(|p| p.n), a[0].n]"#,
        r#"[["y", "x", "z"], "y"]"#,
    ),
    (
        r#"["bb", "a", "ccc"].sort_by(|s| s.len())"#,
        r#"["a", "bb", "ccc"]"#,
    ),
    // A comparator: Rhai's meaning, and the array given back too.
    (
        "let a = [3, 1, 2]; let s = a.sort_by(|x, y| y - x); [s, a]",
        "[[3, 2, 1], [3, 2, 1]]",
    ),
    ("[].sort_by(|x| x)", "[]"),
    (
        r#"let g = [#{t: "a", v: 1}, #{t: "b", v: 2}, #{t: "a", v: 3}].group_by(|x| x.t); [g.a.len(), g.b[0].v, g.keys()]"#,
        r#"[2, 2, ["a", "b"]]"#,
    ),
    (
        "[1, 2, 1].group_by(|x| x % 2 == 0)",
        r#"{"false": [1, 1], "true": [2]}"#,
    ),
    (
        r#"[3, 1, 3, "3", 1, #{a: 1}, #{a: 1}].unique()"#,
        r#"[3, 1, "3", {"a": 1}]"#,
    ),
    ("[[1, 2], [3]].flat_map(|x| x)", "[1, 2, 3]"),
    ("[1, 2].flat_map(|x| [x, x * 10])", "[1, 10, 2, 20]"),
    ("[1, 2].flat_map(|x| x + 1)", "[2, 3]"),
    ("[1, 2, 3, 4].count(|x| x > 2)", "2"),
    (r#"["a", "b", "a"].count("a")"#, "2"),
    ("[7, 8].first() + [7, 8].last()", "15"),
    ("[[].first(), [].last()]", "[null, null]"),
    ("[1, 2, 3, 4].skip(1).take(2)", "[2, 3]"),
    ("[1, 2].skip(-1)", "[1, 2]"),
    ("[1, 2].take(5)", "[1, 2]"),
    // Rhai's one-argument `take` stays.
    ("let x = 5; let y = take(x); [x, y]", "[null, 5]"),
    ("#{a: 1, b: 2}.entries()", r#"[["a", 1], ["b", 2]]"#),
    ("round(3.14159, 2)", "3.14"),
    ("round(1234.5, -2)", "1200.0"),
    ("round(7, 2)", "7"),
    // Rhai's one-argument `round` stays.
    ("round(2.5)", "3.0"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_helpers_give_what_models_expect_in_both_modes() {
    let probe = Probe::default();
    let runtime = fixture_runtime(&probe);
    for (script, expected) in CASES {
        let expected: Value = serde_json::from_str(expected).unwrap();
        for mode in [Mode::Sequential, Mode::Speculative] {
            let outcome = run_in(&runtime, script, mode).await;
            match &outcome.result {
                Ok(v) => assert_eq!(v, &expected, "{script} ({mode:?})"),
                Err(e) => panic!("{script} ({mode:?}) failed: {e}"),
            }
        }
    }
}

/// Input a helper cannot use is an error at the helper's call, with what to do instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_to_a_helper_is_a_placed_error() {
    let probe = Probe::default();
    let runtime = fixture_runtime(&probe);
    for (script, says) in [
        (
            "let x = 1;\nlet s = [1, \"two\", 3].sum();",
            "item 1 is string",
        ),
        ("let x = 1;\nlet s = [1, #{a: 1}].max();", "cannot compare"),
        (
            "let x = 1;\nlet s = [#{v: 1}, #{v: \"a\"}].sort_by(|p| p.v);",
            "cannot compare the keys",
        ),
        (
            "let x = 1;\nlet s = [#{v: []}, #{v: []}].min_by(|p| p.v);",
            "cannot compare the keys",
        ),
    ] {
        let outcome = run_in(&runtime, script, Mode::Sequential).await;
        let e = error_of(&outcome);
        assert!(e.message.contains(says), "{script}: {}", e.message);
        assert_eq!(e.line, Some(2), "{script}: {e:?}");
        assert!(e.column.is_some(), "{script}: {e:?}");
    }
}

/// A read in a helper's closure is started by the scout, as in `map`: the run's reads are
/// claimed from speculation, and the value is the sequential one. The read takes 30 ms, so
/// that the scout is ahead of the script however loaded the machine is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_inside_a_helper_s_closure_are_speculated() {
    let slow = Tool::builder("get_user", Effect::Read).handler(|args: Value| async move {
        tokio::time::sleep(Duration::from_millis(30)).await;
        let id = args["id"].as_i64().unwrap_or_default();
        Ok(json!({"id": id, "name": format!("user{id}"), "active": id % 2 == 0}))
    });
    let runtime = Runtime::new(Registry::builder().tool(slow).build().unwrap());
    let script = r#"
        let ids = [1, 2, 3, 4, 5, 6];
        let by = ids.group_by(|i| if get_user(#{id: i}).active { "on" } else { "off" });
        let oldest = ids.max_by(|i| get_user(#{id: i}).id);
        let names = ids.sort_by(|i| -get_user(#{id: i}).id).map(|i| get_user(#{id: i}).name);
        [by.on.len(), oldest, names.join(" "), ids.count(|i| get_user(#{id: i}).active)]
    "#;
    let expected = json!([3, 6, "user6 user5 user4 user3 user2 user1", 3]);
    let sequential = run_in(&runtime, script, Mode::Sequential).await;
    assert_eq!(value_of(&sequential), &expected);
    let speculative = run_in(&runtime, script, Mode::Speculative).await;
    assert_eq!(value_of(&speculative), &expected);
    // Six distinct reads, each made once; at least the group_by's are claimed from the scout.
    assert_eq!(speculative.stats.dispatched, 6, "{:?}", speculative.stats);
    assert!(
        speculative.stats.speculative_claimed >= 1,
        "{:?}",
        speculative.stats
    );
}
