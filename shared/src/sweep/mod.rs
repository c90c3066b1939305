//! Sweep files: detection of the three accepted forms, validation, counting and expansion.
//!
//! A sweep is parsed once into a [`Sweep`], which knows its job count *before* building any
//! job, and can build job `i` on its own ([`Sweep::job`]). That is what lets the server refuse
//! an over-large grid at once and expand a 100,000-job grid without holding it twice. An
//! adaptive sweep (bayes, or random without a cap) has no jobs up front: the server's
//! controller builds each from a proposal ([`Sweep::job_from`]) or its index.
//!
//! The text flows one way: `load` reads it once into a YAML value (bounded while scanning:
//! depth, nodes, alias copies, string bytes; positions in errors), `detect` picks the form,
//! each form's parser (`native`, `wandb` with `wandb_spec` and `wandb_command`, `cvlab`)
//! reads that value with the typed reads of `read` and the shared keys of `common`,
//! `environment` and `adaptive`, and `render` computes every text a value becomes, once.
//! `placeholders` splits native commands, `plan` decodes a job index (in order or spread),
//! `random` does the seeded W&B sampling, and `params` turns params back into proposals'
//! coordinates and writes W&B's params file.

use serde::{Deserialize, Serialize};

mod adaptive;
mod common;
mod cvlab;
mod detect;
mod environment;
mod error;
mod flow_indent;
mod load;
mod native;
mod params;
mod placeholders;
mod plan;
mod random;
mod read;
mod render;
mod scalar;
mod wandb;
mod wandb_command;
mod wandb_spec;

pub use environment::{Code, Environment};
pub use error::SweepError;
pub use load::MAX_DEPTH as MAX_YAML_DEPTH;
pub use params::wandb_params_file;
pub use plan::GridOrder;

use crate::search::{EarlyStop, Search, Space};

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
    /// The job runs the built-in trainer (`app train`), so only a worker built with it can run
    /// it. Not a key of the file: set from the command (see `capabilities::runs_trainer`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub trainer: bool,
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
        Self { max_jobs: 100_000, command: None, max_depth: load::DEFAULT_DEPTH }
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

/// When a sweep's failing runs pause it (as W&B's agent gives up after
/// `WANDB_AGENT_MAX_INITIAL_FAILURES`): after `initial` failed runs while none of its runs has
/// succeeded, or `consecutive` failed runs in a row after one has. Counted since the last
/// success or resume; 0 turns a limit off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailFast {
    /// `max_initial_failures` (3, W&B's default).
    pub initial: u32,
    /// `max_consecutive_failures` (10).
    pub consecutive: u32,
}

impl Default for FailFast {
    fn default() -> Self {
        FailFast { initial: 3, consecutive: 10 }
    }
}

impl FailFast {
    /// Whether `failed_in_a_row` failed runs pause the sweep, given whether any run of it has
    /// succeeded. A pure decision: the server counts, this decides.
    pub fn pauses(&self, failed_in_a_row: u64, any_succeeded: bool) -> bool {
        let limit = if any_succeeded { self.consecutive } else { self.initial };
        limit > 0 && failed_in_a_row >= u64::from(limit)
    }
}

/// A parsed and validated sweep, ready to count and expand.
#[derive(Debug, Clone)]
pub struct Sweep {
    pub name: Option<String>,
    pub form: SweepForm,
    pub metric: Option<Metric>,
    /// W&B `metric.target`: no new run is started once a run reaches it.
    pub metric_target: Option<f64>,
    pub resources: Resources,
    pub priority: i64,
    /// The server's priority class (`[server.priority_classes]`) its jobs are in, if named:
    /// across users, a higher class goes first and may preempt lower ones.
    pub priority_class: Option<String>,
    /// Whether the scheduler may stop its jobs (SIGTERM, then requeue to resume from their
    /// checkpoints) to give their GPUs to a user below their share; `None`: the server decides.
    pub preemptible: Option<bool>,
    pub retries: u32,
    /// Per-job wall-clock limit in seconds.
    pub timeout_secs: Option<u64>,
    /// When failing runs pause the sweep.
    pub fail_fast: FailFast,
    /// How runs are chosen: built up front, or proposed one at a time.
    pub search: Search,
    /// When running runs are stopped early, if ever.
    pub early_stop: Option<EarlyStop>,
    /// `code`, `workdir`, `env`, `setup`.
    pub environment: Environment,
    /// Keys accepted but without effect here (W&B `project`, `entity`, ...), one sentence each.
    pub warnings: Vec<String>,
    plan: plan::Plan,
}

impl Sweep {
    /// Parses and validates a sweep file, detecting its form; refuses it when its job count
    /// exceeds `options.max_jobs` without building any job.
    pub fn parse(yaml: &str, options: &ExpandOptions) -> Result<Sweep, SweepError> {
        let loader = load::Loader::for_text(yaml).with_max_depth(options.max_depth);
        let root = match loader.load(yaml)? {
            serde_norway::Value::Mapping(root) => root,
            other => {
                let found = read::describe(&other);
                let message = format!("expected a mapping of sweep keys or an experiment config, found {found}");
                return Err(error::invalid("(root)", message));
            }
        };
        let mut sweep = match detect::detect_form(&root)? {
            SweepForm::Native => native::parse(&root, options),
            SweepForm::Wandb => wandb::parse(&root, options),
            SweepForm::Cvlab => cvlab::parse(root, &loader, options),
        }?;
        // Every job of a sweep runs the same program: the first one tells.
        sweep.resources.trainer = sweep.job(0).is_some_and(|job| crate::capabilities::runs_trainer(&job.command));
        Ok(sweep)
    }

    /// The number of jobs built at submission, after `max_runs` / `run_cap`; 0 for an
    /// adaptive search, whose runs the controller makes one at a time.
    pub fn count(&self) -> u64 {
        self.plan.count
    }

    /// The count before `max_runs` / `run_cap`, for "24 of 108 (capped)"; for random search
    /// the `run_cap` (0 when there is none). Saturates at `u128::MAX`.
    pub fn full_count(&self) -> u128 {
        self.plan.full_count
    }

    /// Builds job `index`: `None` when `index >= count()`, except in an adaptive search,
    /// where any index gives that index's seeded random draw (the runs of random search
    /// without a cap, and bayes's random proposals).
    pub fn job(&self, index: u64) -> Option<JobSpec> {
        if self.search.is_adaptive() {
            self.plan.draw(index)
        } else {
            self.plan.job(index)
        }
    }

    /// All jobs built at submission, in index order.
    pub fn jobs(&self) -> impl Iterator<Item = JobSpec> + '_ {
        (0..self.count()).filter_map(|index| self.plan.job(index))
    }

    /// The searched parameters in proposal coordinates (see [`crate::search::Space`]).
    pub fn space(&self) -> Space {
        self.plan.space()
    }

    /// Builds job `index` from proposed `values` (coordinates of [`Sweep::space`]); `None`
    /// when there are not as many values as parameters.
    pub fn job_from(&self, index: u64, values: &[f64]) -> Option<JobSpec> {
        self.plan.job_from(index, values)
    }

    /// A finished job's params (its `params` JSON) in the coordinates of [`Sweep::space`], for
    /// [`crate::search::Trial`]; `None` when they do not fit this sweep's parameters.
    pub fn coordinates(&self, params: &serde_json::Value) -> Option<Vec<f64>> {
        params::coordinates(&self.plan, params)
    }

    fn new(
        form: SweepForm,
        settings: common::Settings,
        plan: plan::Plan,
        search: Search,
        early_stop: Option<EarlyStop>,
        warnings: Vec<String>,
    ) -> Sweep {
        let common::Settings {
            name,
            metric,
            metric_target,
            resources,
            priority,
            priority_class,
            preemptible,
            retries,
            timeout_secs,
            fail_fast,
            environment,
        } = settings;
        Sweep {
            name,
            form,
            metric,
            metric_target,
            resources,
            priority,
            priority_class,
            preemptible,
            retries,
            timeout_secs,
            fail_fast,
            search,
            early_stop,
            environment,
            warnings,
            plan,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sweep_can_be_shared_between_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Sweep>();
        let sweep = Sweep::parse("command: x\ngrid: {a: [1, 2]}", &ExpandOptions::default()).unwrap();
        let from_thread = std::thread::scope(|scope| scope.spawn(|| sweep.job(1)).join().unwrap());
        assert_eq!(from_thread.map(|job| job.command), Some("x".to_owned()));
    }
}
