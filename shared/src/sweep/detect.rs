//! Telling the forms apart, and recognising sweep files of other tools that would otherwise
//! be read as a CVLab config and expanded into hundreds of wrong jobs.
//!
//! W&B files have `method` or `parameters`; native ones `grid`, `command` or `train`;
//! anything else is an experiment config to sweep over. Refused with a sentence saying what
//! they are: a Hydra config (a `hydra:` key, or a `defaults:` list of config groups and
//! `_self_`), the Hydra Optuna sweeper's search space (`hydra.sweeper` naming optuna), and a
//! Ray Tune search space (a `{grid_search: [...]}` mapping anywhere).

use serde_norway::{Mapping, Value};

use super::error::{invalid, SweepError};
use super::SweepForm;

pub(crate) fn detect_form(root: &Mapping) -> Result<SweepForm, SweepError> {
    let has = |key: &str| root.contains_key(key);
    if has("method") || has("parameters") {
        return Ok(SweepForm::Wandb);
    }
    if has("grid") || has("command") || has("train") {
        return Ok(SweepForm::Native);
    }
    refuse_foreign(root)?;
    Ok(SweepForm::Cvlab)
}

fn refuse_foreign(root: &Mapping) -> Result<(), SweepError> {
    const INSTEAD: &str = "write the axes as a native sweep (`command:` with `{name}` placeholders and `grid:`) \
                           or a W&B sweep (`method:`, `parameters:`)";
    if let Some(hydra) = root.get("hydra") {
        let optuna = hydra.get("sweeper").is_some_and(|sweeper| text_mentions(sweeper, "optuna"));
        let what = if optuna { "the Hydra Optuna sweeper's search space" } else { "a Hydra config" };
        return Err(invalid("hydra", format!("this is {what}, which app does not run (no Hydra multirun); {INSTEAD}")));
    }
    if let Some(Value::Sequence(items)) = root.get("defaults") {
        let hydra_like = items.iter().any(|item| match item {
            Value::String(text) => text == "_self_",
            Value::Mapping(entry) => entry.len() == 1,
            _ => false,
        });
        if hydra_like {
            let optuna = items.iter().any(|item| text_mentions(item, "optuna"));
            let what =
                if optuna { "a Hydra config using the Optuna sweeper" } else { "a Hydra config (its defaults list)" };
            return Err(invalid("defaults", format!("this is {what}, which app does not run; {INSTEAD}")));
        }
    }
    if let Some(mut path) = find_grid_search(root) {
        path.reverse();
        let path = if path.is_empty() { "grid_search".to_owned() } else { path.join(".") };
        let message = format!("`grid_search` is Ray Tune's search space, which app does not read; {INSTEAD}");
        return Err(invalid(path, message));
    }
    Ok(())
}

fn text_mentions(value: &Value, word: &str) -> bool {
    match value {
        Value::String(text) => text.to_ascii_lowercase().contains(word),
        Value::Sequence(items) => items.iter().any(|item| text_mentions(item, word)),
        Value::Mapping(map) => map.iter().any(|(key, item)| text_mentions(key, word) || text_mentions(item, word)),
        Value::Tagged(tagged) => text_mentions(&tagged.value, word),
        _ => false,
    }
}

/// The key path (innermost key first) of a mapping holding `grid_search`.
fn find_grid_search(map: &Mapping) -> Option<Vec<String>> {
    if map.contains_key("grid_search") {
        return Some(Vec::new());
    }
    map.iter().find_map(|(key, item)| {
        let mut path = find_grid_search(item.as_mapping()?)?;
        path.push(super::read::key_text(key));
        Some(path)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(yaml: &str) -> Result<SweepForm, SweepError> {
        detect_form(serde_norway::from_str::<Value>(yaml).unwrap().as_mapping().unwrap())
    }

    fn refusal(yaml: &str) -> (String, String) {
        match form(yaml) {
            Err(SweepError::Invalid { path, message }) => (path, message),
            other => panic!("{yaml}: {other:?}"),
        }
    }

    #[test]
    fn forms_are_told_apart_by_their_keys() {
        assert_eq!(form("method: grid"), Ok(SweepForm::Wandb));
        assert_eq!(form("parameters: {}\ncommand: x"), Ok(SweepForm::Wandb));
        assert_eq!(form("grid: {}"), Ok(SweepForm::Native));
        assert_eq!(form("train: {}"), Ok(SweepForm::Native));
        assert_eq!(form("command: x"), Ok(SweepForm::Native));
        assert_eq!(form("model: {lr: [1, 2]}"), Ok(SweepForm::Cvlab));
        assert_eq!(form("defaults: [1, 2]"), Ok(SweepForm::Cvlab), "a plain list named defaults is an axis");
    }

    #[test]
    fn other_tools_files_are_named() {
        let (path, message) = refusal("defaults:\n- model: resnet\n- _self_\nlr: 0.1\n");
        assert_eq!(path, "defaults");
        assert!(message.contains("Hydra config"), "{message}");
        let (_, message) = refusal("defaults:\n- override hydra/sweeper: optuna\n");
        assert!(message.contains("Optuna sweeper"), "{message}");
        let (path, message) = refusal(
            "hydra:\n  sweeper:\n    _target_: hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper\n",
        );
        assert_eq!(path, "hydra");
        assert!(message.contains("Optuna sweeper's search space"), "{message}");
        let (path, message) = refusal("config:\n  lr: {grid_search: [0.1, 0.01]}\n");
        assert_eq!(path, "config.lr");
        assert!(message.contains("Ray Tune"), "{message}");
    }
}
