//! The `toolscript` command line: parse arguments, then hand each subcommand to its file in
//! [`cli`]. The whole flow is the one `match` in [`Command::apply`].

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cli;

#[derive(Parser)]
#[command(
    name = "toolscript",
    version,
    about = "Runs orchestration scripts written by language models: many tool calls, one script."
)]
struct Cli {
    /// More diagnostics on stderr (-v: debug, -vv: trace); RUST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a script and print its value (or, with --json, the whole outcome).
    Run(cli::run::Run),
    /// Resume a paused run, or one whose process died: replay it from its journal, then go on.
    Resume(cli::resume::Resume),
    /// Plan a script: run it with real reads and no other call, and keep every call it would
    /// make, in order, for a person to read (docs/plans.md).
    Plan(cli::plan::Plan),
    /// Apply a plan: run its script for real, making exactly the planned calls; any other
    /// call waits for a person.
    Apply(cli::plan::Apply),
    /// Print an artifact exactly as stored (a run's output refers to it), or one of its pages.
    Artifact(cli::artifact::Artifact),
    /// List the store's runs: id, status, start, script, pending call.
    Runs(cli::runs::Runs),
    /// Remove old runs from the store, with their journals and the artifacts no kept run refers
    /// to, then vacuum the file.
    ///
    /// By default only completed and failed runs are removed: a paused, interrupted or running
    /// run can still be resumed, and is removed only when --status names its status. A running
    /// run whose lease is live is never removed. A manifest's `[store] keep_days = N` does the
    /// same for completed and failed runs older than N days, without the vacuum, whenever `run`,
    /// `resume` or `serve` starts with that manifest and a store.
    Prune(cli::prune::Prune),
    /// Compile a script and check its calls without running any tool.
    Check(cli::check::Check),
    /// Print the tools' API, as a model reads it.
    Tools(cli::tools::Tools),
    /// Run scripts sequentially and speculatively, alternating; compare wall times and results.
    Bench(cli::bench::Bench),
    /// Serve toolscript as an MCP server on stdio (or with --http, over Streamable HTTP):
    /// `run_script`, `describe_tools`, `resume_run`, `list_runs` and `read_artifact`.
    Serve(cli::serve::Serve),
    /// Check every hash and the chain of a receipts file.
    Verify(cli::verify::Verify),
}

impl Command {
    /// Runs the subcommand; its exit status, or the message of a usage, manifest or registry
    /// error (exit status 2).
    async fn apply(self) -> Result<ExitCode, String> {
        match self {
            Command::Run(cmd) => cmd.apply().await,
            Command::Resume(cmd) => cmd.apply().await,
            Command::Plan(cmd) => cmd.apply().await,
            Command::Apply(cmd) => cmd.apply().await,
            Command::Artifact(cmd) => cmd.apply().await,
            Command::Runs(cmd) => cmd.apply().await,
            Command::Prune(cmd) => cmd.apply().await,
            Command::Check(cmd) => cmd.apply().await,
            Command::Tools(cmd) => cmd.apply().await,
            Command::Bench(cmd) => cmd.apply().await,
            Command::Serve(cmd) => cmd.apply().await,
            Command::Verify(cmd) => cmd.apply(),
        }
    }
}

/// Counts every allocation of the process, so that a run's memory budget (`Limits::max_memory_mb`)
/// can end a script that grows too large before the process runs out of memory. No limit is set
/// on the allocator itself: a refused allocation would abort the process.
#[global_allocator]
static ALLOCATOR: cap::Cap<std::alloc::System> = cap::Cap::new(std::alloc::System, usize::MAX);

/// How long a command stopped by Ctrl-C or SIGTERM waits for its run and its MCP servers to
/// end before the process exits.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

fn main() -> ExitCode {
    toolscript::set_memory_probe(|| ALLOCATOR.allocated());
    let cli = Cli::parse();
    init_tracing(cli.verbose);
    mask_panics();
    let result = async_runtime().and_then(|rt| {
        // `serve` stops on its own: over HTTP at a signal, over stdio when its client leaves.
        let on_signal = !matches!(cli.command, Command::Serve(_));
        // MCP servers' connections live on this runtime: every command uses it.
        let outcome = rt.block_on(async {
            if !on_signal {
                return Ok(cli.command.apply().await);
            }
            let stop = cli::stop_signal();
            tokio::select! {
                outcome = cli.command.apply() => Ok(outcome),
                status = stop => Err(status),
            }
        });
        match outcome {
            Ok(outcome) => {
                // Tools of MCP servers may still hold tasks; do not wait for them at exit.
                rt.shutdown_background();
                outcome
            }
            Err(status) => {
                // Ctrl-C or SIGTERM: the command was dropped. A durable run stops at its next
                // operation (the call under way ends and is journaled); MCP servers, once no
                // call holds them, get their stdin closed and a moment to exit. What still runs
                // after the grace ends with the process (the servers' guards kill their
                // process groups), and a run left `running` is resumed like a killed one's.
                rt.block_on(toolscript::mcp::servers_closed(STOP_GRACE));
                rt.shutdown_background();
                eprintln!("toolscript: stopped by a signal; `toolscript runs` lists a durable run it left, and `toolscript resume RUN_ID` goes on with it");
                Ok(ExitCode::from(status))
            }
        }
    });
    result.unwrap_or_else(|message| {
        let message = toolscript::secrets::process_mask()
            .text(&message)
            .into_owned();
        eprintln!("toolscript: {message}");
        ExitCode::from(cli::USAGE)
    })
}

fn init_tracing(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "toolscript=debug",
        _ => "toolscript=trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default))
        // The MCP SDK traces whole messages at its lowest levels: tools' results and
        // arguments, secrets among them. Its own diagnostics stop at `debug`.
        .add_directive(
            if verbose == 0 {
                "rmcp=warn"
            } else {
                "rmcp=debug"
            }
            .parse()
            .expect("a valid directive"),
        );
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| MaskedStderr)
        // Colours only for a person at a terminal; never escape codes in a client's log.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// Standard error with every secret this process fetched masked: each log event is written
/// whole by one call, so a secret is never split across two.
struct MaskedStderr;

impl std::io::Write for MaskedStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        masked_write(&mut std::io::stderr(), buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// Writes `buf` to `out` with every secret this process fetched masked; all of `buf` counts as
/// written.
fn masked_write(out: &mut impl std::io::Write, buf: &[u8]) -> std::io::Result<usize> {
    let text = String::from_utf8_lossy(buf);
    let masked = toolscript::secrets::process_mask().text(&text);
    out.write_all(masked.as_bytes())?;
    Ok(buf.len())
}

/// A panic's message (a tool body's, caught by the dispatch path) may quote a value a secret
/// was in: once the process holds a secret, the message is written masked.
fn mask_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let mask = toolscript::secrets::process_mask();
        if mask.is_empty() {
            default(info);
        } else {
            eprintln!("toolscript: {}", mask.text(&info.to_string()));
        }
    }));
}

fn async_runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))
}

#[cfg(test)]
mod tests {
    /// A log line that holds a secret this process fetched is written with the secret masked.
    #[test]
    fn log_output_masks_every_secret_fetched() {
        toolscript::secrets::process_mask().add("log-secret-4242", "[secret:LOG]");
        let mut out = Vec::new();
        let line = b"TRACE call answered: token log-secret-4242 ok\n";
        assert_eq!(super::masked_write(&mut out, line).unwrap(), line.len());
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "TRACE call answered: token [secret:LOG] ok\n"
        );
    }
}
