//! The registry: a validated, immutable set of tools with compiled schemas.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::{Approval, Body, Effect, Tool, ToolSpec};
use crate::error::{Error, ErrorKind, ToolError};
use crate::guard::Guard;
use crate::secrets::{RedactPath, Secrets, Side};

/// The longest tool name, in bytes (names are ASCII).
pub(crate) const MAX_NAME_LEN: usize = 128;

/// Words a tool cannot be named after: Rhai's keywords and the script surface's own functions.
/// A tool with one of these names could not be called by its name, or would hide a built-in.
const RESERVED_WORDS: &[&str] = &[
    "as",
    "break",
    "call",
    "catch",
    "const",
    "continue",
    "curry",
    "debug",
    "do",
    "else",
    "eval",
    "export",
    "false",
    "fn",
    "Fn",
    "for",
    "global",
    "if",
    "import",
    "in",
    "is_def_fn",
    "is_def_var",
    "is_shared",
    "let",
    "loop",
    "print",
    "private",
    "return",
    "switch",
    "this",
    "throw",
    "tool",
    "true",
    "try",
    "type_of",
    "until",
    "while",
];

/// A tool after validation: its spec, body, compiled schemas and script alias.
pub(crate) struct RegisteredTool {
    pub(crate) spec: ToolSpec,
    /// `spec.name`, shared: the ledger's keys hold it without a copy of their own.
    pub(crate) name: Arc<str>,
    pub(crate) body: Body,
    pub(crate) input: jsonschema::Validator,
    pub(crate) output: Option<jsonschema::Validator>,
    /// The Rhai function name, when the tool's own name is not a Rhai identifier (`get-user`
    /// is also `get_user`).
    pub(crate) alias: Option<String>,
    /// The slots a call takes before its timeout starts.
    pub(crate) slots: super::Slots,
    /// Whether the scout may start it: a read that allows neither repeats nor opts out, and,
    /// for a composite, whose every nested tool is speculable too (a composite would otherwise
    /// make, ahead of the script, the calls its nested tools forbid making ahead).
    pub(crate) speculable: bool,
    /// How its recent calls answered: the scout leaves a quick read to the executor.
    pub(crate) pace: Pace,
    /// Its redaction paths, parsed.
    pub(crate) redact: Vec<RedactPath>,
    /// A composite one of whose nested tools redacts: its own arguments may carry what they
    /// redact, so they are kept as a keyed digest too.
    pub(crate) nested_redacts: bool,
}

/// Whether a tool answers its calls at once: each of its last [`Pace::QUICK_AFTER`] calls
/// answered at its body's first poll, within [`Pace::QUICK`] of its start. Kept per tool for
/// the runtime's life (a registry's clones share it), updated by every call that reaches the
/// body.
///
/// Such a read has no latency to hide: speculated, it costs the scout what it saves the
/// executor, and the executor waits for the scout's copy of it. So the scout leaves it to the
/// executor while the executor is running (see `RunLedger::hold`).
#[derive(Debug, Default)]
pub(crate) struct Pace(std::sync::atomic::AtomicU8);

impl Pace {
    /// How long a call may take, from its start to its outcome, and still count as quick.
    pub(crate) const QUICK: std::time::Duration = std::time::Duration::from_micros(50);
    /// How many quick calls in a row make a tool quick.
    const QUICK_AFTER: u8 = 4;

    /// A call reached the body: `quick` if it answered at the body's first poll, within
    /// [`Pace::QUICK`]. Written only when the count changes, so that the calls of a tool that
    /// stays quick only read it.
    pub(crate) fn note(&self, quick: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        let n = self.0.load(Relaxed);
        let next = if quick {
            (n + 1).min(Self::QUICK_AFTER)
        } else {
            0
        };
        if next != n {
            self.0.store(next, Relaxed);
        }
    }

    /// Whether the tool's last calls were all quick.
    pub(crate) fn is_quick(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed) >= Self::QUICK_AFTER
    }
}

impl RegisteredTool {
    /// Whether a redaction path of `side` names values of its calls.
    pub(crate) fn redacts(&self, side: Side) -> bool {
        (side == Side::Args && self.nested_redacts) || self.redact.iter().any(|p| p.side() == side)
    }

    /// Masks, in `mask`, the values of `value` (a call's `side`) its redaction paths name.
    pub(crate) fn mask_redacted(&self, side: Side, value: &Value, mask: &crate::secrets::Mask) {
        for path in self.redact.iter().filter(|p| p.side() == side) {
            path.mask_values(value, mask);
        }
    }

    /// Replaces, in a call's arguments, the values its redaction paths name.
    pub(crate) fn redact_args(&self, args: &mut Value) {
        for path in self.redact.iter().filter(|p| p.side() == Side::Args) {
            path.replace(args);
        }
    }

    /// The name a script calls it by as a function.
    pub(crate) fn function_name(&self) -> &str {
        self.alias.as_deref().unwrap_or(&self.spec.name)
    }
}

/// A validated, immutable set of tools. Build one with [`Registry::builder`].
#[derive(Clone, Default)]
pub struct Registry {
    /// Shared by the registry's clones (every engine's diagnosis of a caught error holds one).
    tools: Arc<[Arc<RegisteredTool>]>,
    /// Names and aliases, to positions in `tools`.
    index: Arc<crate::sync::FastMap<String, usize>>,
    /// The tools as script functions, built once for every engine that calls them (see
    /// `engine::register_tool_functions`).
    functions: Arc<std::sync::OnceLock<ToolFunctions>>,
    /// What every call of these tools may touch.
    guard: Guard,
    /// The secrets these tools may use.
    secrets: Arc<Secrets>,
    /// Whether a tool has redaction paths.
    redacting: bool,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.tools.iter().map(|t| &t.spec.name))
            .finish()
    }
}

impl Registry {
    /// Starts an empty registry.
    pub fn builder() -> RegistryBuilder {
        RegistryBuilder::default()
    }

    /// This registry with one more tool of the runtime's own (named `ts_...`), checked by the
    /// same rules otherwise.
    ///
    /// # Errors
    ///
    /// As [`RegistryBuilder::build`].
    pub(crate) fn with_tool(&self, tool: Tool) -> Result<Registry, Error> {
        self.rebuilt(tool, false)
    }

    /// This registry with its own tool of `tool`'s name (the last, `ts_...`) replaced by
    /// `tool`: the same spec with another body, say.
    ///
    /// # Errors
    ///
    /// As [`RegistryBuilder::build`].
    pub(crate) fn replacing_own(&self, tool: Tool) -> Result<Registry, Error> {
        self.rebuilt(tool, true)
    }

    fn rebuilt(&self, tool: Tool, replace: bool) -> Result<Registry, Error> {
        // The tools as they were given (their slots kept), checked again with the new one.
        let name = tool.spec.name.clone();
        let kept = self
            .tools
            .iter()
            .filter(|t| !(replace && t.spec.name == name));
        let tools = kept.map(|t| Tool {
            spec: t.spec.clone(),
            body: t.body.clone(),
            slots: Some(Arc::clone(&t.slots)),
        });
        let mut builder = RegistryBuilder::default()
            .tools(tools)
            .tool(tool)
            .guard(self.guard.clone());
        builder.secrets = Arc::clone(&self.secrets);
        builder.own = 1;
        builder.build()
    }

    /// The guard of this registry's calls.
    pub fn guard(&self) -> &Guard {
        &self.guard
    }

    /// Whether a tool redacts values of its calls.
    pub(crate) fn redacts(&self) -> bool {
        self.redacting
    }

    /// Whether the tool `name` redacts values of its calls (`side`, or either when `None`).
    pub(crate) fn tool_redacts(&self, name: &str, side: Option<Side>) -> bool {
        self.redacting
            && self.get(name).is_some_and(|t| match side {
                Some(side) => t.redacts(side),
                None => !t.redact.is_empty(),
            })
    }

    /// The secrets its tools may use.
    pub fn secrets(&self) -> &Arc<Secrets> {
        &self.secrets
    }

    /// The tool with this name or alias.
    pub(crate) fn get(&self, name: &str) -> Option<&Arc<RegisteredTool>> {
        self.index.get(name).map(|&i| &self.tools[i])
    }

    /// All tools, in the order they were added.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Arc<RegisteredTool>> {
        self.tools.iter()
    }

    /// Every field name that some tool's output schema declares (the keys of a `properties`,
    /// at any depth): a read of one may find it missing on purpose, as an optional field.
    pub(crate) fn declared_fields(&self) -> std::collections::HashSet<String> {
        fn walk(schema: &Value, out: &mut std::collections::HashSet<String>) {
            match schema {
                Value::Object(object) => {
                    if let Some(Value::Object(properties)) = object.get("properties") {
                        out.extend(properties.keys().cloned());
                    }
                    object.values().for_each(|v| walk(v, out));
                }
                Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
                _ => {}
            }
        }
        let mut out = std::collections::HashSet::new();
        for spec in self.specs() {
            if let Some(schema) = &spec.output_schema {
                walk(schema, &mut out);
            }
        }
        out
    }

    /// The specs of all tools, in the order they were added.
    pub fn specs(&self) -> impl Iterator<Item = &ToolSpec> {
        self.tools.iter().map(|t| &t.spec)
    }

    /// The number of tools.
    pub fn len(&self) -> usize {
        self.tools.len()
    }

    /// Whether there are no tools.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
    }

    /// The error of a call to `name` when no tool has that name: `unknown_tool`, with the
    /// closest existing name as the suggestion. The one wording of this rule, for the dispatch
    /// path, the executor and `check`.
    pub(crate) fn unknown_tool(&self, name: &str) -> ToolError {
        self.unknown(name, "tool")
    }

    /// As [`Registry::unknown_tool`], for a name the script used as a `what` ("function",
    /// "method"): the nearest tool is still the suggestion.
    pub(crate) fn unknown(&self, name: &str, what: &str) -> ToolError {
        let mut error = ToolError::new(
            ErrorKind::UnknownTool,
            format!("there is no {what} named `{name}`"),
        );
        if let Some(near) = self.suggest(name) {
            error.message.push_str(&format!("; did you mean `{near}`?"));
            error = error.with_next_action(format!("call `{near}` instead"));
        }
        error.tool = Some(name.to_string());
        error
    }

    /// The tools as script functions, built by `build` the first time an engine asks.
    pub(crate) fn functions(&self, build: impl FnOnce() -> ToolFunctions) -> &ToolFunctions {
        self.functions.get_or_init(build)
    }

    /// The existing name closest to `name`, if one is close enough to be a likely typo.
    pub(crate) fn suggest(&self, name: &str) -> Option<&str> {
        let limit = (name.chars().count() / 3).max(2);
        self.tools
            .iter()
            .map(|t| t.spec.name.as_str())
            .map(|candidate| (edit_distance(name, candidate), candidate))
            .filter(|(d, _)| *d <= limit)
            .min_by_key(|(d, _)| *d)
            .map(|(_, candidate)| candidate)
    }
}

/// A registry's tools as script functions (see `engine::register_tool_functions`).
pub(crate) struct ToolFunctions {
    /// Every tool's functions, shared by every engine.
    pub(crate) module: rhai::Shared<rhai::Module>,
    /// The tools whose function name is one of the engine's own, as (function name, tool):
    /// registered on each engine too, over its own.
    pub(crate) shadowing: Vec<(String, String)>,
}

/// Collects tools; [`RegistryBuilder::build`] validates them all.
#[derive(Default, Debug)]
#[must_use]
pub struct RegistryBuilder {
    tools: Vec<Tool>,
    /// How many of `tools`, at the end, are the runtime's own (their names start with `ts_`).
    own: usize,
    guard: Guard,
    secrets: Arc<Secrets>,
    /// The first error met while adding tools (a tool set whose resource could not be
    /// opened), given back by [`RegistryBuilder::build`].
    #[cfg_attr(not(feature = "files"), allow(dead_code))]
    failed: Option<Error>,
}

impl RegistryBuilder {
    /// Adds one tool.
    pub fn tool(mut self, tool: Tool) -> Self {
        self.tools.push(tool);
        self
    }

    /// Sets the guard every call of these tools passes (by default, none: every call is
    /// allowed).
    pub fn guard(mut self, guard: Guard) -> Self {
        self.guard = guard;
        self
    }

    /// Sets the secrets the tools may use ([`ToolContext::secret`](crate::ToolContext::secret),
    /// an MCP server's or a command tool's environment), each fetched when first needed.
    pub fn secrets(mut self, secrets: Secrets) -> Self {
        self.secrets = Arc::new(secrets);
        self
    }

    /// Sets secrets shared with what started before the registry (its MCP servers).
    #[cfg_attr(not(feature = "manifest"), allow(dead_code))]
    pub(crate) fn shared_secrets(mut self, secrets: Arc<Secrets>) -> Self {
        self.secrets = secrets;
        self
    }

    /// Adds several tools.
    pub fn tools(mut self, tools: impl IntoIterator<Item = Tool>) -> Self {
        self.tools.extend(tools);
        self
    }

    /// Remembers an error met while adding tools: [`RegistryBuilder::build`] returns the first.
    #[cfg_attr(not(feature = "files"), allow(dead_code))]
    pub(crate) fn fail(mut self, error: Error) -> Self {
        self.failed.get_or_insert(error);
        self
    }

    /// Validates every tool and compiles its schemas.
    ///
    /// # Errors
    ///
    /// [`Error::Registry`] naming the first tool that breaks a rule, and the rule: a malformed or
    /// reserved name, a duplicate name or alias, `retries` on a write or external tool, a zero
    /// timeout, or a schema that does not compile (remote references are never fetched). An
    /// error met while adding tools comes first ([`Error::Io`] for a file tools' root that
    /// cannot be opened).
    pub fn build(self) -> Result<Registry, Error> {
        if let Some(error) = self.failed {
            return Err(error);
        }
        let mut tools: Vec<RegisteredTool> = Vec::with_capacity(self.tools.len());
        let mut index: crate::sync::FastMap<String, usize> = Default::default();
        let first_own = self.tools.len() - self.own.min(self.tools.len());
        for (i, tool) in self.tools.into_iter().enumerate() {
            let registered = validate(tool, i >= first_own)?;
            let name = registered.spec.name.clone();
            if let Some(&i) = index.get(&name) {
                let other = &tools[i].spec.name;
                return Err(Error::registry(
                    &name,
                    if *other == name {
                        "two tools have this name".to_string()
                    } else {
                        format!("its name is the script alias of `{other}`")
                    },
                ));
            }
            if let Some(alias) = &registered.alias {
                if let Some(&i) = index.get(alias) {
                    return Err(Error::registry(
                        &name,
                        format!(
                            "its script alias `{alias}` is already taken by `{}`",
                            tools[i].spec.name
                        ),
                    ));
                }
                index.insert(alias.clone(), tools.len());
            }
            index.insert(name, tools.len());
            tools.push(registered);
        }
        for i in 0..tools.len() {
            let nested = check_composite(&tools, &index, &tools[i])?;
            tools[i].nested_redacts = nested.iter().any(|name| {
                index
                    .get(name)
                    .is_some_and(|&j| !tools[j].redact.is_empty())
            });
            tools[i].spec.nested = nested;
        }
        super::cache::check_between(&tools, &index)?;
        let own =
            |spec: &ToolSpec| spec.effect == Effect::Read && spec.speculate && !spec.allow_repeat;
        for i in 0..tools.len() {
            // Nested tools are never composites, so one level decides.
            let nested_ok = tools[i]
                .spec
                .nested
                .iter()
                .all(|name| index.get(name).is_some_and(|&j| own(&tools[j].spec)));
            tools[i].speculable = own(&tools[i].spec) && nested_ok;
        }
        Ok(Registry {
            redacting: tools
                .iter()
                .any(|t| !t.redact.is_empty() || t.nested_redacts),
            tools: tools.into_iter().map(Arc::new).collect(),
            index: Arc::new(index),
            functions: Arc::default(),
            guard: self.guard,
            secrets: self.secrets,
        })
    }
}

/// A composite's rules, each naming both tools: every nested tool exists, appears once, is not
/// itself a composite (nesting is flat), is a read if the composite is, and is a read or
/// idempotent if the composite is idempotent. Returns the nested
/// tools by their own names (an alias is resolved).
fn check_composite(
    tools: &[RegisteredTool],
    index: &crate::sync::FastMap<String, usize>,
    composite: &RegisteredTool,
) -> Result<Vec<String>, Error> {
    let spec = &composite.spec;
    let mut resolved: Vec<String> = Vec::with_capacity(spec.nested.len());
    for name in &spec.nested {
        let Some(&i) = index.get(name) else {
            return Err(Error::registry(
                &spec.name,
                format!("its nested tool `{name}` does not exist"),
            ));
        };
        let child = &tools[i].spec;
        if resolved.contains(&child.name) {
            return Err(Error::registry(
                &spec.name,
                format!("it lists its nested tool `{}` twice", child.name),
            ));
        }
        if child.is_composite() {
            return Err(Error::registry(
                &spec.name,
                format!(
                    "its nested tool `{}` is itself a composite; nesting is flat",
                    child.name
                ),
            ));
        }
        // A retried composite runs its body again, and with it every nested call: only calls
        // that are safe to repeat may be in it.
        if spec.retries > 0 && !child.effect.may_retry() {
            return Err(Error::registry(
                &spec.name,
                format!(
                    "it has `retries`, but its nested tool `{}` is {}: a retry would make that call again",
                    child.name, child.effect
                ),
            ));
        }
        // A call that waits for a person pauses the whole run, which a composite's body,
        // halfway through, cannot.
        if child.approval == Approval::Always {
            return Err(Error::registry(
                &spec.name,
                format!(
                    "its nested tool `{}` needs approval, which only a call of the script itself can wait for: give the composite `approval = \"always\"` instead",
                    child.name
                ),
            ));
        }
        // A resume makes an idempotent call whose outcome was lost again, without asking, and
        // an idempotent composite's body with it: every nested call must be safe to repeat.
        if spec.effect == Effect::Idempotent && !child.effect.may_retry() {
            return Err(Error::registry(
                &spec.name,
                format!(
                    "it is an idempotent composite, but its nested tool `{}` is {}: a resume makes an idempotent call again without asking, so an idempotent composite may contain only reads and idempotent tools (make `{}` a write composite instead)",
                    child.name, child.effect, spec.name
                ),
            ));
        }
        if spec.effect == Effect::Read && child.effect != Effect::Read {
            return Err(Error::registry(
                &spec.name,
                format!(
                    "it is a read composite, but its nested tool `{}` is {}: a read composite may contain only reads",
                    child.name, child.effect
                ),
            ));
        }
        resolved.push(child.name.clone());
    }
    Ok(resolved)
}

/// Checks one tool; `own` for the runtime's own tools, whose names are `ts_...`.
fn validate(tool: Tool, own: bool) -> Result<RegisteredTool, Error> {
    let spec = tool.spec;
    let name = spec.name.as_str();
    match check_name(name) {
        Err(_) if own && name.starts_with("ts_") => {}
        checked => checked.map_err(|rule| Error::registry(name, rule))?,
    }
    if spec.retries > 0 && !spec.effect.may_retry() {
        return Err(Error::registry(
            name,
            format!(
                "`retries` is not allowed on a {} tool: only read and idempotent tools are retried",
                spec.effect
            ),
        ));
    }
    if spec.approval == Approval::Always && spec.effect == Effect::Read {
        return Err(Error::registry(
            name,
            "`approval` is for tools that are not reads: a read has no effect to approve",
        ));
    }
    super::cache::check_own(&spec)?;
    if spec.max_concurrency == 0 {
        return Err(Error::registry(
            name,
            "`max_concurrency` must be at least 1",
        ));
    }
    if spec.timeout == Duration::ZERO {
        return Err(Error::registry(
            name,
            "the timeout must be greater than zero",
        ));
    }
    if let Some(ty) = spec.input_schema.get("type") {
        if ty != "object" {
            return Err(Error::registry(
                name,
                "the input schema must describe an object (tools take one object map)",
            ));
        }
    }
    let input = compile_schema(name, "input", &spec.input_schema)?;
    let output = match &spec.output_schema {
        Some(schema) => Some(compile_schema(name, "output", schema)?),
        None => None,
    };
    let mut redact = Vec::with_capacity(spec.redact.len());
    for text in &spec.redact {
        let path = RedactPath::parse(text).map_err(|e| Error::registry(name, e))?;
        let schema = match path.side() {
            Side::Args => Some(&spec.input_schema),
            Side::Result => spec.output_schema.as_ref(),
        };
        path.check(schema).map_err(|e| Error::registry(name, e))?;
        redact.push(path);
    }
    let alias = spec.name.contains('-').then(|| spec.name.replace('-', "_"));
    if let Some(alias) = &alias {
        if RESERVED_WORDS.contains(&alias.as_str()) {
            return Err(Error::registry(
                name,
                format!("its script alias `{alias}` is a reserved word of the script language"),
            ));
        }
    }
    let slots = tool
        .slots
        .unwrap_or_else(|| super::SlotPool::new(spec.max_concurrency));
    Ok(RegisteredTool {
        name: Arc::from(spec.name.as_str()),
        spec,
        body: tool.body,
        input,
        output,
        alias,
        slots,
        speculable: false,
        pace: Pace::default(),
        redact,
        nested_redacts: false,
    })
}

/// Checks `^[a-zA-Z][a-zA-Z0-9_-]{0,127}$` ([`MAX_NAME_LEN`]), the `ts_` prefix and the
/// reserved words.
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let starts_with_letter = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !starts_with_letter || !rest_ok || name.len() > MAX_NAME_LEN {
        let rest = MAX_NAME_LEN - 1;
        return Err(format!(
            "a name must match ^[a-zA-Z][a-zA-Z0-9_-]{{0,{rest}}}$ (a letter, then up to {rest} letters, digits, `_` or `-`)"
        ));
    }
    if name.starts_with("ts_") {
        return Err(
            "names starting with `ts_` are reserved for the runtime's own tools".to_string(),
        );
    }
    if RESERVED_WORDS.contains(&name) {
        return Err(format!(
            "`{name}` is a reserved word of the script language"
        ));
    }
    Ok(())
}

/// Compiles a schema once. Its `pattern`s are matched by the `regex` engine, in time linear in
/// the text, so that validating a call is bounded by its size (a backtracking engine can take
/// minutes on one hostile pattern); a pattern that needs backtracking (look-around,
/// back-references) is refused here.
fn compile_schema(name: &str, which: &str, schema: &Value) -> Result<jsonschema::Validator, Error> {
    jsonschema::options()
        .with_pattern_options(jsonschema::PatternOptions::regex())
        .build(schema)
        .map_err(|e| Error::registry(name, format!("the {which} schema does not compile: {e}")))
}

impl RegisteredTool {
    /// The argument map a call takes, as a script writes it: `#{ owner: .., repo: .. }`, the
    /// input schema's required properties first.
    pub(crate) fn map_example(&self) -> String {
        let schema = &self.spec.input_schema;
        let mut names: Vec<&str> = schema["required"]
            .as_array()
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if let Some(properties) = schema["properties"].as_object() {
            for name in properties.keys() {
                if !names.contains(&name.as_str()) {
                    names.push(name);
                }
            }
        }
        if names.is_empty() {
            return "#{}".to_string();
        }
        let fields: Vec<String> = names.iter().map(|n| format!("{n}: ..")).collect();
        format!("#{{ {} }}", fields.join(", "))
    }
}

/// Levenshtein distance over characters.
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = if ca == *cb {
                diagonal
            } else {
                1 + diagonal.min(above).min(row[j])
            };
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(name: &str) -> Tool {
        Tool::builder(name, Effect::Read).handler(|_| async { Ok(Value::Null) })
    }

    fn rule(result: Result<Registry, Error>) -> String {
        match result {
            Err(Error::Registry { rule, .. }) => rule,
            other => panic!("expected a registry error, got {other:?}"),
        }
    }

    #[test]
    fn names_follow_the_pattern() {
        for bad in [
            "",
            "1abc",
            "_x",
            "a b",
            "a.b",
            &"a".repeat(MAX_NAME_LEN + 1),
        ] {
            assert!(check_name(bad).is_err(), "{bad:?} should be refused");
        }
        for good in ["a", "get_user", "get-user", "A9", &"a".repeat(MAX_NAME_LEN)] {
            assert!(check_name(good).is_ok(), "{good:?} should be accepted");
        }
    }

    #[test]
    fn reserved_prefix_and_words() {
        assert!(check_name("ts_run").unwrap_err().contains("reserved"));
        assert!(check_name("print").unwrap_err().contains("reserved word"));
        assert!(check_name("tool").unwrap_err().contains("reserved word"));
    }

    #[test]
    fn duplicates_and_alias_collisions() {
        let dup = Registry::builder().tool(tool("a")).tool(tool("a")).build();
        assert!(rule(dup).contains("two tools"));
        let alias_first = Registry::builder()
            .tool(tool("get-user"))
            .tool(tool("get_user"))
            .build();
        assert!(rule(alias_first).contains("alias"));
        let name_first = Registry::builder()
            .tool(tool("get_user"))
            .tool(tool("get-user"))
            .build();
        assert!(rule(name_first).contains("alias"));
    }

    #[test]
    fn retries_only_on_read_and_idempotent() {
        for effect in [Effect::Write, Effect::External] {
            let t = Tool::builder("w", effect)
                .retries(1)
                .handler(|_| async { Ok(Value::Null) });
            assert!(rule(Registry::builder().tool(t).build()).contains("retries"));
        }
        let t = Tool::builder("i", Effect::Idempotent)
            .retries(2)
            .handler(|_| async { Ok(Value::Null) });
        assert!(Registry::builder().tool(t).build().is_ok());
    }

    #[test]
    fn schemas_are_compiled_once_and_bad_ones_refused() {
        let t = Tool::builder("s", Effect::Read)
            .input_schema(json!({"type": "object", "properties": {"id": {"type": "intger"}}}))
            .handler(|_| async { Ok(Value::Null) });
        assert!(rule(Registry::builder().tool(t).build()).contains("input schema"));
        let t = Tool::builder("s", Effect::Read)
            .input_schema(json!({"type": "string"}))
            .handler(|_| async { Ok(Value::Null) });
        assert!(rule(Registry::builder().tool(t).build()).contains("object"));
        let t = Tool::builder("s", Effect::Read)
            .output_schema(json!({"$ref": "https://example.com/schema.json"}))
            .handler(|_| async { Ok(Value::Null) });
        assert!(rule(Registry::builder().tool(t).build()).contains("output schema"));
    }

    /// A pattern with catastrophic backtracking is matched in linear time (with a backtracking
    /// engine, this test would run for hours: `^(a+)+$` over 5,000 `a`s and a `b`).
    #[test]
    fn patterns_are_matched_in_linear_time() {
        let t = Tool::builder("p", Effect::Read)
            .input_schema(json!({"type": "object", "properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}}))
            .handler(|_| async { Ok(Value::Null) });
        let r = Registry::builder().tool(t).build().unwrap();
        let input = json!({"s": format!("{}b", "a".repeat(5_000))});
        assert!(!r.get("p").unwrap().input.is_valid(&input));
        let lookahead = Tool::builder("q", Effect::Read)
            .input_schema(json!({"type": "object", "properties": {"s": {"type": "string", "pattern": "^(?=a)a$"}}}))
            .handler(|_| async { Ok(Value::Null) });
        assert!(rule(Registry::builder().tool(lookahead).build()).contains("input schema"));
    }

    #[test]
    fn zero_timeout_is_refused() {
        let t = Tool::builder("t", Effect::Read)
            .timeout(Duration::ZERO)
            .handler(|_| async { Ok(Value::Null) });
        assert!(rule(Registry::builder().tool(t).build()).contains("timeout"));
    }

    fn composite(name: &str, effect: Effect, nested: &[&str]) -> Tool {
        Tool::builder(name, effect)
            .nested(nested.iter().copied())
            .composite(|_, _| async { Ok(Value::Null) })
    }

    #[test]
    fn composite_rules_name_both_tools() {
        let write = Tool::builder("save", Effect::Write).handler(|_| async { Ok(Value::Null) });
        let cases = [
            (
                vec![composite("c", Effect::Read, &["missing"])],
                "`missing` does not exist",
            ),
            (
                vec![tool("a"), composite("c", Effect::Read, &["a", "a"])],
                "`a` twice",
            ),
            (
                vec![
                    tool("a"),
                    composite("inner", Effect::Read, &["a"]),
                    composite("c", Effect::Read, &["inner"]),
                ],
                "`inner` is itself a composite",
            ),
            (
                vec![write.clone(), composite("c", Effect::Read, &["save"])],
                "`save` is write",
            ),
            (
                vec![composite("c", Effect::Read, &["c"])],
                "`c` is itself a composite",
            ),
            (
                vec![
                    write.clone(),
                    Tool::builder("c", Effect::Idempotent)
                        .retries(2)
                        .nested(["save"])
                        .composite(|_, _| async { Ok(Value::Null) }),
                ],
                "a retry would make that call again",
            ),
        ];
        for (tools, needle) in cases {
            match Registry::builder().tools(tools).build() {
                Err(Error::Registry { tool, rule }) => {
                    assert!(rule.contains(needle), "{rule}");
                    assert!(tool == "c", "the composite is named: {tool}");
                }
                other => panic!("expected a registry error for {needle}, got {other:?}"),
            }
        }
        let ok = Registry::builder()
            .tools([
                tool("get-user"),
                write,
                composite("c", Effect::Write, &["get_user", "save"]),
            ])
            .build()
            .unwrap();
        assert_eq!(
            ok.get("c").unwrap().spec.nested,
            ["get-user", "save"],
            "aliases resolve"
        );
    }

    #[test]
    fn suggestions_find_near_names() {
        let r = Registry::builder()
            .tool(tool("get_user"))
            .tool(tool("list_orders"))
            .build()
            .unwrap();
        assert_eq!(r.suggest("get_usr"), Some("get_user"));
        assert_eq!(r.suggest("list_order"), Some("list_orders"));
        assert_eq!(r.suggest("refund"), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
}
