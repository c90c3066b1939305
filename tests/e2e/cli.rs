//! End-to-end tests of the `app` binary: real processes against a real server on loopback.

use std::process::Output;
use testkit::{app, repo, ServerProcess};

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
    testkit::signal(&server.child, "TERM");
    assert!(
        testkit::wait_exit(&mut server.child, std::time::Duration::from_secs(20)).success(),
        "SIGTERM is a clean shutdown"
    );
}

#[test]
fn a_sweep_file_without_a_name_is_named_after_its_project_and_file() {
    let server = ServerProcess::start();
    let dir = tempfile::tempdir().unwrap();
    // Git looks no higher than the temporary directory, whatever holds it.
    let ceiling = dir.path().parent().unwrap();
    let submit = |file: &std::path::Path| {
        let output = app()
            .arg("submit")
            .arg(file)
            .args(["--no-code", "--json", "--url", &server.url])
            .env("GIT_CEILING_DIRECTORIES", ceiling)
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", stderr(&output));
        let answer: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        answer["name"].as_str().unwrap().to_string()
    };
    let nameless = "command: 'true'\ngrid:\n  i: [0, 1]\n";
    // Outside git: the sweep file's own directory.
    std::fs::create_dir(dir.path().join("myproj")).unwrap();
    let file = dir.path().join("myproj/sweep.yaml");
    std::fs::write(&file, nameless).unwrap();
    assert_eq!(submit(&file), "myproj/sweep");
    assert_eq!(submit(&file), "myproj/sweep-2");
    // In git: the work tree's top, wherever in it the file is; made a plain name.
    let repo = dir.path().join("Other Repo");
    std::fs::create_dir_all(repo.join("configs")).unwrap();
    let init = std::process::Command::new("git").arg("init").arg("-q").arg(&repo).output().unwrap();
    assert!(init.status.success(), "{}", stderr(&init));
    std::fs::write(repo.join("configs/sweep.yaml"), nameless).unwrap();
    assert_eq!(submit(&repo.join("configs/sweep.yaml")), "Other-Repo/sweep");
    // A name in the file is kept as written.
    let named = dir.path().join("myproj/named.yaml");
    std::fs::write(&named, format!("name: team/grid\n{nameless}")).unwrap();
    assert_eq!(submit(&named), "team/grid");

    let status = app().args(["status", "myproj/sweep-2", "--url", &server.url]).output().unwrap();
    assert!(stdout(&status).contains("sweep myproj/sweep-2 (id 2): 2 jobs: 2 queued"), "{}", stdout(&status));
    let cancel = app().args(["cancel", "myproj/sweep", "--url", &server.url]).output().unwrap();
    assert!(stdout(&cancel).contains("2 cancelled"), "{}{}", stdout(&cancel), stderr(&cancel));
    let results = app().args(["results", "Other-Repo/sweep", "--url", &server.url]).output().unwrap();
    assert!(results.status.success(), "{}", stderr(&results));
}

fn help(args: &[&str]) -> String {
    let output = app().args(args).arg("--help").env_remove("COLUMNS").output().unwrap();
    assert!(output.status.success(), "{args:?} --help: {}", stderr(&output));
    stdout(&output)
}

/// Every verb's help lists its own flags, never the serving modes' ones.
#[test]
fn each_verbs_help_shows_only_its_own_flags() {
    let verbs: &[&[&str]] = &[
        &["submit"],
        &["status"],
        &["wait"],
        &["logs"],
        &["results"],
        &["files"],
        &["cancel"],
        &["retry"],
        &["workers"],
        &["whoami"],
        &["sweeps", "rm"],
        &["sweeps", "ls"],
        &["sweeps", "class"],
        &["train"],
        &["bench"],
    ];
    for verb in verbs {
        let text = help(verb);
        for foreign in ["--bind", "--data-dir", "--server-only", "--client-only", "--worker-token-file", "--gpus "] {
            assert!(!text.contains(foreign), "`app {} --help` lists {foreign}:\n{text}", verb.join(" "));
        }
    }
    let train = help(&["train"]);
    assert!(train.contains("--config <FILE>") && train.contains("The trainer's YAML config"), "{train}");
    assert!(!train.contains("TOML") && !train.contains("--url"), "{train}");
    assert!(help(&["bench"]).contains("The trainer's YAML config"));
    let status = help(&["status"]);
    assert!(
        status.contains("--url <URL>") && status.contains("[env: APP_URL=") && status.contains("--json"),
        "{status}"
    );
    assert!(!status.contains("--config"), "{status}");
}

#[test]
fn the_main_help_groups_the_serving_flags_and_keeps_the_benchmarks_apart() {
    let text = help(&[]);
    for needle in ["Server (app, app --server-only):", "Worker (app, app --client-only):", "--bind <ADDRESS>"] {
        assert!(text.contains(needle), "`{needle}` missing:\n{text}");
    }
    for verb in ["wait", "workers", "sweeps", "train", "bench"] {
        assert!(text.contains(&format!("\n  {verb} ")), "`{verb}` missing:\n{text}");
    }
    // The maintainers' benchmarks are not in the shipped binary (bench/, `app-bench`).
    assert!(!text.contains("bench-queue") && !text.contains("\n  dev ") && !text.contains("app dev"), "{text}");
    let output = app().args(["dev", "bench", "queue"]).output().unwrap();
    assert!(
        !output.status.success() && stderr(&output).contains("unrecognized subcommand 'dev'"),
        "{}",
        stderr(&output)
    );
    assert!(text.contains("[env: APP_BIND]") && text.contains("[env: APP_CONFIG_FILE]"), "{text}");
}

#[test]
fn serving_flags_with_a_verb_or_with_the_other_mode_are_refused() {
    let output = app().args(["--bind", "127.0.0.1:1", "status"]).output().unwrap();
    assert!(!output.status.success());
    assert!(stderr(&output).contains("--bind"), "{}", stderr(&output));
    let output = app().args(["status", "--bind", "127.0.0.1:1"]).output().unwrap();
    assert!(stderr(&output).contains("unexpected argument '--bind'"), "{}", stderr(&output));
    let output = app().args(["--client-only", "--data-dir", "x", "--url", "http://127.0.0.1:9"]).output().unwrap();
    assert!(stderr(&output).contains("cannot be used with"), "{}", stderr(&output));
    let output = app().args(["--server-only", "--gpus", "0"]).output().unwrap();
    assert!(stderr(&output).contains("cannot be used with"), "{}", stderr(&output));
}

#[test]
fn a_config_file_with_both_tables_serves_and_an_unknown_key_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let port = testkit::free_port();
    let both = dir.path().join("both.toml");
    std::fs::write(
        &both,
        format!(
            "[server]\nbind = \"127.0.0.1:{port}\"\ndata_dir = \"{}\"\n\n[worker]\nname = \"box-1\"\nmax_jobs = 2\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let mut server = app()
        .args(["--server-only", "--config"])
        .arg(&both)
        .env_remove("APP_BIND")
        .env_remove("APP_DATA_DIR")
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    // The database in the [server] table's data_dir, and the port of its bind.
    while !dir.path().join("data").join("queue.db").is_file()
        || std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
    {
        assert!(std::time::Instant::now() < deadline, "the server did not start with both tables");
        assert!(server.try_wait().unwrap().is_none(), "the server exited");
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    let _ = server.kill();
    let _ = server.wait();

    // APP_CONFIG_FILE names the file when --config does not; a misspelt key is named.
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[server]\nbind = \"127.0.0.1:1\"\n\n[worker]\nmax_job = 3\n").unwrap();
    let output = app().arg("--server-only").env("APP_CONFIG_FILE", &bad).output().unwrap();
    assert_one_line_error(&output, "unknown field `max_job`");
    assert!(stderr(&output).contains("bad.toml at line 5"), "{}", stderr(&output));
    std::fs::write(&bad, "[server]\n[workers]\n").unwrap();
    assert_one_line_error(&app().arg("--config").arg(&bad).output().unwrap(), "unknown field `workers`");
    let missing = app().args(["--config", "/nonexistent/both.toml"]).output().unwrap();
    assert_one_line_error(&missing, "reading config file /nonexistent/both.toml");
}

#[test]
fn flags_beat_the_environment_which_beats_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file_port = testkit::free_port();
    let config = dir.path().join("server.toml");
    std::fs::write(&config, format!("[server]\nbind = \"127.0.0.1:{file_port}\"\ndata_dir = \"from-file\"\n")).unwrap();
    // Each start must create its database where the winning layer says.
    let start = |extra: &[&str], env_data: Option<&str>, expected: &str| {
        let mut command = app();
        command.current_dir(dir.path()).arg("--server-only").arg("--config").arg(&config).args(extra);
        command.env_remove("APP_BIND").env_remove("APP_DATA_DIR").stderr(std::process::Stdio::null());
        if let Some(data) = env_data {
            command.env("APP_DATA_DIR", data);
        }
        let mut child = command.spawn().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !dir.path().join(expected).join("queue.db").is_file() {
            assert!(std::time::Instant::now() < deadline, "no database in {expected}");
            assert!(child.try_wait().unwrap().is_none(), "the server exited");
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        let _ = child.kill();
        let _ = child.wait();
    };
    start(&[], None, "from-file");
    start(&[], Some("from-env"), "from-env");
    start(&["--data-dir", "from-flag"], Some("from-env"), "from-flag");
    assert!(!dir.path().join("app-data").exists(), "the default was never used");
}

#[test]
fn keys_without_effect_are_named_as_warnings_by_the_dry_run_and_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("wandb.yaml");
    std::fs::write(
        &file,
        "program: train.py\nmethod: grid\nproject: my-project\nentity: my-team\nparameters:\n  lr: {values: [0.1, 0.01]}\n",
    )
    .unwrap();
    let output = app().args(["submit", "--dry-run"]).arg(&file).output().unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let warnings = stderr(&output);
    assert!(warnings.contains("warning:") && warnings.contains("project") && warnings.contains("entity"), "{warnings}");
    assert!(stdout(&output).contains("2 jobs"), "{}", stdout(&output));
    let server = ServerProcess::start();
    let output = app().args(["submit", "--url", &server.url]).arg(&file).output().unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stderr(&output).contains("project"), "the server's answer names them too: {}", stderr(&output));
}
