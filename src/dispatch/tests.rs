use super::*;
use crate::dispatch::breaker::BreakerConfig;
use crate::tool::{Registry, Tool};
use serde_json::json;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

/// A run's context over `registry`, under `budget`, with a minute to go.
fn run_over(registry: Registry, budget: Budget) -> Arc<RunContext> {
    Arc::new(RunContext::new(
        Arc::new(registry),
        Arc::new(Breakers::new(BreakerConfig::default())),
        budget,
        Duration::from_secs(60),
        "run".into(),
        Arc::default(),
        None,
    ))
}

fn context(budget: Budget) -> (Arc<RunContext>, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let write = Tool::builder("write", Effect::Write)
        .input_schema(json!({"type": "object", "properties": {"n": {"type": "integer"}}}))
        .handler(move |args| {
            counter.fetch_add(1, Ordering::SeqCst);
            async move { Ok(args) }
        });
    let read = Tool::builder("read", Effect::Read).handler(|_| async { Ok(json!(1)) });
    let slow_write = Tool::builder("slow_write", Effect::Write)
        .handler(|_| async { futures::future::pending().await });
    let slow_read = Tool::builder("slow_read", Effect::Read)
        .handler(|_| async { futures::future::pending().await });
    let registry = Registry::builder()
        .tools([write, read, slow_write, slow_read])
        .build()
        .unwrap();
    (run_over(registry, budget), runs)
}

fn nested(tool: &str) -> Call {
    Call::new(
        tool,
        json!({}),
        Caller::Composite {
            parent: 7,
            allowed: Arc::from(vec!["read".to_string()]),
            speculation: None,
            cancel: Arc::new(tokio_util::sync::CancellationToken::new()),
        },
    )
}

#[tokio::test]
async fn unknown_tools_get_a_suggestion_and_no_receipt() {
    let (ctx, _) = context(Budget::default());
    let e = dispatch(&ctx, Call::top_level("reed", json!({})))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::UnknownTool);
    assert!(e.message.contains("did you mean `read`"), "{}", e.message);
    assert!(ctx.take_receipts().is_empty());
}

#[tokio::test]
async fn a_composite_may_call_only_its_declared_tools() {
    let (ctx, runs) = context(Budget::default());
    let e = dispatch(&ctx, nested("write")).await.unwrap_err();
    assert_eq!(e.kind, ErrorKind::PermissionDenied);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(dispatch(&ctx, nested("read")).await.unwrap(), json!(1));
    let receipts = ctx.take_receipts();
    assert_eq!(receipts.len(), 2);
    assert!(receipts.iter().all(|r| r.parent == Some(7)));
}

#[tokio::test]
async fn refused_calls_never_reach_the_body_or_the_effect_log() {
    let (ctx, runs) = context(Budget {
        max_calls: 2,
        ..Budget::default()
    });
    let e = dispatch(&ctx, Call::top_level("write", json!({"n": "x"})))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidInput);
    // Invalid input did not count as a repeat: the corrected call runs.
    dispatch(&ctx, Call::top_level("write", json!({"n": 1})))
        .await
        .unwrap();
    let e = dispatch(&ctx, Call::top_level("write", json!({"n": 2})))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::BudgetExceeded);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let effects = ctx.take_effects();
    assert_eq!(effects.len(), 1);
    assert_eq!(effects[0].args, json!({"n": 1}));
    assert_eq!(effects[0].ok, Some(true));
    assert_eq!(ctx.dispatched(), 3);
}

/// A dropped call still gets its one receipt, frees its in-flight slot and its progress
/// count; a dropped write whose body started is `ambiguous_outcome` (and the effect log says
/// `null`), a dropped read is `cancelled`.
#[tokio::test]
async fn a_dropped_call_gets_exactly_one_receipt() {
    let (ctx, _) = context(Budget {
        max_in_flight: 1,
        ..Budget::default()
    });
    for tool in ["slow_write", "slow_read"] {
        let call = dispatch(&ctx, Call::top_level(tool, json!({})));
        let cut = tokio::time::timeout(Duration::from_millis(20), call).await;
        assert!(cut.is_err(), "{tool} never answers");
        assert_eq!(
            ctx.progress.in_flight(),
            0,
            "{tool}: the in-flight count fell back"
        );
    }
    // The in-flight slot was freed: another call is admitted under `max_in_flight = 1`.
    assert_eq!(
        dispatch(&ctx, Call::top_level("read", json!({})))
            .await
            .unwrap(),
        json!(1)
    );
    let receipts = ctx.take_receipts();
    let kinds: Vec<_> = receipts
        .iter()
        .map(|r| (r.tool.as_str(), r.error_kind.as_deref(), r.attempt))
        .collect();
    assert_eq!(
        kinds,
        [
            ("slow_write", Some("ambiguous_outcome"), 1),
            ("slow_read", Some("cancelled"), 1),
            ("read", None, 1),
        ]
    );
    assert_eq!(ctx.progress.done(), 3);
    let effects = ctx.take_effects();
    assert_eq!(effects.len(), 1);
    assert_eq!(effects[0].ok, None, "the write's outcome is unknown");
}

#[tokio::test]
async fn a_write_that_times_out_has_an_unknown_outcome() {
    let slow = Tool::builder("slow", Effect::Write)
        .timeout(Duration::from_millis(10))
        .handler(|_| async { futures::future::pending().await });
    let registry = Registry::builder().tool(slow).build().unwrap();
    let ctx = run_over(registry, Budget::default());
    let e = dispatch(&ctx, Call::top_level("slow", json!({})))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::AmbiguousOutcome);
    assert!(!e.recoverable);
    assert_eq!(e.tool.as_deref(), Some("slow"));
    assert!(
        e.message.contains("may or may not have taken effect"),
        "{}",
        e.message
    );
    assert_eq!(ctx.take_effects()[0].ok, None);
}

/// A body's timeout counts from the body's start, whether or not it answers at its first poll:
/// a body that works 300 ms before it first waits, then waits 300 ms, misses a 450 ms timeout
/// (a timer started at its first wait would have let it finish); one that answers at its first
/// poll is not cut short, as no timer fires without a poll that waits.
#[tokio::test]
async fn a_body_s_timeout_counts_from_its_start_past_its_first_poll() {
    let ms = Duration::from_millis;
    let late = Tool::builder("late", Effect::Read)
        .timeout(ms(450))
        .handler(move |args| async move {
            std::thread::sleep(ms(300));
            tokio::time::sleep(ms(300)).await;
            Ok(args)
        });
    let busy =
        Tool::builder("busy", Effect::Read)
            .timeout(ms(20))
            .handler(move |args| async move {
                std::thread::sleep(ms(60));
                Ok(args)
            });
    let registry = Registry::builder().tool(late).tool(busy).build().unwrap();
    let ctx = run_over(registry, Budget::default());
    let e = dispatch(&ctx, Call::top_level("late", json!({})))
        .await
        .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Timeout, "{}", e.message);
    let answered = dispatch(&ctx, Call::top_level("busy", json!({"n": 1}))).await;
    assert_eq!(answered.unwrap(), json!({"n": 1}));
}

#[test]
fn panic_messages_are_recovered() {
    assert_eq!(panic_message(&"static"), "static");
    assert_eq!(panic_message(&String::from("owned")), "owned");
    assert_eq!(panic_message(&5_u8), "(no message)");
}
