//! Sweep files: detection of the three accepted forms, validation, counting and expansion.
//!
//! A sweep is parsed once into a [`Sweep`], which knows its job count *before* building any
//! job, and can build job `i` on its own ([`Sweep::job`]). That is what lets the server refuse
//! an over-large grid at once and expand a 100,000-job grid without holding it twice.
//!
//! Code map: `yaml` loads the file (and keeps `!!python/` tags) through `bounded`, which
//! refuses documents that aliases blow up, each form has its module (`native`, `wandb` with
//! `wandb_spec`, `cvlab`), `render` precomputes every value's texts, `template` and `config`
//! split commands, params and config files into literal text and value slots, `shell`
//! writes values for the quotes around their placeholder, `plan` decodes a job index, and
//! `random` does the seeded W&B sampling.

use serde::{Deserialize, Serialize};
use serde_norway::{Mapping, Value};

mod bounded;
mod common;
mod config;
mod cvlab;
mod error;
mod native;
mod plan;
mod random;
mod read;
mod render;
mod shell;
mod template;
mod wandb;
mod wandb_spec;
mod yaml;

pub use bounded::MAX_DEPTH as MAX_YAML_DEPTH;
pub use error::SweepError;

/// Which of the three accepted sweep forms a file was written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SweepForm {
    /// `grid:` + `command:` (or `train:`), the documented form.
    Native,
    /// A W&B sweep configuration (`method:`, `parameters:`).
    Wandb,
    /// A CVLab-Kit experiment config: every list leaf is an axis.
    Cvlab,
}

impl std::fmt::Display for SweepForm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SweepForm::Native => "native",
            SweepForm::Wandb => "W&B",
            SweepForm::Cvlab => "CVLab-Kit config",
        })
    }
}

/// Whether the sweep's metric is to be minimised or maximised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Goal {
    Minimize,
    Maximize,
}

/// The metric that ranks a sweep's runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metric {
    pub name: String,
    pub goal: Goal,
}

/// What one job of the sweep asks of a worker.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    /// GPUs per job; `None` means "1 on a GPU box, 0 on a box without GPUs".
    pub gpus: Option<u32>,
    /// Declared GPU memory per GPU in bytes; when set, jobs may share a GPU.
    pub gpu_memory: Option<u64>,
    /// Whether the job needs its GPUs to itself; `None` means "yes unless gpu_memory is set".
    pub exclusive: Option<bool>,
}

/// Settings that come from the server or the command line rather than from the file.
#[derive(Debug, Clone)]
pub struct ExpandOptions {
    /// Refuse a sweep whose job count exceeds this.
    pub max_jobs: u64,
    /// The command for the CVLab-Kit form (`app submit --command`); `None` means
    /// `python main.py --config {config}`.
    pub command: Option<String>,
    /// Refuse YAML nested deeper than this many lists and maps (at most [`MAX_YAML_DEPTH`]).
    pub max_depth: usize,
}

impl Default for ExpandOptions {
    fn default() -> Self {
        Self { max_jobs: 100_000, command: None, max_depth: bounded::DEFAULT_DEPTH }
    }
}

/// One job of a sweep, fully resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobSpec {
    /// Stable position in the sweep, from 0.
    pub index: u64,
    /// The job's parameter values as the text of a JSON object, keys in axis order.
    pub params: String,
    /// The shell command to run (`sh -c`); `{config}` has become `"$APP_CONFIG"`.
    pub command: String,
    /// The resolved config file (YAML) when the form has one (CVLab-Kit, `train:`);
    /// otherwise the worker writes `params` as the config.
    pub config: Option<String>,
}

/// A parsed and validated sweep, ready to count and expand.
#[derive(Debug, Clone)]
pub struct Sweep {
    pub name: Option<String>,
    pub form: SweepForm,
    pub metric: Option<Metric>,
    pub resources: Resources,
    pub priority: i64,
    pub retries: u32,
    /// Per-job wall-clock limit in seconds.
    pub timeout_secs: Option<u64>,
    plan: plan::Plan,
}

impl Sweep {
    /// Parses and validates a sweep file, detecting its form; refuses it when its job count
    /// exceeds `options.max_jobs` without building any job.
    pub fn parse(yaml: &str, options: &ExpandOptions) -> Result<Sweep, SweepError> {
        let loader = yaml::Loader::for_text(yaml).with_max_depth(options.max_depth);
        let root = match loader.load(yaml)? {
            Value::Mapping(root) => root,
            other => {
                let found = yaml::describe(&other);
                let message = format!("expected a mapping of sweep keys or an experiment config, found {found}");
                return Err(error::invalid("(root)", message));
            }
        };
        match detect_form(&root) {
            SweepForm::Native => native::parse(&root, yaml, &loader, options),
            SweepForm::Wandb => wandb::parse(&root, &loader, options),
            SweepForm::Cvlab => cvlab::parse(&root, yaml, &loader, options),
        }
    }

    /// The number of jobs, after `max_runs` / `run_cap`.
    pub fn count(&self) -> u64 {
        self.plan.count
    }

    /// Builds job `index`; `None` when `index >= count()`.
    pub fn job(&self, index: u64) -> Option<JobSpec> {
        self.plan.job(index)
    }

    /// All jobs in index order.
    pub fn jobs(&self) -> impl Iterator<Item = JobSpec> + '_ {
        (0..self.count()).filter_map(|index| self.job(index))
    }

    fn new(form: SweepForm, settings: common::Settings, plan: plan::Plan) -> Sweep {
        let common::Settings { name, metric, resources, priority, retries, timeout_secs } = settings;
        Sweep { name, form, metric, resources, priority, retries, timeout_secs, plan }
    }
}

/// W&B files are recognised by `method`/`parameters`, native ones by `grid`, `command` or
/// `train`; anything else is an experiment config to sweep over.
fn detect_form(root: &Mapping) -> SweepForm {
    let has = |key: &str| root.contains_key(key);
    if has("method") || has("parameters") {
        SweepForm::Wandb
    } else if has("grid") || has("command") || has("train") {
        SweepForm::Native
    } else {
        SweepForm::Cvlab
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(yaml: &str) -> SweepForm {
        detect_form(serde_norway::from_str::<Value>(yaml).unwrap().as_mapping().unwrap())
    }

    #[test]
    fn forms_are_told_apart_by_their_keys() {
        assert_eq!(form("method: grid"), SweepForm::Wandb);
        assert_eq!(form("parameters: {}\ncommand: x"), SweepForm::Wandb);
        assert_eq!(form("grid: {}"), SweepForm::Native);
        assert_eq!(form("train: {}"), SweepForm::Native);
        assert_eq!(form("command: x"), SweepForm::Native);
        assert_eq!(form("model: {lr: [1, 2]}"), SweepForm::Cvlab);
    }

    #[test]
    fn a_sweep_can_be_shared_between_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Sweep>();
        let sweep = Sweep::parse("command: x\ngrid: {a: [1, 2]}", &ExpandOptions::default()).unwrap();
        let from_thread = std::thread::scope(|scope| scope.spawn(|| sweep.job(1)).join().unwrap());
        assert_eq!(from_thread.map(|job| job.command), Some("x".to_owned()));
    }
}
