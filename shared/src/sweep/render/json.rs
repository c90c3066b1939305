//! Compact JSON of YAML values, mapping keys in document order (a `serde_json::Map` may sort
//! them, depending on features other crates turn on), floats in their shortest round-trip
//! form, so the params JSON reads back to the very float the file held.

use serde_norway::Value;

use super::untagged;

pub(crate) fn write_json(value: &Value, out: &mut String) -> Result<(), String> {
    match untagged(value) {
        Value::Null => out.push_str("null"),
        Value::Bool(flag) => out.push_str(if *flag { "true" } else { "false" }),
        Value::Number(number) => {
            if let Some(whole) = number.as_i64() {
                out.push_str(&whole.to_string());
            } else if let Some(whole) = number.as_u64() {
                out.push_str(&whole.to_string());
            } else {
                write_float(number.as_f64().unwrap_or(f64::NAN), out)?;
            }
        }
        Value::String(text) => out.push_str(&json_string(text)),
        Value::Sequence(items) => {
            out.push('[');
            for (position, item) in items.iter().enumerate() {
                if position > 0 {
                    out.push(',');
                }
                write_json(item, out)?;
            }
            out.push(']');
        }
        Value::Mapping(map) => {
            out.push('{');
            for (position, (key, item)) in map.iter().enumerate() {
                if position > 0 {
                    out.push(',');
                }
                out.push_str(&json_string(&key_string(key)?));
                out.push(':');
                write_json(item, out)?;
            }
            out.push('}');
        }
        Value::Tagged(_) => unreachable!("untagged() removed every tag"),
    }
    Ok(())
}

/// A mapping key as a JSON object key; collections cannot be one.
pub(crate) fn key_string(key: &Value) -> Result<String, String> {
    match untagged(key) {
        Value::String(text) => Ok(text.clone()),
        Value::Sequence(_) | Value::Mapping(_) => {
            Err("a mapping used as a parameter value needs scalar keys".to_owned())
        }
        Value::Number(number) => Ok(number.to_string()),
        Value::Bool(flag) => Ok(flag.to_string()),
        _ => Ok("null".to_owned()),
    }
}

/// A float's JSON text (`0.001`, `1e-5`, `2.0`): serde_json's shortest round-trip form.
pub(crate) fn write_float(number: f64, out: &mut String) -> Result<(), String> {
    if !number.is_finite() {
        return Err(format!("`{number}` cannot be a parameter value: JSON has no NaN or infinity"));
    }
    out.push_str(&serde_json::Number::from_f64(number).map(|n| n.to_string()).unwrap_or_default());
    Ok(())
}

/// A string's JSON text: quoted and escaped.
pub(crate) fn json_string(text: &str) -> String {
    // Serialising a &str to JSON cannot fail.
    serde_json::to_string(text).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_read_back_bit_for_bit() {
        for number in [0.1, 1e-5, 2.0, 0.00026057902620338835, 1.7976931348623157e308, 5e-324, -0.0] {
            let mut text = String::new();
            write_float(number, &mut text).unwrap();
            let back: f64 = serde_json::from_str(&text).unwrap();
            assert_eq!(back.to_bits(), number.to_bits(), "{text}");
        }
        assert!(write_float(f64::INFINITY, &mut String::new()).is_err());
    }
}
