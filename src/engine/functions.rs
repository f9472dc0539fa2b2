//! Tools as script functions: one registration that the executor, the scout and script
//! composites share, differing only in what a call does.

use std::sync::Arc;

use rhai::{
    Dynamic, Engine, EvalAltResult, FuncRegistration, ImmutableString, Map, Module,
    NativeCallContext, Position,
};

use crate::tool::{Registry, ToolFunctions};

/// What a script's tool functions call: the call site, the tool's name, the argument map.
pub(crate) type ToolCall = Arc<dyn Fn(Position, &str, &Dynamic) -> CallResult + Send + Sync>;

/// What a tool function gives the script: the call's value, or its error.
type CallResult = Result<Dynamic, Box<EvalAltResult>>;

/// What an engine's tool functions call, carried as the engine's tag: the functions are built
/// once per registry and shared by every engine (a catalog of hundreds of tools took a run and
/// each scout pass over a millisecond to register again), each engine with a call of its own.
#[derive(Clone)]
struct Calls(ToolCall);

/// The call of the engine running the function.
fn call_of(ctx: &NativeCallContext) -> Result<ToolCall, Box<EvalAltResult>> {
    ctx.tag()
        .and_then(|tag| tag.read_lock::<Calls>().map(|calls| Arc::clone(&calls.0)))
        .ok_or_else(|| "a tool function was called by an engine that calls no tool".into())
}

/// Makes every tool a script function (under its function name: the alias of a `-` name) with
/// one argument or none, plus the generic `tool(name, args)`; all of them call `call`.
///
/// The functions live in one module per registry, shared by every engine. A tool whose name
/// is also one of the engine's own functions is registered on the engine itself as well,
/// where it overrides that function, as a function registered after it does.
pub(crate) fn register_tool_functions(engine: &mut Engine, registry: &Registry, call: ToolCall) {
    // A caught error's diagnosis names the tools.
    super::catch::register(engine, registry.clone());
    *engine.default_tag_mut() = Dynamic::from(Calls(call));
    let functions = registry.functions(|| functions_of(registry));
    engine.register_global_module(functions.module.clone());
    for (function, name) in &functions.shadowing {
        let (with_args, without) = tool_functions(name);
        engine.register_fn(function, with_args);
        engine.register_fn(function, without);
    }
}

/// `registry`'s tools as script functions.
fn functions_of(registry: &Registry) -> ToolFunctions {
    let own = super::diagnose::engine_functions();
    let mut module = Module::new();
    let mut shadowing = Vec::new();
    for tool in registry.iter() {
        let (function, name) = (tool.function_name(), &tool.spec.name);
        let (with_args, without) = tool_functions(name);
        FuncRegistration::new(function).set_into_module(&mut module, with_args);
        FuncRegistration::new(function).set_into_module(&mut module, without);
        if own.contains(function) {
            shadowing.push((function.to_string(), name.clone()));
        }
    }
    FuncRegistration::new("tool").set_into_module(
        &mut module,
        |ctx: NativeCallContext, name: ImmutableString, args: Dynamic| {
            call_of(&ctx)?(ctx.call_position(), &name, &args)
        },
    );
    FuncRegistration::new("tool").set_into_module(
        &mut module,
        |ctx: NativeCallContext, name: ImmutableString| {
            call_of(&ctx)?(ctx.call_position(), &name, &empty())
        },
    );
    ToolFunctions {
        module: module.into(),
        shadowing,
    }
}

/// The two functions of the tool `name`: given its argument map, and given none.
fn tool_functions(
    name: &str,
) -> (
    impl Fn(NativeCallContext, Dynamic) -> CallResult + Send + Sync + 'static,
    impl Fn(NativeCallContext) -> CallResult + Send + Sync + 'static,
) {
    let (with_args, without) = (name.to_string(), name.to_string());
    (
        move |ctx: NativeCallContext, args: Dynamic| {
            call_of(&ctx)?(ctx.call_position(), &with_args, &args)
        },
        move |ctx: NativeCallContext| call_of(&ctx)?(ctx.call_position(), &without, &empty()),
    )
}

fn empty() -> Dynamic {
    Dynamic::from_map(Map::new())
}
