//! What the script most likely meant: Rhai's parse and runtime errors, read together with the
//! script's text and the catalog, become errors that say what to write instead.
//!
//! Scripts are written by language models, which write the languages they have read most:
//! `{ owner: "acme" }` for a map, `null`, `arr.length`, `console.log`, `f"..."`, `elif`. Rhai's
//! own messages for these say where the parser or the interpreter gave up ("Expecting ';' to
//! terminate this statement", "Function not found: `+ ((), i64)`"), not what to write. Each rule
//! here recognises one such mistake and names the Rhai way in `suggested_next_action`,
//! concretely enough to copy.
//! A mistake no rule knows keeps Rhai's message and the kind's general hint.

use std::collections::HashSet;

use rhai::{EvalAltResult, ParseError};

use crate::error::{ErrorKind, RunError};
use crate::tool::{RegisteredTool, Registry};

/// A failure described for the model: what went wrong and what to write instead.
#[derive(Debug)]
pub(crate) struct Hint {
    pub(crate) kind: ErrorKind,
    pub(crate) message: String,
    pub(crate) action: Option<String>,
    pub(crate) tool: Option<String>,
}

impl Hint {
    fn new(kind: ErrorKind, message: impl Into<String>, action: Option<String>) -> Hint {
        Hint {
            kind,
            message: message.into(),
            action,
            tool: None,
        }
    }

    /// A tool error (from the dispatch path's own checks), as a hint.
    pub(crate) fn from_tool(e: crate::error::ToolError) -> Hint {
        Hint {
            kind: e.kind,
            message: e.message,
            action: e.suggested_next_action,
            tool: e.tool,
        }
    }

    fn script(message: impl Into<String>, action: impl Into<String>) -> Hint {
        Hint::new(ErrorKind::ScriptError, message, Some(action.into()))
    }

    /// The run's error, at `line` and `column`.
    pub(crate) fn at(self, line: Option<usize>, column: Option<usize>) -> RunError {
        let mut error = RunError::new(self.kind, self.message);
        if let Some(action) = self.action {
            error.suggested_next_action = Some(action);
        }
        error.tool = self.tool;
        error.line = line;
        error.column = column;
        error
    }
}

/// What the diagnosis of a runtime error knows of the script's world.
pub(crate) struct Known<'a> {
    /// The tools the script may call.
    pub(crate) registry: Option<&'a Registry>,
    /// Whether a function of that name exists: the engine's, a tool's, the script's own.
    pub(crate) functions: &'a dyn Fn(&str) -> bool,
}

// ---------------------------------------------------------------------------------------------
// Parse errors
// ---------------------------------------------------------------------------------------------

/// A compile error: `invalid_script` at its line and column, with what to write instead when
/// the script's text shows a mistake a rule knows.
pub(crate) fn parse_error(source: &str, e: &ParseError) -> RunError {
    let (line, column) = super::line_column(e.position());
    let rhai_message = e.err_type().to_string();
    let text = line
        .and_then(|l| source.lines().nth(l - 1))
        .unwrap_or_default();
    let hint = parse_hint(&rhai_message, text, column.unwrap_or(1));
    let (message, action) = match hint {
        Some((why, action)) => (format!("{rhai_message}: {why}"), Some(action)),
        None => (rhai_message, None),
    };
    Hint::new(ErrorKind::InvalidScript, message, action).at(line, column)
}

/// The explanation and the next action for a parse error, from Rhai's message and the text of
/// the line it is on.
fn parse_hint(message: &str, line: &str, column: usize) -> Option<(String, String)> {
    let hint = |why: &str, action: String| Some((why.to_string(), action));
    if let Some(word) = reserved_word(message) {
        return match word {
            "null" | "nil" => hint(
                "Rhai has no null; the empty value is ()",
                format!(
                    "use () instead of {word}: write `x == ()`, or `x ?? default` for a default"
                ),
            ),
            "await" | "async" => hint(
                "tool calls are synchronous in Rhai: a call returns its result",
                "remove `await`: write `let r = get_repo(#{ owner: \"acme\" });`".to_string(),
            ),
            "var" => hint(
                "variables are declared with let",
                "write `let` instead of `var`".to_string(),
            ),
            "new" => hint(
                "Rhai has no constructors",
                "write the value itself: `#{ key: value }` for a map, `[a, b]` for an array"
                    .to_string(),
            ),
            other => Some((
                format!("`{other}` is reserved in Rhai"),
                format!("choose another name than `{other}`"),
            )),
        };
    }
    if message.contains("'==='") {
        return hint(
            "Rhai compares with == (no type coercion)",
            "write == instead of ===".to_string(),
        );
    }
    if message.contains("'!=='") {
        return hint(
            "Rhai compares with != (no type coercion)",
            "write != instead of !==".to_string(),
        );
    }
    if message.contains("'++'") || message.contains("'--'") {
        let op = if message.contains("'++'") { '+' } else { '-' };
        return hint(
            "Rhai has no increment operators",
            format!("write `x {op}= 1` instead of `x{op}{op}`"),
        );
    }
    if message.contains("Unknown operator: '?'") {
        return hint(
            "Rhai has no ternary operator; `if` is an expression",
            "write `if c { a } else { b }` instead of `c ? a : b`".to_string(),
        );
    }
    let trimmed = line.trim_start();
    if line.contains("=>") {
        return hint(
            "closures are written with bars in Rhai",
            "write `|x| x * 2` instead of `(x) => x * 2` (and `|a, b| a - b` for two parameters)"
                .to_string(),
        );
    }
    if trimmed.starts_with("for (") || trimmed.starts_with("for(") {
        return hint(
            "Rhai loops over a range or an array",
            "write `for i in 0..n { ... }`, or `for x in items { ... }`".to_string(),
        );
    }
    if trimmed.starts_with("def ") || trimmed.starts_with("function ") {
        return hint(
            "functions are declared with fn and a body in braces",
            "write `fn name(x) { ... }`".to_string(),
        );
    }
    if has_word(line, "elif") {
        return hint(
            "Rhai writes else if",
            "write `else if` instead of `elif`".to_string(),
        );
    }
    if let Some(fixed) = f_string(line) {
        return Some((
            "Rhai has no f-strings; interpolation is in backtick strings".to_string(),
            format!("use backticks: {fixed}"),
        ));
    }
    if let Some(map) = brace_map(line, column) {
        return Some((
            "`{ ... }` is a block in Rhai; an object map is written #{ ... }".to_string(),
            format!("write {map}"),
        ));
    }
    if has_word(trimmed, "try") && (line.contains("= try") || line.contains("return try")) {
        return hint(
            "try is a statement in Rhai and has no value",
            "declare the variable first and assign inside: `let r = (); try { r = f(); } catch (e) { r = e; }`"
                .to_string(),
        );
    }
    if ["and", "or", "not"].iter().any(|w| has_word(line, w)) {
        return hint(
            "Rhai writes && for and, || for or, ! for not",
            "write && / || / ! instead of and / or / not".to_string(),
        );
    }
    if line.trim_end().ends_with(':')
        && ["if ", "else", "for ", "while "]
            .iter()
            .any(|w| trimmed.starts_with(w))
    {
        return hint(
            "Rhai blocks are in braces, not introduced by a colon",
            "write `if x { ... } else { ... }`".to_string(),
        );
    }
    None
}

/// The word in "'null' is a reserved keyword" (and "... reserved symbol").
fn reserved_word(message: &str) -> Option<&str> {
    let rest = message.strip_prefix('\'')?;
    let (word, tail) = rest.split_once('\'')?;
    tail.contains("reserved").then_some(word)
}

/// Whether `word` occurs in `line` as a whole word, outside a string.
fn has_word(line: &str, word: &str) -> bool {
    let code = without_strings(line);
    code.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .any(|w| w == word)
}

/// The line with the contents of its string literals blanked out, byte for byte: an index into
/// it is an index into the line, on a character boundary of both.
fn without_strings(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut quote = None;
    for c in line.chars() {
        match quote {
            Some(q) if c == q => {
                quote = None;
                out.push(c);
            }
            Some(_) => out.extend(std::iter::repeat_n(' ', c.len_utf8())),
            None => {
                if c == '"' || c == '`' || c == '\'' {
                    quote = Some(c);
                }
                out.push(c);
            }
        }
    }
    out
}

/// `f"n={n}"` on the line, rewritten as the backtick string `` `n=${n}` ``.
fn f_string(line: &str) -> Option<String> {
    let at = line.find("f\"").or_else(|| line.find("f'"))?;
    if at > 0 {
        let before = line[..at].chars().last()?;
        if before.is_alphanumeric() || before == '_' {
            return None;
        }
    }
    let quote = line[at + 1..].chars().next()?;
    let body_start = at + 2;
    let end = line[body_start..].find(quote)? + body_start;
    let body = &line[body_start..end];
    Some(format!("`{}`", body.replace('{', "${")))
}

/// A JavaScript object literal on the line (`{ owner: "acme" }`, not preceded by `#`), as the
/// Rhai map to write instead.
fn brace_map(line: &str, column: usize) -> Option<String> {
    let code = without_strings(line);
    let bytes = code.as_bytes();
    // The literal nearest before the error's column, else the first on the line.
    let mut best = None;
    for (i, b) in bytes.iter().enumerate() {
        if *b != b'{' || (i > 0 && bytes[i - 1] == b'#') {
            continue;
        }
        let after = code[i + 1..].trim_start();
        let key_end = after
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '"'))
            .unwrap_or(after.len());
        let is_map =
            key_end > 0 && after[key_end..].trim_start().starts_with(':') || after.starts_with('}');
        if is_map && (best.is_none() || i < column) {
            best = Some(i);
        }
    }
    let start = best?;
    let mut depth = 0usize;
    let mut end = line.len();
    for (i, b) in bytes.iter().enumerate().skip(start) {
        match b {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    end = i + 1;
                    break;
                }
            }
            _ => {}
        }
    }
    let literal = &line[start..end];
    if literal.trim() == "{}" || literal.replace(' ', "") == "{}" {
        return Some("#{} for an empty map".to_string());
    }
    Some(format!("#{literal}"))
}

// ---------------------------------------------------------------------------------------------
// Runtime errors
// ---------------------------------------------------------------------------------------------

/// A Rhai runtime error, reduced to what the diagnosis reads. Built from an `EvalAltResult`
/// (an uncaught error) or from the map Rhai gives a `catch` block (a caught one), so both get
/// the same diagnosis.
#[derive(Debug)]
pub(crate) enum Fault {
    VariableNotFound(String),
    /// `x.p` where `x`'s type has no property `p`: Rhai's message, which names both.
    DotExpr(String),
    FunctionNotFound(String),
    ArrayBounds {
        length: i64,
        index: i64,
    },
    StringBounds {
        length: i64,
        index: i64,
    },
    IndexingType(String),
    MismatchDataType {
        requested: String,
        actual: String,
    },
    Arithmetic(String),
    For,
    Constant(String),
    /// A closure given to a function uses a variable the call already holds (Rhai's "data
    /// race"): the function's name.
    DataRace(String),
    /// Anything else: only Rhai's message.
    Other(String),
}

impl Fault {
    /// The fault of a runtime error (`None` for a thrown value, a limit, a termination).
    pub(crate) fn of(e: &EvalAltResult) -> Option<Fault> {
        use EvalAltResult as E;
        Some(match e {
            E::ErrorInFunctionCall(_, _, inner, _) => return Fault::of(inner),
            E::ErrorVariableNotFound(v, _) => Fault::VariableNotFound(v.clone()),
            E::ErrorDotExpr(m, _) => Fault::DotExpr(m.clone()),
            E::ErrorPropertyNotFound(p, _) => Fault::DotExpr(format!("Property not found: {p}")),
            E::ErrorFunctionNotFound(s, _) => Fault::FunctionNotFound(s.clone()),
            E::ErrorArrayBounds(n, i, _) => Fault::ArrayBounds {
                length: *n as i64,
                index: *i,
            },
            E::ErrorStringBounds(n, i, _) => Fault::StringBounds {
                length: *n as i64,
                index: *i,
            },
            E::ErrorIndexingType(t, _) => Fault::IndexingType(t.clone()),
            E::ErrorMismatchDataType(r, a, _) => Fault::MismatchDataType {
                requested: r.clone(),
                actual: a.clone(),
            },
            E::ErrorArithmetic(m, _) => Fault::Arithmetic(m.clone()),
            E::ErrorFor(_) => Fault::For,
            E::ErrorAssignmentToConstant(v, _) | E::ErrorNonPureMethodCallOnConstant(v, _) => {
                Fault::Constant(v.clone())
            }
            E::ErrorDataRace(text, _) => Fault::DataRace(data_race_function(text)),
            E::ErrorRuntime(..)
            | E::ErrorTooManyOperations(_)
            | E::ErrorStackOverflow(_)
            | E::ErrorDataTooLarge(..)
            | E::ErrorTerminated(..)
            | E::ErrorParsing(..) => return None,
            other => {
                // Rhai's text without the position it appends: the error carries that itself.
                let text = other.to_string();
                let text = match text.rfind(" (line ") {
                    Some(at) if text.ends_with(')') => text[..at].to_string(),
                    _ => text,
                };
                Fault::Other(text)
            }
        })
    }

    /// The fault of the map Rhai builds for a caught system error: `error` (the variant's
    /// name), `message`, and the variant's fields.
    pub(crate) fn of_caught(map: &rhai::Map) -> Option<Fault> {
        let text = |key: &str| {
            map.get(key)
                .and_then(|v| v.clone().into_immutable_string().ok())
                .map(|s| s.to_string())
        };
        let int = |key: &str| map.get(key).and_then(|v| v.as_int().ok());
        let variant = text("error")?;
        let message = text("message")?;
        Some(match variant.as_str() {
            "ErrorVariableNotFound" => Fault::VariableNotFound(text("variable")?),
            "ErrorDotExpr" => Fault::DotExpr(message),
            "ErrorPropertyNotFound" => {
                Fault::DotExpr(format!("Property not found: {}", text("variable")?))
            }
            "ErrorFunctionNotFound" => Fault::FunctionNotFound(text("function")?),
            "ErrorArrayBounds" => Fault::ArrayBounds {
                length: int("length")?,
                index: int("index")?,
            },
            "ErrorStringBounds" => Fault::StringBounds {
                length: int("length")?,
                index: int("index")?,
            },
            "ErrorIndexingType" => Fault::IndexingType(text("type")?),
            "ErrorMismatchDataType" => Fault::MismatchDataType {
                requested: text("requested")?,
                actual: text("actual")?,
            },
            "ErrorArithmetic" => Fault::Arithmetic(message),
            "ErrorFor" => Fault::For,
            "ErrorAssignmentToConstant" | "ErrorNonPureMethodCallOnConstant" => {
                Fault::Constant(text("variable").or(text("function"))?)
            }
            "ErrorInFunctionCall" => Fault::of_text(&message),
            "ErrorDataRace" => Fault::DataRace(data_race_function(&message)),
            _ => Fault::Other(message),
        })
    }

    /// The fault of an error inside a function, from the text Rhai gives a `catch` for it
    /// ("Unknown property 'y' - ... (line 3, position 9)\nin call to function 'f'"): the
    /// errors a rule knows are recognised by their text.
    fn of_text(message: &str) -> Fault {
        let first = message.lines().next().unwrap_or_default();
        let first = match first.rfind(" (line ") {
            Some(at) => &first[..at],
            None => first,
        };
        if let Some(v) = first.strip_prefix("Variable not found: ") {
            return Fault::VariableNotFound(v.to_string());
        }
        if let Some(f) = first.strip_prefix("Function not found: ") {
            return Fault::FunctionNotFound(f.to_string());
        }
        if first.starts_with("Unknown property") {
            return Fault::DotExpr(first.to_string());
        }
        Fault::Other(message.to_string())
    }

    /// Where an error inside a function happened, from the text Rhai gives a `catch` for it.
    pub(crate) fn position_in_text(message: &str) -> Option<(usize, usize)> {
        let first = message.lines().next()?;
        let rest = &first[first.rfind(" (line ")? + " (line ".len()..];
        let (line, rest) = rest.split_once(", position ")?;
        let column = rest.strip_suffix(')')?;
        Some((line.parse().ok()?, column.parse().ok()?))
    }

    /// What the fault means, and what to write instead.
    pub(crate) fn diagnose(&self, known: &Known<'_>) -> Hint {
        match self {
            Fault::VariableNotFound(name) => variable_not_found(name),
            Fault::DotExpr(message) => dot_expr(message),
            Fault::FunctionNotFound(signature) => function_not_found(signature, known),
            Fault::ArrayBounds { length, index } => Hint::script(
                format!(
                    "array index {index} is out of bounds: the array has {length} item{}",
                    if *length == 1 { "" } else { "s" }
                ),
                "check `a.len()` before indexing, or use `a.get(i)`, which gives () when there is no such item",
            ),
            Fault::StringBounds { length, index } => Hint::script(
                format!("string index {index} is out of bounds: the string has {length} characters"),
                "check `s.len()` before indexing, or use `s.sub_string(start, count)`",
            ),
            Fault::IndexingType(t) if t == "()" => Hint::script(
                "the value indexed with [] is () (a missing field, or a call that returned nothing)",
                "check the value first: `if x != () { x[0] }`",
            ),
            Fault::IndexingType(t) => Hint::script(
                format!("{} cannot be indexed with []", a(&type_name(t))),
                "index arrays with integers (`a[0]`), maps with strings (`m[\"key\"]`) or `.` (`m.key`)",
            ),
            Fault::MismatchDataType { requested, actual } => {
                let (requested, actual) = (type_name(requested), type_name(actual));
                let action = if requested == "bool" {
                    "a condition must be true or false: compare explicitly, as in `if x != () { ... }` or `if n > 0 { ... }`".to_string()
                } else {
                    format!("give a {requested} here: convert with `to_string()`, `parse_int(s)`, `to_float()` or `to_int()`")
                };
                Hint::script(format!("expected {}, found {}", a(&requested), a(&actual)), action)
            }
            Fault::Arithmetic(message) => Hint::script(
                message.clone(),
                "check the operands first (a divisor must not be 0; results must fit in 64 bits)",
            ),
            Fault::For => Hint::script(
                "a for loop needs something to loop over",
                "loop over an array, a range (`for i in 0..n`), a string, or a map's `keys()`/`values()`",
            ),
            Fault::Constant(name) => Hint::script(
                format!("`{name}` is a constant and cannot change"),
                format!("declare it with `let {name} = ...;` instead of `const`"),
            ),
            Fault::DataRace(function) => Hint::script(
                format!("`{function}` cannot run here: a closure given to it uses a variable that the same call already holds (Rhai lends a variable to one user at a time)"),
                "give the value the call works on a name of its own first (`let keys = m.keys(); keys.filter(|k| m[k] > 1)`), or read what the closure needs before the call (`let n = a.len(); a.map(|x| x + n)`)",
            ),
            Fault::Other(message) => Hint::new(ErrorKind::ScriptError, message.clone(), None),
        }
    }
}

/// The function a data race is in, from Rhai's text ("argument #2 of function 'filter'"), or
/// `a function` when the text does not name one.
pub(crate) fn data_race_function(text: &str) -> String {
    text.split('\'')
        .nth(1)
        .filter(|name| !name.is_empty())
        .unwrap_or("a function")
        .to_string()
}

/// `Variable not found`: for a name from another language, the Rhai way.
pub(crate) fn variable_not_found(name: &str) -> Hint {
    let message = format!("Variable not found: {name}");
    let (why, action) = match name {
        "undefined" | "None" | "NULL" | "Null" | "nil" | "null" => (
            format!("Rhai has no {name}; the empty value is ()"),
            format!("use () instead of {name}: write `x == ()`, or `x ?? default`"),
        ),
        "True" | "TRUE" => (
            "Rhai's booleans are lowercase".to_string(),
            "write `true`".to_string(),
        ),
        "False" | "FALSE" => (
            "Rhai's booleans are lowercase".to_string(),
            "write `false`".to_string(),
        ),
        "console" => (
            "Rhai has no console".to_string(),
            "write `print(x)`; printed lines are the run's logs".to_string(),
        ),
        "JSON" => (
            "Rhai has no JSON object".to_string(),
            "values are already maps and arrays; for text write `m.to_json()` or `to_string(x)`"
                .to_string(),
        ),
        "Object" => (
            "Rhai has no Object".to_string(),
            "write `m.keys()`, `m.values()` or `m.len()` on the map itself".to_string(),
        ),
        "Math" => (
            "Rhai has no Math object".to_string(),
            "call the functions directly: `abs(x)`, `floor(x)`, `max(a, b)`, `x.to_float()`"
                .to_string(),
        ),
        "self" | "this" => (
            "there is no receiver here".to_string(),
            "pass the value as a parameter".to_string(),
        ),
        _ => {
            return Hint::script(
                message,
                format!("declare it before it is used: `let {name} = ...;` (a function's body sees only its parameters)"),
            )
        }
    };
    Hint::script(format!("{message}: {why}"), action)
}

/// `x.p` on a type without `p`: Rhai's message is "Unknown property 'p' - a getter is not
/// registered for type 'T'".
fn dot_expr(message: &str) -> Hint {
    let quoted = |after: &str| {
        let rest = message.split_once(after)?.1;
        let rest = rest.strip_prefix('\'')?;
        rest.split_once('\'').map(|(word, _)| word.to_string())
    };
    let property = quoted("property ").unwrap_or_default();
    let on = quoted("type ").unwrap_or_default();
    if on == "()" {
        return Hint::script(
            format!("`.{property}` is read from (), not from a map: the value before it is a field that does not exist, or a call that returned nothing"),
            format!("check the value first (`if x != () {{ x.{property} }}`), or write `x?.{property}`, which gives () instead of an error"),
        );
    }
    if matches!(property.as_str(), "length" | "size" | "count") && !on.is_empty() {
        return Hint::script(
            format!("{} has no property `{property}`", a(&type_name(&on))),
            "write `x.len()` for the number of items or characters",
        );
    }
    if on.is_empty() {
        return Hint::new(ErrorKind::ScriptError, message.to_string(), None);
    }
    Hint::script(
        format!(
            "a {} has no property `{property}`: only maps have fields",
            type_name(&on)
        ),
        format!("check what the value is (`type_of(x)`) before reading `.{property}`"),
    )
}

/// "a string", "an int", "()": a type name with its article.
fn a(type_name: &str) -> String {
    match type_name {
        "()" => "()".to_string(),
        t if t.starts_with(['a', 'e', 'i', 'o', 'u']) => format!("an {t}"),
        t => format!("a {t}"),
    }
}

/// Rhai's internal type names, as a script writes them.
fn type_name(rhai: &str) -> String {
    let rhai = rhai.trim().trim_start_matches('&');
    if rhai.contains("String") || rhai == "str" || rhai.ends_with("ImmutableString") {
        return "string".into();
    }
    match rhai {
        "i64" | "i32" | "INT" => "int",
        "f64" | "f32" | "FLOAT" => "float",
        "()" => "()",
        "bool" => "bool",
        "char" => "char",
        "array" | "rhai::Array" | "Array" => "array",
        "map" | "rhai::Map" | "Map" => "map",
        other => return other.rsplit("::").next().unwrap_or(other).to_string(),
    }
    .to_string()
}

/// The name and argument types of Rhai's "name (type, type)".
fn split_signature(signature: &str) -> (&str, Vec<String>) {
    let Some((name, rest)) = signature.split_once(" (") else {
        return (signature.trim(), Vec::new());
    };
    let inner = rest.strip_suffix(')').unwrap_or(rest);
    let types = if inner.trim().is_empty() {
        Vec::new()
    } else {
        inner.split(", ").map(type_name).collect()
    };
    (name.trim(), types)
}

fn is_operator(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| !(c.is_alphanumeric() || c == '_'))
}

/// Functions that take floats, which an int does not reach.
const FLOAT_FUNCTIONS: &[&str] = &[
    "sqrt",
    "exp",
    "ln",
    "log",
    "sin",
    "cos",
    "tan",
    "asin",
    "acos",
    "atan",
    "sinh",
    "cosh",
    "tanh",
    "floor",
    "ceiling",
    "round",
    "int",
    "fraction",
    "is_nan",
    "is_finite",
];

fn function_not_found(signature: &str, known: &Known<'_>) -> Hint {
    let (name, types) = split_signature(signature);
    let shown = types.iter().map(|t| a(t)).collect::<Vec<_>>().join(" and ");
    if let Some(tool) = known.registry.and_then(|r| r.get(name)) {
        if tool.function_name() == name {
            let mut hint = positional_call(tool, types.len());
            hint.tool = Some(tool.spec.name.clone());
            return hint;
        }
    }
    if is_operator(name) {
        if types.iter().any(|t| t == "()") {
            return Hint::script(
                format!("`{name}` is given {shown}: one side is a field the value does not have, or a call that returned nothing"),
                "check that the field exists, or give it a default: `(x.count ?? 0) + 1`",
            );
        }
        let has = |t: &str| types.iter().any(|x| x == t);
        if has("string") && (has("int") || has("float")) {
            return Hint::script(
                format!("`{name}` does not apply to {shown}"),
                "convert first: `parse_int(s)` or `parse_float(s)` turns text into a number, `n.to_string()` a number into text",
            );
        }
        return Hint::script(
            format!("`{name}` does not apply to {shown}"),
            "make both sides the same type first: `to_int()`, `to_float()`, `to_string()`",
        );
    }
    if (known.functions)(name) {
        if FLOAT_FUNCTIONS.contains(&name) && types.iter().any(|t| t == "int") {
            return Hint::script(
                format!("`{name}` takes a float, not an int"),
                format!("convert the int first: `{name}(x.to_float())`"),
            );
        }
        return Hint::script(
            format!("`{name}` exists, but not for {shown}"),
            format!("check the arguments of `{name}`: their number and types"),
        );
    }
    unknown_function(name, known.registry)
}

/// A call of a function that exists nowhere: a foreign habit (`forEach`, `parseInt`) gets the
/// Rhai way; any other name is an unknown tool, with the nearest tool's name when one is close.
/// `check` and the run both use it, so they say the same.
pub(crate) fn unknown_function(name: &str, registry: Option<&Registry>) -> Hint {
    if let Some(action) = foreign_function(name) {
        return Hint::script(
            format!("there is no function named `{name}` in Rhai"),
            action,
        );
    }
    match registry {
        Some(registry) => Hint::from_tool(registry.unknown(name, "tool or function")),
        None => Hint::new(
            ErrorKind::UnknownTool,
            format!("there is no tool or function named `{name}`"),
            None,
        ),
    }
}

/// The Rhai way of a function other languages have.
fn foreign_function(name: &str) -> Option<String> {
    Some(
        match name {
            "forEach" | "each" => "loop instead: `for x in items { ... }`",
            "length" | "size" | "count" => "write `x.len()`",
            "join" => "build the text in a loop, or `items.reduce(|s, x| if s == \"\" { `${x}` } else { `${s},${x}` }, \"\")`",
            "parseInt" | "int" | "Number" => "write `parse_int(s)` (or `x.to_int()` for a float)",
            "parseFloat" | "float" => "write `parse_float(s)` (or `x.to_float()` for an int)",
            "toString" | "str" | "String" => "write `x.to_string()`",
            "toUpperCase" | "upper" => "write `s.to_upper()`",
            "toLowerCase" | "lower" => "write `s.to_lower()`",
            "includes" | "has" => "write `items.contains(x)` (or `\"key\" in m` for a map)",
            "indexOf" | "index" => "write `items.index_of(x)`",
            "startsWith" | "startswith" => "write `s.starts_with(prefix)`",
            "endsWith" | "endswith" => "write `s.ends_with(suffix)`",
            "substring" | "substr" => "write `s.sub_string(start, count)`",
            "slice" => "write `items.extract(start, count)`",
            "append" => "write `items.push(x)`",
            "isArray" => "write `type_of(x) == \"array\"`",
            "hasOwnProperty" => "write `\"key\" in m`",
            "setTimeout" | "setInterval" => "write `sleep(seconds)`",
            "log" => "write `print(x)`",
            _ => return None,
        }
        .to_string(),
    )
}

/// A tool function given positional arguments (or none that it can use): it takes one map,
/// whose keys its input schema names.
pub(crate) fn positional_call(tool: &RegisteredTool, given: usize) -> Hint {
    let function = tool.function_name();
    let example = tool.map_example();
    Hint::new(
        ErrorKind::InvalidInput,
        format!(
            "`{function}` takes one object map of named arguments, as in {function}({example}); it is given {given} arguments"
        ),
        Some(format!("write {function}({example})")),
    )
}

// ---------------------------------------------------------------------------------------------
// The engine's own functions
// ---------------------------------------------------------------------------------------------

/// The names of the functions every engine has (the standard library and the engine's own), once
/// per process: what a diagnosis inside a running script compares a name against.
pub(crate) fn engine_functions() -> &'static HashSet<String> {
    static NAMES: std::sync::OnceLock<HashSet<String>> = std::sync::OnceLock::new();
    NAMES.get_or_init(|| {
        let engine = super::new_engine(&super::Limits::default(), super::RunControls::default());
        let mut names: HashSet<String> = engine
            .gen_fn_signatures(true)
            .iter()
            .filter_map(|sig| signature_name(sig))
            .collect();
        names.insert("tool".to_string());
        names.extend(KEYWORD_FUNCTIONS.iter().map(|f| f.to_string()));
        names
    })
}

/// Rhai's keyword functions, which no module registers: a closure that captures a variable is
/// a `curry` of an `Fn`, and `f.call(x)`, `type_of(x)`, `is_def_var("x")` are built in (`eval`
/// is switched off: calling it is an error).
pub(crate) const KEYWORD_FUNCTIONS: &[&str] = &[
    "call",
    "curry",
    "Fn",
    "type_of",
    "is_def_var",
    "is_def_fn",
    "is_shared",
    "print",
    "debug",
];

/// The function name in a signature such as `len(array: Array) -> int`.
pub(crate) fn signature_name(signature: &str) -> Option<String> {
    let head = signature.split('(').next()?;
    let name = head.rsplit(' ').next()?.trim();
    (!name.is_empty()).then(|| name.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_signatures() {
        assert_eq!(
            signature_name("len(array: Array) -> int").as_deref(),
            Some("len")
        );
        assert_eq!(
            signature_name("fn abs(x: int) -> int").as_deref(),
            Some("abs")
        );
        assert_eq!(signature_name("get$x(map: Map)").as_deref(), Some("get$x"));
    }

    #[test]
    fn object_literals_become_maps() {
        assert_eq!(
            brace_map("get_repo({ owner: \"acme\" })", 17).as_deref(),
            Some("#{ owner: \"acme\" }")
        );
        assert_eq!(brace_map("let m = #{ a: 1 };", 1), None);
        // Strings of many-byte characters before the literal keep every index on a boundary.
        assert_eq!(
            brace_map("let s = \"🕴é\"; f({ a: \"ü\" })", 20).as_deref(),
            Some("#{ a: \"ü\" }")
        );
        assert_eq!(brace_map("if x { y }", 1), None);
    }

    #[test]
    fn f_strings_become_backtick_strings() {
        assert_eq!(f_string("f\"n={n}\"").as_deref(), Some("`n=${n}`"));
        assert_eq!(f_string("let x = \"off\";"), None);
    }

    #[test]
    fn signatures_split_into_name_and_types() {
        let (name, types) = split_signature("+ ((), i64)");
        assert_eq!(
            (name, types),
            ("+", vec!["()".to_string(), "int".to_string()])
        );
        let (name, types) = split_signature(
            "get_repo (&str | ImmutableString | String, &str | ImmutableString | String)",
        );
        assert_eq!(name, "get_repo");
        assert_eq!(types, vec!["string", "string"]);
    }
}
