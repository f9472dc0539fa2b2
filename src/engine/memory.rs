//! The run's memory budget. Rhai limits sizes (items, bytes of one string), not memory; a short
//! script can still hold gigabytes (many large strings in closures or containers). Two defences:
//!
//! - the built-ins that can allocate a great deal in one step are checked before they allocate
//!   (`replace` with a long replacement), and a value is measured before it is turned into JSON
//!   (an array holding one large string many times shares it in the script, but not in JSON);
//! - where the process counts its allocated bytes (the binary installs a counting allocator and
//!   hands its count to [`set_memory_probe`]), every running script looks at the count as it
//!   checks its deadline, and a run past `Limits::max_memory_mb` ends with `limit_exceeded`
//!   instead of the process aborting when memory runs out.

use std::sync::OnceLock;

use rhai::{Dynamic, Engine, EvalAltResult, ImmutableString, NativeCallContext};

static PROBE: OnceLock<fn() -> usize> = OnceLock::new();

/// Installs the process's count of allocated bytes, read by every running script to keep
/// within `Limits::max_memory_mb`. The count is the whole process's, so in a server it bounds
/// all runs together. The first probe installed stays; `false` if one already was.
pub fn set_memory_probe(probe: fn() -> usize) -> bool {
    PROBE.set(probe).is_ok()
}

/// The bytes the process holds, where a probe is installed.
pub(crate) fn allocated() -> Option<usize> {
    PROBE.get().map(|probe| probe())
}

/// The most bytes a value's JSON may take: larger values are refused before they are built.
pub(crate) const MAX_JSON_BYTES: usize = 256 << 20;

/// About how many bytes `value` takes as JSON, or `None` once it is over `limit`.
pub(crate) fn json_size(value: &Dynamic, limit: usize) -> Option<usize> {
    let mut total = 0usize;
    let mut stack = vec![value.clone()];
    while let Some(value) = stack.pop() {
        total = total.saturating_add(if let Ok(s) = value.clone().into_immutable_string() {
            s.len() + 2
        } else if let Some(items) = value.read_lock::<rhai::Array>() {
            stack.extend(items.iter().cloned());
            items.len() + 2
        } else if let Some(map) = value.read_lock::<rhai::Map>() {
            stack.extend(map.values().cloned());
            map.keys().map(|k| k.len() + 4).sum::<usize>() + 2
        } else {
            24
        });
        if total > limit {
            return None;
        }
    }
    Some(total)
}

/// Size-checked versions of the built-ins that allocate before Rhai checks the result's size.
pub(crate) fn register_checked_builtins(engine: &mut Engine) {
    engine.register_fn(
        "replace",
        |ctx: NativeCallContext,
         text: &mut ImmutableString,
         find: ImmutableString,
         with: ImmutableString|
         -> Result<(), Box<EvalAltResult>> { checked_replace(&ctx, text, &find, &with) },
    );
    engine.register_fn(
        "replace",
        |ctx: NativeCallContext,
         text: &mut ImmutableString,
         find: char,
         with: ImmutableString|
         -> Result<(), Box<EvalAltResult>> {
            checked_replace(&ctx, text, &find.to_string(), &with)
        },
    );
}

fn checked_replace(
    ctx: &NativeCallContext,
    text: &mut ImmutableString,
    find: &str,
    with: &str,
) -> Result<(), Box<EvalAltResult>> {
    if text.is_empty() {
        return Ok(());
    }
    let count = text.matches(find).count();
    let length = (text.len() - count * find.len()).saturating_add(count.saturating_mul(with.len()));
    let max = ctx.engine().max_string_size();
    if max > 0 && length > max {
        return Err(Box::new(EvalAltResult::ErrorDataTooLarge(
            format!("Length of string ({length} bytes after `replace`, at most {max})"),
            ctx.call_position(),
        )));
    }
    *text = text.replace(find, with).into();
    Ok(())
}
