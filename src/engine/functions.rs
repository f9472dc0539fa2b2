//! Tools as script functions: one registration that the executor, the scout and script
//! composites share, differing only in what a call does.

use std::sync::Arc;

use rhai::{Dynamic, Engine, EvalAltResult, ImmutableString, Map, NativeCallContext, Position};

use crate::tool::Registry;

/// What a script's tool functions call: the call site, the tool's name, the argument map.
pub(crate) type ToolCall =
    Arc<dyn Fn(Position, &str, &Dynamic) -> Result<Dynamic, Box<EvalAltResult>> + Send + Sync>;

/// Makes every tool a script function (under its function name: the alias of a `-` name) with
/// one argument or none, plus the generic `tool(name, args)`; all of them call `call`.
pub(crate) fn register_tool_functions(engine: &mut Engine, registry: &Registry, call: ToolCall) {
    // A caught error's diagnosis names the tools.
    super::catch::register(engine, Some(registry.clone()));
    let empty = || Dynamic::from_map(Map::new());
    for tool in registry.iter() {
        let function = tool.function_name();
        let (f, name) = (Arc::clone(&call), tool.spec.name.clone());
        engine.register_fn(function, move |ctx: NativeCallContext, args: Dynamic| {
            f(ctx.call_position(), &name, &args)
        });
        let (f, name) = (Arc::clone(&call), tool.spec.name.clone());
        engine.register_fn(function, move |ctx: NativeCallContext| {
            f(ctx.call_position(), &name, &empty())
        });
    }
    let f = Arc::clone(&call);
    engine.register_fn(
        "tool",
        move |ctx: NativeCallContext, name: ImmutableString, args: Dynamic| {
            f(ctx.call_position(), &name, &args)
        },
    );
    engine.register_fn(
        "tool",
        move |ctx: NativeCallContext, name: ImmutableString| {
            call(ctx.call_position(), &name, &empty())
        },
    );
}
