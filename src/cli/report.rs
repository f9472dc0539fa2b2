//! A run's outcome for a person or a program: the value on stdout alone, so that it can be
//! piped, or with `--json` one object; logs, errors, the summary and the live line on stderr.
//! `run` and `resume` share it.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use toolscript::{Mode, Progress, RunOptions, RunOutcome};

use super::{exit_for, name_limit};

pub(super) fn with_progress(options: RunOptions) -> (RunOptions, Arc<Progress>) {
    let progress = Arc::new(Progress::default());
    (options.progress(Arc::clone(&progress)), progress)
}

/// The live line on stderr, for a person at a terminal.
pub(super) fn live_ticker(
    json: bool,
    progress: Arc<Progress>,
) -> Option<tokio::task::JoinHandle<()>> {
    let live = !json && std::io::stderr().is_terminal();
    live.then(|| tokio::spawn(live_line(progress)))
}

/// Prints a run's outcome; its exit status.
pub(super) fn report(
    outcome: &RunOutcome,
    json: bool,
    ticker: Option<tokio::task::JoinHandle<()>>,
) -> ExitCode {
    if let Some(ticker) = ticker {
        ticker.abort();
        eprint!("\r\x1b[2K");
    }
    if json {
        println!("{}", outcome_json(outcome));
    } else {
        print_human(outcome);
    }
    exit_for(outcome.status())
}

/// The outcome as `run --json` prints it: a limit the run reached is named as its flag.
fn outcome_json(outcome: &RunOutcome) -> Value {
    outcome.report_naming(name_limit).to_json()
}

/// The line on stderr that shows a run going on; the caller clears it.
async fn live_line(progress: Arc<Progress>) {
    let started = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        eprint!(
            "\r\x1b[2K{} calls done, {} in flight, {:.1} s",
            progress.done(),
            progress.in_flight(),
            started.elapsed().as_secs_f64()
        );
        let _ = std::io::stderr().flush();
    }
}

/// Text a script or a tool produced, safe for a terminal: control characters but newlines and
/// tabs (terminal escapes, carriage returns) are shown escaped, so that no script can move the
/// cursor, recolour or retitle the terminal. Text for a pipe is left as it is.
fn for_terminal(text: &str, terminal: bool) -> String {
    if !terminal {
        return text.to_string();
    }
    text.chars()
        .map(|c| match c {
            '\n' | '\t' => c.to_string(),
            c if c.is_control() => c.escape_default().to_string(),
            c => c.to_string(),
        })
        .collect()
}

/// The value on stdout, alone, so that it can be piped; logs, errors and the summary on stderr.
fn print_human(outcome: &RunOutcome) {
    let err_terminal = std::io::stderr().is_terminal();
    for line in &outcome.logs {
        eprintln!("{}", for_terminal(line, err_terminal));
    }
    for warning in &outcome.warnings {
        eprintln!(
            "warning: {}",
            for_terminal(&warning.line_text(), err_terminal)
        );
    }
    if outcome.warnings_left_out > 0 {
        eprintln!(
            "warning: {} more places read a missing field",
            outcome.warnings_left_out
        );
    }
    if !outcome.unapplied.is_empty() {
        eprintln!(
            "unapplied: {} planned call(s) the run never reached:",
            outcome.unapplied.len()
        );
        for call in &outcome.unapplied {
            eprintln!(
                "  - {} {}",
                call.tool,
                for_terminal(&call.args.to_string(), err_terminal)
            );
        }
    }
    let terminal = std::io::stdout().is_terminal();
    let mut out = std::io::stdout().lock();
    if let Some(pending) = &outcome.pending {
        eprintln!(
            "paused: run {} waits at `{}` ({}, {}) with {}",
            outcome.run_id,
            pending.tool,
            pending.place(),
            match pending.awaiting {
                toolscript::Awaiting::Approval => "awaiting approval",
                toolscript::Awaiting::PlanDivergence => "diverged from its plan",
                _ => "awaiting resolve: its outcome was lost",
            },
            for_terminal(&pending.args.to_string(), err_terminal)
        );
        if let Some(why) = pending
            .why
            .as_deref()
            .filter(|_| pending.uncertain == Some(true))
        {
            eprintln!("  uncertain: {}", for_terminal(why, err_terminal));
        }
        if let (toolscript::Awaiting::PlanDivergence, Some(why)) =
            (pending.awaiting, pending.why.as_deref())
        {
            eprintln!("  diverged: {}", for_terminal(why, err_terminal));
        }
    }
    match &outcome.result {
        Err(e) if outcome.pending.is_some() => {
            if let Some(action) = &e.suggested_next_action {
                eprintln!("  next: {}", for_terminal(action, err_terminal));
            }
        }
        Ok(Value::String(s)) => {
            let _ = writeln!(out, "{}", for_terminal(s, terminal));
        }
        Ok(value) => {
            let _ = writeln!(
                out,
                "{}",
                serde_json::to_string_pretty(value).unwrap_or_default()
            );
        }
        Err(e) => {
            let described = e.describe_naming(name_limit);
            eprintln!("error: {}", for_terminal(&described, err_terminal));
            if let Some(action) = &e.suggested_next_action {
                eprintln!("  hint: {}", for_terminal(action, err_terminal));
            }
        }
    }
    let s = &outcome.stats;
    let mut summary = format!(
        "{} tool calls ({} dispatched, {} deduplicated, {} effectful) in {:.1} ms, {}",
        s.tool_calls,
        s.dispatched,
        s.deduplicated,
        s.effectful_calls,
        s.wall_ms,
        match s.mode {
            Mode::Sequential => s.mode.as_str().to_string(),
            _ if s.speculative_held > 0 => format!(
                "speculative: {} reads started early, {} claimed, {} wasted, {} left to the executor",
                s.speculative_launched,
                s.speculative_claimed,
                s.speculative_wasted,
                s.speculative_held
            ),
            _ => format!(
                "speculative: {} reads started early, {} claimed, {} wasted",
                s.speculative_launched, s.speculative_claimed, s.speculative_wasted
            ),
        }
    );
    if s.replayed > 0 {
        summary.push_str(&format!("; {} answered by the journal", s.replayed));
    }
    if s.cache_hits > 0 {
        summary.push_str(&format!("; {} answered by the cache", s.cache_hits));
    }
    if !outcome.effects.is_empty() {
        let effects: Vec<String> = outcome
            .effects
            .iter()
            .map(|e| {
                let outcome = match e.ok {
                    Some(true) => "",
                    Some(false) => " (failed)",
                    None => " (outcome unknown)",
                };
                format!("{}{outcome}", e.tool)
            })
            .collect();
        summary.push_str(&format!("; effects: {}", effects.join(", ")));
    }
    eprintln!("{summary}");
}

#[cfg(test)]
mod tests {
    use super::for_terminal;

    #[test]
    fn terminal_escapes_from_scripts_are_shown_not_obeyed() {
        let text = "red \u{1b}[31mtext\r\n\tnext\u{7}";
        let shown = for_terminal(text, true);
        assert_eq!(shown, "red \\u{1b}[31mtext\\r\n\tnext\\u{7}");
        assert_eq!(
            for_terminal(text, false),
            text,
            "a pipe gets the text as it is"
        );
    }
}
