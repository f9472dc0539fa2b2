//! What a run keeps of the catalog it started with: a fingerprint of each tool, made of what
//! changes a call's behaviour (its effect, approval, result policy, schemas, nested tools, the
//! body of a script tool, the command of an MCP server, the version a Rust tool's builder
//! sets) and never of prose (descriptions, titles). A resume compares the fingerprints and
//! names each tool that changed and how.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The fingerprint of one tool: each part a name or a SHA-256, so that two can be compared
/// part by part and a change named.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct ToolPrint {
    /// `read`, `write`, `idempotent` or `external`.
    pub effect: String,
    /// `never` or `always`.
    pub approval: String,
    /// The result policy's name (`auto`, `page`, ...).
    pub result: String,
    /// SHA-256 of the input schema, its prose left out.
    pub input: String,
    /// SHA-256 of the output schema, its prose left out, when it has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// A composite's nested tools.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nested: Vec<String>,
    /// The version a Rust tool's builder set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// SHA-256 of a script tool's body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub script: Option<String>,
    /// SHA-256 of an MCP server's command and environment.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// Where the tool comes from (`mcp:SERVER/TOOL`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
    /// SHA-256 of the guard's rules and of how the guard reads the tool's calls, when a guard
    /// decides them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guard: Option<String>,
}

/// The fingerprints of a catalog's tools, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CatalogPrint(pub BTreeMap<String, ToolPrint>);

impl CatalogPrint {
    /// What changed from `self` (the catalog a run started with) to `now`, a line per tool:
    /// a tool removed, or a part of its fingerprint changed. A tool added is no change: the
    /// run never called it. Empty when nothing that matters changed.
    pub fn changes(&self, now: &CatalogPrint) -> Vec<String> {
        let mut out = Vec::new();
        for (name, then) in &self.0 {
            let Some(now) = now.0.get(name) else {
                out.push(format!("`{name}` is gone"));
                continue;
            };
            let mut parts = Vec::new();
            let named = |what: &str, a: &str, b: &str| format!("its {what} ({a} → {b})");
            if then.effect != now.effect {
                parts.push(named("effect", &then.effect, &now.effect));
            }
            if then.approval != now.approval {
                parts.push(named("approval", &then.approval, &now.approval));
            }
            if then.result != now.result {
                parts.push(named("result policy", &then.result, &now.result));
            }
            if then.input != now.input {
                parts.push("its input schema".to_string());
            }
            if then.output != now.output {
                parts.push("its output schema".to_string());
            }
            if then.nested != now.nested {
                parts.push(format!(
                    "its nested tools ({} → {})",
                    shown_list(&then.nested),
                    shown_list(&now.nested)
                ));
            }
            if then.version != now.version {
                parts.push(named(
                    "version",
                    then.version.as_deref().unwrap_or("none"),
                    now.version.as_deref().unwrap_or("none"),
                ));
            }
            if then.script != now.script {
                parts.push("its script body".to_string());
            }
            if then.server != now.server {
                parts.push("its MCP server's command".to_string());
            }
            if then.guard != now.guard {
                parts.push("the guard's rules over it".to_string());
            }
            if then.origin != now.origin {
                parts.push(named(
                    "origin",
                    then.origin.as_deref().unwrap_or("none"),
                    now.origin.as_deref().unwrap_or("none"),
                ));
            }
            if !parts.is_empty() {
                out.push(format!("`{name}`: {} changed", parts.join(", ")));
            }
        }
        out
    }
}

fn shown_list(names: &[String]) -> String {
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn print(effect: &str) -> ToolPrint {
        ToolPrint {
            effect: effect.into(),
            approval: "never".into(),
            result: "auto".into(),
            input: "i".into(),
            ..ToolPrint::default()
        }
    }

    #[test]
    fn changes_name_the_tool_and_each_part() {
        let then = CatalogPrint(BTreeMap::from([
            ("a".to_string(), print("read")),
            ("b".to_string(), print("write")),
            ("c".to_string(), print("read")),
        ]));
        let mut now = then.clone();
        assert!(then.changes(&now).is_empty());
        now.0.remove("c");
        now.0.insert("d".into(), print("read"));
        let b = now.0.get_mut("b").unwrap();
        b.approval = "always".into();
        b.script = Some("s".into());
        b.version = Some("2".into());
        let changes = then.changes(&now);
        assert_eq!(
            changes,
            vec![
                "`b`: its approval (never → always), its version (none → 2), its script body changed",
                "`c` is gone",
            ]
        );
    }

    #[test]
    fn a_print_of_a_later_version_with_more_parts_still_parses() {
        let parsed: CatalogPrint = serde_json::from_str(
            r#"{"t":{"effect":"read","approval":"never","result":"auto","input":"x","later":1}}"#,
        )
        .unwrap();
        assert_eq!(parsed.0["t"].effect, "read");
    }
}
