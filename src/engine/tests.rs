use super::*;
use std::time::Duration;

fn engine(deadline: Option<Duration>, skip_sleep: bool) -> Engine {
    let watch = RunControls {
        deadline: deadline.map(|d| Instant::now() + d),
        skip_sleep,
        ..RunControls::default()
    };
    new_engine(&Limits::default(), watch)
}

fn terminated_by(result: Result<Dynamic, Box<rhai::EvalAltResult>>) -> Option<String> {
    match *result.err()? {
        rhai::EvalAltResult::ErrorTerminated(token, _) => token.into_string().ok(),
        _ => None,
    }
}

/// `sleep` is one operation to Rhai; here it meets the deadline like any other work.
#[test]
fn a_sleep_ends_at_the_deadline() {
    let started = Instant::now();
    let e = engine(Some(Duration::from_millis(100)), false);
    let result = e.eval::<Dynamic>("sleep(100000); 1");
    assert_eq!(terminated_by(result).as_deref(), Some(DEADLINE));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// Huge, negative and NaN lengths neither panic (`Duration::from_secs_f64` would) nor hang.
#[test]
fn odd_sleep_lengths_are_harmless() {
    let e = engine(Some(Duration::from_millis(50)), false);
    for script in ["sleep(-1); 1", "sleep(0.0 / 0.0); 1", "sleep(0); 1"] {
        assert_eq!(e.eval::<rhai::INT>(script).unwrap(), 1, "{script}");
    }
    let result = e.eval::<Dynamic>("sleep(1e300); 1");
    assert_eq!(terminated_by(result).as_deref(), Some(DEADLINE));
}

#[test]
fn a_cancelled_engine_stops_sleeping() {
    let run = CancellationToken::new();
    let watch = RunControls {
        cancel: Some(run.child_token()),
        ..RunControls::default()
    };
    let e = new_engine(&Limits::default(), watch);
    // The run's token is cancelled: the engine's, a child of it, is too.
    let setter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        run.cancel();
    });
    let result = e.eval::<Dynamic>("sleep(60); 1");
    setter.join().unwrap();
    assert_eq!(terminated_by(result).as_deref(), Some(CANCELLED));
}

/// Every sleep that waits at all runs through the run's `sleeps` (the executor marks itself
/// waiting there); one of no time does not, and an error of the sleep (its deadline) is the
/// script's.
#[test]
fn sleeps_that_wait_run_through_the_hook() {
    let through = Arc::new(AtomicU64::new(0));
    let count = Arc::clone(&through);
    let watch = RunControls {
        deadline: Some(Instant::now() + Duration::from_secs(3)),
        sleeps: Some(Arc::new(move |sleep: &mut dyn FnMut()| {
            count.fetch_add(1, Ordering::SeqCst);
            sleep();
        })),
        ..RunControls::default()
    };
    let e = new_engine(&Limits::default(), watch);
    let started = Instant::now();
    let script = "sleep(0); sleep(-1); sleep(0.0 / 0.0); sleep(0.02); sleep(1); 1";
    assert_eq!(e.eval::<rhai::INT>(script).unwrap(), 1);
    assert_eq!(through.load(Ordering::SeqCst), 2);
    assert!(started.elapsed() >= Duration::from_millis(1020));
    let result = e.eval::<Dynamic>("sleep(100000); 1");
    assert_eq!(terminated_by(result).as_deref(), Some(DEADLINE));
    assert_eq!(through.load(Ordering::SeqCst), 3);
}

/// The scout's engines skip sleeping altogether.
#[test]
fn the_scout_never_sleeps() {
    let started = Instant::now();
    let e = engine(None, true);
    assert_eq!(e.eval::<rhai::INT>("sleep(1000); 2").unwrap(), 2);
    assert!(started.elapsed() < Duration::from_secs(1));
}
