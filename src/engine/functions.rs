//! Tools as script functions: one registration that the executor, the scout and script
//! composites share, differing only in what a call does.

use std::sync::Arc;

use rhai::{
    Dynamic, Engine, EvalAltResult, FuncRegistration, ImmutableString, Map, Module,
    NativeCallContext, Position, Shared,
};

use crate::tool::Registry;

/// What a script's tool functions call: the call site, the tool's name, the argument map.
pub(crate) type ToolCall =
    Arc<dyn Fn(Position, &str, &Dynamic) -> Result<Dynamic, Box<EvalAltResult>> + Send + Sync>;

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
    super::catch::register(engine, Some(registry.clone()));
    *engine.default_tag_mut() = Dynamic::from(Calls(call));
    engine.register_global_module(registry.functions(|| functions_of(registry)));
    let own = super::diagnose::engine_functions();
    for tool in registry.iter() {
        let function = tool.function_name();
        if own.contains(function) {
            register_tool(engine, function, &tool.spec.name);
        }
    }
}

/// The module of `registry`'s tools as script functions.
fn functions_of(registry: &Registry) -> Shared<Module> {
    let mut module = Module::new();
    for tool in registry.iter() {
        let (function, name) = (tool.function_name(), tool.spec.name.clone());
        let with_args = name.clone();
        FuncRegistration::new(function).set_into_module(
            &mut module,
            move |ctx: NativeCallContext, args: Dynamic| {
                call_of(&ctx)?(ctx.call_position(), &with_args, &args)
            },
        );
        FuncRegistration::new(function)
            .set_into_module(&mut module, move |ctx: NativeCallContext| {
                call_of(&ctx)?(ctx.call_position(), &name, &empty())
            });
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
    module.into()
}

/// The tool `name`'s functions, on the engine itself.
fn register_tool(engine: &mut Engine, function: &str, name: &str) {
    let with_args = name.to_string();
    engine.register_fn(function, move |ctx: NativeCallContext, args: Dynamic| {
        call_of(&ctx)?(ctx.call_position(), &with_args, &args)
    });
    let name = name.to_string();
    engine.register_fn(function, move |ctx: NativeCallContext| {
        call_of(&ctx)?(ctx.call_position(), &name, &empty())
    });
}

fn empty() -> Dynamic {
    Dynamic::from_map(Map::new())
}
