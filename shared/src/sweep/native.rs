//! The native form: `grid:` axes with `command:` (placeholders `{name}`) or `train:` (a
//! built-in trainer config that each job's values override), `max_runs` with
//! `max_runs_order`, and adaptive `search:` with `early_stop:` over the grid's values.

use serde_norway::{Mapping, Value};

use super::adaptive::{parse_native_early_stop, parse_native_search};
use super::common::{parse_settings, SHARED_KEYS};
use super::error::{invalid, SweepError};
use super::placeholders::{command_template, CONFIG_REF};
use super::plan::{check_count, grid_size, GridOrder, Plan, Source, Templates};
use super::random::{Distribution, Sampler};
use super::read::{self, describe, get, join, key_text};
use super::render::template::{JsonShape, Template};
use super::render::yaml::Doc;
use super::render::Rendered;
use super::{ExpandOptions, Sweep, SweepForm};
use crate::search::Search;

const KEYS: [&str; 8] = ["command", "train", "max_runs", "max_runs_order", "grid", "search", "early_stop", "seed"];

pub(crate) fn parse(root: &Mapping, options: &ExpandOptions) -> Result<Sweep, SweepError> {
    let allowed: Vec<&str> = SHARED_KEYS.iter().chain(KEYS.iter()).copied().collect();
    read::check_keys(root, "", &allowed, &[], "a native sweep")?;
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
    let order = match get(root, "max_runs_order").map(|order| (order.as_str(), order)) {
        None | Some((Some("in_order"), _)) => GridOrder::InOrder,
        Some((Some("spread"), _)) => GridOrder::Spread,
        Some((_, other)) => {
            let found = key_text(other);
            return Err(invalid("max_runs_order", format!("expected in_order or spread, found `{found}`")));
        }
    };
    let seed = super::wandb::parse_seed(root)?;
    let search = parse_native_search(root, seed, cap, settings.metric.as_ref())?;
    let early_stop = parse_native_early_stop(root, settings.metric.as_ref())?;
    let full_count = grid_size(axes.iter().map(|(_, values)| values.len()));
    let count = match search {
        Search::Grid => check_count(full_count, cap, options.max_jobs)?,
        // Random draws from the grid's values, `max_runs` of them.
        Search::Random { .. } => check_count(u128::from(cap.unwrap_or(0)), None, options.max_jobs)?,
        Search::AdaptiveRandom { .. } | Search::Bayes { .. } => 0,
    };

    let mut rendered = Vec::with_capacity(axes.len());
    for (name, values) in &axes {
        let path = join("grid", name);
        let values = values.iter().map(|value| Rendered::new(value).map_err(|message| invalid(&path, message)));
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
            (command, Some(train_config(train, &names)?))
        }
    };
    let templates = Templates::new(JsonShape::flat(names.iter().copied()), command, config);
    let source = match search {
        Search::Grid => Source::Grid(rendered, order),
        _ => {
            let leaves = rendered.into_iter().map(|values| Distribution::Categorical { values, cumulative: None });
            Source::Random(Sampler { seed, leaves: leaves.collect() })
        }
    };
    let plan = Plan { count, full_count, source, templates };
    Ok(Sweep::new(SweepForm::Native, settings, plan, search, early_stop, Vec::new()))
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

/// The `train:` mapping with each grid key (dotted for nested keys, by the one rule of
/// [`crate::dotted`]) replaced by a slot.
fn train_config(train: &Mapping, names: &[&str]) -> Result<Template, SweepError> {
    let mut document = train.clone();
    let mut paths = Vec::with_capacity(names.len());
    for name in names {
        let path = crate::dotted::set_dotted(&mut document, name, Value::Null)
            .map_err(|message| invalid(join("grid", name), format!("{message} in `train`")))?;
        paths.push(path);
    }
    let mut doc = Doc::from_mapping(document);
    for (slot, path) in paths.iter().enumerate() {
        set_slot(&mut doc, path, slot);
    }
    Ok(doc.template())
}

/// Puts slot `slot` at `path`, which `set_dotted` has just made sure leads through mappings.
fn set_slot(doc: &mut Doc, path: &[String], slot: usize) {
    let Some((first, rest)) = path.split_first() else { return *doc = Doc::Slot(slot) };
    if let Doc::Map(entries) = doc {
        if let Some((_, inner)) = entries.iter_mut().find(|(key, _)| key.as_str() == Some(first.as_str())) {
            set_slot(inner, rest, slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotted_grid_keys_set_nested_train_keys() {
        let train: Mapping = serde_norway::from_str("optim: {name: sgd, lr: 1}\nflat.key: 1").unwrap();
        let template = train_config(&train, &["optim.lr", "sched.gamma", "flat.key"]).unwrap();
        let values: Vec<Rendered> = [2, 3, 4].map(Rendered::integer).into();
        let mut out = String::new();
        template.render(&values.iter().collect::<Vec<_>>(), 0, &mut out);
        let expected: Value =
            serde_norway::from_str("optim: {name: sgd, lr: 2}\nflat.key: 4\nsched: {gamma: 3}").unwrap();
        assert_eq!(serde_norway::from_str::<Value>(&out).unwrap(), expected, "{out}");
        let error = train_config(&train, &["optim.name.x"]).unwrap_err();
        assert!(matches!(error, SweepError::Invalid { ref path, .. } if path == "grid.optim.name.x"), "{error:?}");
    }
}
