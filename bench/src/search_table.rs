//! The search comparison of `app-bench search` (issue 32): app's bayes (auto, TPE, GP) and
//! random search on eight problems, with 1 and 8 runs in flight, against Optuna's samplers when
//! `bench/search/optuna_bench.py` gives their results on the same problems, seeds and noise.
//!
//! Problems (defined identically in the Python file): Branin, Hartmann-6, Rosenbrock-4 on a
//! log-scaled range ([0.01, 10] each, log-uniform), Styblinski-Tang-8, a mixed space (two
//! log-uniform floats, an integer, two categoricals), Hartmann-6 with N(0, 0.1) noise on
//! what a run reports, four value lists (`choices4`) and a 15-choice categorical with two log
//! floats (`wide_choice`). Each figure is the *true* value of the run that reported the best
//! value so far (the one a researcher would pick), after 40 and 100 runs: median and
//! quartiles over the seeds.
//!
//! With `workers` > 1, runs go as a queue of that many workers runs them when each takes the
//! same time: the first `workers` are proposed at once, then each finishing run (the oldest)
//! is followed by a proposal that sees the others still running (`pending`), as the server's
//! controller proposes when a worker claims. This is the proposals' own path without the
//! server (`propose_by`), not the queue itself.

use serde_json::Value;
use shared::search::{propose, propose_by, Param, Sampler, Space, Trial};
use std::collections::VecDeque;

pub const TRIALS: usize = 100;
pub const CHECKPOINTS: [usize; 2] = [40, 100];

#[derive(Clone, Copy)]
pub struct Problem {
    pub name: &'static str,
    space: fn() -> Space,
    truth: fn(&[f64]) -> f64,
    /// The standard deviation of the Gaussian noise on what a run reports.
    pub noise: f64,
}

pub const PROBLEMS: [Problem; 8] = [
    Problem { name: "branin", space: branin_space, truth: branin, noise: 0.0 },
    Problem { name: "hartmann6", space: unit_cube::<6>, truth: hartmann6, noise: 0.0 },
    Problem { name: "rosenbrock4_log", space: rosenbrock_space, truth: rosenbrock, noise: 0.0 },
    Problem { name: "styblinski_tang8", space: styblinski_space, truth: styblinski_tang, noise: 0.0 },
    Problem { name: "mixed5", space: mixed_space, truth: mixed, noise: 0.0 },
    Problem { name: "noisy_hartmann6", space: unit_cube::<6>, truth: hartmann6, noise: 0.1 },
    Problem { name: "choices4", space: choices_space, truth: choices, noise: 0.0 },
    Problem { name: "wide_choice", space: wide_choice_space, truth: wide_choice, noise: 0.0 },
];

impl Problem {
    pub fn space(&self) -> Space {
        (self.space)()
    }

    /// Run `number` of a sweep seeded `seed` at `values`: what it reports (its true value and
    /// the problem's noise) and its true value.
    pub fn run(&self, values: &[f64], seed: u64, number: u64) -> (f64, f64) {
        let truth = (self.truth)(values);
        (truth + self.noise * gaussian(seed, number), truth)
    }
}

fn float(low: f64, high: f64, log: bool) -> Param {
    Param::Float { low, high, log, step: None }
}

fn branin_space() -> Space {
    Space { params: vec![float(-5.0, 10.0, false), float(0.0, 15.0, false)] }
}

fn branin(x: &[f64]) -> f64 {
    shared::search::problems::branin(x)
}

fn unit_cube<const N: usize>() -> Space {
    Space { params: vec![float(0.0, 1.0, false); N] }
}

fn hartmann6(x: &[f64]) -> f64 {
    shared::search::problems::hartmann6(x)
}

fn rosenbrock_space() -> Space {
    Space { params: vec![float(0.01, 10.0, true); 4] }
}

/// Σ 100 (x[i+1] - x[i]²)² + (1 - x[i])²; 0 at (1, 1, 1, 1).
fn rosenbrock(x: &[f64]) -> f64 {
    x.windows(2).map(|pair| 100.0 * (pair[1] - pair[0] * pair[0]).powi(2) + (1.0 - pair[0]).powi(2)).sum()
}

fn styblinski_space() -> Space {
    Space { params: vec![float(-5.0, 5.0, false); 8] }
}

/// ½ Σ (x⁴ - 16x² + 5x); -39.166 per dimension at x = -2.9035.
fn styblinski_tang(x: &[f64]) -> f64 {
    0.5 * x.iter().map(|x| x.powi(4) - 16.0 * x * x + 5.0 * x).sum::<f64>()
}

fn mixed_space() -> Space {
    Space {
        params: vec![
            float(1e-5, 1e-1, true),
            float(1e-6, 1e-2, true),
            Param::Int { low: 1, high: 10 },
            Param::Categorical { choices: 3 },
            Param::Categorical { choices: 2 },
        ],
    }
}

/// 1 + (log10 lr + 3)² + ½ (log10 wd + 4)² + (n - 6)²/10 + {0, 0.5, 1}[kind] + {0.3, 0}[act]:
/// 1 at lr = 1e-3, wd = 1e-4, n = 6, kind 0, act 1.
fn mixed(x: &[f64]) -> f64 {
    1.0 + (x[0].log10() + 3.0).powi(2)
        + 0.5 * (x[1].log10() + 4.0).powi(2)
        + (x[2] - 6.0).powi(2) / 10.0
        + [0.0, 0.5, 1.0][x[3] as usize]
        + [0.3, 0.0][x[4] as usize]
}

/// Only categoricals, as a native sweep's value lists: optimizer (3), learning rate (6 listed
/// values), batch size (4), dropout (5); 360 combinations, 18 one-hot dimensions.
fn choices_space() -> Space {
    Space { params: [3, 6, 4, 5].map(|choices| Param::Categorical { choices }).to_vec() }
}

/// 1 + {0.3, 0, 0.05}[opt] + 0.1 (lr - {4, 2, 2}[opt])² + {0.1, 0, 0.05, 0.2}[batch] +
/// {0.15, 0.05, 0, 0.05, 0.3}[dropout]: the best learning rate depends on the optimizer; 1 at
/// (1, 2, 1, 2).
fn choices(x: &[f64]) -> f64 {
    let [opt, lr, batch, dropout] = [x[0], x[1], x[2], x[3]].map(|index| index as usize);
    1.0 + [0.3, 0.0, 0.05][opt]
        + 0.1 * (lr as f64 - [4.0, 2.0, 2.0][opt]).powi(2)
        + [0.1, 0.0, 0.05, 0.2][batch]
        + [0.15, 0.05, 0.0, 0.05, 0.3][dropout]
}

/// A 15-choice categorical (an architecture) and two log-uniform floats (learning rate, weight
/// decay): 17 one-hot dimensions.
fn wide_choice_space() -> Space {
    Space { params: vec![Param::Categorical { choices: 15 }, float(1e-5, 1e-1, true), float(1e-6, 1e-2, true)] }
}

const WIDE_OFFSETS: [f64; 15] = [0.8, 0.35, 1.2, 0.0, 0.6, 0.25, 0.9, 0.45, 1.5, 0.15, 0.7, 0.3, 1.0, 0.5, 0.1];

/// 1 + offset[arch] + (log10 lr + 3 + ½ (arch mod 3 - 1))² + ½ (log10 wd + 4)²: each
/// architecture has its own best learning rate; 1 at arch 3, lr = 10^-2.5, wd = 1e-4.
fn wide_choice(x: &[f64]) -> f64 {
    let arch = x[0] as usize;
    let shift = 0.5 * ((arch % 3) as f64 - 1.0);
    1.0 + WIDE_OFFSETS[arch] + (x[1].log10() + 3.0 + shift).powi(2) + 0.5 * (x[2].log10() + 4.0).powi(2)
}

/// A standard normal draw for run `trial` of `seed` (Box-Muller over two SplitMix64 draws).
fn gaussian(seed: u64, trial: u64) -> f64 {
    let u1 = 1.0 - super::search::unit(seed, trial, 11);
    let u2 = super::search::unit(seed, trial, 12);
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// The true value of the run that reported the best value, after each checkpoint, for one
/// seed; `sampler` `None` is random search.
pub fn curve(problem: &Problem, seed: u64, sampler: Option<Sampler>, workers: usize) -> Vec<f64> {
    at_checkpoints(simulate(problem, seed, sampler, workers).1)
}

/// The runs [`curve`] makes, in index order.
pub fn runs(problem: &Problem, seed: u64, sampler: Option<Sampler>, workers: usize) -> Vec<Vec<f64>> {
    simulate(problem, seed, sampler, workers).0.into_iter().map(|trial| trial.values).collect()
}

/// The runs of one seed (they finish in index order, the oldest first) and their (reported,
/// true) values.
fn simulate(problem: &Problem, seed: u64, sampler: Option<Sampler>, workers: usize) -> (Vec<Trial>, Vec<(f64, f64)>) {
    let space = (problem.space)();
    let mut finished: Vec<Trial> = Vec::with_capacity(TRIALS);
    let mut in_flight: VecDeque<(u64, Vec<f64>)> = VecDeque::new();
    let mut results = Vec::with_capacity(TRIALS);
    let mut next = 0u64;
    while finished.len() < TRIALS {
        while in_flight.len() < workers && (next as usize) < TRIALS {
            let pending: Vec<Vec<f64>> = in_flight.iter().map(|(_, values)| values.clone()).collect();
            let values = match sampler {
                Some(sampler) => propose_by(sampler, &space, false, &finished, &pending, seed, next).values,
                // Random search is the proposer with nothing learned (its random start).
                None => propose(&space, false, &[], &[], seed, next).values,
            };
            in_flight.push_back((next, values));
            next += 1;
        }
        let Some((number, values)) = in_flight.pop_front() else { break };
        let (reported, truth) = problem.run(&values, seed, number);
        results.push((reported, truth));
        finished.push(Trial { values, metric: Some(reported) });
    }
    (finished, results)
}

/// The true value of the run that reported the best value so far, at each of [`CHECKPOINTS`]
/// that many runs are in, from the runs' (reported, true) values in the order they finished.
pub fn at_checkpoints(finished: impl IntoIterator<Item = (f64, f64)>) -> Vec<f64> {
    let (mut best_reported, mut best_true) = (f64::INFINITY, f64::NAN);
    let mut at = Vec::new();
    for (count, (reported, truth)) in finished.into_iter().enumerate() {
        if reported < best_reported {
            (best_reported, best_true) = (reported, truth);
        }
        if CHECKPOINTS.contains(&(count + 1)) {
            at.push(best_true);
        }
    }
    at
}

/// (q1, median, q3).
pub type Quartiles = (f64, f64, f64);

/// The [`Quartiles`] of `values`.
pub fn quartiles(mut values: Vec<f64>) -> Quartiles {
    values.sort_by(f64::total_cmp);
    let at = |q: f64| {
        let position = q * (values.len() - 1) as f64;
        let (low, high) = (position.floor() as usize, position.ceil() as usize);
        values[low] + (values[high] - values[low]) * (position - low as f64)
    };
    (at(0.25), at(0.5), at(0.75))
}

/// Optuna's figures for `problem` and `config` at `trials` runs over those of `seeds` its
/// results have, and how many those are, from the Python file's JSON: `{"first_seed": N,
/// "search": {problem: {config: [[true best after run 1..100] per seed from N]}}}`.
pub fn optuna_at(
    results: &Value,
    problem: &str,
    config: &str,
    trials: usize,
    seeds: &std::ops::Range<u64>,
) -> Option<(Quartiles, usize)> {
    let curves = results["search"][problem][config].as_array()?;
    let first = results["first_seed"].as_u64().unwrap_or(0);
    let values: Option<Vec<f64>> = seeds
        .clone()
        .filter_map(|seed| seed.checked_sub(first).and_then(|index| curves.get(index as usize)))
        .map(|curve| curve.get(trials - 1)?.as_f64())
        .collect();
    values.filter(|values| !values.is_empty()).map(|values| (quartiles(values.clone()), values.len()))
}

/// Prints the table: per problem, a row per searcher, median [q1, q3] at each checkpoint.
pub fn print(seeds: std::ops::Range<u64>, optuna: &[Value], only: &[String], digits: u8) {
    let configs: [(&str, Option<Sampler>, usize); 7] = [
        ("app auto, 1 worker", Some(Sampler::Auto), 1),
        ("app auto, 8 workers", Some(Sampler::Auto), 8),
        ("app TPE, 1 worker", Some(Sampler::Tpe), 1),
        ("app TPE, 8 workers", Some(Sampler::Tpe), 8),
        ("app GP, 1 worker", Some(Sampler::Gp), 1),
        ("app GP, 8 workers", Some(Sampler::Gp), 8),
        ("app random", None, 1),
    ];
    let theirs = ["tpe, 1 worker", "tpe, 8 workers", "gp, 1 worker", "gp, 8 workers", "random, 1 worker"];
    println!(
        "search: the true value of the best-reported run, median [q1, q3] over {} seeds (minimised)",
        seeds.end - seeds.start
    );
    for problem in PROBLEMS.iter().filter(|problem| only.is_empty() || only.iter().any(|name| name == problem.name)) {
        let started = std::time::Instant::now();
        println!("{} ({})", problem.name, if problem.noise > 0.0 { "noise N(0, 0.1)" } else { "exact" });
        println!("  {:<30} {:>28} {:>28}", "searcher", "at 40 runs", "at 100 runs");
        let d = usize::from(digits);
        let show = |(q1, median, q3): Quartiles| format!("{median:.d$} [{q1:.d$}, {q3:.d$}]");
        let space = (problem.space)();
        for (name, sampler, workers) in configs {
            // The model that proposes here: "app GP" on a space of more than 20 dimensions is TPE.
            let name = match sampler {
                Some(sampler) if sampler != Sampler::Tpe => format!("{name} ({})", sampler.label(&space)),
                _ => name.to_owned(),
            };
            let curves: Vec<Vec<f64>> = seeds.clone().map(|seed| curve(problem, seed, sampler, workers)).collect();
            let cells: Vec<String> = (0..CHECKPOINTS.len())
                .map(|at| show(quartiles(curves.iter().map(|curve| curve[at]).collect())))
                .collect();
            println!("  {:<30} {:>28} {:>28}", name, cells[0], cells[1]);
        }
        for config in theirs {
            let cells: Vec<Option<(Quartiles, usize)>> = CHECKPOINTS
                .iter()
                .map(|trials| {
                    optuna.iter().find_map(|results| optuna_at(results, problem.name, config, *trials, &seeds))
                })
                .collect();
            if cells.iter().all(Option::is_some) {
                let cells: Vec<(Quartiles, usize)> = cells.into_iter().flatten().collect();
                // Fewer of the seeds than app's rows: said, as the medians are over fewer.
                let name = match cells[0].1 as u64 == seeds.end - seeds.start {
                    true => format!("optuna {config}"),
                    false => format!("optuna {config} ({} seeds)", cells[0].1),
                };
                let cells: Vec<String> = cells.into_iter().map(|(figures, _)| show(figures)).collect();
                println!("  {:<30} {:>28} {:>28}", name, cells[0], cells[1]);
            }
        }
        eprintln!("  ({} took {:.1?} for app's searches)", problem.name, started.elapsed());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_problems_have_their_known_minima() {
        assert!((rosenbrock(&[1.0; 4])).abs() < 1e-12);
        assert!((styblinski_tang(&[-2.903534; 8]) + 39.16617 * 8.0).abs() < 1e-3);
        assert!((mixed(&[1e-3, 1e-4, 6.0, 0.0, 1.0]) - 1.0).abs() < 1e-12);
        assert!((choices(&[1.0, 2.0, 1.0, 2.0]) - 1.0).abs() < 1e-12);
        assert!((wide_choice(&[3.0, 10f64.powf(-2.5), 1e-4]) - 1.0).abs() < 1e-12);
        let draws: Vec<f64> = (0..4000).map(|trial| gaussian(3, trial)).collect();
        let mean = draws.iter().sum::<f64>() / 4000.0;
        let variance = draws.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 4000.0;
        assert!(mean.abs() < 0.05 && (variance - 1.0).abs() < 0.1, "{mean} {variance}");
    }

    #[test]
    fn the_true_value_of_the_best_reported_run_is_what_is_counted() {
        let noisy = Problem { noise: 0.1, ..PROBLEMS[1] };
        let curve = curve(&noisy, 0, None, 1);
        assert_eq!(curve.len(), CHECKPOINTS.len());
        // The run with the best report, whose true value may be above another run's.
        let space = unit_cube::<6>();
        let runs: Vec<(f64, f64)> = (0..40)
            .map(|number| {
                let values = propose(&space, false, &[], &[], 0, number).values;
                let truth = hartmann6(&values);
                (truth + 0.1 * gaussian(0, number), truth)
            })
            .collect();
        let picked = runs.iter().min_by(|a, b| a.0.total_cmp(&b.0)).unwrap().1;
        assert_eq!(curve[0], picked);
    }
}
