//! End-to-end tests of the `app` binary: real processes against a real server on loopback.

mod common;

use common::{app, repo, ServerProcess};
use std::process::Output;

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).to_string()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).to_string()
}

/// A failed verb says what went wrong on one line, and never panics.
fn assert_one_line_error(output: &Output, needle: &str) {
    assert!(!output.status.success(), "should fail: {}", stdout(output));
    let text = stderr(output);
    assert_eq!(text.trim().lines().count(), 1, "one line expected: {text}");
    assert!(text.starts_with("error: "), "{text}");
    assert!(text.contains(needle), "`{needle}` missing from: {text}");
    assert!(!text.contains("panicked") && !text.contains("backtrace"), "{text}");
}

#[test]
fn dry_run_json_prints_the_count_and_every_job_without_a_server() {
    let output = app()
        .args(["submit", "--dry-run", "--json", "--url", "http://127.0.0.1:9"])
        .arg(repo("configs/vaep-grid.yaml"))
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(json["count"], 108);
    let jobs = json["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 108);
    assert_eq!(
        jobs[0]["params"],
        serde_json::json!({"lr": 0.001, "batch_size": 2048, "hidden_dims": [128, 64], "horizon": 10})
    );
    assert_eq!(jobs[1]["params"]["horizon"], 15, "the last axis varies fastest");
}

#[test]
fn dry_run_text_shows_the_count_and_the_first_parameter_sets() {
    let output = app().args(["submit", "--dry-run"]).arg(repo("configs/vaep-grid-first-20.yaml")).output().unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    assert!(text.contains("20 jobs"), "{text}");
    assert!(text.contains("\"lr\":0.001"), "{text}");
    assert!(text.contains("and 15 more"), "{text}");
}

#[test]
fn a_bad_sweep_file_fails_with_its_line_and_column_or_key_path() {
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.yaml");
    std::fs::write(&broken, "command: \"true\"\ngrid:\n  lr: [0.1, 0.2\n").unwrap();
    for extra in [&["--dry-run"][..], &["--url", "http://127.0.0.1:9"][..]] {
        let output = app().arg("submit").arg(&broken).args(extra).output().unwrap();
        assert_one_line_error(&output, "line");
        assert!(stderr(&output).contains("column"));
    }
    let unknown = dir.path().join("unknown.yaml");
    std::fs::write(&unknown, "command: \"true\"\ngrid:\n  lr: []\n").unwrap();
    assert_one_line_error(&app().arg("submit").arg(&unknown).arg("--dry-run").output().unwrap(), "grid.lr");
}

#[test]
fn a_missing_file_or_a_down_server_is_a_one_line_error() {
    let output = app().args(["submit", "/nonexistent/sweep.yaml", "--dry-run"]).output().unwrap();
    assert_one_line_error(&output, "/nonexistent/sweep.yaml");
    let output = app().args(["status", "--url", "http://127.0.0.1:9"]).output().unwrap();
    assert_one_line_error(&output, "cannot reach the server at http://127.0.0.1:9");
    let output = app()
        .arg("submit")
        .arg(repo("configs/quickstart.yaml"))
        .args(["--url", "http://127.0.0.1:9"])
        .output()
        .unwrap();
    assert_one_line_error(&output, "cannot reach");
}

#[test]
fn submit_status_and_cancel_against_a_real_server_process() {
    let server = ServerProcess::start();
    let submit = app().arg("submit").arg(repo("configs/vaep-grid.yaml")).args(["--url", &server.url]).output().unwrap();
    assert!(submit.status.success(), "{}", stderr(&submit));
    assert!(stdout(&submit).contains("submitted sweep vaep-grid"), "{}", stdout(&submit));
    assert!(stdout(&submit).contains("108 jobs"));
    let status = app().args(["status", "--url", &server.url]).output().unwrap();
    assert!(status.status.success(), "{}", stderr(&status));
    assert!(stdout(&status).contains("vaep-grid") && stdout(&status).contains("108"), "{}", stdout(&status));
    let jobs = app().args(["status", "vaep-grid", "--limit", "3", "--url", &server.url]).output().unwrap();
    let text = stdout(&jobs);
    assert!(text.contains("108 jobs: 108 queued"), "{text}");
    assert!(text.contains("105 more"), "{text}");
    let cancel = app().args(["cancel", "vaep-grid", "--url", &server.url]).output().unwrap();
    assert!(stdout(&cancel).contains("108 cancelled"), "{}", stdout(&cancel));
    let again = app().args(["cancel", "1", "--url", &server.url]).output().unwrap();
    assert_one_line_error(&again, "cancelled");
    let missing = app().args(["status", "no-such-sweep", "--url", &server.url]).output().unwrap();
    assert_one_line_error(&missing, "no sweep `no-such-sweep`");
    let mut server = server;
    common::signal(&server.child, "TERM");
    assert!(
        common::wait_exit(&mut server.child, std::time::Duration::from_secs(20)).success(),
        "SIGTERM is a clean shutdown"
    );
}
