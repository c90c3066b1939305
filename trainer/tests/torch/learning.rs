//! Learning, resume, gradient accumulation, loss scaling, bf16, data sources and mistakes,
//! batch norm with a one-row tail, and what `device` says without CUDA.

use super::{config, gradients, outputs, small_engine, weights, SEPARABLE};
use tch::{Device, Kind, Tensor};
use trainer::config::{Amp, Task};
use trainer::torch::data;
use trainer::torch::loader::Batch;
use trainer::torch::step::Engine;
use trainer::torch::train::{evaluate_checkpoint, train};

#[test]
fn separable_data_is_learned_and_the_best_checkpoint_reproduces_its_val_loss() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(SEPARABLE);
    let summary = train(&config, &outputs(dir.path()), None).unwrap();
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
    train(&short, &outputs(dir.path()), None).unwrap();
    let mut resumed = first.clone();
    resumed.epochs = 4;
    resumed.resume = Some(dir.path().join("model_epoch_002.pt"));
    let summary = train(&resumed, &outputs(dir.path()), None).unwrap();
    let epochs: Vec<u64> = summary.history.iter().map(|entry| entry["epoch"].as_u64().unwrap()).collect();
    assert_eq!(epochs, vec![1, 2, 3, 4]);
    assert!(summary.history[2]["train_loss"].as_f64().unwrap() < summary.history[0]["train_loss"].as_f64().unwrap());
}

#[test]
fn micro_batches_accumulate_to_the_full_batch_gradient() {
    // Plain SGD, so the step is the gradient itself (Adam's first step would hide its scale).
    let yaml = "data: {samples: 256, features: 8, classes: 3}\nmodel: {hidden_dims: [16, 16]}\ndevice: cpu\n\
        optimizer: {name: sgd, lr: 0.5, momentum: 0}\n";
    let (mut single, batch) = small_engine(yaml);
    let (mut accumulated, _) = small_engine(&format!("{yaml}grad_accum: 4\n"));
    let before = weights(&single);
    let (first, second) = (single.step(&batch).unwrap(), accumulated.step(&batch).unwrap());
    assert!(first.applied && second.applied);
    let (loss_single, loss_accumulated) = (first.loss_sum.double_value(&[]), second.loss_sum.double_value(&[]));
    assert!((loss_single - loss_accumulated).abs() < 1e-4, "{loss_single} vs {loss_accumulated}");
    // One SGD step from the same start: the same weights means the same gradient.
    for ((old, a), b) in before.iter().zip(weights(&single)).zip(weights(&accumulated)) {
        assert!(!old.equal(&a), "the step changed the weights");
        assert!(a.allclose(&b, 1e-5, 1e-6, false));
    }
}

#[test]
fn the_fp16_loss_scaler_skips_a_step_with_an_inf_gradient_and_lowers_the_scale() {
    // fp16 autocast needs CUDA; the scaler's tensor work is the same on the CPU, so the engine
    // runs in fp32 here with the scaler of `amp: fp16`.
    let yaml = "data: {samples: 256, features: 8}\nmodel: {hidden_dims: [8]}\ndevice: cpu\namp: fp16\n\
        loss_scale: {init: 1024, growth_interval: 2}\noptimizer: {name: sgd, lr: 0.1, momentum: 0}\n";
    let config = config(yaml);
    let data = data::load(&config.data, 0).unwrap();
    let mut engine = Engine::new(&config, &data, Device::Cpu).unwrap();
    engine.amp = Amp::Off;
    let batch = Batch { x: data.train.x.narrow(0, 0, 32), y: data.train.y.narrow(0, 0, 32), step_rows: 32 };
    let backward = |engine: &mut Engine| {
        let (mean, weight) = engine.forward(&batch);
        engine.backward(&mean, weight).unwrap();
    };

    let before = weights(&engine);
    backward(&mut engine);
    let _ = engine.params()[0].grad().narrow(0, 0, 1).fill_(f64::INFINITY);
    assert!(!engine.apply().unwrap(), "the step with an inf gradient is skipped");
    let scaler = engine.scaler.as_ref().unwrap();
    assert_eq!(scaler.scale(), 512.0);
    assert_eq!(scaler.skipped(), 1);
    for (old, new) in before.iter().zip(weights(&engine)) {
        assert!(old.equal(&new), "a skipped step changes no weight");
    }

    // A clean step applies the unscaled gradient: SGD moves by lr x the plain gradient.
    let (mut reference, _) = small_engine(&yaml.replace("amp: fp16", "amp: off"));
    tch::no_grad(|| {
        for (variable, old) in reference.params().iter().zip(&before) {
            variable.shallow_clone().copy_(old);
        }
    });
    let (mean, weight) = reference.forward(&batch);
    reference.backward(&mean, weight).unwrap();
    let plain = gradients(&reference);
    backward(&mut engine);
    assert!(engine.apply().unwrap());
    assert_eq!(engine.scaler.as_ref().unwrap().scale(), 512.0);
    for ((old, new), grad) in before.iter().zip(weights(&engine)).zip(&plain) {
        let expected = old - grad * 0.1;
        assert!(new.allclose(&expected, 1e-4, 1e-6, false), "the loss was unscaled before the step");
    }
    // Two clean steps in a row grow the scale.
    backward(&mut engine);
    assert!(engine.apply().unwrap());
    assert_eq!(engine.scaler.as_ref().unwrap().scale(), 1024.0);
}

#[test]
fn a_one_row_last_batch_never_reaches_batch_norm() {
    // 41 rows, 8 held out: 33 to train in batches of 16 leave a last batch of one row, whose
    // variance is undefined. It is merged into the batch before it, so the running statistics
    // stay finite, every epoch has a val_loss and model_best.pt is written.
    let dir = tempfile::tempdir().unwrap();
    let yaml = "data: {samples: 41, features: 4, classes: 2, val_fraction: 0.2}\n\
        model: {hidden_dims: [8], batch_norm: true}\nbatch_size: 16\nepochs: 3\ndevice: cpu\n";
    let summary = train(&config(yaml), &outputs(dir.path()), None).unwrap();
    for entry in &summary.history {
        assert!(entry["val_loss"].as_f64().is_some_and(f64::is_finite), "{entry:?}");
    }
    assert!(dir.path().join("model_best.pt").is_file());
    let state = trainer::torch::checkpoint::read(&dir.path().join("model_best.pt")).unwrap();
    let variance = &state["bn0.running_var"];
    assert_eq!(variance.isfinite().all().int64_value(&[]), 1, "{variance}");
    // Two steps per epoch (16 + 17 rows), three epochs: six training forward passes.
    assert_eq!(state["bn0.num_batches_tracked"].int64_value(&[]), 6);

    // A batch size that can only ever give batch norm one row is refused, naming the key.
    let error = trainer::TrainConfig::from_yaml(&yaml.replace("batch_size: 16", "batch_size: 1")).unwrap_err();
    assert_eq!(error.key, "batch_size");
    assert!(error.message.contains("batch norm"), "{error}");
}

#[test]
fn without_a_gpu_auto_says_why_and_cuda_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    train(&config("data: {samples: 64, features: 4}\nepochs: 1\ndevice: auto\n"), &outputs(dir.path()), None).unwrap();
    let log = std::fs::read_to_string(dir.path().join("training.log")).unwrap();
    let first = log.lines().next().unwrap();
    assert!(first.starts_with("device CPU (CUDA unavailable: "), "{first}");

    let error = train(&config("device: cuda\n"), &outputs(&dir.path().join("cuda")), None).unwrap_err().to_string();
    assert!(error.starts_with("at device: CUDA unavailable: "), "{error}");
    let reason = error.trim_start_matches("at device: CUDA unavailable: ");
    assert!(reason.contains("not found") || reason.contains("no CUDA device"), "{error}");
}

#[test]
fn bf16_autocast_runs_matmuls_in_bf16_on_the_cpu_and_trains() {
    super::avoid_unusable_amx();
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
    let summary = train(&config(&format!("{SEPARABLE}amp: bf16\n")), &outputs(dir.path()), None).unwrap();
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
    let summary = train(&config(&yaml), &outputs(&dir.path().join("out")), None).unwrap();
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
    let summary = train(&config(&yaml), &outputs(&dir.path().join("out")), None).unwrap();
    assert!(summary.history[0]["val_loss"].as_f64().unwrap().is_finite());

    let images =
        "data: {samples: 600, image: [1, 8, 8], classes: 3}\nmodel: {name: cnn, channels: [8], hidden_dims: [16]}\n\
        optimizer: {lr: 0.01}\nbatch_size: 32\nepochs: 4\ndevice: cpu\n";
    let summary = train(&config(images), &outputs(&dir.path().join("images")), None).unwrap();
    assert!(summary.history.last().unwrap()["val_accuracy"].as_f64().unwrap() > 0.9, "{:?}", summary.history);
    assert_eq!(data::load(&config(images).data, 0).unwrap().task, Task::Classification);
}
