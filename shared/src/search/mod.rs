//! Adaptive search, pure: what a sweep asks for ([`Search`], [`EarlyStop`]), the next
//! parameters to try ([`propose`], TPE over the finished trials), and whether a running trial
//! should stop early ([`early_stop::decide`], Hyperband/ASHA rungs or a median rule).
//!
//! No I/O and no clock: the server's sweep controller (outside this crate) reads the finished
//! and running trials and their metric histories from its database, calls these functions,
//! and applies what they decide (a new job, a cancel). Given the same inputs they return the
//! same answer, so a controller restarted after a crash proposes and stops exactly as before.

#[cfg(test)]
mod comparison;
pub mod early_stop;
mod kernels;
pub mod problems;
pub mod space;
pub mod tpe;

pub use early_stop::{decide, Decision, EarlyStop, RungKind};
pub use space::{Param, Space};
pub use tpe::{propose, Proposal, Trial};

/// How a sweep chooses its runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Search {
    /// The cartesian product, every job built up front from its index.
    Grid,
    /// Seeded random draws with a known count (`run_cap` / `max_runs`): built up front.
    Random { seed: u64 },
    /// Seeded random draws until the sweep is stopped (W&B `random` with no `run_cap`): job
    /// `i` is still a pure function of `i`, made when a worker asks for work.
    AdaptiveRandom { seed: u64 },
    /// Tree-structured Parzen estimator proposals from the finished runs' metric, made when a
    /// worker asks for work; at most `run_cap` runs, else until stopped.
    Bayes { seed: u64, run_cap: Option<u64> },
}

impl Search {
    /// Whether runs are made one at a time by the controller rather than all at submission.
    pub fn is_adaptive(&self) -> bool {
        matches!(self, Search::AdaptiveRandom { .. } | Search::Bayes { .. })
    }

    /// The most runs an adaptive search makes; `None` runs until stopped.
    pub fn run_cap(&self) -> Option<u64> {
        match self {
            Search::Bayes { run_cap, .. } => *run_cap,
            _ => None,
        }
    }

    /// For the dry run: "adaptive: up to 50 runs", "adaptive: runs until stopped".
    pub fn describe(&self) -> Option<String> {
        match self {
            Search::Bayes { run_cap: Some(cap), .. } => Some(format!("adaptive (bayes, TPE): up to {cap} runs")),
            Search::Bayes { run_cap: None, .. } => Some("adaptive (bayes, TPE): runs until stopped".to_owned()),
            Search::AdaptiveRandom { .. } => Some("adaptive (random): runs until stopped".to_owned()),
            Search::Grid | Search::Random { .. } => None,
        }
    }
}
