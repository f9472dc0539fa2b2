//! JSON Schemas generated from types: the one way the crate writes the schema of a data format
//! it reads or prints (a tool's arguments, a run's outcome, a list of runs), so that a schema
//! and the data it describes come from the same type.
//!
//! The schemas are plain: every subschema inline (no `$ref` or `$defs`), no `$schema`, root
//! `title` or root `description`, and draft-07 keywords only (schemars' draft-07 settings), which the clients of our
//! MCP server (the MCP Inspector, Python's `mcp`, rmcp) and `jsonschema` all read the same way.

use schemars::generate::{Contract, SchemaSettings};
use schemars::JsonSchema;
use serde_json::{Map, Value};

/// The schema of what `T` reads: arguments and other input, as deserialised (a field with a
/// default is not required).
pub(crate) fn input<T: JsonSchema>() -> Map<String, Value> {
    generate::<T>(Contract::Deserialize)
}

/// The schema of what `T` prints: outputs, as serialised (a field left out when empty is not
/// required).
pub(crate) fn output<T: JsonSchema>() -> Map<String, Value> {
    generate::<T>(Contract::Serialize)
}

fn generate<T: JsonSchema>(contract: Contract) -> Map<String, Value> {
    let settings = SchemaSettings::draft07().with(|s| {
        s.inline_subschemas = true;
        s.meta_schema = None;
        s.contract = contract;
    });
    let schema = settings.into_generator().into_root_schema_for::<T>();
    let mut map = match schema.to_value() {
        Value::Object(map) => map,
        // `true` (any JSON) as an object, and `false` (nothing) as the object that says so.
        Value::Bool(true) => Map::new(),
        _ => Map::from_iter([("not".to_string(), Value::Object(Map::new()))]),
    };
    // The Rust type's name and docs are no part of the format (its fields' docs are).
    map.remove("title");
    map.remove("description");
    // An object's properties are listed even when there are none: some clients require the
    // key, and a stray argument is then named as unexpected.
    if map.get("type") == Some(&Value::from("object")) && !map.contains_key("properties") {
        map.insert("properties".to_string(), Value::Object(Map::new()));
    }
    map
}
