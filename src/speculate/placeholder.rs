//! Placeholders: the scout's stand-ins for values it does not have yet. A placeholder is a
//! source and a path of fields and indexes into it. The source is one read's outcome (possibly
//! still in flight), or a value derived from placeholders that is known once their reads land:
//! a string interpolated from them, or a value written into before it was known (a map given a
//! key the scout does not have yet). Field and index access derive placeholders; operators and
//! built-in functions use the value once it has arrived and give an unknown before; branch
//! conditions are guessed. Every pending cell a decision depended on is noted, so the scout
//! knows when a new pass can see more.

use std::cell::RefCell;
use std::sync::Arc;

use rhai::{
    Array, Dynamic, Engine, EvalAltResult, FnPtr, ImmutableString, Map, NativeCallContext,
    FUNC_TO_STRING, INT,
};
use serde_json::Value;

use super::rewrite::{
    COND, COND_LOOSE, INDEX, INTERPOLATE, KEY, MARK, SETTLE, UNLIKELY, UNLIKELY_LOOSE, VALUE,
};
use crate::engine::to_dynamic;
use crate::ledger::Cell;

/// What `to_string` of a pending placeholder gives. A read whose arguments contain it cannot be
/// started: its real arguments are not known.
pub(crate) const PENDING_TEXT: &str = "\u{1}pending\u{1}";

/// Pieces one deferred string may hold; a longer one is an unknown. Resolving a deferred value
/// walks all of it at every use, so its size bounds the scout's work per use.
const MAX_PIECES: usize = 256;
/// Writes one deferred value may hold; past them it is an unknown (see [`MAX_PIECES`]).
const MAX_WRITES: usize = 1_024;

#[derive(Clone, Debug)]
enum Step {
    Field(ImmutableString),
    Index(INT),
}

/// Where a placeholder's value comes from.
#[derive(Clone, Debug)]
enum Source {
    /// One read's outcome, possibly still in flight.
    Cell(Arc<Cell>),
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

/// Items a container may hold for a read of it by a key not known yet to be deferred: the
/// deferred value keeps a copy of the container as it was, and a larger one is an unknown.
const MAX_LOOKUP_ITEMS: usize = 256;

/// An operator the scout applies once its operands are known (see [`DEFERRED_OPERATORS`]).
#[derive(Clone, Debug)]
struct Op {
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
struct Edits {
    base: Dynamic,
    writes: Vec<(Dynamic, Dynamic)>,
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
    Pending(Vec<Arc<Cell>>),
    /// It resolved to an error, or its path does not exist, or it is an unknown.
    Never,
}

impl Placeholder {
    pub(crate) fn of(cell: Arc<Cell>) -> Placeholder {
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

    /// A string joined from `pieces` (strings and placeholders), flattening deferred strings
    /// among them; an unknown past [`MAX_PIECES`].
    fn text(pieces: Vec<Dynamic>) -> Dynamic {
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

    fn child(&self, step: Step) -> Dynamic {
        let mut path = self.path.clone();
        path.push(step);
        Dynamic::from(Placeholder {
            source: self.source.clone(),
            path,
        })
    }

    /// `self[key] = value`: the placeholder becomes (or stays) a value edited before it was
    /// known.
    fn write(&mut self, key: Dynamic, value: Dynamic) {
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
    fn edit(base: Dynamic) -> Dynamic {
        Dynamic::from(Placeholder {
            source: Source::Edited(Arc::new(Edits {
                base,
                writes: Vec::new(),
            })),
            path: Vec::new(),
        })
    }

    pub(crate) fn state(&self) -> Resolved {
        let root = match &self.source {
            Source::Unknown => return Resolved::Never,
            Source::Cell(cell) => return cell_state(cell, &self.path),
            Source::Text(pieces) => text_state(pieces),
            Source::Edited(edits) => edits.state(),
            Source::Op(op) => op.state(),
            Source::Lookup(lookup) => lookup_state(&lookup.0, &lookup.1),
        };
        match root {
            Resolved::Value(root) => walk(root, &self.path),
            other => other,
        }
    }
}

/// A read's outcome along `path`: walked in JSON, so that only the value reached is converted.
fn cell_state(cell: &Arc<Cell>, path: &[Step]) -> Resolved {
    let outcome = cell.get();
    let root = match outcome.as_deref() {
        Some(Ok(root)) => root,
        Some(Err(_)) => return Resolved::Never,
        // A read still in flight may be taken to return what it returned before the last
        // write; the decision that takes it is noted, so that a pass sees the real value.
        None => match cell.predicted() {
            Some(guess) => {
                note(cell);
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

/// `container[key]`, once the key and the container are known: Rhai's indexing of known values,
/// where anything Rhai would refuse is an unknown.
fn lookup_state(container: &Dynamic, key: &Dynamic) -> Resolved {
    let key = match shallow(key) {
        Resolved::Value(key) => key,
        other => return other,
    };
    match shallow(container) {
        Resolved::Value(container) => shallow(&index_known(&container, &key)),
        other => other,
    }
}

/// A read of `container[key]` with a key not known yet: deferred for a small map or array
/// (see [`MAX_LOOKUP_ITEMS`]) or a value not known yet itself, an unknown otherwise.
fn lookup(container: &Dynamic, key: Dynamic) -> Dynamic {
    let items = container
        .read_lock::<Map>()
        .map(|m| m.len())
        .or_else(|| container.read_lock::<Array>().map(|a| a.len()));
    let small = is_placeholder(container) || items.is_some_and(|n| n <= MAX_LOOKUP_ITEMS);
    match shallow(&key) {
        Resolved::Pending(_) if small => Dynamic::from(Placeholder {
            source: Source::Lookup(Arc::new((container.clone(), key))),
            path: Vec::new(),
        }),
        _ => Placeholder::unknown(),
    }
}

/// A known value along `path`, as [`cell_state`] walks JSON.
fn walk(mut value: Dynamic, path: &[Step]) -> Resolved {
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
        value = match shallow(&next) {
            Resolved::Value(v) => v,
            other => return other,
        };
    }
    Resolved::Value(value)
}

/// A value one level deep: a placeholder becomes where it stands, anything else is known.
fn shallow(value: &Dynamic) -> Resolved {
    match value.read_lock::<Placeholder>() {
        None => Resolved::Value(value.clone()),
        Some(p) => p.state(),
    }
}

/// How interpolation writes a scalar (`rhai_facts::display_of_a_scalar_is_what_interpolation_writes`);
/// `None` for containers, whose text the scout does not rebuild.
fn display(value: &Dynamic) -> Option<String> {
    is_scalar(value).then(|| value.to_string())
}

/// Whether a value is one the scout computes with: a string, number, boolean, `()` or
/// character.
fn is_scalar(value: &Dynamic) -> bool {
    value.is_string()
        || value.is_int()
        || value.is_float()
        || value.is_bool()
        || value.is_unit()
        || value.is_char()
}

fn text_state(pieces: &[Dynamic]) -> Resolved {
    let mut text = String::new();
    let mut pending = Vec::new();
    for piece in pieces {
        match shallow(piece) {
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
    fn operator(op: &'static str, operands: &[&Dynamic]) -> Dynamic {
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
    fn state(&self) -> Resolved {
        let mut pending = Vec::new();
        let mut values = Vec::with_capacity(self.operands.len());
        for operand in &self.operands {
            match shallow(operand) {
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
            crate::engine::Watch::default(),
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
    fn state(&self) -> Resolved {
        let mut pending = Vec::new();
        let mut base = match shallow(&self.base) {
            Resolved::Value(v) => Some(v),
            Resolved::Pending(cells) => {
                pending.extend(cells);
                None
            }
            Resolved::Never => return Resolved::Never,
        };
        let mut keys = Vec::with_capacity(self.writes.len());
        for (key, _) in &self.writes {
            match shallow(key) {
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
    GUESSES.with(|g| *g.borrow_mut() = GuessLog::default());
}

/// A guess a pass made at a condition it did not know yet: the condition, and the value it
/// went on with. A deferred call made after it, over the same pending reads, carries it, and is
/// not started once the condition proved the guess wrong: the pass was then on a path the run
/// does not take.
#[derive(Debug)]
pub(crate) struct Guess {
    condition: Dynamic,
    taken: bool,
}

impl Guess {
    /// Whether the condition is known now and is not what was guessed (or not a boolean, which
    /// ends the run there). One still unknown has proved nothing.
    pub(crate) fn proved_wrong(&self) -> bool {
        match shallow(&self.condition) {
            Resolved::Value(v) => v.as_bool() != Ok(self.taken),
            Resolved::Pending(_) | Resolved::Never => false,
        }
    }
}

/// Guesses kept for one pending cell, the latest ones: a deferred call looks only at these.
const GUESSES_PER_CELL: usize = 8;
/// Guesses one deferred call carries at most.
pub(crate) const GUESSES_PER_CALL: usize = 16;

/// The guesses of one pass.
#[derive(Default)]
struct GuessLog {
    /// Conditions guessed so far, recorded or not (see `rewrite::SETTLE`).
    count: INT,
    /// The latest recorded guesses, by each pending cell their condition waits for (keyed by
    /// the cell's address; the entry holds the cell, so the address is not reused meanwhile).
    by_cell: std::collections::HashMap<usize, (Arc<Cell>, Vec<Arc<Guess>>)>,
}

thread_local! {
    /// The guesses of the pass running on this thread, set and cleared with its notes.
    static GUESSES: RefCell<GuessLog> = RefCell::new(GuessLog::default());
}

/// A guess at a condition the scout does not know yet: counted, and, when the condition waits
/// for reads and the guess alone decides the branch (`recorded`), kept by those reads.
fn guess(condition: &Dynamic, cells: &[Arc<Cell>], taken: bool, recorded: bool) -> bool {
    GUESSES.with(|g| {
        let mut log = g.borrow_mut();
        log.count += 1;
        if !recorded || cells.is_empty() {
            return;
        }
        let guess = Arc::new(Guess {
            condition: condition.clone(),
            taken,
        });
        for cell in cells {
            let (_, kept) = log
                .by_cell
                .entry(Arc::as_ptr(cell) as usize)
                .or_insert_with(|| (Arc::clone(cell), Vec::new()));
            if kept.last().is_some_and(|g| Arc::ptr_eq(g, &guess)) {
                continue;
            }
            if kept.len() == GUESSES_PER_CELL {
                kept.remove(0);
            }
            kept.push(Arc::clone(&guess));
        }
    });
    taken
}

/// The guesses made so far in this pass over any of `cells`, latest first, at most
/// [`GUESSES_PER_CALL`].
pub(crate) fn guesses_over(cells: &[Arc<Cell>]) -> Vec<Arc<Guess>> {
    GUESSES.with(|g| {
        let log = g.borrow();
        let mut out: Vec<Arc<Guess>> = Vec::new();
        for cell in cells {
            let Some((_, kept)) = log.by_cell.get(&(Arc::as_ptr(cell) as usize)) else {
                continue;
            };
            for guess in kept.iter().rev() {
                if out.len() == GUESSES_PER_CALL {
                    return out;
                }
                if !out.iter().any(|g| Arc::ptr_eq(g, guess)) {
                    out.push(Arc::clone(guess));
                }
            }
        }
        out
    })
}

/// A condition's value: known, or guessed `guessed` (see [`guess`]).
fn decide(value: &Dynamic, guessed: bool, recorded: bool) -> Result<bool, Box<EvalAltResult>> {
    match shallow(value) {
        Resolved::Value(v) => v
            .as_bool()
            .map_err(|t| format!("a condition must be a boolean, not {t}").into()),
        Resolved::Pending(cells) => {
            cells.iter().for_each(note);
            Ok(guess(value, &cells, guessed, recorded))
        }
        Resolved::Never => Ok(guess(value, &[], guessed, false)),
    }
}

pub(crate) fn take_notes() -> PassNotes {
    GUESSES.with(|g| *g.borrow_mut() = GuessLog::default());
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
    match shallow(value) {
        Resolved::Value(v) => Ok(v),
        Resolved::Pending(cells) => {
            cells.iter().for_each(note);
            Err(())
        }
        Resolved::Never => Err(()),
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
fn resolve_into(value: &Dynamic, pending: &mut Vec<Arc<Cell>>) -> Option<Value> {
    if let Some(p) = value.read_lock::<Placeholder>() {
        return match p.state() {
            Resolved::Value(v) => resolve_into(&v, pending),
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
/// once known; before, a deferred value for a comparison (see [`DEFERRED_OPERATORS`]) and an
/// unknown for anything else.
///
/// A `+` of a string and a placeholder (or of a deferred string and anything) is a deferred
/// string: Rhai's `+` with a string on either side appends the other side's text.
fn binary(ctx: &NativeCallContext, op: &'static str, a: &Dynamic, b: &Dynamic) -> RhaiResult {
    if op == "+" && (is_text(a) || is_text(b)) {
        return Ok(match (shallow(a), shallow(b)) {
            (Resolved::Never, _) | (_, Resolved::Never) => Placeholder::unknown(),
            (Resolved::Value(mut a), Resolved::Value(mut b)) => {
                return ctx.call_native_fn_raw(op, false, &mut [&mut a, &mut b]);
            }
            _ => Placeholder::text(vec![a.clone(), b.clone()]),
        });
    }
    match (known(a), known(b)) {
        (Ok(mut a), Ok(mut b)) => ctx.call_native_fn_raw(op, false, &mut [&mut a, &mut b]),
        _ => Ok(Placeholder::operator(op, &[a, b])),
    }
}

/// Whether a value is a string, known or deferred.
fn is_text(value: &Dynamic) -> bool {
    value.is_string()
        || value
            .read_lock::<Placeholder>()
            .is_some_and(|p| p.path.is_empty() && matches!(p.source, Source::Text(_)))
}

/// An interpolation's pieces, evaluated: the string Rhai would build once every piece is known,
/// a deferred string while some are pending, an unknown if one never will be.
fn interpolate(ctx: &NativeCallContext, items: Array) -> Dynamic {
    let mut pieces = Vec::new();
    let mut text = String::new();
    for item in items {
        let pending = match item.read_lock::<Placeholder>() {
            None => None,
            Some(p) => match p.state() {
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

/// The key of `container[key] = ...` (see [`KEY`]): a key the scout does not have yet turns a
/// map or an array into a value edited before it was known, so that the write is kept for
/// when the key arrives instead of failing.
fn assignment_key(container: &mut Dynamic, key: Dynamic) -> Dynamic {
    match shallow(&key) {
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

/// Registers the placeholder type, its accessors and operators, the functions the rewritten
/// script calls, and the fallback that applies built-in functions to known values.
pub(crate) fn register(engine: &mut Engine, reserved: Arc<[String]>) {
    engine.register_type_with_name::<Placeholder>("Placeholder");
    engine.register_indexer_get(|p: &mut Placeholder, key: ImmutableString| {
        derive(p, &Dynamic::from(key))
    });
    engine.register_indexer_get(|p: &mut Placeholder, key: INT| derive(p, &Dynamic::from(key)));
    engine.register_indexer_get(|p: &mut Placeholder, key: Placeholder| {
        match shallow(&Dynamic::from(key)) {
            Resolved::Value(key) => derive(p, &key),
            _ => Placeholder::unknown(),
        }
    });
    // A write into a value the scout does not have is kept, to be applied once it arrives.
    engine.register_indexer_set(|p: &mut Placeholder, key: ImmutableString, v: Dynamic| {
        p.write(key.into(), v)
    });
    engine.register_indexer_set(|p: &mut Placeholder, key: INT, v: Dynamic| p.write(key.into(), v));
    engine.register_indexer_set(|p: &mut Placeholder, key: Placeholder, v: Dynamic| {
        p.write(Dynamic::from(key), v)
    });
    engine.register_fn(INTERPOLATE, |ctx: NativeCallContext, items: Array| {
        interpolate(&ctx, items)
    });
    engine.register_fn(KEY, assignment_key);
    // Rhai's array functions that take any value compare it with each item themselves, and an
    // unknown comparison is false to them: `x in list` on a value not known yet would be a
    // confident `false` instead of an unknown.
    for name in ["contains", "index_of"] {
        engine.register_fn(
            name,
            move |ctx: NativeCallContext, list: &mut Array, p: Placeholder| -> RhaiResult {
                match known(&Dynamic::from(p)) {
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
    engine.register_fn(
        "sort",
        |ctx: NativeCallContext,
         array: &mut Array,
         comparer: FnPtr|
         -> Result<(), Box<EvalAltResult>> {
            if array.len() <= 1 {
                return Ok(());
            }
            let mut undecided = false;
            let sorted = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                array.sort_by(|x, y| {
                    let compared = comparer
                        .call_raw(&ctx, None, [x.clone(), y.clone()])
                        .ok()
                        .and_then(|v| match known(&v) {
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
        },
    );
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
                let a = Dynamic::from(a);
                match known(&a) {
                    Ok(mut a) => ctx.call_native_fn_raw(op, false, &mut [&mut a]),
                    Err(()) => Ok(Placeholder::operator(op, &[&a])),
                }
            },
        );
    }

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
        engine.register_fn(name, move |value: Dynamic| {
            decide(&value, guessed, recorded)
        });
    }
    engine.register_fn(MARK, || GUESSES.with(|g| g.borrow().count));
    engine.register_fn(SETTLE, |mark: INT, value: Dynamic| {
        if GUESSES.with(|g| g.borrow().count) > mark {
            Placeholder::unknown()
        } else {
            value
        }
    });
    engine.register_fn(VALUE, |value: Dynamic| known(&value).unwrap_or(value));
    engine.register_fn(INDEX, |container: &mut Dynamic, key: Dynamic| -> Dynamic {
        match known(&key) {
            Ok(key) if is_placeholder(container) => match container.read_lock::<Placeholder>() {
                Some(p) => derive(&p, &key),
                None => Placeholder::unknown(),
            },
            Ok(key) => index_known(container, &key),
            Err(()) => lookup(container, key),
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
        // A function may change its first argument (`push`, `remove`): a deferred value the
        // scout is building (a map given an unknown key) must not silently miss that change.
        let derived = args.first().is_some_and(|a| is_derived(a)) && !PURE.contains(&name);
        let mut values = Vec::with_capacity(args.len());
        for arg in args.iter() {
            match known(arg) {
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

/// Whether a value is a placeholder derived by the scout (a deferred string, or a value
/// written into before it was known), rather than a read's outcome.
fn is_derived(value: &Dynamic) -> bool {
    value
        .read_lock::<Placeholder>()
        .is_some_and(|p| matches!(p.source, Source::Text(_) | Source::Edited(_)))
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

    fn pending() -> (Arc<Cell>, Dynamic) {
        let cell = Cell::new();
        let p = Dynamic::from(Placeholder::of(Arc::clone(&cell)));
        (cell, p)
    }

    fn field(p: &Dynamic, name: &str) -> Dynamic {
        index_known(p, &Dynamic::from(ImmutableString::from(name)))
    }

    #[test]
    fn a_deferred_string_is_joined_once_its_pieces_land() {
        let (a, pa) = pending();
        let (b, pb) = pending();
        let inner = Placeholder::text(vec!["id-".into(), field(&pa, "id")]);
        let text = Placeholder::text(vec![inner, "/".into(), field(&pb, "n")]);
        let args = Dynamic::from_map(Map::from_iter([("name".into(), text.clone())]));
        assert!(matches!(resolve_deep(&args), Resolution::Pending(c) if c.len() == 2));
        a.set(Ok(json!({"id": 7})));
        assert!(matches!(resolve_deep(&args), Resolution::Pending(c) if c.len() == 1));
        b.set(Ok(json!({"n": 1.5})));
        assert!(
            matches!(resolve_deep(&args), Resolution::Ready(v) if v == json!({"name": "id-7/1.5"}))
        );
        // A container has no text the scout rebuilds: never known.
        let (c, pc) = pending();
        let text = Placeholder::text(vec!["x".into(), pc]);
        c.set(Ok(json!([1])));
        assert!(matches!(resolve_deep(&text), Resolution::Never));
        let long = Placeholder::text(vec![pa; MAX_PIECES + 1]);
        assert!(matches!(resolve_deep(&long), Resolution::Never));
    }

    #[test]
    fn a_lookup_by_a_pending_key_resolves_as_rhai_indexes() {
        let (cell, p) = pending();
        let map = Dynamic::from_map(Map::from_iter([
            ("u1".into(), Dynamic::from("red")),
            (
                "u2".into(),
                Dynamic::from_map(Map::from_iter([("n".into(), Dynamic::from(7_i64))])),
            ),
        ]));
        let array = Dynamic::from_array(vec![Dynamic::from(10_i64), Dynamic::from(20_i64)]);
        let team = lookup(&map, field(&p, "name"));
        let nested = field(&lookup(&map, field(&p, "other")), "n");
        let item = lookup(&array, field(&p, "i"));
        let missing = lookup(&map, field(&p, "none"));
        let beyond = lookup(&array, field(&p, "far"));
        for value in [&team, &nested, &item] {
            assert!(matches!(resolve_deep(value), Resolution::Pending(_)));
        }
        cell.set(Ok(
            json!({"name": "u1", "other": "u2", "i": -1, "none": "u9", "far": 5}),
        ));
        assert!(matches!(resolve_deep(&team), Resolution::Ready(v) if v == json!("red")));
        assert!(matches!(resolve_deep(&nested), Resolution::Ready(v) if v == json!(7)));
        // A negative index counts from the end, a missing map key is `()`, as in Rhai; an index
        // out of bounds is an error there, and never known here.
        assert!(matches!(resolve_deep(&item), Resolution::Ready(v) if v == json!(20)));
        assert!(matches!(resolve_deep(&missing), Resolution::Ready(v) if v == json!(null)));
        assert!(matches!(resolve_deep(&beyond), Resolution::Never));
        // A large container, or a key that can never be known, is an unknown at once.
        let large = Dynamic::from_array(vec![Dynamic::UNIT; MAX_LOOKUP_ITEMS + 1]);
        let (_cell, q) = pending();
        assert!(matches!(
            resolve_deep(&lookup(&large, q)),
            Resolution::Never
        ));
        assert!(matches!(
            resolve_deep(&lookup(&map, Placeholder::unknown())),
            Resolution::Never
        ));
    }

    /// Through the scout's own indexing function, as the rewritten script calls it.
    #[test]
    fn the_scouts_index_defers_a_lookup_by_a_pending_key() {
        let mut engine = Engine::new_raw();
        register(&mut engine, Arc::from(Vec::<String>::new()));
        let (cell, u) = pending();
        let mut scope = rhai::Scope::new();
        scope.push("u", u);
        scope.push(
            "m",
            Dynamic::from_map(Map::from_iter([("u1".into(), Dynamic::from("red"))])),
        );
        let team: Dynamic = engine
            .eval_with_scope(&mut scope, &format!("{INDEX}(m, u.name)"))
            .unwrap();
        assert!(matches!(resolve_deep(&team), Resolution::Pending(_)));
        cell.set(Ok(json!({"name": "u1"})));
        assert!(matches!(resolve_deep(&team), Resolution::Ready(v) if v == json!("red")));
    }

    /// The scout's `sort` with a comparator sorts known values as Rhai does (an int or a bool
    /// from the comparator, anything else by type), and leaves no guessed order: over a value
    /// not known yet every item becomes an unknown.
    #[test]
    fn a_sort_over_values_not_known_yet_orders_nothing() {
        let scripts = [
            "let a = [3, 1, 2]; a.sort(|x, y| x - y); a",
            "let a = [3, 1, 2]; a.sort(|x, y| x > y); a",
            "let a = [#{n: 2}, #{n: 1}]; a.sort(|x, y| x.n - y.n); a",
            "let a = [1, \"b\", 2.5, ()]; a.sort(|x, y| \"no\"); a",
            "let a = [2, 1]; a.sort(|x, y| x.missing - y); a",
        ];
        let mut scout = Engine::new();
        register(&mut scout, Arc::from(Vec::<String>::new()));
        let plain = Engine::new();
        for script in scripts {
            let ours = format!(
                "{:?}",
                scout.eval::<Dynamic>(script).map_err(|e| e.to_string())
            );
            let rhai = format!(
                "{:?}",
                plain.eval::<Dynamic>(script).map_err(|e| e.to_string())
            );
            assert_eq!(ours, rhai, "{script}");
        }
        let (cell, p) = pending();
        let mut scope = rhai::Scope::new();
        scope.push("p", p);
        let sorted: Array = scout
            .eval_with_scope(
                &mut scope,
                "let a = [p, #{n: 1}]; a.sort(|x, y| x.n - y.n); a",
            )
            .unwrap();
        assert!(sorted
            .iter()
            .all(|item| matches!(resolve_deep(item), Resolution::Never)));
        cell.set(Ok(json!({"n": 2})));
        let sorted: Array = scout
            .eval_with_scope(
                &mut scope,
                "let a = [p, #{n: 1}]; a.sort(|x, y| x.n - y.n); a",
            )
            .unwrap();
        let sorted: Vec<Value> = sorted
            .iter()
            .map(|item| match resolve_deep(item) {
                Resolution::Ready(v) => v,
                _ => panic!("known once its read landed"),
            })
            .collect();
        assert_eq!(sorted, vec![json!({"n": 1}), json!({"n": 2})]);
    }

    #[test]
    fn a_map_given_a_pending_key_keeps_its_writes_in_order() {
        let (cell, p) = pending();
        let mut map = Dynamic::from_map(Map::from_iter([("a".into(), Dynamic::from(1_i64))]));
        let key = assignment_key(&mut map, field(&p, "name"));
        assert!(is_placeholder(&map), "the map became a deferred value");
        map.write_lock::<Placeholder>()
            .unwrap()
            .write(key.clone(), Dynamic::from(2_i64));
        map.write_lock::<Placeholder>()
            .unwrap()
            .write(ImmutableString::from("b").into(), field(&p, "n"));
        map.write_lock::<Placeholder>()
            .unwrap()
            .write(key, Dynamic::from(3_i64));
        assert!(matches!(resolve_deep(&map), Resolution::Pending(c) if c.len() == 1));
        // A field read of the deferred map waits for it too.
        let b = field(&map, "b");
        assert!(matches!(resolve_deep(&b), Resolution::Pending(_)));
        cell.set(Ok(json!({"name": "x", "n": 9})));
        assert!(matches!(
            resolve_deep(&map),
            Resolution::Ready(v) if v == json!({"a": 1, "b": 9, "x": 3})
        ));
        assert!(matches!(resolve_deep(&b), Resolution::Ready(v) if v == json!(9)));
        // A known key passes through; a key of the wrong type never resolves.
        let mut plain = Dynamic::from_map(Map::new());
        assert_eq!(
            assignment_key(&mut plain, "k".into())
                .into_string()
                .unwrap(),
            "k"
        );
        assert!(plain.is_map());
        let (cell, p) = pending();
        let key = assignment_key(&mut plain, p);
        plain
            .write_lock::<Placeholder>()
            .unwrap()
            .write(key, Dynamic::UNIT);
        cell.set(Ok(json!(1)));
        assert!(matches!(resolve_deep(&plain), Resolution::Never));
    }

    #[test]
    fn writes_into_a_pending_read_are_applied_to_its_value() {
        let (cell, p) = pending();
        let mut edited = p.clone();
        edited
            .write_lock::<Placeholder>()
            .unwrap()
            .write(ImmutableString::from("x").into(), Dynamic::from(5_i64));
        let x = field(&edited, "x");
        let mut items = Dynamic::from_array(vec![Dynamic::from(1_i64), p]);
        let key = assignment_key(&mut items, field(&x, "nothing"));
        items
            .write_lock::<Placeholder>()
            .unwrap()
            .write(key, Dynamic::UNIT);
        cell.set(Ok(json!({"x": 1, "y": 2})));
        assert!(matches!(resolve_deep(&x), Resolution::Ready(v) if v == json!(5)));
        assert!(matches!(
            resolve_deep(&edited),
            Resolution::Ready(v) if v == json!({"x": 5, "y": 2})
        ));
        // `5.nothing` does not exist: the array's key never resolves.
        assert!(matches!(resolve_deep(&items), Resolution::Never));
    }

    #[test]
    fn a_deferred_value_never_misses_a_change_made_by_a_function() {
        let mut engine = Engine::new();
        register(&mut engine, Arc::from(Vec::new()));
        let (cell, p) = pending();
        let mut scope = rhai::Scope::new();
        scope.push("u", p);
        let script = r#"
            let m = #{a: 1}; m[__ts_key(m, u.name)] = 2;
            let before = m; let n = m.len();
            m.remove("a");
            [before, m, n]
        "#;
        let out: Array = engine.eval_with_scope(&mut scope, script).unwrap();
        // `len` changes nothing; `remove` on a value not known yet makes it an unknown.
        assert!(is_placeholder(&out[0]) && is_placeholder(&out[1]) && is_placeholder(&out[2]));
        cell.set(Ok(json!({"name": "x"})));
        assert!(
            matches!(resolve_deep(&out[0]), Resolution::Ready(v) if v == json!({"a": 1, "x": 2}))
        );
        assert!(matches!(resolve_deep(&out[1]), Resolution::Never));
        // Once known, the function runs on the value, and the variable becomes the result.
        let mut scope = rhai::Scope::new();
        scope.push("m", out[0].clone());
        let out: Array = engine
            .eval_with_scope(&mut scope, r#"let r = m.remove("a"); [r, m]"#)
            .unwrap();
        assert_eq!(out[0].as_int().unwrap(), 1);
        assert!(out[1].is_map(), "{:?}", out[1]);
        assert!(matches!(resolve_deep(&out[1]), Resolution::Ready(v) if v == json!({"x": 2})));
    }

    /// An engine with the scout's placeholder functions, and a scope holding `u`, a read in
    /// flight.
    fn scout_engine() -> (Engine, rhai::Scope<'static>, Arc<Cell>) {
        let mut engine = Engine::new();
        register(&mut engine, Arc::from(Vec::new()));
        let (cell, p) = pending();
        let mut scope = rhai::Scope::new();
        scope.push("u", p);
        (engine, scope, cell)
    }

    #[test]
    fn deferred_comparisons_resolve_to_what_the_run_computes() {
        let fields = [
            json!(1),
            json!(2.5),
            json!("b"),
            json!(true),
            json!(null),
            json!([1]),
        ];
        let others = [
            "1", "2.5", "2", "\"a\"", "\"b\"", "'b'", "true", "false", "()",
        ];
        let plain = Engine::new();
        for field in &fields {
            for other in others {
                for op in ["==", "!=", "<", "<=", ">", ">="] {
                    for script in [format!("u.v {op} {other}"), format!("{other} {op} u.v")] {
                        let (engine, mut scope, cell) = scout_engine();
                        let deferred: Dynamic =
                            engine.eval_with_scope(&mut scope, &script).unwrap();
                        let negated: Dynamic = engine
                            .eval_with_scope(&mut scope, &format!("!({script})"))
                            .unwrap();
                        assert!(
                            is_placeholder(&deferred) && is_placeholder(&negated),
                            "{script}"
                        );
                        cell.set(Ok(json!({ "v": field })));
                        let mut scope = rhai::Scope::new();
                        scope.push("u", to_dynamic(&json!({ "v": field })));
                        let expected = plain.eval_with_scope::<Dynamic>(&mut scope, &script);
                        match (resolve_deep(&deferred), expected) {
                            // Only scalars are computed: a container's comparison stays unknown.
                            (Resolution::Never, _) if field.is_array() => {}
                            (Resolution::Ready(v), Ok(e)) => {
                                assert_eq!(v, json!(e.as_bool().unwrap()), "{script} on {field}");
                                let not = resolve_deep(&negated);
                                assert!(
                                    matches!(not, Resolution::Ready(n) if n == json!(!e.as_bool().unwrap())),
                                    "!({script}) on {field}"
                                );
                            }
                            (got, e) => panic!(
                                "{script} on {field}: {:?} against {e:?}",
                                matches!(got, Resolution::Ready(_))
                            ),
                        }
                    }
                }
            }
        }
        // `!` of a non-boolean is Rhai's error: never known. Arithmetic stays an unknown.
        let (engine, mut scope, cell) = scout_engine();
        let not: Dynamic = engine.eval_with_scope(&mut scope, "!u.n").unwrap();
        let sum: Dynamic = engine.eval_with_scope(&mut scope, "u.n + 1 > 2").unwrap();
        cell.set(Ok(json!({"n": 5})));
        assert!(matches!(resolve_deep(&not), Resolution::Never));
        assert!(matches!(resolve_deep(&sum), Resolution::Never));
    }

    #[test]
    fn a_decisive_guess_is_kept_by_the_reads_it_waited_for_until_it_is_proved() {
        let (engine, mut scope, cell) = scout_engine();
        let (other, q) = pending();
        scope.push("q", q);
        begin_notes();
        // Decisive: a condition of its own, a guard guessed not taken, `&&` operands guessed
        // true. Loose: `||` operands guessed true. Another read's guess is not `u`'s.
        let script = format!(
            "if {COND}(u.active) {{ 1 }}; if {UNLIKELY}(!u.active) {{ 2 }}; \
             if {COND}(u.n > 2) && {COND}(u.n < 9) {{ 3 }}; if {COND_LOOSE}(u.team == 0) {{ 4 }}; \
             if {COND}(q.active) {{ 5 }}"
        );
        engine.run_with_scope(&mut scope, &script).unwrap();
        let guesses = guesses_over(std::slice::from_ref(&cell));
        assert_eq!(guesses.len(), 4, "{guesses:?}");
        assert_eq!(guesses_over(std::slice::from_ref(&other)).len(), 1);
        assert!(guesses.iter().all(|g| !g.proved_wrong()), "still unknown");
        // Guessed right: active, and 2 < n < 9.
        cell.set(Ok(json!({"active": true, "n": 5, "team": 1})));
        assert!(guesses.iter().all(|g| !g.proved_wrong()));
        let (engine, mut scope, cell) = scout_engine();
        begin_notes();
        engine
            .run_with_scope(&mut scope, &script.replace("q.", "u."))
            .unwrap();
        let guesses = guesses_over(std::slice::from_ref(&cell));
        // `u.active` guessed true, then `!u.active` false: both wrong for an inactive user.
        cell.set(Ok(json!({"active": false, "n": 5})));
        assert_eq!(guesses.iter().filter(|g| g.proved_wrong()).count(), 3);
        take_notes();
        // A new pass starts with no guesses; a read keeps only its latest ones.
        let (engine, mut scope, cell) = scout_engine();
        begin_notes();
        assert!(guesses_over(std::slice::from_ref(&cell)).is_empty());
        for _ in 0..2 * GUESSES_PER_CALL {
            engine
                .run_with_scope(&mut scope, &format!("if {COND}(u.a) {{}}"))
                .unwrap();
        }
        assert_eq!(
            guesses_over(std::slice::from_ref(&cell)).len(),
            GUESSES_PER_CELL
        );
        take_notes();
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
