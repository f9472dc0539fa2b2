//! Conversions between script values and JSON. Integers stay integers; `()` is `null`.

use rhai::Dynamic;
use serde_json::Value;

/// A script value as JSON, or why it has none (a function pointer, a timestamp, a float that is
/// not a number: JSON has no NaN or infinity, and turning one silently into `null` would lose
/// it).
pub(crate) fn to_json(value: &Dynamic) -> Result<Value, String> {
    // Built directly, sized as it is built; what it cannot build is sized first, then left to
    // the deserializer (or refused below: a value with a float that is not a number).
    let mut room = super::memory::MAX_JSON_BYTES;
    if let Some(json) = plain_json(value, &mut room) {
        return Ok(json);
    }
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

/// The JSON of a value made only of `()`, booleans, integers, finite floats, strings, arrays
/// and maps, built directly: what [`rhai::serde::from_dynamic`] builds, at a fraction of the
/// cost (every tool call's arguments come through here). `None` for anything else (a
/// character, a shared value, a blob...), which the deserializer handles, and for a value
/// whose JSON would take more than `room` bytes as [`super::memory::json_size`] counts them
/// (`room` is what is left of it).
fn plain_json(value: &Dynamic, room: &mut usize) -> Option<Value> {
    let mut take = |bytes: usize| {
        *room = room.checked_sub(bytes)?;
        Some(())
    };
    if value.is_shared() {
        return None;
    }
    if let Some(text) = value.read_lock::<rhai::ImmutableString>() {
        take(text.len() + 2)?;
        return Some(Value::String(text.as_str().to_owned()));
    }
    if let Some(items) = value.read_lock::<rhai::Array>() {
        take(items.len() + 2)?;
        return items
            .iter()
            .map(|item| plain_json(item, room))
            .collect::<Option<Vec<Value>>>()
            .map(Value::Array);
    }
    if let Some(map) = value.read_lock::<rhai::Map>() {
        take(map.keys().map(|k| k.len() + 4).sum::<usize>() + 2)?;
        // Entry by entry: collecting a map sorts a vector of its entries first.
        let mut object = serde_json::Map::new();
        for (k, v) in map.iter() {
            object.insert(k.as_str().to_owned(), plain_json(v, room)?);
        }
        return Some(Value::Object(object));
    }
    take(24)?;
    if value.is_unit() {
        return Some(Value::Null);
    }
    if let Ok(b) = value.as_bool() {
        return Some(Value::Bool(b));
    }
    if let Ok(i) = value.as_int() {
        return Some(Value::from(i));
    }
    if let Ok(x) = value.as_float() {
        return serde_json::Number::from_f64(x).map(Value::Number);
    }
    None
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

/// A JSON value as a script value, built directly: what [`rhai::serde::to_dynamic`] builds
/// (every tool call's result comes through here), without going through a serializer. An
/// integer beyond the script's 64-bit range (a `u64` above `i64::MAX`) becomes the string of
/// its digits — exact, where a float would silently lose digits.
pub(crate) fn to_dynamic(value: &Value) -> Dynamic {
    match value {
        Value::Null => Dynamic::UNIT,
        Value::Bool(b) => Dynamic::from_bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Dynamic::from_int(i),
            (None, _) if n.is_u64() => Dynamic::from(n.to_string()),
            (None, Some(x)) => Dynamic::from_float(x),
            // Not reached: every number without arbitrary precision is one or the other.
            (None, None) => Dynamic::from(n.to_string()),
        },
        Value::String(text) => Dynamic::from(rhai::ImmutableString::from(text.as_str())),
        Value::Array(items) => Dynamic::from_array(items.iter().map(to_dynamic).collect()),
        Value::Object(map) => {
            // Entry by entry: collecting a map sorts a vector of its entries first.
            let mut object = rhai::Map::new();
            for (k, v) in map {
                object.insert(k.as_str().into(), to_dynamic(v));
            }
            Dynamic::from_map(object)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
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

    /// The direct path counts a value's size as `json_size` does: a value just under the
    /// limit is built, one just over it is refused, nested or not.
    #[test]
    fn the_direct_path_is_bounded_as_the_size_check_is() {
        let limit = 1000;
        for value in [
            Dynamic::from("x".repeat(400)),
            Dynamic::from_array(vec![Dynamic::from("y".repeat(100)); 5]),
            Dynamic::from_map(
                (0..20)
                    .map(|i| (format!("k{i}").into(), Dynamic::from(i64::from(i))))
                    .collect(),
            ),
        ] {
            let size = crate::engine::memory::json_size(&value, usize::MAX).unwrap();
            assert!(size < limit, "{size}");
            assert!(plain_json(&value, &mut size.to_owned()).is_some());
            assert!(plain_json(&value, &mut (size - 1)).is_none());
            assert_eq!(crate::engine::memory::json_size(&value, size - 1), None);
        }
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

    /// The direct JSON of `value`, whatever its size.
    fn plain(value: &Dynamic) -> Option<Value> {
        plain_json(value, &mut usize::MAX.to_owned())
    }

    /// The value with every integer beyond `i64` written as its digits, as the script sees it.
    fn huge_integers_as_strings(value: &Value) -> Value {
        match value {
            Value::Number(n) if n.as_i64().is_none() && n.is_u64() => Value::String(n.to_string()),
            Value::Array(items) => {
                Value::Array(items.iter().map(huge_integers_as_strings).collect())
            }
            Value::Object(map) => Value::Object(
                map.iter()
                    .map(|(k, v)| (k.clone(), huge_integers_as_strings(v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>()
                .prop_map(|x| serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)),
            Just(json!(1.0)),
            Just(json!(-0.0)),
            ".{0,6}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 40, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::btree_map(".{0,4}", inner, 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// The direct conversions build exactly what rhai's serde conversions build, both ways.
        #[test]
        fn the_direct_conversions_are_the_serde_ones(value in json()) {
            let direct = to_dynamic(&value);
            let exact = huge_integers_as_strings(&value);
            let serde = rhai::serde::to_dynamic(&exact).unwrap();
            prop_assert_eq!(format!("{direct:?}"), format!("{serde:?}"));
            prop_assert_eq!(direct.type_name(), serde.type_name());
            let back = rhai::serde::from_dynamic::<Value>(&direct).unwrap();
            prop_assert_eq!(plain(&direct), Some(back.clone()));
            prop_assert_eq!(to_json(&direct).unwrap(), back);
        }
    }

    /// What the direct path leaves to the deserializer still converts as before.
    #[test]
    fn characters_and_shared_values_go_through_the_deserializer() {
        let c = Dynamic::from('x');
        assert!(plain(&c).is_none());
        assert_eq!(to_json(&c).unwrap(), json!("x"));
        let shared = Dynamic::from_array(vec![Dynamic::from(1_i64)]).into_shared();
        assert!(plain(&shared).is_none());
        // Whatever the deserializer makes of a shared value, the conversion still does.
        let serde = rhai::serde::from_dynamic::<Value>(&shared).map_err(|e| e.to_string());
        assert_eq!(to_json(&shared).ok(), serde.ok());
        let inner = Dynamic::from_array(vec![Dynamic::from('y'), Dynamic::from(2_i64)]);
        assert_eq!(to_json(&inner).unwrap(), json!(["y", 2]));
    }

    #[test]
    fn unit_is_null() {
        assert_eq!(to_json(&Dynamic::UNIT).unwrap(), Value::Null);
    }
}
