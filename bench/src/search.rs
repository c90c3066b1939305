//! `app-bench search`: app's bayes (auto, TPE, GP) and random search on six problems with 1
//! and 8 runs in flight (`search_table`), the GP's proposal cost, and Hyperband/ASHA early
//! stopping on synthetic learning curves, side by side with Optuna when `--optuna FILE` gives
//! Optuna's results on the same problems (`bench/search/run.sh` makes that file and runs this
//! verb). Also `--hostile`: how long hostile sweep files take to be refused. Prints figures;
//! asserts nothing.
//!
//! Noise and learning curves are drawn from SplitMix64 (`unit`), so the Python side
//! (`bench/search/optuna_bench.py`) sees the same numbers.

use std::collections::BTreeMap;
use std::time::Instant;

use clap::Args;
use serde_json::Value;
use shared::search::early_stop::{hyperband_rungs, History};
use shared::search::{decide, propose_by, Decision, EarlyStop, Param, Proposer, RungKind, Sampler, Space, Trial};
use shared::sweep::{ExpandOptions, Sweep};

#[derive(Debug, Args)]
pub struct BenchSearchArgs {
    /// Seeds per problem.
    #[arg(long, default_value_t = 15)]
    pub seeds: u64,
    /// The first seed (seeds run from here).
    #[arg(long, default_value_t = 0)]
    pub first_seed: u64,
    /// Optuna's results (JSON from bench/search/optuna_bench.py) to compare with; may be
    /// given again (GPSampler's run apart from TPE's): a figure comes from the first file
    /// that has it.
    #[arg(long)]
    pub optuna: Vec<std::path::PathBuf>,
    /// Only these problems (comma separated: branin, hartmann6, rosenbrock4_log,
    /// styblinski_tang8, mixed5, noisy_hartmann6, choices4, wide_choice); all by default.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Decimals of the figures printed (more tell medians that agree to 4 apart).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u8).range(1..=9))]
    pub digits: u8,
    /// Time the refusal of hostile sweep files instead.
    #[arg(long)]
    pub hostile: bool,
    /// Run app's auto choice through a real server and worker instead, beside the proposal
    /// functions' figures (`search_queue`).
    #[arg(long)]
    pub queue: bool,
}

/// How many seeds Optuna's results hold (files written before they said so): the length of
/// one problem's curves.
fn seeds_in(results: &Value) -> Option<u64> {
    let problems = results["search"].as_object()?;
    let configs = problems.values().next()?.as_object()?;
    Some(configs.values().next()?.as_array()?.len() as u64)
}

const CONFIGS: usize = 81;
const MAX_STEP: u64 = 81;

pub async fn run(args: BenchSearchArgs) -> anyhow::Result<()> {
    if args.hostile {
        hostile();
        return Ok(());
    }
    anyhow::ensure!(args.seeds > 0, "--seeds must be at least 1");
    if args.queue {
        return crate::search_queue::run(args.first_seed..args.first_seed + args.seeds, &args.only).await;
    }
    let optuna = args
        .optuna
        .iter()
        .map(|path| Ok(serde_json::from_str(&std::fs::read_to_string(path)?)?))
        .collect::<anyhow::Result<Vec<Value>>>()?;
    crate::search_table::print(args.first_seed..args.first_seed + args.seeds, &optuna, &args.only, args.digits);
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
    for results in &optuna {
        if let Some(pruners) = results["pruning"].as_object() {
            for (name, figures) in pruners {
                let saved = figures["saved"].as_f64().unwrap_or(f64::NAN);
                let kept = figures["best_in_top3"].as_u64().unwrap_or(0);
                // Optuna's pruners over its own seeds, which may be more than app's here.
                let seeds = results["seeds"].as_u64().or_else(|| seeds_in(results)).unwrap_or(args.seeds);
                println!("{:<36} {:>13.1}% {:>15} of {:>3}", format!("optuna {name}"), saved * 100.0, kept, seeds);
            }
        }
    }
    Ok(())
}

/// What one GP proposal costs at 200 finished runs (and 8 running), on 2, 6 and 20 floats:
/// the median of 9 proposals.
fn proposal_costs() {
    println!();
    println!("GP proposal cost at 200 finished runs and 8 running (median of 9); a claim batch of 8 (median of 5):");
    for dims in [2usize, 6, 20] {
        let space = Space { params: vec![Param::Float { low: 0.0, high: 1.0, log: false, step: None }; dims] };
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
        // A claim batch's 8 runs: one proposer (one fit), or a fit per run as before.
        let batch = |shared: bool| {
            let times: Vec<f64> = (0..5)
                .map(|batch| {
                    let started = Instant::now();
                    let proposer = Proposer::new(Sampler::Gp, &space, false, &finished, 1);
                    let mut pending = pending.clone();
                    for number in (0..8).map(|number| 208 + 8 * batch + number) {
                        pending.push(match shared {
                            true => proposer.propose(&pending, number).values,
                            false => propose_by(Sampler::Gp, &space, false, &finished, &pending, 1, number).values,
                        });
                    }
                    started.elapsed().as_secs_f64() * 1000.0
                })
                .collect();
            median(times)
        };
        let one = median(std::mem::take(&mut costs));
        let (fitted_once, fitted_each) = (batch(true), batch(false));
        println!("  {dims:>2} dimensions: {one:.1} ms; 8 runs: {fitted_once:.1} ms, {fitted_each:.1} ms fitting each");
    }
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
pub(crate) fn unit(seed: u64, a: u64, b: u64) -> f64 {
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
