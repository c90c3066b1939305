//! Adaptive sweeps as the server's controller will drive them: a proposal becomes a job, a
//! finished job's params become the model's coordinates again, and the spread order of a
//! capped grid covers every axis.

use shared::search::{propose, Search, Trial};
use shared::sweep::{ExpandOptions, Sweep};

fn parse(yaml: &str) -> Sweep {
    Sweep::parse(yaml, &ExpandOptions::default()).unwrap_or_else(|error| panic!("{error}\n{yaml}"))
}

const BAYES: &str = "method: bayes\nprogram: t.py\nmetric: {name: loss}\nparameters:\n  \
                     lr: {distribution: log_uniform_values, min: 1e-5, max: 1e-1}\n  \
                     bs: {values: [32, 64, 128]}\n  layers: {min: 1, max: 8}\n  \
                     opt: {parameters: {momentum: {distribution: q_uniform, min: 0, max: 1, q: 0.1}}}\n";

#[test]
fn proposals_become_jobs_and_jobs_become_coordinates_again() {
    let sweep = parse(BAYES);
    let space = sweep.space();
    assert_eq!(space.params.len(), 4);
    let mut finished = Vec::new();
    for number in 0..25u64 {
        let proposal = propose(&space, false, &finished, &[], 11, number);
        let job = sweep.job_from(number, &proposal.values).expect("a job for the sweep's own space");
        assert_eq!(job.index, number);
        let params: serde_json::Value = serde_json::from_str(&job.params).unwrap();
        assert!([32, 64, 128].contains(&params["bs"].as_i64().unwrap()));
        let coordinates = sweep.coordinates(&params).expect("params fit the space");
        assert_eq!(coordinates.len(), 4);
        let loss = (params["lr"].as_f64().unwrap().log10() + 3.0).abs() + params["layers"].as_f64().unwrap() / 10.0;
        finished.push(Trial { values: coordinates, metric: Some(loss) });
    }
    assert!(sweep.job_from(0, &[1.0]).is_none(), "too few values");
}

#[test]
fn random_without_run_cap_draws_any_index() {
    let sweep = parse("method: random\nprogram: t.py\nparameters: {lr: {min: 0.0, max: 1.0}}\n");
    assert_eq!(sweep.search, Search::AdaptiveRandom { seed: 0 });
    assert_eq!(sweep.count(), 0);
    let far = sweep.job(123_456).unwrap();
    assert_eq!(Some(far.clone()), sweep.job(123_456), "a draw depends on its index only");
    assert_ne!(far.params, sweep.job(123_457).unwrap().params);
}

#[test]
fn native_search_keys_make_searches() {
    let tpe = parse("command: x {a}\nsearch: tpe\nmax_runs: 40\nmetric: {name: loss}\nearly_stop: {type: asha, eta: 3}\ngrid: {a: [1, 2, 3]}\n");
    assert_eq!(tpe.search, Search::Bayes { seed: 0, run_cap: Some(40), sampler: shared::search::Sampler::Tpe });
    assert_eq!(tpe.job_from(3, &[2.0]).unwrap().command, "x 3");
    let random = parse("command: x {a}\nsearch: random\nmax_runs: 5\nseed: 3\ngrid: {a: [1, 2, 3]}\n");
    assert_eq!((random.search, random.count()), (Search::Random { seed: 3 }, 5));
}

#[test]
fn a_spread_capped_grid_covers_every_axis_and_reports_the_full_count() {
    let yaml = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/vaep-grid.yaml")).unwrap();
    let capped = parse(&format!("{yaml}\nmax_runs: 24\nmax_runs_order: spread\n"));
    assert_eq!((capped.count(), capped.full_count()), (24, 108));
    let jobs: Vec<serde_json::Value> = capped.jobs().map(|job| serde_json::from_str(&job.params).unwrap()).collect();
    for (axis, values) in [("lr", 3), ("batch_size", 3), ("hidden_dims", 4), ("horizon", 3)] {
        let seen: std::collections::HashSet<String> = jobs.iter().map(|job| job[axis].to_string()).collect();
        assert_eq!(seen.len(), values, "{axis}");
    }
    let in_order = parse(&format!("{yaml}\nmax_runs: 24\n"));
    let lrs: std::collections::HashSet<String> = in_order.jobs().map(|job| job.params[..12].to_owned()).collect();
    assert_eq!(lrs.len(), 1, "in order, 24 of 108 stay at the first lr");
}

#[test]
fn environment_keys_are_exposed() {
    let sweep = parse("command: x\nenv: {OMP_NUM_THREADS: 4}\nsetup: source .venv/bin/activate\ncode: none\n");
    assert_eq!(sweep.environment.env, [("OMP_NUM_THREADS".to_owned(), "4".to_owned())]);
    assert_eq!(sweep.environment.code, shared::sweep::Code::None);
    assert_eq!(sweep.environment.setup.as_deref(), Some("source .venv/bin/activate"));
}
