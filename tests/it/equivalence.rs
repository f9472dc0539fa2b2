//! Speculation never changes a run's result: for every script of the corpus — `scripts/`, the
//! benchmark scenarios, the tests' own scripts — and for random scripts, the speculative and the
//! sequential run give the same value or error (kind, line, column), logs and effects; random
//! scripts that retry reads failing by their arguments and occurrence also make the same calls,
//! with the same receipts.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{json, Value};
use toolscript::bench::observable;
use toolscript::{
    demo_catalog, Effect, ErrorKind, Manifests, Mode, Registry, RunOutcome, Runtime, Tool,
    ToolBuilder, ToolError,
};

use crate::support::{by_occurrence, fixture_registry, run_in, Probe};

/// Runs `script` once in each mode, each on a fresh runtime, and returns both observable
/// results and the number of speculative reads the executor claimed.
async fn both(make: &dyn Fn() -> Runtime, script: &str) -> (Value, Value, u64) {
    let (sequential, speculative) = both_outcomes(make, script).await;
    (
        observable(&sequential),
        observable(&speculative),
        speculative.stats.speculative_claimed,
    )
}

/// Runs `script` once in each mode, each on a fresh runtime: (sequential, speculative).
pub(crate) async fn both_outcomes(
    make: &dyn Fn() -> Runtime,
    script: &str,
) -> (RunOutcome, RunOutcome) {
    let sequential = run_in(&make(), script, Mode::Sequential).await;
    let speculative = run_in(&make(), script, Mode::Speculative).await;
    assert_eq!(sequential.stats.speculative_launched, 0);
    (sequential, speculative)
}

fn bench_catalog(latency_ms: u64) -> Runtime {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/bench/catalog.toml");
    let text = std::fs::read_to_string(path)
        .unwrap()
        .replace("latency_ms = 20", &format!("latency_ms = {latency_ms}"));
    let mut manifests = Manifests::new();
    manifests.load_str(Path::new(path), &text).unwrap();
    Runtime::new(manifests.into_registry().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sample_scripts_give_the_same_result() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts");
    let mut samples = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        // MCP samples need their servers: the MCP tests cover them.
        let mcp = path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("mcp_"));
        if path.extension().is_some_and(|e| e == "rhai") && !mcp {
            let script = std::fs::read_to_string(&path).unwrap();
            let (a, b, claimed) = both(&|| Runtime::new(demo_catalog().unwrap()), &script).await;
            assert_eq!(a, b, "{}", path.display());
            // Every sample makes independent reads of the demo's 20-80 ms tools.
            assert!(claimed > 0, "{}: nothing was speculated", path.display());
            samples += 1;
        }
    }
    assert!(samples >= 2, "only {samples} sample scripts found");
    let mut checked = 0;
    for entry in std::fs::read_dir(format!("{dir}/bench")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        // Long chains take seconds sequentially; the 10- and 50-page chains stand for them.
        if path.extension().is_none_or(|e| e != "rhai")
            || name == "chain_1000.rhai"
            || name.starts_with("mcp_")
        {
            continue;
        }
        let script = std::fs::read_to_string(&path).unwrap();
        for latency in [0, 2] {
            let (a, b, claimed) = both(&|| bench_catalog(latency), &script).await;
            assert_eq!(a, b, "{name} at {latency} ms");
            // With latency to hide, every scenario but a pure dependency chain gives the scout
            // independent reads to start early (a chain's next page may or may not be claimed
            // first, by timing); at 0 ms the executor may well be first.
            let chain = name.starts_with("chain_") || name.starts_with("pagination");
            if latency > 0 && !chain {
                assert!(
                    claimed > 0,
                    "{name} at {latency} ms: nothing was speculated"
                );
            }
        }
        checked += 1;
    }
    assert!(checked >= 8, "only {checked} bench scripts found");
    // The model-style corpus: the same result in both modes. (Whether it is speculated is
    // what `toolscript bench` measures against each script's declared best; several shapes
    // are not yet.)
    let mut model = 0;
    for entry in std::fs::read_dir(format!("{dir}/bench/model")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name.starts_with("fanout_1000") {
            continue;
        }
        let script = std::fs::read_to_string(&path).unwrap();
        let (a, b, _) = both(&|| bench_catalog(1), &script).await;
        assert_eq!(a, b, "{name}");
        assert!(a["result"].get("value").is_some(), "{name} runs: {a}");
        model += 1;
    }
    assert!(model >= 25, "only {model} model scripts found");
}

/// Scripts the other tests use, on the fixture catalog.
const CORPUS: &[&str] = &[
    "let x = 1;\nget_usr(#{id: 1})",
    "create_order(#{user: 1});\n  create_order(#{user: 1})",
    "get_user(#{id: \"seven\"})",
    "let u = get_user(#{id: 1});\nlet v = bad_output();",
    "boom()",
    "get_user(#{id: 1000})",
    "let a = 1;\na + missing",
    "throw #{kind: \"rate_limited\", message: \"slow down\"}",
    "let kinds = [];\nfor i in 0..7 {\n  try { flaky(#{i: i}); } catch (e) { kinds.push(e.kind); }\n}\nkinds",
    "let a = get_user(#{id: 1});\nlet b = get_user(#{id: 1});\nlet c = get_user(#{id: 2});\n[a.name, b.name, c.name]",
    "get_user(#{id: 1});\ncreate_order(#{user: 1});\nget_user(#{id: 1});\nnotify(#{});\nget_user(#{id: 1}); get_user(#{id: 1});",
    "let kinds = [];\nfor i in 0..3 { try { get_user(#{id: 500}); } catch (e) { kinds.push(e.kind); } }\nkinds",
    "[poll(), poll(), poll()]",
    "create_order(#{user: 3});\ntry { create_order(#{user: 0}); } catch {}\ntry { create_order(#{user: 3}); } catch {}\nnotify(#{to: \"ops\"});\nif false { create_order(#{user: 9}); }\nget_user(#{id: 1}).name",
    "print(\"one\"); debug(2); print(`three ${1 + 2}`); 0",
    "fn lookup(id) {\n    get_user(#{id: id})\n}\nlet a = lookup(1);\nlookup(1000)",
    "let active = [];\nfor id in 1..=6 { let u = get_user(#{id: id}); if u.active { active.push(u.name); } }\nactive",
    "let n = 0;\nfor id in 1..=6 {\n  let u = lookup(#{id: id});\n  if u.active { n += orders_of(#{id: u.id}).len(); }\n}\nn",
    "let u = lookup(#{id: 4});\nlet name = `user ${u.id}`;\nlet o = orders_of(#{id: u.id + 1});\nswitch u.id { 4 => o.len(), _ => -1 }",
    "let xs = [lookup(#{id: 1}), lookup(#{id: 2})];\nlet pick = xs[lookup(#{id: 3}).id % 2];\npick.id ?? 0",
    "let u = lookup(#{id: 2});\nif type_of(u.id) == \"i64\" && u.active || false { create_order(#{user: u.id}) } else { 0 }",
    "let total = 0;\nlet u = lookup(#{id: 1});\nwhile total < 3 && lookup(#{id: total}).id >= 0 { total += 1; }\ntotal",
    "let first = lookup(#{id: 1});\ncreate_order(#{user: first.id});\nlet second = lookup(#{id: 1});\n[first.id, second.id, orders_of(#{id: second.id})]",
    "let e = ();\ntry { lookup(#{id: \"x\"}); } catch (err) { e = err.kind; }\ntry { hang(); } catch (err) { e += err.kind; }\ne",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_test_corpus_gives_the_same_result() {
    for script in CORPUS {
        let (a, b, claimed) = both(
            &|| Runtime::new(fixture_registry(&Probe::default())),
            script,
        )
        .await;
        assert_eq!(a, b, "{script}");
        // Several independent reads of a 30 ms tool: the scout starts the later ones while the
        // executor waits for the first. (Zero-latency reads race the executor: no assertion.)
        let independent_slow_reads =
            script.contains("lookup(#{id: id})") || script.starts_with("let xs = [lookup");
        if independent_slow_reads {
            assert!(claimed > 0, "nothing was speculated: {script}");
        }
    }
}

/// The random scripts' catalog: reads whose results depend on how many writes happened (so a
/// read started in the wrong epoch shows), failing reads, a write that can conflict, an
/// external call, and a read and a write composite. Latencies of 0 to 2 ms let the scout and the executor race.
fn random_catalog() -> Runtime {
    Runtime::new(Registry::builder().tools(random_tools()).build().unwrap())
}

pub(crate) fn random_tools() -> Vec<Tool> {
    random_tools_with(false)
}

/// A call's latency: none at all is no wait, so that the call answers at its first poll, as a
/// native lookup does (a tool whose calls keep doing so is quick, and the scout holds its
/// reads for the executor).
async fn took(latency: Duration) {
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
}

/// The random catalog's tools; with `cache`, `get`, `list` and the composite `pair` keep their
/// results for a minute, and `put` and `put_checked` invalidate `get`'s entries only (so that
/// `list`'s go stale within their lifetime, as a cache's may).
pub(crate) fn random_tools_with(cache: bool) -> Vec<Tool> {
    let cached = |builder: ToolBuilder| match cache {
        true => builder.cache_ttl(Duration::from_secs(60)),
        false => builder,
    };
    let invalidating = |builder: ToolBuilder| match cache {
        true => builder.invalidates(["get"]),
        false => builder,
    };
    let puts = Arc::new(Mutex::new(0_i64));
    let latency = |id: i64| Duration::from_micros((id.unsigned_abs() % 3) * 700);
    let (p1, p2, p3) = (Arc::clone(&puts), Arc::clone(&puts), Arc::clone(&puts));
    let get = cached(Tool::builder("get", Effect::Read))
        .input_schema(json!({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}))
        .handler(move |args| {
            let puts = *p1.lock().unwrap();
            async move {
                let id = args["id"].as_i64().unwrap_or_default();
                took(latency(id)).await;
                if !(0..17).contains(&id) {
                    return Err(ToolError::not_found(format!("no record {id}")));
                }
                Ok(json!({"id": id, "v": (id * 7 + puts) % 13, "ok": (id + puts) % 3 != 0, "next": (id * 5 + 1) % 20}))
            }
        });
    let list = cached(Tool::builder("list", Effect::Read))
        .input_schema(
            json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
        )
        .handler(move |args| {
            let puts = *p2.lock().unwrap();
            async move {
                let n = args["n"].as_i64().unwrap_or_default();
                took(latency(n + 1)).await;
                Ok(json!([(n + puts) % 20, (n + 1) % 20, (n + 2 * puts) % 20]))
            }
        });
    let put = invalidating(Tool::builder("put", Effect::Write))
        .input_schema(
            json!({"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"]}),
        )
        .handler(move |args| {
            let puts = Arc::clone(&p3);
            async move {
                let k = args["k"].as_i64().unwrap_or_default();
                took(latency(k)).await;
                if k % 7 == 6 {
                    return Err(ToolError::new(
                        toolscript::ErrorKind::Conflict,
                        format!("key {k} is locked"),
                    ));
                }
                let mut n = puts.lock().unwrap();
                *n += 1;
                Ok(json!(*n))
            }
        });
    // A read by name (`r<id>`), for interpolated and concatenated arguments.
    let p4 = Arc::clone(&puts);
    let find = Tool::builder("find", Effect::Read)
        .input_schema(json!({"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}))
        .handler(move |args| {
            let puts = *p4.lock().unwrap();
            async move {
                let name = args["name"].as_str().unwrap_or_default().to_string();
                let id = name.strip_prefix('r').and_then(|n| n.parse::<i64>().ok());
                took(latency(id.unwrap_or(1))).await;
                match id {
                    Some(id) if (0..17).contains(&id) => {
                        Ok(json!({"id": id, "v": (id * 5 + puts) % 11, "name": name}))
                    }
                    _ => Err(ToolError::not_found(format!("no record named {name}"))),
                }
            }
        });
    // A read that answers at its first poll, always: after four calls it is quick, and the
    // scout holds its reads for the executor (and starts them when the executor waits).
    let p5 = Arc::clone(&puts);
    let tally = Tool::builder("tally", Effect::Read).handler(move |args| {
        let puts = *p5.lock().unwrap();
        async move {
            let i = args["i"].as_i64().unwrap_or_default();
            Ok(json!({"i": i, "v": (i * 3 + puts) % 7}))
        }
    });
    let notify = Tool::builder("notify", Effect::External)
        .handler(|args| async move { Ok(json!({"sent": args})) });
    // A read composite (speculated as a whole) and a write composite (never speculated).
    let pair = cached(Tool::builder("pair", Effect::Read))
        .nested(["get", "list"])
        .composite(|args, ctx| async move {
            let record = ctx.call("get", json!({"id": args["id"]})).await?;
            let listed = ctx.call("list", json!({"n": record["next"]})).await?;
            Ok(json!({"v": record["v"], "first": listed[0]}))
        });
    let put_checked = invalidating(Tool::builder("put_checked", Effect::Write))
        .nested(["get", "put"])
        .composite(|args, ctx| async move {
            let record = ctx.call("get", json!({"id": args["k"]})).await?;
            ctx.call("put", json!({"k": record["next"]})).await
        });
    vec![get, list, put, notify, pair, put_checked, find, tally]
}

/// A random script: statements over reads, writes, conditions, loops and try/catch, reads
/// whose arguments are interpolated or concatenated from other reads, and a map `m` keyed by
/// read fields (the scout's deferred values).
pub(crate) fn script_strategy() -> impl Strategy<Value = String> {
    scripts_with(false, false)
}

/// Script functions the random scripts with functions define: each helper is one of a few
/// shapes — a branch on a read, an early `return` guard, a loop that returns the first match,
/// a conditional write, a recursive walk along `next`, a caught failing read — with random
/// constants. Ids are taken modulo 17, the records that exist, so that most calls succeed. `h0` to `h3` take an id; `walk(id, n)` recurses.
fn helpers_strategy() -> impl Strategy<Value = String> {
    let shape = (0_usize..6, 0_i64..13, 0_i64..20).prop_map(|(shape, k, j)| match shape {
        0 => format!("let r = get(#{{id: id % 17}});\nif r.ok {{ get(#{{id: (r.next + {j}) % 17}}).v }} else {{ r.v + {k} }}"),
        1 => format!("let r = get(#{{id: id % 17}});\nif !r.ok || r.v > {k} {{ return -1; }}\nr.v + get(#{{id: r.next % 17}}).v"),
        2 => format!("for i in list(#{{n: id % 17}}) {{\nlet r = get(#{{id: i % 17}});\nif r.ok && r.v > {k} {{ return r.id; }}\n}}\n()"),
        3 => format!("let r = get(#{{id: id % 17}});\nif r.v > {k} {{ put(#{{k: (r.next + {j}) % 17}}); }}\nr.v"),
        4 => format!("try {{\nlet r = get(#{{id: id + {j}}});\nif r.ok {{ r.v }} else {{ -r.v }}\n}} catch (e) {{ e.kind }}"),
        _ => format!("let r = get(#{{id: id % 17}});\nswitch r.v % 3 {{ 0 if r.ok => r.next, 1 => get(#{{id: r.next % 17}}).v, _ => {k} }}"),
    });
    (prop::collection::vec(shape, 4), 0_i64..13).prop_map(|(shapes, k)| {
        let mut out: Vec<String> = shapes
            .iter()
            .enumerate()
            .map(|(i, body)| format!("fn h{i}(id) {{\n{body}\n}}"))
            .collect();
        out.push(format!(
            "fn walk(id, n) {{\nif n <= 0 {{ return id; }}\nlet r = get(#{{id: id % 17}});\nif r.ok || r.v > {k} {{ walk(r.next % 17, n - 1) }} else {{ r.id }}\n}}"
        ));
        out.join("\n")
    })
}

/// Random scripts; with `edges`, also calls of the edge catalog's tools (see [`edge_catalog`]);
/// with `functions`, also calls of script functions ([`helpers_strategy`]) and closures with
/// conditions and reads, passed to `map`, `filter` and `reduce` or called.
fn scripts_with(edges: bool, functions: bool) -> impl Strategy<Value = String> {
    let id = prop_oneof![
        (0_i64..20).prop_map(|k| k.to_string()),
        (0_usize..4, 0_i64..5).prop_map(|(v, k)| format!("(x{v}.next + {k}) % 20")),
        (0_usize..4).prop_map(|v| format!("x{v}.v")),
    ];
    let leaf = prop_oneof![
        id.clone()
            .prop_map(|e| format!("acc.push(get(#{{id: {e}}}).v);")),
        (0_usize..4).prop_map(|v| format!("acc.push(x{v}.v);")),
        id.clone().prop_map(|e| format!("put(#{{k: {e}}});")),
        id.clone()
            .prop_map(|e| format!("try {{ put(#{{k: {e}}}); }} catch (e) {{ acc.push(e.kind); }}")),
        id.clone().prop_map(|e| format!("notify(#{{n: {e}}});")),
        (0_usize..4).prop_map(|v| format!("print(`x{v}=${{x{v}.v}}`);")),
        id.clone()
            .prop_map(|e| format!("acc.push(get(#{{id: get(#{{id: {e}}}).next}}).id);")),
        id.clone()
            .prop_map(|e| format!("acc.push(pair(#{{id: {e}}}).first);")),
        id.clone().prop_map(|e| format!(
            "try {{ acc.push(put_checked(#{{k: {e}}})); }} catch (e) {{ acc.push(e.kind); }}"
        )),
        // The executor waits in a sleep as for a call: the scout starts what it held.
        (1_u32..4).prop_map(|ms| format!("sleep({ms}.0 / 1000.0);")),
        (4_i64..12, 0_usize..4).prop_map(|(n, v)| format!(
            "for i in 0..{n} {{ acc.push(tally(#{{i: i + x{v}.v}}).v); }}"
        )),
    ];
    // Interpolated and concatenated arguments, and the map `m` keyed by read fields.
    let key = prop_oneof![
        (0_usize..4).prop_map(|v| format!("`k${{x{v}.v}}`")),
        (0_usize..4).prop_map(|v| format!("\"k\" + x{v}.next")),
        id.clone()
            .prop_map(|e| format!("find(#{{name: `r${{{e}}}`}}).name")),
    ];
    let derived = prop_oneof![
        id.clone()
            .prop_map(|e| format!("acc.push(find(#{{name: `r${{{e}}}`}}).v);")),
        (0_usize..4).prop_map(|v| format!("acc.push(find(#{{name: \"r\" + x{v}.v}}).id);")),
        (0_usize..4, 0_usize..4).prop_map(|(a, b)| format!(
            "try {{ acc.push(find(#{{name: `r${{x{a}.v}}${{x{b}.v}}`}}).v); }} catch (e) {{ acc.push(e.kind); }}"
        )),
        (key.clone(), id.clone()).prop_map(|(k, e)| format!("m[{k}] = get(#{{id: {e}}}).v;")),
        key.clone().prop_map(|k| format!(
            "let k = {k};\nif k in m {{ m[k] += 1; }} else {{ m[k] = 1; }}"
        )),
        key.clone().prop_map(|k| format!("acc.push(m[{k}] ?? -1);")),
        Just("acc.push(m.len());".to_string()),
        Just(
            "for k in m.keys() {\ntry { acc.push(find(#{name: \"r\" + m[k]}).v); } catch (e) { acc.push(e.kind); }\n}"
                .to_string()
        ),
    ];
    let leaf = prop_oneof![3 => leaf, 2 => derived];
    let edge_id = prop_oneof![4 => id.clone(), 1 => Just("-1".to_string())];
    let edge = prop_oneof![
        edge_id.clone().prop_map(|e| format!(
            "try {{ acc.push(shaky(#{{id: {e}}})); }} catch (e) {{ acc.push(e.kind); }}"
        )),
        edge_id.clone().prop_map(|e| format!(
            "try {{ acc.push(slowish(#{{id: {e}}}).id); }} catch (e) {{ acc.push(e.kind); }}"
        )),
        edge_id.clone().prop_map(|e| format!(
            "try {{ acc.push(careful(#{{id: {e}}})); }} catch (e) {{ acc.push(e.kind); }}"
        )),
        edge_id.prop_map(|e| format!("acc.push(shaky(#{{id: {e}}}));")),
    ];
    let calls = prop_oneof![
        (0_usize..4, id.clone()).prop_map(|(h, e)| format!("acc.push(h{h}({e}));")),
        (id.clone(), 0_i64..4).prop_map(|(e, n)| format!("acc.push(walk({e}, {n}));")),
        (0_usize..4).prop_map(|h| format!("for i in 0..6 {{ acc.push(h{h}(i * 3)); }}")),
        (id.clone(), 0_i64..13).prop_map(|(e, k)| format!(
            "acc.push(list(#{{n: {e}}}).map(|i| if get(#{{id: i % 17}}).ok {{ i }} else {{ -i }}));\nacc.push(list(#{{n: ({e} + 1) % 20}}).filter(|i| get(#{{id: i % 17}}).v > {k}).len());"
        )),
        (id.clone(), 0_usize..4).prop_map(|(e, v)| format!(
            "acc.push(list(#{{n: {e}}}).reduce(|s, i| if get(#{{id: i % 17}}).ok && x{v}.ok {{ s + i }} else {{ s }}, 0));"
        )),
        (0_usize..4, id.clone()).prop_map(|(v, e)| format!(
            "let f = |i| {{ let r = get(#{{id: (i + x{v}.next) % 17}}); if r.ok {{ return r.v; }} h{v}(r.next) }};\nacc.push(f.call({e}));\nacc.push([1, 2, 3].map(|j| f.call(j * 4)));"
        )),
    ];
    let leaf = match (edges, functions) {
        (true, _) => prop_oneof![2 => leaf, 1 => edge].boxed(),
        (false, true) => prop_oneof![1 => leaf, 1 => calls].boxed(),
        (false, false) => leaf.boxed(),
    };
    let block = leaf.prop_recursive(3, 24, 4, move |inner| {
        let body = prop::collection::vec(inner, 1..4).prop_map(|s| s.join("\n"));
        prop_oneof![
            (0_usize..4, body.clone(), body.clone()).prop_map(|(v, a, b)| format!(
                "if x{v}.ok {{\n{a}\n}} else {{\n{b}\n}}"
            )),
            (0_i64..20, body.clone()).prop_map(|(n, b)| format!(
                "for i in list(#{{n: {n}}}) {{\nlet x0 = get(#{{id: i}});\n{b}\n}}"
            )),
            body.clone().prop_map(|b| format!("try {{\n{b}\n}} catch (e) {{ acc.push(e.kind); }}")),
            (0_usize..4, body.clone()).prop_map(|(v, b)| format!(
                "let c = 0;\nwhile c < 3 && get(#{{id: (x{v}.next + c) % 20}}).ok {{\nc += 1;\n{b}\n}}"
            )),
        ]
    });
    let lets = prop::collection::vec(0_i64..20, 4).prop_map(|ids| {
        ids.iter()
            .enumerate()
            .map(|(i, id)| format!("let x{i} = get(#{{id: {id}}});"))
            .collect::<Vec<_>>()
            .join("\n")
    });
    let helpers = if functions {
        helpers_strategy().boxed()
    } else {
        Just(String::new()).boxed()
    };
    (helpers, lets, prop::collection::vec(block, 1..6)).prop_map(|(helpers, lets, body)| {
        format!(
            "{helpers}\nlet acc = [];\nlet m = #{{}};\n{lets}\n{}\n[acc, m]",
            body.join("\n")
        )
    })
}

/// The random catalog, at the edges: a read that fails in ways its breaker counts (and one
/// its schema refuses), a read with a tight timeout, a read composite that catches its nested
/// failures, breakers that open after 3 failures, and a budget of 30 calls that many scripts
/// reach — so that claims meet breakers near their threshold and budgets near their end.
fn edge_catalog() -> Runtime {
    let shaky = Tool::builder("shaky", Effect::Read)
        .input_schema(json!({"type": "object", "properties": {"id": {"type": "integer", "minimum": 0}}, "required": ["id"]}))
        .handler(|args| async move {
            let id = args["id"].as_i64().unwrap_or_default();
            tokio::time::sleep(Duration::from_micros((id as u64 % 3) * 700)).await;
            match id % 4 {
                0 => Err(ToolError::unavailable(format!("{id} is down"))),
                1 => Err(ToolError::internal(format!("{id} broke"))),
                _ => Ok(json!(id * 2)),
            }
        });
    let slowish = Tool::builder("slowish", Effect::Read)
        .timeout(Duration::from_millis(20))
        .input_schema(json!({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}))
        .handler(|args| async move {
            let id = args["id"].as_i64().unwrap_or_default();
            // Odd ids take far longer than the timeout; even ones answer at once.
            if id % 2 != 0 {
                tokio::time::sleep(Duration::from_millis(400)).await;
            }
            Ok(json!({"id": id}))
        });
    let careful = Tool::builder("careful", Effect::Read)
        .nested(["shaky", "get"])
        .composite(|args, ctx| async move {
            let first = ctx.call("shaky", json!({"id": args["id"]})).await;
            let second = ctx.call("get", json!({"id": args["id"]})).await;
            Ok(json!([
                first.map_err(|e| e.kind.to_string()).err(),
                second.map(|v| v["v"].clone()).ok()
            ]))
        });
    let tools: Vec<Tool> = random_tools()
        .into_iter()
        .chain([shaky, slowish, careful])
        .collect();
    edge_runtime(tools, 3, 30)
}

/// A runtime of `tools` whose breaker opens after `failures` failures and whose budget is
/// `max_calls`: edges the random scripts reach.
fn edge_runtime(tools: Vec<Tool>, failures: u32, max_calls: u64) -> Runtime {
    let mut breaker = toolscript::BreakerConfig::default();
    breaker.failure_threshold = failures;
    let mut limits = toolscript::Limits::default();
    limits.max_calls = max_calls;
    Runtime::builder(Registry::builder().tools(tools).build().unwrap())
        .breaker(breaker)
        .limits(limits)
        .build()
}

/// An async runtime of two workers, and a property runner of `TOOLSCRIPT_PROPTEST_CASES`
/// cases (default 200).
pub(crate) fn property_runner() -> (tokio::runtime::Runtime, TestRunner) {
    let cases = std::env::var("TOOLSCRIPT_PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    (rt, runner)
}

/// Runs `TOOLSCRIPT_PROPTEST_CASES` (default 200) random scripts of `strategy` in both modes,
/// each mode on a fresh runtime of `catalog`; fails at the first difference. Returns the number
/// of cases and of those in which speculation took part.
fn same_in_both_modes(
    strategy: impl Strategy<Value = String>,
    catalog: &dyn Fn() -> Runtime,
) -> (u32, u64) {
    let (cases, speculated, _) = same_in_both_modes_by(strategy, catalog, &observable, &|_| false);
    (cases, speculated)
}

/// [`same_in_both_modes`], comparing what `view` shows of each run's outcome; the third number
/// is of the cases whose sequential run `counts`.
fn same_in_both_modes_by(
    strategy: impl Strategy<Value = String>,
    catalog: &dyn Fn() -> Runtime,
    view: &dyn Fn(&RunOutcome) -> Value,
    counts: &dyn Fn(&RunOutcome) -> bool,
) -> (u32, u64, u64) {
    let (rt, mut runner) = property_runner();
    let cases = runner.config().cases;
    let speculated = std::sync::atomic::AtomicU64::new(0);
    let counted = std::sync::atomic::AtomicU64::new(0);
    let result = runner.run(&strategy, |script| {
        let (sequential, speculative) = rt.block_on(both_outcomes(catalog, &script));
        prop_assert_eq!(view(&sequential), view(&speculative), "{}", script);
        if speculative.stats.speculative_claimed > 0 {
            speculated.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        if counts(&sequential) {
            counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    (cases, speculated.into_inner(), counted.into_inner())
}

/// At the edges of breakers, budgets and timeouts, with composites whose children fail or are
/// refused: speculation still changes nothing.
#[test]
fn random_scripts_at_the_edges_give_the_same_result() {
    same_in_both_modes(scripts_with(true, false), &edge_catalog);
}

#[test]
fn random_scripts_give_the_same_result() {
    let (cases, speculated) = same_in_both_modes(script_strategy(), &random_catalog);
    // Most random scripts make independent reads the scout can start early (173 of 200 on a
    // quiet machine); a quarter is a floor that load cannot push it under, but a scout that
    // does nothing cannot reach.
    assert!(
        speculated >= u64::from(cases) / 4,
        "only {speculated} of {cases} random scripts were speculated"
    );
}

/// The random catalog again, as a manifest's script tools (their shared `state` counts the
/// writes): quick bodies run in place on the executor's, the scout's and the composites'
/// threads, and speculation still changes nothing.
fn script_catalog() -> Runtime {
    const TOOLS: &str = r##"
[[tool]]
name = "get"
effect = "read"
latency_ms = 1
input = { type = "object", properties = { id = { type = "integer" } }, required = ["id"] }
script = '''
let id = args.id;
let puts = state.puts ?? 0;
if id < 0 || id >= 17 { throw #{ kind: "not_found", message: `no record ${id}` } }
#{ id: id, v: (id * 7 + puts) % 13, ok: (id + puts) % 3 != 0, next: (id * 5 + 1) % 20 }
'''

[[tool]]
name = "list"
effect = "read"
input = { type = "object", properties = { n = { type = "integer" } }, required = ["n"] }
script = '''
let n = args.n;
let puts = state.puts ?? 0;
[(n + puts) % 20, (n + 1) % 20, (n + 2 * puts) % 20]
'''

[[tool]]
name = "put"
effect = "write"
input = { type = "object", properties = { k = { type = "integer" } }, required = ["k"] }
script = '''
if args.k % 7 == 6 { throw #{ kind: "conflict", message: `key ${args.k} is locked` } }
state.puts = (state.puts ?? 0) + 1;
state.puts
'''

[[tool]]
name = "find"
effect = "read"
latency_ms = 1
input = { type = "object", properties = { name = { type = "string" } }, required = ["name"] }
script = '''
let name = args.name;
let digits = if name.starts_with("r") { name.sub_string(1) } else { "" };
let id = -1;
if digits.len() > 0 && digits.len() < 4 {
    id = 0;
    for c in digits.to_chars() {
        if c < '0' || c > '9' { id = -1; break; }
        id = id * 10 + parse_int(c.to_string());
    }
}
if id < 0 || id >= 17 { throw #{ kind: "not_found", message: `no record named ${name}` } }
#{ id: id, v: (id * 5 + (state.puts ?? 0)) % 11, name: name }
'''

[[tool]]
name = "tally"
effect = "read"
script = '''
let i = if type_of(args.i) == "i64" { args.i } else { 0 };
#{ i: i, v: (i * 3 + (state.puts ?? 0)) % 7 }
'''

[[tool]]
name = "notify"
effect = "external"
script = "#{ sent: args }"

[[tool]]
name = "pair"
effect = "read"
nested = ["get", "list"]
script = '''
let record = get(#{ id: args.id });
let listed = list(#{ n: record.next });
#{ v: record.v, first: listed[0] }
'''

[[tool]]
name = "put_checked"
effect = "write"
nested = ["get", "put"]
script = '''
let record = get(#{ id: args.k });
put(#{ k: record.next })
'''
"##;
    let mut manifests = Manifests::new();
    manifests.load_str(Path::new("random.toml"), TOOLS).unwrap();
    Runtime::new(manifests.into_registry().unwrap())
}

#[test]
fn random_scripts_over_script_tools_give_the_same_result() {
    let (cases, speculated) = same_in_both_modes(script_strategy(), &script_catalog);
    assert!(
        speculated >= u64::from(cases) / 4,
        "only {speculated} of {cases} random scripts over script tools were speculated"
    );
}

/// Durable runs (each journaled in a store of its own) give the same result in both modes:
/// the journal, the leases and the holds of a durable run change nothing of what it does.
#[test]
fn random_scripts_in_durable_runs_give_the_same_result() {
    let dir = tempfile::TempDir::new().unwrap();
    let stores = std::sync::atomic::AtomicU64::new(0);
    let durable = || {
        let n = stores.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let store = toolscript::SqliteStore::open(&dir.path().join(format!("{n}.sqlite3")));
        Runtime::builder(Registry::builder().tools(random_tools()).build().unwrap())
            .store(Arc::new(store.unwrap()))
            .build()
    };
    let (cases, speculated) = same_in_both_modes(script_strategy(), &durable);
    assert!(
        speculated >= u64::from(cases) / 4,
        "only {speculated} of {cases} random durable scripts were speculated"
    );
}

/// The random catalog under a guard that denies some reads (and a composite's nested read),
/// and asks about some writes (denied: a run with no store cannot pause), by their arguments.
fn guarded_catalog() -> Runtime {
    use toolscript::guard::{Guard, Rule, Ruling};
    let rule = |tools: &[&str], when: &str, ruling: Ruling| {
        Rule::new(tools, ruling, format!("{tools:?} when {when}"))
            .unwrap()
            .when(when)
            .unwrap()
    };
    let guard = Guard::builder(std::env::temp_dir())
        .rule(rule(&["get"], "args.id % 5 == 4", Ruling::Deny))
        .rule(rule(&["list"], "args.n == 3", Ruling::Deny))
        .rule(rule(&["put*"], "args.k > 10", Ruling::Ask))
        .rule(rule(&["find"], "args.name.len() > 2", Ruling::Deny))
        .build()
        .unwrap();
    Runtime::new(
        Registry::builder()
            .tools(random_tools())
            .guard(guard)
            .build()
            .unwrap(),
    )
}

/// Under a guard the scout evaluates the rules as the executor does: what it refuses, and
/// what it leaves to the executor, changes nothing.
#[test]
fn random_scripts_under_a_guard_give_the_same_result() {
    same_in_both_modes(script_strategy(), &guarded_catalog);
}

/// Random scripts whose script functions and closures branch, return early, loop, recurse,
/// write and read: the scout runs their bodies rewritten, and speculation still changes nothing.
#[test]
fn random_scripts_with_functions_and_closures_give_the_same_result() {
    let (cases, speculated) = same_in_both_modes(scripts_with(false, true), &random_catalog);
    assert!(
        speculated >= u64::from(cases) / 4,
        "only {speculated} of {cases} random scripts were speculated"
    );
}

/// How a retried read of the retry catalog fails: by its arguments' `id` and by how many times it
/// was called with those arguments (`n`, from 0), never by a count shared between arguments.
/// Ids `6 (mod 7)` fail for good, though `unavailable` (the tool says so); ids `5 (mod 7)` are
/// not found; any other id fails its first `id % 4` calls, in turn `unavailable`, `timeout` and
/// a tool's own `rate_limited` that says it passes, and then succeeds.
fn fails_by_occurrence(args: &Value, n: u64) -> Option<ToolError> {
    let id = args["id"].as_i64().unwrap_or_default();
    match id.rem_euclid(7) {
        6 => {
            return Some(ToolError::unavailable(format!("{id} is retired")).with_recoverable(false))
        }
        5 => return Some(ToolError::not_found(format!("no record {id}"))),
        _ => {}
    }
    if n >= id.rem_euclid(4) as u64 {
        return None;
    }
    Some(match (id + n as i64).rem_euclid(3) {
        0 => ToolError::unavailable(format!("{id} is down")),
        1 => ToolError::new(ErrorKind::Timeout, format!("{id} did not answer")),
        _ => ToolError::with_kind_name("rate_limited", format!("{id}: slow down"))
            .unwrap()
            .with_recoverable(true),
    })
}

/// The retry scripts' catalog: `flaky`, a read that fails by its arguments and occurrence
/// ([`fails_by_occurrence`]); `wrap`, a read composite over another such read; `tick`, a write
/// that may repeat and returns a new number each time; and the random catalog's reads `get`,
/// `list` and `find` for the rest. Breakers open after 4 failures and the budget is 40 calls, so
/// that retry loops meet both.
///
/// The scripts pass the latest `tick` as `s` in every retried read's arguments: a read the scout
/// started in an epoch the executor then left (a retry it did not make, a branch it did not take)
/// counts against those arguments only, never against an identical call of a later epoch, so
/// each arguments' calls are the same in both modes and so is what each call returns.
fn retry_catalog() -> Runtime {
    let latency = |args: &Value| {
        Duration::from_micros((args["id"].as_i64().unwrap_or_default().unsigned_abs() % 3) * 700)
    };
    let (flaky, _) = by_occurrence("flaky", latency, fails_by_occurrence);
    let (inner, _) = by_occurrence("inner", latency, fails_by_occurrence);
    let wrap = Tool::builder("wrap", Effect::Read)
        .nested(["inner"])
        .composite(|args, ctx| async move {
            let got = ctx.call("inner", args).await?;
            Ok(json!({"n": got["n"]}))
        });
    let ticks = Arc::new(Mutex::new(0_i64));
    let tick = Tool::builder("tick", Effect::Write)
        .allow_repeat(true)
        .handler(move |_| {
            let mut n = ticks.lock().unwrap();
            *n += 1;
            let n = *n;
            async move { Ok(json!(n)) }
        });
    let reads = random_tools()
        .into_iter()
        .filter(|t| ["get", "list", "find"].contains(&t.spec().name.as_str()));
    let tools: Vec<Tool> = reads.chain([flaky, inner, wrap, tick]).collect();
    edge_runtime(tools, 4, 40)
}

/// Random scripts of retry loops a model writes — bounded, rethrowing, swallowing a few — over
/// `flaky` and `wrap`, single and uncaught calls of them, fan-outs of retries over a listed page,
/// ids taken from other reads (the scout's deferred calls), writes between them (`s = tick()`),
/// branches, loops and `try` blocks.
fn retry_scripts() -> impl Strategy<Value = String> {
    let id = prop_oneof![
        (0_i64..20).prop_map(|k| k.to_string()),
        (0_usize..4, 0_i64..5).prop_map(|(v, k)| format!("(x{v}.next + {k}) % 20")),
        (0_usize..4).prop_map(|v| format!("x{v}.v")),
    ];
    let retried = prop_oneof![Just("flaky"), Just("wrap")];
    let attempt = |tool: &str, id: &str| format!("{tool}(#{{id: {id}, s: s}})");
    let leaf = prop_oneof![
        3 => (retried.clone(), id.clone(), 2_i64..5).prop_map(move |(tool, e, tries)| format!(
            "let r = (); let t = 0;\nwhile r == () && t < {tries} {{\n  t += 1;\n  try {{ r = {}; }} catch (e) {{ acc.push(e.kind); if !e.recoverable {{ break; }} }}\n}}\nacc.push(if r == () {{ -1 }} else {{ r.n }});",
            attempt(tool, &e)
        )),
        1 => (retried.clone(), id.clone()).prop_map(move |(tool, e)| format!(
            "let r = ();\nloop {{\n  try {{ r = {}; break; }}\n  catch (e) {{ acc.push(e.kind); if !e.recoverable {{ throw e; }} }}\n}}\nacc.push(r.n);",
            attempt(tool, &e)
        )),
        2 => (retried.clone(), id.clone()).prop_map(move |(tool, e)| format!(
            "try {{ acc.push({}.n); }} catch (e) {{ acc.push(e.kind); }}",
            attempt(tool, &e)
        )),
        1 => (retried.clone(), id.clone())
            .prop_map(move |(tool, e)| format!("acc.push({}.n);", attempt(tool, &e))),
        2 => (id.clone(), 2_i64..4).prop_map(move |(e, tries)| format!(
            "for i in list(#{{n: {e}}}) {{\n  let r = (); let t = 0;\n  while r == () && t < {tries} {{ t += 1; try {{ r = {}; }} catch (e) {{ }} }}\n  acc.push(if r == () {{ -1 }} else {{ r.n }});\n}}",
            attempt("flaky", "i")
        )),
        2 => Just("s = tick();".to_string()),
        1 => Just("try { s = tick(); } catch (e) { acc.push(e.kind); }".to_string()),
        2 => id.clone().prop_map(|e| format!("acc.push(get(#{{id: {e}}}).v);")),
    ];
    let block = leaf.prop_recursive(2, 16, 3, |inner| {
        let body = prop::collection::vec(inner, 1..4).prop_map(|s| s.join("\n"));
        prop_oneof![
            (0_usize..4, body.clone(), body.clone())
                .prop_map(|(v, a, b)| format!("if x{v}.ok {{\n{a}\n}} else {{\n{b}\n}}")),
            (0_i64..20, body.clone()).prop_map(|(n, b)| format!(
                "for i in list(#{{n: {n}}}) {{\nlet x0 = get(#{{id: i}});\n{b}\n}}"
            )),
            body.clone()
                .prop_map(|b| format!("try {{\n{b}\n}} catch (e) {{ acc.push(e.kind); }}")),
        ]
    });
    let lets = prop::collection::vec(0_i64..20, 4).prop_map(|ids| {
        ids.iter()
            .enumerate()
            .map(|(i, id)| format!("let x{i} = get(#{{id: {id}}});"))
            .collect::<Vec<_>>()
            .join("\n")
    });
    (lets, prop::collection::vec(block, 1..6)).prop_map(|(lets, body)| {
        format!(
            "let acc = [];\nlet s = 0;\n{lets}\n{}\nacc",
            body.join("\n")
        )
    })
}

/// What a retry script's run must keep in both modes: its observable result, the calls the
/// script made and answered from earlier ones, and the receipts of the calls the run made its
/// own (a speculative one only if claimed) — tool, arguments, error kind and result — but those
/// the budget or a breaker refused: a claim the sequential call's refusal stands for writes no
/// receipt of its own.
fn made_the_same(outcome: &RunOutcome) -> Value {
    let mut receipts: Vec<String> = outcome
        .receipts
        .iter()
        .filter(|r| !r.speculative || r.claimed)
        .filter(|r| {
            !matches!(
                r.error_kind.as_deref(),
                Some("budget_exceeded" | "circuit_open")
            )
        })
        .map(|r| json!([r.tool, r.args_sha256, r.error_kind, r.result_sha256]).to_string())
        .collect();
    receipts.sort();
    json!({
        "observable": observable(outcome),
        "tool_calls": outcome.stats.tool_calls,
        "deduplicated": outcome.stats.deduplicated,
        "receipts": receipts,
    })
}

/// Whether the run made a read again after it failed: two receipts of identical calls of a
/// retried tool.
fn retried_a_read(outcome: &RunOutcome) -> bool {
    let mut seen = std::collections::HashSet::new();
    outcome
        .receipts
        .iter()
        .filter(|r| r.tool == "flaky" || r.tool == "wrap")
        .any(|r| !seen.insert(r.args_sha256.clone()))
}

/// Retry scripts a model writes, on the retry catalog.
const RETRY_CORPUS: &[&str] = &[
    // Fails twice, then succeeds; a repeat after the success is answered by it.
    "let r = (); let tries = 0;\nwhile r == () && tries < 3 {\n    tries += 1;\n    try { r = flaky(#{id: 2, s: 0}); } catch (e) { }\n}\n[tries, r.n, flaky(#{id: 2, s: 0}).n]",
    // Not found is not retried; a failure for good, though `unavailable`, neither.
    "let kinds = [];\nfor id in [5, 6, 5, 6] { try { flaky(#{id: id, s: 0}); } catch (e) { kinds.push([e.kind, e.recoverable]); } }\nkinds",
    // A fan-out of retry loops: the scout retries each once its failure lands.
    "let out = [];\nfor id in list(#{n: 3}) + [1, 2, 3, 9, 10] {\n  let r = (); let t = 0;\n  while r == () && t < 4 { t += 1; try { r = flaky(#{id: id, s: 0}); } catch (e) { } }\n  out.push([id, t, if r == () { -1 } else { r.n }]);\n}\nout",
    // Four failures in a row open the breaker; its refusals are retried until the budget ends
    // the loop, which rethrows what cannot pass.
    "let kinds = [];\nfor id in [3, 7, 9, 10] { try { flaky(#{id: id, s: 0}); } catch (e) { kinds.push(e.kind); } }\nlet r = ();\nloop {\n  try { r = flaky(#{id: 3, s: 0}); break; }\n  catch (e) { kinds.push(e.kind); if !e.recoverable { throw e; } }\n}\nkinds",
    // A composite retried, a write between, the same arguments in a new epoch.
    "let seen = [];\nlet s = 0;\nfor round in 0..3 {\n  let r = ();\n  while r == () { try { r = wrap(#{id: 3, s: s}); } catch (e) { seen.push(e.kind); } }\n  seen.push(r.n);\n  s = tick();\n}\nseen",
    // The same read, first with known arguments, then with arguments from another read.
    "let kinds = [];\ntry { flaky(#{id: 9, s: 0}); } catch (e) { kinds.push(e.kind); }\nlet id = get(#{id: 1}).next + 3;\nlet r = ();\nwhile r == () { try { r = flaky(#{id: id, s: 0}); } catch (e) { kinds.push(e.kind); } }\n[id, kinds, r.n]",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_corpus_makes_the_same_calls_with_the_same_receipts() {
    for script in RETRY_CORPUS {
        let (sequential, speculative) = both_outcomes(&retry_catalog, script).await;
        assert_eq!(
            made_the_same(&sequential),
            made_the_same(&speculative),
            "{script}"
        );
        assert!(
            retried_a_read(&sequential) || script.contains("[5, 6"),
            "{script}"
        );
    }
}

#[test]
fn random_retry_loops_make_the_same_calls_with_the_same_receipts() {
    let (cases, speculated, retried) = same_in_both_modes_by(
        retry_scripts(),
        &retry_catalog,
        &made_the_same,
        &retried_a_read,
    );
    // Most scripts retry some read (and speculate some): a quarter is a floor that load cannot
    // push them under, but a runtime that never retries (or a scout that does nothing) cannot
    // reach.
    assert!(
        retried >= u64::from(cases) / 4,
        "only {retried} of {cases} random scripts retried a read"
    );
    assert!(
        speculated >= u64::from(cases) / 4,
        "only {speculated} of {cases} random scripts were speculated"
    );
}

/// With a cache warmed by a sequential run of the same script on the same runtime, the
/// speculative and the sequential run give the same result: both see the entries made before
/// they started, and the scout takes a hit as a read that has landed.
#[test]
fn random_scripts_with_cached_reads_give_the_same_result() {
    let (rt, mut runner) = property_runner();
    let cases = runner.config().cases;
    let hit = std::sync::atomic::AtomicU64::new(0);
    let result = runner.run(&script_strategy(), |script| {
        let warm_then = |mode: Mode| {
            let script = script.clone();
            async move {
                let runtime = Runtime::new(
                    Registry::builder()
                        .tools(random_tools_with(true))
                        .build()
                        .unwrap(),
                );
                run_in(&runtime, &script, Mode::Sequential).await;
                run_in(&runtime, &script, mode).await
            }
        };
        let sequential = rt.block_on(warm_then(Mode::Sequential));
        let speculative = rt.block_on(warm_then(Mode::Speculative));
        prop_assert_eq!(
            observable(&sequential),
            observable(&speculative),
            "{}",
            script
        );
        prop_assert_eq!(
            sequential.stats.cache_hits,
            speculative.stats.cache_hits,
            "{}",
            script
        );
        if speculative.stats.cache_hits > 0 {
            hit.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let hit = hit.into_inner();
    assert!(
        hit >= u64::from(cases) / 2,
        "only {hit} of {cases} cached scripts were answered by the cache"
    );
}
