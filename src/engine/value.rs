//! Conversions between script values and JSON. Integers stay integers; `()` is `null`.

use rhai::Dynamic;
use serde_json::Value;

/// A script value as JSON, or why it has none (a function pointer, a timestamp, ...).
pub(crate) fn to_json(value: &Dynamic) -> Result<Value, String> {
    rhai::serde::from_dynamic::<Value>(value)
        .map_err(|e| format!("a {} value has no JSON form ({e})", value.type_name()))
}

/// A JSON value as a script value.
pub(crate) fn to_dynamic(value: &Value) -> Dynamic {
    // Serialising a `serde_json::Value` into a `Dynamic` cannot fail: every JSON value has a
    // script form.
    rhai::serde::to_dynamic(value).unwrap_or(Dynamic::UNIT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn round_trip_keeps_integers() {
        let v = json!({"a": 1, "b": [1.5, "x", null, true], "c": {"d": -7}});
        let d = to_dynamic(&v);
        assert!(d.clone().cast::<rhai::Map>()["a"].is_int());
        assert_eq!(to_json(&d).unwrap(), v);
    }

    #[test]
    fn unit_is_null() {
        assert_eq!(to_json(&Dynamic::UNIT).unwrap(), Value::Null);
    }
}
