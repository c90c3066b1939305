//! `app-bench search`: app's TPE, GP and random search, and its Hyperband/ASHA early stopping,
//! on standard test problems, side by side with Optuna when `--optuna FILE` gives Optuna's
//! results on the same problems (`bench/search/run.sh` makes that file and runs this verb).
//! Also `--hostile`: how long hostile sweep files take to be refused. Prints figures; asserts
//! nothing.
//!
//! The problems are defined identically in `bench/search/optuna_bench.py`: Branin (2-D),
//! Hartmann-6, and a noisy quadratic over a mixed space (a categorical, an integer, a
//! log-scaled float), noise and learning curves drawn from SplitMix64 so both languages see the
//! same numbers. Budgets: 100 trials, best-so-far read at 20, 50 and 100, over `--seeds` seeds.

use std::collections::BTreeMap;
use std::time::Instant;

use clap::Args;
use serde_json::Value;
use shared::search::early_stop::{hyperband_rungs, History};
use shared::search::{decide, propose, propose_by, Decision, EarlyStop, Param, RungKind, Sampler, Space, Trial};
use shared::sweep::{ExpandOptions, Sweep};

#[derive(Debug, Args)]
pub struct BenchSearchArgs {
    /// Seeds per problem.
    #[arg(long, default_value_t = 15)]
    pub seeds: u64,
    /// The first seed (seeds run from here).
    #[arg(long, default_value_t = 0)]
    pub first_seed: u64,
    /// Optuna's results (JSON from bench/search/optuna_bench.py) to compare with.
    #[arg(long)]
    pub optuna: Option<std::path::PathBuf>,
    /// Time the refusal of hostile sweep files instead.
    #[arg(long)]
    pub hostile: bool,
}

const TRIALS: usize = 100;
const CHECKPOINTS: [usize; 3] = [20, 50, 100];
const CONFIGS: usize = 81;
const MAX_STEP: u64 = 81;

pub async fn run(args: BenchSearchArgs) -> anyhow::Result<()> {
    if args.hostile {
        hostile();
        return Ok(());
    }
    let optuna: Option<Value> = match &args.optuna {
        Some(path) => Some(serde_json::from_str(&std::fs::read_to_string(path)?)?),
        None => None,
    };
    println!("search: median best value over {} seeds (minimised); ratio = app / Optuna TPE", args.seeds);
    println!("(hartmann6 is negative: there a ratio above 1 means app found lower values;");
    println!(" app GP is `search: gp`, which proposes by TPE on a space with a categorical parameter)");
    println!(
        "{:<18} {:>6} {:>12} {:>12} {:>12} {:>12} {:>9} {:>9}",
        "problem", "trials", "app TPE", "app GP", "app random", "Optuna TPE", "TPE/Opt", "GP/Opt"
    );
    for problem in PROBLEMS {
        let started = Instant::now();
        let seeds = args.first_seed..args.first_seed + args.seeds;
        let tpe = medians(&best_curves(problem, seeds.clone(), Some(Sampler::Tpe)));
        let gp = medians(&best_curves(problem, seeds.clone(), Some(Sampler::Gp)));
        let random = medians(&best_curves(problem, seeds, None));
        let theirs = optuna.as_ref().and_then(|results| results["search"][problem.name].as_array().cloned());
        for (position, trials) in CHECKPOINTS.iter().enumerate() {
            let optuna_median = theirs.as_ref().and_then(|seeds| median_at(seeds, *trials));
            let ratio = |ours: f64| optuna_median.map_or("-".to_owned(), |theirs| format!("{:.3}", ours / theirs));
            let shown = optuna_median.map_or("-".to_owned(), |value| format!("{value:.5}"));
            println!(
                "{:<18} {:>6} {:>12.5} {:>12.5} {:>12.5} {:>12} {:>9} {:>9}",
                problem.name,
                trials,
                tpe[position],
                gp[position],
                random[position],
                shown,
                ratio(tpe[position]),
                ratio(gp[position])
            );
        }
        eprintln!("  ({} took {:.1?} for the three app searches)", problem.name, started.elapsed());
    }
    proposal_costs();
    println!();
    println!(
        "early stopping: {CONFIGS} configs of up to {MAX_STEP} steps, run one after another, {} curve sets",
        args.seeds
    );
    println!("{:<36} {:>14} {:>22}", "rule (eta 3)", "compute saved", "true best in top 3");
    // W&B hyperband and native ASHA share the rung rule; min_iter 1 and 3 as Optuna's
    // min_resource 1 and 3.
    let rungs = |min_iter| EarlyStop::Rungs {
        kind: RungKind::Hyperband,
        rungs: hyperband_rungs(Some(min_iter), Some(MAX_STEP), None, 3.0),
        eta: 3.0,
    };
    let rules = [
        ("app hyperband/asha (min 1)", rungs(1)),
        ("app hyperband/asha (min 3)", rungs(3)),
        ("app median (warmup 5)", EarlyStop::Median { warmup_steps: 5, min_runs: 5 }),
    ];
    for (name, rule) in rules {
        let (saved, kept) = early_stopping(&rule, args.first_seed..args.first_seed + args.seeds);
        println!("{:<36} {:>13.1}% {:>15} of {:>3}", name, saved * 100.0, kept, args.seeds);
    }
    if let Some(results) = &optuna {
        if let Some(pruners) = results["pruning"].as_object() {
            for (name, figures) in pruners {
                let saved = figures["saved"].as_f64().unwrap_or(f64::NAN);
                let kept = figures["best_in_top3"].as_u64().unwrap_or(0);
                println!("{:<36} {:>13.1}% {:>15} of {:>3}", format!("optuna {name}"), saved * 100.0, kept, args.seeds);
            }
        }
    }
    Ok(())
}

/// What one GP proposal costs at 200 finished runs (and 8 running), on 2, 6 and 20 floats:
/// the median of 9 proposals.
fn proposal_costs() {
    println!();
    println!("GP proposal cost at 200 finished runs and 8 running (median of 9):");
    for dims in [2usize, 6, 20] {
        let space = Space { params: vec![float(0.0, 1.0); dims] };
        let point = |i: u64| (0..dims as u64).map(|d| unit(i, d, 3)).collect::<Vec<f64>>();
        let finished: Vec<Trial> = (0..200)
            .map(|i| {
                let values = point(i);
                let metric = values.iter().map(|x| (x - 0.3).powi(2)).sum::<f64>();
                Trial { values, metric: Some(metric) }
            })
            .collect();
        let pending: Vec<Vec<f64>> = (200..208).map(point).collect();
        let mut costs: Vec<f64> = (0..9)
            .map(|number| {
                let started = Instant::now();
                let proposal = propose_by(Sampler::Gp, &space, false, &finished, &pending, 1, 208 + number);
                assert!(proposal.random_because.is_none());
                started.elapsed().as_secs_f64() * 1000.0
            })
            .collect();
        println!("  {dims:>2} dimensions: {:.1} ms", median(std::mem::take(&mut costs)));
    }
}

// --- search problems --------------------------------------------------------------------

#[derive(Clone, Copy)]
struct Problem {
    name: &'static str,
    space: fn() -> Space,
    objective: fn(&[f64], u64, u64) -> f64,
}

const PROBLEMS: [Problem; 3] = [
    Problem { name: "branin", space: branin_space, objective: branin },
    Problem { name: "hartmann6", space: hartmann_space, objective: hartmann6 },
    Problem { name: "noisy_mixed", space: mixed_space, objective: noisy_mixed },
];

fn float(low: f64, high: f64) -> Param {
    Param::Float { low, high, log: false, step: None }
}

fn branin_space() -> Space {
    Space { params: vec![float(-5.0, 10.0), float(0.0, 15.0)] }
}

fn branin(x: &[f64], _seed: u64, _trial: u64) -> f64 {
    shared::search::problems::branin(x)
}

fn hartmann_space() -> Space {
    Space { params: vec![float(0.0, 1.0); 6] }
}

fn hartmann6(x: &[f64], _seed: u64, _trial: u64) -> f64 {
    shared::search::problems::hartmann6(x)
}

fn mixed_space() -> Space {
    Space {
        params: vec![
            Param::Categorical { choices: 3 },
            Param::Int { low: 1, high: 10 },
            Param::Float { low: 1e-5, high: 1e-1, log: true, step: None },
        ],
    }
}

/// 1 + (log10 lr + 3)^2 + (n - 6)^2 / 10 + {0, 0.5, 1}[kind] + noise in [-0.1, 0.1).
fn noisy_mixed(x: &[f64], seed: u64, trial: u64) -> f64 {
    let offset = [0.0, 0.5, 1.0][x[0] as usize];
    let noise = 0.1 * (2.0 * unit(seed, trial, 7) - 1.0);
    1.0 + (x[2].log10() + 3.0).powi(2) + (x[1] - 6.0).powi(2) / 10.0 + offset + noise
}

/// Best-so-far at each checkpoint, per seed, proposed by `sampler` (random search: `None`).
fn best_curves(problem: Problem, seeds: std::ops::Range<u64>, sampler: Option<Sampler>) -> Vec<Vec<f64>> {
    let space = (problem.space)();
    seeds
        .map(|seed| {
            let mut finished: Vec<Trial> = Vec::with_capacity(TRIALS);
            let mut best = f64::INFINITY;
            let mut at = Vec::new();
            for number in 0..TRIALS as u64 {
                // Random search is the proposer with nothing learned (its random start).
                let values = match sampler {
                    Some(sampler) => propose_by(sampler, &space, false, &finished, &[], seed, number).values,
                    None => propose(&space, false, &[], &[], seed, number).values,
                };
                let value = (problem.objective)(&values, seed, number);
                best = best.min(value);
                finished.push(Trial { values, metric: Some(value) });
                if CHECKPOINTS.contains(&(number as usize + 1)) {
                    at.push(best);
                }
            }
            at
        })
        .collect()
}

fn medians(curves: &[Vec<f64>]) -> Vec<f64> {
    (0..CHECKPOINTS.len()).map(|position| median(curves.iter().map(|curve| curve[position]).collect())).collect()
}

fn median_at(seeds: &[Value], trials: usize) -> Option<f64> {
    let values: Option<Vec<f64>> = seeds.iter().map(|curve| curve.get(trials - 1)?.as_f64()).collect();
    values.map(median)
}

fn median(mut values: Vec<f64>) -> f64 {
    trainer::bench::median(&mut values)
}

// --- learning curves ---------------------------------------------------------------------

/// Loss of config `config` at step `step` (1-based): `final + amplitude * step^-rate` plus a
/// little noise, so early rankings differ from final ones.
fn curve(seed: u64, config: u64, step: u64) -> f64 {
    let last = 0.1 + 0.9 * unit(seed, config, 0);
    let amplitude = 0.5 + 2.0 * unit(seed, config, 1);
    let rate = 0.3 + 0.7 * unit(seed, config, 2);
    last + amplitude * (step as f64).powf(-rate) + 0.02 * (unit(seed, config, 100 + step) - 0.5)
}

/// (fraction of steps saved against training every config to the end, seeds in which the
/// config with the best noise-free final loss finished among the best 3 completed runs).
fn early_stopping(rule: &EarlyStop, seeds: std::ops::Range<u64>) -> (f64, u64) {
    let mut saved = Vec::new();
    let mut kept = 0;
    for seed in seeds {
        let mut histories: Vec<Vec<(u64, f64)>> = Vec::new();
        let mut completed: Vec<(f64, u64)> = Vec::new();
        let mut steps = 0u64;
        for config in 0..CONFIGS as u64 {
            let mut history = Vec::new();
            for step in 1..=MAX_STEP {
                history.push((step, curve(seed, config, step)));
                steps += 1;
                let others: Vec<History<'_>> = histories.iter().map(Vec::as_slice).collect();
                if matches!(decide(rule, false, &others, &history), Decision::Stop { .. }) {
                    break;
                }
            }
            if history.len() as u64 == MAX_STEP {
                completed.push((history[history.len() - 1].1, config));
            }
            histories.push(history);
        }
        saved.push(1.0 - steps as f64 / (CONFIGS as u64 * MAX_STEP) as f64);
        let truth = (0..CONFIGS as u64).min_by(|a, b| final_loss(seed, *a).total_cmp(&final_loss(seed, *b)));
        completed.sort_by(|a, b| a.0.total_cmp(&b.0));
        if completed.iter().take(3).any(|(_, config)| Some(*config) == truth) {
            kept += 1;
        }
    }
    (median(saved), kept)
}

fn final_loss(seed: u64, config: u64) -> f64 {
    let last = 0.1 + 0.9 * unit(seed, config, 0);
    let amplitude = 0.5 + 2.0 * unit(seed, config, 1);
    let rate = 0.3 + 0.7 * unit(seed, config, 2);
    last + amplitude * (MAX_STEP as f64).powf(-rate)
}

/// Uniform in [0, 1) from SplitMix64 of (seed, a, b); the Python side computes the same.
fn unit(seed: u64, a: u64, b: u64) -> f64 {
    let mut state = seed.wrapping_mul(1_000_003).wrapping_add(a.wrapping_mul(1_009)).wrapping_add(b);
    state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    state = (state ^ (state >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    state = (state ^ (state >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    state ^= state >> 31;
    (state >> 11) as f64 / (1u64 << 53) as f64
}

// --- hostile sweep files -------------------------------------------------------------------

/// Times `Sweep::parse` on hostile files up to the 4 MiB body limit.
fn hostile() {
    const LIMIT: usize = 4 << 20;
    let fill = |unit: &str, open: &str, close: &str| {
        let count = (LIMIT - 16) / (open.len() + close.len()).max(unit.len());
        (open.repeat(count), close.repeat(count))
    };
    let mut cases: BTreeMap<&str, String> = BTreeMap::new();
    let (open, close) = fill("", "[", "]");
    cases.insert("flow [ nesting (2M levels)", format!("a: {open}{close}"));
    let (open, close) = fill("", "{a: ", "}");
    cases.insert("flow { nesting", format!("a: {open}x{close}"));
    cases.insert("block - nesting (2M levels)", format!("a:\n{}x\n", "- ".repeat(LIMIT / 2 - 8)));
    cases.insert("block indent nesting", (0..2800).map(|depth| format!("{}k:\n", " ".repeat(depth))).collect());
    cases.insert("long flow sequence (2M items)", format!("a: [{}]\n", vec!["1"; LIMIT / 2 - 8].join(",")));
    cases.insert("long block sequence", format!("a:\n{}", "- 1\n".repeat(LIMIT / 4 - 8)));
    let zeros = vec!["0"; 6000].join(",");
    let aliases = vec!["*a"; (LIMIT - zeros.len()) / 3 - 16].join(",");
    cases.insert("alias fan-out", format!("command: run\nx: &a [{zeros}]\ny: [{aliases}]\n"));
    let mut laughs = String::from("a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for level in b'b'..=b'i' {
        let previous = (level - 1) as char;
        let items = vec![format!("*{previous}"); 9].join(", ");
        laughs.push_str(&format!("{}: &{} [{items}]\n", level as char, level as char));
    }
    cases.insert("billion laughs", laughs);
    cases.insert("CVLab 100,000 axes", (0..100_000).map(|key| format!("k{key}: [1, 2]\n")).collect());
    println!("{:<32} {:>9} {:>10} {:>10}  outcome", "hostile sweep file", "bytes", "wall", "cpu");
    for (name, text) in cases {
        let cpu_before = thread_cpu_ns();
        let started = Instant::now();
        let result = Sweep::parse(&text, &ExpandOptions::default());
        let elapsed = started.elapsed();
        let cpu = match (cpu_before, thread_cpu_ns()) {
            (Some(before), Some(after)) => format!("{:.1}ms", (after - before) as f64 / 1e6),
            _ => "-".to_owned(),
        };
        let outcome = match result {
            Ok(sweep) => format!("accepted ({} jobs)", sweep.count()),
            Err(error) => error.to_string().chars().take(70).collect(),
        };
        println!("{name:<32} {:>9} {:>8.1}ms {cpu:>10}  {outcome}", text.len(), elapsed.as_secs_f64() * 1e3);
    }
}

/// This thread's time on a CPU in nanoseconds (Linux `schedstat`), so the figures do not
/// depend on what else the machine is running.
fn thread_cpu_ns() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    stat.split_whitespace().next()?.parse().ok()
}
