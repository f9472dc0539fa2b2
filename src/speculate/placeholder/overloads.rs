//! What the scout's engine registers for placeholders: their accessors, their text, the list
//! functions that would otherwise answer confidently about values not known yet, operators,
//! the functions the rewritten script calls, and the fallback that applies any other built-in
//! function to values once they are known. Every function that resolves a value reports to the
//! pass's [`PassLog`], so that what it waited for and what it guessed is the pass's.
//!
//! All but the fallback are built once per process into one module that every pass's engine
//! shares (building them took a pass about 40 µs, more than many passes' reads): they find the
//! pass's log as the log of the thread they run on, since every pass has a thread of its own
//! and its engine runs on it alone.

use std::any::TypeId;
use std::cell::RefCell;
use std::sync::{Arc, OnceLock};

use rhai::{
    Array, Dynamic, Engine, EvalAltResult, FnPtr, ImmutableString, Module, NativeCallContext,
    Shared, FUNC_TO_STRING, INT,
};

use super::deferred::lookup;
use super::{
    derive, index_known, is_derived, is_placeholder, is_text, shallow, PassLog, Placeholder,
    Resolved, PENDING_TEXT,
};
use crate::engine::set;
use crate::speculate::rewrite::{
    COND, COND_LOOSE, INDEX, INTERPOLATE, KEY, MARK, SETTLE, UNLIKELY, UNLIKELY_LOOSE, VALUE,
};

type RhaiResult = Result<Dynamic, Box<EvalAltResult>>;

const BINARY_OPERATORS: &[&str] = &[
    "+", "-", "*", "/", "%", "**", "==", "!=", "<", "<=", ">", ">=", "&", "|", "^", "<<", ">>",
];

/// A binary operator with a placeholder on either side: the built-in operator over the values
/// once known; before, a deferred value for a comparison (see
/// `deferred::DEFERRED_OPERATORS`) and an unknown for anything else.
///
/// A `+` of a string and a placeholder (or of a deferred string and anything) is a deferred
/// string: Rhai's `+` with a string on either side appends the other side's text.
fn binary(
    ctx: &NativeCallContext,
    op: &'static str,
    a: &Dynamic,
    b: &Dynamic,
    log: &PassLog,
) -> RhaiResult {
    if op == "+" && (is_text(a) || is_text(b)) {
        return Ok(match (shallow(a, log), shallow(b, log)) {
            (Resolved::Never, _) | (_, Resolved::Never) => Placeholder::unknown(),
            (Resolved::Value(mut a), Resolved::Value(mut b)) => {
                return ctx.call_native_fn_raw(op, false, &mut [&mut a, &mut b]);
            }
            _ => Placeholder::text(vec![a.clone(), b.clone()]),
        });
    }
    match (log.known(a), log.known(b)) {
        (Ok(mut a), Ok(mut b)) => ctx.call_native_fn_raw(op, false, &mut [&mut a, &mut b]),
        _ => Ok(Placeholder::operator(op, &[a, b])),
    }
}

/// An interpolation's pieces, evaluated: the string Rhai would build once every piece is known,
/// a deferred string while some are pending, an unknown if one never will be.
fn interpolate(ctx: &NativeCallContext, items: Array, log: &PassLog) -> Dynamic {
    let mut pieces = Vec::new();
    let mut text = String::new();
    for item in items {
        let pending = match item.read_lock::<Placeholder>() {
            None => None,
            Some(p) => match p.state(log) {
                Resolved::Value(v) => Some(Some(v)),
                Resolved::Pending(_) => Some(None),
                Resolved::Never => return Placeholder::unknown(),
            },
        };
        match pending {
            None => text.push_str(&printed(ctx, item)),
            Some(Some(v)) => text.push_str(&printed(ctx, v)),
            Some(None) => {
                if !text.is_empty() {
                    pieces.push(Dynamic::from(std::mem::take(&mut text)));
                }
                pieces.push(item);
            }
        }
    }
    if pieces.is_empty() {
        return text.into();
    }
    if !text.is_empty() {
        pieces.push(text.into());
    }
    Placeholder::text(pieces)
}

/// A known value as interpolation writes it: a string as it is, anything else through its
/// `to_string`, falling back as Rhai's printing does.
fn printed(ctx: &NativeCallContext, mut item: Dynamic) -> String {
    if item.is_string() {
        return item.to_string();
    }
    match ctx.call_native_fn_raw(FUNC_TO_STRING, true, &mut [&mut item]) {
        Ok(r) if r.is_string() => r.to_string(),
        Ok(r) => ctx.engine().map_type_name(r.type_name()).to_string(),
        Err(_) => ctx.engine().map_type_name(&item.to_string()).to_string(),
    }
}

/// The key of `container[key] = ...` (see `rewrite::KEY`): a key the scout does not have yet
/// turns a map or an array into a value edited before it was known, so that the write is kept
/// for when the key arrives instead of failing.
pub(super) fn assignment_key(container: &mut Dynamic, key: Dynamic, log: &PassLog) -> Dynamic {
    match shallow(&key, log) {
        Resolved::Value(k) => k,
        Resolved::Pending(_) | Resolved::Never => {
            if container.is_map() || container.is_array() {
                let base = std::mem::take(container);
                *container = Placeholder::edit(base);
            }
            key
        }
    }
}

thread_local! {
    /// The log of the pass that runs on this thread.
    static PASS_LOG: RefCell<Option<Arc<PassLog>>> = const { RefCell::new(None) };
}

/// Calls `f` with the log of the pass running on this thread (a log nobody reads outside one).
fn with_log<R>(f: impl FnOnce(&PassLog) -> R) -> R {
    match PASS_LOG.with(|log| log.borrow().clone()) {
        Some(log) => f(&log),
        None => f(&PassLog::default()),
    }
}

/// Registers, on a pass's engine, the placeholder type, its accessors and operators, the
/// functions the rewritten script calls, and the fallback that applies built-in functions to
/// known values; each reports to `log`, which becomes the log of this thread's pass: the
/// engine must run on this thread alone. `reserved` names the functions the fallback leaves
/// alone (tools, the script's own functions).
pub(crate) fn register(engine: &mut Engine, reserved: Arc<[String]>, log: &Arc<PassLog>) {
    PASS_LOG.with(|current| *current.borrow_mut() = Some(Arc::clone(log)));
    engine.register_type_with_name::<Placeholder>("Placeholder");
    engine.register_global_module(shared());
    register_fallback(engine, reserved, log);
}

/// Builds the placeholder functions now, if no pass has yet: a runtime does so when it is
/// built, so that the module (some 30 KB, kept for the life of the process) is held whether or
/// not a run speculates, and a speculative run does not meet a memory budget a sequential one
/// fits (`lossless::random_scripts_that_fit_the_memory_budget_sequentially_fit_it_speculatively`).
pub(crate) fn prepare() {
    let _ = shared();
}

/// The functions every pass registers but the fallback, built on first use.
fn shared() -> Shared<Module> {
    static SHARED: OnceLock<Shared<Module>> = OnceLock::new();
    SHARED
        .get_or_init(|| {
            let mut module = Module::new();
            accessors(&mut module);
            text(&mut module);
            lists(&mut module);
            operators(&mut module);
            wrappers(&mut module);
            module.into()
        })
        .clone()
}

/// Fields and indexes of a placeholder, read and written, and `for` over one.
fn accessors(module: &mut Module) {
    module.set_indexer_get_fn(|p: &mut Placeholder, key: ImmutableString| {
        Ok(with_log(|l| derive(p, &Dynamic::from(key), l)))
    });
    module.set_indexer_get_fn(|p: &mut Placeholder, key: INT| {
        Ok(with_log(|l| derive(p, &Dynamic::from(key), l)))
    });
    module.set_indexer_get_fn(|p: &mut Placeholder, key: Placeholder| {
        Ok(with_log(|l| match shallow(&Dynamic::from(key), l) {
            Resolved::Value(key) => derive(p, &key, l),
            _ => Placeholder::unknown(),
        }))
    });
    // A write into a value the scout does not have is kept, to be applied once it arrives.
    module.set_indexer_set_fn(|p: &mut Placeholder, key: ImmutableString, v: Dynamic| {
        p.write(key.into(), v);
        Ok(())
    });
    module.set_indexer_set_fn(|p: &mut Placeholder, key: INT, v: Dynamic| {
        p.write(key.into(), v);
        Ok(())
    });
    module.set_indexer_set_fn(|p: &mut Placeholder, key: Placeholder, v: Dynamic| {
        p.write(Dynamic::from(key), v);
        Ok(())
    });
    // A list not known yet is guessed empty, and noted: the next pass iterates the real one.
    module.set_iter(TypeId::of::<Placeholder>(), |value: Dynamic| {
        let items = match with_log(|l| l.known(&value)).map(Dynamic::into_array) {
            Ok(Ok(items)) => items,
            Ok(Err(_)) | Err(()) => Vec::new(),
        };
        Box::new(items.into_iter())
    });
}

/// The text of a placeholder: interpolations, `to_string` and `to_debug`.
fn text(module: &mut Module) {
    set(
        module,
        INTERPOLATE,
        |ctx: NativeCallContext, items: Array| with_log(|l| interpolate(&ctx, items, l)),
    );
    set(module, "to_string", |p: &mut Placeholder| {
        with_log(|l| match p.state(l) {
            Resolved::Value(v) => v.to_string(),
            _ => PENDING_TEXT.to_string(),
        })
    });
    set(module, "to_debug", |p: &mut Placeholder| {
        with_log(|l| match p.state(l) {
            Resolved::Value(v) => format!("{v:?}"),
            _ => PENDING_TEXT.to_string(),
        })
    });
}

/// The array functions that would answer confidently about a value not known yet.
fn lists(module: &mut Module) {
    // Rhai's array functions that take any value compare it with each item themselves, and an
    // unknown comparison is false to them: `x in list` on a value not known yet would be a
    // confident `false` instead of an unknown.
    for name in ["contains", "index_of"] {
        set(
            module,
            name,
            move |ctx: NativeCallContext, list: &mut Array, p: Placeholder| -> RhaiResult {
                match with_log(|l| l.known(&Dynamic::from(p))) {
                    Ok(mut value) => {
                        let mut list = Dynamic::from_array(list.clone());
                        ctx.call_native_fn_raw(name, false, &mut [&mut list, &mut value])
                    }
                    Err(()) => Ok(Placeholder::unknown()),
                }
            },
        );
    }
    // Rhai's `sort` with a comparator takes a comparison it cannot read for "in order", and
    // so would order an array of values not known yet by a guess (and a `extract` of its
    // first items would pick a guessed few). The scout's sorts as Rhai's does when every
    // comparison is known, and makes every item an unknown when one is not.
    // Rhai's `all` stops at the first item whose predicate is not `true`, and a predicate not
    // known yet is not `true` to it: the scout would stop at the first item and start none of
    // the others' reads. The scout's `all` guesses such a predicate holds, goes on, and is an
    // unknown itself unless an item's predicate is known to fail. (`some`, `filter` and `find`
    // already go on past a predicate that is not `true`.)
    set(
        module,
        "all",
        |ctx: NativeCallContext, array: &mut Array, predicate: FnPtr| -> RhaiResult {
            with_log(|l| all(&ctx, array, &predicate, l))
        },
    );
    set(
        module,
        "sort",
        |ctx: NativeCallContext,
         array: &mut Array,
         comparer: FnPtr|
         -> Result<(), Box<EvalAltResult>> {
            with_log(|l| sort(&ctx, array, &comparer, l))
        },
    );
}

/// `array.all(predicate)` as Rhai's, but a predicate not known yet is guessed to hold (see
/// [`register_lists`]).
fn all(ctx: &NativeCallContext, array: &mut Array, predicate: &FnPtr, log: &PassLog) -> RhaiResult {
    let mut unknown = false;
    for (i, item) in array.iter().enumerate() {
        // The predicate takes the item, or the item and its index.
        let result = match predicate.call_raw(ctx, None, [item.clone()]) {
            Err(e) if matches!(*e, EvalAltResult::ErrorFunctionNotFound(..)) => {
                let index = INT::try_from(i).unwrap_or(INT::MAX);
                predicate.call_raw(ctx, None, [item.clone(), index.into()])?
            }
            other => other?,
        };
        match log.known(&result) {
            Ok(value) if value.as_bool().unwrap_or(false) => {}
            Ok(_) => return Ok(false.into()),
            Err(()) => unknown = true,
        }
    }
    Ok(if unknown {
        Placeholder::unknown()
    } else {
        true.into()
    })
}

/// `array.sort(comparer)` as Rhai sorts, when every comparison is known; every item an unknown
/// when one is not (see [`register_lists`]).
fn sort(
    ctx: &NativeCallContext,
    array: &mut Array,
    comparer: &FnPtr,
    log: &PassLog,
) -> Result<(), Box<EvalAltResult>> {
    if array.len() <= 1 {
        return Ok(());
    }
    let mut undecided = false;
    let sorted = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        array.sort_by(|x, y| {
            let compared = comparer
                .call_raw(ctx, None, [x.clone(), y.clone()])
                .ok()
                .and_then(|v| match log.known(&v) {
                    Ok(v) => Some(v),
                    Err(()) => {
                        undecided = true;
                        None
                    }
                })
                .and_then(|v| {
                    v.as_int()
                        .or_else(|_| v.as_bool().map(|v| if v { -1 } else { 1 }))
                        .ok()
                });
            match compared {
                Some(v) => v.cmp(&0),
                None => x.type_id().cmp(&y.type_id()),
            }
        });
    }));
    if undecided {
        array
            .iter_mut()
            .for_each(|item| *item = Placeholder::unknown());
    }
    sorted.map_err(|_| "error in comparer for sorting".into())
}

/// Operators with a placeholder on either side, and unary ones on a placeholder.
fn operators(module: &mut Module) {
    for &op in BINARY_OPERATORS {
        set(
            module,
            op,
            move |ctx: NativeCallContext, a: Placeholder, b: Dynamic| {
                with_log(|l| binary(&ctx, op, &Dynamic::from(a), &b, l))
            },
        );
        set(
            module,
            op,
            move |ctx: NativeCallContext, a: Dynamic, b: Placeholder| {
                with_log(|l| binary(&ctx, op, &a, &Dynamic::from(b), l))
            },
        );
    }
    for op in ["-", "+", "!"] {
        set(
            module,
            op,
            move |ctx: NativeCallContext, a: Placeholder| -> RhaiResult {
                let a = Dynamic::from(a);
                match with_log(|l| l.known(&a)) {
                    Ok(mut a) => ctx.call_native_fn_raw(op, false, &mut [&mut a]),
                    Err(()) => Ok(Placeholder::operator(op, &[&a])),
                }
            },
        );
    }
}

/// The functions the rewritten script calls (`speculate::rewrite`), but the interpolation's.
fn wrappers(module: &mut Module) {
    // An unknown condition is guessed true: the branch that does more work is the one worth
    // starting reads for, and a wrong guess only wastes reads. The guard of a branch that
    // leaves is guessed not taken. A loose guess (an operand that does not decide its
    // condition alone) is not recorded.
    for (name, guessed, recorded) in [
        (COND, true, true),
        (UNLIKELY, false, true),
        (COND_LOOSE, true, false),
        (UNLIKELY_LOOSE, false, false),
    ] {
        set(module, name, move |value: Dynamic| {
            with_log(|l| l.decide(&value, guessed, recorded))
        });
    }
    set(module, MARK, || with_log(PassLog::guesses_made));
    set(module, SETTLE, |mark: INT, value: Dynamic| {
        if with_log(PassLog::guesses_made) > mark {
            Placeholder::unknown()
        } else {
            value
        }
    });
    set(module, VALUE, |value: Dynamic| {
        with_log(|l| l.known(&value)).unwrap_or(value)
    });
    set(
        module,
        INDEX,
        |container: &mut Dynamic, key: Dynamic| -> Dynamic {
            with_log(|l| match l.known(&key) {
                Ok(key) if is_placeholder(container) => {
                    match container.read_lock::<Placeholder>() {
                        Some(p) => derive(&p, &key, l),
                        None => Placeholder::unknown(),
                    }
                }
                Ok(key) => index_known(container, &key, l),
                Err(()) => lookup(container, key, l),
            })
        },
    );
    set(module, KEY, |container: &mut Dynamic, key: Dynamic| {
        with_log(|l| assignment_key(container, key, l))
    });
}

/// The fallback for built-in functions given a placeholder: applied to the values once they
/// are known, an unknown before.
fn register_fallback(engine: &mut Engine, reserved: Arc<[String]>, log: &Arc<PassLog>) {
    let log = Arc::clone(log);
    // Volatile, but the one hook that sees built-in functions applied to a placeholder.
    #[allow(deprecated)]
    engine.on_missing_function(move |name, args, is_method, mut ctx| {
        // Tool functions that failed, and the scout's own functions, keep their error.
        if name.starts_with("__ts_") || reserved.iter().any(|r| r == name) {
            return Ok(None);
        }
        if !args.iter().any(|a| is_placeholder(a)) {
            return Ok(None);
        }
        // A function may change its first argument (`push`, `remove`): a deferred value the
        // scout is building (a map given an unknown key) must not silently miss that change.
        let derived = args.first().is_some_and(|a| is_derived(a))
            && !PURE.contains(&name)
            && !crate::engine::helpers::PURE_HELPERS.contains(&name);
        let mut values = Vec::with_capacity(args.len());
        for arg in args.iter() {
            match log.known(arg) {
                Ok(v) => values.push(v),
                Err(()) => {
                    if derived {
                        *args[0] = Placeholder::unknown();
                    }
                    return Ok(Some(Placeholder::unknown()));
                }
            }
        }
        let mut refs: Vec<&mut Dynamic> = values.iter_mut().collect();
        let result = ctx.call_fn_raw(name, false, is_method, &mut refs)?;
        // The call ran on the value: the argument becomes it, with what the call changed.
        if derived {
            *args[0] = values.swap_remove(0);
        }
        Ok(Some(result))
    });
}

/// Built-in functions that never change their first argument: calling one on a deferred
/// value leaves it as it is. Any other call on one that is not known yet makes it an unknown.
const PURE: &[&str] = &[
    "len",
    "is_empty",
    "keys",
    "values",
    "contains",
    "get",
    "index_of",
    "to_string",
    "to_debug",
    "to_json",
    "sub_string",
    "starts_with",
    "ends_with",
    "to_upper",
    "to_lower",
    "split",
    "filter",
    "map",
    "reduce",
    "some",
    "all",
    "find",
    "find_map",
    "parse_int",
    "parse_float",
    "type_of",
    "==",
    "!=",
    "+",
    "-",
    "*",
    "/",
    "%",
    "<",
    "<=",
    ">",
    ">=",
];
