//! Steps 7 and 9: arguments and results checked against the schemas compiled with the registry.

use serde_json::Value;

use crate::error::{ErrorKind, ToolError};
use crate::tool::RegisteredTool;

/// Step 7: the arguments must be an object and match the input schema. The message names the
/// JSON pointer and the rule, and may quote the arguments (they are the script's own).
pub(crate) fn check_input(tool: &RegisteredTool, args: &Value) -> Result<(), ToolError> {
    if !args.is_object() {
        return Err(ToolError::new(
            ErrorKind::InvalidInput,
            format!(
                "`{}` takes one object map, as in {}(#{{...}}); it was given {}",
                tool.spec.name,
                tool.function_name(),
                json_type(args)
            ),
        ));
    }
    let problems: Vec<String> = tool
        .input
        .iter_errors(args)
        .take(3)
        .map(|e| {
            format!(
                "at {} ({}): {}",
                pointer(&e.instance_path().to_string()),
                e.kind().keyword(),
                e
            )
        })
        .collect();
    if problems.is_empty() {
        return Ok(());
    }
    Err(ToolError::new(
        ErrorKind::InvalidInput,
        format!(
            "arguments of `{}` do not match its input schema: {}",
            tool.spec.name,
            problems.join("; ")
        ),
    ))
}

/// Step 9: the result must match the output schema. The invalid value is never quoted: only
/// where it is wrong and which rule it breaks.
pub(crate) fn check_output(tool: &RegisteredTool, result: &Value) -> Result<(), ToolError> {
    let Some(validator) = &tool.output else {
        return Ok(());
    };
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
            e.message.contains("`/id`") && e.message.contains("minimum"),
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
