//! Steps 7 and 9: arguments and results checked against the schemas compiled with the registry.

use serde_json::Value;

use crate::error::{ErrorKind, ToolError};
use crate::tool::RegisteredTool;

/// Step 7: the arguments must be an object and match the input schema. The message names each
/// wrong field as the script wrote it (`args.filter.state`) and what it must be (the allowed
/// values of an enum, the expected type, the missing field, the allowed fields), and may quote
/// the arguments (they are the script's own); the next action says what to write.
pub(crate) fn check_input(tool: &RegisteredTool, args: &Value) -> Result<(), ToolError> {
    if !args.is_object() {
        let example = tool.map_example();
        let function = tool.function_name();
        return Err(ToolError::new(
            ErrorKind::InvalidInput,
            format!(
                "`{}` takes one object map, as in {function}({example}); it was given {}",
                tool.spec.name,
                json_type(args)
            ),
        )
        .with_next_action(format!("write {function}({example})")));
    }
    // Valid arguments, the usual case, are checked without the errors' iterator and its
    // allocation.
    if tool.input.is_valid(args) {
        return Ok(());
    }
    let problems: Vec<(String, Option<String>)> = tool
        .input
        .iter_errors(args)
        .take(3)
        .map(|e| explain(&e, &tool.spec.input_schema))
        .collect();
    if problems.is_empty() {
        return Ok(());
    }
    let action = problems.iter().find_map(|(_, action)| action.clone());
    let messages: Vec<&str> = problems.iter().map(|(m, _)| m.as_str()).collect();
    let error = ToolError::new(
        ErrorKind::InvalidInput,
        format!(
            "arguments of `{}` do not match its input schema: {}",
            tool.spec.name,
            messages.join("; ")
        ),
    );
    Err(match action {
        Some(action) => error.with_next_action(action),
        None => error,
    })
}

/// One violation of an input schema: what is wrong where, and what to write instead.
fn explain(e: &jsonschema::ValidationError<'_>, schema: &Value) -> (String, Option<String>) {
    use jsonschema::error::ValidationErrorKind as K;
    let at = field_path(&e.instance_path().to_string());
    let given = e.instance();
    match e.kind() {
        K::Enum { options } => {
            let values = options.as_array().cloned().unwrap_or_default();
            allowed_values(&at, &values, false, given)
        }
        K::Constant { expected_value } => {
            allowed_values(&at, std::slice::from_ref(&**expected_value), false, given)
        }
        K::Type { kind } => {
            let expected = type_names(kind);
            (
                format!(
                    "`{at}` must be {expected}; it is {} ({})",
                    given,
                    json_type(given)
                ),
                Some(format!("give `{at}` {expected}")),
            )
        }
        K::Required { property } => {
            let name = property.as_str().unwrap_or_default();
            (
                format!("`{at}` is missing the required field `{name}`"),
                Some(format!("add `{name}: ..` to `{at}`")),
            )
        }
        K::AdditionalProperties { unexpected } => {
            let parent = e.schema_path().to_string();
            let parent = parent
                .strip_suffix("/additionalProperties")
                .unwrap_or(&parent);
            let allowed: Vec<String> = resolve(schema, parent)
                .and_then(|s| s.get("properties"))
                .and_then(Value::as_object)
                .map(|p| p.keys().cloned().collect())
                .unwrap_or_default();
            let list = |names: &[String]| {
                names
                    .iter()
                    .map(|n| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let mut action = format!("remove {}", list(unexpected));
            if let Some(first) = unexpected.first() {
                if let Some(near) = closest(first, allowed.iter().map(String::as_str)) {
                    action = format!("write `{near}` instead of `{first}`");
                }
            }
            (
                format!(
                    "`{at}` has no field {}; its fields are {}",
                    list(unexpected),
                    if allowed.is_empty() {
                        "none".to_string()
                    } else {
                        list(&allowed)
                    }
                ),
                Some(action),
            )
        }
        K::AnyOf { context } | K::OneOfNotValid { context } => {
            // Each alternative failed; when each is a plain value or type (an enum or null, as
            // `Option<Enum>` comes out), name them all.
            let mut values = Vec::new();
            let mut types = Vec::new();
            let mut simple = true;
            for branch in context {
                for inner in branch {
                    match inner.kind() {
                        K::Enum { options } => {
                            values.extend(options.as_array().cloned().unwrap_or_default())
                        }
                        K::Constant { expected_value } => values.push((**expected_value).clone()),
                        K::Type { kind } => types.push(type_names(kind)),
                        _ => simple = false,
                    }
                }
            }
            if simple && !values.is_empty() {
                let nullable = types.iter().any(|t| t == "()");
                return allowed_values(&at, &values, nullable, given);
            }
            if simple && !types.is_empty() {
                let expected = types.join(" or ");
                return (
                    format!(
                        "`{at}` must be {expected}; it is {} ({})",
                        given,
                        json_type(given)
                    ),
                    Some(format!("give `{at}` {expected}")),
                );
            }
            match context.iter().flatten().next() {
                Some(inner) => explain(inner, schema),
                None => (format!("`{at}`: {e}"), None),
            }
        }
        _ => (format!("`{at}` ({}): {e}", e.kind().keyword()), None),
    }
}

/// "`args.state` must be one of ..." with the closest allowed value as the next action.
fn allowed_values(
    at: &str,
    values: &[Value],
    nullable: bool,
    given: &Value,
) -> (String, Option<String>) {
    let mut shown: Vec<String> = values.iter().map(Value::to_string).collect();
    shown.dedup();
    if nullable {
        shown.push("()".to_string());
    }
    let message = format!("`{at}` must be one of {}; it is {given}", shown.join(", "));
    let texts: Vec<String> = values
        .iter()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    let action = match given
        .as_str()
        .and_then(|g| closest(g, texts.iter().map(String::as_str)))
    {
        Some(near) => format!(
            "write `{}: \"{near}\"`",
            at.rsplit('.').next().unwrap_or(at)
        ),
        None => format!("use one of {}", shown.join(", ")),
    };
    (message, Some(action))
}

/// The candidate nearest to `name`, if one is close enough to be a likely slip.
fn closest<'a>(name: &str, candidates: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (name.chars().count() / 2).max(2);
    candidates
        .map(|c| {
            (
                crate::tool::edit_distance(&name.to_lowercase(), &c.to_lowercase()),
                c,
            )
        })
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// "a string", "an int", "a string or ()", for a schema's `type`.
fn type_names(kind: &jsonschema::error::TypeKind) -> String {
    use jsonschema::error::TypeKind;
    let name = |t: &jsonschema::JsonType| match t.to_string().as_str() {
        "integer" => "an int".to_string(),
        "number" => "a number".to_string(),
        "string" => "a string".to_string(),
        "boolean" => "a bool".to_string(),
        "array" => "an array".to_string(),
        "object" => "an object map `#{...}`".to_string(),
        "null" => "()".to_string(),
        other => other.to_string(),
    };
    match kind {
        TypeKind::Single(t) => name(t),
        TypeKind::Multiple(set) => set
            .iter()
            .map(|t| name(&t))
            .collect::<Vec<_>>()
            .join(" or "),
    }
}

/// A JSON pointer into the arguments, as the script writes it: `/filter/state` is
/// `args.filter.state`, `/ids/0` is `args.ids[0]`.
fn field_path(pointer: &str) -> String {
    let mut out = "args".to_string();
    for raw in pointer.split('/').skip(1) {
        let segment = raw.replace("~1", "/").replace("~0", "~");
        if segment.parse::<usize>().is_ok() {
            out.push_str(&format!("[{segment}]"));
        } else if segment.chars().all(|c| c.is_alphanumeric() || c == '_') {
            out.push('.');
            out.push_str(&segment);
        } else {
            out.push_str(&format!("[{segment:?}]"));
        }
    }
    out
}

/// The sub-schema at a schema path, following local `$ref`s on the way.
fn resolve<'a>(root: &'a Value, path: &str) -> Option<&'a Value> {
    let mut at = root;
    for raw in path.split('/').skip(1) {
        let segment = raw.replace("~1", "/").replace("~0", "~");
        if segment == "$ref" {
            let target = at.get("$ref")?.as_str()?.strip_prefix('#')?;
            at = root.pointer(target)?;
            continue;
        }
        at = match at {
            Value::Array(items) => items.get(segment.parse::<usize>().ok()?)?,
            other => other.get(&segment)?,
        };
    }
    Some(at)
}

/// Step 9: the result must match the output schema. The invalid value is never quoted: only
/// where it is wrong and which rule it breaks.
pub(crate) fn check_output(tool: &RegisteredTool, result: &Value) -> Result<(), ToolError> {
    let Some(validator) = &tool.output else {
        return Ok(());
    };
    if validator.is_valid(result) {
        return Ok(());
    }
    let declared = declared_keys(tool.spec.output_schema.as_ref());
    let problems: Vec<String> = validator
        .iter_errors(result)
        .take(3)
        .map(|e| {
            let at = hidden(&e.instance_path().to_string(), result, &declared);
            format!(
                "at {} the `{}` rule fails (schema path {})",
                pointer(&at),
                e.kind().keyword(),
                e.schema_path()
            )
        })
        .collect();
    if problems.is_empty() {
        return Ok(());
    }
    Err(ToolError::new(
        ErrorKind::InvalidOutput,
        format!(
            "`{}` returned a result that does not match its output schema: {}",
            tool.spec.name,
            problems.join("; ")
        ),
    ))
}

/// Every property name an output schema declares (under `properties` or `required`, at any
/// depth): the tool's author wrote them, so they may be shown.
fn declared_keys(schema: Option<&Value>) -> std::collections::HashSet<String> {
    fn walk(value: &Value, out: &mut std::collections::HashSet<String>) {
        match value {
            Value::Object(map) => {
                if let Some(Value::Object(properties)) = map.get("properties") {
                    out.extend(properties.keys().cloned());
                }
                if let Some(Value::Array(required)) = map.get("required") {
                    out.extend(
                        required
                            .iter()
                            .filter_map(|k| k.as_str().map(str::to_string)),
                    );
                }
                map.values().for_each(|v| walk(v, out));
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = std::collections::HashSet::new();
    if let Some(schema) = schema {
        walk(schema, &mut out);
    }
    out
}

/// A JSON pointer into an invalid value with every map key the schema does not declare replaced
/// by `*`: such a key is the value's own data (a secret, say), and the value is never shown.
fn hidden(path: &str, value: &Value, declared: &std::collections::HashSet<String>) -> String {
    let mut at = value;
    let mut out = String::new();
    for raw in path.split('/').skip(1) {
        let segment = raw.replace("~1", "/").replace("~0", "~");
        out.push('/');
        match at {
            Value::Array(items) => {
                out.push_str(raw);
                at = segment
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| items.get(i))
                    .unwrap_or(&Value::Null);
            }
            Value::Object(map) => {
                if declared.contains(&segment) {
                    out.push_str(raw);
                } else {
                    out.push('*');
                }
                at = map.get(&segment).unwrap_or(&Value::Null);
            }
            _ => out.push('*'),
        }
    }
    out
}

fn pointer(path: &str) -> String {
    if path.is_empty() {
        "the top level".to_string()
    } else {
        format!("`{path}`")
    }
}

pub(crate) fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null (`()`)",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object map",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tool::{Effect, Registry, Tool};
    use serde_json::json;

    fn registered() -> Registry {
        let tool = Tool::builder("get_user", Effect::Read)
            .input_schema(json!({
                "type": "object",
                "properties": {"id": {"type": "integer", "minimum": 1}},
                "required": ["id"],
                "additionalProperties": false
            }))
            .output_schema(json!({
                "type": "object",
                "properties": {"secret": {"type": "integer"}},
                "required": ["secret"]
            }))
            .handler(|_| async { Ok(Value::Null) });
        Registry::builder().tool(tool).build().unwrap()
    }

    #[test]
    fn input_errors_name_pointer_and_rule() {
        let r = registered();
        let t = r.get("get_user").unwrap();
        assert!(check_input(t, &json!({"id": 3})).is_ok());
        let e = check_input(t, &json!({"id": 0})).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidInput);
        assert!(
            e.message.contains("`args.id`") && e.message.contains("minimum"),
            "{}",
            e.message
        );
        let e = check_input(t, &json!({})).unwrap_err();
        assert!(e.message.contains("required"), "{}", e.message);
        let e = check_input(t, &json!([1])).unwrap_err();
        assert!(e.message.contains("one object map"), "{}", e.message);
    }

    #[test]
    fn output_errors_never_show_the_value() {
        let r = registered();
        let t = r.get("get_user").unwrap();
        assert!(check_output(t, &json!({"secret": 1})).is_ok());
        let e = check_output(t, &json!({"secret": "hunter2-password"})).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidOutput);
        assert!(
            e.message.contains("`/secret`") && e.message.contains("type"),
            "{}",
            e.message
        );
        assert!(!e.message.contains("hunter2"), "{}", e.message);
    }

    /// The keys of an invalid value are its data too: a key the schema does not declare is
    /// never quoted in the pointer.
    #[test]
    fn output_errors_hide_the_value_s_own_keys() {
        let tool = Tool::builder("t", Effect::Read)
            .output_schema(json!({
                "type": "object",
                "properties": {"m": {"type": "object", "additionalProperties": {"type": "integer"}}}
            }))
            .handler(|_| async { Ok(Value::Null) });
        let r = Registry::builder().tool(tool).build().unwrap();
        let e = check_output(r.get("t").unwrap(), &json!({"m": {"SECRET-KEY": "x"}})).unwrap_err();
        assert!(e.message.contains("`/m/*`"), "{}", e.message);
        assert!(!e.message.contains("SECRET"), "{}", e.message);
        let declared = declared_keys(Some(&json!({"properties": {"a": {}}})));
        let value = json!({"a": [{"k": 1}]});
        assert_eq!(hidden("/a/0/k", &value, &declared), "/a/0/*");
    }
}
