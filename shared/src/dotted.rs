//! Setting a value by dotted key (`optim.lr`). Its one caller is the native sweep form, which
//! puts each `grid` key into the `train:` mapping (`sweep/native.rs`). The trainer's `--set
//! key=value` does not use it: `trainer/src/config.rs` (`apply_override`) keeps its own rule,
//! which always descends at the dots, so there a literal dotted key never wins.
//!
//! The rule: a key that literally contains the dots, present at the top, wins (`flat.key: 1`
//! is set as is); otherwise each dot descends one mapping, creating missing ones and replacing
//! a `null` by a mapping; a segment that holds anything else is an error naming it. Empty
//! segments (`a..b`, `.a`, `a.`) are refused.

use serde_norway::{Mapping, Value};

/// Sets `value` at dotted `key` in `map` and returns the key path it was set at.
pub fn set_dotted(map: &mut Mapping, key: &str, value: Value) -> Result<Vec<String>, String> {
    if map.contains_key(key) || !key.contains('.') {
        if key.is_empty() {
            return Err("an empty key cannot be set".to_owned());
        }
        map.insert(Value::String(key.to_owned()), value);
        return Ok(vec![key.to_owned()]);
    }
    let parts: Vec<&str> = key.split('.').collect();
    if parts.iter().any(|part| part.is_empty()) {
        return Err(format!("`{key}` has an empty segment between its dots"));
    }
    let (last, parents) = parts.split_last().unwrap_or((&key, &[]));
    let mut current = map;
    for (depth, part) in parents.iter().enumerate() {
        let entry = current.entry(Value::String((*part).to_owned())).or_insert(Value::Null);
        if entry.is_null() {
            *entry = Value::Mapping(Mapping::new());
        }
        current = match entry {
            Value::Mapping(inner) => inner,
            _ => {
                let parent = parts[..=depth].join(".");
                return Err(format!("cannot set `{key}`: `{parent}` is not a mapping"));
            }
        };
    }
    current.insert(Value::String((*last).to_owned()), value);
    Ok(parts.iter().map(|part| (*part).to_owned()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(text: &str) -> Mapping {
        serde_norway::from_str(text).unwrap()
    }

    #[test]
    fn literal_keys_win_then_dots_descend() {
        let mut document = mapping("optim: {name: sgd, lr: 1}\nflat.key: 1\nsched: null");
        assert_eq!(set_dotted(&mut document, "optim.lr", Value::from(2)), Ok(vec!["optim".into(), "lr".into()]));
        assert_eq!(set_dotted(&mut document, "sched.gamma", Value::from(3)).unwrap().len(), 2);
        assert_eq!(set_dotted(&mut document, "new.deep.key", Value::from(5)).unwrap().len(), 3);
        assert_eq!(set_dotted(&mut document, "flat.key", Value::from(4)), Ok(vec!["flat.key".into()]));
        let expected = mapping("optim: {name: sgd, lr: 2}\nflat.key: 4\nsched: {gamma: 3}\nnew: {deep: {key: 5}}");
        assert_eq!(document, expected);
    }

    #[test]
    fn refuses_what_cannot_be_set() {
        let mut document = mapping("optim: {name: sgd}");
        let error = set_dotted(&mut document, "optim.name.x", Value::from(1)).unwrap_err();
        assert_eq!(error, "cannot set `optim.name.x`: `optim.name` is not a mapping");
        assert!(set_dotted(&mut document, "a..b", Value::from(1)).is_err());
        assert!(set_dotted(&mut document, ".a", Value::from(1)).is_err());
        assert!(set_dotted(&mut document, "", Value::from(1)).is_err());
    }
}
