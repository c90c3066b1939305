//! Tokens end to end: the real server, worker and CLI processes, each given its own token.

use shared::api::JobQuery;
use shared::job::JobStatus;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};
use testkit::{app, free_port, wait_until, ServerProcess, WorkerProcess};

const USER: &str = "e2e-user-token-0123456789";
const WORKER: &str = "e2e-worker-token-0123456789";

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[tokio::test]
async fn a_secured_server_runs_jobs_for_token_holders_only_and_jobs_never_see_the_token() {
    let tokens = tempfile::tempdir().unwrap();
    let (user_file, worker_file) = (tokens.path().join("user"), tokens.path().join("worker"));
    std::fs::write(&user_file, format!("# the team's token\n{USER}\n")).unwrap();
    std::fs::write(&worker_file, format!("{WORKER}\n")).unwrap();
    let server = ServerProcess::start_with(&format!(
        "lease_secs = 3\nheartbeat_secs = 0.5\nuser_token_file = {:?}\nworker_token_file = {:?}\n",
        user_file, worker_file
    ));
    let sweep = tokens.path().join("sweep.yaml");
    std::fs::write(&sweep, "name: secret\ncommand: 'echo \"token=[${APP_TOKEN:-none}]\"'\n").unwrap();

    // No token: a one-line error that says what to set, and nothing stored.
    let refused = app().args(["submit", "--url", &server.url]).arg(&sweep).output().unwrap();
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("APP_TOKEN"), "{}", stderr(&refused));
    // The worker's token cannot submit either.
    let wrong = app().args(["submit", "--url", &server.url]).arg(&sweep).env("APP_TOKEN", WORKER).output().unwrap();
    assert!(!wrong.status.success() && stderr(&wrong).contains("worker token"), "{}", stderr(&wrong));
    let submitted = app().args(["submit", "--url", &server.url]).arg(&sweep).env("APP_TOKEN", USER).output().unwrap();
    assert!(submitted.status.success(), "{}", stderr(&submitted));

    // A worker without a token gets nowhere; one with the worker token (from a file) runs it.
    let mut stray = WorkerProcess::start(&server.url, "stray", &[]);
    let worker_flag = worker_file.to_string_lossy().into_owned();
    let _worker = WorkerProcess::start(&server.url, "good", &["--token-file", &worker_flag]);
    let client =
        client::Client::with_options(&server.url, &client::ClientOptions { token: Some(USER.into()), ca_pem: None })
            .unwrap();
    let job = wait_until("the job succeeds", Duration::from_secs(30), || async {
        let jobs = client.jobs(&JobQuery::default()).await.ok()?.jobs;
        jobs.into_iter().find(|job| job.status == JobStatus::Succeeded)
    })
    .await;
    assert_eq!(job.worker.as_deref(), Some("good"));
    let log = client.log(job.id, &Default::default()).await.unwrap().text;
    assert!(log.contains("token=[none]"), "the job saw a token: {log}");
    // The stray worker may still be starting on a loaded machine: wait for its word, bounded.
    wait_until("the stray worker names the token", Duration::from_secs(30), || async {
        stray.log().contains("token").then_some(())
    })
    .await;
    stray.signal("TERM");
    stray.wait_exit(Duration::from_secs(10));
    assert!(stray.log().contains("token"), "the stray worker says why it cannot work: {}", stray.log());
}

#[test]
fn listening_beyond_loopback_without_tokens_is_refused_unless_insecure() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let bind = format!("0.0.0.0:{port}");
    let started = Instant::now();
    let refused = app()
        .args(["--server-only", "--bind", &bind, "--data-dir"])
        .arg(dir.path().join("data"))
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let message = stderr(&refused);
    assert!(message.contains("refusing to listen") && message.contains("--insecure-no-auth"), "{message}");
    assert!(started.elapsed() < Duration::from_secs(20));
    let mut insecure = app()
        .args(["--server-only", "--insecure-no-auth", "--bind", &bind, "--data-dir"])
        .arg(dir.path().join("data"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(insecure.try_wait().unwrap().is_none(), "--insecure-no-auth lets it start");
        assert!(Instant::now() < deadline, "the insecure server did not start listening");
        std::thread::sleep(Duration::from_millis(25));
    }
    let _ = insecure.kill();
    let _ = insecure.wait();
}

#[tokio::test]
async fn tokens_never_reach_the_server_log_even_at_trace_level() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let log = dir.path().join("server.log");
    let mut server = app()
        .args(["--server-only", "--bind", &format!("127.0.0.1:{port}"), "--data-dir"])
        .arg(dir.path().join("data"))
        .env("APP_USER_TOKEN", USER)
        .env("APP_WORKER_TOKEN", WORKER)
        .env("RUST_LOG", "trace")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    wait_until("the server answers", Duration::from_secs(20), || async {
        http.get(format!("{url}/api/health")).send().await.ok()
    })
    .await;
    for token in [USER, WORKER, "wrong-token-wrong-token-1"] {
        let _ = http.get(format!("{url}/api/jobs")).bearer_auth(token).send().await.unwrap();
        let _ = http.get(format!("{url}/api/jobs?token={token}")).send().await.unwrap();
        let _ = http.get(format!("{url}/api/events")).header("cookie", format!("app_token={token}")).send().await;
        let _ = http.post(format!("{url}/api/session")).bearer_auth(token).send().await.unwrap();
    }
    let _ = server.kill();
    let _ = server.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("/api/jobs"), "the log has the requests: {}", &text[..text.len().min(2000)]);
    for token in [USER, WORKER, "wrong-token-wrong-token-1"] {
        assert!(!text.contains(token), "a token reached the log");
    }
}

const USER_A: &str = "e2e-user-a-token-0123456789";
const USER_B: &str = "e2e-user-b-token-0123456789";

/// `app ARGS` against `url` as the holder of `token`: (success, stdout, stderr).
fn app_as(url: &str, token: &str, args: &[&str]) -> (bool, String, String) {
    let output = app().args(args).args(["--url", url]).env("APP_TOKEN", token).output().unwrap();
    (output.status.success(), String::from_utf8_lossy(&output.stdout).into_owned(), stderr(&output))
}

#[tokio::test]
async fn two_users_of_one_token_file_see_everything_and_change_only_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let (user_file, worker_file) = (dir.path().join("users"), dir.path().join("worker"));
    std::fs::write(&user_file, format!("# the lab\nuser-a:{USER_A}\nuser-b:{USER_B}\n")).unwrap();
    std::fs::write(&worker_file, format!("{WORKER}\n")).unwrap();
    let server = ServerProcess::start_with(&format!(
        "user_token_file = {:?}\nworker_token_file = {:?}\n",
        user_file, worker_file
    ));
    let url = server.url.as_str();
    for (name, token) in [("grid-a", USER_A), ("grid-b", USER_B)] {
        let file = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&file, format!("name: {name}\ncommand: 'true'\ngrid:\n  i: [1, 2]\n")).unwrap();
        let (ok, _, err) = app_as(url, token, &["submit", &file.to_string_lossy()]);
        assert!(ok, "{name}: {err}");
    }

    let (ok, out, err) = app_as(url, USER_A, &["whoami"]);
    assert!(ok && out == "user-a\n", "{out}{err}");
    let (_, out, _) = app_as(url, USER_B, &["whoami"]);
    assert_eq!(out, "user-b\n");

    // --mine is the caller's own; --user anyone's; without either, everyone's with owners.
    let sweeps = |args: &[&str], token| -> Vec<(String, String)> {
        let (ok, out, err) = app_as(url, token, &[&["status", "--json"], args].concat());
        assert!(ok, "{err}");
        let listed: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
        listed
            .iter()
            .map(|sweep| (sweep["name"].as_str().unwrap().into(), sweep["owner"].as_str().unwrap().into()))
            .collect()
    };
    let pair = |name: &str, owner: &str| (name.to_string(), owner.to_string());
    assert_eq!(sweeps(&["--mine"], USER_A), [pair("grid-a", "user-a")]);
    assert_eq!(sweeps(&["--mine"], USER_B), [pair("grid-b", "user-b")]);
    assert_eq!(sweeps(&["--user", "user-a"], USER_B), [pair("grid-a", "user-a")]);
    assert_eq!(sweeps(&[], USER_B), [pair("grid-b", "user-b"), pair("grid-a", "user-a")]);
    let (_, table, _) = app_as(url, USER_B, &["status"]);
    assert!(table.contains("owner") && table.contains("user-a") && table.contains("user-b"), "{table}");

    // user-b may not cancel user-a's sweep: refused with the owner named, and nothing changed.
    let (ok, _, err) = app_as(url, USER_B, &["cancel", "grid-a"]);
    assert!(!ok && err.contains("sweep grid-a belongs to user-a"), "{err}");
    let (ok, out, _) = app_as(url, USER_B, &["status", "grid-a", "--json"]);
    let jobs: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(ok && jobs["jobs"].as_array().unwrap().iter().all(|job| job["status"] == "queued"), "{jobs}");
    // Its owner may.
    let (ok, out, err) = app_as(url, USER_A, &["cancel", "grid-a"]);
    assert!(ok && out.contains("2 cancelled"), "{out}{err}");
}

#[test]
fn a_bad_user_token_file_stops_the_server_naming_the_line_but_not_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let users = dir.path().join("users");
    let secret = "secret-part-of-a-token-0123";
    for (text, says) in [
        (format!("user-a:{USER_A}\nUser B:{secret}\n"), "line 2 has a bad name"),
        (format!("user-a:{secret}\nuser-b:{secret}\n"), "is also user-a's"),
        (format!("user-a:{WORKER}\n"), "also a worker token"),
    ] {
        std::fs::write(&users, &text).unwrap();
        let output = app()
            .args(["--server-only", "--bind", &format!("127.0.0.1:{}", free_port()), "--data-dir"])
            .arg(dir.path().join("data"))
            .arg("--user-token-file")
            .arg(&users)
            .env("APP_WORKER_TOKEN", WORKER)
            .stdout(Stdio::null())
            .output()
            .unwrap();
        let message = stderr(&output);
        assert!(!output.status.success() && message.contains(says), "{text:?}: {message}");
        assert!(message.contains(&users.display().to_string()), "the file is named: {message}");
        assert!(!message.contains(secret) && !message.contains(WORKER), "a token reached the message: {message}");
    }
}
