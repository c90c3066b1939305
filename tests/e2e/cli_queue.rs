//! End-to-end tests of the verbs that follow and change the queue (`wait`, `submit --wait`,
//! `cancel`, `retry`, `sweeps rm`, `workers`, `logs`, `files`, `--json`), against the embedded
//! `app` (server and local worker in one process) configured by one file with both tables.

use serde_json::Value;
use std::path::PathBuf;
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};
use testkit::{app, free_port};

const LONG: Duration = Duration::from_secs(60);

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).to_string()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).to_string()
}

/// `app --config both.toml`: the server and a worker named `box-1`, each from its table.
struct Embedded {
    child: Child,
    url: String,
    dir: tempfile::TempDir,
}

impl Embedded {
    fn start() -> Embedded {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let config = format!(
            "[server]\nbind = \"127.0.0.1:{port}\"\ndata_dir = \"{data}\"\nheartbeat_secs = 0.5\n\n\
             [worker]\nname = \"box-1\"\nwork_dir = \"{work}\"\nmax_jobs = 4\nkill_grace_secs = 1\n",
            data = dir.path().join("data").display(),
            work = dir.path().join("work").display(),
        );
        std::fs::write(dir.path().join("both.toml"), config).unwrap();
        let mut app = app();
        // With APP_TEST_BACKEND=postgres, on a fresh database of the test process's PostgreSQL.
        if let Some(database) = testkit::postgres::test_database() {
            app.args(["--database-url", &database]);
        }
        let child = app
            .arg("--config")
            .arg(dir.path().join("both.toml"))
            .env_remove("APP_BIND")
            .env_remove("APP_DATA_DIR")
            .env_remove("APP_WORK_DIR")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("app.log")).unwrap())
            .spawn()
            .unwrap();
        let embedded = Embedded { child, url: format!("http://127.0.0.1:{port}"), dir };
        wait_for("the embedded app listens", || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
        embedded
    }

    /// `app VERB ARGS --url URL`.
    fn run(&self, args: &[&str]) -> Output {
        app().args(args).args(["--url", &self.url]).env_remove("COLUMNS").output().unwrap()
    }

    fn json(&self, args: &[&str]) -> Value {
        let output = self.run(args);
        assert!(output.status.success(), "{args:?}: {}", stderr(&output));
        serde_json::from_slice(&output.stdout).unwrap_or_else(|error| panic!("{args:?}: {error}: {}", stdout(&output)))
    }

    fn sweep_file(&self, name: &str, yaml: &str) -> PathBuf {
        let path = self.dir.path().join(format!("{name}.yaml"));
        std::fs::write(&path, yaml).unwrap();
        path
    }

    fn submit(&self, name: &str, yaml: &str) {
        let path = self.sweep_file(name, yaml);
        let output = self.run(&["submit", path.to_str().unwrap()]);
        assert!(output.status.success(), "{}", stderr(&output));
    }

    /// The jobs of a sweep, by index.
    fn jobs(&self, sweep: &str) -> Vec<Value> {
        self.json(&["status", sweep, "--json", "--limit", "1000"])["jobs"].as_array().unwrap().clone()
    }

    fn statuses(&self, sweep: &str) -> Vec<String> {
        self.jobs(sweep).iter().map(|job| job["status"].as_str().unwrap().to_string()).collect()
    }

    fn wait_finished(&self, sweep: &str) -> Vec<Value> {
        let mut jobs = Vec::new();
        wait_for(&format!("every job of {sweep} finished"), || {
            jobs = self.jobs(sweep);
            jobs.iter().all(|job| matches!(job["status"].as_str(), Some("succeeded" | "failed" | "cancelled")))
        });
        jobs
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + LONG;
    while !check() {
        assert!(Instant::now() < deadline, "timed out after {LONG:?} waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Jobs 0 and 2 fail after printing a few lines; job 1 succeeds. (All on stdout: stdout and
/// stderr are separate pipes, so their lines may reach the log in either order.)
const MIXED: &str =
    "name: mixed\ncommand: 'for n in 1 2 3 4 5 6 7 8 9 10 11 12; do echo \"line $n of job {i}\"; done; \
                     test {i} -eq 1 || { echo \"boom in job {i}\"; exit 3; }'\ngrid:\n  i: [0, 1, 2]\n";

#[test]
fn wait_and_submit_wait_exit_non_zero_naming_the_failed_jobs_with_their_last_log_lines() {
    let app = Embedded::start();
    let path = app.sweep_file("mixed", MIXED);
    let submitted = app.run(&["submit", path.to_str().unwrap(), "--wait"]);
    assert!(!submitted.status.success(), "a failed job fails the wait");
    let text = stdout(&submitted);
    assert!(text.contains("sweep mixed: 1 succeeded, 2 failed, 0 cancelled"), "{text}");
    assert!(text.contains("(#0, i=0) failed on box-1: exited with code 3"), "{text}");
    assert!(text.contains("| boom in job 2"), "the end of the log is shown: {text}");
    assert!(!text.contains("line 1 of job 0"), "only the last lines: {text}");
    assert!(text.contains("| line 12 of job 0"), "{text}");
    let error = stderr(&submitted);
    assert_eq!(error.trim(), "error: sweep mixed: 2 of 3 jobs failed");

    let again = app.run(&["wait", "mixed"]);
    assert!(!again.status.success());
    assert!(stdout(&again).contains("| boom in job 0"), "{}", stdout(&again));
    let jobs = app.jobs("mixed");
    let succeeded = jobs[1]["id"].to_string();
    let one = app.run(&["wait", &succeeded]);
    assert!(one.status.success(), "{}", stderr(&one));
    assert!(stdout(&one).contains(&format!("job {succeeded}: 1 succeeded, 0 failed")), "{}", stdout(&one));
    let missing = app.run(&["wait", "no-such-sweep"]);
    assert_eq!(stderr(&missing).trim().lines().count(), 1, "{}", stderr(&missing));
    assert!(stderr(&missing).contains("no sweep `no-such-sweep`"), "{}", stderr(&missing));
}

#[test]
fn wait_gives_up_after_its_timeout_and_the_jobs_keep_running() {
    let app = Embedded::start();
    app.submit("slow", "name: slow\ncommand: sleep 30\ngrid:\n  i: [0]\n");
    let started = Instant::now();
    let output = app.run(&["wait", "slow", "--timeout", "1"]);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("sweep slow: timed out after 1s with 0 of 1 jobs finished"),
        "{}",
        stderr(&output)
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_ne!(app.statuses("slow"), ["cancelled"]);
    app.run(&["cancel", "slow"]);
}

#[test]
fn status_filters_by_status_across_sweeps_and_retry_takes_ids_sweeps_or_failed() {
    let app = Embedded::start();
    app.submit("mixed", MIXED);
    app.submit("other", "name: other\ncommand: exit {i}\ngrid:\n  i: [0, 4]\n");
    app.wait_finished("mixed");
    app.wait_finished("other");

    let failed = app.json(&["status", "--status", "failed", "--json"]);
    let sweeps: Vec<&str> =
        failed["jobs"].as_array().unwrap().iter().map(|job| job["sweep"].as_str().unwrap()).collect();
    assert_eq!(failed["total"], 3, "{failed}");
    assert_eq!(sweeps, ["other", "mixed", "mixed"], "newest first, failed only");
    let table = app.run(&["status", "--status", "succeeded"]);
    let text = stdout(&table);
    assert!(text.contains("mixed") && text.contains("other") && !text.contains("exited with code"), "{text}");

    let retry = app.run(&["retry", "other"]);
    assert!(stdout(&retry).contains("sweep other: 1 failed jobs queued again"), "{}", stdout(&retry));
    app.wait_finished("other");
    let ids: Vec<String> = app.jobs("mixed").iter().map(|job| job["id"].to_string()).collect();
    let listed = app.run(&["retry", &ids[0], &ids[1]]);
    assert!(stdout(&listed).contains("1 jobs queued again"), "{}", stdout(&listed));
    assert!(stdout(&listed).contains(&format!("left as they were (not failed or cancelled, or unknown): {}", ids[1])));
    app.wait_finished("mixed");
    let all = app.run(&["retry", "--failed"]);
    let text = stdout(&all);
    assert!(text.contains("sweep mixed: 2 failed jobs queued again"), "{text}");
    assert!(text.contains("sweep other: 1 failed jobs queued again"), "{text}");
    app.wait_finished("mixed");
    let ids_refused = app.run(&["retry", "--failed", &ids[0]]);
    assert!(stderr(&ids_refused).contains("--failed retries the failed jobs of sweeps"), "{}", stderr(&ids_refused));
    let nothing = app.run(&["retry", &ids[1], &ids[1]]);
    assert!(!nothing.status.success());
    assert!(stderr(&nothing).contains("none of the jobs listed is failed or cancelled"), "{}", stderr(&nothing));
}

#[test]
fn cancel_takes_several_ids_and_sweeps() {
    let app = Embedded::start();
    app.submit("sleepy", "name: sleepy\ncommand: sleep 60\ngrid:\n  i: [0, 1, 2, 3, 4, 5]\n");
    app.submit("sleepier", "name: sleepier\ncommand: sleep 60\ngrid:\n  i: [0, 1]\n");
    let ids: Vec<String> = app.jobs("sleepy").iter().map(|job| job["id"].to_string()).collect();
    let output = app.run(&["cancel", &ids[4], &ids[5], "sleepier"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    assert!(text.contains("sweep sleepier: "), "{text}");
    assert!(text.contains("jobs cancelled"), "{text}");
    wait_for("the listed jobs and the sweep are cancelled", || {
        let sleepy = app.statuses("sleepy");
        sleepy[4] == "cancelled" && sleepy[5] == "cancelled" && app.statuses("sleepier") == ["cancelled", "cancelled"]
    });
    assert!(app.statuses("sleepy")[..4].iter().all(|status| status != "cancelled"));
    app.run(&["cancel", "sleepy"]);
}

#[test]
fn a_finished_sweep_is_removed_with_its_results_after_confirmation_only() {
    let app = Embedded::start();
    app.submit("keep", "name: keep\ncommand: 'echo kept > $APP_OUTPUT_DIR/out.txt'\ngrid:\n  i: [0]\n");
    app.submit("busy", "name: busy\ncommand: sleep 60\ngrid:\n  i: [0]\n");
    app.submit("old", "name: old\ncommand: 'echo weights > $APP_OUTPUT_DIR/model.pt'\ngrid:\n  i: [0, 1]\n");
    app.wait_finished("old");
    app.wait_finished("keep");
    let results = app.dir.path().join("data").join("results");
    assert!(results.join("old").join("0").is_dir());

    let busy = app.run(&["sweeps", "rm", "busy", "--yes"]);
    assert!(stderr(&busy).contains("cancel it first (app cancel busy)"), "{}", stderr(&busy));
    // No terminal to ask on and no --yes: nothing is removed.
    let unconfirmed = app.run(&["sweeps", "rm", "old"]);
    assert!(!unconfirmed.status.success());
    assert!(stderr(&unconfirmed).contains("pass --yes"), "{}", stderr(&unconfirmed));
    assert!(results.join("old").is_dir());

    let removed = app.run(&["sweeps", "rm", "old", "--yes"]);
    assert!(removed.status.success(), "{}", stderr(&removed));
    assert!(stdout(&removed).contains("removed sweep old (id 3): 2 jobs, 2 result versions"), "{}", stdout(&removed));
    assert!(!results.join("old").exists());
    assert!(results.join("keep").join("0").is_dir());
    let names: Vec<String> =
        app.json(&["sweeps", "ls", "--json"]).as_array().unwrap().iter().map(|s| s["name"].to_string()).collect();
    assert_eq!(names, ["\"busy\"", "\"keep\""]);
    app.run(&["cancel", "busy"]);
}

#[test]
fn a_sweep_moves_between_priority_classes_the_server_has_and_no_others() {
    let app = Embedded::start();
    app.submit("queued", "name: queued\ncommand: sleep 60\ngrid:\n  i: [0]\n");
    // The embedded server names no classes: any name is refused, saying so; the default is not.
    let unknown = app.run(&["sweeps", "class", "queued", "--to", "urgent"]);
    assert!(!unknown.status.success());
    assert!(stderr(&unknown).contains("urgent"), "{}", stderr(&unknown));
    let neither = app.run(&["sweeps", "class", "queued"]);
    assert!(!neither.status.success() && stderr(&neither).contains("--to"), "{}", stderr(&neither));
    let back = app.run(&["sweeps", "class", "queued", "--default"]);
    assert!(back.status.success(), "{}", stderr(&back));
    assert_eq!(stdout(&back).trim(), "queued is in the default priority class (0)");
    app.run(&["cancel", "queued"]);
}

#[test]
fn json_output_of_workers_results_logs_and_files_parses_and_logs_to_files_are_plain() {
    let app = Embedded::start();
    let yaml =
        "name: colour\nmetric: {name: loss, goal: minimize}\ncommand: 'printf \"\\033[1;31mred\\033[0m plain\\n\"; \
                printf \"x\" > $APP_OUTPUT_DIR/a.bin; echo \"{\\\"loss\\\": 0.{i}}\" >> $APP_METRICS_FILE'\n\
                grid:\n  i: [5, 2]\n";
    app.submit("colour", yaml);
    let jobs = app.wait_finished("colour");
    assert!(jobs.iter().all(|job| job["status"] == "succeeded"), "{jobs:?}");
    let id = jobs[0]["id"].to_string();

    let workers = app.json(&["workers", "--json"]);
    assert_eq!(workers[0]["name"], "box-1", "the [worker] table named the embedded worker");
    assert_eq!(workers[0]["capacity"]["job_slots"], 4);
    let table = stdout(&app.run(&["workers"]));
    assert!(table.contains("box-1") && table.contains("healthy") && table.contains("none (CPU)"), "{table}");

    let results = app.json(&["results", "colour", "--json"]);
    assert_eq!(results["rows"][0]["params"]["i"], 2, "ranked by loss");
    let board = stdout(&app.run(&["results", "colour"]));
    assert!(board.lines().nth(1).unwrap().trim_start().starts_with("rank │ loss (min)"), "{board}");

    let logs = app.json(&["logs", &id, "--json"]);
    assert_eq!(logs["text"], "red plain\n", "escape codes removed: {logs}");
    let to_file = app.dir.path().join("job.log");
    let written =
        testkit::app().args(["logs", &id, "--url", &app.url]).stdout(std::fs::File::create(&to_file).unwrap()).status();
    assert!(written.unwrap().success());
    assert_eq!(std::fs::read_to_string(&to_file).unwrap(), "red plain\n");
    let raw = app.run(&["logs", &id, "--raw"]);
    assert!(stdout(&raw).contains("\u{1b}[1;31mred"), "--raw keeps them: {}", stdout(&raw));

    let files = app.json(&["files", &id, "--json"]);
    assert_eq!(files[0]["files"][0]["size"], 1);
    let listing = stdout(&app.run(&["files", &id]));
    assert!(listing.contains("1 B") && listing.contains("a.bin"), "{listing}");
    let server_log = std::fs::read_to_string(app.dir.path().join("app.log")).unwrap();
    assert!(!server_log.contains('\u{1b}'), "the daemon's own log in a file has no colour codes");
    assert!(server_log.contains("INFO"), "{server_log}");
}

#[test]
fn tables_fit_the_width_columns_gives() {
    let app = Embedded::start();
    let yaml = "name: wide\ncommand: 'true'\ngrid:\n  learning_rate: [0.001, 0.0005]\n  batch_size: [2048, 4096]\n  \
                hidden_dims: [[512, 256, 128, 64]]\n  optimizer_name: [adamw_with_decoupled_weight_decay]\n";
    app.submit("wide", yaml);
    app.wait_finished("wide");
    for (columns, verb) in [("80", &["status", "wide"][..]), ("80", &["status"][..]), ("100", &["results", "wide"][..])]
    {
        let output = testkit::app().args(verb).args(["--url", &app.url]).env("COLUMNS", columns).output().unwrap();
        let text = stdout(&output);
        let width: usize = columns.parse().unwrap();
        for line in text.lines() {
            assert!(line.chars().count() <= width, "{verb:?} at {columns} columns: {line}\n{text}");
        }
    }
    let piped = stdout(&app.run(&["status", "wide"]));
    assert!(piped.lines().any(|line| line.chars().count() > 100), "unfitted when piped without COLUMNS:\n{piped}");
}
