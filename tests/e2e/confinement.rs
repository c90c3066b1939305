//! What a job can reach of its worker and what outlives it (issue 31, items 2 and 3): the
//! tokens of the worker (and, in `app` alone, of the server) are out of reach of its jobs'
//! /proc scans; jobs may run as another user; processes that leave a job's process group and
//! session end with its attempt, whether it ended, was cancelled or its worker was killed.
//! Real `app` processes on loopback; the credentials are made by a shell the test never reads,
//! so the test process holds none of them.

use shared::api::LogQuery;
use shared::job::JobStatus;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use testkit::{alive, app, wait_until, wait_until_sync, ServerProcess, WorkerProcess};

const LONG: Duration = Duration::from_secs(90);

/// The scanning job: looks for `pieces` joined in every /proc file of every other process.
fn scan_command(pieces: &[&str]) -> String {
    scan_command_with("python3", pieces)
}

fn scan_command_with(python: &str, pieces: &[&str]) -> String {
    format!("{python} {} {}", testkit::repo("tests/fixtures/proc_scan.py").display(), pieces.join(" "))
}

/// Shell lines that set `variable` to a fresh secret `<prefix>-<48 hex digits>`, the prefix
/// written in two pieces so that the test's own memory never holds it whole.
fn secret(variable: &str, prefix: (&str, &str)) -> String {
    format!(
        "{variable}=\"{}\"\"{}-$(od -An -N24 -tx1 /dev/urandom | tr -d ' \\n')\"; export {variable}\n",
        prefix.0, prefix.1
    )
}

/// `command`, started by a shell that first runs `prelude` (which may set variables), then
/// execs it: the process is `command`'s program, its environment set by the shell.
fn through_shell(command: &Command, prelude: &str) -> Command {
    let mut shell = Command::new("/bin/sh");
    shell.arg("-c").arg(format!("{prelude}exec \"$@\"")).arg("sh").arg(command.get_program()).args(command.get_args());
    for (key, value) in command.get_envs() {
        match value {
            Some(value) => shell.env(key, value),
            None => shell.env_remove(key),
        };
    }
    shell.stdin(Stdio::null());
    shell
}

/// A process killed when the test ends, also when it fails.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn job_log(server: &ServerProcess, sweep: &str) -> (shared::api::Job, String) {
    let job = wait_until(&format!("the job of {sweep} ended"), LONG, || async {
        let job = server.jobs_of(sweep).await.pop()?;
        job.status.is_terminal().then_some(job)
    })
    .await;
    let log = server.client().log(job.id, &LogQuery::default()).await.unwrap().text;
    (job, log)
}

/// Checks a scan's output: it ran, could read its own environment, and found nothing.
fn assert_nothing_found(log: &str) {
    assert!(log.contains("scan done"), "the scan did not finish:\n{log}");
    assert!(log.contains("sees_own_environment=True"), "the scan could not read what it should:\n{log}");
    assert!(!log.contains("FOUND"), "a job read a credential:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_finds_no_worker_token_in_any_proc_file_of_any_process() {
    let server = ServerProcess::start();
    let dir = tempfile::tempdir().unwrap();
    let mut worker_command = app();
    worker_command
        .args(["--client-only", "--url", &server.url, "--name", "scanned", "--work-dir"])
        .arg(dir.path().join("work"))
        .env("RUST_LOG", "info");
    // The token in the worker's environment, as `APP_TOKEN=... app --client-only` puts it.
    let worker = Killed(
        through_shell(&worker_command, &secret("APP_TOKEN", ("secretA-to", "ken")))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("worker.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    server.submit(&format!("name: scan\ncommand: {}\n", scan_command(&["secretA", "-token-"]))).await;
    let (job, log) = job_log(&server, "scan").await;
    assert_eq!(job.status, JobStatus::Succeeded, "{job:#?}\n{log}");
    assert_nothing_found(&log);
    // The worker is among the ancestors the scan looked at.
    assert!(log.contains(&format!("{}", worker.0.id())), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_of_app_alone_finds_neither_the_user_nor_the_worker_token() {
    let dir = tempfile::tempdir().unwrap();
    let port = testkit::free_port();
    let url = format!("http://127.0.0.1:{port}");
    // Tokens made and kept in files by a shell: the user token for `app submit`, both for `app`.
    let user_file = dir.path().join("user-token");
    let make = format!(
        "{}printf %s \"$APP_USER_TOKEN\" > {}\n",
        secret("APP_USER_TOKEN", ("secretB-to", "ken")),
        user_file.display()
    );
    let mut embedded_command = app();
    embedded_command
        .args(["--bind", &format!("127.0.0.1:{port}"), "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--work-dir")
        .arg(dir.path().join("work"))
        .env("RUST_LOG", "info");
    let prelude = format!("{make}{}", secret("APP_WORKER_TOKEN", ("secretB-to", "ken")));
    let embedded = Killed(
        through_shell(&embedded_command, &prelude)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("app.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    wait_until_sync("app listens", LONG, || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    let report = dir.path().join("report");
    let sweep = dir.path().join("scan.yaml");
    std::fs::write(
        &sweep,
        format!("name: scan\ncommand: {} > {}\n", scan_command(&["secretB", "-token-"]), report.display()),
    )
    .unwrap();
    let mut submit = app();
    submit.args(["submit", "--no-code", "--url", &url]).arg(&sweep);
    let submitted =
        through_shell(&submit, &format!("APP_TOKEN=\"$(cat {})\"; export APP_TOKEN\n", user_file.display()))
            .output()
            .unwrap();
    assert!(submitted.status.success(), "{}", String::from_utf8_lossy(&submitted.stderr));
    wait_until_sync("the scan wrote its report", LONG, || {
        std::fs::read_to_string(&report).is_ok_and(|report| report.contains("scan done"))
    });
    let report = std::fs::read_to_string(&report).unwrap();
    assert_nothing_found(&report);
    assert!(report.contains(&format!("{}", embedded.0.id())), "app is among the ancestors:\n{report}");
}

/// Whether this test process may start jobs as another user (root, with `nobody` known).
fn can_run_as_nobody() -> bool {
    nix::unistd::Uid::effective().is_root() && nix::unistd::User::from_name("nobody").ok().flatten().is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_run_as_the_configured_user_own_what_they_write_and_deliver_it() {
    if !can_run_as_nobody() {
        eprintln!("skipped: starting jobs as another user needs root and a `nobody` user");
        return;
    }
    let nobody = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let server = ServerProcess::start();
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), "[worker]\nrun_as = \"nobody\"\n").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut worker_command = app();
    worker_command
        .args(["--client-only", "--url", &server.url, "--name", "lab", "--max-jobs", "1", "--config"])
        .arg(config.path())
        .arg("--work-dir")
        .arg(dir.path().join("work"));
    let _worker = Killed(
        through_shell(&worker_command, &secret("APP_TOKEN", ("secretC-to", "ken")))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let script =
        "id -u; echo \"HOME=$HOME USER=$USER\"; echo '{\"step\": 1, \"loss\": 0.5}' >> \"$APP_METRICS_FILE\"; \
                  echo weights > \"$APP_OUTPUT_DIR/model.txt\"; echo state > \"$APP_CHECKPOINT_DIR/state\"; \
                  touch own-file; cat /proc/$PPID/environ > /dev/null 2>&1 && echo READ-WORKER-ENVIRON; true";
    server.submit(&format!("name: lab\ncommand: {}\n", serde_json::to_string(script).unwrap())).await;
    let (job, log) = job_log(&server, "lab").await;
    assert_eq!(job.status, JobStatus::Succeeded, "{job:#?}\n{log}");
    assert!(log.starts_with(&format!("{}\n", nobody.uid)), "{log}");
    assert!(log.contains(&format!("HOME={} USER=nobody", nobody.dir.display())), "{log}");
    assert!(!log.contains("READ-WORKER-ENVIRON"), "{log}");
    let results = server.client().results(job.id).await.unwrap();
    let files: Vec<&str> = results[0].files.iter().map(|file| file.path.as_str()).collect();
    assert_eq!(files, ["model.txt"], "{:?}", results[0].files);
    // The system's Python: the user's own may sit in root's home, which `nobody` cannot enter.
    let scan = scan_command_with("/usr/bin/python3", &["secretC", "-token-"]);
    server.submit(&format!("name: lab-scan\ncommand: {scan}\n")).await;
    let (job, log) = job_log(&server, "lab-scan").await;
    assert_eq!(job.status, JobStatus::Succeeded, "{job:#?}\n{log}");
    assert!(log.contains(&format!("uid={}", nobody.uid)), "{log}");
    assert_nothing_found(&log);
}

#[test]
fn a_run_as_user_that_does_not_exist_is_refused_at_start_saying_so() {
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), "[worker]\nrun_as = \"no-such-user-x\"\n").unwrap();
    let work = tempfile::tempdir().unwrap();
    let output = app()
        .args([
            "--client-only",
            "--url",
            "http://127.0.0.1:9",
            "--config",
            config.path().to_str().unwrap(),
            "--work-dir",
        ])
        .arg(work.path())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("run_as: there is no user `no-such-user-x`"), "{stderr}");
}

/// A job that starts `setsid sleep 300` (a new session and group: no group kill reaches it),
/// writes its pid to `pid_file`, and then `then` (exit or wait).
fn escaping_job(name: &str, pid_file: &Path, then: &str) -> String {
    format!("name: {name}\ncommand: \"setsid sleep 300 > /dev/null 2>&1 & echo $! > {}; {then}\"\n", pid_file.display())
}

fn read_pid(path: &Path) -> u32 {
    let mut pid = None;
    wait_until_sync("the job wrote its escapee's pid", LONG, || {
        pid = std::fs::read_to_string(path).ok().and_then(|text| text.trim().parse().ok());
        pid.is_some()
    });
    pid.unwrap()
}

fn gone_within(pid: u32, limit: Duration, what: &str) {
    let started = Instant::now();
    wait_until_sync(what, limit, || !alive(pid));
    eprintln!("{what}: {:?}", started.elapsed());
}

/// Ends, cancels, and kills the worker of, a job whose process escaped its group: each time
/// the escapee ends with it.
async fn escapees_end_with_their_attempt(cgroups: bool) {
    let server = ServerProcess::start();
    let config = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(config.path(), format!("[worker]\ncgroups = {cgroups}\n")).unwrap();
    let args = ["--config", config.path().to_str().unwrap(), "--max-jobs", "2"];
    let mut worker = WorkerProcess::start(&server.url, "keeper", &args);
    let pids = tempfile::tempdir().unwrap();
    let mechanism = if cgroups { "cgroup v2" } else { "subreaper" };
    wait_until_sync("the worker said how it keeps jobs", LONG, || worker.log().contains("jobs are kept"));
    if cgroups && !worker.log().contains("cgroup v2") {
        eprintln!("no writable cgroup v2 here: the subreaper path is what this run checks");
    } else {
        assert!(worker.log().contains(mechanism), "{}", worker.log());
    }

    // 1. The job exits while its escapee runs on: the escapee goes within a heartbeat or two.
    let ended = pids.path().join("ended");
    server.submit(&escaping_job("ended", &ended, "exit 0")).await;
    let escapee = read_pid(&ended);
    let (job, _) = job_log(&server, "ended").await;
    assert_eq!(job.status, JobStatus::Succeeded);
    gone_within(escapee, Duration::from_secs(10), &format!("{mechanism}: the escapee of an ended job is gone"));

    // 2. A cancelled job: its escapee goes with it.
    let cancelled = pids.path().join("cancelled");
    server.submit(&escaping_job("cancelled", &cancelled, "sleep 300")).await;
    let escapee = read_pid(&cancelled);
    let job = server.jobs_of("cancelled").await.pop().unwrap();
    server.client().cancel_job(job.id).await.unwrap();
    gone_within(escapee, Duration::from_secs(15), &format!("{mechanism}: the escapee of a cancelled job is gone"));

    // 3. The worker is killed with SIGKILL: the guard takes the escapee too.
    let killed = pids.path().join("killed");
    server.submit(&escaping_job("killed", &killed, "sleep 300")).await;
    let escapee = read_pid(&killed);
    assert!(alive(escapee));
    worker.child.kill().unwrap();
    worker.child.wait().unwrap();
    gone_within(escapee, Duration::from_secs(10), &format!("{mechanism}: the escapee of a killed worker is gone"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_that_leave_a_job_end_with_it_in_a_cgroup() {
    escapees_end_with_their_attempt(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_that_leave_a_job_end_with_it_without_cgroups() {
    escapees_end_with_their_attempt(false).await;
}
