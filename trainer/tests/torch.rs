//! The trainer on libtorch, on the CPU: learning, checkpoints, loss scaling, data
//! parallelism, mixed precision and the bench's OOM handling.
#![cfg(feature = "torch")]

use tch::{Device, Kind, Tensor};
use trainer::bench::BenchStatus;
use trainer::config::{Amp, Task, TrainConfig};
use trainer::torch::bench::{Bench, BenchOptions};
use trainer::torch::data;
use trainer::torch::device::Devices;
use trainer::torch::loader::Batch;
use trainer::torch::step::Engine;
use trainer::torch::train::{evaluate_checkpoint, train, Outputs};

fn config(yaml: &str) -> TrainConfig {
    TrainConfig::from_yaml(yaml).unwrap()
}

fn outputs(dir: &std::path::Path) -> Outputs {
    Outputs { dir: dir.to_path_buf(), metrics_file: Some(dir.join("metrics.jsonl")), echo: false }
}

const SEPARABLE: &str = "data: {source: synthetic, samples: 4000, features: 16, classes: 2}\n\
    model: {hidden_dims: [64]}\noptimizer: {name: adam, lr: 0.01}\nbatch_size: 128\nepochs: 6\ndevice: cpu\nthreads: 1\n";

#[test]
fn separable_data_is_learned_and_the_best_checkpoint_reproduces_its_val_loss() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(SEPARABLE);
    let summary = train(&config, &outputs(dir.path())).unwrap();
    let history = &summary.history;
    let first_loss = history[0]["train_loss"].as_f64().unwrap();
    let last = history.last().unwrap();
    assert!(last["train_loss"].as_f64().unwrap() < first_loss / 2.0, "{history:?}");
    assert!(last["val_accuracy"].as_f64().unwrap() > 0.95, "{history:?}");

    // Every file the run promises, and one metrics line per epoch.
    for file in ["model_best.pt", "model_best.json", "config.json", "training_history.json", "training.log"] {
        assert!(dir.path().join(file).is_file(), "{file} missing");
    }
    let lines = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 6);
    let line: serde_json::Value = serde_json::from_str(lines.lines().next().unwrap()).unwrap();
    for key in ["step", "train_loss", "val_loss", "val_accuracy", "samples_per_s", "lr"] {
        assert!(line[key].is_number(), "{key} in {line}");
    }

    let best = summary.best_value.unwrap();
    let best_epoch = summary.best_epoch.unwrap();
    assert_eq!(history[best_epoch - 1]["val_loss"].as_f64().unwrap(), best);
    let reloaded = evaluate_checkpoint(&config, &dir.path().join("model_best.pt")).unwrap();
    assert!((reloaded.loss - best).abs() < 1e-6, "reloaded {} vs best {best}", reloaded.loss);
}

#[test]
fn resume_continues_after_the_checkpoints_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let first = config(&format!("{SEPARABLE}checkpoint_every: 2\n"));
    let mut short = first.clone();
    short.epochs = 2;
    train(&short, &outputs(dir.path())).unwrap();
    let mut resumed = first.clone();
    resumed.epochs = 4;
    resumed.resume = Some(dir.path().join("model_epoch_002.pt"));
    let summary = train(&resumed, &outputs(dir.path())).unwrap();
    let epochs: Vec<u64> = summary.history.iter().map(|entry| entry["epoch"].as_u64().unwrap()).collect();
    assert_eq!(epochs, vec![1, 2, 3, 4]);
    assert!(summary.history[2]["train_loss"].as_f64().unwrap() < summary.history[0]["train_loss"].as_f64().unwrap());
}

fn small_engine(yaml: &str, replicas: usize) -> (Engine, Batch) {
    let config = config(yaml);
    let data = data::load(&config.data, config.seed).unwrap();
    let devices = Devices { replicas: vec![Device::Cpu; replicas], cuda: false };
    let engine = Engine::new(&config, &data, &devices).unwrap();
    let rows = Tensor::arange(64, (Kind::Int64, Device::Cpu));
    let batch = Batch { x: data.train.x.index_select(0, &rows), y: data.train.y.index_select(0, &rows) };
    (engine, batch)
}

fn gradients(engine: &Engine) -> Vec<Tensor> {
    engine.master().vs.trainable_variables().iter().map(|variable| variable.grad().copy()).collect()
}

#[test]
fn two_replicas_average_to_the_full_batch_gradient() {
    let yaml = "data: {samples: 256, features: 8, classes: 3}\nmodel: {hidden_dims: [16, 16]}\ndevice: cpu\n";
    let (mut single, batch) = small_engine(yaml, 1);
    let (mut pair, _) = small_engine(yaml, 2);
    let (mut pair_accum, _) = small_engine(&format!("{yaml}grad_accum: 4\n"), 2);
    let loss_single = single.accumulate(&batch);
    let loss_pair = pair.accumulate(&batch);
    let _ = pair_accum.accumulate(&batch);
    assert!((loss_single.double_value(&[]) - loss_pair.double_value(&[])).abs() < 1e-6);
    let (full, averaged, accumulated) = (gradients(&single), gradients(&pair), gradients(&pair_accum));
    assert_eq!(full.len(), 6);
    for ((full, averaged), accumulated) in full.iter().zip(&averaged).zip(&accumulated) {
        assert!(full.abs().sum(Kind::Float).double_value(&[]) > 0.0);
        assert!(full.allclose(averaged, 1e-5, 1e-6, false), "{full} vs {averaged}");
        assert!(full.allclose(accumulated, 1e-5, 1e-6, false));
    }
    // One step on each leaves every replica with the same weights as the single one.
    single.apply();
    pair.apply();
    for replica in &pair.replicas {
        for (name, weight) in replica.vs.variables() {
            let reference = &single.master().vs.variables()[&name];
            assert!(weight.allclose(reference, 1e-5, 1e-6, false), "{name}");
        }
    }
}

#[test]
fn the_fp16_loss_scaler_skips_a_step_with_an_inf_gradient_and_lowers_the_scale() {
    // fp16 autocast needs CUDA; the scaler's tensor work is the same on the CPU, so the engine
    // runs in fp32 here with the scaler of `amp: fp16`.
    let yaml = "data: {samples: 256, features: 8}\nmodel: {hidden_dims: [8]}\ndevice: cpu\namp: fp16\n\
        loss_scale: {init: 1024, growth_interval: 2}\n";
    let config = config(yaml);
    let data = data::load(&config.data, 0).unwrap();
    let mut engine = Engine::new(&config, &data, &Devices { replicas: vec![Device::Cpu], cuda: false }).unwrap();
    engine.amp = Amp::Off;
    let batch = Batch { x: data.train.x.narrow(0, 0, 32), y: data.train.y.narrow(0, 0, 32) };
    let weights =
        |engine: &Engine| engine.master().vs.trainable_variables().iter().map(Tensor::copy).collect::<Vec<_>>();

    let before = weights(&engine);
    let _ = engine.accumulate(&batch);
    let grad = engine.master().vs.trainable_variables()[0].grad();
    let _ = grad.narrow(0, 0, 1).fill_(f64::INFINITY);
    assert!(!engine.apply(), "the step with an inf gradient is skipped");
    let scaler = engine.scaler.as_ref().unwrap();
    assert_eq!(scaler.scale(), 512.0);
    assert_eq!(scaler.skipped(), 1);
    for (old, new) in before.iter().zip(weights(&engine)) {
        assert!(old.equal(&new), "a skipped step changes no weight");
    }

    // Clean steps apply with correctly unscaled gradients, and two of them grow the scale.
    let _ = engine.accumulate(&batch);
    let scaled_grad = engine.master().vs.trainable_variables()[0].grad().copy();
    assert!(engine.apply());
    assert_eq!(engine.scaler.as_ref().unwrap().scale(), 512.0);
    let (mut reference, _) = small_engine(yaml.replace("amp: fp16", "amp: off").as_str(), 1);
    let _ = reference
        .master()
        .vs
        .trainable_variables()
        .iter()
        .zip(before.iter())
        .map(|(variable, old)| {
            tch::no_grad(|| variable.shallow_clone().copy_(old));
        })
        .count();
    let _ = reference.accumulate(&batch);
    let plain_grad = reference.master().vs.trainable_variables()[0].grad();
    assert!((scaled_grad / 512.0).allclose(&plain_grad, 1e-4, 1e-6, false), "the loss was scaled by the scale");
    let _ = engine.accumulate(&batch);
    assert!(engine.apply());
    assert_eq!(engine.scaler.as_ref().unwrap().scale(), 1024.0);
    assert!(weights(&engine).iter().zip(&before).any(|(new, old)| !new.equal(old)));
}

#[test]
fn bf16_autocast_runs_matmuls_in_bf16_on_the_cpu_and_trains() {
    let linear_output = |amp: Amp| {
        let autocast = trainer::torch::amp::Autocast::enter(amp, false);
        assert_eq!(autocast.active(), amp != Amp::Off);
        assert_eq!(trainer::torch::amp::autocast_enabled(false), amp != Amp::Off);
        let x = Tensor::randn([4, 8], (Kind::Float, Device::Cpu));
        let w = Tensor::randn([8, 2], (Kind::Float, Device::Cpu));
        x.matmul(&w).kind()
    };
    assert_eq!(linear_output(Amp::Bf16), Kind::BFloat16);
    assert_eq!(linear_output(Amp::Off), Kind::Float);
    assert!(!trainer::torch::amp::autocast_enabled(false), "leaving the guard turns autocast off");

    let dir = tempfile::tempdir().unwrap();
    let summary = train(&config(&format!("{SEPARABLE}amp: bf16\n")), &outputs(dir.path())).unwrap();
    assert!(summary.history.last().unwrap()["val_accuracy"].as_f64().unwrap() > 0.9, "{:?}", summary.history);
}

#[test]
fn regression_from_a_csv_reports_val_mae() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = String::from("a,b,target\n");
    for row in 0..400 {
        let (a, b) = ((row % 20) as f64 / 10.0, (row % 7) as f64 / 3.0);
        text.push_str(&format!("{a},{b},{}\n", 2.0 * a - b));
    }
    let csv = dir.path().join("data.csv");
    std::fs::write(&csv, text).unwrap();
    let yaml = format!(
        "data: {{source: csv, path: {}, label: target, task: regression}}\nmodel: {{hidden_dims: [32]}}\n\
         optimizer: {{lr: 0.01}}\nbatch_size: 32\nepochs: 20\ndevice: cpu\nearly_stopping: {{metric: val_mae}}\n",
        csv.display()
    );
    let summary = train(&config(&yaml), &outputs(&dir.path().join("out"))).unwrap();
    let last = summary.history.last().unwrap();
    assert!(last["val_mae"].as_f64().unwrap() < 0.2, "{last:?}");
    assert!(last.get("val_accuracy").is_none());
    assert_eq!(summary.best_metric, "val_mae");
}

#[test]
fn data_mistakes_name_the_key_and_the_row() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("data.csv");
    std::fs::write(&csv, "x,label\n1,0\n2,1\nNaN,0\n").unwrap();
    let load = |extra: &str| {
        let yaml = format!("data: {{source: csv, path: {}{extra}}}\n", csv.display());
        data::load(&config(&yaml).data, 0).unwrap_err().to_string()
    };
    assert_eq!(load(""), "at data.path: NaN in row 3, column `x`");
    let missing = load(", label: y");
    assert!(missing.starts_with("at data.label: no column `y`"), "{missing}");
    std::fs::write(&csv, "x,label\n1,0.5\n2,1\n").unwrap();
    assert!(load("").starts_with("at data.label: class labels must be whole numbers"));

    let x = dir.path().join("x.npy");
    Tensor::from_slice(&[1.0f32, 2.0, f32::NAN, 4.0, 5.0, 6.0]).reshape([3, 2]).write_npy(&x).unwrap();
    let y = dir.path().join("y.npy");
    Tensor::from_slice(&[0i64, 1, 0]).write_npy(&y).unwrap();
    let yaml = format!("data: {{source: npy, path: {}, labels: {}}}\n", x.display(), y.display());
    let error = data::load(&config(&yaml).data, 0).unwrap_err().to_string();
    assert_eq!(error, "at data.path: NaN in the features at row 2 (counting from 1)");
}

#[test]
fn safetensors_and_the_cnn_on_images() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.safetensors");
    let x = Tensor::randn([64, 1, 8, 8], (Kind::Float, Device::Cpu));
    let y = Tensor::randint(3, [64], (Kind::Int64, Device::Cpu));
    Tensor::write_safetensors(&[("x", &x), ("label", &y)], &path).unwrap();
    let yaml = format!(
        "data: {{source: safetensors, path: {}}}\nmodel: {{name: cnn, channels: [4], hidden_dims: [8], batch_norm: true}}\n\
         batch_size: 16\nepochs: 1\ndevice: cpu\n",
        path.display()
    );
    let summary = train(&config(&yaml), &outputs(&dir.path().join("out"))).unwrap();
    assert!(summary.history[0]["val_loss"].as_f64().unwrap().is_finite());

    let images =
        "data: {samples: 600, image: [1, 8, 8], classes: 3}\nmodel: {name: cnn, channels: [8], hidden_dims: [16]}\n\
        optimizer: {lr: 0.01}\nbatch_size: 32\nepochs: 4\ndevice: cpu\n";
    let summary = train(&config(images), &outputs(&dir.path().join("images"))).unwrap();
    assert!(summary.history.last().unwrap()["val_accuracy"].as_f64().unwrap() > 0.9, "{:?}", summary.history);
    assert_eq!(data::load(&config(images).data, 0).unwrap().task, Task::Classification);
}

#[test]
fn bench_marks_out_of_memory_settings_and_goes_on() {
    let config = config("data: {samples: 512, features: 8}\nmodel: {hidden_dims: [16]}\ndevice: cpu\n");
    let options = BenchOptions { steps: 3, warmup: 1, memory_limit: None };
    let bench = Bench::new(&config, options.clone()).unwrap();
    let absurd = bench.measure(1 << 40, Amp::Off).unwrap();
    assert_eq!(absurd.status, BenchStatus::Oom, "{absurd:?}");
    let fine = bench.measure(64, Amp::Off).unwrap();
    assert_eq!(fine.status, BenchStatus::Ok, "{fine:?}");
    assert!(fine.samples_per_s > 0.0 && fine.step_ms > 0.0 && fine.forward_ms >= 0.0);
    assert!(fine.peak_memory_bytes.unwrap() > 1 << 20);
    let fp16 = bench.measure(64, Amp::Fp16).unwrap();
    assert_eq!(fp16.status, BenchStatus::Oom);
    assert!(fp16.error.unwrap().contains("fp16 needs a CUDA device"));

    // A memory cap below what any setting needs: every setting is out of memory.
    let capped = Bench::new(&config, BenchOptions { memory_limit: Some(1 << 20), ..options }).unwrap();
    let row = capped.measure(64, Amp::Off).unwrap();
    assert_eq!(row.status, BenchStatus::Oom);
    assert!(row.error.unwrap().contains("over the limit"));
    let (largest, probes) = capped.auto_batch_size(Amp::Off, 1024, 0.9).unwrap();
    assert_eq!(largest, None);
    assert!(!probes.is_empty());
}

#[test]
fn auto_batch_size_finds_the_largest_batch_under_the_cap() {
    // The cap is the measured peak of batch 256 plus a little: the search must land near 256.
    let config = config(
        "data: {samples: 2048, features: 512}\nmodel: {hidden_dims: [1024, 1024]}\ndevice: cpu\nbatch_size: 32\n",
    );
    let options = BenchOptions { steps: 1, warmup: 1, memory_limit: None };
    let probe = Bench::new(&config, options.clone()).unwrap();
    let small = probe.measure(32, Amp::Off).unwrap().peak_memory_bytes.unwrap();
    let big = probe.measure(4096, Amp::Off).unwrap().peak_memory_bytes.unwrap();
    assert!(big > small + (32 << 20), "a big batch needs visibly more memory: {small} vs {big}");
    let limit = small + (big - small) / 2;
    let capped = Bench::new(&config, BenchOptions { memory_limit: Some(limit), ..options }).unwrap();
    let (largest, _) = capped.auto_batch_size(Amp::Off, 1 << 14, 1.0).unwrap();
    let largest = largest.unwrap();
    assert!(largest > 32 && largest < 4096, "{largest}");
    // Peaks near the cap vary a little between runs; well inside and well outside do not.
    assert_eq!(capped.measure(largest / 2, Amp::Off).unwrap().status, BenchStatus::Ok);
    assert_eq!(capped.measure((largest * 2).min(4096), Amp::Off).unwrap().status, BenchStatus::Oom);
}
