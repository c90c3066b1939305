//! A job's params in other shapes: back to proposal coordinates (for the bayes model), and
//! the params file W&B's agent writes for `wandb.config` readers.
//!
//! W&B's agent writes each run's parameters to `wandb/sweep-<id>/config-<run>.yaml` and sets
//! `WANDB_SWEEP_PARAM_PATH` to it before starting the program; `wandb.init()` reads that file
//! (`config_util.dict_from_config_file`) into `wandb.config`. Its text is
//! `wandb_version: 1`, a blank line, then a YAML mapping of each top-level parameter to
//! `{value: <value>}` (nested parameters as nested mappings), in parameter order.
//! [`wandb_params_file`] writes the same document from a job's params JSON; the worker writes
//! it into the attempt's directory and sets the variable.

use serde_json::Value as Json;
use serde_norway::{Mapping, Value};

use super::plan::{Plan, Source};
use super::random::Distribution;
use super::render::template::JsonShape;
use super::render::yaml::document;

/// The text of W&B's params file for a job whose params JSON is `params`.
pub fn wandb_params_file(params: &str) -> Result<String, String> {
    let params: Json =
        serde_json::from_str(params).map_err(|error| format!("the job's params are not JSON: {error}"))?;
    let Json::Object(entries) = params else { return Err("the job's params are not a JSON object".to_owned()) };
    let mut text = String::from("wandb_version: 1\n");
    if entries.is_empty() {
        // W&B writes the version line alone when there is nothing (an empty mapping would
        // not parse back as one).
        return Ok(text);
    }
    let mut root = Mapping::new();
    for (name, value) in entries {
        let mut wrapped = Mapping::new();
        wrapped.insert(Value::from("value"), yaml_of(&value));
        root.insert(Value::String(name), Value::Mapping(wrapped));
    }
    text.push('\n');
    text.push_str(&document(&Value::Mapping(root)));
    Ok(text)
}

fn yaml_of(value: &Json) -> Value {
    match value {
        Json::Null => Value::Null,
        Json::Bool(flag) => Value::Bool(*flag),
        Json::Number(number) => match (number.as_u64(), number.as_i64()) {
            (Some(whole), _) => Value::from(whole),
            (_, Some(whole)) => Value::from(whole),
            _ => Value::from(number.as_f64().unwrap_or(f64::NAN)),
        },
        Json::String(text) => Value::String(text.clone()),
        Json::Array(items) => Value::Sequence(items.iter().map(yaml_of).collect()),
        Json::Object(entries) => {
            Value::Mapping(entries.iter().map(|(key, item)| (Value::String(key.clone()), yaml_of(item))).collect())
        }
    }
}

/// A job's params in proposal coordinates, slot by slot.
pub(crate) fn coordinates(plan: &Plan, params: &Json) -> Option<Vec<f64>> {
    let mut paths = Vec::new();
    slot_paths(&plan.templates.shape, &mut Vec::new(), &mut paths);
    paths.sort_by_key(|(slot, _)| *slot);
    paths
        .iter()
        .enumerate()
        .map(|(slot, (_, path))| {
            let value = path.iter().try_fold(params, |value, key| value.get(key))?;
            match &plan.source {
                Source::Grid(axes, _) => index_of(axes.get(slot)?.iter().map(|value| value.json.as_str()), value),
                Source::Random(sampler) => match sampler.leaves.get(slot)? {
                    Distribution::Constant(_) => Some(0.0),
                    Distribution::Categorical { values, .. } => {
                        index_of(values.iter().map(|value| value.json.as_str()), value)
                    }
                    _ => value.as_f64(),
                },
            }
        })
        .collect()
}

fn index_of<'a>(mut choices: impl Iterator<Item = &'a str>, value: &Json) -> Option<f64> {
    let text = serde_json::to_string(value).ok()?;
    choices.position(|choice| choice == text).map(|index| index as f64)
}

fn slot_paths(shape: &JsonShape, prefix: &mut Vec<String>, out: &mut Vec<(usize, Vec<String>)>) {
    match shape {
        JsonShape::Slot(slot) => out.push((*slot, prefix.clone())),
        JsonShape::Object(entries) => {
            for (key, inner) in entries {
                prefix.push(key.clone());
                slot_paths(inner, prefix, out);
                prefix.pop();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_params_file_reads_back_as_w_and_b_writes_it() {
        let text = wandb_params_file(
            r#"{"lr":1e-5,"layers":[64,32],"opt":{"name":"adam","beta":0.9},"flag":true,"s":"1e-5"}"#,
        )
        .unwrap();
        assert!(text.starts_with("wandb_version: 1\n\nlr:\n  value: 0.00001\n"), "{text}");
        let read: Value = serde_norway::from_str(&text).unwrap();
        assert_eq!(read["opt"]["value"]["beta"].as_f64(), Some(0.9));
        assert_eq!(read["layers"]["value"][1].as_u64(), Some(32));
        assert_eq!(read["s"]["value"].as_str(), Some("1e-5"), "a string stays a string");
        assert_eq!(wandb_params_file("{}").unwrap(), "wandb_version: 1\n");
        assert!(wandb_params_file("[1]").is_err());
    }
}
