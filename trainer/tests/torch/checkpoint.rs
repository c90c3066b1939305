//! Checkpoints: PyTorch (Python torch 2.11, `weights_only=True` by default) loads ours and gets
//! the same outputs; we resume from ours and from PyTorch's; another model shape is refused
//! naming the tensor.

use super::{config, outputs, repo, separable, small_engine};
use std::path::Path;
use std::process::Command;
use tch::{Device, Kind, Tensor};
use trainer::config::CheckpointFormat;
use trainer::torch::checkpoint::CheckpointInfo;
use trainer::torch::saver::{Saver, Target};
use trainer::torch::step::Engine;
use trainer::torch::train::train;
use trainer::torch::{checkpoint, data};

/// Python with torch: `import torch` needs the full wheel (scripts/setup-torch.sh --full,
/// instant once done), plus numpy and safetensors, which it installs too.
fn python() -> std::path::PathBuf {
    let setup = Command::new(repo().join("scripts/setup-torch.sh")).arg("--full").status().unwrap();
    assert!(setup.success(), "scripts/setup-torch.sh --full failed");
    repo().join(".venv-torch/bin/python")
}

/// The model's outputs (eval mode) for `x`, from a checkpoint loaded into a fresh engine.
fn outputs_of(yaml: &str, checkpoint_path: &Path, x: &Tensor) -> Tensor {
    let config = config(yaml);
    let data = data::load(&config.data, config.seed).unwrap();
    let mut engine = Engine::new(&config, &data, Device::Cpu).unwrap();
    checkpoint::resume(&mut engine, checkpoint_path).unwrap();
    tch::no_grad(|| engine.model.forward(x, false))
}

#[test]
fn pytorch_loads_the_checkpoints_with_torch_load_and_gets_the_same_outputs() {
    let python = python();
    for format in ["pt", "safetensors"] {
        let dir = tempfile::tempdir().unwrap();
        let yaml = format!("{}checkpoint_format: {format}\n", separable(2, "hidden_dims: [32, 16], batch_norm: true"));
        train(&config(&yaml), &outputs(dir.path()), None).unwrap();
        let file = format!("model_best.{format}");
        let x = Tensor::randn([20, 16], (Kind::Float, Device::Cpu));
        let (input, output) = (dir.path().join("x.npy"), dir.path().join("y.npy"));
        x.write_npy(&input).unwrap();
        let run = Command::new(&python)
            .arg(repo().join("bench/load_checkpoint.py"))
            .arg(dir.path())
            .args(["--checkpoint", &file, "--input"])
            .arg(&input)
            .arg("--output")
            .arg(&output)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(run.status.success(), "{format}: {stderr}");
        let report: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
        assert!(report["torch"].as_str().unwrap().starts_with("2.11"), "{report}");
        let keys: Vec<&str> = report["keys"].as_array().unwrap().iter().map(|key| key.as_str().unwrap()).collect();
        let expected = [
            "fc0.weight",
            "fc0.bias",
            "bn0.weight",
            "bn0.bias",
            "bn0.running_mean",
            "bn0.running_var",
            "bn0.num_batches_tracked",
        ];
        if format == "pt" {
            // In module order, as PyTorch's own state_dict() lists them.
            assert_eq!(&keys[..7], expected, "{keys:?}");
        }
        assert_eq!(keys.len(), 16, "fc0, bn0, fc1, bn1 and out: {keys:?}");
        assert!(
            expected.iter().chain(&["bn1.num_batches_tracked", "out.bias"]).all(|key| keys.contains(key)),
            "{keys:?}"
        );
        assert!(!stderr.contains("Warning"), "{stderr}");

        let theirs = Tensor::read_npy(&output).unwrap();
        let ours = outputs_of(&yaml, &dir.path().join(&file), &x);
        assert!(ours.allclose(&theirs, 1e-5, 1e-5, false), "{format}: {ours} vs {theirs}");
    }
}

#[test]
fn training_resumes_from_a_state_dict_pytorch_saved() {
    // PyTorch writes the state dict of a DDP-wrapped model (keys prefixed `module.`) with
    // torch.save; resuming from it continues with exactly those weights.
    let python = python();
    let dir = tempfile::tempdir().unwrap();
    let yaml = separable(1, "hidden_dims: [8]");
    let saved = dir.path().join("pytorch.pt");
    let script = format!(
        "import torch\ntorch.manual_seed(1)\nstate = {{'module.fc0.weight': torch.randn(8, 16), 'module.fc0.bias': torch.zeros(8),\n\
         'module.out.weight': torch.randn(2, 8), 'module.out.bias': torch.ones(2)}}\ntorch.save(state, {:?})\n",
        saved.display().to_string()
    );
    let run = Command::new(&python).args(["-c", &script]).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let state = checkpoint::read(&saved).unwrap();
    assert_eq!(state["out.bias"], Tensor::ones([2], (Kind::Float, Device::Cpu)));

    let config = config(&yaml);
    let data = data::load(&config.data, config.seed).unwrap();
    let mut engine = Engine::new(&config, &data, Device::Cpu).unwrap();
    assert!(checkpoint::resume(&mut engine, &saved).unwrap().is_none(), "no sidecar: no position");
    let variables = engine.vs.variables();
    assert!(variables["fc0.weight"].equal(&state["fc0.weight"]));
    assert!(variables["out.bias"].equal(&state["out.bias"]));
}

#[test]
fn a_checkpoint_of_another_model_shape_is_refused_naming_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let small = separable(1, "hidden_dims: [8]");
    train(&config(&small), &outputs(dir.path()), None).unwrap();
    let checkpoint_path = dir.path().join("model_best.pt");
    for (hidden, expected) in [("[16]", "`fc0.weight` has shape [8, 16] in"), ("[8, 4]", "has no tensor `fc1.weight`")]
    {
        let other =
            format!("{}resume: {}\n", separable(1, &format!("hidden_dims: {hidden}")), checkpoint_path.display());
        let error = train(&config(&other), &outputs(&dir.path().join("other")), None).unwrap_err().to_string();
        assert!(error.starts_with("at resume: ") && error.contains(expected), "{error}");
        assert!(error.contains("another model shape"), "{error}");
    }
}

#[test]
fn a_snapshot_keeps_its_moments_weights_while_training_goes_on() {
    // The saver writes a snapshot on another thread while the next epoch trains: the snapshot
    // must own its memory, also for a model on the CPU, where moving to the host is a no-op.
    let (mut engine, batch) =
        small_engine("data: {samples: 256, features: 8}\nmodel: {hidden_dims: [8]}\ndevice: cpu\n");
    let before = engine.vs.variables()["fc0.weight"].copy();
    let taken =
        |state: Vec<(String, Tensor)>| -> std::collections::HashMap<String, Tensor> { state.into_iter().collect() };
    let (on_device, on_host) = (taken(checkpoint::snapshot(&engine)), taken(checkpoint::state_dict(&engine)));
    assert!(engine.step(&batch).unwrap().applied);
    assert!(!engine.vs.variables()["fc0.weight"].equal(&before), "the step changed the weights");
    assert!(on_device["fc0.weight"].equal(&before), "the snapshot moved with the model");
    assert!(on_host["fc0.weight"].equal(&before), "the host state dict moved with the model");
}

#[test]
fn the_saver_writes_every_epochs_own_file_and_the_last_best_and_reports_a_failed_write() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = "data: {samples: 256, features: 8}\nmodel: {hidden_dims: [8]}\ndevice: cpu\n";
    let (mut engine, batch) = small_engine(yaml);
    let info = |epoch: usize| CheckpointInfo {
        epoch,
        step: epoch * 10,
        metric: "val_loss".into(),
        value: Some(1.0 / epoch as f64),
        best_value: Some(1.0 / epoch as f64),
        loss_scale: None,
    };
    let weights = |engine: &trainer::torch::step::Engine| engine.vs.variables()["fc0.weight"].copy();
    let saved = |path: &Path| checkpoint::read(path).unwrap()["fc0.weight"].copy();
    let epoch_of = |path: &Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(path.with_extension("json")).unwrap()).unwrap()
    };
    let best = dir.path().join("model_best.pt");
    let latest = Target::Latest { dir: dir.path().to_path_buf(), format: CheckpointFormat::Pt };
    // Saves faster than a disk may take them: a newer best may replace a waiting one, but
    // every epoch's own file holds that epoch's weights, and at the end the best and the
    // latest hold the last epoch's.
    let mut saver = Saver::default();
    let mut each_epoch = Vec::new();
    for epoch in 1..=6 {
        assert!(engine.step(&batch).unwrap().applied);
        let own = dir.path().join(format!("model_epoch_{epoch:03}.pt"));
        let mut targets = vec![Target::File(best.clone()), latest.clone()];
        if epoch % 2 == 0 {
            targets.push(Target::File(own.clone()));
            each_epoch.push((own, weights(&engine)));
        }
        saver.save(&engine, targets, info(epoch)).unwrap();
    }
    saver.finish().unwrap();
    for (path, expected) in &each_epoch {
        assert!(saved(path).equal(expected), "{path:?} holds its epoch's weights");
    }
    for path in [&best, &dir.path().join("last.pt")] {
        assert!(saved(path).equal(&weights(&engine)), "{path:?} holds the last epoch's weights");
        assert_eq!(epoch_of(path)["epoch"], 6, "{path:?}");
    }
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into())
        .collect();
    assert!(!names.iter().any(|name| name.contains("partial")), "every file is renamed into place: {names:?}");

    // A write into a directory that is not there fails, at the next save or at the end, and
    // nothing handed over after it is written.
    let missing = dir.path().join("gone/model_best.pt");
    let next = dir.path().join("next.pt");
    saver.save(&engine, vec![Target::File(missing.clone())], info(7)).unwrap();
    let error = match saver.save(&engine, vec![Target::File(next.clone())], info(8)) {
        Err(error) => error,
        Ok(()) => saver.finish().unwrap_err(),
    }
    .to_string();
    assert!(error.contains(&missing.display().to_string()), "{error}");
    assert!(saver.finish().is_ok(), "a failure is reported once");
    assert!(!next.exists(), "nothing is written after a failed write");
    // The saver starts afresh after a reported failure.
    saver.save(&engine, vec![Target::File(next.clone())], info(9)).unwrap();
    saver.finish().unwrap();
    assert_eq!(epoch_of(&next)["epoch"], 9);
}
