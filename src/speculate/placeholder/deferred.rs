//! Values derived from placeholders, known once the reads they come from land: a string
//! joined from pieces, a value written into before it was known, a container read by a key not
//! known yet, a comparison over values not known yet. Each is bounded (pieces, writes, items),
//! since resolving one walks all of it at every use.

use std::sync::Arc;

use rhai::{Array, Dynamic, Engine, ImmutableString, Map, INT};

use super::{
    display, index_known, is_placeholder, is_scalar, shallow, PassLog, Placeholder, Resolved,
    Source,
};

/// Pieces one deferred string may hold; a longer one is an unknown. Resolving a deferred value
/// walks all of it at every use, so its size bounds the scout's work per use.
pub(super) const MAX_PIECES: usize = 256;
/// Writes one deferred value may hold; past them it is an unknown (see [`MAX_PIECES`]).
const MAX_WRITES: usize = 1_024;

/// Items a container may hold for a read of it by a key not known yet to be deferred: the
/// deferred value keeps a copy of the container as it was, and a larger one is an unknown.
pub(super) const MAX_LOOKUP_ITEMS: usize = 256;

/// An operator the scout applies once its operands are known (see [`DEFERRED_OPERATORS`]).
#[derive(Clone, Debug)]
pub(super) struct Op {
    op: &'static str,
    operands: Vec<Dynamic>,
    /// Deferred operators inside it, itself included: resolving it walks all of them.
    size: usize,
}

/// The operators whose value over pending scalars is deferred rather than an unknown: those a
/// condition is made of. Arithmetic stays an unknown (a sum over a fan-out would grow a deferred
/// value at each step).
const DEFERRED_OPERATORS: &[&str] = &["==", "!=", "<", "<=", ">", ">=", "!"];

/// A deferred value's writes: `base[key] = value`, in order. Keys must be known for the value
/// to be; written values may stay placeholders, as in any container.
#[derive(Clone, Debug)]
pub(super) struct Edits {
    base: Dynamic,
    writes: Vec<(Dynamic, Dynamic)>,
}

impl Placeholder {
    /// A string joined from `pieces` (strings and placeholders), flattening deferred strings
    /// among them; an unknown past [`MAX_PIECES`].
    pub(super) fn text(pieces: Vec<Dynamic>) -> Dynamic {
        let mut flat: Vec<Dynamic> = Vec::with_capacity(pieces.len());
        for piece in pieces {
            match piece.read_lock::<Placeholder>() {
                Some(p) if p.path.is_empty() => {
                    if let Source::Text(inner) = &p.source {
                        flat.extend(inner.iter().cloned());
                        continue;
                    }
                }
                _ => {}
            }
            flat.push(piece);
        }
        if flat.len() > MAX_PIECES {
            return Placeholder::unknown();
        }
        Dynamic::from(Placeholder {
            source: Source::Text(flat.into()),
            path: Vec::new(),
        })
    }

    /// `self[key] = value`: the placeholder becomes (or stays) a value edited before it was
    /// known.
    pub(super) fn write(&mut self, key: Dynamic, value: Dynamic) {
        match &mut self.source {
            Source::Unknown => {}
            Source::Edited(edits) if self.path.is_empty() => {
                if edits.writes.len() >= MAX_WRITES {
                    self.source = Source::Unknown;
                } else {
                    Arc::make_mut(edits).writes.push((key, value));
                }
            }
            _ => *self = Placeholder::edited(Dynamic::from(self.clone()), key, value),
        }
    }

    fn edited(base: Dynamic, key: Dynamic, value: Dynamic) -> Placeholder {
        Placeholder {
            source: Source::Edited(Arc::new(Edits {
                base,
                writes: vec![(key, value)],
            })),
            path: Vec::new(),
        }
    }

    /// An empty edit of `base`: the value `base` is until something is written into it.
    pub(super) fn edit(base: Dynamic) -> Dynamic {
        Dynamic::from(Placeholder {
            source: Source::Edited(Arc::new(Edits {
                base,
                writes: Vec::new(),
            })),
            path: Vec::new(),
        })
    }
}

/// `container[key]`, once the key and the container are known: Rhai's indexing of known values,
/// where anything Rhai would refuse is an unknown.
pub(super) fn lookup_state(container: &Dynamic, key: &Dynamic, log: &PassLog) -> Resolved {
    let key = match shallow(key, log) {
        Resolved::Value(key) => key,
        other => return other,
    };
    match shallow(container, log) {
        Resolved::Value(container) => shallow(&index_known(&container, &key, log), log),
        other => other,
    }
}

/// A read of `container[key]` with a key not known yet: deferred for a small map or array
/// (see [`MAX_LOOKUP_ITEMS`]) or a value not known yet itself, an unknown otherwise.
pub(super) fn lookup(container: &Dynamic, key: Dynamic, log: &PassLog) -> Dynamic {
    let items = container
        .read_lock::<Map>()
        .map(|m| m.len())
        .or_else(|| container.read_lock::<Array>().map(|a| a.len()));
    let small = is_placeholder(container) || items.is_some_and(|n| n <= MAX_LOOKUP_ITEMS);
    match shallow(&key, log) {
        Resolved::Pending(_) if small => Dynamic::from(Placeholder {
            source: Source::Lookup(Arc::new((container.clone(), key))),
            path: Vec::new(),
        }),
        _ => Placeholder::unknown(),
    }
}

pub(super) fn text_state(pieces: &[Dynamic], log: &PassLog) -> Resolved {
    let mut text = String::new();
    let mut pending = Vec::new();
    for piece in pieces {
        match shallow(piece, log) {
            Resolved::Value(v) => match display(&v) {
                Some(s) => text.push_str(&s),
                None => return Resolved::Never,
            },
            Resolved::Pending(cells) => pending.extend(cells),
            Resolved::Never => return Resolved::Never,
        }
    }
    if pending.is_empty() {
        Resolved::Value(text.into())
    } else {
        Resolved::Pending(pending)
    }
}

impl Placeholder {
    /// `op` over `operands`, at least one of them not known yet: a deferred value when `op` is
    /// one of [`DEFERRED_OPERATORS`] and every operand may still turn out a scalar, an unknown
    /// otherwise.
    pub(super) fn operator(op: &'static str, operands: &[&Dynamic]) -> Dynamic {
        let mut size = 1;
        for operand in operands {
            match operand.read_lock::<Placeholder>() {
                None if !is_scalar(operand) => return Placeholder::unknown(),
                None => {}
                Some(p) => match (&p.source, p.path.is_empty()) {
                    (Source::Unknown, _) => return Placeholder::unknown(),
                    (Source::Op(inner), true) => size += inner.size,
                    _ => size += 1,
                },
            }
        }
        if !DEFERRED_OPERATORS.contains(&op) || size > MAX_PIECES {
            return Placeholder::unknown();
        }
        Dynamic::from(Placeholder {
            source: Source::Op(Arc::new(Op {
                op,
                operands: operands.iter().map(|&o| o.clone()).collect(),
                size,
            })),
            path: Vec::new(),
        })
    }
}

impl Op {
    /// The operator's value once every operand is a known scalar, as the executor's engine
    /// computes it (an error, such as `<` between a number and a string, is never known).
    pub(super) fn state(&self, log: &PassLog) -> Resolved {
        let mut pending = Vec::new();
        let mut values = Vec::with_capacity(self.operands.len());
        for operand in &self.operands {
            match shallow(operand, log) {
                Resolved::Value(v) if is_scalar(&v) => values.push(v),
                Resolved::Value(_) | Resolved::Never => return Resolved::Never,
                Resolved::Pending(cells) => pending.extend(cells),
            }
        }
        if !pending.is_empty() {
            return Resolved::Pending(pending);
        }
        match evaluate(self.op, values) {
            Some(v) => Resolved::Value(v),
            None => Resolved::Never,
        }
    }
}

/// `op` applied to known scalars by an engine built as the executor's is, so that mixed
/// numbers, string and character comparisons and `==` between different types give exactly
/// what the run gives (`rhai_facts::comparisons_between_scalars`).
fn evaluate(op: &str, values: Vec<Dynamic>) -> Option<Dynamic> {
    static EVALUATOR: std::sync::OnceLock<(Engine, Vec<(&'static str, rhai::AST)>)> =
        std::sync::OnceLock::new();
    let (engine, asts) = EVALUATOR.get_or_init(|| {
        let engine = crate::engine::new_engine(
            &crate::engine::Limits::default(),
            crate::engine::RunControls::default(),
        );
        let asts = DEFERRED_OPERATORS
            .iter()
            .map(|&op| {
                let text = if op == "!" {
                    "!a".to_string()
                } else {
                    format!("a {op} b")
                };
                (op, engine.compile(text).expect("an operator template"))
            })
            .collect();
        (engine, asts)
    });
    let ast = &asts.iter().find(|(o, _)| *o == op)?.1;
    let mut scope = rhai::Scope::new();
    for (name, value) in ["a", "b"].into_iter().zip(values) {
        scope.push_dynamic(name, value);
    }
    engine.eval_ast_with_scope::<Dynamic>(&mut scope, ast).ok()
}

impl Edits {
    /// The base with every write applied, once the base and every key are known. A write Rhai
    /// would refuse (a key of the wrong type, an index out of bounds) makes it an unknown.
    pub(super) fn state(&self, log: &PassLog) -> Resolved {
        let mut pending = Vec::new();
        let mut base = match shallow(&self.base, log) {
            Resolved::Value(v) => Some(v),
            Resolved::Pending(cells) => {
                pending.extend(cells);
                None
            }
            Resolved::Never => return Resolved::Never,
        };
        let mut keys = Vec::with_capacity(self.writes.len());
        for (key, _) in &self.writes {
            match shallow(key, log) {
                Resolved::Value(k) => keys.push(k),
                Resolved::Pending(cells) => pending.extend(cells),
                Resolved::Never => return Resolved::Never,
            }
        }
        if !pending.is_empty() {
            return Resolved::Pending(pending);
        }
        let Some(value) = base.as_mut() else {
            return Resolved::Never;
        };
        for (key, (_, written)) in keys.into_iter().zip(&self.writes) {
            if !write_known(value, &key, written) {
                return Resolved::Never;
            }
        }
        Resolved::Value(base.unwrap_or_default())
    }
}

/// `container[key] = written` on known values, as Rhai does it for maps and arrays; `false`
/// for anything else, or what Rhai would refuse.
fn write_known(container: &mut Dynamic, key: &Dynamic, written: &Dynamic) -> bool {
    if container.is_map() {
        let (Some(mut map), Some(k)) = (
            container.write_lock::<Map>(),
            key.read_lock::<ImmutableString>(),
        ) else {
            return false;
        };
        map.insert(k.as_str().into(), written.clone());
        return true;
    }
    let (Some(mut items), Ok(i)) = (container.write_lock::<Array>(), key.as_int()) else {
        return false;
    };
    let i = if i < 0 { items.len() as INT + i } else { i };
    match usize::try_from(i).ok().and_then(|i| items.get_mut(i)) {
        Some(slot) => {
            *slot = written.clone();
            true
        }
        None => false,
    }
}
