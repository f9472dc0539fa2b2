//! Command tools: tools whose call runs a program (see `docs/commands.md`).
//!
//! A command tool's argv is a template ([`CommandLine::Template`]): each element one argument,
//! `{name}` filled from the call's arguments, never split and never seen by a shell. Its
//! program runs in a folder beneath its root, with an environment that holds only what the
//! tool passes on (`env_pass`) or declares (`env`): never the parent's otherwise. Its stdout
//! and stderr are captured up to a bound each. It runs in a process group of its own, led by
//! a guard (`crate::children`) that kills the whole group when the program ends, when its
//! timeout passes, when the call's future is dropped (the dispatch path's timeout, a
//! cancelled run), and when toolscript dies.
//!
//! On Linux with Landlock, the program is confined before it starts: it reads and writes
//! beneath its root, reads and executes the system's folders, and nothing else of the file
//! system. Elsewhere it runs unconfined, and its results say so (`confined: false` and a
//! `warning`).
//!
//! The guard's command rules ([`crate::guard::CommandRules`]) read a call's argv from the
//! tool's spec ([`crate::guard::GuardView::command`]), before the call reaches the tool.

#[cfg(all(target_os = "linux", unix))]
mod pre_exec;
#[cfg(target_os = "linux")]
mod sandbox;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Map, Value};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::effect::Effect;
use crate::error::{Error, ErrorKind, ToolError};
use crate::guard::CommandLine;
use crate::secrets::EnvValue;
use crate::tool::Tool;

/// The default bound of each of stdout and stderr: 64 KiB.
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 64 * 1024;

/// The default timeout of a command: 60 s.
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// What the dispatch path's timeout adds to a command's own, so that the command's (which
/// says what it ran) comes first.
const DISPATCH_GRACE: Duration = Duration::from_secs(2);

/// What a result says when the program ran unconfined.
const UNCONFINED: &str = "the command ran unconfined: this system has no Landlock, so it could read and write outside its root";

/// Whether this system confines command tools with Landlock (Linux 5.13 and later, with
/// Landlock enabled).
pub fn landlock_available() -> bool {
    #[cfg(target_os = "linux")]
    {
        sandbox::available()
    }
    #[cfg(not(target_os = "linux"))]
    {
        false
    }
}

/// How a command tool runs its program: shared by its calls.
#[derive(Debug)]
struct Runner {
    /// The tool's name, for its process group's record.
    name: String,
    /// Every call runs beneath it; canonical.
    root: PathBuf,
    line: CommandLine,
    /// Variables of this process passed on, where set.
    env_pass: Vec<String>,
    /// Variables set, over those passed on (a secret's fetched at the call).
    env: BTreeMap<String, EnvValue>,
    timeout: Duration,
    max_output_bytes: usize,
    /// Folders read and executed besides the system's, under Landlock.
    read: Vec<PathBuf>,
}

/// Builds a command tool: set what differs from the defaults, then [`CommandToolBuilder::build`].
#[derive(Debug)]
#[must_use]
pub struct CommandToolBuilder {
    name: String,
    root: PathBuf,
    argv: Vec<String>,
    cwd: Option<String>,
    env_pass: Vec<String>,
    env: BTreeMap<String, EnvValue>,
    timeout: Duration,
    max_output_bytes: usize,
    effect: Effect,
    description: String,
    input_schema: Option<Value>,
    read: Vec<PathBuf>,
}

/// Starts a command tool named `name` that runs `argv` (a template: `{name}` is the call's
/// argument `name`) beneath `root`. By default: it runs in `root`, passes on `PATH` alone,
/// times out after 60 s, keeps 64 KiB of each output, has the `write` effect, and takes one
/// string argument per placeholder.
pub fn command_tool(
    name: impl Into<String>,
    root: impl Into<PathBuf>,
    argv: impl IntoIterator<Item = impl Into<String>>,
) -> CommandToolBuilder {
    CommandToolBuilder {
        name: name.into(),
        root: root.into(),
        argv: argv.into_iter().map(Into::into).collect(),
        cwd: None,
        env_pass: vec!["PATH".to_string()],
        env: BTreeMap::new(),
        timeout: DEFAULT_COMMAND_TIMEOUT,
        max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
        effect: Effect::Write,
        description: String::new(),
        input_schema: None,
        read: Vec::new(),
    }
}

impl CommandToolBuilder {
    /// Sets the folder it runs in, relative to the root (it must stay beneath it).
    pub fn cwd(mut self, cwd: impl Into<String>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    /// Sets the variables of this process passed on to the program, where set (default
    /// `PATH` alone).
    pub fn env_pass(mut self, names: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.env_pass = names.into_iter().map(Into::into).collect();
        self
    }

    /// Sets a variable of the program's environment: a value, or a secret's
    /// (`EnvValue::Secret`), fetched when the tool is first called.
    pub fn env(mut self, name: impl Into<String>, value: impl Into<EnvValue>) -> Self {
        self.env.insert(name.into(), value.into());
        self
    }

    /// Sets the timeout: then the program's whole process group is killed.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Sets how many bytes of each of stdout and stderr are kept.
    pub fn max_output_bytes(mut self, bytes: usize) -> Self {
        self.max_output_bytes = bytes;
        self
    }

    /// Sets the tool's effect (default `write`).
    pub fn effect(mut self, effect: Effect) -> Self {
        self.effect = effect;
        self
    }

    /// Sets the description the model reads.
    pub fn description(mut self, text: impl Into<String>) -> Self {
        self.description = text.into();
        self
    }

    /// Sets the input schema (default: one required string per placeholder).
    pub fn input_schema(mut self, schema: Value) -> Self {
        self.input_schema = Some(schema);
        self
    }

    /// Adds a folder the program may read and execute under Landlock, besides the system's
    /// (`~/.cargo`, a toolchain's).
    pub fn read_beneath(mut self, folder: impl Into<PathBuf>) -> Self {
        self.read.push(folder.into());
        self
    }

    /// The tool.
    ///
    /// # Errors
    ///
    /// [`Error::Registry`] naming the tool: an empty argv, a root that is not a folder, a
    /// `cwd` outside the root, a timeout or output bound of zero.
    pub fn build(self) -> Result<Tool, Error> {
        let name = self.name;
        let fail = |rule: String| Error::registry(&name, rule);
        if self.argv.is_empty() || self.argv[0].is_empty() {
            return Err(fail(
                "a command tool's `argv` starts with its program".into(),
            ));
        }
        if self.argv[0].contains('{') {
            return Err(fail(
                "a command tool's program is fixed: a placeholder may not name it".into(),
            ));
        }
        if self.timeout.is_zero() || self.max_output_bytes == 0 {
            return Err(fail(
                "a command tool's `timeout_ms` and `max_output_bytes` are at least 1".into(),
            ));
        }
        let root = std::fs::canonicalize(&self.root).map_err(|e| {
            fail(format!(
                "its root `{}` is not a folder: {e}",
                self.root.display()
            ))
        })?;
        if let Some(cwd) = &self.cwd {
            beneath(&root, cwd).map_err(|e| fail(format!("`cwd`: {e}")))?;
        }
        let placeholders = placeholders(&self.argv);
        let schema = self.input_schema.unwrap_or_else(|| {
            let properties: Map<String, Value> = placeholders
                .iter()
                .map(|p| (p.clone(), json!({"type": "string"})))
                .collect();
            json!({
                "type": "object",
                "properties": properties,
                "required": placeholders,
                "additionalProperties": false,
            })
        });
        let line = CommandLine::Template {
            argv: self.argv,
            cwd: self.cwd,
        };
        let runner = Runner {
            name: name.clone(),
            root,
            line: line.clone(),
            env_pass: self.env_pass,
            env: self.env,
            timeout: self.timeout,
            max_output_bytes: self.max_output_bytes,
            read: self.read,
        };
        Ok(finish(
            Tool::builder(name, self.effect)
                .description(self.description)
                .input_schema(schema),
            line,
            runner,
        ))
    }
}

/// The built-in `run_command(#{argv, cwd?})`: runs any argv beneath `root`, with `PATH` alone
/// passed on, a 60 s timeout and 64 KiB of each output; effect `write`.
///
/// It runs whatever it is given, so it belongs only in a registry whose guard has
/// `commands` rules: the guard reads each call's argv (`CommandLine::Given`) and decides.
///
/// # Errors
///
/// [`Error::Registry`]: `root` is not a folder.
pub fn run_command(root: impl Into<PathBuf>) -> Result<Tool, Error> {
    let root = root.into();
    let root = std::fs::canonicalize(&root).map_err(|e| {
        Error::registry(
            "run_command",
            format!("its root `{}` is not a folder: {e}", root.display()),
        )
    })?;
    let runner = Runner {
        name: "run_command".into(),
        root,
        line: CommandLine::Given,
        env_pass: vec!["PATH".into()],
        env: BTreeMap::new(),
        timeout: DEFAULT_COMMAND_TIMEOUT,
        max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
        read: Vec::new(),
    };
    let schema = json!({
        "type": "object",
        "properties": {
            "argv": {"type": "array", "items": {"type": "string"}, "minItems": 1,
                     "description": "The program and its arguments, one element each; no shell."},
            "cwd": {"type": "string", "description": "The folder it runs in, relative to the root."},
        },
        "required": ["argv"],
        "additionalProperties": false,
    });
    Ok(finish(
        Tool::builder("run_command", Effect::Write)
            .description("Runs a program with its arguments (no shell) in a folder of the project; returns its exit status, stdout and stderr.")
            .input_schema(schema),
        CommandLine::Given,
        runner,
    ))
}

/// The tool: its spec declares the command line for the guard; its body runs it.
fn finish(builder: crate::tool::ToolBuilder, line: CommandLine, runner: Runner) -> Tool {
    let runner = Arc::new(runner);
    builder
        .command_line(line)
        .timeout(runner.timeout + DISPATCH_GRACE)
        .handler_with_context(move |args, ctx| {
            let runner = Arc::clone(&runner);
            async move {
                let secrets = ctx.secrets().cloned().unwrap_or_default();
                let env = crate::secrets::resolve_env(&runner.env, &secrets)
                    .await
                    .map_err(|why| ToolError::unavailable(why).with_recoverable(false))?;
                runner.run(&args, &env, &secrets).await
            }
        })
}

/// The placeholders of a template, in order, once each.
fn placeholders(argv: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for part in argv {
        let mut rest = part.as_str();
        while let Some(open) = rest.find('{') {
            let Some(close) = rest[open..].find('}') else {
                break;
            };
            let name = &rest[open + 1..open + close];
            if !out.iter().any(|n| n == name) {
                out.push(name.to_string());
            }
            rest = &rest[open + close + 1..];
        }
    }
    out
}

/// The folder `cwd` (relative to `root`) as a real path, if it is beneath `root`.
fn beneath(root: &Path, cwd: &str) -> Result<PathBuf, String> {
    let joined = root.join(cwd);
    let real = std::fs::canonicalize(&joined)
        .map_err(|e| format!("`{cwd}` is not a folder beneath the root: {e}"))?;
    if !real.starts_with(root) {
        return Err(format!("`{cwd}` is outside the root"));
    }
    if !real.is_dir() {
        return Err(format!("`{cwd}` is not a folder"));
    }
    Ok(real)
}

impl Runner {
    async fn run(
        &self,
        args: &Value,
        env: &BTreeMap<String, String>,
        secrets: &crate::secrets::Secrets,
    ) -> Result<Value, ToolError> {
        let argv = self.line.argv(args).map_err(ToolError::invalid_input)?;
        let cwd = beneath(&self.root, &argv.cwd)
            .map_err(|e| ToolError::new(ErrorKind::PermissionDenied, format!("`cwd`: {e}")))?;
        let mut command = tokio::process::Command::new(&argv.argv[0]);
        command
            .args(&argv.argv[1..])
            .current_dir(&cwd)
            .env_clear()
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        // A variable a secret comes from is passed on only as that secret, named in `env`.
        for name in &self.env_pass {
            if secrets.env_vars().any(|var| var == name) {
                continue;
            }
            if let Some(value) = std::env::var_os(name) {
                command.env(name, value);
            }
        }
        command.envs(env);

        // The group's guard: dropped when the program has ended, when the timeout passes or
        // when this future is dropped, it kills every process of the group.
        let guard = crate::children::ChildGuard::start(&format!("command tool `{}`", self.name))
            .map_err(|e| ToolError::unavailable(format!("the command cannot be started: {e}")))?;
        #[cfg(unix)]
        command.process_group(guard.group() as i32);

        let confined = self.confine(&mut command)?;
        let mut child = command.spawn().map_err(|e| {
            ToolError::new(
                ErrorKind::Failed,
                format!("`{}` cannot be started: {e}", argv.argv[0]),
            )
        })?;
        // The ruleset's descriptor was needed until the spawn only.
        #[cfg(target_os = "linux")]
        drop(confined.ruleset);
        guard.started(child.id());
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let max = self.max_output_bytes;
        let waiter = async move {
            let status = child.wait().await;
            // What the program left running in its group ends with it.
            drop(guard);
            status
        };
        let readers = async { tokio::join!(capture(stdout, max), capture(stderr, max)) };
        let ran = tokio::time::timeout(self.timeout, async { tokio::join!(waiter, readers) }).await;
        let Ok((status, ((stdout, out_cut), (stderr, err_cut)))) = ran else {
            return Err(ToolError::new(
                ErrorKind::Timeout,
                format!(
                    "`{}` ran longer than {} ms: its process group was killed",
                    argv.argv[0],
                    self.timeout.as_millis()
                ),
            ));
        };
        let status = status
            .map_err(|e| ToolError::internal(format!("the command's end cannot be read: {e}")))?;
        let mut result = json!({
            "status": status.code(),
            "stdout": String::from_utf8_lossy(&stdout),
            "stderr": String::from_utf8_lossy(&stderr),
            "truncated": out_cut || err_cut,
            "confined": confined.confined,
        });
        #[cfg(unix)]
        {
            use std::os::unix::process::ExitStatusExt;
            if let Some(signal) = status.signal() {
                result["signal"] = json!(signal);
            }
        }
        if !confined.confined {
            result["warning"] = json!(UNCONFINED);
        }
        Ok(result)
    }

    /// Confines `command` to the root where Landlock is available.
    fn confine(&self, command: &mut tokio::process::Command) -> Result<Confined, ToolError> {
        #[cfg(target_os = "linux")]
        {
            let ruleset = sandbox::ruleset(&self.root, &self.read).map_err(ToolError::internal)?;
            match ruleset {
                Some(fd) => {
                    pre_exec::restrict_before_exec(command, &fd);
                    Ok(Confined {
                        confined: true,
                        ruleset: Some(fd),
                    })
                }
                None => {
                    warn_unconfined();
                    Ok(Confined {
                        confined: false,
                        ruleset: None,
                    })
                }
            }
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = (command, &self.read);
            warn_unconfined();
            Ok(Confined { confined: false })
        }
    }
}

/// Whether a command is confined, and what must stay open until it is spawned.
struct Confined {
    confined: bool,
    #[cfg(target_os = "linux")]
    ruleset: Option<std::os::fd::OwnedFd>,
}

/// Says once per process that command tools run unconfined.
fn warn_unconfined() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| tracing::warn!("{UNCONFINED}"));
}

/// Reads `stream` to its end, keeping its first `max` bytes: whether more came.
async fn capture(stream: Option<impl AsyncRead + Unpin>, max: usize) -> (Vec<u8>, bool) {
    let Some(mut stream) = stream else {
        return (Vec::new(), false);
    };
    let mut kept = Vec::new();
    let mut cut = false;
    let mut buf = vec![0u8; 8192];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = max.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
                cut |= n > room;
            }
        }
    }
    (kept, cut)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_found_once_each_in_order() {
        let argv: Vec<String> = ["grep", "-e", "{pattern}", "--", "{file}", "{pattern}.bak"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(placeholders(&argv), ["pattern", "file"]);
    }

    #[test]
    fn a_bad_tool_is_refused_with_its_rule() {
        let dir = tempfile::tempdir().unwrap();
        let empty: [&str; 0] = [];
        let err = command_tool("t", dir.path(), empty).build().unwrap_err();
        assert!(err.to_string().contains("starts with its program"), "{err}");
        let err = command_tool("t", dir.path(), ["{p}"]).build().unwrap_err();
        assert!(err.to_string().contains("placeholder"), "{err}");
        let err = command_tool("t", dir.path(), ["ls"])
            .cwd("..")
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("outside the root"), "{err}");
        let err = command_tool("t", dir.path().join("nope"), ["ls"])
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("not a folder"), "{err}");
        let err = command_tool("t", dir.path(), ["ls"])
            .timeout(Duration::ZERO)
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("at least 1"), "{err}");
    }

    #[test]
    fn the_schema_takes_one_string_per_placeholder() {
        let dir = tempfile::tempdir().unwrap();
        let tool = command_tool("t", dir.path(), ["echo", "{a}", "x{b}y"])
            .build()
            .unwrap();
        let schema = &tool.spec().input_schema;
        assert_eq!(schema["required"], json!(["a", "b"]));
        assert_eq!(schema["properties"]["b"]["type"], "string");
        assert!(matches!(
            tool.spec().guard.command,
            Some(CommandLine::Template { .. })
        ));
    }

    /// Whether the process `pid` is gone (or a zombie, which runs nothing).
    #[cfg(target_os = "linux")]
    fn gone(pid: u32) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            Ok(stat) => stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next().map(|s| s == "Z"))
                .unwrap_or(true),
        }
    }

    /// The dispatch path's timeout, or a cancelled run, drops the call's future: the group
    /// dies with it, though the command's own timeout is far off.
    #[cfg(target_os = "linux")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_call_kills_its_group() {
        let dir = tempfile::tempdir().unwrap();
        let runner = Runner {
            name: "slow".into(),
            root: std::fs::canonicalize(dir.path()).unwrap(),
            line: CommandLine::Template {
                argv: [
                    "sh",
                    "-c",
                    "sleep 60 & echo $! > pids; echo $$ >> pids; wait",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect(),
                cwd: None,
            },
            env_pass: vec!["PATH".into()],
            env: BTreeMap::new(),
            timeout: Duration::from_secs(600),
            max_output_bytes: 10,
            read: Vec::new(),
        };
        let pids = dir.path().join("pids");
        let args = json!({});
        // Boxed, so that dropping it drops the future itself (`tokio::pin!` would not).
        let env = BTreeMap::new();
        let secrets = crate::secrets::Secrets::default();
        let mut call = Box::pin(runner.run(&args, &env, &secrets));
        // Polls the call until both pids are written, then drops it.
        let written = async {
            loop {
                let text = std::fs::read_to_string(&pids).unwrap_or_default();
                if text.lines().count() == 2 {
                    return text;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        let text = tokio::select! {
            text = written => text,
            ended = &mut call => panic!("the call ended: {ended:?}"),
        };
        drop(call);
        let pids: Vec<u32> = text.lines().map(|l| l.trim().parse().unwrap()).collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !pids.iter().all(|p| gone(*p)) {
            assert!(
                std::time::Instant::now() < deadline,
                "a process of the group survived: {pids:?} {:?}",
                pids.iter()
                    .map(|p| std::fs::read_to_string(format!("/proc/{p}/stat")))
                    .collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    #[tokio::test]
    async fn output_is_cut_at_its_bound() {
        let (stream, cut) = capture(Some(&b"0123456789"[..]), 4).await;
        assert_eq!((stream.as_slice(), cut), (&b"0123"[..], true));
        let (stream, cut) = capture(Some(&b"0123"[..]), 4).await;
        assert_eq!((stream.as_slice(), cut), (&b"0123"[..], false));
    }
}
