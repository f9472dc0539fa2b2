//! Placeholders: the scout's stand-ins for values it does not have yet. A placeholder is a cell
//! (one read's outcome, possibly still in flight) and a path of fields and indexes into it.
//! Field and index access derive placeholders; operators and built-in functions use the value
//! once it has arrived and give an unknown before; branch conditions are guessed. Every pending
//! cell a decision depended on is noted, so the scout knows when a new pass can see more.

use std::cell::RefCell;
use std::sync::Arc;

use rhai::{Array, Dynamic, Engine, EvalAltResult, ImmutableString, Map, NativeCallContext, INT};
use serde_json::Value;

use super::rewrite::{COND, INDEX, UNLIKELY, VALUE};
use crate::engine::to_dynamic;
use crate::ledger::Cell;

/// What `to_string` of a pending placeholder gives. A read whose arguments contain it cannot be
/// started: its real arguments are not known.
pub(crate) const PENDING_TEXT: &str = "\u{1}pending\u{1}";

#[derive(Clone, Debug)]
enum Step {
    Field(ImmutableString),
    Index(INT),
}

/// A value the scout does not have yet.
#[derive(Clone, Debug)]
pub(crate) struct Placeholder {
    /// `None` for an unknown that will never resolve (an operator over a pending value, say).
    cell: Option<Arc<Cell>>,
    path: Vec<Step>,
}

/// Where a placeholder stands now.
pub(crate) enum Resolved {
    Value(Dynamic),
    Pending(Arc<Cell>),
    /// It resolved to an error, or its path does not exist, or it is an unknown.
    Never,
}

impl Placeholder {
    pub(crate) fn of(cell: Arc<Cell>) -> Placeholder {
        Placeholder {
            cell: Some(cell),
            path: Vec::new(),
        }
    }

    pub(crate) fn unknown() -> Dynamic {
        Dynamic::from(Placeholder {
            cell: None,
            path: Vec::new(),
        })
    }

    fn child(&self, step: Step) -> Dynamic {
        let mut path = self.path.clone();
        path.push(step);
        Dynamic::from(Placeholder {
            cell: self.cell.clone(),
            path,
        })
    }

    pub(crate) fn state(&self) -> Resolved {
        let Some(cell) = &self.cell else {
            return Resolved::Never;
        };
        let Some(outcome) = cell.get() else {
            return Resolved::Pending(Arc::clone(cell));
        };
        let Ok(root) = outcome.as_ref() else {
            return Resolved::Never;
        };
        let mut value: &Value = root;
        let null = Value::Null;
        for step in &self.path {
            value = match (step, value) {
                (Step::Field(name), Value::Object(map)) => map.get(name.as_str()).unwrap_or(&null),
                (Step::Index(i), Value::Array(items)) => {
                    let i = if *i < 0 { items.len() as INT + i } else { *i };
                    match usize::try_from(i).ok().and_then(|i| items.get(i)) {
                        Some(item) => item,
                        None => return Resolved::Never,
                    }
                }
                _ => return Resolved::Never,
            };
        }
        Resolved::Value(to_dynamic(value))
    }
}

/// What one pass learned while it ran: the pending cells its decisions depended on.
#[derive(Default)]
pub(crate) struct PassNotes {
    pub(crate) pending: Vec<Arc<Cell>>,
}

thread_local! {
    /// The notes of the pass running on this thread. Set and cleared by every pass, so that no
    /// thread ever carries one pass's notes into another.
    static NOTES: RefCell<Option<PassNotes>> = const { RefCell::new(None) };
}

pub(crate) fn begin_notes() {
    NOTES.with(|n| *n.borrow_mut() = Some(PassNotes::default()));
}

pub(crate) fn take_notes() -> PassNotes {
    NOTES.with(|n| n.borrow_mut().take()).unwrap_or_default()
}

/// Notes that a decision depended on `cell`.
fn note(cell: &Arc<Cell>) {
    NOTES.with(|n| {
        if let Some(notes) = n.borrow_mut().as_mut() {
            if !notes.pending.iter().any(|c| Arc::ptr_eq(c, cell)) {
                notes.pending.push(Arc::clone(cell));
            }
        }
    });
}

/// A value as far as it is known: a placeholder that resolved becomes its value; a pending one
/// is noted and stays `Err(())`.
fn known(value: &Dynamic) -> Result<Dynamic, ()> {
    match value.read_lock::<Placeholder>() {
        None => Ok(value.clone()),
        Some(p) => match p.state() {
            Resolved::Value(v) => Ok(v),
            Resolved::Pending(cell) => {
                note(&cell);
                Err(())
            }
            Resolved::Never => Err(()),
        },
    }
}

pub(crate) fn is_placeholder(value: &Dynamic) -> bool {
    value.is::<Placeholder>()
}

/// Arguments as far as they are known.
pub(crate) enum Resolution {
    Ready(Value),
    Pending(Vec<Arc<Cell>>),
    Never,
}

/// Resolves a value that may contain placeholders anywhere inside it into plain JSON.
pub(crate) fn resolve_deep(value: &Dynamic) -> Resolution {
    let mut pending = Vec::new();
    match resolve_into(value, &mut pending) {
        None => Resolution::Never,
        Some(_) if !pending.is_empty() => Resolution::Pending(pending),
        Some(v) => Resolution::Ready(v),
    }
}

/// `None` when some part can never be known; pending cells are collected.
fn resolve_into(value: &Dynamic, pending: &mut Vec<Arc<Cell>>) -> Option<Value> {
    if let Some(p) = value.read_lock::<Placeholder>() {
        return match p.state() {
            Resolved::Value(v) => resolve_into(&v, pending),
            Resolved::Pending(cell) => {
                pending.push(cell);
                Some(Value::Null)
            }
            Resolved::Never => None,
        };
    }
    if let Some(map) = value.read_lock::<Map>() {
        let mut out = serde_json::Map::new();
        for (k, v) in map.iter() {
            out.insert(k.to_string(), resolve_into(v, pending)?);
        }
        return Some(Value::Object(out));
    }
    if let Some(items) = value.read_lock::<Array>() {
        return items
            .iter()
            .map(|v| resolve_into(v, pending))
            .collect::<Option<Vec<_>>>()
            .map(Value::Array);
    }
    if let Some(s) = value.read_lock::<ImmutableString>() {
        if s.contains(PENDING_TEXT) {
            return None;
        }
    }
    crate::engine::to_json(value).ok()
}

type RhaiResult = Result<Dynamic, Box<EvalAltResult>>;

/// Indexes a known value; anything Rhai would refuse is an unknown (the scout is only advisory).
fn index_known(container: &Dynamic, key: &Dynamic) -> Dynamic {
    if let (Some(items), Ok(i)) = (container.read_lock::<Array>(), key.as_int()) {
        let i = if i < 0 { items.len() as INT + i } else { i };
        return usize::try_from(i)
            .ok()
            .and_then(|i| items.get(i).cloned())
            .unwrap_or_else(Placeholder::unknown);
    }
    if let (Some(map), Some(k)) = (
        container.read_lock::<Map>(),
        key.read_lock::<ImmutableString>(),
    ) {
        return map.get(k.as_str()).cloned().unwrap_or(Dynamic::UNIT);
    }
    if let (Some(s), Ok(i)) = (container.read_lock::<ImmutableString>(), key.as_int()) {
        let count = s.chars().count() as INT;
        let i = if i < 0 { count + i } else { i };
        return usize::try_from(i)
            .ok()
            .and_then(|i| s.chars().nth(i))
            .map(Dynamic::from)
            .unwrap_or_else(Placeholder::unknown);
    }
    if let Some(p) = container.read_lock::<Placeholder>() {
        return derive(&p, key);
    }
    Placeholder::unknown()
}

/// `p[key]` / `p.key` on a placeholder.
fn derive(p: &Placeholder, key: &Dynamic) -> Dynamic {
    match p.state() {
        Resolved::Value(v) => index_known(&v, key),
        Resolved::Never => Placeholder::unknown(),
        Resolved::Pending(_) => {
            if let Ok(i) = key.as_int() {
                p.child(Step::Index(i))
            } else if let Some(name) = key.read_lock::<ImmutableString>() {
                p.child(Step::Field(name.clone()))
            } else {
                Placeholder::unknown()
            }
        }
    }
}

const BINARY_OPERATORS: &[&str] = &[
    "+", "-", "*", "/", "%", "**", "==", "!=", "<", "<=", ">", ">=", "&", "|", "^", "<<", ">>",
];

/// A binary operator with a placeholder on either side: the built-in operator over the values
/// once known, an unknown before.
fn binary(ctx: &NativeCallContext, op: &str, a: &Dynamic, b: &Dynamic) -> RhaiResult {
    match (known(a), known(b)) {
        (Ok(mut a), Ok(mut b)) => ctx.call_native_fn_raw(op, false, &mut [&mut a, &mut b]),
        _ => Ok(Placeholder::unknown()),
    }
}

/// Registers the placeholder type, its accessors and operators, the functions the rewritten
/// script calls, and the fallback that applies built-in functions to known values.
pub(crate) fn register(engine: &mut Engine, reserved: Arc<[String]>) {
    engine.register_type_with_name::<Placeholder>("Placeholder");
    engine.register_indexer_get(|p: &mut Placeholder, key: ImmutableString| {
        derive(p, &Dynamic::from(key))
    });
    engine.register_indexer_get(|p: &mut Placeholder, key: INT| derive(p, &Dynamic::from(key)));
    // Writes into a value the scout does not have change nothing it relies on.
    engine.register_indexer_set(|_: &mut Placeholder, _: ImmutableString, _: Dynamic| {});
    engine.register_indexer_set(|_: &mut Placeholder, _: INT, _: Dynamic| {});
    engine.register_fn("to_string", |p: &mut Placeholder| match p.state() {
        Resolved::Value(v) => v.to_string(),
        _ => PENDING_TEXT.to_string(),
    });
    engine.register_fn("to_debug", |p: &mut Placeholder| match p.state() {
        Resolved::Value(v) => format!("{v:?}"),
        _ => PENDING_TEXT.to_string(),
    });
    engine.register_iterator::<Placeholder>();

    for &op in BINARY_OPERATORS {
        engine.register_fn(
            op,
            move |ctx: NativeCallContext, a: Placeholder, b: Dynamic| {
                binary(&ctx, op, &Dynamic::from(a), &b)
            },
        );
        engine.register_fn(
            op,
            move |ctx: NativeCallContext, a: Dynamic, b: Placeholder| {
                binary(&ctx, op, &a, &Dynamic::from(b))
            },
        );
    }
    for op in ["-", "+", "!"] {
        engine.register_fn(
            op,
            move |ctx: NativeCallContext, a: Placeholder| -> RhaiResult {
                match known(&Dynamic::from(a)) {
                    Ok(mut a) => ctx.call_native_fn_raw(op, false, &mut [&mut a]),
                    Err(()) => Ok(Placeholder::unknown()),
                }
            },
        );
    }

    // An unknown condition is guessed true: the branch that does more work is the one worth
    // starting reads for, and a wrong guess only wastes reads.
    engine.register_fn(COND, |value: Dynamic| -> Result<bool, Box<EvalAltResult>> {
        match known(&value) {
            Ok(v) => v
                .as_bool()
                .map_err(|t| format!("a condition must be a boolean, not {t}").into()),
            Err(()) => Ok(true),
        }
    });
    // The guard of a branch that leaves: guessed not taken.
    engine.register_fn(
        UNLIKELY,
        |value: Dynamic| -> Result<bool, Box<EvalAltResult>> {
            match known(&value) {
                Ok(v) => v
                    .as_bool()
                    .map_err(|t| format!("a condition must be a boolean, not {t}").into()),
                Err(()) => Ok(false),
            }
        },
    );
    engine.register_fn(VALUE, |value: Dynamic| known(&value).unwrap_or(value));
    engine.register_fn(INDEX, |container: &mut Dynamic, key: Dynamic| -> Dynamic {
        match known(&key) {
            Ok(key) if is_placeholder(container) => match container.read_lock::<Placeholder>() {
                Some(p) => derive(&p, &key),
                None => Placeholder::unknown(),
            },
            Ok(key) => index_known(container, &key),
            Err(()) => Placeholder::unknown(),
        }
    });

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
        let mut values = Vec::with_capacity(args.len());
        for arg in args.iter() {
            match known(arg) {
                Ok(v) => values.push(v),
                Err(()) => return Ok(Some(Placeholder::unknown())),
            }
        }
        let mut refs: Vec<&mut Dynamic> = values.iter_mut().collect();
        ctx.call_fn_raw(name, false, is_method, &mut refs).map(Some)
    });
}

impl IntoIterator for Placeholder {
    type Item = Dynamic;
    type IntoIter = std::vec::IntoIter<Dynamic>;

    /// A list not known yet is guessed empty, and noted: the next pass iterates the real one.
    fn into_iter(self) -> Self::IntoIter {
        match known(&Dynamic::from(self)) {
            Ok(v) => match v.into_array() {
                Ok(items) => items.into_iter(),
                Err(_) => Vec::new().into_iter(),
            },
            Err(()) => Vec::new().into_iter(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn resolved(value: Value) -> Placeholder {
        let cell = Cell::new();
        cell.set(Ok(value));
        Placeholder::of(cell)
    }

    #[test]
    fn paths_walk_the_resolved_value() {
        let p = resolved(json!({"a": [10, {"b": "x"}]}));
        let d = derive(&p, &Dynamic::from(ImmutableString::from("a")));
        let d = index_known(&d, &Dynamic::from(-1 as INT));
        let d = index_known(&d, &Dynamic::from(ImmutableString::from("b")));
        assert_eq!(d.into_string().unwrap(), "x");
    }

    #[test]
    fn pending_values_are_noted_and_resolve_later() {
        let cell = Cell::new();
        let p = Placeholder::of(Arc::clone(&cell));
        let child = derive(&p, &Dynamic::from(ImmutableString::from("id")));
        begin_notes();
        assert!(known(&child).is_err());
        let args = {
            let mut m = Map::new();
            m.insert("id".into(), child.clone());
            Dynamic::from_map(m)
        };
        assert!(matches!(resolve_deep(&args), Resolution::Pending(c) if c.len() == 1));
        assert_eq!(take_notes().pending.len(), 1);
        cell.set(Ok(json!({"id": 7})));
        assert!(matches!(resolve_deep(&args), Resolution::Ready(v) if v == json!({"id": 7})));
        cell.set(Ok(json!(null)));
    }

    #[test]
    fn failures_and_pending_text_never_resolve() {
        let cell = Cell::new();
        cell.set(Err(crate::error::ToolError::not_found("x")));
        assert!(matches!(Placeholder::of(cell).state(), Resolved::Never));
        let text = Dynamic::from(format!("id-{PENDING_TEXT}"));
        assert!(matches!(resolve_deep(&text), Resolution::Never));
    }
}
