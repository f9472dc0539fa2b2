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
#[cfg_attr(not(feature = "mcp"), allow(dead_code))]
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
    drop_number_formats(&mut map);
    // An object's properties are listed even when there are none: some clients require the
    // key, and a stray argument is then named as unexpected.
    if map.get("type") == Some(&Value::from("object")) && !map.contains_key("properties") {
        map.insert("properties".to_string(), Value::Object(Map::new()));
    }
    map
}

/// The numeric `format`s schemars writes (`uint`, `int64`, `double`, ...) are no JSON Schema
/// format: clients ignore them at best, and they would change the published schemas (and the
/// catalog hash that paused runs are resumed under) without changing what they accept.
fn drop_number_formats(map: &mut Map<String, Value>) {
    const NUMBER_FORMATS: &[&str] = &[
        "int", "int8", "int16", "int32", "int64", "int128", "uint", "uint8", "uint16", "uint32",
        "uint64", "uint128", "float", "double",
    ];
    if map
        .get("format")
        .and_then(Value::as_str)
        .is_some_and(|f| NUMBER_FORMATS.contains(&f))
    {
        map.remove("format");
    }
    for value in map.values_mut() {
        match value {
            Value::Object(inner) => drop_number_formats(inner),
            Value::Array(items) => {
                for item in items.iter_mut().filter_map(Value::as_object_mut) {
                    drop_number_formats(item);
                }
            }
            _ => {}
        }
    }
}
