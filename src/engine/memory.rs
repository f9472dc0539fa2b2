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

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use super::set;
use rhai::{Dynamic, EvalAltResult, ImmutableString, Module, NativeCallContext, Shared};

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

/// Runs going on in this process: they share its memory, and so its budget.
static RUNS: AtomicUsize = AtomicUsize::new(0);

/// Counts a run among those going on until it is dropped.
#[derive(Debug)]
pub(crate) struct Running(());

impl Running {
    pub(crate) fn enter() -> Running {
        RUNS.fetch_add(1, Ordering::SeqCst);
        Running(())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        RUNS.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Runs going on in this process now.
pub(crate) fn runs() -> usize {
    RUNS.load(Ordering::SeqCst)
}

/// The share of the memory budget past which a new run is not started while others run: the
/// runs going on keep the room they need, and one more never ends them.
const ROOM_FOR_MORE: f64 = 0.8;

/// Whether a new run may start under a memory budget of `max_mb` MiB: `Err` with why not when
/// other runs go on and the process already holds most of the budget.
pub(crate) fn room_for_a_run(max_mb: u64) -> Result<(), String> {
    room(allocated(), runs(), max_mb)
}

/// [`room_for_a_run`] for a process holding `held` bytes with `others` runs going on.
fn room(held: Option<usize>, others: usize, max_mb: u64) -> Result<(), String> {
    let Some(held) = held else {
        return Ok(());
    };
    let budget = max_mb.saturating_mul(1 << 20) as f64;
    if others == 0 || (held as f64) < budget * ROOM_FOR_MORE {
        return Ok(());
    }
    Err(format!(
        "the process holds {} MiB of its memory budget of {max_mb} MiB (max_memory_mb), shared by the {others} run{} going on: this run was not started, so that none of them is ended for it; try again when they have ended",
        held >> 20,
        if others == 1 { "" } else { "s" }
    ))
}

/// The end of the message of an allocation past the memory budget: the limit's key, so that
/// the error can carry it as data.
pub(crate) const OVER_BUDGET: &str = ": max_memory_mb)";

/// The most bytes a value's JSON may take: larger values are refused before they are built.
pub(crate) const MAX_JSON_BYTES: usize = 256 << 20;

/// About how many bytes `value` takes as JSON, or `None` once it is over `limit`.
pub(crate) fn json_size(value: &Dynamic, limit: usize) -> Option<usize> {
    let mut total = 0usize;
    let mut shared = Vec::new();
    add_json_size(value, limit, &mut total, &mut shared)?;
    while let Some(value) = shared.pop() {
        add_json_size(&value, limit, &mut total, &mut shared)?;
    }
    Some(total)
}

/// Adds to `total` about how many bytes `value` takes as JSON, reading it where it is (it is
/// measured at every tool call, and copying it cost more than measuring it); `None` once the
/// total is over `limit`. A value shared by closures, which may hold itself, is copied out to
/// `shared` to be measured in turn rather than recursed into: a value that holds itself then
/// grows the total until it is over the limit.
fn add_json_size(
    value: &Dynamic,
    limit: usize,
    total: &mut usize,
    shared: &mut Vec<Dynamic>,
) -> Option<()> {
    let mut add = |bytes: usize| {
        *total = total.saturating_add(bytes);
        (*total <= limit).then_some(())
    };
    if value.is_shared() {
        shared.push(value.flatten_clone());
        return Some(());
    }
    if let Some(text) = value.read_lock::<ImmutableString>() {
        add(text.len() + 2)
    } else if let Some(items) = value.read_lock::<rhai::Array>() {
        add(items.len() + 2)?;
        items
            .iter()
            .try_for_each(|item| add_json_size(item, limit, total, shared))
    } else if let Some(map) = value.read_lock::<rhai::Map>() {
        add(map.keys().map(|k| k.len() + 4).sum::<usize>() + 2)?;
        map.values()
            .try_for_each(|item| add_json_size(item, limit, total, shared))
    } else {
        add(24)
    }
}

/// Size-checked versions of the built-ins that allocate before Rhai checks the result's size
/// (`replace` with a long replacement), or that allocate as much as they are asked for in one
/// step (`pad`, `blob`): what they would allocate is checked against the engine's size limits
/// and against what is left of the memory budget of `max_memory` bytes first.
///
/// As a module, built once for each budget and shared by every engine with that budget (the
/// last [`KEPT_BUDGETS`] budgets are kept; most processes have one).
pub(crate) fn checked_builtins(max_memory: usize) -> Shared<Module> {
    static KEPT: Mutex<Vec<(usize, Shared<Module>)>> = Mutex::new(Vec::new());
    let mut kept = crate::sync::lock(&KEPT);
    if let Some((_, module)) = kept.iter().find(|(budget, _)| *budget == max_memory) {
        return module.clone();
    }
    let mut module = Module::new();
    register_checked_builtins(&mut module, max_memory);
    let module: Shared<Module> = module.into();
    if kept.len() >= KEPT_BUDGETS {
        kept.remove(0);
    }
    kept.push((max_memory, module.clone()));
    module
}

/// How many budgets' built-ins [`checked_builtins`] keeps.
const KEPT_BUDGETS: usize = 8;

fn register_checked_builtins(module: &mut Module, max_memory: usize) {
    set(
        module,
        "replace",
        move |ctx: NativeCallContext,
              text: &mut ImmutableString,
              find: ImmutableString,
              with: ImmutableString|
              -> Result<(), Box<EvalAltResult>> {
            checked_replace(&ctx, text, &find, &with, max_memory)
        },
    );
    set(
        module,
        "replace",
        move |ctx: NativeCallContext,
              text: &mut ImmutableString,
              find: char,
              with: ImmutableString|
              -> Result<(), Box<EvalAltResult>> {
            checked_replace(&ctx, text, &find.to_string(), &with, max_memory)
        },
    );
    set(
        module,
        "pad",
        move |ctx: NativeCallContext,
              text: &mut ImmutableString,
              len: rhai::INT,
              with: char|
              -> Result<(), Box<EvalAltResult>> {
            pad_string(&ctx, text, len, &with.to_string(), max_memory)
        },
    );
    set(
        module,
        "pad",
        move |ctx: NativeCallContext,
              text: &mut ImmutableString,
              len: rhai::INT,
              with: ImmutableString|
              -> Result<(), Box<EvalAltResult>> {
            pad_string(&ctx, text, len, &with, max_memory)
        },
    );
    set(
        module,
        "pad",
        move |ctx: NativeCallContext,
              array: &mut rhai::Array,
              len: rhai::INT,
              item: Dynamic|
              -> Result<(), Box<EvalAltResult>> {
            let len = usize::try_from(len).unwrap_or(0);
            if len <= array.len() {
                return Ok(());
            }
            let added = len - array.len();
            let item_bytes = json_size(&item, usize::MAX).unwrap_or(usize::MAX);
            let bytes = added.saturating_mul(item_bytes.max(std::mem::size_of::<Dynamic>()));
            fits(
                &ctx,
                "Size of array",
                len,
                ctx.engine().max_array_size(),
                bytes,
                max_memory,
            )?;
            array.resize(len, item);
            Ok(())
        },
    );
    set(
        module,
        "pad",
        move |ctx: NativeCallContext,
              blob: &mut rhai::Blob,
              len: rhai::INT,
              value: rhai::INT|
              -> Result<(), Box<EvalAltResult>> {
            let len = usize::try_from(len).unwrap_or(0);
            if len <= blob.len() {
                return Ok(());
            }
            let added = len - blob.len();
            fits(
                &ctx,
                "Size of BLOB",
                len,
                ctx.engine().max_array_size(),
                added,
                max_memory,
            )?;
            blob.resize(len, (value & 0xff) as u8);
            Ok(())
        },
    );
    let blob = move |ctx: NativeCallContext,
                     len: rhai::INT,
                     value: rhai::INT|
          -> Result<rhai::Blob, Box<EvalAltResult>> {
        let len = usize::try_from(len).unwrap_or(0);
        fits(
            &ctx,
            "Size of BLOB",
            len,
            ctx.engine().max_array_size(),
            len,
            max_memory,
        )?;
        Ok(vec![(value & 0xff) as u8; len])
    };
    set(module, "blob", blob);
    set(
        module,
        "blob",
        move |ctx: NativeCallContext, len: rhai::INT| blob(ctx, len, 0),
    );
}

/// Whether a value of `size` (in the unit `max` counts; 0: no limit) taking `bytes` more fits
/// the engine's limit and what is left of the memory budget.
///
/// An allocation past the memory budget ends its message with [`OVER_BUDGET`], by which
/// [`super::errors`] knows the limit it reached.
fn fits(
    ctx: &NativeCallContext,
    what: &str,
    size: usize,
    max: usize,
    bytes: usize,
    max_memory: usize,
) -> Result<(), Box<EvalAltResult>> {
    if max > 0 && size > max {
        return Err(Box::new(EvalAltResult::ErrorDataTooLarge(
            format!("{what} ({size}, at most {max})"),
            ctx.call_position(),
        )));
    }
    let left = max_memory.saturating_sub(allocated().unwrap_or(0));
    if bytes > left {
        return Err(Box::new(EvalAltResult::ErrorDataTooLarge(
            format!(
                "{what} ({bytes} bytes, more than the {} MiB the run may hold{OVER_BUDGET}",
                max_memory >> 20
            ),
            ctx.call_position(),
        )));
    }
    Ok(())
}

/// `pad` of a string to `len` characters with copies of `with` (the last one cut short).
fn pad_string(
    ctx: &NativeCallContext,
    text: &mut ImmutableString,
    len: rhai::INT,
    with: &str,
    max_memory: usize,
) -> Result<(), Box<EvalAltResult>> {
    let len = usize::try_from(len).unwrap_or(0);
    let chars = text.chars().count();
    let pad_chars = with.chars().count();
    if len <= chars || pad_chars == 0 {
        return Ok(());
    }
    let missing = len - chars;
    let bytes = (missing / pad_chars)
        .saturating_mul(with.len())
        .saturating_add(
            with.chars()
                .take(missing % pad_chars)
                .map(char::len_utf8)
                .sum(),
        );
    let total = text.len().saturating_add(bytes);
    fits(
        ctx,
        "Length of string",
        total,
        ctx.engine().max_string_size(),
        bytes,
        max_memory,
    )?;
    let padded = text.make_mut();
    for _ in 0..missing / pad_chars {
        padded.push_str(with);
    }
    padded.extend(with.chars().take(missing % pad_chars));
    Ok(())
}

fn checked_replace(
    ctx: &NativeCallContext,
    text: &mut ImmutableString,
    find: &str,
    with: &str,
    max_memory: usize,
) -> Result<(), Box<EvalAltResult>> {
    if text.is_empty() {
        return Ok(());
    }
    let count = text.matches(find).count();
    let length = (text.len() - count * find.len()).saturating_add(count.saturating_mul(with.len()));
    fits(
        ctx,
        "Length of string after `replace`",
        length,
        ctx.engine().max_string_size(),
        length,
        max_memory,
    )?;
    *text = text.replace(find, with).into();
    Ok(())
}

#[cfg(test)]
mod room_tests {
    use super::*;

    #[test]
    fn a_new_run_waits_while_others_share_a_process_near_its_budget() {
        let mib = 1 << 20;
        assert!(room(None, 5, 100).is_ok(), "no probe: nothing to judge by");
        assert!(
            room(Some(95 * mib), 0, 100).is_ok(),
            "alone, a run is judged as it runs"
        );
        assert!(room(Some(70 * mib), 3, 100).is_ok());
        let e = room(Some(85 * mib), 2, 100).unwrap_err();
        assert!(e.contains("85 MiB of its memory budget of 100 MiB"), "{e}");
        assert!(e.contains("shared by the 2 runs going on"), "{e}");
    }
}
