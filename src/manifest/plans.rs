//! The plan settings of a manifest (see docs/plans.md): `plan_result` and `plan = "stop"` on a
//! `[[tool]]`; `plan_results = { tool = "expr" }` and `plan_stop = ["tool"]` on an `[[mcp]]`
//! server. An expression that does not compile is an error with the manifest's file and line.

use std::collections::BTreeMap;

use crate::mcp::McpServerSpec;
use crate::plan::{PlanResult, PlanSpec};
use crate::tool::ToolSpec;

/// Sets a `[[tool]]`'s plan settings on its spec.
pub(super) fn apply_to_tool(
    spec: &mut ToolSpec,
    result: Option<String>,
    plan: Option<String>,
) -> Result<(), String> {
    spec.plan = settings(&spec.name, result.as_deref(), plan.as_deref())?;
    Ok(())
}

/// A tool's plan settings: its `plan_result` compiled, and `plan = "stop"`.
fn settings(tool: &str, result: Option<&str>, plan: Option<&str>) -> Result<PlanSpec, String> {
    let mut settings = PlanSpec::default();
    if let Some(text) = result {
        settings.result =
            Some(PlanResult::compile(text).map_err(|message| format!("tool `{tool}`: {message}"))?);
    }
    match plan {
        None => {}
        Some("stop") => settings.stop = true,
        Some(other) => {
            return Err(format!(
            "tool `{tool}`: `plan` takes \"stop\" (the plan ends at its first call), not {other:?}"
        ))
        }
    }
    Ok(settings)
}

/// Sets an `[[mcp]]` server's plan settings on its spec, by the server's tool names.
pub(super) fn apply_to_server(
    spec: &mut McpServerSpec,
    results: BTreeMap<String, String>,
    stop: Vec<String>,
) -> Result<(), String> {
    for (tool, text) in &results {
        let mut settings = settings(tool, Some(text), None)?;
        settings.stop = stop.contains(tool);
        spec.plan.insert(tool.clone(), settings);
    }
    for tool in stop {
        spec.plan.entry(tool).or_default().stop = true;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broken_expression_or_plan_value_is_an_error_naming_the_tool() {
        let e = settings("refund", Some("#{ a: "), None).unwrap_err();
        assert!(
            e.contains("tool `refund`") && e.contains("plan_result"),
            "{e}"
        );
        let e = settings("refund", None, Some("halt")).unwrap_err();
        assert!(e.contains("\"stop\""), "{e}");
        let ok = settings("refund", Some("args.x"), Some("stop")).unwrap();
        assert!(ok.stop && ok.result.is_some());
    }
}
