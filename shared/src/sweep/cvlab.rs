//! The CVLab-Kit form: a plain experiment config in which every list at a mapping leaf is an
//! axis, named by its dotted key path (`optimizer.lr`).
//!
//! What is not an axis, and why: a tagged value (`!!python/tuple [0.9, 0.999]` is one value
//! for the Python loader); a quoted list-looking string (`"[224, 224]"`, the CVLab way to
//! pass a list as one value; it is handed on as a real list); a one-element list (it becomes
//! its element); an empty list (one run with `[]`); anything under a `device` key (GPU
//! choice is the scheduler's). Lists inside lists are values, never nested axes.

use std::collections::HashSet;

use serde_norway::{Mapping, Value};

use super::error::{invalid, SweepError};
use super::load::Loader;
use super::placeholders::command_template;
use super::plan::{count_jobs, grid_size, GridOrder, Plan, Source, Templates};
use super::read::{join, key_text};
use super::render::template::JsonShape;
use super::render::yaml::Doc;
use super::render::Rendered;
use super::{ExpandOptions, Sweep, SweepForm};
use crate::search::Search;

/// The command when `app submit --command` gives none.
const DEFAULT_COMMAND: &str = "python main.py --config {config}";

pub(crate) fn parse(root: Mapping, loader: &Loader, options: &ExpandOptions) -> Result<Sweep, SweepError> {
    let mut document = Doc::from_mapping(root);
    let mut axes = Vec::new();
    find_axes(&mut document, "", loader, &mut |path, values| {
        axes.push((path, values));
        Doc::Slot(axes.len() - 1)
    })?;
    // Counted first: an over-limit file is refused before any other work on its axes.
    let count = count_jobs(axes.iter().map(|(_, values)| values.len()), None, options.max_jobs)?;
    let mut seen = HashSet::with_capacity(axes.len());
    if let Some((path, _)) = axes.iter().find(|(path, _)| !seen.insert(path.as_str())) {
        return Err(invalid(path.as_str(), format!("two keys make the same parameter name `{path}`")));
    }

    let mut rendered = Vec::with_capacity(axes.len());
    for (path, values) in &axes {
        let values = values.iter().map(|value| Rendered::new(value).map_err(|message| invalid(path, message)));
        rendered.push(values.collect::<Result<Vec<_>, _>>()?);
    }
    let names: Vec<&str> = axes.iter().map(|(path, _)| path.as_str()).collect();
    let command =
        command_template(options.command.as_deref().unwrap_or(DEFAULT_COMMAND), &names, |name| resolve(&names, name))?;
    let full_count = grid_size(rendered.iter().map(Vec::len));
    let templates = Templates::new(JsonShape::flat(names.iter().copied()), command, Some(document.template()));
    let plan = Plan { count, full_count, source: Source::Grid(rendered, GridOrder::InOrder), templates };
    Ok(Sweep::new(SweepForm::Cvlab, Default::default(), plan, Search::Grid, None, Vec::new()))
}

/// A placeholder names a parameter by its dotted path, or by its last segment when only one
/// parameter ends that way (`{lr}` for `optimizer.lr`).
fn resolve(names: &[&str], name: &str) -> Option<usize> {
    if let Some(exact) = names.iter().position(|known| *known == name) {
        return Some(exact);
    }
    let ends_with = |known: &&str| known.rsplit('.').next() == Some(name);
    let mut matches = names.iter().enumerate().filter(|(_, known)| ends_with(known));
    match (matches.next(), matches.next()) {
        (Some((slot, _)), None) => Some(slot),
        _ => None,
    }
}

/// Walks nested mappings in document order, resolving non-axis lists in place and handing
/// each axis to `axis`, which returns what to leave in its place.
fn find_axes(
    doc: &mut Doc,
    parent: &str,
    loader: &Loader,
    axis: &mut dyn FnMut(String, Vec<Value>) -> Doc,
) -> Result<(), SweepError> {
    let Doc::Map(entries) = doc else { return Ok(()) };
    for (key, node) in entries.iter_mut() {
        if key.as_str() == Some("device") {
            continue;
        }
        let path = join(parent, &key_text(key));
        match node {
            Doc::Map(_) => find_axes(node, &path, loader, axis)?,
            Doc::Value(Value::Sequence(items)) if items.len() == 1 => {
                *node = Doc::Value(as_list_if_listy(items.remove(0), loader)?)
            }
            Doc::Value(Value::Sequence(items)) if items.len() >= 2 => {
                let values = std::mem::take(items).into_iter().map(|item| as_list_if_listy(item, loader));
                *node = axis(path, values.collect::<Result<_, _>>()?);
            }
            Doc::Value(value @ Value::String(_)) => *value = as_list_if_listy(std::mem::take(value), loader)?,
            _ => {}
        }
    }
    Ok(())
}

/// A string written like a list (`"[224, 224]"`) becomes that list; any other value, or a
/// string that does not parse as a list, is returned unchanged. Fails only when the sweep
/// file's budget of YAML nodes is spent (a list string repeated by aliases).
fn as_list_if_listy(value: Value, loader: &Loader) -> Result<Value, SweepError> {
    let Value::String(text) = &value else { return Ok(value) };
    let trimmed = text.trim();
    if !(trimmed.starts_with('[') && trimmed.ends_with(']')) {
        return Ok(value);
    }
    match loader.load(trimmed) {
        Ok(list @ Value::Sequence(_)) => Ok(list),
        Err(error) if loader.is_spent() => Err(error),
        _ => Ok(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_resolve_by_path_or_unique_last_segment() {
        let names = ["model.lr", "optim.lr", "optim.momentum", "epochs"];
        assert_eq!(resolve(&names, "optim.lr"), Some(1));
        assert_eq!(resolve(&names, "momentum"), Some(2));
        assert_eq!(resolve(&names, "epochs"), Some(3));
        assert_eq!(resolve(&names, "lr"), None, "ambiguous");
        assert_eq!(resolve(&names, "nope"), None);
    }

    #[test]
    fn list_looking_strings_become_lists_only_when_they_parse() {
        let loader = Loader::for_text("");
        let list = as_list_if_listy(Value::String(" [224, 224] ".into()), &loader);
        assert_eq!(list, Ok(Value::Sequence(vec![Value::from(224), Value::from(224)])));
        let broken = Value::String("[1, [2]".into());
        assert_eq!(as_list_if_listy(broken.clone(), &loader), Ok(broken));
        let prose = Value::String("model [a, b]".into());
        assert_eq!(as_list_if_listy(prose.clone(), &loader), Ok(prose));
        let huge = Value::String("[99999999999999999999999]".into());
        assert_eq!(as_list_if_listy(huge.clone(), &loader), Ok(huge));
    }
}
