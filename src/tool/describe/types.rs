//! JSON Schema as the types a script sees: `int`, `"open" | "closed"`, `array<#{ id: int }>`,
//! `map<string, T>`, with every description, default, format and range as a trailing comment
//! on the line of the field it belongs to.
//!
//! An object stays on one line unless one of its fields has something to say; then each field
//! gets a line of its own and its notes follow it as `// ...`. Local `$ref`s are expanded in
//! place, except those that lead back to themselves: a recursive type is written by name and
//! defined once, above the function. Depth and the number of schema nodes rendered are bounded,
//! so that no schema (cyclic, deep, or a DAG that doubles at every level) makes the catalog
//! large or slow.
//!
//! Everything taken from a schema is made safe for one line: names and literals are quoted with
//! every line-breaking character escaped, notes have them replaced by spaces, and type names
//! from `$defs` keep only identifier characters.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::one_line;

/// The deepest nesting rendered; below it a type is `?`.
const MAX_DEPTH: usize = 16;

/// The most schema nodes rendered for one tool's argument or result; past it a type is `?`.
const MAX_NODES: usize = 2_000;

/// The most `$ref` targets looked at when finding recursive types.
const MAX_REFS: usize = 256;

/// A default longer than this, as a literal, is left out.
const MAX_DEFAULT: usize = 60;

/// A pattern longer than this is left out.
const MAX_PATTERN: usize = 60;

/// An object whose one-line form is longer than this is written a field a line.
const MAX_INLINE: usize = 100;

/// The names of the types the catalog writes itself.
const RESERVED_TYPES: &[&str] = &[
    "int", "float", "bool", "string", "array", "map", "text", "never",
];

/// One line of a rendered type and the notes that end it.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Line {
    /// The type's text on this line.
    pub(super) text: String,
    /// What the schema says about what starts on this line: descriptions, defaults, ranges.
    pub(super) notes: Vec<String>,
}

impl Line {
    /// The line as written: its text, then its notes as a `//` comment.
    pub(super) fn written(&self) -> String {
        if self.notes.is_empty() {
            self.text.clone()
        } else {
            let mut comment = String::new();
            for note in &self.notes {
                if !comment.is_empty() {
                    // A note that ends a sentence needs no separator of its own.
                    comment.push_str(if comment.ends_with(['.', ';']) {
                        " "
                    } else {
                        "; "
                    });
                }
                comment.push_str(note);
            }
            format!("{}  // {comment}", self.text)
        }
    }
}

/// A rendered type: one line, or several when an object is written a field a line.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Rendered {
    pub(super) lines: Vec<Line>,
}

impl Rendered {
    pub(super) fn word(text: impl Into<String>) -> Rendered {
        Rendered {
            lines: vec![Line {
                text: text.into(),
                notes: Vec::new(),
            }],
        }
    }

    /// Whether it is one line with no notes.
    fn is_plain(&self) -> bool {
        self.lines.len() == 1 && self.lines[0].notes.is_empty()
    }

    /// Appends text to the last line.
    pub(super) fn push_str(&mut self, text: &str) {
        if let Some(last) = self.lines.last_mut() {
            last.text.push_str(text);
        }
    }

    /// Appends `other`: its first line continues this one's last line.
    pub(super) fn append(&mut self, other: Rendered) {
        let mut lines = other.lines.into_iter();
        if let (Some(first), Some(last)) = (lines.next(), self.lines.last_mut()) {
            last.text.push_str(&first.text);
            last.notes.extend(first.notes);
        }
        self.lines.extend(lines);
    }

    /// Text, then this type.
    pub(super) fn after(text: &str, other: Rendered) -> Rendered {
        let mut out = Rendered::word(text);
        out.append(other);
        out
    }

    /// Adds notes to the first line (where the type starts).
    fn note(&mut self, notes: Vec<String>) {
        if let Some(first) = self.lines.first_mut() {
            // The notes of the type itself come before those of its parts.
            let parts = std::mem::take(&mut first.notes);
            first.notes = notes;
            first.notes.extend(parts);
        }
    }

    /// Every line indented by `by`, except the first.
    fn indent_rest(mut self, by: &str) -> Rendered {
        for line in self.lines.iter_mut().skip(1) {
            line.text.insert_str(0, by);
        }
        self
    }

    /// The text alone, as one line (notes dropped).
    fn flat(&self) -> String {
        self.lines
            .iter()
            .map(|l| l.text.trim())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Where a schema is rendered.
#[derive(Clone, Copy, Default)]
struct At {
    depth: usize,
    /// An optional field: `()` is left out of its union, since an absent field reads as `()`.
    optional: bool,
    /// The description was already given by the schema this one refines (a `$ref`'s siblings,
    /// a union around it): do not repeat one from here.
    described: bool,
}

impl At {
    fn deeper(self) -> At {
        At {
            depth: self.depth + 1,
            optional: false,
            described: false,
        }
    }
}

/// Renders the schemas of one tool: the argument or result schema is the root that local
/// `$ref`s point into.
pub(super) struct Types<'a> {
    root: &'a Value,
    /// `$ref` targets that lead back to themselves, by JSON pointer, and the names they get.
    recursive: BTreeMap<String, String>,
    /// The recursive types this rendering has named, to be defined once.
    used: BTreeSet<String>,
    /// Targets being expanded, to stop at a cycle the pre-scan did not see.
    stack: Vec<String>,
    nodes: usize,
}

impl<'a> Types<'a> {
    pub(super) fn new(root: &'a Value) -> Types<'a> {
        let recursive = recursive_refs(root);
        Types {
            root,
            recursive,
            used: BTreeSet::new(),
            stack: Vec::new(),
            nodes: 0,
        }
    }

    /// The root schema's type. Its own description is left out when `described` (a tool's
    /// argument, whose description is the tool's).
    pub(super) fn root(&mut self, described: bool) -> Rendered {
        let root = self.root;
        self.render(
            root,
            At {
                described,
                ..At::default()
            },
        )
    }

    /// The recursive types named so far, each as `Name = type`, defining those they name in
    /// turn.
    pub(super) fn definitions(&mut self) -> Vec<Rendered> {
        let mut done = BTreeSet::new();
        let mut out = Vec::new();
        while let Some(pointer) = self.used.iter().find(|p| !done.contains(*p)).cloned() {
            done.insert(pointer.clone());
            let name = self.recursive.get(&pointer).cloned().unwrap_or_default();
            let Some(target) = self.target(&pointer) else {
                continue;
            };
            self.stack.push(pointer.clone());
            let body = self.render(target, At::default().deeper());
            self.stack.pop();
            out.push(Rendered::after(&format!("{name} = "), body));
        }
        out
    }

    fn target(&self, pointer: &str) -> Option<&'a Value> {
        self.root.pointer(pointer)
    }

    fn render(&mut self, schema: &Value, at: At) -> Rendered {
        self.nodes += 1;
        if self.nodes > MAX_NODES || at.depth > MAX_DEPTH {
            return Rendered::word("?");
        }
        let Some(obj) = schema.as_object() else {
            return Rendered::word(match schema {
                Value::Bool(false) => "never",
                _ => "?",
            });
        };
        if let Some(reference) = obj.get("$ref").and_then(Value::as_str) {
            return self.reference(obj, reference, at);
        }
        self.render_here(schema, at)
    }

    /// A `$ref`: a recursive type by name, another local one expanded with its siblings
    /// (a description next to it) taking precedence; a remote one is `?`.
    fn reference(&mut self, obj: &Map<String, Value>, reference: &str, at: At) -> Rendered {
        let own_notes = || {
            if at.described {
                Vec::new()
            } else {
                notes(obj, "")
            }
        };
        let Some(pointer) = local(reference) else {
            let mut out = Rendered::word("?");
            out.note(own_notes());
            return out;
        };
        let pointer = pointer.as_str();
        if let Some(name) = self.recursive.get(pointer) {
            let mut out = Rendered::word(name.clone());
            self.used.insert(pointer.to_string());
            // A recursive type's own description is in its definition.
            out.note(own_notes());
            return out;
        }
        let target = match self.target(pointer) {
            Some(target) if !self.stack.iter().any(|p| p == pointer) => target,
            _ => {
                let mut out = Rendered::word("?");
                out.note(own_notes());
                return out;
            }
        };
        // Siblings of `$ref` refine its target: they are merged over it, so a description
        // beside the `$ref` wins over the target's own.
        let merged = match target {
            Value::Object(t) => {
                let mut merged = t.clone();
                for (k, v) in obj {
                    if k != "$ref" {
                        merged.insert(k.clone(), v.clone());
                    }
                }
                Value::Object(merged)
            }
            other => other.clone(),
        };
        self.stack.push(pointer.to_string());
        let out = self.render(&merged, at);
        self.stack.pop();
        out
    }

    /// A schema without a `$ref` at its top.
    fn render_here(&mut self, schema: &Value, at: At) -> Rendered {
        let Some(obj) = schema.as_object() else {
            return self.render(schema, at);
        };
        // A nullable `["integer", "null"]` has an integer's notes.
        let ty = type_of(obj).or_else(|| {
            obj.get("type")
                .and_then(Value::as_array)
                .and_then(|t| t.iter().filter_map(Value::as_str).find(|t| *t != "null"))
                .map(str::to_string)
        });
        let own_notes = if at.described {
            notes_without_description(obj, ty.as_deref())
        } else {
            notes(obj, ty.as_deref().unwrap_or(""))
        };
        let inner = At {
            described: at.described || obj.contains_key("description"),
            ..at
        };
        let mut out = self.shape(obj, inner);
        out.note(own_notes);
        out
    }

    /// The type of a schema, without its own notes.
    fn shape(&mut self, obj: &Map<String, Value>, at: At) -> Rendered {
        if let Some(all) = obj.get("allOf").and_then(Value::as_array) {
            if let Some(merged) = self.merge_all_of(obj, all) {
                return self.shape(&merged, at);
            }
            let mut rest = obj.clone();
            rest.remove("allOf");
            let mut parts: Vec<Rendered> = Vec::new();
            if has_shape(&rest) {
                parts.push(self.shape(&rest, at));
            }
            for member in all {
                parts.push(self.render(
                    member,
                    At {
                        depth: at.depth + 1,
                        ..at
                    },
                ));
            }
            return join(parts, " & ", true);
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(options) = obj.get(key).and_then(Value::as_array) {
                let mut rest = obj.clone();
                rest.remove(key);
                let base_type = rest.get("type").cloned();
                let mut members = Vec::new();
                for option in options {
                    let mut option = option.clone();
                    if let Value::Object(o) = &mut option {
                        // A member that only refines (a format, a range) keeps the outer type.
                        if let (false, Some(t)) = (has_shape(o), &base_type) {
                            o.insert("type".into(), t.clone());
                        }
                        // A constant's description is noted beside its value (see `notes`).
                        if constant(o).is_some() {
                            o.remove("description");
                        }
                    }
                    members.push(self.render(
                        &option,
                        At {
                            depth: at.depth + 1,
                            ..at
                        },
                    ));
                }
                let union = union(members, at.optional);
                let object_base =
                    rest.contains_key("properties") || rest.contains_key("additionalProperties");
                if object_base {
                    let base = self.shape(&rest, at);
                    return join(vec![base, parenthesised(union)], " & ", false);
                }
                return union;
            }
        }
        if let Some(values) = obj.get("enum").and_then(Value::as_array) {
            let members = values.iter().map(|v| Rendered::word(literal(v))).collect();
            return union(members, at.optional);
        }
        if let Some(value) = obj.get("const") {
            return Rendered::word(literal(value));
        }
        let nullable = obj.get("nullable").and_then(Value::as_bool) == Some(true);
        let out = match obj.get("type") {
            Some(Value::Array(types)) => {
                let mut members = Vec::new();
                for t in types {
                    let mut single = obj.clone();
                    single.insert("type".into(), t.clone());
                    single.remove("nullable");
                    members.push(self.shape(
                        &single,
                        At {
                            optional: false,
                            ..at
                        },
                    ));
                }
                union(members, at.optional)
            }
            _ => match type_of(obj).as_deref() {
                Some("integer") => Rendered::word("int"),
                Some("number") => Rendered::word("float"),
                Some("boolean") => Rendered::word("bool"),
                Some("string") => Rendered::word("string"),
                Some("null") => Rendered::word("()"),
                Some("array") => self.array(obj, at),
                Some("object") => self.object(obj, at),
                Some(other) => Rendered::word(identifier(other)),
                None => Rendered::word("?"),
            },
        };
        if nullable {
            union(vec![out, Rendered::word("()")], at.optional)
        } else {
            out
        }
    }

    fn array(&mut self, obj: &Map<String, Value>, at: At) -> Rendered {
        let tuple = obj
            .get("prefixItems")
            .or_else(|| obj.get("items").filter(|i| i.is_array()))
            .and_then(Value::as_array);
        if let Some(items) = tuple {
            let parts = items
                .iter()
                .map(|item| self.render(item, at.deeper()))
                .collect();
            let mut out = Rendered::word("[");
            out.append(join(parts, ", ", false));
            out.push_str("]");
            return out;
        }
        match obj.get("items") {
            Some(items) if items != &Value::Bool(true) && items != &Value::Object(Map::new()) => {
                let mut out = Rendered::word("array<");
                out.append(self.render(items, at.deeper()));
                out.push_str(">");
                out
            }
            _ => Rendered::word("array"),
        }
    }

    fn object(&mut self, obj: &Map<String, Value>, at: At) -> Rendered {
        let required = required(obj);
        let props = obj.get("properties").and_then(Value::as_object);
        let extra = obj
            .get("additionalProperties")
            .filter(|v| v.is_object() && v.as_object().is_some_and(|o| !o.is_empty()))
            .or_else(|| {
                obj.get("patternProperties")
                    .and_then(Value::as_object)
                    .and_then(|p| p.values().next())
            });
        let mut fields: Vec<Rendered> = Vec::new();
        match props {
            Some(props) if !props.is_empty() => {
                for (name, prop) in props {
                    let optional = !required.contains(&name.as_str());
                    let label = format!("{}{}: ", field(name), if optional { "?" } else { "" });
                    let ty = self.render(
                        prop,
                        At {
                            depth: at.depth + 1,
                            optional,
                            described: false,
                        },
                    );
                    fields.push(Rendered::after(&label, ty));
                }
            }
            _ => {
                // Only the names of required fields are known.
                for name in &required {
                    fields.push(Rendered::word(format!("{}: ?", field(name))));
                }
            }
        }
        if fields.is_empty() {
            return match extra {
                Some(value) => {
                    let mut out = Rendered::word("map<string, ");
                    out.append(self.render(value, at.deeper()));
                    out.push_str(">");
                    out
                }
                None => Rendered::word("map"),
            };
        }
        if let Some(value) = extra {
            fields.push(Rendered::after(
                "[key: string]: ",
                self.render(value, at.deeper()),
            ));
        }
        let inline = fields.iter().all(Rendered::is_plain);
        if inline {
            let text: Vec<String> = fields.iter().map(Rendered::flat).collect();
            let text = format!("#{{ {} }}", text.join(", "));
            if text.len() <= MAX_INLINE {
                return Rendered::word(text);
            }
        }
        let mut out = Rendered::word("#{");
        for f in fields {
            let mut f = f.indent_rest("    ");
            f.push_str(",");
            let mut lines = f.lines.into_iter();
            if let Some(mut first) = lines.next() {
                first.text.insert_str(0, "    ");
                out.lines.push(first);
            }
            out.lines.extend(lines);
        }
        out.lines.push(Line {
            text: "}".into(),
            notes: Vec::new(),
        });
        out
    }

    /// `allOf` members that are all plain objects (after local `$ref`s), merged into one:
    /// their properties together, their required fields together. `None` when one is not.
    fn merge_all_of(&self, obj: &Map<String, Value>, all: &[Value]) -> Option<Map<String, Value>> {
        const OBJECT_KEYS: &[&str] = &[
            "type",
            "properties",
            "required",
            "additionalProperties",
            "description",
            "title",
            "$ref",
            "$defs",
            "definitions",
            "$schema",
        ];
        let mut merged = obj.clone();
        merged.remove("allOf");
        let mut props = merged
            .get("properties")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let mut req: Vec<Value> = merged
            .get("required")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for member in all {
            let mut member = member.as_object()?;
            let mut hops = 0;
            while let Some(r) = member.get("$ref").and_then(Value::as_str) {
                let pointer = local(r)?;
                if self.recursive.contains_key(&pointer) || hops > 8 {
                    return None;
                }
                member = self.target(&pointer)?.as_object()?;
                hops += 1;
            }
            if member.keys().any(|k| !OBJECT_KEYS.contains(&k.as_str()))
                || member.get("type").is_some_and(|t| t != "object")
            {
                return None;
            }
            if let Some(p) = member.get("properties").and_then(Value::as_object) {
                for (k, v) in p {
                    props.entry(k.clone()).or_insert_with(|| v.clone());
                }
            }
            if let Some(r) = member.get("required").and_then(Value::as_array) {
                req.extend(
                    r.iter()
                        .filter(|v| !req.contains(v))
                        .cloned()
                        .collect::<Vec<_>>(),
                );
            }
        }
        merged.insert("type".into(), "object".into());
        merged.insert("properties".into(), Value::Object(props));
        merged.insert("required".into(), Value::Array(req));
        Some(merged)
    }
}

/// Whether a schema says what shape a value has (beyond refining one given elsewhere).
fn has_shape(obj: &Map<String, Value>) -> bool {
    [
        "type",
        "$ref",
        "enum",
        "const",
        "properties",
        "items",
        "prefixItems",
        "additionalProperties",
        "anyOf",
        "oneOf",
        "allOf",
    ]
    .iter()
    .any(|k| obj.contains_key(*k))
}

/// The schema's `type` when it is one name, or the one its keywords imply.
fn type_of(obj: &Map<String, Value>) -> Option<String> {
    match obj.get("type") {
        Some(Value::String(t)) => Some(t.clone()),
        Some(_) => None,
        None if [
            "properties",
            "additionalProperties",
            "required",
            "patternProperties",
        ]
        .iter()
        .any(|k| obj.contains_key(*k)) =>
        {
            Some("object".into())
        }
        None if obj.contains_key("items") || obj.contains_key("prefixItems") => {
            Some("array".into())
        }
        None => None,
    }
}

/// Members joined by `sep`, parenthesised when `wrap` and there are several.
fn join(parts: Vec<Rendered>, sep: &str, wrap: bool) -> Rendered {
    let several = parts.len() > 1;
    let mut out = Rendered::word(if wrap && several { "(" } else { "" });
    for (i, part) in parts.into_iter().enumerate() {
        if i > 0 {
            out.push_str(sep);
        }
        out.append(part);
    }
    if wrap && several {
        out.push_str(")");
    }
    out
}

fn parenthesised(union: Rendered) -> Rendered {
    let several = union.lines.iter().any(|l| l.text.contains(" | "));
    if several {
        let mut out = Rendered::word("(");
        out.append(union);
        out.push_str(")");
        out
    } else {
        union
    }
}

/// Members of a union, repeated ones once; `()` left out for an optional field.
fn union(members: Vec<Rendered>, optional: bool) -> Rendered {
    let mut seen: Vec<Rendered> = Vec::new();
    for m in members {
        if optional && m.lines.len() == 1 && m.lines[0].text == "()" {
            continue;
        }
        if !seen.contains(&m) {
            seen.push(m);
        }
    }
    match seen.len() {
        0 => Rendered::word(if optional { "()" } else { "never" }),
        _ => join(seen, " | ", false),
    }
}

/// The names in `required`.
pub(super) fn required(obj: &Map<String, Value>) -> Vec<&str> {
    obj.get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// What a schema says besides its shape, each made one line: its description, then its
/// constraints.
fn notes(obj: &Map<String, Value>, ty: &str) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(d) = obj.get("description").and_then(Value::as_str) {
        let d = one_line(d.trim());
        if !d.is_empty() {
            out.push(d);
        }
    }
    out.extend(notes_without_description(obj, Some(ty)));
    out
}

fn notes_without_description(obj: &Map<String, Value>, ty: Option<&str>) -> Vec<String> {
    let mut out = Vec::new();
    let format = obj.get("format").and_then(Value::as_str);
    match ty {
        Some("integer" | "number") => {
            if let Some(range) = range(obj, format) {
                out.push(range);
            }
            // Formats of numbers (`int64`, `double`) only restate the type.
            if let Some(f) = format.filter(|f| !is_number_format(f)) {
                out.push(one_line(f));
            }
        }
        _ => {
            if let Some(f) = format {
                out.push(one_line(f));
            }
            let (min, max) = match ty {
                Some("array") => ("minItems", "maxItems"),
                _ => ("minLength", "maxLength"),
            };
            let bound = |k: &str| obj.get(k).and_then(Value::as_u64);
            match (bound(min), bound(max)) {
                (Some(a), Some(b)) if a == b => out.push(format!("len {a}")),
                (Some(a), Some(b)) => out.push(format!("len {a}..={b}")),
                (Some(1), None) => out.push("not empty".into()),
                (Some(a), None) if a > 0 => out.push(format!("len >= {a}")),
                (None, Some(b)) => out.push(format!("len <= {b}")),
                _ => {}
            }
            if obj.get("uniqueItems").and_then(Value::as_bool) == Some(true) {
                out.push("unique".into());
            }
            if let Some(p) = obj.get("pattern").and_then(Value::as_str) {
                if p.chars().count() <= MAX_PATTERN {
                    out.push(format!("pattern {}", one_line(p)));
                }
            }
        }
    }
    if let Some(d) = obj.get("default") {
        let d = literal(d);
        if d.chars().count() <= MAX_DEFAULT {
            out.push(format!("default {d}"));
        }
    }
    if obj.get("deprecated").and_then(Value::as_bool) == Some(true) {
        out.push("deprecated".into());
    }
    // The values of a union of constants (`oneOf` with a description each).
    for key in ["oneOf", "anyOf"] {
        for option in obj.get(key).and_then(Value::as_array).into_iter().flatten() {
            let Some(option) = option.as_object() else {
                continue;
            };
            let (Some(value), Some(d)) = (
                constant(option),
                option.get("description").and_then(Value::as_str),
            ) else {
                continue;
            };
            out.push(format!("{}: {}", literal(value), one_line(d.trim())));
        }
    }
    out
}

/// The one value a schema allows (`const`, or an `enum` of one).
fn constant(obj: &Map<String, Value>) -> Option<&Value> {
    obj.get("const").or_else(|| {
        obj.get("enum")
            .and_then(Value::as_array)
            .filter(|e| e.len() == 1)
            .and_then(|e| e.first())
    })
}

fn is_number_format(format: &str) -> bool {
    matches!(
        format,
        "int8"
            | "int16"
            | "int32"
            | "int64"
            | "uint"
            | "uint8"
            | "uint16"
            | "uint32"
            | "uint64"
            | "int"
            | "uint128"
            | "int128"
            | "float"
            | "double"
    )
}

/// The range of a number: `1..=100`, `>= 0`, `< 5`; bounds that only restate the number's
/// format (`uint8`: 0 to 255) are left out.
fn range(obj: &Map<String, Value>, format: Option<&str>) -> Option<String> {
    let number = |k: &str| obj.get(k).filter(|v| v.is_number()).map(Value::to_string);
    let flag = |k: &str| obj.get(k).and_then(Value::as_bool) == Some(true);
    let natural_max = match format {
        Some("uint8") => Some("255"),
        Some("uint16") => Some("65535"),
        Some("uint32") => Some("4294967295"),
        Some("int8") => Some("127"),
        Some("int16") => Some("32767"),
        Some("int32") => Some("2147483647"),
        _ => None,
    };
    let natural_min = match format {
        Some(f) if f.starts_with("uint") => Some("0"),
        Some("int8") => Some("-128"),
        Some("int16") => Some("-32768"),
        Some("int32") => Some("-2147483648"),
        _ => None,
    };
    // Draft 4 writes exclusive bounds as flags beside `minimum`/`maximum`.
    let (mut low, mut low_open) = match (number("minimum"), number("exclusiveMinimum")) {
        (_, Some(x)) => (Some(x), true),
        (Some(x), None) => (Some(x), flag("exclusiveMinimum")),
        (None, None) => (None, false),
    };
    let (mut high, mut high_open) = match (number("maximum"), number("exclusiveMaximum")) {
        (_, Some(x)) => (Some(x), true),
        (Some(x), None) => (Some(x), flag("exclusiveMaximum")),
        (None, None) => (None, false),
    };
    if !low_open && low.as_deref() == natural_min && low.is_some() {
        (low, low_open) = (None, false);
    }
    if !high_open && high.as_deref() == natural_max && high.is_some() {
        (high, high_open) = (None, false);
    }
    match (low, high) {
        (Some(a), Some(b)) if !low_open && !high_open => Some(format!("{a}..={b}")),
        (Some(a), Some(b)) => Some(format!(
            "{} {a}, {} {b}",
            if low_open { ">" } else { ">=" },
            if high_open { "<" } else { "<=" }
        )),
        (Some(a), None) => Some(format!("{} {a}", if low_open { ">" } else { ">=" })),
        (None, Some(b)) => Some(format!("{} {b}", if high_open { "<" } else { "<=" })),
        (None, None) => None,
    }
}

/// A JSON value as a script literal: `"open"`, `3`, `()`, `[1, 2]`, `#{ a: 1 }`. Strings are
/// quoted with every line-breaking character escaped, so a literal is always one line.
pub(super) fn literal(value: &Value) -> String {
    match value {
        Value::Null => "()".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => quoted(s),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(literal).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(map) if map.is_empty() => "#{}".into(),
        Value::Object(map) => {
            let fields: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{}: {}", field(k), literal(v)))
                .collect();
            format!("#{{ {} }}", fields.join(", "))
        }
    }
}

/// A string in double quotes: `"` and `\` escaped, and every control or line-separating
/// character written as `\u{...}`.
fn quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if super::breaks_line(c) => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A property name as written in a type: plain when it is an identifier, else quoted.
pub(super) fn field(name: &str) -> String {
    if is_identifier(name) {
        name.to_string()
    } else {
        quoted(name)
    }
}

fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// A name made of identifier characters only, for a type name taken from a schema.
fn identifier(name: &str) -> String {
    let kept: String = name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .take(64)
        .collect();
    match kept.chars().next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' => kept,
        _ => format!("T{kept}"),
    }
}

/// The local `$ref` targets that can reach themselves, by JSON pointer (`#` stripped), each
/// with the name a script sees: the last segment of its pointer (the root is its `title`, or
/// `Self`), made an identifier and unique.
fn recursive_refs(root: &Value) -> BTreeMap<String, String> {
    // The references found under each target, starting from the root.
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut todo = vec![String::new()];
    while let Some(pointer) = todo.pop() {
        if edges.contains_key(&pointer) || edges.len() >= MAX_REFS {
            continue;
        }
        let mut found = BTreeSet::new();
        if let Some(target) = root.pointer(&pointer) {
            refs_in(target, &mut found, pointer.is_empty(), 0);
        }
        todo.extend(found.iter().cloned());
        edges.insert(pointer, found);
    }
    let reaches_itself = |start: &String| {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<&String> = edges.get(start).into_iter().flatten().collect();
        while let Some(p) = stack.pop() {
            if p == start {
                return true;
            }
            if seen.insert(p) {
                stack.extend(edges.get(p).into_iter().flatten());
            }
        }
        false
    };
    let mut names = BTreeMap::new();
    let mut taken = BTreeSet::new();
    for pointer in edges.keys().filter(|p| reaches_itself(p)) {
        let base = if pointer.is_empty() {
            root.get("title")
                .and_then(Value::as_str)
                .map(identifier)
                .unwrap_or_else(|| "Self".into())
        } else {
            let last = pointer.rsplit('/').next().unwrap_or_default();
            identifier(&last.replace("~1", "/").replace("~0", "~"))
        };
        // A name the catalog's own types use (`int`, `text`) would read as that type.
        let base = if RESERVED_TYPES.contains(&base.as_str()) {
            format!("{base}_")
        } else {
            base
        };
        let mut name = base.clone();
        let mut n = 2;
        while !taken.insert(name.clone()) {
            name = format!("{base}{n}");
            n += 1;
        }
        names.insert(pointer.clone(), name);
    }
    names
}

/// The JSON pointer of a local `$ref` (`#/$defs/A%20B` is `/$defs/A B`); `None` for another
/// document's.
fn local(reference: &str) -> Option<String> {
    let fragment = reference.strip_prefix('#')?.as_bytes();
    let mut bytes = Vec::with_capacity(fragment.len());
    let mut i = 0;
    while i < fragment.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (fragment[i], fragment.get(i + 1), fragment.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                bytes.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                bytes.push(b);
                i += 1;
            }
        }
    }
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// Collects the local `$ref` pointers in a schema, not descending into definitions (they are
/// reached through the references) nor into values (`const`, `default`, `enum`, `examples`).
fn refs_in(schema: &Value, found: &mut BTreeSet<String>, is_root: bool, depth: usize) {
    if depth > 64 {
        return;
    }
    match schema {
        Value::Object(obj) => {
            for (k, v) in obj {
                match k.as_str() {
                    "$ref" => {
                        if let Some(p) = v.as_str().and_then(local) {
                            found.insert(p);
                        }
                    }
                    "const" | "default" | "enum" | "examples" => {}
                    "$defs" | "definitions" if is_root => {}
                    _ => refs_in(v, found, false, depth + 1),
                }
            }
        }
        Value::Array(items) => {
            for item in items {
                refs_in(item, found, false, depth + 1);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use serde_json::json;

    /// The type of `schema` as written, its recursive types' definitions after it.
    fn show(schema: Value) -> String {
        let mut types = Types::new(&schema);
        let root = types.root(false);
        let mut lines: Vec<String> = root.lines.iter().map(Line::written).collect();
        for d in types.definitions() {
            lines.extend(d.lines.iter().map(|l| format!("type {}", l.written())));
        }
        lines.join("\n")
    }

    #[test]
    fn scalars_literals_and_unions() {
        let cases = [
            (json!({"type": "integer"}), "int"),
            (json!({"type": "number"}), "float"),
            (json!({"type": "boolean"}), "bool"),
            (json!({"type": "null"}), "()"),
            (json!({}), "?"),
            (json!(true), "?"),
            (json!(false), "never"),
            (
                json!({"enum": ["open", "closed", null, 3]}),
                r#""open" | "closed" | () | 3"#,
            ),
            (json!({"const": {"a": [1, "x"]}}), r#"#{ a: [1, "x"] }"#),
            (json!({"type": ["string", "null"]}), "string | ()"),
            (json!({"type": "string", "nullable": true}), "string | ()"),
            (
                json!({"anyOf": [{"type": "integer"}, {"type": "null"}]}),
                "int | ()",
            ),
            (
                json!({"oneOf": [{"type": "integer"}, {"type": "integer"}]}),
                "int",
            ),
            (
                json!({"type": "string", "anyOf": [{"format": "date"}, {"format": "date-time"}]}),
                "string | string  // date; date-time",
            ),
            (json!({"type": "array"}), "array"),
            (json!({"type": "array", "items": {}}), "array"),
            (
                json!({"prefixItems": [{"type": "integer"}, {"type": "string"}]}),
                "[int, string]",
            ),
            (json!({"type": "object"}), "map"),
            (
                json!({"type": "object", "additionalProperties": {"type": "integer"}}),
                "map<string, int>",
            ),
            (json!({"required": ["a", "b c"]}), r#"#{ a: ?, "b c": ? }"#),
            (json!({"type": "gizmo\n{"}), "gizmo"),
        ];
        for (schema, expected) in cases {
            assert_eq!(show(schema.clone()), expected, "{schema}");
        }
    }

    #[test]
    fn objects_stay_on_one_line_until_a_field_has_notes() {
        let plain = json!({
            "type": "object",
            "properties": {
                "id": {"type": "integer"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "status": {"enum": ["open", "closed"]}
            },
            "required": ["id"]
        });
        assert_eq!(
            show(plain),
            r#"#{ id: int, status?: "open" | "closed", tags?: array<string> }"#
        );
        let noted = json!({
            "type": "object",
            "properties": {
                "id": {"type": "integer", "description": "the id", "minimum": 1},
                "page": {
                    "type": "object",
                    "properties": {
                        "size": {"type": "integer", "maximum": 100, "minimum": 1, "default": 20},
                        "after": {"type": ["string", "null"], "format": "date-time"}
                    },
                    "required": ["size"]
                },
                "extra": {"type": "object", "properties": {"a": {"type": "integer"}},
                          "additionalProperties": {"type": "string"}}
            },
            "required": ["id", "page"]
        });
        assert_eq!(
            show(noted),
            "#{\n    \
                 extra?: #{ a?: int, [key: string]: string },\n    \
                 id: int,  // the id; >= 1\n    \
                 page: #{\n        \
                     after?: string,  // date-time\n        \
                     size: int,  // 1..=100; default 20\n    \
                 },\n\
             }"
        );
    }

    #[test]
    fn refs_expand_in_place_and_their_siblings_win() {
        let schema = json!({
            "type": "object",
            "properties": {
                "state": {"anyOf": [{"$ref": "#/$defs/State"}, {"type": "null"}]},
                "owner": {"$ref": "#/definitions/User", "description": "who owns it"},
                "users": {"type": "array", "items": {"$ref": "#/$defs/User"}}
            },
            "required": ["owner", "users"],
            "$defs": {
                "State": {
                    "description": "Which issues.",
                    "oneOf": [
                        {"type": "string", "enum": ["closed"]},
                        {"type": "string", "const": "open", "description": "Still open."}
                    ]
                },
                "User": {"type": "object", "description": "A user.",
                         "properties": {"id": {"type": "integer"}}, "required": ["id"]}
            },
            "definitions": {"User": {"$ref": "#/$defs/User"}}
        });
        assert_eq!(
            show(schema),
            "#{\n    \
                 owner: #{ id: int },  // who owns it\n    \
                 state?: \"closed\" | \"open\",  // Which issues. \"open\": Still open.\n    \
                 users: array<#{ id: int }>,  // A user.\n\
             }"
        );
    }

    #[test]
    fn recursive_types_are_named_and_defined_once() {
        let schema = json!({
            "type": "object",
            "properties": {"tree": {"$ref": "#/$defs/Node"}, "other": {"$ref": "#/$defs/Node"}},
            "required": ["tree"],
            "$defs": {
                "Node": {
                    "type": "object",
                    "description": "A node.",
                    "properties": {
                        "name": {"type": "string"},
                        "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}
                    },
                    "required": ["name", "children"]
                }
            }
        });
        assert_eq!(
            show(schema),
            "#{ other?: Node, tree: Node }\n\
             type Node = #{ children: array<Node>, name: string }  // A node."
        );
        // Mutual recursion, and the root referring to itself.
        let mutual = json!({
            "$ref": "#/$defs/A",
            "$defs": {
                "A": {"type": "object", "properties": {"b": {"$ref": "#/$defs/B"}}},
                "B": {"type": "array", "items": {"$ref": "#/$defs/A"}}
            }
        });
        assert_eq!(show(mutual), "A\ntype A = #{ b?: B }\ntype B = array<A>");
        let root = json!({"title": "List", "type": "object",
                          "properties": {"next": {"$ref": "#"}}});
        assert_eq!(show(root), "#{ next?: List }\ntype List = #{ next?: List }");
        // A `$ref` to itself, and one to nowhere.
        assert_eq!(
            show(json!({"$defs": {"X": {"$ref": "#/$defs/X"}}, "$ref": "#/$defs/X"})),
            "X\ntype X = X"
        );
        let named_int = json!({"$ref": "#/$defs/int",
                               "$defs": {"int": {"type": "array", "items": {"$ref": "#/$defs/int"}}}});
        assert_eq!(show(named_int), "int_\ntype int_ = array<int_>");
        assert_eq!(show(json!({"$ref": "#/$defs/missing"})), "?");
        assert_eq!(show(json!({"$ref": "https://example.com/s.json"})), "?");
    }

    #[test]
    fn deep_and_exponential_schemas_are_cut_short() {
        let mut deep = json!({"type": "integer"});
        for _ in 0..200 {
            deep = json!({"type": "array", "items": deep});
        }
        let out = show(deep);
        assert!(out.contains("array<?>"), "{out}");
        assert!(out.matches("array<").count() <= MAX_DEPTH + 1, "{out}");
        // Each definition uses the next one twice: expanded in full it would be 2^40 nodes.
        let mut defs = Map::new();
        for i in 0..40 {
            let next = format!("#/$defs/D{}", i + 1);
            defs.insert(
                format!("D{i}"),
                json!({"type": "object", "properties": {"a": {"$ref": next}, "b": {"$ref": next}}}),
            );
        }
        defs.insert("D40".into(), json!({"type": "integer"}));
        let wide = json!({"$ref": "#/$defs/D0", "$defs": defs});
        let out = show(wide);
        assert!(out.len() < 100_000, "{} bytes", out.len());
        assert!(out.contains('?'), "cut short: {out}");
    }

    #[test]
    fn all_of_merges_plain_objects() {
        let schema = json!({
            "allOf": [
                {"$ref": "#/$defs/Base"},
                {"type": "object", "properties": {"b": {"type": "string"}}, "required": ["b"]}
            ],
            "$defs": {"Base": {"type": "object", "properties": {"a": {"type": "integer"}}}}
        });
        assert_eq!(show(schema), "#{ a?: int, b: string }");
        let mixed = json!({"allOf": [{"type": "string"}, {"minLength": 2}]});
        assert_eq!(show(mixed), "(string & ?)  // len >= 2");
    }

    #[test]
    fn number_formats_and_their_natural_bounds_say_nothing() {
        let cases = [
            (
                json!({"type": "integer", "format": "uint8", "minimum": 0, "maximum": 255}),
                "int",
            ),
            (
                json!({"type": "integer", "format": "uint64", "minimum": 0}),
                "int",
            ),
            (
                json!({"type": "integer", "exclusiveMinimum": 0}),
                "int  // > 0",
            ),
            (
                json!({"type": "number", "minimum": 0, "exclusiveMaximum": 1.5}),
                "float  // >= 0, < 1.5",
            ),
            (
                json!({"type": "string", "format": "email", "maxLength": 9}),
                "string  // email; len <= 9",
            ),
            (
                json!({"type": "array", "items": {"type": "integer"}, "minItems": 1, "uniqueItems": true}),
                "array<int>  // not empty; unique",
            ),
        ];
        for (schema, expected) in cases {
            assert_eq!(show(schema.clone()), expected, "{schema}");
        }
    }

    /// Names, literals, notes and `$defs` names from a schema cannot leave their line, nor
    /// write code outside a string or a comment.
    #[test]
    fn hostile_schemas_stay_in_their_place() {
        let evil = "x\n}) -> ?;\nfn evil() {\u{2028}\u{85}\r\u{1b}[2J";
        let schema = json!({
            "type": "object",
            "properties": {
                evil: {"type": "string", "description": evil, "default": evil, "pattern": evil,
                       "format": evil},
                "e": {"enum": [evil, {"k\n": evil}]},
                "r": {"$ref": format!("#/$defs/{}", encoded(evil))}
            },
            "$defs": {evil: {"type": "object", "properties": {"again": {"$ref": format!("#/$defs/{}", encoded(evil))}}}}
        });
        let out = show(schema);
        for line in out.lines() {
            assert!(
                !line.chars().any(crate::tool::describe::breaks_line),
                "{line:?}"
            );
            assert!(
                !starts_a_token(&code_of(line), "evil"),
                "code outside a string: {line:?}"
            );
        }
    }

    /// A `$defs` name as a `$ref` fragment: `/` escaped for the pointer, the rest for the URI.
    pub(crate) fn encoded(name: &str) -> String {
        name.replace('~', "~0")
            .replace('/', "~1")
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b == b'~' {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect()
    }

    /// Whether `word` begins a token of `code` (rather than sitting inside an identifier made
    /// of a schema's name, which is harmless).
    pub(crate) fn starts_a_token(code: &str, word: &str) -> bool {
        code.match_indices(word).any(|(i, _)| {
            !code[..i]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        })
    }

    /// A line's text outside string literals and before a `//` comment.
    pub(crate) fn code_of(line: &str) -> String {
        let mut code = String::new();
        let mut chars = line.chars().peekable();
        let mut in_string = false;
        while let Some(c) = chars.next() {
            if in_string {
                match c {
                    '\\' => {
                        chars.next();
                    }
                    '"' => in_string = false,
                    _ => {}
                }
            } else if c == '"' {
                in_string = true;
            } else if c == '/' && chars.peek() == Some(&'/') {
                break;
            } else {
                code.push(c);
            }
        }
        assert!(!in_string, "a string left open: {line:?}");
        code
    }
}
