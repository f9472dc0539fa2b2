//! TOML manifests: `[[tool]]` tables declaring script tools (run by `script_tool`), `[[mcp]]`
//! tables declaring MCP servers; and the embedded demo catalog, which is such a manifest.

mod cache;
mod command_tool;
mod files;
mod guard;
mod latency;
mod plans;
mod script_tool;
mod secrets;

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rhai::AST;
use serde::Deserialize;
use serde_json::Value;
use toml::Spanned;

use crate::engine::Limits;
use crate::error::Error;
use crate::mcp::McpServerSpec;
use crate::tool::{Approval, BodySource, Effect, Registry, Tool, ToolSpec};
use script_tool::ScriptHost;

/// The largest `[store] keep_days`: a century.
const MAX_KEEP_DAYS: u32 = 36_500;

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
    /// Limits and budgets of every run (see [`Limits::set`]).
    #[serde(default)]
    limits: std::collections::BTreeMap<Spanned<String>, Spanned<toml::Value>>,
    /// How the store of runs is kept.
    store: Option<Spanned<StoreEntry>>,
    /// What every call may touch.
    guard: Option<Spanned<guard::GuardEntry>>,
    /// The built-in file tools (`manifest::files`).
    files: Option<Spanned<files::FilesEntry>>,
    /// Where each secret comes from (`manifest::secrets`).
    secrets: Option<Spanned<BTreeMap<String, secrets::SecretEntry>>>,
}

/// A `[store]` table.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StoreEntry {
    /// Completed and failed runs are removed once their record is this many days old.
    keep_days: Option<Spanned<toml::Value>>,
}

/// An `[[mcp]]` table: a server to start, whose tools become tools of the registry.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct McpEntry {
    name: Option<String>,
    command: Vec<String>,
    #[serde(default)]
    env: std::collections::BTreeMap<String, crate::secrets::EnvValue>,
    prefix: Option<String>,
    timeout_ms: Option<u64>,
    #[serde(default)]
    effects: std::collections::BTreeMap<String, Effect>,
    #[serde(default)]
    approval: std::collections::BTreeMap<String, Approval>,
    trust_annotations: Option<bool>,
    max_concurrency: Option<usize>,
    #[serde(default)]
    paths: std::collections::BTreeMap<String, Vec<String>>,
    /// Redaction paths by the server's tool name.
    #[serde(default)]
    redact: std::collections::BTreeMap<String, Vec<String>>,
    /// Cached reads, by the server's tool name (`cache.rs`).
    #[serde(default)]
    cache: std::collections::BTreeMap<String, cache::CacheTable>,
    /// The reads each tool makes stale, by the server's tool name.
    #[serde(default)]
    invalidates: std::collections::BTreeMap<String, Vec<String>>,
    /// What each tool answers in a plan, by the server's tool name (`plans.rs`).
    #[serde(default)]
    plan_results: std::collections::BTreeMap<String, String>,
    /// The tools whose first call ends a plan.
    #[serde(default)]
    plan_stop: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ToolEntry {
    name: String,
    #[serde(default)]
    description: String,
    /// Required of a script tool; a command tool's is `write` by default.
    effect: Option<Effect>,
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
    /// A script tool's body; a command tool has none.
    script: Option<Spanned<String>>,
    #[serde(default)]
    nested: Vec<String>,
    #[serde(default)]
    approval: Approval,
    #[serde(default)]
    result: crate::policy::ResultPolicy,
    /// `"command"`: a command tool (`command_tool.rs`), with the fields below.
    kind: Option<String>,
    argv: Option<Vec<String>>,
    cwd: Option<String>,
    env_pass: Option<Vec<String>>,
    env: Option<std::collections::BTreeMap<String, crate::secrets::EnvValue>>,
    /// Redaction paths (`args.password`, `result.contacts[*].email`).
    #[serde(default)]
    redact: Vec<String>,
    max_output_bytes: Option<usize>,
    read_paths: Option<Vec<String>>,
    /// How long a read's results answer later runs (`cache.rs`).
    cache_ttl_s: Option<f64>,
    cache_scope: Option<cache::Scope>,
    /// The cached reads a tool that is not a read makes stale.
    #[serde(default)]
    invalidates: Vec<String>,
    /// What a planned call answers in a plan (`plans.rs`).
    plan_result: Option<String>,
    /// `"stop"`: a plan ends at its first call.
    plan: Option<String>,
}

/// Where a tool was declared, for errors found after parsing.
#[derive(Clone)]
struct Declared {
    tool: String,
    file: PathBuf,
    line: usize,
}

/// Loads manifests into tools. Script tools loaded by one `Manifests` share one `state` map.
pub struct Manifests {
    tools: Vec<Tool>,
    declared: Vec<Declared>,
    /// MCP servers declared but not started yet.
    servers: Vec<(McpServerSpec, Declared)>,
    host: Arc<ScriptHost>,
    /// The defaults, with every `[limits]` key loaded so far applied in order.
    limits: Limits,
    /// `[store] keep_days`: the last manifest loaded that sets it wins.
    keep_days: Option<u32>,
    /// The `[guard]` tables loaded so far, merged in order.
    guard: Option<guard::GuardConfig>,
    /// The guard the registry was built with: what the file tools' listings leave out.
    built_guard: Arc<std::sync::OnceLock<crate::guard::Guard>>,
    /// The root of each `[files]` table and command tool: a guard's root must be theirs, so
    /// that its rules read the names the tools open and the folders they run in.
    rooted: Vec<(PathBuf, Declared, String)>,
    /// Where each secret comes from, as the manifests loaded so far declare.
    secret_sources: BTreeMap<String, crate::secrets::SecretSource>,
    /// Each secret an environment names, and where: every one must be declared.
    secret_uses: Vec<(String, Declared, String)>,
    /// The secrets, made when first needed (to start a server, or to build the registry) and
    /// shared by the servers and the registry: each is fetched once.
    secrets: Option<Arc<crate::secrets::Secrets>>,
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
        Manifests {
            tools: Vec::new(),
            declared: Vec::new(),
            servers: Vec::new(),
            host: Arc::new(ScriptHost::new()),
            limits: Limits::default(),
            keep_days: None,
            guard: None,
            built_guard: Arc::default(),
            rooted: Vec::new(),
            secret_sources: BTreeMap::new(),
            secret_uses: Vec::new(),
            secrets: None,
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
            source: None,
        };
        let parsed: ManifestFile =
            toml::from_str(text).map_err(|e| error(e.span(), e.message().trim().to_string()))?;
        // A later manifest's key wins over an earlier one's; a file with a bad key changes none.
        let mut limits = self.limits.clone();
        for (key, value) in &parsed.limits {
            let number = match value.get_ref() {
                toml::Value::Integer(n) => *n as f64,
                toml::Value::Float(x) => *x,
                other => {
                    return Err(error(
                        Some(value.span()),
                        format!(
                            "`[limits]` `{}` takes a number, not a {}",
                            key.get_ref(),
                            other.type_str()
                        ),
                    ))
                }
            };
            limits
                .set(key.get_ref(), number)
                .map_err(|e| error(Some(key.span()), format!("`[limits]`: {e}")))?;
        }
        let mut keep_days = self.keep_days;
        if let Some(days) = parsed
            .store
            .as_ref()
            .and_then(|s| s.get_ref().keep_days.as_ref())
        {
            keep_days = Some(match days.get_ref() {
                toml::Value::Integer(n) if (1..=i64::from(MAX_KEEP_DAYS)).contains(n) => *n as u32,
                other => {
                    return Err(error(
                        Some(days.span()),
                        format!(
                            "`[store]` `keep_days` takes a whole number of days from 1 to {MAX_KEEP_DAYS}, not {other}"
                        ),
                    ))
                }
            });
        }
        let mut guard = self.guard.clone();
        if let Some(entry) = parsed.guard {
            let span = entry.span();
            let folder = file
                .parent()
                .filter(|dir| dir.is_dir())
                .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
            guard::merge(&mut guard, entry.into_inner(), &folder)
                .map_err(|message| error(Some(span), format!("`[guard]`: {message}")))?;
        }
        let mut secret_sources = self.secret_sources.clone();
        if let Some(entry) = parsed.secrets {
            let span = entry.span();
            secrets::merge(&mut secret_sources, entry.into_inner(), folder_of(file))
                .map_err(|message| error(Some(span), format!("`[secrets]`: {message}")))?;
        }
        self.secret_sources = secret_sources;
        for entry in parsed.mcp {
            let span = entry.span();
            let entry = entry.into_inner();
            for (key, value) in &entry.env {
                if let crate::secrets::EnvValue::Secret { secret } = value {
                    self.secret_uses.push((
                        secret.clone(),
                        Declared {
                            tool: String::new(),
                            file: file.to_path_buf(),
                            line: line_of(text, span.start),
                        },
                        format!("`[[mcp]]` `env` `{key}`"),
                    ));
                }
            }
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
            spec.approval = entry.approval;
            spec.paths = entry.paths;
            spec.redact = entry.redact;
            cache::apply_to_server(&mut spec, entry.cache, entry.invalidates)
                .map_err(|message| error(Some(span.clone()), message))?;
            plans::apply_to_server(&mut spec, entry.plan_results, entry.plan_stop)
                .map_err(|message| error(Some(span.clone()), message))?;
            spec.trust_annotations = entry.trust_annotations.unwrap_or(true);
            if let Some(calls) = entry.max_concurrency {
                if calls == 0 {
                    return Err(error(
                        Some(span),
                        "`max_concurrency` must be at least 1".to_string(),
                    ));
                }
                spec.max_concurrency = calls;
            }
            // A server runs in its manifest's folder, so relative paths in its command work
            // from wherever toolscript is started.
            spec.cwd = file
                .parent()
                .filter(|dir| dir.is_dir())
                .map(Path::to_path_buf);
            self.servers.push((
                spec,
                Declared {
                    tool: String::new(),
                    file: file.to_path_buf(),
                    line: line_of(text, span.start),
                },
            ));
        }
        if let Some(entry) = &parsed.files {
            let span = entry.span();
            // What the tools' listings leave out: the guard's forbidden names, once the
            // registry is built with the guard of every manifest loaded by then.
            let guard = Arc::clone(&self.built_guard);
            let hidden: crate::guard::Hider =
                Arc::new(move |path: &str| guard.get().is_some_and(|g| g.hides(path)));
            let tools = files::tools(entry.get_ref(), file, hidden, |m| {
                error(Some(span.clone()), m)
            })?;
            self.rooted.push((
                files::root_of(entry.get_ref(), file),
                Declared {
                    tool: String::new(),
                    file: file.to_path_buf(),
                    line: line_of(text, span.start),
                },
                "`[files]` `root`".to_string(),
            ));
            for tool in tools {
                self.declared.push(Declared {
                    tool: tool.spec().name.clone(),
                    file: file.to_path_buf(),
                    line: line_of(text, span.start),
                });
                self.tools.push(tool);
            }
        }
        for entry in parsed.tool {
            let span = entry.span();
            let entry = entry.into_inner();
            let redact = entry.redact.clone();
            let mut entry = entry;
            let cached = (
                entry.cache_ttl_s.take(),
                entry.cache_scope.take(),
                std::mem::take(&mut entry.invalidates),
                entry.plan_result.take(),
                entry.plan.take(),
            );
            let cached = |mut tool: Tool| {
                let (ttl, scope, invalidates, plan_result, plan) = cached;
                cache::apply_to_tool(&mut tool.spec, ttl, scope, invalidates)
                    .map_err(|message| error(Some(span.clone()), message))?;
                plans::apply_to_tool(&mut tool.spec, plan_result, plan)
                    .map_err(|message| error(Some(span.clone()), message))?;
                Ok::<Tool, Error>(tool)
            };
            if entry.kind.is_some() {
                let secret_uses: Vec<(String, String)> = entry
                    .env
                    .iter()
                    .flatten()
                    .filter_map(|(key, value)| match value {
                        crate::secrets::EnvValue::Secret { secret } => Some((
                            secret.clone(),
                            format!("tool `{}` `env` `{key}`", entry.name),
                        )),
                        crate::secrets::EnvValue::Plain(_) => None,
                    })
                    .collect();
                let mut tool = command_tool::build(entry, file)
                    .map_err(|message| error(Some(span.clone()), message))?;
                tool.spec.redact = redact;
                let tool = cached(tool)?;
                let declared = Declared {
                    tool: tool.spec().name.clone(),
                    file: file.to_path_buf(),
                    line: line_of(text, span.start),
                };
                self.rooted.push((
                    folder_of(file).to_path_buf(),
                    declared.clone(),
                    format!("command tool `{}`", declared.tool),
                ));
                for (secret, place) in secret_uses {
                    self.secret_uses.push((secret, declared.clone(), place));
                }
                self.declared.push(declared);
                self.tools.push(tool);
                continue;
            }
            command_tool::refuse_fields(&entry)
                .map_err(|message| error(Some(span.clone()), message))?;
            let (Some(script), Some(_)) = (&entry.script, entry.effect) else {
                let missing = if entry.script.is_none() {
                    "script"
                } else {
                    "effect"
                };
                return Err(error(
                    Some(span),
                    format!("tool `{}`: missing field `{missing}`", entry.name),
                ));
            };
            let script_span = script.span();
            let ast = self
                .host
                .engine
                .compile(&*crate::rhai_ast::mark_escapes(script.get_ref()))
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
                        source: None,
                    }
                })?;
            self.declared.push(Declared {
                tool: entry.name.clone(),
                file: file.to_path_buf(),
                line: line_of(text, span.start),
            });
            let mut tool = self.script_tool(entry, ast);
            tool.spec.redact = redact;
            self.tools.push(cached(tool)?);
        }
        self.limits = limits;
        self.keep_days = keep_days;
        self.guard = guard;
        Ok(())
    }

    /// `[store] keep_days`: completed and failed runs whose record is older are removed from
    /// the store (the command line does it when a run, a resume or a server starts). Where
    /// several manifests set it, the last loaded wins.
    pub fn keep_days(&self) -> Option<u32> {
        self.keep_days
    }

    /// The limits of the manifests' `[limits]` tables over the defaults: where several set a
    /// key, the last loaded wins.
    pub fn limits(&self) -> &Limits {
        &self.limits
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
        let secrets = self.secrets()?;
        for (spec, origin) in std::mem::take(&mut self.servers) {
            let tools = crate::mcp::connect(&spec, &secrets).await?;
            for tool in tools {
                self.declared.push(Declared {
                    tool: tool.spec().name.clone(),
                    ..origin.clone()
                });
                self.tools.push(tool);
            }
        }
        Ok(())
    }

    /// The secrets the manifests declare (none fetched yet), once every secret an environment
    /// names is known to be declared.
    fn secrets(&mut self) -> Result<Arc<crate::secrets::Secrets>, Error> {
        if let Some((name, origin, place)) = self
            .secret_uses
            .iter()
            .find(|(name, _, _)| !self.secret_sources.contains_key(name))
        {
            let known: Vec<&str> = self.secret_sources.keys().map(String::as_str).collect();
            return Err(Error::Manifest {
                file: origin.file.clone(),
                line: Some(origin.line),
                message: format!(
                    "{place} names the secret `{name}`, which no `[secrets]` table declares (declared: {})",
                    if known.is_empty() { "none".to_string() } else { known.join(", ") }
                ),
                source: None,
            });
        }
        let sources = &self.secret_sources;
        Ok(Arc::clone(self.secrets.get_or_insert_with(|| {
            Arc::new(crate::secrets::Secrets::new(sources.clone()))
        })))
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
    pub fn into_registry(mut self) -> Result<Registry, Error> {
        if let Some((spec, origin)) = self.servers.first() {
            return Err(Error::Manifest {
                file: origin.file.clone(),
                line: Some(origin.line),
                message: format!(
                    "MCP server `{}` is declared but not started: build the registry with `Manifests::build`",
                    spec.name
                ),
                source: None,
            });
        }
        let secrets = self.secrets()?;
        let declared = self.declared;
        let guard =
            match &self.guard {
                Some(config) => config.build().map_err(|message| Error::Manifest {
                    file: config.file.clone(),
                    line: None,
                    message: format!("`[guard]`: {message}"),
                    source: None,
                })?,
                // File and command tools never go unguarded: with no `[guard]`, the default one
                // over their folder (its forbidden list, reads and writes anywhere in it).
                None => match self.rooted.first() {
                    Some((folder, origin, _)) => crate::guard::Guard::builder(folder)
                        .build()
                        .map_err(|message| Error::Manifest {
                            file: origin.file.clone(),
                            line: Some(origin.line),
                            message,
                            source: None,
                        })?,
                    None => crate::guard::Guard::default(),
                },
            };
        if let Some(root) = guard.root() {
            for (folder, origin, what) in &self.rooted {
                if folder.canonicalize().ok().as_deref() != Some(root) {
                    return Err(Error::Manifest {
                        file: origin.file.clone(),
                        line: Some(origin.line),
                        message: format!(
                            "{what} works in {}, which is not the guard's root ({}): the guard's rules name files relative to its root, so the tools must work in it (declare them in a manifest in the guard's root)",
                            folder.display(),
                            root.display()
                        ),
                        source: None,
                    });
                }
            }
        }
        let guard = self.built_guard.get_or_init(|| guard).clone();
        #[cfg_attr(not(feature = "commands"), allow(unused_mut))]
        let mut tools = self.tools;
        // `run_command` exists only where command rules decide its every call.
        #[cfg(feature = "commands")]
        if let (true, Some(root)) = (guard.has_command_rules(), guard.root()) {
            tools.push(crate::commands::run_command(root)?);
        }
        Registry::builder()
            .tools(tools)
            .guard(guard)
            .shared_secrets(secrets)
            .build()
            .map_err(|e| match e {
                Error::Registry { tool, rule } => match declared.iter().rfind(|o| o.tool == tool) {
                    Some(origin) => Error::Manifest {
                        file: origin.file.clone(),
                        line: Some(origin.line),
                        message: format!("tool `{tool}`: {rule}"),
                        source: None,
                    },
                    None => Error::Registry { tool, rule },
                },
                other => other,
            })
    }

    fn script_tool(&self, entry: ToolEntry, ast: AST) -> Tool {
        let mut spec = ToolSpec::new(entry.name, entry.effect.unwrap_or(Effect::Write));
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
        spec.approval = entry.approval;
        spec.result = entry.result;
        let script = entry.script.as_ref().map(|s| s.get_ref().as_str());
        spec.source = Some(BodySource::Script(crate::json::sha256_hex(
            script.unwrap_or_default(),
        )));
        let body = script_tool::Body {
            ast,
            sees_state: script.is_none_or(|s| s.contains("state")),
        };
        self.host
            .tool(spec, body, Duration::from_millis(entry.latency_ms))
    }
}

/// The folder of the manifest `file`: what its relative roots are relative to.
fn folder_of(file: &Path) -> &Path {
    file.parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
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
        assert!(
            message.contains("expected"),
            "the parser's own words: {message}"
        );
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
        assert_eq!(spec.env["A"], "1".into());
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
