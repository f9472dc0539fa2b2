//! Missing fields named: a read of a field the map does not have, which the script does not
//! handle, is a warning of the run (line, column, the field, the map's fields, the closest);
//! handled reads, assignments and fields an output schema declares are not.

use serde_json::{json, Value};
use toolscript::{Effect, Mode, Registry, RunOutcome, Runtime, Tool, Warning};

use crate::support::{run_in, value_of};

/// Tools as most MCP servers give them: results without an output schema (`list_prs`,
/// `get_repo`), and one whose output schema declares its fields (`get_customer`).
fn catalog() -> Registry {
    let prs = Tool::builder("list_prs", Effect::Read)
        .description("Open pull requests.")
        .handler(|_| async {
            Ok(json!([
                {"id": 1, "title": "a", "age_days": 40, "author": {"login": "ann"}},
                {"id": 2, "title": "b", "age_days": 10, "author": {"login": "bob"}}
            ]))
        });
    let repo = Tool::builder("get_repo", Effect::Read)
        .handler(|_| async { Ok(json!({"name": "core", "team": "infra", "archived": false})) });
    let customer = Tool::builder("get_customer", Effect::Read)
        .input_schema(json!({"type": "object", "properties": {"id": {"type": "integer"}}}))
        .output_schema(json!({
            "type": "object",
            "properties": {"id": {"type": "integer"}, "email": {"type": "string"},
                           "vip": {"type": "boolean"},
                           "address": {"type": "object", "properties": {"city": {"type": "string"}}}},
            "required": ["id"]
        }))
        .handler(|_| async { Ok(json!({"id": 1, "address": {}})) });
    Registry::builder()
        .tools([prs, repo, customer])
        .build()
        .expect("a valid catalog")
}

fn runtime() -> Runtime {
    Runtime::new(catalog())
}

async fn run(script: &str) -> RunOutcome {
    run_in(&runtime(), script, Mode::Speculative).await
}

/// `(line, column, field, closest)` of each warning.
fn places(outcome: &RunOutcome) -> Vec<(usize, usize, String, Option<String>)> {
    outcome
        .warnings
        .iter()
        .map(|w: &Warning| {
            (
                w.line.unwrap_or_default(),
                w.column.unwrap_or_default(),
                w.field.clone(),
                w.closest.clone(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_filter_on_a_misspelt_field_names_the_field_the_map_has() {
    let outcome = run("let prs = list_prs();\nprs.filter(|p| p.age > 30)").await;
    assert_eq!(value_of(&outcome), &json!([]));
    assert_eq!(
        places(&outcome),
        vec![(2, 18, "age".into(), Some("age_days".into()))]
    );
    let w = &outcome.warnings[0];
    assert_eq!(w.fields, vec!["age_days", "author", "id", "title"]);
    assert!(
        w.message.contains("did you mean `age_days`"),
        "{}",
        w.message
    );
    let json = outcome.to_json();
    assert_eq!(json["warnings"][0]["line"], 2);
    assert_eq!(json["warnings"][0]["column"], 18);
    assert_eq!(json["warnings"][0]["closest"], "age_days");
    assert!(json.get("warnings_left_out").is_none(), "{json}");
}

#[tokio::test]
async fn every_handled_form_gives_no_warning() {
    for script in [
        "let p = list_prs()[0]; p.email ?? \"none\"",
        "let p = list_prs()[0]; if p.vipp == () { 1 } else { 2 }",
        "let p = list_prs()[0]; if p.vipp != () { 1 } else { 2 }",
        "let p = list_prs()[0]; if () == p.vipp { 1 } else { 2 }",
        "let p = list_prs()[0]; type_of(p.vipp) == \"()\"",
        "let p = list_prs()[0]; p.vipp.type_of()",
        "let p = list_prs()[0]; p.reviewers?.len()",
        "let p = list_prs()[0]; p.labels?[0]",
        "let p = list_prs()[0]; let c = p.cursor; if c == () { 0 } else { c }",
        "let p = list_prs()[0]; let c = 0; c = p.cursor; c ?? 0",
        "let p = list_prs()[0]; if \"vipp\" in p { p.vipp } else { 0 }",
        "list_prs().filter(|p| (p.draft ?? false) == false).len()",
        "let p = list_prs()[0]; p[\"vipp\"] ?? 1",
        "let m = #{}; let k = \"x\"; m[k] ?? 3",
        "let m = #{a: 1}; let k = \"x\"; m[k]",
    ] {
        let outcome = run(script).await;
        assert!(outcome.result.is_ok(), "{script}: {:?}", outcome.result);
        assert!(
            outcome.warnings.is_empty(),
            "{script}: {:?}",
            outcome.warnings
        );
    }
}

/// Each script reads one missing field unhandled (so that the hook is on), then assigns in
/// one way or another: the assignments behave as they do without it.
#[tokio::test]
async fn assignments_give_no_warning_and_keep_their_meaning() {
    let cases: &[(&str, Value)] = &[
        ("m.new_key = 1; m", json!({"a": 1, "new_key": 1})),
        ("m[\"k\"] = 2; m", json!({"a": 1, "k": 2})),
        ("let k = \"c\"; m[k] = 3; m", json!({"a": 1, "c": 3})),
        (
            "let k = \"c\"; m[k] = (m[k] ?? 0) + 1; m[k] = (m[k] ?? 0) + 1; m",
            json!({"a": 1, "c": 2}),
        ),
        ("m.a += 1; m", json!({"a": 2})),
        (
            "m.n = #{}; m.n.deep = 5; m.n.x = [1]; m.n.x.push(2); m",
            json!({"a": 1, "n": {"deep": 5, "x": [1, 2]}}),
        ),
        (
            "let k = \"z\"; m.n = #{}; m.n[k] = 1; m",
            json!({"a": 1, "n": {"z": 1}}),
        ),
        (
            "for k in [\"p\", \"q\"] { m[k] = k; } m",
            json!({"a": 1, "p": "p", "q": "q"}),
        ),
        (
            "let keys = [\"p\"]; m[keys[0]] = 7; m",
            json!({"a": 1, "p": 7}),
        ),
        (
            "if true { let k = `x${1}`; m[k] = 1; } m",
            json!({"a": 1, "x1": 1}),
        ),
        (
            "let k = \"gone\"; let v = m[k]; [m, v]",
            json!([{"a": 1}, null]),
        ),
        (
            "let v = m.gone2 ?? 0; [m, v, m.keys().len()]",
            json!([{"a": 1}, 0, 1]),
        ),
        (
            "fn add(x) { x.added = 1; x } add(m)",
            json!({"a": 1, "added": 1}),
        ),
        (
            "let f = |x| { x[\"lit\"] = 1; x }; f.call(m)",
            json!({"a": 1, "lit": 1}),
        ),
        ("let arr = [0, 0]; arr[1] = 5; arr", json!([0, 5])),
    ];
    for (body, expected) in cases {
        let script =
            format!("let m = #{{a: 1}};\nlet p = list_prs()[0]; let unhandled = p.age;\n{body}");
        let outcome = run(&script).await;
        assert_eq!(value_of(&outcome), expected, "{script}");
        assert_eq!(
            places(&outcome),
            vec![(2, 42, "age".into(), Some("age_days".into()))],
            "{script}"
        );
    }
}

/// An assignment to a computed key inside a function cannot be marked: such a script is not
/// watched, and its assignments keep working.
#[tokio::test]
async fn a_computed_assignment_inside_a_function_turns_the_watch_off_and_still_works() {
    let script = "fn tally(m, k) { m[k] = (m[k] ?? 0) + 1; m }\n\
                  let p = list_prs()[0]; let x = p.agee;\n\
                  tally(tally(#{}, \"a\"), \"a\")";
    let outcome = run(script).await;
    assert_eq!(value_of(&outcome), &json!({"a": 2}));
    assert!(outcome.warnings.is_empty(), "{:?}", outcome.warnings);
}

#[tokio::test]
async fn nested_fields_tool_results_and_literal_maps_are_watched() {
    let outcome = run("let r = get_repo(#{});\n\
                       let m = #{ name: \"x\", size: 3 };\n\
                       let a = r.teams;\n\
                       let b = m.sise;\n\
                       let c = list_prs()[0].author.logn;\n\
                       [a, b, c]")
    .await;
    assert_eq!(value_of(&outcome), &json!([null, null, null]));
    assert_eq!(
        places(&outcome),
        vec![
            (3, 11, "teams".into(), Some("team".into())),
            (4, 11, "sise".into(), Some("size".into())),
            (5, 30, "logn".into(), Some("login".into())),
        ]
    );
    // A missing field in the middle of a chain fails the run at the next step; the warning
    // says which field was missing.
    let outcome = run("let p = list_prs()[0];\np.auther.login").await;
    assert!(outcome.result.is_err());
    assert_eq!(places(&outcome)[0].2, "auther");
}

#[tokio::test]
async fn warnings_are_one_per_place_and_capped() {
    let outcome =
        run("let n = 0; for p in list_prs() { for i in 0..50 { if p.aeg == 1 { n += 1 } } } n")
            .await;
    assert_eq!(value_of(&outcome), &json!(0));
    assert_eq!(outcome.warnings.len(), 1);
    assert_eq!(outcome.warnings_left_out, 0);

    let reads: Vec<String> = (0..30).map(|i| format!("p.missing{i}")).collect();
    let script = format!("let p = list_prs()[0];\n[{}]", reads.join(", "));
    let outcome = run(&script).await;
    assert_eq!(outcome.warnings.len(), 20);
    assert_eq!(outcome.warnings_left_out, 10);
    assert_eq!(outcome.warnings[0].field, "missing0");
    assert_eq!(outcome.warnings[19].field, "missing19");
    // The output keeps the first that fit in its budget and counts the rest.
    let json = outcome.to_json();
    let kept = json["warnings"].as_array().map_or(0, Vec::len);
    assert!(kept >= 3, "{json}");
    assert_eq!(json["warnings_left_out"], 30 - kept);
    assert_eq!(json["warnings"][0]["field"], "missing0");
}

#[tokio::test]
async fn a_field_an_output_schema_declares_is_not_warned_about() {
    // `vip` is declared by `get_customer`'s output schema: optional, so a missing one is no
    // surprise, on any map. `vipp` is declared nowhere.
    let outcome = run("let c = get_customer(#{id: 1});\n\
                       let p = list_prs()[0];\n\
                       [c.vip, c.email, p.vip, c.address.city, c.vipp]")
    .await;
    assert_eq!(value_of(&outcome), &json!([null, null, null, null, null]));
    assert_eq!(places(&outcome), vec![(3, 43, "vipp".into(), None)]);
}

#[tokio::test]
async fn speculative_and_sequential_runs_give_the_same_warnings() {
    let script = "let prs = list_prs();\n\
                  let r = get_repo(#{});\n\
                  let old = prs.filter(|p| p.age > 30);\n\
                  for p in prs { if p.author.name == r.owner { old.push(p.id) } }\n\
                  [old, r.team]";
    let runtime = runtime();
    let speculative = run_in(&runtime, script, Mode::Speculative).await;
    let sequential = run_in(&runtime, script, Mode::Sequential).await;
    assert_eq!(speculative.warnings, sequential.warnings);
    assert_eq!(places(&sequential).len(), 3, "{:?}", sequential.warnings);
    assert_eq!(speculative.result, sequential.result);
}

#[tokio::test]
async fn a_thousand_missing_fields_never_blow_the_output_budget() {
    let reads: Vec<String> = (0..1000)
        .map(|i| format!("p.{}{i}", "very_long_field_name_".repeat(3)))
        .collect();
    let script = format!(
        "let p = #{{ {} }};\n[{}]",
        (0..300)
            .map(|i| format!("f{i}: {i}"))
            .collect::<Vec<_>>()
            .join(", "),
        reads.join(", ")
    );
    let mut limits = toolscript::Limits::default();
    limits.max_inline_tokens = 300;
    let runtime = Runtime::builder(catalog()).limits(limits).build();
    let outcome = run_in(&runtime, &script, Mode::Sequential).await;
    let report = outcome.report();
    let text = serde_json::to_string(&report.warnings).unwrap();
    assert!(text.len() < 2_000, "{}", text.len());
    assert_eq!(report.warnings.len() + report.warnings_left_out, 1000);
    assert!(report.warnings_left_out >= 980);
}

#[test]
fn check_warns_where_an_output_schema_says_which_fields_exist() {
    let runtime = runtime();
    let problems = runtime
        .check(
            "let c = get_customer(#{id: 1});\n\
             let a = c.emial;\n\
             let b = get_customer(#{id: 2}).address.ctiy;\n\
             let fine = [c.email, c.nickname ?? \"\", c.address.city, c.zzzzzz];\n\
             let p = list_prs()[0];\n\
             [a, b, p.agee, fine]",
        )
        .expect("compiles");
    let found: Vec<(Option<usize>, Option<usize>, &str)> = problems
        .iter()
        .map(|p| (p.line, p.column, p.message.as_str()))
        .collect();
    assert_eq!(found.len(), 2, "{problems:#?}");
    assert!(problems
        .iter()
        .all(|p| p.severity == toolscript::Severity::Warning));
    assert_eq!((found[0].0, found[0].1), (Some(2), Some(11)));
    assert!(
        found[0]
            .2
            .contains("`get_customer`'s result has no field `emial`"),
        "{}",
        found[0].2
    );
    assert!(
        found[0].2.contains("did you mean `email`?"),
        "{}",
        found[0].2
    );
    assert_eq!((found[1].0, found[1].1), (Some(3), Some(40)));
    assert!(
        found[1].2.contains("did you mean `city`?"),
        "{}",
        found[1].2
    );
    assert!(problems[0]
        .suggested_next_action
        .as_deref()
        .is_some_and(|a| a.contains("`email`")));
}

#[test]
fn check_follows_a_variable_only_while_it_holds_the_result() {
    let runtime = runtime();
    for script in [
        // Bound twice: which result it holds depends on the path taken.
        "let c = get_customer(#{id: 1}); if true { let c = #{emial: 1}; c.emial } else { 0 }",
        // Assigned afterwards.
        "let c = get_customer(#{id: 1}); c = #{emial: 1}; c.emial",
        // Handled.
        "let c = get_customer(#{id: 1}); c.emial ?? \"\"",
        // A tool whose result has no declared fields.
        "let r = get_repo(#{}); r.teamm",
        // A function's parameter of the same name.
        "fn f(c) { c.emial } let c = get_customer(#{id: 1}); f(#{emial: 1})",
    ] {
        let problems = runtime.check(script).expect("compiles");
        assert!(
            problems.iter().all(|p| !p.message.contains("has no field")),
            "{script}: {problems:#?}"
        );
    }
    let problems = runtime
        .check("for c in [get_customer(#{id: 1})] { c.emial }")
        .expect("compiles");
    assert!(problems.iter().all(|p| !p.message.contains("has no field")));
}

#[cfg(feature = "cli")]
#[test]
fn the_command_line_prints_warnings_on_stderr_and_in_json() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("s.rhai");
    std::fs::write(
        &script,
        "let c = get_customer(#{id: 3});\nlet m = #{ total: 1 };\n[c.name, m.totl]",
    )
    .unwrap();
    let path = script.to_str().unwrap();
    let out = crate::cli::toolscript(&["run", path]);
    assert_eq!(out.code, 0, "{out:?}");
    let line = out
        .stderr
        .lines()
        .find(|l| l.starts_with("warning: "))
        .unwrap_or_else(|| panic!("{out:?}"));
    assert!(
        line.starts_with("warning: line 3, column 12: the map has no field `totl`"),
        "{line}"
    );
    assert!(
        line.contains("did you mean `total`?") && line.contains("(its fields: total)"),
        "{line}"
    );
    assert!(!out.stdout.contains("warning"), "{out:?}");

    let out = crate::cli::toolscript(&["run", path, "--json"]);
    let json: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    assert_eq!(json["warnings"][0]["field"], "totl");
    assert_eq!(json["warnings"][0]["line"], 3);
    assert!(!out.stderr.contains("warning"), "{out:?}");
}

#[cfg(feature = "cli")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_result_carries_the_warnings() {
    use crate::mcp_server::{
        arguments, assert_matches_output_schema, outcome_of, serve_session, wire,
    };
    let session = async {
        let client = serve_session(&[], &crate::support::test_store()).await;
        let tools = client.list_all_tools().await.expect("tools/list answers");
        let run_script = tools.iter().find(|t| t.name == "run_script").unwrap();
        let params = rmcp::model::CallToolRequestParams::new("run_script").with_arguments(
            arguments(json!({"script": "let c = get_customer(#{id: 3});\nc.nmae"})),
        );
        let result = client.call_tool(params).await.expect("run_script answers");
        let outcome = outcome_of(&wire(&result));
        assert_matches_output_schema(run_script, &outcome);
        assert_eq!(outcome["ok"], true);
        assert_eq!(outcome["warnings"][0]["field"], "nmae");
        assert_eq!(outcome["warnings"][0]["closest"], "name");
        assert_eq!(outcome["warnings"][0]["line"], 2);
        assert_eq!(outcome["warnings"][0]["column"], 3);
        client.cancel().await.ok();
    };
    tokio::time::timeout(std::time::Duration::from_secs(60), session)
        .await
        .expect("the session finished in time");
}
