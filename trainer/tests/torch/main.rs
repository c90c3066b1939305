//! The trainer on libtorch, on the CPU: learning, loss scaling and mixed precision
//! (`learning`), checkpoints read by Python's torch (`checkpoint`), two Gloo ranks against one
//! process (`ddp`), and the bench's out-of-memory handling (`bench`).
#![cfg(feature = "torch")]

mod bench;
mod checkpoint;
mod ddp;
mod learning;

use tch::{Device, Kind, Tensor};
use trainer::config::TrainConfig;
use trainer::torch::data;
use trainer::torch::loader::Batch;
use trainer::torch::step::Engine;
use trainer::torch::train::Outputs;

pub fn config(yaml: &str) -> TrainConfig {
    TrainConfig::from_yaml(yaml).unwrap()
}

pub fn outputs(dir: &std::path::Path) -> Outputs {
    Outputs { dir: dir.to_path_buf(), metrics_file: Some(dir.join("metrics.jsonl")), echo: false }
}

pub const SEPARABLE: &str = "data: {source: synthetic, samples: 4000, features: 16, classes: 2}\n\
    model: {hidden_dims: [64]}\noptimizer: {name: adam, lr: 0.01}\nbatch_size: 128\nepochs: 6\ndevice: cpu\nthreads: 1\n";

/// SEPARABLE with other epochs and model settings (a YAML flow mapping's inside).
pub fn separable(epochs: usize, model: &str) -> String {
    SEPARABLE
        .replace("epochs: 6", &format!("epochs: {epochs}"))
        .replace("model: {hidden_dims: [64]}", &format!("model: {{{model}}}"))
}

/// An engine on the CPU and the first 64 training rows as one step's batch.
pub fn small_engine(yaml: &str) -> (Engine, Batch) {
    let config = config(yaml);
    let data = data::load(&config.data, config.seed).unwrap();
    let engine = Engine::new(&config, &data, Device::Cpu).unwrap();
    let rows = Tensor::arange(64, (Kind::Int64, Device::Cpu));
    let batch = Batch { x: data.train.x.index_select(0, &rows), y: data.train.y.index_select(0, &rows), step_rows: 64 };
    (engine, batch)
}

pub fn weights(engine: &Engine) -> Vec<Tensor> {
    engine.params().iter().map(Tensor::copy).collect()
}

pub fn gradients(engine: &Engine) -> Vec<Tensor> {
    engine.params().iter().map(|variable| variable.grad().copy()).collect()
}

/// The repository's root (the trainer crate is one level down).
pub fn repo() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Some virtual machines (Firecracker among them) report AMX in CPUID but fault on its
/// instructions, and oneDNN's bf16 matmuls then die with SIGILL (Python's torch as well). Capping
/// oneDNN at AVX-512 bf16 keeps bf16 tests about autocast rather than the host. Each nextest
/// test is its own process, and this runs before its first tensor operation.
pub fn avoid_unusable_amx() {
    std::env::set_var("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16");
}
