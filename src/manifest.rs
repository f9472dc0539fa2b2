//! TOML manifests: `[[tool]]` tables declaring script tools, whose bodies are Rhai scripts that
//! see `args` and a `state` map shared by all script tools loaded together; and the embedded demo
//! catalog, which is such a manifest.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rhai::{Dynamic, Engine, EvalAltResult, Map, Scope, AST};
use serde::Deserialize;
use serde_json::Value;
use toml::Spanned;

use crate::error::{Error, ErrorKind, ToolError};
use crate::mcp::McpServerSpec;
use crate::script::{self, Limits};
use crate::tool::{Effect, Registry, Tool, ToolContext, ToolSpec};

/// The demo catalog's manifest, compiled into the binary.
const DEMO_CATALOG: &str = include_str!("demo/catalog.toml");
const DEMO_NAME: &str = "<demo catalog>";

/// The embedded demo catalog: a small support desk with customers, orders, tickets and a refund
/// policy, whose reads take tens of milliseconds.
///
/// # Errors
///
/// None in practice: the catalog is tested. The `Result` keeps the library free of panics.
pub fn demo_catalog() -> Result<Registry, Error> {
    let mut manifests = Manifests::new();
    manifests.load_str(Path::new(DEMO_NAME), DEMO_CATALOG)?;
    manifests.into_registry()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ManifestFile {
    #[serde(default)]
    tool: Vec<Spanned<ToolEntry>>,
    #[serde(default)]
    mcp: Vec<Spanned<McpEntry>>,
}

/// An `[[mcp]]` table: a server to start, whose tools become tools of the registry.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct McpEntry {
    name: Option<String>,
    command: Vec<String>,
    #[serde(default)]
    env: std::collections::BTreeMap<String, String>,
    prefix: Option<String>,
    timeout_ms: Option<u64>,
    #[serde(default)]
    effects: std::collections::BTreeMap<String, Effect>,
    trust_annotations: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolEntry {
    name: String,
    #[serde(default)]
    description: String,
    effect: Effect,
    #[serde(default)]
    latency_ms: u64,
    timeout_ms: Option<u64>,
    #[serde(default)]
    retries: u32,
    #[serde(default)]
    allow_repeat: bool,
    speculate: Option<bool>,
    input: Option<Value>,
    output: Option<Value>,
    script: Spanned<String>,
    #[serde(default)]
    nested: Vec<String>,
}

/// Where a tool was declared, for errors found after parsing.
#[derive(Clone)]
struct Origin {
    tool: String,
    file: PathBuf,
    line: usize,
}

/// Loads manifests into tools. Script tools loaded by one `Manifests` share one `state` map.
pub struct Manifests {
    tools: Vec<Tool>,
    origins: Vec<Origin>,
    /// MCP servers declared but not started yet.
    servers: Vec<(McpServerSpec, Origin)>,
    host: Arc<ScriptHost>,
}

impl std::fmt::Debug for Manifests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manifests")
            .field("tools", &self.tools.len())
            .finish_non_exhaustive()
    }
}

impl Default for Manifests {
    fn default() -> Self {
        Manifests::new()
    }
}

impl Manifests {
    /// No manifests yet, and an empty shared `state`.
    pub fn new() -> Manifests {
        let limits = Limits::default();
        let mut engine = script::new_engine(&limits, script::Watch::default());
        engine.on_print(|s| tracing::debug!(target: "toolscript::script_tool", "{s}"));
        engine.on_debug(|s, _, _| tracing::debug!(target: "toolscript::script_tool", "{s}"));
        Manifests {
            tools: Vec::new(),
            origins: Vec::new(),
            servers: Vec::new(),
            host: Arc::new(ScriptHost {
                engine,
                limits,
                state: RwLock::default(),
                running: tokio::sync::Semaphore::new(
                    std::thread::available_parallelism().map_or(2, |n| n.get()),
                ),
            }),
        }
    }

    /// Reads and loads one manifest file.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when it cannot be read; [`Error::Manifest`] naming the file, the line where
    /// one is known, and what is wrong.
    pub fn load_file(&mut self, path: &Path) -> Result<(), Error> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        self.load_str(path, &text)
    }

    /// Loads a manifest from text; `file` names it in errors.
    ///
    /// # Errors
    ///
    /// [`Error::Manifest`] naming the file, the line where one is known, and what is wrong.
    pub fn load_str(&mut self, file: &Path, text: &str) -> Result<(), Error> {
        let error = |span: Option<Range<usize>>, message: String| Error::Manifest {
            file: file.to_path_buf(),
            line: span.map(|s| line_of(text, s.start)),
            message,
        };
        let parsed: ManifestFile =
            toml::from_str(text).map_err(|e| error(e.span(), e.message().trim().to_string()))?;
        for entry in parsed.mcp {
            let span = entry.span();
            let entry = entry.into_inner();
            if entry.command.is_empty() {
                return Err(error(
                    Some(span),
                    "`[[mcp]]` needs a `command`: the program and its arguments".to_string(),
                ));
            }
            let mut spec = McpServerSpec::new(entry.command);
            if let Some(name) = entry.name {
                spec.name = name;
            }
            spec.env = entry.env;
            spec.prefix = entry.prefix;
            if let Some(ms) = entry.timeout_ms {
                spec.timeout = Duration::from_millis(ms);
            }
            spec.effects = entry.effects;
            spec.trust_annotations = entry.trust_annotations.unwrap_or(true);
            // A server runs in its manifest's folder, so relative paths in its command work
            // from wherever toolscript is started.
            spec.cwd = file
                .parent()
                .filter(|dir| dir.is_dir())
                .map(Path::to_path_buf);
            self.servers.push((
                spec,
                Origin {
                    tool: String::new(),
                    file: file.to_path_buf(),
                    line: line_of(text, span.start),
                },
            ));
        }
        for entry in parsed.tool {
            let span = entry.span();
            let entry = entry.into_inner();
            let script_span = entry.script.span();
            let ast = self
                .host
                .engine
                .compile(entry.script.get_ref())
                .map_err(|e| {
                    let first = body_first_line(text, script_span.start);
                    Error::Manifest {
                        file: file.to_path_buf(),
                        line: Some(first + e.position().line().unwrap_or(1) - 1),
                        message: format!(
                            "tool `{}`: its script does not compile: {}",
                            entry.name,
                            e.err_type()
                        ),
                    }
                })?;
            self.origins.push(Origin {
                tool: entry.name.clone(),
                file: file.to_path_buf(),
                line: line_of(text, span.start),
            });
            self.tools.push(self.script_tool(entry, ast));
        }
        Ok(())
    }

    /// The MCP servers the manifests declare.
    pub fn mcp_servers(&self) -> impl Iterator<Item = &McpServerSpec> {
        self.servers.iter().map(|(spec, _)| spec)
    }

    /// Starts the MCP servers the manifests declare and adds their tools. A server lives as
    /// long as any of its tools; it is shut down when the last one is dropped.
    ///
    /// # Errors
    ///
    /// [`Error::Mcp`] naming the server that failed to start, to initialise or to list its
    /// tools.
    pub async fn connect(&mut self) -> Result<(), Error> {
        for (spec, origin) in std::mem::take(&mut self.servers) {
            let tools = crate::mcp::connect(&spec).await?;
            for tool in tools {
                self.origins.push(Origin {
                    tool: tool.spec().name.clone(),
                    ..origin.clone()
                });
                self.tools.push(tool);
            }
        }
        Ok(())
    }

    /// Starts the declared MCP servers, then builds the registry.
    ///
    /// # Errors
    ///
    /// As [`Manifests::connect`] and [`Manifests::into_registry`].
    pub async fn build(mut self) -> Result<Registry, Error> {
        self.connect().await?;
        self.into_registry()
    }

    /// The tools loaded so far (MCP servers' only after [`Manifests::connect`]).
    pub fn into_tools(self) -> Vec<Tool> {
        self.tools
    }

    /// Builds a registry of the tools loaded so far.
    ///
    /// # Errors
    ///
    /// A registry rule broken by a tool, as [`Error::Manifest`] naming the file and line that
    /// declared it, the tool and the rule; an [`Error::Manifest`] if MCP servers are declared
    /// but not started ([`Manifests::build`] starts them).
    pub fn into_registry(self) -> Result<Registry, Error> {
        if let Some((spec, origin)) = self.servers.first() {
            return Err(Error::Manifest {
                file: origin.file.clone(),
                line: Some(origin.line),
                message: format!(
                    "MCP server `{}` is declared but not started: build the registry with `Manifests::build`",
                    spec.name
                ),
            });
        }
        let origins = self.origins;
        Registry::builder()
            .tools(self.tools)
            .build()
            .map_err(|e| match e {
                Error::Registry { tool, rule } => match origins.iter().rfind(|o| o.tool == tool) {
                    Some(origin) => Error::Manifest {
                        file: origin.file.clone(),
                        line: Some(origin.line),
                        message: format!("tool `{tool}`: {rule}"),
                    },
                    None => Error::Registry { tool, rule },
                },
                other => other,
            })
    }

    fn script_tool(&self, entry: ToolEntry, ast: AST) -> Tool {
        let mut spec = ToolSpec::new(entry.name, entry.effect);
        spec.description = entry.description;
        if let Some(input) = entry.input {
            spec.input_schema = input;
        }
        spec.output_schema = entry.output;
        if let Some(ms) = entry.timeout_ms {
            spec.timeout = Duration::from_millis(ms);
        }
        spec.retries = entry.retries;
        spec.allow_repeat = entry.allow_repeat;
        spec.speculate = entry.speculate.unwrap_or(true);
        spec.nested = entry.nested;
        let latency = Duration::from_millis(entry.latency_ms);
        let effect = spec.effect;
        let (host, ast) = (Arc::clone(&self.host), Arc::new(ast));
        if spec.is_composite() {
            return Tool::from_spec(spec, move |args, ctx| {
                let (host, ast) = (Arc::clone(&host), Arc::clone(&ast));
                async move {
                    let started = tokio::time::Instant::now();
                    // A composite that times out must make no more nested calls.
                    let cancel = CancelOnDrop(Arc::new(AtomicBool::new(false)));
                    let (flag, handle) = (Arc::clone(&cancel.0), tokio::runtime::Handle::current());
                    let result = tokio::task::spawn_blocking(move || {
                        host.run_composite(&ast, &args, &ctx, &handle, flag)
                    })
                    .await
                    .unwrap_or_else(|e| {
                        Err(ToolError::internal(format!("the script tool stopped: {e}")))
                    });
                    tokio::time::sleep_until(started + latency).await;
                    result
                }
            });
        }
        Tool::from_spec(spec, move |args, _ctx| {
            let (host, ast) = (Arc::clone(&host), Arc::clone(&ast));
            // The body runs first and the simulated latency follows, so that the replies of
            // calls started together arrive together, as a remote service's would.
            async move {
                let started = tokio::time::Instant::now();
                let Ok(permit) = host.running.acquire().await else {
                    return Err(ToolError::internal("the script tool host is closed"));
                };
                let runner = Arc::clone(&host);
                let result = tokio::task::spawn_blocking(move || runner.run(&ast, &args, effect))
                    .await
                    .unwrap_or_else(|e| {
                        Err(ToolError::internal(format!("the script tool stopped: {e}")))
                    });
                drop(permit);
                tokio::time::sleep_until(started + latency).await;
                result
            }
        })
    }
}

/// Sets its flag when dropped: the future of a call that timed out (or was cancelled) drops it.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// What script tools loaded together share: an engine and the `state` map.
struct ScriptHost {
    engine: Engine,
    limits: Limits,
    state: RwLock<Map>,
    /// Bodies running at once, one per core: a fan-out of a hundred calls wakes a hundred
    /// blocking threads otherwise, and their switching costs more than the bodies.
    running: tokio::sync::Semaphore,
}

impl ScriptHost {
    /// Runs a script tool's body. Read tools run side by side and see `state` as it is; other
    /// tools run alone, so `state` changes are never lost, and a body that fails leaves `state`
    /// as it found it.
    fn run(&self, ast: &AST, args: &Value, effect: Effect) -> Result<Value, ToolError> {
        let mut scope = Scope::new();
        scope.push("args", script::to_dynamic(args));
        if effect == Effect::Read {
            let state = self.state.read().unwrap_or_else(|p| p.into_inner());
            scope.push("state", Dynamic::from_map(state.clone()));
            drop(state);
            let value = self
                .engine
                .eval_ast_with_scope::<Dynamic>(&mut scope, ast)
                .map_err(|e| self.tool_error(*e))?;
            return result_json(&value);
        }
        let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
        scope.push("state", Dynamic::from_map(state.clone()));
        let value = self
            .engine
            .eval_ast_with_scope::<Dynamic>(&mut scope, ast)
            .map_err(|e| self.tool_error(*e))?;
        match scope.get_value::<Map>("state") {
            Some(new_state) => *state = new_state,
            None => {
                return Err(ToolError::internal(
                    "the script tool replaced `state` with something that is not an object map",
                ))
            }
        }
        result_json(&value)
    }

    /// Runs a composite's body: it calls its nested tools like any script does, each call
    /// going through the dispatch path. It sees a snapshot of `state` and changes it only
    /// through its nested tools (it holds no lock while they run).
    fn run_composite(
        &self,
        ast: &AST,
        args: &Value,
        ctx: &ToolContext,
        handle: &tokio::runtime::Handle,
        cancel: Arc<AtomicBool>,
    ) -> Result<Value, ToolError> {
        let watch = script::Watch {
            cancel: Some(Arc::clone(&cancel)),
            ..script::Watch::default()
        };
        let mut engine = script::new_engine(&self.limits, watch);
        engine.on_print(|s| tracing::debug!(target: "toolscript::script_tool", "{s}"));
        engine.on_debug(|s, _, _| tracing::debug!(target: "toolscript::script_tool", "{s}"));
        let (context, handle) = (ctx.clone(), handle.clone());
        let call: script::ToolCall = Arc::new(move |pos, name, args| {
            if cancel.load(Ordering::SeqCst) {
                return Err(Box::new(EvalAltResult::ErrorTerminated(
                    Dynamic::from("cancelled"),
                    pos,
                )));
            }
            let args = script::to_json(args).map_err(|e| {
                script::tool_error_to_rhai(ToolError::invalid_input(format!(
                    "the arguments of `{name}` cannot be sent: {e}"
                )))
            })?;
            let (context, name) = (context.clone(), name.to_string());
            let result = script::block_on(&handle, async move { context.call(&name, args).await })
                .unwrap_or_else(|| Err(ToolError::internal("the async runtime shut down")));
            match result {
                Ok(value) => Ok(script::to_dynamic(&value)),
                Err(e) => Err(script::tool_error_to_rhai(e)),
            }
        });
        // Every tool of the run is a function here, so that a call to one the composite did
        // not declare is refused by the dispatch path (`permission_denied`), not unknown.
        if let Some(registry) = ctx.registry() {
            script::register_tool_functions(&mut engine, registry, call);
        }
        let mut scope = Scope::new();
        scope.push("args", script::to_dynamic(args));
        let state = self.state.read().unwrap_or_else(|p| p.into_inner()).clone();
        scope.push("state", Dynamic::from_map(state));
        let value = engine
            .eval_ast_with_scope::<Dynamic>(&mut scope, ast)
            .map_err(|e| self.tool_error(*e))?;
        result_json(&value)
    }

    /// A thrown map with `kind` and `message` is the tool's structured error; any other thrown
    /// value is `failed`; anything else is the tool's own bug, `internal`.
    fn tool_error(&self, e: EvalAltResult) -> ToolError {
        if let EvalAltResult::ErrorRuntime(value, _) = &e {
            if let Some(map) = value.read_lock::<Map>() {
                let text = |key: &str| map.get(key).map(|v| v.to_string());
                if let (Some(kind), Some(message)) = (text("kind"), text("message")) {
                    return match ErrorKind::parse(&kind) {
                        Some(kind) => ToolError::new(kind, message),
                        None => ToolError::internal(format!(
                            "the script tool threw the malformed error kind `{kind}`: {message}"
                        )),
                    };
                }
            }
            return ToolError::new(ErrorKind::Failed, value.to_string());
        }
        let e = script::from_rhai(e, &self.limits);
        let at = e
            .line
            .map(|l| format!(" (line {l} of its script)"))
            .unwrap_or_default();
        ToolError::internal(format!("the script tool failed{at}: {}", e.message))
    }
}

fn result_json(value: &Dynamic) -> Result<Value, ToolError> {
    script::to_json(value).map_err(|e| {
        ToolError::internal(format!("the script tool's result cannot be returned: {e}"))
    })
}

/// The 1-based line of a byte offset.
fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// The line of the first line of a script string's contents: a multi-line string's opening
/// delimiter followed by a newline starts it on the next line.
fn body_first_line(text: &str, start: usize) -> usize {
    let line = line_of(text, start);
    let rest = &text[start.min(text.len())..];
    let multi_line_opening = ["'''\n", "\"\"\"\n", "'''\r\n", "\"\"\"\r\n"]
        .iter()
        .any(|d| rest.starts_with(d));
    line + usize::from(multi_line_opening)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Registry, Error> {
        let mut m = Manifests::new();
        m.load_str(Path::new("m.toml"), text)?;
        m.into_registry()
    }

    fn manifest_error(result: Result<Registry, Error>) -> (Option<usize>, String) {
        match result {
            Err(Error::Manifest { line, message, .. }) => (line, message),
            other => panic!("expected a manifest error, got {other:?}"),
        }
    }

    #[test]
    fn the_demo_catalog_loads() {
        let registry = demo_catalog().unwrap();
        assert!(registry.len() >= 8);
        assert!(registry.specs().any(|s| s.effect == Effect::Write));
    }

    #[test]
    fn syntax_errors_name_the_line() {
        let (line, message) = manifest_error(load("[[tool]]\nname = \"a\"\neffect = \n"));
        assert_eq!(line, Some(3));
        assert!(!message.is_empty());
    }

    #[test]
    fn unknown_effects_and_fields_are_refused() {
        let (line, message) = manifest_error(load(
            "[[tool]]\nname = \"a\"\neffect = \"reed\"\nscript = \"1\"\n",
        ));
        assert_eq!(line, Some(3));
        assert!(message.contains("read"), "{message}");
        let (_, message) = manifest_error(load(
            "[[tool]]\nname = \"a\"\neffect = \"read\"\nscript = \"1\"\ncolour = 1\n",
        ));
        assert!(message.contains("colour"), "{message}");
        let (_, message) = manifest_error(load("[[tool]]\nname = \"a\"\nscript = \"1\"\n"));
        assert!(message.contains("effect"), "{message}");
    }

    #[test]
    fn script_errors_name_the_line_in_the_file() {
        let text =
            "[[tool]]\nname = \"a\"\neffect = \"read\"\nscript = '''\nlet x = 1;\nlet = ;\n'''\n";
        let (line, message) = manifest_error(load(text));
        assert_eq!(line, Some(6));
        assert!(message.contains("tool `a`"), "{message}");
    }

    #[test]
    fn registry_errors_name_the_declaring_line() {
        let text = "[[tool]]\nname = \"a\"\neffect = \"read\"\nscript = \"1\"\n\n[[tool]]\nname = \"a\"\neffect = \"read\"\nscript = \"2\"\n";
        let (line, message) = manifest_error(load(text));
        assert_eq!(line, Some(6));
        assert!(message.contains("two tools"), "{message}");
    }

    #[test]
    fn mcp_tables_are_parsed() {
        let mut m = Manifests::new();
        m.load_str(
            Path::new("m.toml"),
            "[[mcp]]\nname = \"files\"\ncommand = [\"node\", \"server.js\"]\nprefix = \"fs_\"\ntimeout_ms = 500\neffects = { write_file = \"idempotent\" }\ntrust_annotations = false\nenv = { A = \"1\" }\n",
        )
        .unwrap();
        let spec = m.mcp_servers().next().unwrap().clone();
        assert_eq!(spec.name, "files");
        assert_eq!(spec.command, ["node", "server.js"]);
        assert_eq!(spec.prefix.as_deref(), Some("fs_"));
        assert_eq!(spec.timeout, Duration::from_millis(500));
        assert_eq!(spec.effects["write_file"], Effect::Idempotent);
        assert!(!spec.trust_annotations);
        assert_eq!(spec.env["A"], "1");
        let (line, message) = manifest_error(m.into_registry());
        assert_eq!(line, Some(1));
        assert!(message.contains("not started"), "{message}");
        let (_, message) = manifest_error(load("[[mcp]]\ncommand = []\n"));
        assert!(message.contains("command"), "{message}");
        let (_, message) = manifest_error(load(
            "[[mcp]]\ncommand = [\"x\"]\neffects = { a = \"sometimes\" }\n",
        ));
        assert!(message.contains("read"), "{message}");
    }

    #[test]
    fn composite_rules_name_the_declaring_line() {
        let text = "[[tool]]\nname = \"w\"\neffect = \"write\"\nscript = \"1\"\n\n[[tool]]\nname = \"c\"\neffect = \"read\"\nnested = [\"w\"]\nscript = \"w()\"\n";
        let (line, message) = manifest_error(load(text));
        assert_eq!(line, Some(6));
        assert!(
            message.contains("`c`") && message.contains("`w`"),
            "{message}"
        );
    }
}
