//! The native form: `grid:` axes with `command:` (placeholders `{name}`) or `train:` (a
//! built-in trainer config that each job's values override).

use serde_norway::{Mapping, Value};

use super::common::parse_settings;
use super::config::SlotMarkers;
use super::error::{invalid, SweepError};
use super::plan::{count_jobs, Plan, Source, Templates};
use super::read;
use super::render::Rendered;
use super::template::{command_template, JsonShape, Template, CONFIG_REF};
use super::yaml::{describe, get, join, key_text, Loader};
use super::{ExpandOptions, Sweep, SweepForm};

const KEYS: [&str; 11] = [
    "name",
    "description",
    "command",
    "train",
    "resources",
    "metric",
    "max_runs",
    "priority",
    "retries",
    "timeout",
    "grid",
];

pub(crate) fn parse(
    root: &Mapping,
    source: &str,
    loader: &Loader,
    options: &ExpandOptions,
) -> Result<Sweep, SweepError> {
    read::check_keys(root, "", &KEYS, &[], "a native sweep")?;
    let settings = parse_settings(root)?;
    let run = match (get(root, "command"), get(root, "train")) {
        (Some(_), Some(_)) => return Err(invalid("train", "a native sweep takes `command` or `train`, not both")),
        (None, None) => {
            return Err(invalid(
                "command",
                "a native sweep needs `command` (a shell command) or `train` (a trainer config)",
            ))
        }
        (Some(command), None) => Run::Command(read::string(command, "command")?),
        (None, Some(train)) => Run::Train(read::mapping(train, "train")?),
    };
    let axes = read_grid(root)?;
    let cap = get(root, "max_runs").map(|cap| read::positive(cap, "max_runs")).transpose()?;
    let count = count_jobs(axes.iter().map(|(_, values)| values.len()), cap, options.max_jobs)?;

    let mut rendered = Vec::with_capacity(axes.len());
    for (name, values) in &axes {
        let path = join("grid", name);
        let values = values.iter().map(|value| Rendered::new(value, loader).map_err(|message| invalid(&path, message)));
        rendered.push(values.collect::<Result<Vec<_>, _>>()?);
    }
    let names: Vec<&str> = axes.iter().map(|(name, _)| name.as_str()).collect();
    let (command, config) = match run {
        Run::Command(command) => {
            let resolve = |name: &str| names.iter().position(|known| *known == name);
            (command_template(&command, &names, resolve)?, None)
        }
        Run::Train(train) => {
            let command = Template::text(&format!("app train --config {CONFIG_REF}"));
            (command, Some(train_config(train, &names, source, loader)?))
        }
    };
    let templates = Templates { params: JsonShape::flat(names.iter().copied()).template(), command, config };
    Ok(Sweep::new(SweepForm::Native, settings, Plan { count, source: Source::Grid(rendered), templates }))
}

enum Run<'a> {
    Command(String),
    Train(&'a Mapping),
}

/// The axes in document order; no grid at all is one job with no parameters.
fn read_grid(root: &Mapping) -> Result<Vec<(String, &Vec<Value>)>, SweepError> {
    let Some(grid) = get(root, "grid") else { return Ok(Vec::new()) };
    let grid = read::mapping(grid, "grid")?;
    let mut axes = Vec::with_capacity(grid.len());
    for (key, values) in grid {
        let name = match key.as_str() {
            Some(name) if !name.is_empty() => name.to_owned(),
            _ => {
                let message = format!("grid keys must be non-empty parameter names, found `{}`", key_text(key));
                return Err(invalid(join("grid", &key_text(key)), message));
            }
        };
        let path = join("grid", &name);
        match values {
            Value::Sequence(items) if items.is_empty() => {
                return Err(invalid(path, "empty axis: give at least one value (or remove the key)"))
            }
            Value::Sequence(items) => axes.push((name, items)),
            other => {
                let message =
                    format!("expected a list of values, found {} (write [x] for a single value)", describe(other));
                return Err(invalid(path, message));
            }
        }
    }
    Ok(axes)
}

/// The `train:` mapping with each grid key (dotted for nested keys) replaced by a slot.
fn train_config(train: &Mapping, names: &[&str], source: &str, loader: &Loader) -> Result<Template, SweepError> {
    let markers = SlotMarkers::for_text(source);
    let mut document = train.clone();
    for (slot, name) in names.iter().enumerate() {
        set_path(&mut document, name, markers.marker(slot))?;
    }
    markers.template(loader, &Value::Mapping(document), names.len())
}

fn set_path(document: &mut Mapping, name: &str, value: Value) -> Result<(), SweepError> {
    // A key that literally contains the dots wins over nesting.
    if document.contains_key(name) || !name.contains('.') {
        document.insert(Value::String(name.to_owned()), value);
        return Ok(());
    }
    let mut parts: Vec<&str> = name.split('.').collect();
    let last = parts.pop().unwrap_or(name);
    let mut current = document;
    for (depth, part) in parts.iter().enumerate() {
        let entry = current.entry(Value::String((*part).to_owned())).or_insert_with(|| Value::Mapping(Mapping::new()));
        current = match entry {
            Value::Mapping(inner) => inner,
            _ => {
                let parent = parts[..=depth].join(".");
                let message = format!("cannot set `{name}` in `train`: `{parent}` is not a mapping there");
                return Err(invalid(join("grid", name), message));
            }
        };
    }
    current.insert(Value::String(last.to_owned()), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotted_grid_keys_set_nested_train_keys() {
        let mut document: Mapping = serde_norway::from_str("optim: {name: sgd, lr: 1}\nflat.key: 1").unwrap();
        set_path(&mut document, "optim.lr", Value::from(2)).unwrap();
        set_path(&mut document, "sched.gamma", Value::from(3)).unwrap();
        set_path(&mut document, "flat.key", Value::from(4)).unwrap();
        let expected: Mapping =
            serde_norway::from_str("optim: {name: sgd, lr: 2}\nflat.key: 4\nsched: {gamma: 3}").unwrap();
        assert_eq!(document, expected);
        let error = set_path(&mut document, "optim.name.x", Value::from(1)).unwrap_err();
        assert!(matches!(error, SweepError::Invalid { ref path, .. } if path == "grid.optim.name.x"), "{error:?}");
    }
}
