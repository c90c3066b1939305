//! `app-bench search --queue`: app's bayes through the real queue on the problems of
//! `search_table`, against the same proposals made by calling the proposal functions (what
//! the rest of `app-bench search` reports). Per problem and number of job slots (1 and 8), a
//! real server and one real worker with that many slots; each seed is a W&B `method: bayes`
//! sweep of 100 runs, submitted when the one before it has ended. A run is this binary
//! (`app-bench search-run`), which reads its parameters from `APP_PARAMS`, reports the
//! problem's value (with its noise, drawn from the run's index) to `$APP_METRICS_FILE` and
//! its true value beside it. Runs are counted in the order they finished. Prints figures;
//! asserts nothing.
//!
//! With one slot each proposal knows every result before it, so the queue's runs are the
//! functions' runs; "agree to" is the median number of first runs that are (to 1e-9 of each
//! value: a GP amplifies any difference in the last digits, so a lower figure means the
//! server's model saw something else). With 8 slots the order in which runs end is the
//! queue's own, so the figures are a second measurement.

use crate::processes::{options, wait_for, Processes};
use crate::search_table::{at_checkpoints, quartiles, Quartiles, CHECKPOINTS, PROBLEMS, TRIALS};
use anyhow::Context;
use client::Client;
use shared::api::{Job, JobQuery, SubmitQuery};
use shared::search::{Param, Sampler, Space};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long one sweep of 100 runs may take before the benchmark gives up on it.
const SWEEP_LIMIT: Duration = Duration::from_secs(600);

/// `app-bench search-run PROBLEM SEED`: one run of a sweep, inside a job.
#[derive(Debug, clap::Args)]
pub struct SearchRunArgs {
    pub problem: String,
    pub seed: u64,
}

/// Reports the run's value to `$APP_METRICS_FILE`: `loss` (what the model sees) and `truth`.
pub fn search_run(args: &SearchRunArgs) -> anyhow::Result<()> {
    let problem = PROBLEMS.iter().find(|problem| problem.name == args.problem).context("no such problem")?;
    let params: serde_json::Value = serde_json::from_str(&std::env::var("APP_PARAMS").context("APP_PARAMS")?)?;
    let index: u64 = std::env::var("APP_INDEX").context("APP_INDEX")?.parse()?;
    let values = values_of(&params, &problem.space()).context("the run's parameters")?;
    let (reported, truth) = problem.run(&values, args.seed, index);
    let line = serde_json::json!({"step": 1, "loss": reported, "truth": truth});
    let path = std::env::var_os("APP_METRICS_FILE").context("APP_METRICS_FILE")?;
    use std::io::Write;
    writeln!(std::fs::OpenOptions::new().append(true).create(true).open(path)?, "{line}")?;
    Ok(())
}

/// A run's parameters (`p0`, `p1`, ... as [`sweep_file`] names them) as the space's values.
fn values_of(params: &serde_json::Value, space: &Space) -> Option<Vec<f64>> {
    (0..space.params.len()).map(|index| params[format!("p{index}")].as_f64()).collect()
}

/// The W&B sweep file of `space`: parameter `p{i}` for the space's parameter `i` (a
/// categorical one's values are its choices' indexes, as the functions' runs hold them).
fn sweep_file(name: &str, problem: &str, space: &Space, seed: u64, program: &str) -> String {
    let params: Vec<String> = space
        .params
        .iter()
        .enumerate()
        .map(|(index, param)| {
            let spec = match param {
                Param::Float { low, high, log: false, .. } => format!("{{min: {low:?}, max: {high:?}}}"),
                Param::Float { low, high, log: true, .. } => {
                    format!("{{distribution: log_uniform_values, min: {low:?}, max: {high:?}}}")
                }
                Param::Int { low, high } => format!("{{distribution: int_uniform, min: {low}, max: {high}}}"),
                // None of the problems has one; a constant 0 is what the functions' runs hold.
                Param::Fixed => "{value: 0}".to_owned(),
                Param::Categorical { choices } => {
                    format!("{{values: [{}]}}", (0..*choices).map(|c| c.to_string()).collect::<Vec<_>>().join(", "))
                }
            };
            format!("  p{index}: {spec}\n")
        })
        .collect();
    format!(
        "name: {name}\nmethod: bayes\nseed: {seed}\nrun_cap: {TRIALS}\nmetric: {{name: loss, goal: minimize}}\n\
         parameters:\n{}command: '{program} search-run {problem} {seed}'\n",
        params.concat()
    )
}

/// The queue's figures for one problem and number of slots.
struct Measured {
    /// Per seed, the true value of the best-reported run at each checkpoint.
    curves: Vec<Vec<f64>>,
    /// Per seed, how many of the first runs were the functions' runs ([`agree`]).
    agree: Vec<f64>,
    /// Seconds from submission to the last run's end, per sweep.
    seconds: Vec<f64>,
}

pub async fn run(seeds: std::ops::Range<u64>, only: &[String]) -> anyhow::Result<()> {
    let program = std::env::current_exe()?.display().to_string();
    // The jobs' command line is split by the shell and quoted by YAML's single quotes.
    anyhow::ensure!(
        !program.contains(|c: char| c.is_whitespace() || "'\"$`\\;&|()<>*?~#!{}[]".contains(c)),
        "app-bench's path {program} would need quoting in a job's command; run it from another"
    );
    println!(
        "search through the real queue: one server, one worker, {TRIALS} runs a sweep; median [q1, q3] over {} seeds",
        seeds.end - seeds.start
    );
    for problem in PROBLEMS.iter().filter(|problem| only.is_empty() || only.iter().any(|name| name == problem.name)) {
        println!("{} ({})", problem.name, if problem.noise > 0.0 { "noise N(0, 0.1)" } else { "exact" });
        println!("  {:<34} {:>28} {:>28} {:>10} {:>9}", "searcher", "at 40 runs", "at 100 runs", "agree to", "s/sweep");
        for slots in [1usize, 8] {
            let measured = through_queue(problem.name, seeds.clone(), slots, &program).await?;
            let functions: Vec<Vec<f64>> = seeds
                .clone()
                .map(|seed| crate::search_table::curve(problem, seed, Some(Sampler::Auto), slots))
                .collect();
            let show = |curves: &[Vec<f64>], at: usize| {
                let (q1, median, q3): Quartiles = quartiles(curves.iter().map(|curve| curve[at]).collect());
                format!("{median:.4} [{q1:.4}, {q3:.4}]")
            };
            let plural = if slots > 1 { "s" } else { "" };
            let seconds = quartiles(measured.seconds.clone()).1;
            println!(
                "  {:<34} {:>28} {:>28} {:>10} {:>9.1}",
                format!("queue auto, {slots} slot{plural}"),
                show(&measured.curves, 0),
                show(&measured.curves, 1),
                format!("run {:.0}", quartiles(measured.agree.clone()).1),
                seconds
            );
            println!(
                "  {:<34} {:>28} {:>28}",
                format!("functions auto, {slots} worker{plural}"),
                show(&functions, 0),
                show(&functions, 1)
            );
        }
    }
    Ok(())
}

/// Runs one sweep per seed of `problem` through a fresh server and a worker of `slots` slots.
async fn through_queue(
    problem: &str,
    seeds: std::ops::Range<u64>,
    slots: usize,
    program: &str,
) -> anyhow::Result<Measured> {
    let spec = PROBLEMS.iter().find(|candidate| candidate.name == problem).context("no such problem")?;
    let space = spec.space();
    let dir = tempfile::tempdir()?;
    let app = crate::app_binary()?;
    let mut processes = Processes(Vec::new());
    let url = processes.server(&app, dir.path(), &[])?;
    let client = Client::with_options(&url, &options(None))?;
    wait_for(Duration::from_secs(30), || async { client.health().await.is_ok() }).await?;
    processes.0.push(
        Command::new(&app)
            .args([
                "--client-only",
                "--url",
                &url,
                "--name",
                "searcher",
                "--max-jobs",
                &slots.to_string(),
                "--work-dir",
            ])
            .arg(dir.path().join("work"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("worker.log"))?)
            .spawn()?,
    );
    let mut measured = Measured { curves: Vec::new(), agree: Vec::new(), seconds: Vec::new() };
    for seed in seeds {
        let name = format!("{problem}-{slots}-{seed}");
        let started = Instant::now();
        client.submit(&sweep_file(&name, problem, &space, seed, program), &SubmitQuery::default()).await?;
        let query = JobQuery { sweep: Some(name.clone()), limit: Some(1000), ..Default::default() };
        let deadline = started + SWEEP_LIMIT;
        let mut jobs: Vec<Job> = loop {
            let jobs = client.jobs(&query).await.map(|page| page.jobs).unwrap_or_default();
            if jobs.len() >= TRIALS && jobs.iter().all(|job| job.status.is_terminal()) {
                break jobs;
            }
            anyhow::ensure!(Instant::now() < deadline, "sweep {name} not done within {SWEEP_LIMIT:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        measured.seconds.push(started.elapsed().as_secs_f64());
        let failed = jobs.iter().filter(|job| !job.metrics.contains_key("truth")).count();
        anyhow::ensure!(failed == 0, "{failed} runs of {name} reported nothing");
        // The order the results came in: by the time each run finished, then its index.
        jobs.sort_by_key(|job| (job.finished_at, job.index));
        let results = jobs.iter().map(|job| (job.metrics["loss"].last, job.metrics["truth"].last));
        measured.curves.push(at_checkpoints(results));
        jobs.sort_by_key(|job| job.index);
        let theirs: Vec<Option<Vec<f64>>> = jobs.iter().map(|job| values_of(&job.params, &space)).collect();
        measured.agree.push(agree(&theirs, &functions_runs(spec, seed, slots)) as f64);
    }
    debug_assert!(measured.curves.iter().all(|curve| curve.len() == CHECKPOINTS.len()));
    Ok(measured)
}

/// How many of the first runs are the same in the queue and the functions, to 1e-9 of each
/// value.
fn agree(queue: &[Option<Vec<f64>>], functions: &[Option<Vec<f64>>]) -> usize {
    let close = |a: &f64, b: &f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-300);
    queue
        .iter()
        .zip(functions)
        .take_while(|pair| match pair {
            (Some(a), Some(b)) => a.len() == b.len() && a.iter().zip(b).all(|(a, b)| close(a, b)),
            _ => false,
        })
        .count()
}

/// The runs the proposal functions make for `seed`, in index order (as `search_table::curve`
/// makes them), to compare with the queue's.
fn functions_runs(problem: &crate::search_table::Problem, seed: u64, slots: usize) -> Vec<Option<Vec<f64>>> {
    crate::search_table::runs(problem, seed, Some(Sampler::Auto), slots).into_iter().map(Some).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared::sweep::{ExpandOptions, Sweep};

    #[test]
    fn each_problem_s_sweep_file_is_its_space_and_its_runs_read_back() {
        for problem in PROBLEMS {
            let yaml = sweep_file("s", problem.name, &problem.space(), 3, "/bin/app-bench");
            let sweep =
                Sweep::parse(&yaml, &ExpandOptions::default()).unwrap_or_else(|error| panic!("{yaml}\n{error}"));
            assert_eq!(sweep.space(), problem.space(), "{}", problem.name);
            assert!(
                matches!(sweep.search, shared::search::Search::Bayes { seed: 3, run_cap: Some(100), .. }),
                "{yaml}"
            );
            // A proposal, as the server would make it into a job, gives the values back.
            let values = shared::search::propose(&problem.space(), false, &[], &[], 3, 0).values;
            let job = sweep.job_from(0, &values).expect("a job of the sweep's space");
            let params: serde_json::Value = serde_json::from_str(&job.params).unwrap();
            assert_eq!(values_of(&params, &problem.space()), Some(values), "{}", problem.name);
        }
    }
}
