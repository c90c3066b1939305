//! End-to-end tests of the worker daemon: the real `app` binary as server and workers on
//! loopback, fake GPUs standing in for real ones.

use shared::api::{Job, LogQuery};
use shared::job::JobStatus;
use std::collections::HashMap;
use std::time::Duration;
use testkit::{alive, app, wait_until, ServerProcess, WorkerProcess};

const LONG: Duration = Duration::from_secs(60);

/// Waits until every job of the sweep has finished (succeeded, failed or cancelled).
async fn finished(server: &ServerProcess, sweep: &str) -> Vec<Job> {
    wait_until(&format!("every job of {sweep} finished"), LONG, || async {
        let jobs = server.jobs_of(sweep).await;
        jobs.iter().all(|job| job.status.is_terminal()).then_some(jobs)
    })
    .await
}

/// Waits until a job of the sweep runs, and returns it.
async fn running_job(server: &ServerProcess, sweep: &str) -> Job {
    wait_until(&format!("a job of {sweep} runs"), LONG, || async {
        server.jobs_of(sweep).await.into_iter().find(|job| job.status == JobStatus::Running)
    })
    .await
}

/// Reads a file of a job's latest result version.
async fn result_file(server: &ServerProcess, job: shared::api::JobId, path: &str) -> String {
    let versions = server.client().results(job).await.unwrap();
    let version = versions.last().unwrap_or_else(|| panic!("job {job} has no result"));
    let destination = tempfile::NamedTempFile::new().unwrap();
    server.client().download_file(job, version.attempt, path, destination.path()).await.unwrap();
    std::fs::read_to_string(destination.path()).unwrap()
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|byte| format!("{byte:02x}")).collect()
}

/// (start, end) in ns, from the `span` file the jobs below write.
fn span(text: &str) -> (u128, u128) {
    let mut parts = text.split_whitespace().map(|part| part.parse::<u128>().unwrap());
    (parts.next().unwrap(), parts.next().unwrap())
}

const SPAN_JOB: &str = r#"start=$(date +%s%N); sleep 0.4; echo "$start $(date +%s%N)" > "$APP_OUTPUT_DIR/span"; echo "$CUDA_VISIBLE_DEVICES" > "$APP_OUTPUT_DIR/gpus""#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_with_two_fake_gpus_each_spread_a_sweep_without_sharing_a_gpu() {
    let server = ServerProcess::start();
    let _a = WorkerProcess::start(&server.url, "box-a", &["--fake-gpus", "2x24GiB"]);
    let _b = WorkerProcess::start(&server.url, "box-b", &["--fake-gpus", "2x24GiB"]);
    let yaml = format!(
        "name: spread\ncommand: '{SPAN_JOB}'\nresources: {{gpus: 1}}\ngrid:\n  i: [{}]\n",
        (0..12).map(|i| i.to_string()).collect::<Vec<_>>().join(", ")
    );
    server.submit(&yaml).await;
    let jobs = finished(&server, "spread").await;
    assert!(jobs.iter().all(|job| job.status == JobStatus::Succeeded), "{jobs:#?}");
    let mut spans: HashMap<(String, String), Vec<(u128, u128)>> = HashMap::new();
    let client = server.client();
    for job in &jobs {
        let version = client.results(job.id).await.unwrap().pop().expect("a result version");
        let worker = job.worker.clone().unwrap();
        assert_eq!(version.record.worker, worker);
        let gpus = result_file(&server, job.id, "gpus").await.trim().to_string();
        assert!(gpus == "0" || gpus == "1", "job {} ran on GPU {gpus:?}, not one of its worker's two", job.id);
        assert_eq!(version.record.cuda_visible_devices.as_deref(), Some(gpus.as_str()));
        // Every file downloads with the sha256 of its manifest.
        for file in &version.files {
            let destination = tempfile::NamedTempFile::new().unwrap();
            client.download_file(job.id, version.attempt, &file.path, destination.path()).await.unwrap();
            assert_eq!(sha256_hex(&std::fs::read(destination.path()).unwrap()), file.sha256);
        }
        spans.entry((worker, gpus)).or_default().push(span(&result_file(&server, job.id, "span").await));
    }
    assert!(
        spans.keys().any(|(worker, _)| worker == "box-a") && spans.keys().any(|(worker, _)| worker == "box-b"),
        "both workers ran jobs: {:?}",
        spans.keys()
    );
    for (gpu, mut runs) in spans {
        runs.sort();
        for pair in runs.windows(2) {
            assert!(pair[0].1 <= pair[1].0, "two exclusive jobs overlapped on {gpu:?}: {pair:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_that_declare_memory_pack_three_to_a_24_gib_gpu() {
    let server = ServerProcess::start();
    let _worker = WorkerProcess::start(&server.url, "packer", &["--fake-gpus", "1x24GiB", "--max-jobs", "8"]);
    let yaml = format!("name: packed\ncommand: '{SPAN_JOB}'\nresources: {{gpus: 1, gpu_memory: 8GiB}}\ngrid:\n  i: [0, 1, 2, 3, 4, 5, 6]\n");
    server.submit(&yaml).await;
    let jobs = finished(&server, "packed").await;
    let mut events = Vec::new();
    for job in &jobs {
        assert_eq!(job.status, JobStatus::Succeeded);
        let (start, end) = span(&result_file(&server, job.id, "span").await);
        events.push((start, 1i32));
        events.push((end, -1));
    }
    events.sort();
    let mut running = 0;
    let mut most = 0;
    for (_, change) in events {
        running += change;
        most = most.max(running);
    }
    assert!(most <= 3, "{most} jobs of 8 GiB shared one 24 GiB GPU");
    assert!(most >= 2, "jobs with declared memory should share the GPU (at most {most} ran at once)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_gpu_job_gets_two_distinct_gpus_and_torchrun_variables() {
    let server = ServerProcess::start();
    let _worker = WorkerProcess::start(&server.url, "duo", &["--fake-gpus", "2x24GiB"]);
    let command = r#"env | grep -E "^(CUDA_VISIBLE_DEVICES|WORLD_SIZE|MASTER_ADDR|MASTER_PORT|APP_PARAM_LR|APP_SWEEP|APP_ATTEMPT)=" | sort > "$APP_OUTPUT_DIR/env""#;
    server.submit(&format!("name: duo\ncommand: '{command}'\nresources: {{gpus: 2}}\ngrid: {{lr: [0.5]}}\n")).await;
    let jobs = finished(&server, "duo").await;
    let env = result_file(&server, jobs[0].id, "env").await;
    assert!(env.contains("CUDA_VISIBLE_DEVICES=0,1") || env.contains("CUDA_VISIBLE_DEVICES=1,0"), "{env}");
    assert!(env.contains("WORLD_SIZE=2") && env.contains("MASTER_ADDR=127.0.0.1"), "{env}");
    assert!(
        env.contains("APP_PARAM_LR=0.5") && env.contains("APP_SWEEP=duo") && env.contains("APP_ATTEMPT=1"),
        "{env}"
    );
    let port: u16 = env.lines().find_map(|line| line.strip_prefix("MASTER_PORT=")).unwrap().parse().unwrap();
    assert!(port > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_s_job_is_requeued_after_its_lease_and_finished_by_another() {
    let server = ServerProcess::start();
    let mut first = WorkerProcess::start(&server.url, "doomed", &[]);
    server.submit("name: survivor\ncommand: 'sleep 2; echo done > \"$APP_OUTPUT_DIR/done\"'\n").await;
    let client = server.client();
    let job = running_job(&server, "survivor").await;
    assert_eq!(job.worker.as_deref(), Some("doomed"));
    first.signal("KILL");
    first.wait_exit(Duration::from_secs(10));
    let _second = WorkerProcess::start(&server.url, "rescuer", &[]);
    let jobs = finished(&server, "survivor").await;
    assert_eq!(jobs[0].status, JobStatus::Succeeded);
    assert_eq!((jobs[0].attempt, jobs[0].worker.as_deref()), (2, Some("rescuer")));
    let versions = client.results(job.id).await.unwrap();
    assert_eq!(versions.len(), 1, "one result recorded");
    assert_eq!(versions[0].attempt, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_running_job_kills_its_whole_process_group() {
    let server = ServerProcess::start();
    let worker = WorkerProcess::start(&server.url, "victim", &[]);
    let pids = worker.dir.path().join("pids");
    std::fs::create_dir_all(&pids).unwrap();
    let command = format!("sleep 1000 & echo $! > {0}/child; echo $$ > {0}/parent; sleep 1000", pids.display());
    server.submit(&format!("name: forever\ncommand: '{command}'\n")).await;
    let read_pid =
        |name: &str| std::fs::read_to_string(pids.join(name)).ok().and_then(|text| text.trim().parse::<u32>().ok());
    let (parent, child) =
        wait_until("the job wrote its pids", LONG, || async { read_pid("parent").zip(read_pid("child")) }).await;
    assert!(alive(parent) && alive(child));
    let job = server.jobs_of("forever").await.remove(0);
    server.client().cancel_job(job.id).await.unwrap();
    // Heartbeat (0.5 s) + grace (2 s) + slack.
    wait_until("the job and the child it forked are gone", Duration::from_secs(8), || async {
        (!alive(parent) && !alive(child)).then_some(())
    })
    .await;
    let job = wait_until("the job is cancelled", LONG, || async {
        let job = server.client().job(job.id).await.unwrap();
        (job.status == JobStatus::Cancelled).then_some(job)
    })
    .await;
    assert_eq!(job.reason.as_deref(), Some("cancelled"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_fail_jobs_retries_rerun_them_and_missing_commands_say_so() {
    let server = ServerProcess::start();
    let _worker = WorkerProcess::start(&server.url, "strict", &[]);
    server.submit("name: three\ncommand: 'exit 3'\n").await;
    server.submit("name: three-again\ncommand: 'exit 3'\nretries: 1\n").await;
    server.submit("name: typo\ncommand: 'pyhton-not-installed train.py'\n").await;
    let three = finished(&server, "three").await.remove(0);
    assert_eq!((three.status, three.exit_code, three.attempt), (JobStatus::Failed, Some(3), 1));
    let again = finished(&server, "three-again").await.remove(0);
    assert_eq!(
        (again.status, again.exit_code, again.attempt),
        (JobStatus::Failed, Some(3), 2),
        "retries: 1 runs twice"
    );
    let typo = finished(&server, "typo").await.remove(0);
    assert_eq!((typo.status, typo.exit_code), (JobStatus::Failed, Some(127)));
    assert!(typo.reason.as_deref().unwrap_or_default().contains("not found"), "{:?}", typo.reason);
    let log = server.client().log(typo.id, &LogQuery::default()).await.unwrap();
    assert!(log.text.contains("pyhton-not-installed"), "{}", log.text);
    // The worker is unaffected.
    server.submit("name: after\ncommand: 'true'\n").await;
    assert_eq!(finished(&server, "after").await[0].status, JobStatus::Succeeded);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_reach_the_api_and_the_leaderboard_and_garbage_lines_are_skipped() {
    let server = ServerProcess::start();
    let _worker = WorkerProcess::start(&server.url, "scorer", &[]);
    let command = r#"for s in 1 2 3; do echo "{\"step\": $s, \"val_loss\": $(awk "BEGIN { print {loss} + 1 / $s }")}" >> "$APP_METRICS_FILE"; done; echo "not json" >> "$APP_METRICS_FILE"; echo "{\"step\": 4, \"val_loss\": {loss}}" >> "$APP_METRICS_FILE""#;
    let yaml = format!("name: board\ncommand: '{command}'\nmetric: {{name: val_loss, goal: minimize}}\ngrid:\n  loss: [0.5, 0.1, 0.9]\n");
    server.submit(&yaml).await;
    let jobs = finished(&server, "board").await;
    assert!(jobs.iter().all(|job| job.status == JobStatus::Succeeded), "{jobs:#?}");
    let client = server.client();
    let best = jobs.iter().find(|job| job.params["loss"] == 0.1).unwrap();
    let summary = &best.metrics["val_loss"];
    assert_eq!((summary.last, summary.min, summary.count), (0.1, 0.1, 4));
    assert!((summary.max - 1.1).abs() < 1e-9);
    let series = client.metrics(best.id).await.unwrap();
    assert_eq!(series[0].values.len(), 4);
    let log = client.log(best.id, &LogQuery::default()).await.unwrap();
    assert!(log.text.contains("metrics line 4 skipped"), "the garbage line is reported in the job log: {log:?}");
    let board = client.summary("board", None).await.unwrap();
    let order: Vec<f64> = board.rows.iter().map(|row| row.params["loss"].as_f64().unwrap()).collect();
    assert_eq!(order, [0.1, 0.5, 0.9]);
    let top = client.summary("board", Some(1)).await.unwrap();
    assert_eq!(top.rows.len(), 1);
    let results = app().args(["results", "board", "--top", "2", "--url", &server.url]).output().unwrap();
    let text = String::from_utf8_lossy(&results.stdout);
    assert!(text.find("0.1").unwrap() < text.find("0.5").unwrap(), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlink_out_of_the_output_directory_is_not_followed() {
    let server = ServerProcess::start();
    let worker = WorkerProcess::start(&server.url, "careful", &[]);
    let secret = worker.dir.path().join("secret.txt");
    std::fs::write(&secret, "do not upload").unwrap();
    let command = format!("echo ok > \"$APP_OUTPUT_DIR/ok.txt\"; ln -s {} \"$APP_OUTPUT_DIR/leak\"", secret.display());
    server.submit(&format!("name: links\ncommand: '{command}'\n")).await;
    let job = finished(&server, "links").await.remove(0);
    let version = server.client().results(job.id).await.unwrap().pop().unwrap();
    let paths: Vec<&str> = version.files.iter().map(|file| file.path.as_str()).collect();
    assert_eq!(paths, ["ok.txt"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_follow_shows_a_printed_line_within_two_seconds() {
    let server = ServerProcess::start();
    let _worker = WorkerProcess::start(&server.url, "talker", &[]);
    server.submit("name: talk\ncommand: 'echo hello-from-the-job; sleep 4'\n").await;
    let job = running_job(&server, "talk").await;
    let started = std::time::Instant::now();
    let mut follower = std::process::Command::new(env!("CARGO_BIN_EXE_app"))
        .args(["logs", &job.id.to_string(), "-f", "--url", &server.url])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = follower.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        use std::io::BufRead;
        std::io::BufReader::new(stdout).lines().next().unwrap().unwrap()
    });
    let line = tokio::time::timeout(Duration::from_secs(5), line).await.expect("a line within 5 s").unwrap();
    assert_eq!(line, "hello-from-the-job");
    assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
    // -f ends by itself when the attempt ends.
    let status = testkit::wait_exit(&mut follower, LONG);
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_jobs_survive_a_server_restart_and_their_results_arrive() {
    let mut server = ServerProcess::start();
    let _worker = WorkerProcess::start(&server.url, "steady", &[]);
    server
        .submit("name: outage\ncommand: 'echo before; sleep 4; echo after; echo kept > \"$APP_OUTPUT_DIR/kept\"'\n")
        .await;
    running_job(&server, "outage").await;
    server.stop();
    // Down for several heartbeats (0.5 s each), though less than the lease.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    server.restart();
    let job = finished(&server, "outage").await.remove(0);
    assert_eq!((job.status, job.attempt), (JobStatus::Succeeded, 1), "the same attempt finished");
    assert_eq!(result_file(&server, job.id, "kept").await.trim(), "kept");
    let log = server.client().log(job.id, &LogQuery::default()).await.unwrap();
    assert!(log.text.contains("before") && log.text.contains("after"), "{}", log.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_started_before_its_server_keeps_retrying_then_registers() {
    let port = testkit::free_port();
    let url = format!("http://127.0.0.1:{port}");
    let worker = WorkerProcess::start(&url, "early", &[]);
    wait_until("the worker says it cannot reach the server", Duration::from_secs(10), || async {
        worker.log().contains("cannot register with the server").then_some(())
    })
    .await;
    let warnings = worker.log().matches("cannot register with the server").count();
    assert_eq!(warnings, 1, "one warning per interval, not one per try:\n{}", worker.log());
    let server = ServerProcess::start_on(port);
    let workers = wait_until("the worker registers", Duration::from_secs(40), || async {
        let workers = server.client().workers().await.ok()?;
        (!workers.is_empty()).then_some(workers)
    })
    .await;
    assert_eq!(workers[0].name, "early");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_running_jobs_then_the_worker_exits_zero() {
    let server = ServerProcess::start();
    let mut worker = WorkerProcess::start(&server.url, "drainer", &[]);
    server.submit("name: drain\ncommand: 'sleep 1.5; echo finished'\n").await;
    running_job(&server, "drain").await;
    worker.signal("TERM");
    // Once the worker drains (a signal is handled when it is handled: on a loaded machine, a
    // sweep submitted at once can reach a claim the worker made before it saw the signal).
    testkit::wait_until_sync("the worker drains", LONG, || worker.log().contains("draining: no new jobs"));
    server.submit("name: not-taken\ncommand: 'true'\n").await;
    let status = worker.wait_exit(LONG);
    assert!(status.success(), "{status:?}\n{}", worker.log());
    assert_eq!(server.jobs_of("drain").await[0].status, JobStatus::Succeeded);
    assert_eq!(server.jobs_of("not-taken").await[0].status, JobStatus::Queued, "a draining worker claims nothing");
    // It said it left: shown as `left`, also once its lease (3 s) has long passed, not `lost`.
    let state = || async { server.client().workers().await.unwrap().remove(0).state };
    assert_eq!(state().await, shared::api::WorkerState::Left);
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(state().await, shared::api::WorkerState::Left);
    let overview = server.client().overview().await.unwrap();
    assert_eq!((overview.workers.left, overview.workers.lost), (1, 0));
    // Started again, it is healthy again.
    let _again = WorkerProcess::start(&server.url, "drainer", &[]);
    wait_until("the worker is back", LONG, || async {
        (state().await == shared::api::WorkerState::Healthy).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_kills_the_jobs_and_hands_them_back() {
    let server = ServerProcess::start();
    let mut worker = WorkerProcess::start(&server.url, "quitter", &[]);
    server.submit("name: handed-back\ncommand: 'sleep 1000'\n").await;
    running_job(&server, "handed-back").await;
    worker.signal("TERM");
    tokio::time::sleep(Duration::from_millis(300)).await;
    worker.signal("TERM");
    let status = worker.wait_exit(LONG);
    assert!(status.success(), "{status:?}\n{}", worker.log());
    let job = server.jobs_of("handed-back").await.remove(0);
    assert_eq!((job.status, job.crash_count), (JobStatus::Queued, 0), "requeued at once, not counted as a crash");
    assert_eq!(server.client().workers().await.unwrap()[0].state, shared::api::WorkerState::Left);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_result_records_the_git_commit_of_the_working_tree() {
    let server = ServerProcess::start();
    let dir = tempfile::tempdir().unwrap();
    let git = |args: &[&str]| {
        let output = std::process::Command::new("git")
            .args(["-c", "user.name=test", "-c", "user.email=test@example.com", "-C"])
            .arg(dir.path())
            .args(args)
            .output()
            .unwrap();
        assert!(output.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    };
    git(&["init", "-q"]);
    git(&["commit", "-q", "--allow-empty", "-m", "experiment code"]);
    let head = git(&["rev-parse", "HEAD"]);
    let _worker = WorkerProcess::start_in(dir, &server.url, "versioned", &[]);
    server.submit("name: tracked\ncommand: 'true'\n").await;
    let job = finished(&server, "tracked").await.remove(0);
    let version = server.client().results(job.id).await.unwrap().pop().unwrap();
    assert_eq!(version.record.git_commit.as_deref(), Some(head.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relative_work_dir_still_gives_jobs_paths_that_work_from_their_own_directory() {
    let server = ServerProcess::start();
    let home = tempfile::tempdir().unwrap();
    let mut child = app()
        .current_dir(home.path())
        .args(["--client-only", "--url", &server.url, "--name", "relative", "--work-dir", "runs"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // `app` in a job's command is the worker's own binary (a `train:` sweep runs `app train`).
    let command = r#"echo "{\"step\": 1, \"acc\": 0.5}" >> "$APP_METRICS_FILE"; cat "$APP_CONFIG" > "$APP_OUTPUT_DIR/config"; command -v app > "$APP_OUTPUT_DIR/app""#;
    server.submit(&format!("name: rel\ncommand: '{command}'\ngrid: {{x: [7]}}\n")).await;
    let job = finished(&server, "rel").await.remove(0);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(job.status, JobStatus::Succeeded, "{:?}", job.reason);
    assert_eq!(job.metrics["acc"].last, 0.5);
    assert!(result_file(&server, job.id, "config").await.contains("\"x\":7"));
    assert_eq!(result_file(&server, job.id, "app").await.trim(), env!("CARGO_BIN_EXE_app"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_past_its_timeout_is_killed_and_gpu_telemetry_reaches_the_server() {
    let server = ServerProcess::start();
    let _worker = WorkerProcess::start(&server.url, "timer", &["--fake-gpus", "1x16GiB"]);
    server.submit("name: slow\ncommand: 'echo started; sleep 60'\ntimeout: 1\nresources: {gpus: 1}\n").await;
    let started = std::time::Instant::now();
    let job = finished(&server, "slow").await.remove(0);
    assert_eq!(job.status, JobStatus::Failed);
    assert_eq!(job.reason.as_deref(), Some("timed out after 1 s"));
    assert!(started.elapsed() < Duration::from_secs(20), "a 1 s timeout took {:?}", started.elapsed());
    let samples = wait_until("the worker's GPU telemetry is stored", LONG, || async {
        let samples = server.client().telemetry("timer").await.ok()?;
        (!samples.is_empty()).then_some(samples)
    })
    .await;
    assert_eq!((samples[0].index, samples[0].memory_total), (0, 16 << 30));
    assert!(samples[0].at > 0);
}

/// CPU time (user + system, in clock ticks of 10 ms) a process has used so far.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_worker_waits_quietly_instead_of_spinning() {
    let server = ServerProcess::start();
    let worker = WorkerProcess::start(&server.url, "full", &["--max-jobs", "1"]);
    server.submit("name: occupy\ncommand: 'sleep 30'\ngrid: {i: [1, 2]}\n").await;
    running_job(&server, "occupy").await;
    let before = cpu_ticks(worker.child.id());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let used = cpu_ticks(worker.child.id()) - before;
    assert!(used < 40, "a full worker used {used} ticks of CPU in 2 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attempt_directories_go_once_delivered_unless_asked_to_stay() {
    let server = ServerProcess::start();
    let tidy = WorkerProcess::start(&server.url, "tidy", &[]);
    server.submit("name: scratch\ncommand: 'echo data > \"$APP_OUTPUT_DIR/out.txt\"'\n").await;
    let job = finished(&server, "scratch").await.remove(0);
    assert_eq!(result_file(&server, job.id, "out.txt").await.trim(), "data");
    // The attempt ran in a slot directory, emptied once everything was delivered.
    let slot = tidy.dir.path().join("work/slots/0");
    let emptied = || {
        let empty = |dir: &str| std::fs::read_dir(slot.join(dir)).is_ok_and(|mut entries| entries.next().is_none());
        // The files stay, emptied, for the next attempt in the slot (their inodes are reused).
        let emptied_file = |file: &str| std::fs::metadata(slot.join(file)).is_ok_and(|meta| meta.len() == 0);
        empty("work") && empty("output") && emptied_file("job.log") && emptied_file("config.yaml")
    };
    wait_until("the attempt's files are emptied", LONG, || async { emptied().then_some(()) }).await;
    assert!(!tidy.dir.path().join("work/scratch").exists(), "nothing was kept");
    drop(tidy);
    let keeper = WorkerProcess::start(&server.url, "keeper", &["--keep-work-dirs"]);
    server.submit("name: kept\ncommand: 'echo data > \"$APP_OUTPUT_DIR/out.txt\"'\n").await;
    finished(&server, "kept").await;
    assert!(keeper.dir.path().join("work/kept/0/attempt-1/output/out.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_w_and_b_job_finds_its_parameters_where_wandb_init_reads_them() {
    let server = ServerProcess::start();
    let _worker = WorkerProcess::start(&server.url, "agent", &[]);
    // The docs' "omit ${args}" pattern: the script reads wandb.config, not its arguments.
    let sweep =
        "name: config-readers\nmethod: grid\nprogram: train.py\ncommand: [sh, -c, 'cat \"$WANDB_SWEEP_PARAM_PATH\"']\n\
                 parameters:\n  lr: {values: [0.001]}\n  layers: {value: 3}\n";
    server.submit(sweep).await;
    let job = finished(&server, "config-readers").await.remove(0);
    assert_eq!(job.status, JobStatus::Succeeded, "{job:#?}");
    let log = server.client().log(job.id, &shared::api::LogQuery::default()).await.unwrap().text;
    assert!(log.starts_with("wandb_version: 1"), "{log}");
    assert!(log.contains("lr:\n  value: 0.001") && log.contains("layers:\n  value: 3"), "{log}");
    // A native sweep's job gets no W&B file.
    server.submit("name: native\ncommand: 'echo [$WANDB_SWEEP_PARAM_PATH]'\n").await;
    let job = finished(&server, "native").await.remove(0);
    let log = server.client().log(job.id, &shared::api::LogQuery::default()).await.unwrap().text;
    assert_eq!(log, "[]\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_jobs_start_from_a_reserve_that_a_long_job_hands_back_to_idle_workers() {
    let server = ServerProcess::start();
    let _a = WorkerProcess::start(&server.url, "box-a", &["--max-jobs", "1"]);
    // Short jobs, but the fourth (index 3) runs long.
    let yaml = "name: reserve\ncommand: 'test {i} -ne 3 || sleep 8; echo {i} > \"$APP_OUTPUT_DIR/i\"'\n\
                grid:\n  i: [0, 1, 2, 3, 4, 5, 6]\n";
    server.submit(yaml).await;
    let long = wait_until("the long job runs", LONG, || async {
        server.jobs_of("reserve").await.into_iter().find(|job| job.index == 3 && job.status == JobStatus::Running)
    })
    .await;
    // box-a (one slot) claimed the next job with the long one's predecessor's finish; with its
    // slot taken for 8 s, that job goes back to the queue after a second, for box-b.
    let _b = WorkerProcess::start(&server.url, "box-b", &["--max-jobs", "1"]);
    let jobs = finished(&server, "reserve").await;
    let by_index: HashMap<u64, &Job> = jobs.iter().map(|job| (job.index, job)).collect();
    for job in &jobs {
        assert_eq!(job.status, JobStatus::Succeeded, "{job:#?}");
        assert_eq!(job.crash_count, 0, "{job:#?}");
        let versions = server.client().results(job.id).await.unwrap();
        assert_eq!(versions.len(), 1, "job {} recorded once", job.index);
        assert_eq!(result_file(&server, job.id, "i").await.trim(), job.index.to_string());
    }
    for index in 1..=3 {
        let job = by_index[&index];
        assert_eq!((job.attempt, job.worker.as_deref()), (1, Some("box-a")), "started from box-a's reserve: {job:#?}");
    }
    let handed_back = by_index[&4];
    assert_eq!((handed_back.attempt, handed_back.worker.as_deref()), (2, Some("box-b")), "{handed_back:#?}");
    let long_end = by_index[&3].finished_at.unwrap();
    assert!(handed_back.finished_at.unwrap() < long_end, "the reserved job did not wait for the long one");
    assert!(long_end - long.started_at.unwrap() >= 8_000);
}
