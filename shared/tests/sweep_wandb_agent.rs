//! With the real `wandb` package: a script that calls `wandb.init()` (offline) and reads
//! `wandb.config` receives a job's parameters from the file `wandb_params_file` renders, named
//! in `WANDB_SWEEP_PARAM_PATH`, as W&B's agent provides them.
//!
//! Needs a Python with `wandb` installed: `APP_TEST_WANDB_PYTHON=/path/to/python`, else
//! `python3` if it can import wandb. Without one the test says so and checks nothing
//! (`python3 -m venv /tmp/wandb-venv && /tmp/wandb-venv/bin/pip install wandb`).

use std::process::Command;

use shared::sweep::{wandb_params_file, ExpandOptions, Sweep};

fn python_with_wandb() -> Option<String> {
    let candidates = std::env::var("APP_TEST_WANDB_PYTHON").into_iter().chain(["python3".to_owned()]);
    candidates.into_iter().find(|python| {
        Command::new(python).args(["-c", "import wandb"]).output().is_ok_and(|output| output.status.success())
    })
}

#[test]
fn wandb_init_reads_the_params_file() {
    let Some(python) = python_with_wandb() else {
        eprintln!("skipped: no Python with wandb (set APP_TEST_WANDB_PYTHON)");
        return;
    };
    let sweep = Sweep::parse(
        "method: random\nrun_cap: 3\nprogram: t.py\nparameters:\n  lr: {distribution: log_uniform_values, min: 1e-6, max: 1e-1}\n  \
         amp: {values: [true, false]}\n  bs: {distribution: q_uniform, min: 16, max: 256, q: 16}\n  \
         opt: {parameters: {name: {values: [adam, 'sgd m']}, betas: {value: [0.9, 0.999]}}}\n",
        &ExpandOptions::default(),
    )
    .unwrap();
    let dir = std::env::temp_dir().join(format!("app-wandb-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for job in sweep.jobs() {
        let path = dir.join(format!("config-{}.yaml", job.index));
        std::fs::write(&path, wandb_params_file(&job.params).unwrap()).unwrap();
        let script = "import json, wandb\nrun = wandb.init()\nprint(json.dumps(dict(run.config)))\nrun.finish()\n";
        let output = Command::new(&python)
            .args(["-c", script])
            .env("WANDB_SWEEP_PARAM_PATH", &path)
            .env("WANDB_MODE", "offline")
            .env("WANDB_SILENT", "true")
            .env("WANDB_DIR", &dir)
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let stdout = String::from_utf8(output.stdout).unwrap();
        let received: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
        let expected: serde_json::Value = serde_json::from_str(&job.params).unwrap();
        assert_eq!(received, expected, "job {}", job.index);
        // Bit for bit: serde_json compares floats by value; check the text too.
        assert_eq!(received["lr"].as_f64().unwrap().to_bits(), expected["lr"].as_f64().unwrap().to_bits());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
