//! Strings as models mean them: escapes in backtick strings are those of double-quoted ones,
//! what reaches a tool is the decoded text, and positions after an escape stay exact.

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use toolscript::{Effect, Mode, Registry, Runtime, Tool};

use crate::support::{error_of, run_in, value_of};

/// A runtime with one external tool that keeps the text it was sent.
fn mailer() -> (Runtime, Arc<Mutex<Vec<Value>>>) {
    let sent = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&sent);
    let send = Tool::builder("send_email", Effect::External).handler(move |args: Value| {
        kept.lock().unwrap().push(args["body"].clone());
        async { Ok(json!("sent")) }
    });
    let registry = Registry::builder().tool(send).build().unwrap();
    (Runtime::new(registry), sent)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backtick_email_goes_out_with_real_line_breaks() {
    let script = "let name = \"Ann\";\nsend_email(#{body: `Hi ${name},\\n\\nSorry about \\`order 7\\`.\\n\\t- the team`});\n`done`";
    for mode in [Mode::Sequential, Mode::Speculative] {
        let (runtime, sent) = mailer();
        let outcome = run_in(&runtime, script, mode).await;
        assert_eq!(value_of(&outcome), &json!("done"));
        assert_eq!(
            *sent.lock().unwrap(),
            vec![json!("Hi Ann,\n\nSorry about `order 7`.\n\t- the team")],
            "{mode:?}"
        );
    }
}

/// An error after escapes on the same line is reported at the column it was written at, by a
/// run and by `check`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn positions_after_escapes_are_exact() {
    let (runtime, _) = mailer();
    let script = "let s = `a\\n\\t\\u{41}\\``; nope(s)";
    assert_eq!(script.find("nope").map(|i| i + 1), Some(26));
    let outcome = run_in(&runtime, script, Mode::Sequential).await;
    let e = error_of(&outcome);
    assert_eq!((e.line, e.column), (Some(1), Some(26)), "{e:?}");
    let problems = runtime.check(script).unwrap();
    let p = problems.first().expect("an unknown function");
    assert_eq!((p.line, p.column), (Some(1), Some(26)), "{problems:?}");
    // A syntax error after an escape too: where it is without the escapes.
    let e = runtime
        .compile("let s = `\\n\\n`; let t = s +;")
        .unwrap_err();
    let plain = runtime.compile("let s = `_n_n`; let t = s +;").unwrap_err();
    assert_eq!((e.line, e.column), (plain.line, plain.column), "{e:?}");
    assert!(e.column.is_some(), "{e:?}");
}
