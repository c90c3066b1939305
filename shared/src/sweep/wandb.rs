//! The W&B sweep form: `method: grid | random | bayes`, `parameters`, `program` / `command`
//! (see [`super::wandb_command`]), `run_cap`, `early_terminate`, `metric.target`, and our
//! `seed`. Keys W&B reads for its own service (`project`, `entity`, `controller`, ...) are
//! accepted and listed as warnings: they change nothing here.

use serde_norway::{Mapping, Value};

use super::adaptive::{parse_early_terminate, parse_method};
use super::common::{parse_settings, SHARED_KEYS};
use super::error::{invalid, SweepError};
use super::plan::{check_count, grid_size, GridOrder, Plan, Source, Templates};
use super::random::{Distribution, Sampler};
use super::read::{self, get};
use super::render::template::JsonShape;
use super::wandb_command::{command_template, program, Macros};
use super::wandb_spec::{parse_parameters, ParamSpec};
use super::{ExpandOptions, Sweep, SweepForm};
use crate::search::Search;

const KEYS: [&str; 7] = ["method", "parameters", "program", "command", "run_cap", "seed", "early_terminate"];
/// W&B keys about its own service or agent, accepted and reported as ignored.
const IGNORED: [&str; 7] = ["entity", "project", "controller", "job", "image_uri", "scheduler", "launch"];

pub(crate) fn parse(root: &Mapping, options: &ExpandOptions) -> Result<Sweep, SweepError> {
    let allowed: Vec<&str> = SHARED_KEYS.iter().chain(KEYS.iter()).copied().collect();
    read::check_keys(root, "", &allowed, &IGNORED, "a W&B sweep")?;
    let mut warnings = ignored_keys(root);
    let settings = parse_settings(root)?;
    let Some(parameters) = get(root, "parameters") else {
        return Err(invalid("parameters", "a W&B sweep needs `parameters`"));
    };
    let specs = parse_parameters(parameters, "parameters")?;
    let run_cap = get(root, "run_cap").map(|cap| read::positive(cap, "run_cap")).transpose()?;
    let seed = parse_seed(root)?;
    let search = parse_method(root, seed, run_cap, settings.metric.as_ref())?;
    let early_stop = parse_early_terminate(root, settings.metric.as_ref())?;
    if get(root, "early_terminate").and_then(Value::as_mapping).is_some_and(|map| map.contains_key("strict")) {
        warnings.push(
            "`early_terminate.strict` is accepted but not distinguished: every run is compared at each bracket"
                .to_owned(),
        );
    }

    let mut leaves = Vec::new();
    let shape = flatten(&specs, "parameters", &mut leaves);
    let (source, full_count) = match search {
        Search::Grid => {
            let mut axes = Vec::with_capacity(leaves.len());
            for (path, leaf) in &leaves {
                let Some(values) = leaf.grid_values() else {
                    let name = path.rsplit('.').next().unwrap_or(path);
                    let message =
                        format!("grid search needs `values` or `value`; `{name}` has distribution {}", leaf.name());
                    return Err(invalid(path.as_str(), message));
                };
                axes.push(values.to_vec());
            }
            let full = grid_size(axes.iter().map(Vec::len));
            (Source::Grid(axes, GridOrder::InOrder), full)
        }
        _ => {
            let sampler = Sampler { seed, leaves: leaves.iter().map(|(_, leaf)| (*leaf).clone()).collect() };
            (Source::Random(sampler), u128::from(run_cap.unwrap_or(0)))
        }
    };
    let count = match search {
        Search::Grid | Search::Random { .. } => check_count(full_count, run_cap, options.max_jobs)?,
        Search::AdaptiveRandom { .. } | Search::Bayes { .. } => {
            check_count(full_count, None, options.max_jobs)?;
            0
        }
    };
    let program = program(root)?;
    let command = command_template(get(root, "command"), &Macros { program: program.as_deref(), shape: &shape })?;
    let templates = Templates::new(shape, command, None);
    let plan = Plan { count, full_count, source, templates };
    Ok(Sweep::new(SweepForm::Wandb, settings, plan, search, early_stop, warnings))
}

/// `seed`, any 64-bit integer (negative ones keep their bits); 0 when absent.
pub(crate) fn parse_seed(root: &Mapping) -> Result<u64, SweepError> {
    match get(root, "seed") {
        Some(seed) => {
            Ok(read::integer_in::<i128>(seed, "seed", i64::MIN.into(), u64::MAX.into(), "a 64-bit integer")? as u64)
        }
        None => Ok(0),
    }
}

/// One warning per key that W&B reads and we do not.
fn ignored_keys(root: &Mapping) -> Vec<String> {
    let mut warnings: Vec<String> = IGNORED
        .iter()
        .filter(|key| root.contains_key(**key))
        .map(|key| format!("`{key}` is a W&B service setting and is ignored here"))
        .collect();
    if get(root, "description").is_some() {
        warnings.push("`description` is kept in the sweep file only; it is not shown anywhere".to_owned());
    }
    warnings
}

/// Numbers the leaves in document order (they become template slots) and returns the
/// params object's shape, nested parameters kept nested.
fn flatten<'a>(
    specs: &'a [(String, ParamSpec)],
    path: &str,
    leaves: &mut Vec<(String, &'a Distribution)>,
) -> JsonShape {
    let entries = specs.iter().map(|(name, spec)| {
        let spec_path = format!("{path}.{name}");
        let shape = match spec {
            ParamSpec::Leaf(distribution) => {
                leaves.push((spec_path, distribution));
                JsonShape::Slot(leaves.len() - 1)
            }
            ParamSpec::Nested(inner) => flatten(inner, &format!("{spec_path}.parameters"), leaves),
        };
        (name.clone(), shape)
    });
    JsonShape::Object(entries.collect())
}
