//! A tool's cache settings, as its spec declares them, and the registry's rules over them: a
//! cache is for reads, its scope paths name arguments the input schema can have or values of
//! the run's context, and `invalidates` names tools that exist.

use std::time::Duration;

use serde_json::Value;

use super::{Effect, RegisteredTool, ToolSpec};
use crate::error::Error;

/// Where a scope value is read from: the call's arguments or the run's context, then a path of
/// object keys into it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ScopePath {
    /// `args.a.b`: the call's arguments.
    Args(Vec<String>),
    /// `context.a.b`: the run's context value.
    Context(Vec<String>),
}

impl ScopePath {
    /// Parses `args.KEY[.KEY...]` or `context.KEY[.KEY...]`.
    pub(crate) fn parse(text: &str) -> Result<ScopePath, String> {
        let mut parts = text.split('.');
        let root = parts.next().unwrap_or_default();
        let keys: Vec<String> = parts.map(str::to_string).collect();
        let bad = || {
            format!(
                "the cache scope `{text}` is not a path: write `args.NAME` (an argument of the call) or `context.NAME` (a value of the run's context), with `.` between nested keys"
            )
        };
        if keys.is_empty() || keys.iter().any(String::is_empty) {
            return Err(bad());
        }
        match root {
            "args" => Ok(ScopePath::Args(keys)),
            "context" => Ok(ScopePath::Context(keys)),
            _ => Err(bad()),
        }
    }

    /// The value at this path in `args` or `context`; `null` where there is none.
    pub(crate) fn value_in(&self, args: &Value, context: Option<&Value>) -> Value {
        let (mut at, keys) = match self {
            ScopePath::Args(keys) => (Some(args), keys),
            ScopePath::Context(keys) => (context, keys),
        };
        for key in keys {
            at = at.and_then(|v| v.get(key));
        }
        at.cloned().unwrap_or(Value::Null)
    }
}

/// Whether an object described by `schema` can hold a value at `keys`: `false` only where the
/// schema says so (a key that is not among its `properties` when `additionalProperties` is
/// `false`, or a value that is not an object on the way).
pub(crate) fn schema_can_have(schema: &Value, keys: &[String]) -> bool {
    let Some((key, rest)) = keys.split_first() else {
        return true;
    };
    let Some(object) = schema.as_object() else {
        // `true` or a schema that is not an object lets anything through.
        return schema != &Value::Bool(false);
    };
    if let Some(ty) = object.get("type").and_then(Value::as_str) {
        if ty != "object" {
            return false;
        }
    }
    match object.get("properties").and_then(|p| p.get(key)) {
        Some(property) => schema_can_have(property, rest),
        None => object.get("additionalProperties") != Some(&Value::Bool(false)),
    }
}

/// The cache rules of one tool, checked when the registry is built.
pub(super) fn check_own(spec: &ToolSpec) -> Result<(), Error> {
    let name = spec.name.as_str();
    let rule = |message: String| Err(Error::registry(name, message));
    if spec.cache_ttl.is_none() && !spec.cache_scope.is_empty() {
        return rule("`cache_scope` without `cache_ttl`: give the entries a lifetime".into());
    }
    if let Some(ttl) = spec.cache_ttl {
        if spec.effect != Effect::Read {
            return rule(format!(
                "a cache is for reads only, and this is a {} tool: remove its `cache_ttl`",
                spec.effect
            ));
        }
        if ttl == Duration::ZERO {
            return rule("`cache_ttl` must be greater than zero".into());
        }
    }
    for text in &spec.cache_scope {
        let path = ScopePath::parse(text).map_err(|m| Error::registry(name, m))?;
        if let ScopePath::Args(keys) = &path {
            if !schema_can_have(&spec.input_schema, keys) {
                return rule(format!(
                    "the cache scope `{text}` names an argument its input schema does not allow: name one of its properties"
                ));
            }
        }
    }
    if spec.effect == Effect::Read && !spec.invalidates.is_empty() {
        return rule(
            "`invalidates` is for tools that are not reads: a read changes nothing to drop".into(),
        );
    }
    Ok(())
}

/// The rules between tools: every tool `invalidates` names exists.
pub(super) fn check_between(
    tools: &[RegisteredTool],
    index: &crate::sync::FastMap<String, usize>,
) -> Result<(), Error> {
    for tool in tools {
        for named in &tool.spec.invalidates {
            if !index.contains_key(named) {
                return Err(Error::registry(
                    &tool.spec.name,
                    format!("`invalidates` names `{named}`, which is no tool of the catalog"),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn keys(path: &str) -> Vec<String> {
        match ScopePath::parse(path).unwrap() {
            ScopePath::Args(k) | ScopePath::Context(k) => k,
        }
    }

    #[test]
    fn scope_paths_parse_or_say_what_to_write() {
        assert_eq!(
            ScopePath::parse("args.account").unwrap(),
            ScopePath::Args(vec!["account".into()])
        );
        assert_eq!(
            ScopePath::parse("context.tenant.id").unwrap(),
            ScopePath::Context(vec!["tenant".into(), "id".into()])
        );
        for bad in [
            "",
            "args",
            "args.",
            "ctx.tenant",
            "args..a",
            ".a",
            "context",
        ] {
            let e = ScopePath::parse(bad).unwrap_err();
            assert!(e.contains("`args.NAME`"), "{bad}: {e}");
        }
    }

    #[test]
    fn values_are_read_from_args_or_context_and_null_when_missing() {
        let args = json!({"account": "a1", "deep": {"x": 2}});
        let context = json!({"tenant": "t"});
        let at = |p: &str| ScopePath::parse(p).unwrap().value_in(&args, Some(&context));
        assert_eq!(at("args.account"), json!("a1"));
        assert_eq!(at("args.deep.x"), json!(2));
        assert_eq!(at("args.missing"), Value::Null);
        assert_eq!(at("context.tenant"), json!("t"));
        let none = ScopePath::parse("context.tenant")
            .unwrap()
            .value_in(&args, None);
        assert_eq!(none, Value::Null);
    }

    #[test]
    fn a_schema_refuses_only_what_it_rules_out() {
        let closed = json!({"type": "object", "properties": {"a": {"type": "string"},
            "o": {"type": "object", "properties": {"b": {}}, "additionalProperties": false}},
            "additionalProperties": false});
        assert!(schema_can_have(&closed, &keys("args.a")));
        assert!(schema_can_have(&closed, &keys("args.o.b")));
        assert!(!schema_can_have(&closed, &keys("args.z")));
        assert!(!schema_can_have(&closed, &keys("args.o.z")));
        // A string has no keys.
        assert!(!schema_can_have(&closed, &keys("args.a.b")));
        let open = json!({"type": "object"});
        assert!(schema_can_have(&open, &keys("args.anything.deep")));
        assert!(schema_can_have(&json!(true), &keys("args.x")));
        assert!(!schema_can_have(&json!(false), &keys("args.x")));
    }
}
