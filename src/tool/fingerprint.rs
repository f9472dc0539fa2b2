//! The catalog's fingerprint: for each tool, what changes how a call of it behaves, and none
//! of its prose. A paused run keeps it, and a resume names each tool whose fingerprint changed.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{Approval, BodySource, Registry};
use crate::store::{CatalogPrint, ToolPrint};

/// The fingerprint of every tool of `registry`.
pub(crate) fn fingerprint(registry: &Registry) -> CatalogPrint {
    let tools = registry.specs().map(|spec| {
        let (script, server) = match &spec.source {
            Some(BodySource::Script(sha)) => (Some(sha.clone()), None),
            Some(BodySource::McpServer(sha)) => (None, Some(sha.clone())),
            None => (None, None),
        };
        let print = ToolPrint {
            effect: spec.effect.as_str().to_string(),
            approval: match spec.approval {
                Approval::Never => "never",
                Approval::Always => "always",
            }
            .to_string(),
            result: spec.result.as_str().to_string(),
            input: schema_sha256(&spec.input_schema),
            output: spec.output_schema.as_ref().map(schema_sha256),
            nested: spec.nested.clone(),
            version: spec.version.clone(),
            script,
            server,
            origin: spec.origin.clone(),
            guard: registry.guard().is_active().then(|| {
                crate::json::sha256_hex(format!("{}\n{:?}", registry.guard().summary(), spec.guard))
            }),
        };
        (spec.name.clone(), print)
    });
    CatalogPrint(tools.collect::<BTreeMap<_, _>>())
}

/// SHA-256 of a schema's canonical JSON, without its prose: the `description`, `title` and
/// `$comment` strings and the `examples` of every subschema (a value the schema holds as data,
/// under `const`, `enum` or `default`, is kept whole).
fn schema_sha256(schema: &Value) -> String {
    crate::json::jcs_value_sha256(&without_prose(schema))
}

fn without_prose(schema: &Value) -> Value {
    match schema {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(key, value)| match key.as_str() {
                    "description" | "title" | "$comment" => !value.is_string(),
                    "examples" => false,
                    _ => true,
                })
                .map(|(key, value)| {
                    let kept = match (key.as_str(), value) {
                        ("const" | "enum" | "default", _) => value.clone(),
                        // Maps of names to schemas: the names are data, each value a schema.
                        (
                            "properties" | "patternProperties" | "$defs" | "definitions"
                            | "dependentSchemas",
                            Value::Object(named),
                        ) => Value::Object(
                            named
                                .iter()
                                .map(|(name, schema)| (name.clone(), without_prose(schema)))
                                .collect(),
                        ),
                        _ => without_prose(value),
                    };
                    (key.clone(), kept)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_prose).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prose_is_left_out_and_data_is_kept() {
        let a = json!({"type": "object", "description": "A", "title": "T",
            "properties": {"description": {"type": "string", "description": "x"}},
            "examples": [{"description": "e"}]});
        let b = json!({"type": "object", "description": "B",
            "properties": {"description": {"type": "string", "description": "y"}}});
        assert_eq!(schema_sha256(&a), schema_sha256(&b));
        // A property named `description` is a property, not prose.
        let c = json!({"type": "object", "properties": {}});
        assert_ne!(schema_sha256(&a), schema_sha256(&c));
        let named = |name: &str| json!({"properties": {name: {"type": "string"}}});
        assert_ne!(
            schema_sha256(&named("examples")),
            schema_sha256(&named("other"))
        );
        assert_ne!(schema_sha256(&named("title")), schema_sha256(&c));
        // A const's text is data.
        let d = json!({"const": {"description": "one"}});
        let e = json!({"const": {"description": "two"}});
        assert_ne!(schema_sha256(&d), schema_sha256(&e));
        let f = json!({"type": "string"});
        let g = json!({"type": "integer"});
        assert_ne!(schema_sha256(&f), schema_sha256(&g));
    }
}
