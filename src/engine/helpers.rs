//! The list and map helpers models reach for from JavaScript and Python: `sum`, `min` and `max`
//! of an array, `join`, `sort_by` with a key, `group_by`, `unique`, `flat_map`, `count`, `first`,
//! `last`, `skip`, `take`, `entries`, `round` to digits.
//!
//! Where Rhai already has the name with another meaning, Rhai's stays and the model's is added
//! only where the arguments tell them apart: `min(a, b)` of two numbers is Rhai's, `min(array)`
//! is added; `take(x)` is Rhai's, `take(array, n)` is added; `sort_by` with a two-parameter
//! comparator is Rhai's (in place), with a one-parameter key it sorts by the key (in place too),
//! and both give the sorted array back, so that `let s = list.sort_by(..)` is never `()`.
//!
//! None of them changes its argument (but `sort_by`, as Rhai's), so the scout treats them as
//! it treats Rhai's own pure functions; a closure given to one calls tools as any code does.

use std::collections::HashSet;

use std::sync::OnceLock;

use super::set;
use rhai::{
    Array, Dynamic, EvalAltResult, FnPtr, ImmutableString, Map, Module, NativeCallContext, Shared,
};

type RhaiResult<T = Dynamic> = Result<T, Box<EvalAltResult>>;

/// The helpers' names that do not change their first argument: the scout may apply them to a
/// value it is still building.
pub(crate) const PURE_HELPERS: &[&str] = &[
    "sum", "min", "max", "min_by", "max_by", "join", "group_by", "unique", "flat_map", "count",
    "first", "last", "skip", "take", "entries", "round",
];

/// The helpers, as one module built once and shared by every engine of the process
/// (`Engine::register_global_module`): registering them on each engine was a tenth of the
/// cost of starting a run, and of a scout's pass. An engine's own functions come before
/// its global modules, and a module registered later before one registered earlier, so a
/// helper still comes before the standard library's function of the same signature (none
/// has one) and after an engine's own.
pub(crate) fn module() -> Shared<Module> {
    static MODULE: OnceLock<Shared<Module>> = OnceLock::new();
    MODULE
        .get_or_init(|| {
            let mut module = Module::new();
            register(&mut module);
            module.into()
        })
        .clone()
}

fn register(module: &mut Module) {
    set(module, "sum", sum);
    set(module, "min", |ctx: NativeCallContext, list: Array| {
        extreme(&ctx, list, "min", std::cmp::Ordering::Less)
    });
    set(module, "max", |ctx: NativeCallContext, list: Array| {
        extreme(&ctx, list, "max", std::cmp::Ordering::Greater)
    });
    set(
        module,
        "min_by",
        |ctx: NativeCallContext, list: Array, key: FnPtr| {
            extreme_by(&ctx, list, &key, "min_by", std::cmp::Ordering::Less)
        },
    );
    set(
        module,
        "max_by",
        |ctx: NativeCallContext, list: Array, key: FnPtr| {
            extreme_by(&ctx, list, &key, "max_by", std::cmp::Ordering::Greater)
        },
    );
    set(module, "join", |list: Array| join(&list, ","));
    set(module, "join", |list: Array, separator: ImmutableString| {
        join(&list, &separator)
    });
    // Python's `", ".join(list)`.
    set(module, "join", |separator: ImmutableString, list: Array| {
        join(&list, &separator)
    });
    set(module, "sort_by", sort_by);
    set(module, "group_by", group_by);
    set(module, "unique", unique);
    set(module, "flat_map", flat_map);
    set(module, "count", count_where);
    set(module, "count", count_of);
    set(module, "first", |list: Array| {
        list.into_iter().next().unwrap_or(Dynamic::UNIT)
    });
    set(module, "last", |list: Array| {
        list.into_iter().last().unwrap_or(Dynamic::UNIT)
    });
    set(module, "skip", |list: Array, n: rhai::INT| -> Array {
        list.into_iter().skip(count_arg(n)).collect()
    });
    set(module, "take", |list: Array, n: rhai::INT| -> Array {
        list.into_iter().take(count_arg(n)).collect()
    });
    set(module, "entries", |map: Map| -> Array {
        map.into_iter()
            .map(|(k, v)| Dynamic::from_array(vec![ImmutableString::from(k.as_str()).into(), v]))
            .collect()
    });
    set(module, "round", |x: rhai::FLOAT, digits: rhai::INT| {
        round(x, digits)
    });
    set(module, "round", |x: rhai::INT, _digits: rhai::INT| x);
}

/// What to do when keys cannot be compared.
const KEY_ACTION: &str =
    "make the key a number or a string for every item, as in `|x| x.score ?? 0` or `|x| x.name.to_string()`";

/// A count argument: a negative one is none.
fn count_arg(n: rhai::INT) -> usize {
    usize::try_from(n).unwrap_or(0)
}

/// A helper's error at its call: a script error with what to write instead.
fn error<T>(ctx: &NativeCallContext, message: String, action: &str) -> RhaiResult<T> {
    let mut map = Map::new();
    map.insert("kind".into(), "script_error".into());
    map.insert("message".into(), message.into());
    map.insert("suggested_next_action".into(), action.into());
    Err(Box::new(EvalAltResult::ErrorRuntime(
        map.into(),
        ctx.call_position(),
    )))
}

/// A number of the array, or why not.
enum Number {
    Int(rhai::INT),
    Float(rhai::FLOAT),
}

fn number(value: &Dynamic) -> Option<Number> {
    if let Ok(i) = value.as_int() {
        return Some(Number::Int(i));
    }
    value.as_float().ok().map(Number::Float)
}

/// The sum of an array of numbers: an integer while every item is one, else a float; `0` for
/// an empty array. An item that is not a number is an error naming it.
fn sum(ctx: NativeCallContext, list: Array) -> RhaiResult {
    let mut int: rhai::INT = 0;
    let mut float: Option<rhai::FLOAT> = None;
    for (i, item) in list.iter().enumerate() {
        match (number(item), &mut float) {
            (Some(Number::Int(n)), None) => match int.checked_add(n) {
                Some(s) => int = s,
                None => float = Some(int as rhai::FLOAT + n as rhai::FLOAT),
            },
            (Some(Number::Int(n)), Some(f)) => *f += n as rhai::FLOAT,
            (Some(Number::Float(x)), None) => float = Some(int as rhai::FLOAT + x),
            (Some(Number::Float(x)), Some(f)) => *f += x,
            (None, _) => {
                return error(
                    &ctx,
                    format!(
                        "sum: item {i} is {} ({}), not a number",
                        item.type_name(),
                        short(item)
                    ),
                    "sum a list of numbers: pick the number from each item first, as in `list.map(|x| x.amount).sum()`",
                )
            }
        }
    }
    Ok(float.map_or(Dynamic::from_int(int), Dynamic::from_float))
}

/// A value in a message, cut short.
fn short(value: &Dynamic) -> String {
    let text = value.to_string();
    match text.char_indices().nth(40) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text,
    }
}

/// How two items compare: numbers with numbers, strings with strings (and characters);
/// anything else cannot be ordered.
fn order(a: &Dynamic, b: &Dynamic) -> Option<std::cmp::Ordering> {
    match (number(a), number(b)) {
        (Some(Number::Int(x)), Some(Number::Int(y))) => return Some(x.cmp(&y)),
        (Some(x), Some(y)) => {
            let f = |n| match n {
                Number::Int(i) => i as rhai::FLOAT,
                Number::Float(f) => f,
            };
            return f(x).partial_cmp(&f(y));
        }
        _ => {}
    }
    let text = |v: &Dynamic| -> Option<String> {
        if v.is_string() || v.is_char() {
            Some(v.to_string())
        } else {
            None
        }
    };
    Some(text(a)?.cmp(&text(b)?))
}

/// The smallest (`Less`) or largest (`Greater`) item, the first of equals; `()` for an empty
/// array.
fn extreme(
    ctx: &NativeCallContext,
    list: Array,
    name: &str,
    want: std::cmp::Ordering,
) -> RhaiResult {
    let mut best: Option<Dynamic> = None;
    for item in list {
        best = Some(match best {
            None => item,
            Some(b) => match order(&item, &b) {
                Some(o) if o == want => item,
                Some(_) => b,
                None => {
                    return error(
                        ctx,
                        format!(
                            "{name}: cannot compare {} with {}",
                            item.type_name(),
                            b.type_name()
                        ),
                        "give a list of numbers or of strings, or compare items by a key: `list.max_by(|x| x.score)`",
                    )
                }
            },
        });
    }
    Ok(best.unwrap_or(Dynamic::UNIT))
}

/// The item with the smallest (`Less`) or largest (`Greater`) key, the first of equals; `()` for
/// an empty array.
fn extreme_by(
    ctx: &NativeCallContext,
    list: Array,
    key: &FnPtr,
    name: &str,
    want: std::cmp::Ordering,
) -> RhaiResult {
    let mut best: Option<(Dynamic, Dynamic)> = None;
    for item in list {
        let k = key.call_raw(ctx, None, [item.clone()])?;
        best = Some(match best {
            None => (k, item),
            Some((bk, b)) => match order(&k, &bk) {
                Some(o) if o == want => (k, item),
                Some(_) => (bk, b),
                None => {
                    return error(
                        ctx,
                        format!(
                            "{name}: cannot compare the keys {} and {}",
                            k.type_name(),
                            bk.type_name()
                        ),
                        KEY_ACTION,
                    )
                }
            },
        });
    }
    Ok(best.map_or(Dynamic::UNIT, |(_, item)| item))
}

/// The items' text joined by `separator`: strings as they are, anything else as `to_string`.
fn join(list: &Array, separator: &str) -> String {
    let mut out = String::new();
    for (i, item) in list.iter().enumerate() {
        if i > 0 {
            out.push_str(separator);
        }
        match item.read_lock::<ImmutableString>() {
            Some(s) => out.push_str(&s),
            None => out.push_str(&item.to_string()),
        }
    }
    out
}

/// Whether `f` takes one parameter: it is called with one, and a closure that takes two is
/// not found with one (the error names the function pointer itself, not a function it calls).
fn call_one(ctx: &NativeCallContext, f: &FnPtr, arg: Dynamic) -> RhaiResult<Option<Dynamic>> {
    match f.call_raw(ctx, None, [arg]) {
        Ok(v) => Ok(Some(v)),
        Err(e) => match *e {
            EvalAltResult::ErrorFunctionNotFound(ref sig, _) if sig.starts_with(f.fn_name()) => {
                Ok(None)
            }
            _ => Err(e),
        },
    }
}

/// `sort_by(|a, b| ..)`: Rhai's, a comparator; `sort_by(|x| key)`: by the key, stable. Either
/// sorts the array in place and gives it back.
fn sort_by(ctx: NativeCallContext, list: &mut Array, f: FnPtr) -> RhaiResult<Array> {
    let Some(first) = list.first().cloned() else {
        return Ok(Array::new());
    };
    let Some(first_key) = call_one(&ctx, &f, first)? else {
        // A comparator: Rhai's own `sort`.
        let mut array = Dynamic::from_array(std::mem::take(list));
        let mut comparer = Dynamic::from(f);
        let sorted = ctx.call_native_fn_raw("sort", true, &mut [&mut array, &mut comparer]);
        *list = array.into_array().unwrap_or_default();
        sorted.map(drop)?;
        return Ok(list.clone());
    };
    let mut keyed = Vec::with_capacity(list.len());
    keyed.push(first_key);
    for item in list.iter().skip(1) {
        keyed.push(f.call_raw(&ctx, None, [item.clone()])?);
    }
    let mut index: Vec<usize> = (0..list.len()).collect();
    let mut bad = None;
    index.sort_by(|&a, &b| {
        order(&keyed[a], &keyed[b]).unwrap_or_else(|| {
            bad.get_or_insert((keyed[a].type_name(), keyed[b].type_name()));
            std::cmp::Ordering::Equal
        })
    });
    if let Some((a, b)) = bad {
        return error(
            &ctx,
            format!("sort_by: cannot compare the keys {a} and {b}"),
            KEY_ACTION,
        );
    }
    let mut items: Vec<Option<Dynamic>> = std::mem::take(list).into_iter().map(Some).collect();
    *list = index.into_iter().filter_map(|i| items[i].take()).collect();
    Ok(list.clone())
}

/// A map from each key's text to the items with that key, in their order.
fn group_by(ctx: NativeCallContext, list: Array, key: FnPtr) -> RhaiResult<Map> {
    let mut groups = Map::new();
    for item in list {
        let k = key.call_raw(&ctx, None, [item.clone()])?;
        let name = match k.read_lock::<ImmutableString>() {
            Some(s) => s.as_str().into(),
            None => k.to_string().into(),
        };
        let group = groups
            .entry(name)
            .or_insert_with(|| Dynamic::from_array(Array::new()));
        if let Some(mut group) = group.write_lock::<Array>() {
            group.push(item);
        }
    }
    Ok(groups)
}

/// The items without repeats, each where it first came. Two items repeat when they have the
/// same type and the same value (maps and arrays by their contents).
fn unique(list: Array) -> Array {
    let mut seen = HashSet::new();
    list.into_iter()
        .filter(|item| seen.insert((item.type_name(), format!("{item:?}"))))
        .collect()
}

/// Each item's `f(item)`, arrays spliced in, anything else as one item.
fn flat_map(ctx: NativeCallContext, list: Array, f: FnPtr) -> RhaiResult<Array> {
    let mut out = Array::new();
    for item in list {
        let mapped = f.call_raw(&ctx, None, [item])?;
        if mapped.is_array() {
            out.extend(mapped.into_array().unwrap_or_default());
        } else {
            out.push(mapped);
        }
    }
    Ok(out)
}

/// The number of items for which `predicate` is true.
fn count_where(ctx: NativeCallContext, list: Array, predicate: FnPtr) -> RhaiResult<rhai::INT> {
    let mut n: rhai::INT = 0;
    for item in list {
        if predicate
            .call_raw(&ctx, None, [item])?
            .as_bool()
            .unwrap_or(false)
        {
            n += 1;
        }
    }
    Ok(n)
}

/// The number of items equal to `value` (Python's `list.count(x)`).
fn count_of(ctx: NativeCallContext, list: Array, mut value: Dynamic) -> RhaiResult<rhai::INT> {
    let mut n: rhai::INT = 0;
    for mut item in list {
        let equal = ctx.call_native_fn_raw("==", false, &mut [&mut item, &mut value]);
        if equal.is_ok_and(|e| e.as_bool().unwrap_or(false)) {
            n += 1;
        }
    }
    Ok(n)
}

/// `x` rounded to `digits` decimals (half away from zero); negative digits round to tens,
/// hundreds...
fn round(x: rhai::FLOAT, digits: rhai::INT) -> rhai::FLOAT {
    let digits = digits.clamp(-300, 300) as i32;
    let scale = 10f64.powi(digits);
    let scaled = (x * scale).round() / scale;
    if scaled.is_finite() {
        scaled
    } else {
        x
    }
}
