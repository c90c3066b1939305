//! Adaptive search, pure: what a sweep asks for ([`Search`], [`EarlyStop`]), the next
//! parameters to try ([`propose_by`]: a Gaussian process or TPE over the finished trials, as
//! [`Sampler`] chooses), and whether a running trial
//! should stop early ([`early_stop::decide`], Hyperband/ASHA rungs or a median rule).
//!
//! No I/O and no clock: the server's sweep controller (outside this crate) reads the finished
//! and running trials and their metric histories from its database, calls these functions,
//! and applies what they decide (a new job, a cancel). Given the same inputs they return the
//! same answer, so a controller restarted after a crash proposes and stops exactly as before.

#[cfg(test)]
mod comparison;
pub mod early_stop;
mod gp;
pub mod gp_sampler;
mod kernels;
mod lbfgs;
pub mod problems;
pub mod space;
pub mod tpe;
mod warp;

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
    /// Proposals from the finished runs' metric (a Gaussian process or TPE, as `sampler`
    /// says), made when a worker asks for work; at most `run_cap` runs, else until stopped.
    Bayes { seed: u64, run_cap: Option<u64>, sampler: Sampler },
}

/// The model a bayes sweep proposes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sampler {
    /// By the space: where the GP models it (1 to [`GP_MAX_DIMS`] dimensions, a categorical
    /// parameter counting one per choice), the GP proposes, and from [`TPE_FROM_DIMS`]
    /// dimensions every [`TPE_EVERY`]th run is TPE's; [`Sampler::Tpe`] otherwise (W&B's
    /// `method: bayes`, native `search: bayes`).
    Auto,
    /// The tree-structured Parzen estimator (`search: tpe`).
    Tpe,
    /// A Gaussian process with log expected improvement (`search: gp`), categorical parameters
    /// one-hot; a space it does not model (more than [`GP_MAX_DIMS`] dimensions, a categorical
    /// counting one per choice) is proposed for by TPE.
    Gp,
}

/// The most searched parameters the GP models; beyond, its fit costs more than its gain.
pub const GP_MAX_DIMS: usize = 20;

/// Of [`Sampler::Auto`]'s runs on a space the GP models in [`TPE_FROM_DIMS`] dimensions or
/// more, each run whose number is one below a multiple of this is TPE's. TPE's per-parameter densities find the good region of each
/// parameter on its own, where the GP's expected improvement keeps refining one basin or
/// probing the box's corners; the GP then models TPE's runs like its own (decision 0082).
pub const TPE_EVERY: u64 = 3;

/// The fewest dimensions where [`Sampler::Auto`] gives runs to TPE: in one or two the GP's
/// expected improvement covers the box, and TPE's runs only slow its refinement (Branin at
/// 40 runs over 30 seeds: 0.3982 with them, 0.3980 without; decision 0093).
pub const TPE_FROM_DIMS: usize = 3;

impl Sampler {
    /// The model that proposes for `space`: [`Sampler::Gp`] or [`Sampler::Tpe`].
    pub fn resolve(self, space: &Space) -> Sampler {
        match self {
            Sampler::Tpe => Sampler::Tpe,
            Sampler::Auto | Sampler::Gp if gp_sampler::models(space, GP_MAX_DIMS) => Sampler::Gp,
            Sampler::Auto | Sampler::Gp => Sampler::Tpe,
        }
    }

    /// The model that proposes run `number` on `space`: [`Sampler::Gp`] or [`Sampler::Tpe`].
    pub fn for_run(self, space: &Space, number: u64) -> Sampler {
        match self.resolve(space) {
            Sampler::Gp if self.interleaves(space) && number % TPE_EVERY == TPE_EVERY - 1 => Sampler::Tpe,
            resolved => resolved,
        }
    }

    /// Whether some runs on `space` are TPE's among the GP's: [`Sampler::Auto`]'s, from
    /// [`TPE_FROM_DIMS`] dimensions.
    fn interleaves(self, space: &Space) -> bool {
        self == Sampler::Auto && gp_sampler::dimension_count(space) >= TPE_FROM_DIMS
    }

    /// "GP", "GP and TPE" or "TPE", for `space`.
    pub fn label(self, space: &Space) -> &'static str {
        match (self, self.resolve(space)) {
            (_, Sampler::Gp) if self.interleaves(space) => "GP and TPE",
            (_, Sampler::Gp) => "GP",
            _ => "TPE",
        }
    }
}

/// Proposes trial `number` of a sweep seeded `seed` with the model `sampler` chooses for it
/// ([`Sampler::for_run`]; see [`tpe::propose`] for the arguments).
pub fn propose_by(
    sampler: Sampler,
    space: &Space,
    maximize: bool,
    finished: &[Trial],
    pending: &[Vec<f64>],
    seed: u64,
    number: u64,
) -> Proposal {
    Proposer::new(sampler, space, maximize, finished, seed).propose(pending, number)
}

/// The proposals of one sweep for one set of finished trials, as [`propose_by`] makes them,
/// with the GP's kernel fitted once however many runs are proposed (a claim batch makes several,
/// each with the previous ones pending): each proposal is still a function of its arguments.
pub struct Proposer<'a> {
    sampler: Sampler,
    space: &'a Space,
    maximize: bool,
    finished: &'a [Trial],
    seed: u64,
    gp: std::cell::OnceCell<Option<gp_sampler::Prepared>>,
}

impl<'a> Proposer<'a> {
    pub fn new(sampler: Sampler, space: &'a Space, maximize: bool, finished: &'a [Trial], seed: u64) -> Self {
        Proposer { sampler, space, maximize, finished, seed, gp: std::cell::OnceCell::new() }
    }

    /// Trial `number`, with the runs at `pending` queued or running.
    pub fn propose(&self, pending: &[Vec<f64>], number: u64) -> Proposal {
        let (space, finished, seed) = (self.space, self.finished, self.seed);
        let gp = match self.sampler.for_run(space, number) {
            Sampler::Gp => self
                .gp
                .get_or_init(|| gp_sampler::prepare(space, self.maximize, finished))
                .as_ref()
                .and_then(|prepared| gp_sampler::propose_with(prepared, space, finished, pending, seed, number)),
            _ => None,
        };
        gp.unwrap_or_else(|| propose(space, self.maximize, finished, pending, seed, number))
    }
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

    /// For the dry run: "adaptive (bayes, GP and TPE): up to 50 runs", "adaptive (random): runs
    /// until stopped"; a bayes search names the models it uses on `space`.
    pub fn describe(&self, space: &Space) -> Option<String> {
        match self {
            Search::Bayes { run_cap: Some(cap), sampler, .. } => {
                Some(format!("adaptive (bayes, {}): up to {cap} runs", sampler.label(space)))
            }
            Search::Bayes { run_cap: None, sampler, .. } => {
                Some(format!("adaptive (bayes, {}): runs until stopped", sampler.label(space)))
            }
            Search::AdaptiveRandom { .. } => Some("adaptive (random): runs until stopped".to_owned()),
            Search::Grid | Search::Random { .. } => None,
        }
    }
}
