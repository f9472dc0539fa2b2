//! Conversions between script values and JSON. Integers stay integers; `()` is `null`.

use rhai::Dynamic;
use serde_json::Value;

/// A script value as JSON, or why it has none (a function pointer, a timestamp, a float that is
/// not a number: JSON has no NaN or infinity, and turning one silently into `null` would lose
/// it).
pub(crate) fn to_json(value: &Dynamic) -> Result<Value, String> {
    if super::memory::json_size(value, super::memory::MAX_JSON_BYTES).is_none() {
        return Err(format!(
            "its JSON would take more than {} MiB",
            super::memory::MAX_JSON_BYTES >> 20
        ));
    }
    if let Some(x) = non_finite(value) {
        return Err(format!(
            "the float {x} has no JSON form (JSON has no NaN or infinity)"
        ));
    }
    rhai::serde::from_dynamic::<Value>(value)
        .map_err(|e| format!("a {} value has no JSON form ({e})", value.type_name()))
}

/// The first float in `value` that is NaN or infinite.
fn non_finite(value: &Dynamic) -> Option<rhai::FLOAT> {
    if let Ok(x) = value.as_float() {
        return (!x.is_finite()).then_some(x);
    }
    if let Some(items) = value.read_lock::<rhai::Array>() {
        return items.iter().find_map(non_finite);
    }
    if let Some(map) = value.read_lock::<rhai::Map>() {
        return map.values().find_map(non_finite);
    }
    None
}

/// A JSON value as a script value. An integer beyond the script's 64-bit range (a `u64` above
/// `i64::MAX`) becomes the string of its digits — exact, where a float would silently lose
/// digits.
pub(crate) fn to_dynamic(value: &Value) -> Dynamic {
    let exact;
    let value = if has_huge_integer(value) {
        exact = huge_integers_as_strings(value);
        &exact
    } else {
        value
    };
    // Serialising a `serde_json::Value` into a `Dynamic` cannot fail: every JSON value has a
    // script form.
    rhai::serde::to_dynamic(value).unwrap_or(Dynamic::UNIT)
}

fn is_huge(n: &serde_json::Number) -> bool {
    n.as_i64().is_none() && n.as_u64().is_some()
}

fn has_huge_integer(value: &Value) -> bool {
    match value {
        Value::Number(n) => is_huge(n),
        Value::Array(items) => items.iter().any(has_huge_integer),
        Value::Object(map) => map.values().any(has_huge_integer),
        _ => false,
    }
}

fn huge_integers_as_strings(value: &Value) -> Value {
    match value {
        Value::Number(n) if is_huge(n) => Value::String(n.to_string()),
        Value::Array(items) => Value::Array(items.iter().map(huge_integers_as_strings).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), huge_integers_as_strings(v)))
                .collect(),
        ),
        other => other.clone(),
    }
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
    fn floats_without_a_json_form_are_refused() {
        for x in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let nested = Dynamic::from_array(vec![Dynamic::from(1_i64), Dynamic::from(x)]);
            let e = to_json(&nested).unwrap_err();
            assert!(e.contains("no JSON form"), "{e}");
        }
        assert_eq!(
            to_json(&Dynamic::from(1.5_f64)).unwrap(),
            serde_json::json!(1.5)
        );
    }

    /// One large string held many times is shared in the script, but not in JSON: such a
    /// value is refused before its JSON is built.
    #[test]
    fn a_value_whose_json_is_huge_is_refused() {
        let s = Dynamic::from("x".repeat(1 << 20));
        let many = Dynamic::from_array(vec![s; 300]);
        let e = to_json(&many).unwrap_err();
        assert!(e.contains("MiB"), "{e}");
    }

    #[test]
    fn integers_beyond_the_script_range_stay_exact() {
        let v =
            json!({"id": 18446744073709551615_u64, "small": 7, "list": [9223372036854775808_u64]});
        let d = to_dynamic(&v);
        let map = d.cast::<rhai::Map>();
        assert_eq!(
            map["id"].clone().into_string().unwrap(),
            "18446744073709551615"
        );
        assert!(map["small"].is_int());
        let list = map["list"].clone().into_array().unwrap();
        assert_eq!(
            list[0].clone().into_string().unwrap(),
            "9223372036854775808"
        );
    }

    #[test]
    fn unit_is_null() {
        assert_eq!(to_json(&Dynamic::UNIT).unwrap(), Value::Null);
    }
}
