//! A plan as a person reads it: one planned call a line, its arguments as the script wrote them
//! (`+ issue_refund #{ amount_cents: 719, order_id: 17 }`).

use std::fmt::Write;

use serde_json::Value;

use super::{CallStatus, Plan, PlanStatus, WORLD_AS_IT_IS};

/// A JSON value as a Rhai literal: `#{ a: 1 }`, `[1, 2]`, `"text"`, `()`.
pub(crate) fn rhai_literal(value: &Value) -> String {
    let mut out = String::new();
    write_literal(value, &mut out);
    out
}

fn write_literal(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("()"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&n.to_string()),
        // JSON's escapes are Rhai's for every string a value holds.
        Value::String(s) => out.push_str(&Value::String(s.clone()).to_string()),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_literal(item, out);
            }
            out.push(']');
        }
        Value::Object(map) if map.is_empty() => out.push_str("#{}"),
        Value::Object(map) => {
            out.push_str("#{ ");
            for (i, (key, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                if is_identifier(key) {
                    out.push_str(key);
                } else {
                    out.push_str(&Value::String(key.clone()).to_string());
                }
                out.push_str(": ");
                write_literal(item, out);
            }
            out.push_str(" }");
        }
    }
}

fn is_identifier(key: &str) -> bool {
    let mut chars = key.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The whole plan: a header, its calls, how it ended and how to apply it.
pub(super) fn plan(plan: &Plan) -> String {
    let mut out = String::new();
    let planned = plan.planned().count();
    let refused = plan.calls.len() - planned;
    let _ = writeln!(
        out,
        "plan {}: {planned} call{} to make{}, from {} read{}",
        if plan.plan_id.is_empty() {
            "(not stored)"
        } else {
            &plan.plan_id
        },
        if planned == 1 { "" } else { "s" },
        if refused > 0 {
            format!(", {refused} refused")
        } else {
            String::new()
        },
        plan.reads.len(),
        if plan.reads.len() == 1 { "" } else { "s" },
    );
    for call in &plan.calls {
        let args = rhai_literal(&call.args);
        match call.status {
            CallStatus::Planned => {
                let _ = write!(out, "+ {} {args}", call.tool);
            }
            CallStatus::Refused => {
                let why = call
                    .error
                    .as_ref()
                    .map_or(String::new(), |e| format!(" ({}: {})", e.kind, e.message));
                let _ = write!(out, "! {} {args}   refused{why}", call.tool);
            }
        }
        if let Some(asks) = &call.asks {
            let _ = write!(out, "   [{asks}: applying the plan approves it]");
        }
        if call.stop {
            let _ = write!(out, "   [the plan stops here]");
        }
        out.push('\n');
    }
    if plan.calls.is_empty() {
        out.push_str("(no call to make)\n");
    }
    match (plan.status, &plan.error) {
        (PlanStatus::Incomplete, _) => out.push_str(
            "the plan is incomplete: a tool that says `plan = \"stop\"` ends it; what comes after depends on what that call really does\n",
        ),
        (_, Some(error)) => {
            let kind = error.get("kind").and_then(Value::as_str).unwrap_or("error");
            let message = error.get("message").and_then(Value::as_str).unwrap_or("");
            let _ = writeln!(out, "the script would fail: {kind}: {message}");
        }
        (_, None) => {
            if let Some(value) = &plan.value {
                let _ = writeln!(out, "value under the plan: {}", rhai_literal(value));
            }
        }
    }
    let _ = writeln!(out, "note: {WORLD_AS_IT_IS}");
    if !plan.plan_id.is_empty() {
        let _ = writeln!(
            out,
            "apply it with: toolscript apply {} (it expires in {} s)",
            plan.plan_id,
            ((plan.expires_ms - crate::store::now_ms()) / 1000).max(0)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_read_as_rhai_literals() {
        assert_eq!(
            rhai_literal(&json!({"order_id": 17, "amount_cents": 719})),
            "#{ amount_cents: 719, order_id: 17 }"
        );
        assert_eq!(
            rhai_literal(&json!({"a b": [1, "x\"y", null, true], "e": {}})),
            r#"#{ "a b": [1, "x\"y", (), true], e: #{} }"#
        );
    }
}
