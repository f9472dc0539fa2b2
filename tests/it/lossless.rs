//! Speculation is lossless at every limit: random scripts run at random limits — the calls in
//! flight at once, the budget of calls, breakers near their threshold, composites whose
//! timeouts their nested calls' queue for a one-slot tool can exceed, CPU-bound tools and cached
//! reads — give the same result in both modes; and a random script that fits a memory budget
//! sequentially fits it speculatively.

use std::cell::Cell;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use serde_json::{json, Value};
use toolscript::bench::observable;
use toolscript::{BreakerConfig, Effect, Limits, Registry, Runtime, Tool};

use crate::equivalence::{both_outcomes, property_runner, random_tools_with, script_strategy};

/// The limits a case runs at.
#[derive(Clone, Debug)]
struct AtLimits {
    max_in_flight: u64,
    max_calls: u64,
    failures: u32,
    /// The timeout of the composites `three` and `spins`, in ms.
    composite_timeout_ms: u64,
    cached: bool,
}

fn limits_strategy() -> impl Strategy<Value = AtLimits> {
    (
        prop_oneof![Just(1_u64), Just(2), Just(3), Just(256)],
        prop_oneof![Just(12_u64), Just(30), Just(1000)],
        prop_oneof![Just(2_u32), Just(3), Just(5)],
        // Far under the nested calls' time (every call times out in both modes), or far over
        // it when the calls run one after the other (a sequential run never meets it).
        prop_oneof![Just(1_u64), Just(120)],
        any::<bool>(),
    )
        .prop_map(
            |(max_in_flight, max_calls, failures, composite_timeout_ms, cached)| AtLimits {
                max_in_flight,
                max_calls,
                failures,
                composite_timeout_ms,
                cached,
            },
        )
}

/// Burns the CPU for `micros` microseconds without yielding, as a tool that computes does.
fn spin(micros: u64) -> u64 {
    let start = Instant::now();
    let mut x: u64 = 1;
    while start.elapsed() < Duration::from_micros(micros) {
        for _ in 0..64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
    x
}

/// The random catalog and, beside it: `step`, a read of one slot that takes 3 ms (400 ms
/// under a tight timeout); `three`, a read composite making three `step` calls under the
/// case's timeout; `burn`, a CPU-bound read
/// (up to 0.6 ms) under a generous timeout; `spins`, a read composite of three `burn` calls.
fn limits_catalog(at: &AtLimits) -> Runtime {
    let timeout = Duration::from_millis(at.composite_timeout_ms);
    // Under a tight timeout a step takes far longer than it, so that however late the timer
    // fires, no step completes: the nested calls a composite makes never depend on the load.
    let took = Duration::from_millis(if at.composite_timeout_ms < 10 { 400 } else { 3 });
    let step = Tool::builder("step", Effect::Read)
        .max_concurrency(1)
        .handler(move |args: Value| async move {
            tokio::time::sleep(took).await;
            Ok(args["n"].clone())
        });
    let three = Tool::builder("three", Effect::Read)
        .nested(["step"])
        .timeout(timeout)
        .composite(|args, ctx| async move {
            let n = args["n"].as_i64().unwrap_or(0);
            let mut sum = 0;
            for i in 0..3 {
                sum += ctx
                    .call("step", json!({"n": n * 10 + i}))
                    .await?
                    .as_i64()
                    .unwrap_or(0);
            }
            Ok(json!(sum))
        });
    let burn = Tool::builder("burn", Effect::Read)
        .timeout(Duration::from_secs(2))
        .input_schema(
            json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
        )
        .handler(|args: Value| async move {
            let n = args["n"].as_i64().unwrap_or(0).rem_euclid(4) as u64;
            spin(n * 200);
            Ok(json!(n * 3))
        });
    let spins = Tool::builder("spins", Effect::Read)
        .nested(["burn"])
        .timeout(timeout.max(Duration::from_secs(2)))
        .composite(|args, ctx| async move {
            let n = args["n"].as_i64().unwrap_or(0);
            let mut sum = 0;
            for i in 0..3 {
                sum += ctx
                    .call("burn", json!({"n": n + i}))
                    .await?
                    .as_i64()
                    .unwrap_or(0);
            }
            Ok(json!(sum))
        });
    let tools = random_tools_with(at.cached)
        .into_iter()
        .chain([step, three, burn, spins]);
    let mut breaker = BreakerConfig::default();
    breaker.failure_threshold = at.failures;
    let mut limits = Limits::default();
    limits.max_in_flight = at.max_in_flight;
    limits.max_calls = at.max_calls;
    Runtime::builder(Registry::builder().tools(tools).build().unwrap())
        .breaker(breaker)
        .limits(limits)
        .build()
}

/// A statement over the limit catalog's tools, every failure caught and kept.
fn limit_leaf() -> impl Strategy<Value = String> {
    let caught =
        |call: String| format!("try {{ acc.push({call}); }} catch (e) {{ acc.push(e.kind); }}");
    prop_oneof![
        (0_i64..20).prop_map(move |n| caught(format!("three(#{{n: {n}}})"))),
        (1_i64..10).prop_map(move |k| format!(
            "for i in 0..{k} {{ {} }}",
            caught("three(#{n: i})".into())
        )),
        (0_i64..20).prop_map(move |n| caught(format!("burn(#{{n: {n}}})"))),
        (0_i64..20).prop_map(move |n| caught(format!("spins(#{{n: {n}}})"))),
        (1_i64..8).prop_map(move |k| format!(
            "for i in 0..{k} {{ {} }}",
            caught("spins(#{n: i * 2})".into())
        )),
        (0_usize..4).prop_map(move |v| caught(format!("three(#{{n: x{v}.v}})"))),
    ]
}

/// A random script of the equivalence tests with statements over the limit catalog's tools put
/// between its lines (every line of those scripts ends a statement or opens a block, so any
/// place before the last line, the result, is a place for one).
fn limit_scripts() -> impl Strategy<Value = String> {
    (
        script_strategy(),
        prop::collection::vec((any::<prop::sample::Index>(), limit_leaf()), 1..6),
    )
        .prop_map(|(script, inserts)| {
            let mut lines: Vec<String> = script.lines().map(existing_record).collect();
            let result = lines.pop().unwrap_or_default();
            // After the first lines (`let acc = [];` and `let m = #{};`), so `acc` exists.
            let first = lines
                .iter()
                .position(|l| l.starts_with("let m = "))
                .map_or(0, |i| i + 1);
            for (at, leaf) in inserts {
                let place = first + at.index(lines.len() - first + 1);
                lines.insert(place, leaf);
            }
            lines.push(result);
            lines.join("\n")
        })
}

/// A line of a random script, with the record its first reads (`let x0 = get(#{id: 18});`)
/// look up made one that exists: so that most scripts get past their first lines to the
/// limits.
fn existing_record(line: &str) -> String {
    let first_read = line.starts_with("let x") && line.contains(" = get(#{id: ");
    match line.rsplit_once("#{id: ") {
        Some((head, tail)) if first_read => {
            let id: i64 = tail.trim_end_matches("});").parse().unwrap_or(0);
            format!("{head}#{{id: {}}});", id % 17)
        }
        _ => line.to_string(),
    }
}

/// Random scripts at random limits: the same result in both modes, each case's two runs on
/// fresh runtimes of the same limits.
#[test]
fn random_scripts_at_random_limits_give_the_same_result() {
    let (rt, mut runner) = property_runner();
    let cases = runner.config().cases;
    let (speculated, refused, timed_out) = (Cell::new(0_u32), Cell::new(0_u32), Cell::new(0_u32));
    let count = |c: &Cell<u32>, yes: bool| c.set(c.get() + u32::from(yes));
    let strategy = (limit_scripts(), limits_strategy());
    let result = runner.run(&strategy, |(script, at)| {
        let make = || limits_catalog(&at);
        let (sequential, speculative) = rt.block_on(both_outcomes(&make, &script));
        prop_assert_eq!(
            observable(&sequential),
            observable(&speculative),
            "{:?}\n{}",
            at,
            script
        );
        let text = observable(&sequential).to_string();
        count(&speculated, speculative.stats.speculative_claimed > 0);
        count(&refused, text.contains("budget_exceeded"));
        count(&timed_out, text.contains("timeout"));
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let (speculated, refused, timed_out) = (speculated.get(), refused.get(), timed_out.get());
    eprintln!(
        "{cases} cases: {refused} met a budget, {timed_out} a timeout, {speculated} speculated"
    );
    // The generators reach the limits: an eighth of the cases meet a budget, a fortieth a
    // timeout, and a quarter are speculated (a scout that does nothing cannot pass this).
    // 10,000 cases: 4,395 met a budget, 926 a timeout, 9,946 were speculated (before the
    // random scripts gained `sleep` and `tally`, which shift these a little). The seed is new
    // at each run: at 200 cases a timeout is met 18.5 times on average (standard deviation
    // 4.1), so a bar of a twentieth (10) failed about one run in seventy; a fortieth (5) is
    // 3.4 deviations below.
    assert!(
        refused >= cases / 8,
        "{refused} of {cases} cases met a budget"
    );
    assert!(
        timed_out >= cases / 40,
        "{timed_out} of {cases} cases met a timeout"
    );
    assert!(
        speculated >= cases / 4,
        "{speculated} of {cases} cases were speculated"
    );
}

/// A script that builds values of random shapes and sizes, with reads of the demo catalog
/// between them (so the scout has calls to start while it copies what the script builds).
fn memory_script() -> impl Strategy<Value = String> {
    let build = prop_oneof![
        (20_000_u32..120_000).prop_map(|n| format!(
            "let a = [];\nfor i in 0..{n} {{ a.push(#{{ id: i, name: `item ${{i}}` }}); }}\nout.push(a.len());"
        )),
        (2_000_u32..12_000).prop_map(|n| format!(
            "let s = \"\";\nfor i in 0..{n} {{ s += `line ${{i}} of the report\\n`; }}\nout.push(s.len());"
        )),
        (5_000_u32..40_000).prop_map(|n| format!(
            "let m = #{{}};\nfor i in 0..{n} {{ m[`k${{i}}`] = [i, i * 2]; }}\nout.push(m.len());"
        )),
        (1_u32..40).prop_map(|id| format!("out.push(get_customer(#{{ id: {id} }}).tier);")),
        (1_u32..40).prop_map(|id| format!(
            "for o in list_orders(#{{ customer_id: {id} }}) {{ out.push(get_order(#{{ id: o }}).status); }}"
        )),
    ];
    prop::collection::vec(build, 1..4)
        .prop_map(|parts| format!("let out = [];\n{}\nout", parts.join("\n")))
}

/// The number of random memory scripts (`TOOLSCRIPT_MEMORY_CASES`, default 12): each takes a
/// dozen processes.
fn memory_cases() -> u32 {
    std::env::var("TOOLSCRIPT_MEMORY_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(12)
}

/// For random scripts that build large values: at the smallest budget (to the MiB) at which
/// the script fits sequentially, it fits speculatively too. A speculative failure there counts
/// only when three more sequential runs at that budget all fit, so the sequential run's own
/// noise at its edge is never blamed on speculation.
#[cfg(feature = "cli")]
#[test]
fn random_scripts_that_fit_the_memory_budget_sequentially_fit_it_speculatively() {
    use crate::cli::toolscript;
    let dir = tempfile::TempDir::new().unwrap();
    let path = dir.path().join("script.rhai");
    let script_path = path.to_string_lossy().into_owned();
    let run = |mb: u32, sequential: bool| {
        let mb = mb.to_string();
        let mut args = vec!["run", &script_path, "--no-store", "--max-memory-mb", &mb];
        if sequential {
            args.push("--sequential");
        }
        toolscript(&args)
    };
    let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        cases: memory_cases(),
        failure_persistence: None,
        ..Default::default()
    });
    let result = runner.run(&memory_script(), |script| {
        std::fs::write(&path, &script).unwrap();
        let unbounded = run(2048, true);
        prop_assert_eq!(unbounded.code, 0, "{:?}", unbounded);
        // The smallest budget that fits: fits at `high`, not at `low`.
        let (mut low, mut high) = (1_u32, 2048_u32);
        while high - low > 1 {
            let mid = (low + high) / 2;
            if run(mid, true).code == 0 {
                high = mid;
            } else {
                low = mid;
            }
        }
        let speculative = run(high, false);
        if speculative.code != 0 {
            let sequential_fits = (0..3).all(|_| run(high, true).code == 0);
            prop_assert!(
                !sequential_fits,
                "at {} MiB the script fits sequentially but not speculatively: {:?}\n{}",
                high,
                speculative,
                script
            );
        } else {
            prop_assert_eq!(&speculative.stdout, &unbounded.stdout, "{}", script);
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
