//! The adaptive side of a sweep as the API shows it: what a submission will do (runs proposed
//! one at a time, runs stopped early), where a sweep's controller stands, and how a run was
//! stopped early.

use crate::search::{EarlyStop, RungKind, Search};
use crate::sweep::Sweep;
use serde::{Deserialize, Serialize};

/// What a sweep's search does, for the dry run and the answer to a submission.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchPlan {
    /// "adaptive (bayes, GP and TPE): up to 20 runs", "adaptive (random): runs until stopped"; `None`
    /// when every job is built at submission.
    pub adaptive: Option<String>,
    /// The most runs an adaptive search makes; `None` runs until the sweep is cancelled.
    pub run_cap: Option<u64>,
    /// How runs are stopped early, in a sentence; `None` when they are not.
    pub early_stop: Option<String>,
}

impl SearchPlan {
    /// The plan of a parsed sweep; `None` for a sweep that is neither adaptive nor stops runs.
    pub fn of(sweep: &Sweep) -> Option<SearchPlan> {
        let adaptive = sweep.search.describe(&sweep.space());
        let early_stop = sweep.early_stop.as_ref().map(describe_early_stop);
        if adaptive.is_none() && early_stop.is_none() {
            return None;
        }
        let run_cap = if sweep.search.is_adaptive() { sweep.search.run_cap() } else { None };
        Some(SearchPlan { adaptive, run_cap, early_stop })
    }
}

/// An early-stopping rule in a sentence.
pub fn describe_early_stop(rule: &EarlyStop) -> String {
    match rule {
        EarlyStop::Rungs { kind, rungs, eta } => {
            const SHOWN: usize = 8;
            let name = match kind {
                RungKind::Hyperband => "hyperband",
                RungKind::Asha => "asha",
            };
            let mut steps: Vec<String> = rungs.iter().take(SHOWN).map(u64::to_string).collect();
            if rungs.len() > SHOWN {
                steps.push("...".to_owned());
            }
            format!(
                "early stopping ({name}): at steps {}, a run outside the best 1/{eta} of the runs there stops",
                steps.join(", ")
            )
        }
        EarlyStop::Median { warmup_steps, min_runs } => format!(
            "early stopping (median): from step {warmup_steps}, a run worse than the median of at least \
             {min_runs} other runs at its step stops"
        ),
    }
}

/// Which way a sweep's runs are made, for [`SearchState`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SearchMethod {
    /// Proposed from the finished runs' metric (TPE).
    Bayes,
    /// Seeded random draws, made one at a time.
    Random,
    /// Built at submission; the controller only stops runs early.
    Fixed,
}

impl SearchMethod {
    pub fn of(search: &Search) -> SearchMethod {
        match search {
            Search::Bayes { .. } => SearchMethod::Bayes,
            Search::AdaptiveRandom { .. } => SearchMethod::Random,
            Search::Grid | Search::Random { .. } => SearchMethod::Fixed,
        }
    }
}

/// Where a sweep's controller stands (in `GET /api/sweeps/{sweep}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchState {
    pub method: SearchMethod,
    pub seed: u64,
    pub run_cap: Option<u64>,
    /// Runs made so far (the next run's index).
    pub proposed: u64,
    /// Whether the controller still makes runs (no cap reached, not cancelled).
    pub open: bool,
    /// Whether runs are being stopped early.
    pub early_stop: bool,
    /// Runs stopped early so far.
    pub stopped_early: u64,
    /// What happened to the search, in sentences (random proposals for want of the metric,
    /// the cap reached, the sweep cancelled).
    pub notes: Vec<String>,
}

/// How a run was stopped early (a job whose status is `cancelled` and that has this is
/// "stopped early", not cancelled by hand).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoppedEarly {
    /// The step it was judged at (a rung, or its step under the median rule).
    pub rung: u64,
    /// The value it had to reach; `None` when its own metric was not a number.
    pub cutoff: Option<f64>,
    /// The decision in a sentence, naming the rung and the cutoff.
    pub reason: String,
    pub at: i64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sweep::ExpandOptions;

    fn plan(yaml: &str) -> Option<SearchPlan> {
        SearchPlan::of(&Sweep::parse(yaml, &ExpandOptions::default()).unwrap())
    }

    #[test]
    fn plans_say_how_many_runs_and_how_runs_stop() {
        let bayes = plan(
            "method: bayes\nrun_cap: 20\nmetric: {name: loss}\nparameters: {x: {min: 0.0, max: 1.0}}\n\
             early_terminate: {type: hyperband, min_iter: 2, eta: 3}\ncommand: [echo, '${args}']\n",
        )
        .unwrap();
        assert_eq!(
            bayes.adaptive.as_deref(),
            Some("adaptive (bayes, GP): up to 20 runs"),
            "one dimension: the GP alone"
        );
        assert_eq!(bayes.run_cap, Some(20));
        let early = bayes.early_stop.unwrap();
        assert!(
            early.starts_with("early stopping (hyperband): at steps 2, 6, 18, 54, 162, 486, 1458, 4374, ..."),
            "{early}"
        );
        let random = plan("method: random\nparameters: {x: {values: [1, 2]}}\ncommand: [echo]\n").unwrap();
        assert_eq!((random.adaptive.as_deref(), random.run_cap), (Some("adaptive (random): runs until stopped"), None));
        assert_eq!(plan("command: echo {x}\ngrid: {x: [1, 2]}\n"), None);
        let median =
            plan("command: echo {x}\ngrid: {x: [1, 2]}\nmetric: {name: loss}\nearly_stop: {type: median}\n").unwrap();
        assert_eq!(median.adaptive, None);
        assert!(median.early_stop.unwrap().contains("median of at least 5 other runs"));
    }
}
