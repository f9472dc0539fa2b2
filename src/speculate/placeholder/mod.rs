//! Placeholders: the scout's stand-ins for values it does not have yet. A placeholder is a
//! source and a path of fields and indexes into it. The source is one read's outcome (possibly
//! still in flight), or a value derived from placeholders that is known once their reads land:
//! a string interpolated from them, or a value written into before it was known (a map given a
//! key the scout does not have yet). Field and index access derive placeholders; operators and
//! built-in functions use the value once it has arrived and give an unknown before; branch
//! conditions are guessed. Every pending cell a decision depended on is noted, so the scout
//! knows when a new pass can see more.
//!
//! | file | what it holds |
//! |---|---|
//! | `mod.rs` | the placeholder, its sources and paths, where it stands ([`Resolved`]), resolving values that hold placeholders, indexing |
//! | `deferred.rs` | values derived from placeholders: joined strings, values edited before they were known, lookups by keys not known yet, deferred comparisons |
//! | `pass.rs` | [`PassLog`]: one pass's notes and guesses, carried by the functions the pass registers |
//! | `overloads.rs` | what the scout's engine registers: accessors, text, list functions, operators, the rewrite's wrappers, the fallback for built-in functions |

mod deferred;
mod overloads;
mod pass;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use rhai::{Array, Dynamic, ImmutableString, Map, INT};
use serde_json::Value;

use crate::engine::to_dynamic;
use crate::ledger::OutcomeSlot;

use deferred::{lookup_state, text_state, Edits, Op};
pub(crate) use overloads::{prepare, register};
pub(crate) use pass::{Guess, PassLog};

/// What `to_string` of a pending placeholder gives. A read whose arguments contain it cannot be
/// started: its real arguments are not known.
pub(crate) const PENDING_TEXT: &str = "\u{1}pending\u{1}";

#[derive(Clone, Debug)]
enum Step {
    Field(ImmutableString),
    Index(INT),
}

/// Where a placeholder's value comes from.
#[derive(Clone, Debug)]
enum Source {
    /// One read's outcome, possibly still in flight.
    Cell(Arc<OutcomeSlot>),
    /// A value that will never be known (an operator over a pending value, say).
    Unknown,
    /// A string joined from pieces, each a string or a placeholder whose value is a scalar:
    /// an interpolation or a `+` with a placeholder in it.
    Text(Arc<[Dynamic]>),
    /// A value written into before it was known: the value before, and the writes in order.
    Edited(Arc<Edits>),
    /// A comparison or a `!` over values not known yet, computed as Rhai computes it once they
    /// are all scalars; an unknown if one is not.
    Op(Arc<Op>),
    /// `container[key]` read with a key not known yet: the container as it was then, indexed
    /// once the key lands.
    Lookup(Arc<(Dynamic, Dynamic)>),
}

/// A value the scout does not have yet.
#[derive(Clone, Debug)]
pub(crate) struct Placeholder {
    source: Source,
    path: Vec<Step>,
}

/// Where a placeholder stands now.
pub(crate) enum Resolved {
    /// Known: never itself a placeholder (it may hold some, as any container may).
    Value(Dynamic),
    /// Known once these cells have landed (and maybe others they lead to).
    Pending(Vec<Arc<OutcomeSlot>>),
    /// It resolved to an error, or its path does not exist, or it is an unknown.
    Never,
}

impl Placeholder {
    pub(crate) fn of(cell: Arc<OutcomeSlot>) -> Placeholder {
        Placeholder {
            source: Source::Cell(cell),
            path: Vec::new(),
        }
    }

    pub(crate) fn unknown() -> Dynamic {
        Dynamic::from(Placeholder {
            source: Source::Unknown,
            path: Vec::new(),
        })
    }

    fn child(&self, step: Step) -> Dynamic {
        let mut path = self.path.clone();
        path.push(step);
        Dynamic::from(Placeholder {
            source: self.source.clone(),
            path,
        })
    }

    /// Where the placeholder stands now; a read in flight taken to return what it returned
    /// before (a prediction) is noted in `log`, so that the pass runs again when it lands.
    pub(crate) fn state(&self, log: &PassLog) -> Resolved {
        let root = match &self.source {
            Source::Unknown => return Resolved::Never,
            Source::Cell(cell) => return cell_state(cell, &self.path, log),
            Source::Text(pieces) => text_state(pieces, log),
            Source::Edited(edits) => edits.state(log),
            Source::Op(op) => op.state(log),
            Source::Lookup(lookup) => lookup_state(&lookup.0, &lookup.1, log),
        };
        match root {
            Resolved::Value(root) => walk(root, &self.path, log),
            other => other,
        }
    }
}

/// A read's outcome along `path`: walked in JSON, so that only the value reached is converted.
fn cell_state(cell: &Arc<OutcomeSlot>, path: &[Step], log: &PassLog) -> Resolved {
    let outcome = cell.get();
    let root = match outcome.as_deref() {
        Some(Ok(root)) => root,
        Some(Err(_)) => return Resolved::Never,
        // A read still in flight may be taken to return what it returned before the last
        // write; the decision that takes it is noted, so that a pass sees the real value.
        None => match cell.predicted() {
            Some(guess) => {
                log.note(cell);
                guess
            }
            None => return Resolved::Pending(vec![Arc::clone(cell)]),
        },
    };
    let mut value: &Value = root;
    let null = Value::Null;
    for step in path {
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

/// A known value along `path`, as [`cell_state`] walks JSON.
fn walk(mut value: Dynamic, path: &[Step], log: &PassLog) -> Resolved {
    for step in path {
        let next = match step {
            Step::Field(name) => match value.read_lock::<Map>() {
                Some(map) => map.get(name.as_str()).cloned().unwrap_or(Dynamic::UNIT),
                None => return Resolved::Never,
            },
            Step::Index(i) => match value.read_lock::<Array>() {
                Some(items) => {
                    let i = if *i < 0 { items.len() as INT + i } else { *i };
                    match usize::try_from(i).ok().and_then(|i| items.get(i)) {
                        Some(item) => item.clone(),
                        None => return Resolved::Never,
                    }
                }
                None => return Resolved::Never,
            },
        };
        // A deferred value may hold placeholders (a value written into it): go through them.
        value = match shallow(&next, log) {
            Resolved::Value(v) => v,
            other => return other,
        };
    }
    Resolved::Value(value)
}

/// A value one level deep: a placeholder becomes where it stands, anything else is known.
pub(super) fn shallow(value: &Dynamic, log: &PassLog) -> Resolved {
    match value.read_lock::<Placeholder>() {
        None => Resolved::Value(value.clone()),
        Some(p) => p.state(log),
    }
}

/// How interpolation writes a scalar (`rhai_facts::display_of_a_scalar_is_what_interpolation_writes`);
/// `None` for containers, whose text the scout does not rebuild.
pub(super) fn display(value: &Dynamic) -> Option<String> {
    is_scalar(value).then(|| value.to_string())
}

/// Whether a value is one the scout computes with: a string, number, boolean, `()` or
/// character.
pub(super) fn is_scalar(value: &Dynamic) -> bool {
    value.is_string()
        || value.is_int()
        || value.is_float()
        || value.is_bool()
        || value.is_unit()
        || value.is_char()
}

pub(crate) fn is_placeholder(value: &Dynamic) -> bool {
    value.is::<Placeholder>()
}

/// Arguments as far as they are known.
pub(crate) enum Resolution {
    Ready(Value),
    Pending(Vec<Arc<OutcomeSlot>>),
    Never,
}

/// Resolves a value that may contain placeholders anywhere inside it into plain JSON.
pub(crate) fn resolve_deep(value: &Dynamic, log: &PassLog) -> Resolution {
    let mut pending = Vec::new();
    match resolve_into(value, &mut pending, log) {
        None => Resolution::Never,
        Some(_) if !pending.is_empty() => {
            // A deferred value may name one cell many times (a key written twice).
            let mut seen = std::collections::HashSet::new();
            pending.retain(|c| seen.insert(Arc::as_ptr(c)));
            Resolution::Pending(pending)
        }
        Some(v) => Resolution::Ready(v),
    }
}

/// `None` when some part can never be known; pending cells are collected.
fn resolve_into(
    value: &Dynamic,
    pending: &mut Vec<Arc<OutcomeSlot>>,
    log: &PassLog,
) -> Option<Value> {
    if let Some(p) = value.read_lock::<Placeholder>() {
        return match p.state(log) {
            Resolved::Value(v) => resolve_into(&v, pending, log),
            Resolved::Pending(cells) => {
                pending.extend(cells);
                Some(Value::Null)
            }
            Resolved::Never => None,
        };
    }
    if let Some(map) = value.read_lock::<Map>() {
        let mut out = serde_json::Map::new();
        for (k, v) in map.iter() {
            out.insert(k.to_string(), resolve_into(v, pending, log)?);
        }
        return Some(Value::Object(out));
    }
    if let Some(items) = value.read_lock::<Array>() {
        return items
            .iter()
            .map(|v| resolve_into(v, pending, log))
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

/// Indexes a known value; anything Rhai would refuse is an unknown (the scout is only advisory).
pub(super) fn index_known(container: &Dynamic, key: &Dynamic, log: &PassLog) -> Dynamic {
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
        return derive(&p, key, log);
    }
    Placeholder::unknown()
}

/// `p[key]` / `p.key` on a placeholder.
pub(super) fn derive(p: &Placeholder, key: &Dynamic, log: &PassLog) -> Dynamic {
    match p.state(log) {
        Resolved::Value(v) => index_known(&v, key, log),
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

/// Whether a value is a placeholder derived by the scout (a deferred string, or a value
/// written into before it was known), rather than a read's outcome.
pub(super) fn is_derived(value: &Dynamic) -> bool {
    value
        .read_lock::<Placeholder>()
        .is_some_and(|p| matches!(p.source, Source::Text(_) | Source::Edited(_)))
}

/// Whether a value is a string, known or deferred.
pub(super) fn is_text(value: &Dynamic) -> bool {
    value.is_string()
        || value
            .read_lock::<Placeholder>()
            .is_some_and(|p| p.path.is_empty() && matches!(p.source, Source::Text(_)))
}
