//! Tools: their specification (name, effect, schemas, timeout, retries), their bodies, and the
//! registry that validates a set of them once, when it is built.

mod cache;
mod describe;
mod fingerprint;
mod registry;
mod slots;

pub(crate) use cache::ScopePath;
pub(crate) use describe::describe;
pub(crate) use fingerprint::fingerprint;
// The MCP server's `run_script` description heads with the crib sheet too.
pub use describe::Format;
#[cfg(all(feature = "mcp", feature = "manifest"))]
pub(crate) use registry::{check_name, MAX_NAME_LEN};
pub(crate) use registry::{edit_distance, Pace, RegisteredTool, ToolFunctions};
pub use registry::{Registry, RegistryBuilder};

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

pub use crate::effect::Effect;
use crate::error::{ErrorKind, ToolError};
use crate::sync::lock;

/// The default timeout of a tool call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The default number of calls of one tool that may run at once.
pub const DEFAULT_MAX_CONCURRENCY: usize = 32;

pub(crate) use slots::{SlotPool, Slots};

/// Whether a call of a tool waits for a person's yes.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Approval {
    /// Calls are made when the script reaches them.
    #[default]
    Never,
    /// Every call pauses the run until a person approves or rejects it (`toolscript resume`).
    Always,
}

/// Everything about a tool except its body.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ToolSpec {
    /// The name scripts call it by.
    pub name: String,
    /// What it does, for the model reading the catalog.
    pub description: String,
    /// JSON Schema of its one argument, an object.
    pub input_schema: Value,
    /// JSON Schema of its result, checked on every call when present.
    pub output_schema: Option<Value>,
    /// What calling it does to the world.
    pub effect: Effect,
    /// How long one attempt may take.
    pub timeout: Duration,
    /// Every call is dispatched afresh (a polling tool): never deduplicated, never speculated.
    pub allow_repeat: bool,
    /// Extra attempts after a `timeout` or `unavailable` (read and idempotent tools only).
    pub retries: u32,
    /// Whether the scout may start this read early; `false` for costly or rate-limited reads.
    pub speculate: bool,
    /// For a composite: the tools its body may call. Empty for an ordinary tool.
    pub nested: Vec<String>,
    /// Calls of this tool that may run at once; more wait for a slot before their timeout
    /// starts (a call's timeout measures the tool's own work, never a queue). Tools that share
    /// a resource (an MCP server, the threads of script tools) also share one set of slots.
    pub max_concurrency: usize,
    /// Whether each call waits for a person's approval (non-read tools called by the script
    /// itself; a composite may not nest such a tool).
    pub approval: Approval,
    /// What happens to this tool's result when the run's value is that result and does not
    /// fit in the run's output.
    pub result: crate::policy::ResultPolicy,
    /// Where the tool comes from when it is not defined here: `mcp:SERVER/TOOL` for a tool of
    /// an MCP server (its name there, before any mapping to a toolscript name).
    pub origin: Option<String>,
    /// The version of the tool's behaviour, which its author changes when the body changes
    /// what it does: part of the catalog a paused run resumes under (a Rust body cannot be
    /// looked into; a script tool's body and an MCP server's command are fingerprinted).
    pub version: Option<String>,
    /// What the body is made of, where the registry can see it (a script tool's text, an MCP
    /// server's command): part of the catalog's fingerprint.
    pub(crate) source: Option<BodySource>,
    /// How the guard reads its calls: the arguments that name files, the command line a call
    /// starts.
    pub guard: crate::guard::GuardView,
    /// Redaction paths (`args.password`, `result.contacts[*].email`): values never kept or
    /// handed back ([`crate::secrets::RedactPath`]); checked against the schemas when the
    /// registry is built.
    pub redact: Vec<String>,
    /// How long a successful result of this read answers identical calls of later runs (see
    /// docs/cache.md); `None`: never cached.
    pub cache_ttl: Option<Duration>,
    /// What keeps cached results apart besides the arguments, and what an invalidating call
    /// drops: paths such as `args.account` or `context.tenant`.
    pub cache_scope: Vec<String>,
    /// For a tool that is not a read: the cached reads its completion makes stale, dropped in
    /// the same scope.
    pub invalidates: Vec<String>,
    /// How its calls take part in a plan: what a planned call answers, and whether the plan
    /// stops there (see docs/plans.md).
    pub plan: crate::plan::PlanSpec,
}

/// What a tool's body is made of, fingerprinted: a change of it is a change of the catalog a
/// paused run resumes under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum BodySource {
    /// A script tool: SHA-256 of its body's text.
    #[cfg_attr(not(feature = "manifest"), allow(dead_code))]
    Script(String),
    /// A tool of an MCP server: SHA-256 of the server's command and environment.
    #[cfg_attr(not(feature = "mcp"), allow(dead_code))]
    McpServer(String),
}

impl ToolSpec {
    /// A spec with the defaults: no description, any object as input, no output schema,
    /// a 30 s timeout, no repeats, no retries.
    pub fn new(name: impl Into<String>, effect: Effect) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: String::new(),
            input_schema: serde_json::json!({"type": "object"}),
            output_schema: None,
            effect,
            timeout: DEFAULT_TIMEOUT,
            allow_repeat: false,
            retries: 0,
            speculate: true,
            nested: Vec::new(),
            max_concurrency: DEFAULT_MAX_CONCURRENCY,
            approval: Approval::Never,
            result: crate::policy::ResultPolicy::Auto,
            origin: None,
            version: None,
            redact: Vec::new(),
            source: None,
            guard: crate::guard::GuardView::default(),
            cache_ttl: None,
            cache_scope: Vec::new(),
            invalidates: Vec::new(),
            plan: crate::plan::PlanSpec::default(),
        }
    }

    /// Whether this tool is a composite (it declares nested tools).
    pub fn is_composite(&self) -> bool {
        !self.nested.is_empty()
    }
}

/// What a tool body is given besides its arguments.
#[derive(Clone)]
#[non_exhaustive]
pub struct ToolContext {
    /// The tool's name.
    pub tool: String,
    /// This call's id within its run, as it appears in the receipt.
    pub call_id: u64,
    /// The attempt number, from 1.
    pub attempt: u32,
    /// For a non-read call: a key that is the same every time this call of this run is made,
    /// across a resume (`RUN_ID:SEQ`; `RUN_ID:SEQ.N` for the `N`th non-read call nested in a
    /// composite). A tool that remembers the keys it has seen can make each call once.
    pub idempotency_key: Option<String>,
    /// The run's context value (see [`RunOptions::context`](crate::RunOptions::context)): the
    /// same for every call of the run, nested ones included; `None` when the run was given none.
    pub context: Option<Arc<Value>>,
    /// How a composite's body calls its nested tools.
    nested: Option<Arc<dyn NestedCaller>>,
    /// The registry's secrets.
    secrets: Option<Arc<crate::secrets::Secrets>>,
    /// The slot this call holds (see [`ToolSpec::max_concurrency`]), for a body that is done
    /// with the shared resource before its call ends.
    #[cfg_attr(not(feature = "manifest"), allow(dead_code))]
    slot: Arc<std::sync::Mutex<Option<tokio::sync::OwnedSemaphorePermit>>>,
    /// The call's node of the run's cancellation tree.
    cancel: Arc<tokio_util::sync::CancellationToken>,
    /// The run's id and the fencing token of the lease this process holds on it, for a
    /// durable run.
    fencing: Option<(Arc<str>, u64)>,
    /// When this attempt's timeout (or the run's deadline) ends it.
    #[cfg_attr(not(feature = "manifest"), allow(dead_code))]
    deadline: Option<tokio::time::Instant>,
}

/// How a composite's body reaches its nested tools: the dispatch path provides it, so that a
/// tool body never calls another tool's body directly.
pub(crate) trait NestedCaller: Send + Sync {
    /// The run's registry.
    #[cfg_attr(not(feature = "manifest"), allow(dead_code))]
    fn registry(&self) -> &Registry;

    /// Dispatches one nested call.
    fn call(&self, tool: &str, args: Value) -> BoxFuture<'static, Result<Value, ToolError>>;
}

impl fmt::Debug for ToolContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolContext")
            .field("tool", &self.tool)
            .field("call_id", &self.call_id)
            .field("attempt", &self.attempt)
            .finish_non_exhaustive()
    }
}

impl ToolContext {
    // One caller (the dispatch path's step 8), and every argument is one of the call's own.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        tool: &str,
        call_id: u64,
        attempt: u32,
        idempotency_key: Option<String>,
        context: Option<Arc<Value>>,
        nested: Option<Arc<dyn NestedCaller>>,
        secrets: Option<Arc<crate::secrets::Secrets>>,
        slot: Arc<std::sync::Mutex<Option<tokio::sync::OwnedSemaphorePermit>>>,
        cancel: Arc<tokio_util::sync::CancellationToken>,
    ) -> ToolContext {
        ToolContext {
            tool: tool.to_string(),
            call_id,
            attempt,
            idempotency_key,
            context,
            nested,
            secrets,
            slot,
            cancel,
            fencing: None,
            deadline: None,
        }
    }

    /// The context of an attempt that `deadline` ends.
    pub(crate) fn with_deadline(mut self, deadline: tokio::time::Instant) -> ToolContext {
        self.deadline = Some(deadline);
        self
    }

    /// When this attempt's timeout, or the run's deadline, ends it: a body that cannot be
    /// stopped from outside while it runs (a script tool's, run in place) stops itself there.
    #[cfg_attr(not(feature = "manifest"), allow(dead_code))]
    pub(crate) fn deadline(&self) -> Option<tokio::time::Instant> {
        self.deadline
    }

    /// The context, for a durable run's call, with the run's id and the fencing token of the
    /// lease this process holds on it.
    pub(crate) fn with_fencing(mut self, fencing: Option<(Arc<str>, u64)>) -> ToolContext {
        self.fencing = fencing;
        self
    }

    /// The fencing token of the lease this process holds on the call's run: 1 when the run
    /// was created, one more with each take-over by a resume. A service that keeps the
    /// highest token it has seen for a run (see [`ToolContext::fenced_run`]) can refuse a
    /// call with a lower one: it comes from an owner that stalled and lost the run. `None`
    /// for a run without a store.
    pub fn fencing_token(&self) -> Option<u64> {
        self.fencing.as_ref().map(|(_, token)| *token)
    }

    /// The run the fencing token is for.
    pub fn fenced_run(&self) -> Option<&str> {
        self.fencing.as_ref().map(|(run, _)| &**run)
    }

    /// The secret `name`'s value (fetched the first time any tool asks for it). From then on it
    /// is masked, `[secret:NAME]`, in everything the run keeps or hands back; the tool may use
    /// it freely.
    ///
    /// # Errors
    ///
    /// `unavailable` when the secret cannot be had (the error says why, never the value);
    /// `invalid_input` when the registry has no secret of that name.
    pub async fn secret(&self, name: &str) -> Result<Arc<str>, ToolError> {
        let Some(secrets) = self.secrets.as_ref().filter(|s| s.has(name)) else {
            return Err(ToolError::invalid_input(format!(
                "the tool `{}` asked for the secret `{name}`, which the registry does not have",
                self.tool
            ))
            .with_recoverable(false));
        };
        secrets
            .get(name)
            .await
            .map_err(|why| ToolError::new(ErrorKind::Unavailable, why).with_recoverable(false))
    }

    /// The registry's secrets, for a body that fetches several.
    #[cfg_attr(not(feature = "commands"), allow(dead_code))]
    pub(crate) fn secrets(&self) -> Option<&Arc<crate::secrets::Secrets>> {
        self.secrets.as_ref()
    }

    /// Whether the run no longer needs this call: the run was dropped or cancelled, the
    /// speculation it belongs to was given up, or the composite it is nested in ended. (A
    /// body whose own future is dropped — its timeout — simply stops being polled.) A body
    /// that works outside its future, on a thread of its own say, looks here to stop.
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Completes when [`ToolContext::is_cancelled`] becomes true.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await;
    }

    /// The call's node of the run's cancellation tree, for a body's own children.
    #[cfg_attr(not(feature = "manifest"), allow(dead_code))]
    pub(crate) fn cancellation(&self) -> &tokio_util::sync::CancellationToken {
        &self.cancel
    }

    /// Gives back this call's slot before the call ends: the rest of the call (a script tool's
    /// simulated latency, say) does not use the resource the slots stand for.
    #[cfg_attr(not(feature = "manifest"), allow(dead_code))]
    pub(crate) fn release_slot(&self) {
        lock(&self.slot).take();
    }

    /// The run's registry, for a composite's body (`None` for other tools).
    #[cfg_attr(not(feature = "manifest"), allow(dead_code))]
    pub(crate) fn registry(&self) -> Option<&Registry> {
        self.nested.as_ref().map(|n| n.registry())
    }

    /// Calls one of this composite's nested tools, through the same dispatch path as any call:
    /// the run's budget, the tool's breaker, schema validation both ways, its timeout, the
    /// repeat guard, and a receipt whose `parent` is this call.
    ///
    /// Independent nested calls may be awaited together (`futures::join!`) to run in parallel.
    ///
    /// # Errors
    ///
    /// `permission_denied` for a tool this composite did not declare (or from a tool that is not
    /// a composite); otherwise the nested call's own error, with its kind, its message prefixed
    /// by the nested tool's name.
    pub async fn call(&self, tool: &str, args: Value) -> Result<Value, ToolError> {
        match &self.nested {
            Some(nested) => nested.call(tool, args).await,
            None => Err(ToolError::new(
                ErrorKind::PermissionDenied,
                format!(
                    "`{}` is not a composite: it declares no nested tools, so it may not call `{tool}`",
                    self.tool
                ),
            )),
        }
    }
}

/// The future a tool body returns.
pub type ToolFuture = BoxFuture<'static, Result<Value, ToolError>>;

/// A tool's body. Most never look at their call's context (`handler`, `typed`): none is made
/// for them.
#[derive(Clone)]
pub(crate) enum Body {
    Plain(Arc<dyn Fn(Value) -> ToolFuture + Send + Sync>),
    WithContext(Arc<dyn Fn(Value, ToolContext) -> ToolFuture + Send + Sync>),
}

impl Body {
    /// Whether the body takes its call's context.
    pub(crate) fn takes_context(&self) -> bool {
        matches!(self, Body::WithContext(_))
    }

    /// The body's future for `args`, given the context `context` makes if it takes one.
    pub(crate) fn call(&self, args: Value, context: impl FnOnce() -> ToolContext) -> ToolFuture {
        match self {
            Body::Plain(body) => body(args),
            Body::WithContext(body) => body(args, context()),
        }
    }
}

/// A tool: its spec and its body. Build one with [`Tool::builder`].
#[derive(Clone)]
pub struct Tool {
    pub(crate) spec: ToolSpec,
    pub(crate) body: Body,
    /// Slots shared with other tools of the same resource; `None`: the tool's own
    /// `max_concurrency` slots, made when the registry is built.
    pub(crate) slots: Option<Slots>,
}

impl fmt::Debug for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tool").field("spec", &self.spec).finish()
    }
}

impl Tool {
    /// Starts a tool named `name` with `effect`; finish it with [`ToolBuilder::handler`] or
    /// [`ToolBuilder::typed`].
    pub fn builder(name: impl Into<String>, effect: Effect) -> ToolBuilder {
        ToolBuilder {
            spec: ToolSpec::new(name, effect),
        }
    }

    /// A tool from a spec and a body that also receives the call's [`ToolContext`].
    pub fn from_spec<F, Fut>(spec: ToolSpec, body: F) -> Tool
    where
        F: Fn(Value, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, ToolError>> + Send + 'static,
    {
        Tool {
            spec,
            body: Body::WithContext(Arc::new(move |args, ctx| body(args, ctx).boxed())),
            slots: None,
        }
    }

    /// A tool whose body never looks at its call's context.
    fn plain<F, Fut>(spec: ToolSpec, body: F) -> Tool
    where
        F: Fn(Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, ToolError>> + Send + 'static,
    {
        Tool {
            spec,
            body: Body::Plain(Arc::new(move |args| body(args).boxed())),
            slots: None,
        }
    }

    /// The tool's spec.
    pub fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    /// Shares `slots` with the other tools of one resource (its `max_concurrency` is then the
    /// group's).
    #[cfg_attr(not(feature = "manifest"), allow(dead_code))]
    pub(crate) fn sharing(mut self, slots: &Slots) -> Tool {
        self.slots = Some(Arc::clone(slots));
        self
    }
}

/// Builds a [`Tool`]: set what differs from the defaults, then give the body.
#[derive(Debug)]
#[must_use]
pub struct ToolBuilder {
    spec: ToolSpec,
}

impl ToolBuilder {
    /// Declares the arguments that name files, for the guard's path rules.
    pub fn paths(mut self, paths: impl IntoIterator<Item = crate::guard::PathArg>) -> Self {
        self.spec.guard.paths = paths.into_iter().collect();
        self
    }

    /// Declares the command line a call starts, for the guard's command rules.
    pub fn command_line(mut self, line: crate::guard::CommandLine) -> Self {
        self.spec.guard.command = Some(line);
        self
    }

    /// Sets the description the model reads.
    pub fn description(mut self, text: impl Into<String>) -> Self {
        self.spec.description = text.into();
        self
    }

    /// Sets the input JSON Schema (an object schema).
    pub fn input_schema(mut self, schema: Value) -> Self {
        self.spec.input_schema = schema;
        self
    }

    /// Sets the output JSON Schema.
    pub fn output_schema(mut self, schema: Value) -> Self {
        self.spec.output_schema = Some(schema);
        self
    }

    /// Sets the timeout of one attempt.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.spec.timeout = timeout;
        self
    }

    /// Sets the number of automatic retries (read and idempotent tools only).
    pub fn retries(mut self, retries: u32) -> Self {
        self.spec.retries = retries;
        self
    }

    /// Marks a polling tool: every call is dispatched afresh.
    pub fn allow_repeat(mut self, allow: bool) -> Self {
        self.spec.allow_repeat = allow;
        self
    }

    /// Sets how many calls of this tool may run at once (default 32); more wait for a slot,
    /// outside their timeout.
    pub fn max_concurrency(mut self, calls: usize) -> Self {
        self.spec.max_concurrency = calls;
        self
    }

    /// Makes every call of this tool wait for a person's approval: the run pauses there.
    pub fn approval(mut self, approval: Approval) -> Self {
        self.spec.approval = approval;
        self
    }

    /// Sets what happens to this tool's result when it is the run's value and does not fit.
    pub fn result_policy(mut self, policy: crate::policy::ResultPolicy) -> Self {
        self.spec.result = policy;
        self
    }

    /// Sets the version of the tool's behaviour: change it when the body changes what it
    /// does, and a run paused before the change is not resumed under the new body (the
    /// refusal names the tool and both versions).
    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.spec.version = Some(version.into());
        self
    }

    /// Declares redaction paths: the values they name (`args.password`, `result.ssn`,
    /// `result.contacts[*].email`, `result.*.token`) are `"[redacted]"` in everything the run
    /// keeps or hands back; the script and the tool see them. A path is checked against the
    /// tool's schemas when the registry is built.
    pub fn redact(mut self, paths: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.spec.redact = paths.into_iter().map(Into::into).collect();
        self
    }

    /// What a planned call of this tool answers in a plan: a Rhai expression over `args`
    /// (`#{ refund_id: "planned", amount_cents: args.amount_cents }`), where the string
    /// `"planned"` stands for a value known only once the call is made (see docs/plans.md).
    /// Without one, a planned call answers `()`.
    ///
    /// # Errors
    ///
    /// When `expr` is not one expression that compiles.
    pub fn plan_result(mut self, expr: &str) -> Result<Self, crate::Error> {
        let result = crate::plan::PlanResult::compile(expr)
            .map_err(|message| crate::Error::registry(&self.spec.name, message))?;
        self.spec.plan.result = Some(result);
        Ok(self)
    }

    /// Ends a plan at this tool's first call (`plan_incomplete`): what a script does after it
    /// depends on what it really does.
    pub fn plan_stop(mut self) -> Self {
        self.spec.plan.stop = true;
        self
    }

    /// Caches this read's successful results across runs for `ttl` (see docs/cache.md).
    pub fn cache_ttl(mut self, ttl: Duration) -> Self {
        self.spec.cache_ttl = Some(ttl);
        self
    }

    /// Sets the cache's scope: paths such as `args.account` or `context.tenant`, whose values
    /// keep entries apart and bound what an invalidating call drops.
    pub fn cache_scope<S: Into<String>>(mut self, paths: impl IntoIterator<Item = S>) -> Self {
        self.spec.cache_scope = paths.into_iter().map(Into::into).collect();
        self
    }

    /// Declares the cached reads this tool (not a read) makes stale: their entries in the
    /// call's scope are dropped when it completes.
    pub fn invalidates<S: Into<String>>(mut self, tools: impl IntoIterator<Item = S>) -> Self {
        self.spec.invalidates = tools.into_iter().map(Into::into).collect();
        self
    }

    /// Opts a read out of speculation.
    pub fn speculate(mut self, speculate: bool) -> Self {
        self.spec.speculate = speculate;
        self
    }

    /// Declares the tools a composite's body may call (see [`ToolBuilder::composite`]).
    pub fn nested<S: Into<String>>(mut self, tools: impl IntoIterator<Item = S>) -> Self {
        self.spec.nested = tools.into_iter().map(Into::into).collect();
        self
    }

    /// Finishes a composite: a body that calls its nested tools through [`ToolContext::call`].
    pub fn composite<F, Fut>(self, body: F) -> Tool
    where
        F: Fn(Value, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, ToolError>> + Send + 'static,
    {
        Tool::from_spec(self.spec, body)
    }

    /// Finishes the tool with an untyped body over JSON values.
    pub fn handler<F, Fut>(self, body: F) -> Tool
    where
        F: Fn(Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, ToolError>> + Send + 'static,
    {
        Tool::plain(self.spec, body)
    }

    /// Finishes the tool with an untyped body that also takes its call's [`ToolContext`]: its
    /// secrets ([`ToolContext::secret`]), the run's context, the idempotency key.
    pub fn handler_with_context<F, Fut>(self, body: F) -> Tool
    where
        F: Fn(Value, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, ToolError>> + Send + 'static,
    {
        Tool::from_spec(self.spec, body)
    }

    /// Finishes the tool with a typed body; the input and output schemas come from the types.
    ///
    /// The arguments have already passed the input schema; if they still do not deserialize into
    /// `I` the call fails with `invalid_input`. A result that does not serialize fails with
    /// `internal`.
    pub fn typed<I, O, F, Fut>(mut self, body: F) -> Tool
    where
        I: DeserializeOwned + schemars::JsonSchema + Send + 'static,
        O: Serialize + schemars::JsonSchema + 'static,
        F: Fn(I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, ToolError>> + Send + 'static,
    {
        self.spec.input_schema = schemars::schema_for!(I).to_value();
        self.spec.output_schema = Some(schemars::schema_for!(O).to_value());
        let body = Arc::new(body);
        Tool::plain(self.spec, move |args| {
            let body = Arc::clone(&body);
            async move {
                let input: I = serde_json::from_value(args)
                    .map_err(|e| ToolError::new(ErrorKind::InvalidInput, e.to_string()))?;
                let output = body(input).await?;
                serde_json::to_value(output).map_err(|e| {
                    ToolError::internal(format!("the result could not be serialised: {e}"))
                })
            }
        })
    }
}
