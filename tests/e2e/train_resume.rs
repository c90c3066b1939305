//! `app train` under a worker keeps its latest state in `$APP_CHECKPOINT_DIR` and, run again
//! with that directory (as the next attempt of a requeued job is), continues from it rather
//! than starting over. Built with `--features torch`.

#![cfg(feature = "torch")]

use serde_json::Value;
use std::path::Path;
use testkit::{app, repo};

/// `app train` on the small synthetic config for `epochs`, its checkpoint directory `dir`;
/// the epochs it wrote to its metrics file and its log.
fn train(dir: &Path, out: &Path, epochs: u32) -> (Vec<u64>, String) {
    let metrics = out.join("metrics.jsonl");
    let output = app()
        .args(["train", "--config"])
        .arg(repo("configs/train-mlp.yaml"))
        .args(["--set", &format!("epochs={epochs}"), "--set", "early_stopping.patience=0", "--set", "threads=1"])
        .arg("--out")
        .arg(out)
        .arg("--metrics-file")
        .arg(&metrics)
        .env("APP_CHECKPOINT_DIR", dir)
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&output.stderr).to_string() + &String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{log}");
    let epochs = std::fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap()["epoch"].as_u64().unwrap())
        .collect();
    (epochs, log)
}

#[test]
fn a_second_run_with_the_same_checkpoint_directory_continues_after_the_last_epoch() {
    let (dir, first_out, second_out) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (epochs, _) = train(dir.path(), first_out.path(), 2);
    assert_eq!(epochs, [1, 2]);
    let sidecar: Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("last.json")).unwrap()).unwrap();
    assert_eq!(sidecar["epoch"], 2);
    assert!(dir.path().join("last.pt").is_file());
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|entry| entry.unwrap().file_name()).collect();
    assert_eq!(leftovers.len(), 2, "only the latest state, nothing half-written: {leftovers:?}");

    let (epochs, log) = train(dir.path(), second_out.path(), 4);
    assert_eq!(epochs, [3, 4], "continued, not restarted: {log}");
    assert!(log.contains("at epoch 3"), "{log}");
}

/// SIGTERM (what a preemption sends) lets the epoch under way finish and be saved: the run
/// exits with 143 and says which epoch it saved, and a next run continues after it.
#[test]
fn sigterm_saves_the_epoch_under_way_and_the_next_run_continues_after_it() {
    let (dir, first_out, second_out) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let metrics = first_out.path().join("metrics.jsonl");
    let child = app()
        .args(["train", "--config"])
        .arg(repo("configs/train-mlp.yaml"))
        .args(["--set", "epochs=100000", "--set", "early_stopping.patience=0", "--set", "threads=1"])
        .args(["--set", "data.samples=256", "--set", "checkpoint_every=0"])
        .arg("--out")
        .arg(first_out.path())
        .arg("--metrics-file")
        .arg(&metrics)
        .env("APP_CHECKPOINT_DIR", dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::fs::read_to_string(&metrics).map_or(0, |text| text.lines().count()) < 2 {
        assert!(std::time::Instant::now() < deadline, "no epoch done in a minute");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let output = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&output.stderr).to_string() + &String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(143), "{log}");
    let last: u64 = std::fs::read_to_string(&metrics)
        .unwrap()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok()?["epoch"].as_u64())
        .next_back()
        .unwrap();
    assert!(log.contains(&format!("stopped by SIGTERM after epoch {last}, which is saved")), "{log}");
    let sidecar: Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("last.json")).unwrap()).unwrap();
    assert_eq!(sidecar["epoch"], last, "the epoch it stopped after is the one saved");

    let (epochs, _) = train(dir.path(), second_out.path(), last as u32 + 2);
    assert_eq!(epochs, [last + 1, last + 2], "continued after the saved epoch");
}
