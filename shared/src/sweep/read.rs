//! Typed reads of single YAML values, each failing with the key path and what was expected,
//! and the helpers that name keys and values in messages.

use serde_norway::{Mapping, Value};

use super::error::{invalid, SweepError};

/// Refuses any key of `map` outside `allowed` (and `ignored`, accepted for compatibility).
/// `context` completes "unknown key `x` in ...".
pub(crate) fn check_keys(
    map: &Mapping,
    parent: &str,
    allowed: &[&str],
    ignored: &[&str],
    context: &str,
) -> Result<(), SweepError> {
    for key in map.keys() {
        let name = key_text(key);
        let known = key.as_str().is_some_and(|k| allowed.contains(&k) || ignored.contains(&k));
        if !known {
            return Err(invalid(
                join(parent, &name),
                format!("unknown key `{name}` in {context}; allowed: {}", allowed.join(", ")),
            ));
        }
    }
    Ok(())
}

pub(crate) fn string(value: &Value, path: &str) -> Result<String, SweepError> {
    match value {
        Value::String(text) if !text.trim().is_empty() => Ok(text.clone()),
        Value::String(_) => Err(invalid(path, "expected a non-empty string, found an empty one")),
        other => Err(invalid(path, format!("expected a string, found {}", describe(other)))),
    }
}

pub(crate) fn mapping<'a>(value: &'a Value, path: &str) -> Result<&'a Mapping, SweepError> {
    value.as_mapping().ok_or_else(|| invalid(path, format!("expected a mapping, found {}", describe(value))))
}

pub(crate) fn boolean(value: &Value, path: &str) -> Result<bool, SweepError> {
    value.as_bool().ok_or_else(|| invalid(path, format!("expected true or false, found {}", describe(value))))
}

/// Any integer YAML can hold, widened so that signed and unsigned ranges both fit.
pub(crate) fn integer(value: &Value, path: &str) -> Result<i128, SweepError> {
    let number = match value {
        Value::Number(number) => number.as_i64().map(i128::from).or(number.as_u64().map(i128::from)),
        _ => None,
    };
    number.ok_or_else(|| invalid(path, format!("expected an integer, found {}", describe(value))))
}

/// An integer in `min..=max`, converted to the target type.
pub(crate) fn integer_in<T: TryFrom<i128>>(
    value: &Value,
    path: &str,
    min: i128,
    max: i128,
    expected: &str,
) -> Result<T, SweepError> {
    let number = integer(value, path)?;
    if number < min || number > max {
        return Err(invalid(path, format!("expected {expected}, found {number}")));
    }
    T::try_from(number).map_err(|_| invalid(path, format!("expected {expected}, found {number}")))
}

/// A positive integer such as `max_runs` or `run_cap`.
pub(crate) fn positive(value: &Value, path: &str) -> Result<u64, SweepError> {
    integer_in(value, path, 1, i128::from(u64::MAX), "a positive integer")
}

/// Any finite number, integer or float.
pub(crate) fn number(value: &Value, path: &str) -> Result<f64, SweepError> {
    match value.as_f64() {
        Some(number) if number.is_finite() => Ok(number),
        _ => Err(invalid(path, format!("expected a finite number, found {}", describe(value)))),
    }
}

/// Looks up a key, treating an explicit `null` like an absent key.
pub(crate) fn get<'a>(map: &'a Mapping, key: &str) -> Option<&'a Value> {
    map.get(key).filter(|value| !value.is_null())
}

/// A mapping key as it appears in a dotted path.
pub(crate) fn key_text(key: &Value) -> String {
    match key {
        Value::String(text) => text.clone(),
        Value::Number(number) => number.to_string(),
        Value::Bool(flag) => flag.to_string(),
        Value::Null => "null".to_owned(),
        other => {
            let mut text = String::new();
            super::render::yaml::flow(other, &mut text);
            text
        }
    }
}

/// `parent.key`, or `key` at the top level.
pub(crate) fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

/// What kind of value was found, for "expected X, found Y" messages.
pub(crate) fn describe(value: &Value) -> &'static str {
    match value {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(number) if number.is_f64() => "a float",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn yaml(text: &str) -> Value {
        serde_norway::from_str(text).unwrap()
    }

    #[test]
    fn unknown_key_names_the_key_and_the_allowed_ones() {
        let map = yaml("a: 1\nzzz: 2").as_mapping().unwrap().clone();
        let error = check_keys(&map, "resources", &["a", "b"], &[], "`resources`").unwrap_err();
        assert_eq!(error, invalid("resources.zzz", "unknown key `zzz` in `resources`; allowed: a, b"));
        assert!(check_keys(&map, "", &["a"], &["zzz"], "x").is_ok());
    }

    #[test]
    fn integers_are_range_checked() {
        assert_eq!(positive(&yaml("3"), "max_runs"), Ok(3));
        assert!(positive(&yaml("0"), "max_runs").is_err());
        assert!(positive(&yaml("2.5"), "max_runs").is_err());
        let retries: Result<u32, _> = integer_in(&yaml("-1"), "retries", 0, 10, "0 to 10");
        assert_eq!(retries, Err(invalid("retries", "expected 0 to 10, found -1")));
    }

    #[test]
    fn strings_must_be_non_empty_strings() {
        assert_eq!(string(&yaml("x"), "name"), Ok("x".to_owned()));
        assert!(string(&yaml("''"), "name").is_err());
        assert_eq!(string(&yaml("5"), "name"), Err(invalid("name", "expected a string, found an integer")));
    }
}
