//! Data parallelism over c10d with Gloo, two ranks as two threads of this test: after k steps
//! their weights equal those of one process trained on the full batches, and a rank that
//! leaves makes the other fail promptly instead of waiting forever.

use super::{config, weights};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tch::{Device, Tensor};
use trainer::torch::data::{self, Data};
use trainer::torch::loader::{Loader, LoaderOptions};
use trainer::torch::step::{Ddp, Engine};
use trainer::torch::ProcessGroup;

const YAML: &str = "data: {samples: 600, features: 12, classes: 3}\nmodel: {hidden_dims: [32, 16]}\n\
    optimizer: {name: adam, lr: 0.01}\nbatch_size: 64\ndevice: cpu\nthreads: 1\n";
const YAML_ACCUMULATING: &str = "data: {samples: 600, features: 12, classes: 3}\nmodel: {hidden_dims: [32, 16]}\n\
    optimizer: {name: adam, lr: 0.01}\nbatch_size: 64\ndevice: cpu\nthreads: 1\ngrad_accum: 2\n";

/// The ranks are threads of one process here, and libtorch's random generator is global: the
/// draws that must match the single process's (weights, epoch order) take turns.
static GENERATOR: Mutex<()> = Mutex::new(());

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `steps` steps over an epoch's shuffled batches as rank `rank` of `ranks` (alone: 0 of 1).
fn train_steps(data: &Data, engine: &mut Engine, rank: usize, ranks: usize, steps: usize) -> Result<(), String> {
    let options = LoaderOptions { rank, ranks, min_step_rows: ranks, ..LoaderOptions::single(64, Device::Cpu) };
    let loader = {
        let _turn = GENERATOR.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        tch::manual_seed(7);
        Loader::shuffled(&data.train, options).unwrap()
    };
    for batch in loader.take(steps) {
        engine.step(&batch).map_err(|error| error.to_string())?;
    }
    Ok(())
}

fn rank_engine(port: u16, rank: usize, yaml: &str) -> Result<(Data, Engine), String> {
    let config = config(yaml);
    let (data, mut engine) = {
        let _turn = GENERATOR.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let data = data::load(&config.data, config.seed).unwrap();
        let engine = Engine::new(&config, &data, Device::Cpu).unwrap();
        (data, engine)
    };
    let group = ProcessGroup::join("127.0.0.1", port, rank, 2, None, Duration::from_secs(30))?;
    engine.join(Ddp { group, rank, world: 2 }, 25).map_err(|error| error.to_string())?;
    Ok((data, engine))
}

#[test]
fn two_gloo_ranks_end_with_the_weights_of_one_process_on_the_full_batches() {
    // Also with two micro-batches per rank: only the last one's backward all-reduces.
    for ranks_yaml in [YAML, YAML_ACCUMULATING] {
        ranks_match_one_process(ranks_yaml);
    }
}

fn ranks_match_one_process(ranks_yaml: &'static str) {
    let steps = 6;
    let config = config(YAML);
    let (data, mut single) = {
        let _turn = GENERATOR.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let data = data::load(&config.data, config.seed).unwrap();
        let engine = Engine::new(&config, &data, Device::Cpu).unwrap();
        (data, engine)
    };
    let start = weights(&single);
    train_steps(&data, &mut single, 0, 1, steps).unwrap();

    let port = free_port();
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            std::thread::spawn(move || -> Result<Vec<Tensor>, String> {
                let (data, mut engine) = rank_engine(port, rank, ranks_yaml)?;
                train_steps(&data, &mut engine, rank, 2, steps)?;
                Ok(weights(&engine))
            })
        })
        .collect();
    let results: Vec<Vec<Tensor>> = ranks.into_iter().map(|rank| rank.join().unwrap().unwrap()).collect();
    for ((reference, first), second) in weights(&single).iter().zip(&results[0]).zip(&results[1]) {
        assert!(first.equal(second), "the ranks agree exactly");
        assert!(first.allclose(reference, 1e-4, 1e-5, false), "{first} vs {reference}");
    }
    assert!(start.iter().zip(&results[0]).any(|(before, after)| !before.allclose(after, 1e-3, 1e-3, false)));
}

#[test]
fn a_rank_that_leaves_makes_the_other_fail_instead_of_waiting() {
    let port = free_port();
    let leaver = std::thread::spawn(move || {
        let (data, mut engine) = rank_engine(port, 1, YAML).unwrap();
        train_steps(&data, &mut engine, 1, 2, 2).unwrap();
        // Dropping the engine tears this rank's Gloo connections down, as a dead process would.
    });
    let started = Instant::now();
    let (data, mut engine) = rank_engine(port, 0, YAML).unwrap();
    let outcome = train_steps(&data, &mut engine, 0, 2, 1000);
    leaver.join().unwrap();
    let error = outcome.unwrap_err();
    assert!(error.starts_with("data-parallel collective failed"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(25), "failed only after the timeout: {error}");
}
