//! Redaction paths: the arguments and result fields of a tool that are never kept or handed
//! back (`args.password`, `result.ssn`, `result.contacts[*].email`, `result.*.token`). The
//! script and the tool see the real values; everything the run keeps or hands back sees
//! `"[redacted]"`: the values a path names are masked by value from the moment the dispatch
//! path sees them, and replaced where they sit in what the run records of the call itself.

use serde_json::Value;

use super::Mask;

/// What a redacted value is replaced with.
pub const REDACTED: &str = "[redacted]";

/// Which side of a call a path starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The call's arguments.
    Args,
    /// The call's result.
    Result,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    /// A map's field.
    Key(String),
    /// Every item of an array, or every value of a map (`[*]`, `.*`).
    Any,
}

/// One redaction path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedactPath {
    text: String,
    side: Side,
    steps: Vec<Step>,
}

impl std::fmt::Display for RedactPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl RedactPath {
    /// Parses `args.a.b`, `result.items[*].email`, `result.*.token`.
    ///
    /// # Errors
    ///
    /// What is wrong with the path.
    pub fn parse(text: &str) -> Result<RedactPath, String> {
        let bad = |why: &str| format!("redaction path `{text}`: {why}");
        let (side, rest) = if let Some(rest) = text.strip_prefix("args") {
            (Side::Args, rest)
        } else if let Some(rest) = text.strip_prefix("result") {
            (Side::Result, rest)
        } else {
            return Err(bad("it starts with `args` or `result`"));
        };
        let mut steps = Vec::new();
        let mut rest = rest;
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix("[*]") {
                steps.push(Step::Any);
                rest = after;
            } else if let Some(after) = rest.strip_prefix('.') {
                let end = after.find(['.', '[']).unwrap_or(after.len());
                let name = &after[..end];
                if name.is_empty() {
                    return Err(bad("a field's name is empty"));
                }
                steps.push(if name == "*" {
                    Step::Any
                } else {
                    Step::Key(name.to_string())
                });
                rest = &after[end..];
            } else {
                return Err(bad("after a name comes `.name`, `.*` or `[*]`"));
            }
        }
        if side == Side::Args && steps.is_empty() {
            return Err(bad("redact fields of the arguments, not the whole of them"));
        }
        Ok(RedactPath {
            text: text.to_string(),
            side,
            steps,
        })
    }

    /// The side it starts from.
    pub fn side(&self) -> Side {
        self.side
    }

    /// Masks, in `mask`, every value it names in `value` (the side it starts from).
    pub fn mask_values(&self, value: &Value, mask: &Mask) {
        visit(value, &self.steps, &mut |leaf| add_leaves(leaf, mask));
    }

    /// Replaces every value it names in `value` with `"[redacted]"`.
    pub fn replace(&self, value: &mut Value) {
        replace(value, &self.steps);
    }

    /// Checks it against the schema of its side: a path no value the schema allows can have
    /// is an error (a schema that says nothing takes any path).
    ///
    /// # Errors
    ///
    /// Where the path leaves what the schema allows.
    pub fn check(&self, schema: Option<&Value>) -> Result<(), String> {
        let mut schema = match schema {
            Some(schema) => schema,
            None => return Ok(()),
        };
        for (i, step) in self.steps.iter().enumerate() {
            let at = || {
                let shown: Vec<String> = self.steps[..i]
                    .iter()
                    .map(|s| match s {
                        Step::Key(k) => format!(".{k}"),
                        Step::Any => "[*]".to_string(),
                    })
                    .collect();
                format!(
                    "{}{}",
                    if self.side == Side::Args {
                        "args"
                    } else {
                        "result"
                    },
                    shown.concat()
                )
            };
            let kind = schema.get("type").and_then(Value::as_str);
            let next = match step {
                Step::Key(name) => {
                    if kind.is_some_and(|k| k != "object") {
                        return Err(format!(
                            "redaction path `{self}`: `{}` is a {} in the tool's schema, which has no field `{name}`",
                            at(),
                            kind.unwrap_or_default()
                        ));
                    }
                    let field = schema.get("properties").and_then(|p| p.get(name));
                    match field {
                        Some(field) => Some(field),
                        None if schema.get("additionalProperties") == Some(&Value::Bool(false)) => {
                            return Err(format!(
                                "redaction path `{self}`: the tool's schema of `{}` has no field `{name}`",
                                at()
                            ))
                        }
                        None => schema.get("additionalProperties").filter(|s| s.is_object()),
                    }
                }
                Step::Any => match kind {
                    Some("array") => schema.get("items"),
                    Some("object") => schema.get("additionalProperties").filter(|s| s.is_object()),
                    Some(other) => {
                        return Err(format!(
                            "redaction path `{self}`: `{}` is a {other} in the tool's schema: it has no items",
                            at()
                        ))
                    }
                    None => None,
                },
            };
            match next {
                Some(next) => schema = next,
                None => return Ok(()),
            }
        }
        Ok(())
    }
}

/// Calls `found` with every value `steps` lead to from `value`.
fn visit<'a>(value: &'a Value, steps: &[Step], found: &mut impl FnMut(&'a Value)) {
    let Some((step, rest)) = steps.split_first() else {
        found(value);
        return;
    };
    match (step, value) {
        (Step::Key(k), Value::Object(map)) => {
            if let Some(v) = map.get(k) {
                visit(v, rest, found);
            }
        }
        (Step::Any, Value::Array(items)) => items.iter().for_each(|v| visit(v, rest, found)),
        (Step::Any, Value::Object(map)) => map.values().for_each(|v| visit(v, rest, found)),
        _ => {}
    }
}

fn replace(value: &mut Value, steps: &[Step]) {
    let Some((step, rest)) = steps.split_first() else {
        *value = Value::String(REDACTED.to_string());
        return;
    };
    match (step, value) {
        (Step::Key(k), Value::Object(map)) => {
            if let Some(v) = map.get_mut(k) {
                replace(v, rest);
            }
        }
        (Step::Any, Value::Array(items)) => items.iter_mut().for_each(|v| replace(v, rest)),
        (Step::Any, Value::Object(map)) => map.values_mut().for_each(|v| replace(v, rest)),
        _ => {}
    }
}

/// Masks every string of `value` (and the text of its numbers, which a script may turn into
/// a string).
fn add_leaves(value: &Value, mask: &Mask) {
    match value {
        Value::String(s) => {
            mask.add(s, REDACTED);
        }
        Value::Number(n) => {
            mask.add(&n.to_string(), REDACTED);
        }
        Value::Array(items) => items.iter().for_each(|v| add_leaves(v, mask)),
        Value::Object(map) => map.values().for_each(|v| add_leaves(v, mask)),
        Value::Bool(_) | Value::Null => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths_parse_find_replace_and_check() {
        for bad in [
            "x.a",
            "args",
            "args.",
            "args..a",
            "result[0]",
            "args.a[1]",
            "resultx",
        ] {
            assert!(RedactPath::parse(bad).is_err(), "{bad}");
        }
        let p = RedactPath::parse("result.contacts[*].email").unwrap();
        let mut v = json!({"contacts": [{"email": "a@b.example", "n": 1}, {"email": "c@d.example"}], "x": "a@b.example"});
        let mask = Mask::default();
        p.mask_values(&v, &mask);
        assert_eq!(mask.len(), 2);
        p.replace(&mut v);
        assert_eq!(v["contacts"][0]["email"], "[redacted]");
        assert_eq!(v["contacts"][1]["email"], "[redacted]");
        assert_eq!(v["x"], "a@b.example", "replaced only where the path points");
        assert!(mask.holds(&v), "but masked by value everywhere");
        let any = RedactPath::parse("result.*.token").unwrap();
        let mut v = json!({"a": {"token": "t0ken-1"}, "b": {"token": 12345}});
        any.mask_values(&v, &mask);
        any.replace(&mut v);
        assert_eq!(
            v,
            json!({"a": {"token": "[redacted]"}, "b": {"token": "[redacted]"}})
        );
        assert_eq!(mask.text("id 12345"), "id [redacted]");

        let schema = json!({"type": "object", "properties": {"password": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}}, "additionalProperties": false});
        assert!(RedactPath::parse("args.password")
            .unwrap()
            .check(Some(&schema))
            .is_ok());
        assert!(RedactPath::parse("args.tags[*]")
            .unwrap()
            .check(Some(&schema))
            .is_ok());
        let e = RedactPath::parse("args.pasword")
            .unwrap()
            .check(Some(&schema))
            .unwrap_err();
        assert!(e.contains("no field `pasword`"), "{e}");
        let e = RedactPath::parse("args.password.x")
            .unwrap()
            .check(Some(&schema))
            .unwrap_err();
        assert!(e.contains("is a string"), "{e}");
        assert!(RedactPath::parse("result.anything")
            .unwrap()
            .check(None)
            .is_ok());
    }
}
