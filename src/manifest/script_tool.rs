//! Script tools: tools whose body is a Rhai script from a manifest. Their bodies see `args`
//! (validated input), `state`, an object map shared by all script tools loaded together, and
//! `ctx`: `#{tool, attempt, idempotency_key, context, fencing_token}` (the key is `()` for a
//! read; `context` is the run's context value, `()` when it has none; `fencing_token` is the
//! run's lease's token, `()` for a run without a store).
//!
//! A body runs on a script-sized thread, never on an async worker or tokio's blocking pool
//! (whose default stack a deep recursion in a body would overflow): an ordinary body on the
//! shared pool of script threads (one body per core at once), or in place on the script thread
//! that polls its call when the tool's last body was quick; a composite's body — which blocks
//! its thread at every nested call — on a script thread of its own.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rhai::{Dynamic, Engine, EvalAltResult, Map, Scope, AST};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::engine::{self, Limits, RunControls, ScriptPool, Thrown, ToolCall};
use crate::error::{ErrorKind, ToolError};
use crate::tool::{Effect, Tool, ToolContext, ToolSpec};

/// A body that took less than this runs its tool's next call in place: on the script thread
/// that polls the call (the executor's, a scout pass's, a composite's), where a hand-off to the
/// pool and back would cost more than the body (about 60 µs).
const QUICK_BODY: Duration = Duration::from_micros(200);

/// The stack a body run in place needs left: a script tool's bodies nest no deeper than the
/// default `max_call_depth`, which takes a few MiB in a debug build; the thread already runs a
/// script of its own, which may be deep.
const IN_PLACE_ROOM: usize = 16 << 20;

/// A script tool's compiled body.
pub(super) struct Body {
    pub(super) ast: AST,
    /// Whether its text names `state` at all (`eval` is disabled, so a body that does not
    /// never reaches it): a read body or a composite that does not is given none, and its
    /// call costs no copy of the state.
    pub(super) sees_state: bool,
}

/// What script tools loaded together share: an engine, their limits, the `state` map, and the
/// slots of the script threads.
pub(super) struct ScriptHost {
    /// Compiles bodies and runs the bodies that are not composites.
    pub(super) engine: Engine,
    limits: Limits,
    state: RwLock<Map>,
    /// One slot per thread of the pool the bodies run on: a call waits for one before its
    /// timeout starts, so that a queue of bodies never turns into timeouts, and gives it back
    /// once its body is done (its simulated latency takes no thread).
    slots: crate::tool::Slots,
}

impl ScriptHost {
    pub(super) fn new() -> ScriptHost {
        let limits = Limits::default();
        let mut engine = engine::new_engine(&limits, RunControls::default());
        log_prints(&mut engine);
        ScriptHost {
            engine,
            limits,
            state: RwLock::default(),
            slots: crate::tool::SlotPool::new(ScriptPool::threads()),
        }
    }

    /// A tool with `spec` whose body is `body`; `latency` is simulated after the body, so that
    /// the replies of calls started together arrive together, as a remote service's would.
    pub(super) fn tool(self: &Arc<Self>, spec: ToolSpec, body: Body, latency: Duration) -> Tool {
        let (host, body) = (Arc::clone(self), Arc::new(body));
        if spec.is_composite() {
            return Tool::from_spec(spec, move |args, ctx| {
                let (host, body) = (Arc::clone(&host), Arc::clone(&body));
                async move {
                    let started = std::time::Instant::now();
                    let result = host.composite(body, args, ctx).await;
                    if latency > Duration::ZERO {
                        super::latency::sleep_until(crate::sync::deadline_after(started, latency))
                            .await;
                    }
                    result
                }
            });
        }
        let effect = spec.effect;
        let slots = Arc::clone(&self.slots);
        // Whether the tool's last body was quick (the first is taken to be): its next runs in
        // place.
        let quick = Arc::new(AtomicBool::new(true));
        let tool = Tool::from_spec(spec, move |args, ctx: ToolContext| {
            let (host, body, quick) = (Arc::clone(&host), Arc::clone(&body), Arc::clone(&quick));
            async move {
                let started = std::time::Instant::now();
                // A call whose future was dropped (its timeout) stops its body: before it starts,
                // or at its next operation or `sleep` slice.
                let token = ctx.cancellation().child_token();
                let cancel = token.clone().drop_guard();
                let call = call_map(&ctx);
                let in_place = quick.load(Ordering::Relaxed)
                    && engine::stack_room().is_some_and(|room| room >= IN_PLACE_ROOM);
                let deadline = ctx.deadline();
                let job = move || {
                    let began = std::time::Instant::now();
                    let result = host.run(&body, &args, call, effect);
                    quick.store(began.elapsed() < QUICK_BODY, Ordering::Relaxed);
                    result
                };
                let ran = if in_place {
                    let ran = engine::run_in_place(token.clone(), deadline.map(Into::into), job);
                    if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
                        // Past its deadline: the call's timer answers, as it would have had the
                        // body run on the pool.
                        std::future::pending::<()>().await;
                    }
                    // A body stopped because its call was abandoned (the run, or its
                    // speculation, ended) failed for that alone, leaving `state` as it was:
                    // the call was abandoned. One that finished keeps its result.
                    match ran {
                        Ok(Some(Err(_))) if token.is_cancelled() => Ok(None),
                        ran => ran,
                    }
                } else {
                    ScriptPool::shared().run(token, job).await
                };
                let result = match ran {
                    Ok(Some(result)) => result,
                    Ok(None) => Err(ToolError::new(
                        ErrorKind::Cancelled,
                        "the call was abandoned",
                    )),
                    Err(e) => Err(ToolError::internal(format!("the script tool stopped: {e}"))),
                };
                drop(cancel);
                ctx.release_slot();
                if latency > Duration::ZERO {
                    super::latency::sleep_until(crate::sync::deadline_after(started, latency))
                        .await;
                }
                result
            }
        });
        tool.sharing(&slots)
    }

    /// Runs a script tool's body. Read tools run side by side and see `state` as it is; other
    /// tools run alone, so `state` changes are never lost, and a body that fails leaves `state`
    /// as it found it.
    fn run(
        &self,
        body: &Body,
        args: &Value,
        call: Map,
        effect: Effect,
    ) -> Result<Value, ToolError> {
        let mut scope = Scope::new();
        scope.push("args", engine::to_dynamic(args));
        scope.push("ctx", Dynamic::from_map(call));
        let ast = &body.ast;
        if effect == Effect::Read {
            if body.sees_state {
                let state = self.state.read().unwrap_or_else(|p| p.into_inner()).clone();
                scope.push("state", Dynamic::from_map(state));
            }
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

    /// Runs a composite's body on a script thread of its own, and waits for it without
    /// blocking the async runtime. Dropping the returned future (the composite's timeout) stops
    /// the body at its next operation and refuses its further nested calls.
    async fn composite(
        self: Arc<Self>,
        body: Arc<Body>,
        args: Value,
        ctx: ToolContext,
    ) -> Result<Value, ToolError> {
        let token = ctx.cancellation().child_token();
        let cancel = token.clone().drop_guard();
        let handle = tokio::runtime::Handle::current();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let spawned = engine::spawn_script_thread("toolscript-composite", move || {
            let _ = tx.send(self.run_composite(&body, &args, &ctx, &handle, token));
        });
        if let Err(e) = spawned {
            return Err(ToolError::internal(format!(
                "no thread could be started for the composite's body: {e}"
            )));
        }
        let result = rx
            .await
            .unwrap_or_else(|_| Err(ToolError::internal("the composite's body stopped")));
        drop(cancel);
        result
    }

    /// A composite's body: it calls its nested tools like any script does, each call going
    /// through the dispatch path. It sees a snapshot of `state` and changes it only through
    /// its nested tools (it holds no lock while they run).
    fn run_composite(
        &self,
        body: &Body,
        args: &Value,
        ctx: &ToolContext,
        handle: &tokio::runtime::Handle,
        cancel: CancellationToken,
    ) -> Result<Value, ToolError> {
        let watch = RunControls {
            cancel: Some(cancel.clone()),
            ..RunControls::default()
        };
        let mut engine = engine::new_engine(&self.limits, watch);
        log_prints(&mut engine);
        let (context, handle) = (ctx.clone(), handle.clone());
        let call: ToolCall = Arc::new(move |pos, name, args| {
            if cancel.is_cancelled() {
                return Err(Box::new(EvalAltResult::ErrorTerminated(
                    Dynamic::from(engine::CANCELLED),
                    pos,
                )));
            }
            let args = engine::to_json(args).map_err(|e| {
                engine::to_rhai(
                    ToolError::invalid_input(format!(
                        "the arguments of `{name}` cannot be sent: {e}"
                    )),
                    pos,
                )
            })?;
            let (context, name, woken) = (context.clone(), name.to_string(), cancel.clone());
            let nested = async move {
                tokio::select! {
                    result = context.call(&name, args) => result,
                    () = woken.cancelled() => Err(ToolError::new(
                        ErrorKind::Cancelled,
                        "the composite's call ended while this nested call was running",
                    )),
                }
            };
            let result = engine::block_on(&handle, nested)
                .unwrap_or_else(|| Err(ToolError::internal("the async runtime shut down")));
            engine::outcome_to_rhai(&result, pos)
        });
        // Every tool of the run is a function here, so that a call to one the composite did
        // not declare is refused by the dispatch path (`permission_denied`), not unknown.
        if let Some(registry) = ctx.registry() {
            engine::register_tool_functions(&mut engine, registry, call);
        }
        let mut scope = Scope::new();
        scope.push("args", engine::to_dynamic(args));
        scope.push("ctx", Dynamic::from_map(call_map(ctx)));
        if body.sees_state {
            let state = self.state.read().unwrap_or_else(|p| p.into_inner()).clone();
            scope.push("state", Dynamic::from_map(state));
        }
        let value = engine
            .eval_ast_with_scope::<Dynamic>(&mut scope, &body.ast)
            .map_err(|e| self.tool_error(*e))?;
        result_json(&value)
    }

    /// A thrown structured error is the tool's error (a malformed kind is the tool's bug,
    /// `internal`); any other thrown value is `failed`; anything else is the tool's own bug,
    /// `internal`.
    fn tool_error(&self, e: EvalAltResult) -> ToolError {
        if let EvalAltResult::ErrorRuntime(value, _) = &e {
            return match engine::thrown_error(value) {
                Thrown::Structured(error) => error,
                Thrown::MalformedKind(kind) => ToolError::internal(format!(
                    "the script tool threw the malformed error kind `{kind}`"
                )),
                Thrown::Plain => ToolError::new(ErrorKind::Failed, value.to_string()),
            };
        }
        let e = engine::from_rhai(e, &self.limits);
        let at = e
            .line
            .map(|l| format!(" (line {l} of its script)"))
            .unwrap_or_default();
        ToolError::internal(format!("the script tool failed{at}: {}", e.message))
    }
}

/// What a body sees of its call, as `ctx`.
fn call_map(ctx: &ToolContext) -> Map {
    let mut map = Map::new();
    map.insert("tool".into(), ctx.tool.clone().into());
    map.insert("attempt".into(), rhai::INT::from(ctx.attempt).into());
    map.insert(
        "idempotency_key".into(),
        ctx.idempotency_key
            .clone()
            .map_or(Dynamic::UNIT, Into::into),
    );
    map.insert(
        "fencing_token".into(),
        ctx.fencing_token()
            .and_then(|t| rhai::INT::try_from(t).ok())
            .map_or(Dynamic::UNIT, Into::into),
    );
    map.insert(
        "context".into(),
        ctx.context
            .as_deref()
            .map_or(Dynamic::UNIT, crate::engine::to_dynamic),
    );
    map
}

/// Script tools' prints are diagnostics, never output.
fn log_prints(engine: &mut Engine) {
    engine.on_print(|s| tracing::debug!(target: "toolscript::script_tool", "{s}"));
    engine.on_debug(|s, _, _| tracing::debug!(target: "toolscript::script_tool", "{s}"));
}

fn result_json(value: &Dynamic) -> Result<Value, ToolError> {
    engine::to_json(value).map_err(|e| {
        ToolError::internal(format!("the script tool's result cannot be returned: {e}"))
    })
}
