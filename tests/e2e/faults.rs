//! Fault tests: the real `app` binary as server and workers on loopback, hit by what goes wrong
//! in production: the server killed with SIGKILL mid-sweep, a worker frozen past its lease, a
//! restart in the middle of a long-poll claim or of an upload, a full disk. Each one checks that
//! every job ends once, with exactly one result version whose files match their manifest.

use shared::api::{
    AttemptRecord, ClaimRequest, Job, JobQuery, RegisterRequest, ReportRequest, ResultUpload, ResultVersion,
};
use shared::job::{JobStatus, Outcome};
use shared::placement::{Capacity, GpuSlot};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use testkit::{alive, signal, wait_exit, wait_until, wait_until_or, ServerProcess, WorkerProcess};

/// Generous: these run in parallel with each other on small machines.
const LONG: Duration = Duration::from_secs(90);

/// Waits until every job of the sweep has finished; the server may be briefly unreachable.
async fn finished(server: &ServerProcess, sweep: &str) -> Vec<Job> {
    let query = JobQuery { sweep: Some(sweep.into()), limit: Some(1000), ..JobQuery::default() };
    wait_until(&format!("every job of {sweep} finished"), LONG, || async {
        let jobs = server.client().jobs(&query).await.ok()?.jobs;
        jobs.iter().all(|job| job.status.is_terminal()).then_some(jobs)
    })
    .await
}

async fn job_in(server: &ServerProcess, sweep: &str, status: JobStatus) -> Job {
    wait_until(&format!("a job of {sweep} is {status:?}"), LONG, || async {
        server.jobs_of(sweep).await.into_iter().find(|job| job.status == status)
    })
    .await
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Waits until every worker logged that a heartbeat failed (they beat every 0.5 s); on a
/// timeout, the panic shows the end of each silent worker's log, which says where it was.
async fn noticed_the_server_is_gone(workers: &[&WorkerProcess]) {
    let silent = || workers.iter().filter(|worker| !worker.log().contains("heartbeat failed"));
    let tails = || {
        let tail = |worker: &&WorkerProcess| {
            let log = worker.log();
            let lines: Vec<&str> = log.lines().collect();
            let last = lines[lines.len().saturating_sub(30)..].join("\n");
            format!("--- {} (pid {}):\n{last}", worker.name, worker.child.id())
        };
        format!("with no failed heartbeat logged by\n{}", silent().map(tail).collect::<Vec<_>>().join("\n"))
    };
    wait_until_or(LONG, || async { silent().next().is_none().then_some(()) }, tails).await;
}

/// SIGKILL, then waits for the process to be gone.
fn kill_server(server: &mut ServerProcess) {
    signal(&server.child, "KILL");
    wait_exit(&mut server.child, Duration::from_secs(20));
}

/// The job's only result version, after checking that it is the one of the job's last attempt
/// and that every file downloads with the size and SHA-256 of its manifest. With `data_dir`,
/// also that the version's directory on the server holds those files and nothing else but
/// the server's own `.app/` record.
async fn only_version(server: &ServerProcess, job: &Job, data_dir: Option<&Path>) -> ResultVersion {
    let client = server.client();
    let mut versions = client.results(job.id).await.unwrap();
    assert_eq!(versions.len(), 1, "job {} has {} result versions: {versions:#?}", job.id, versions.len());
    let version = versions.remove(0);
    assert_eq!(version.attempt, job.attempt, "job {}: the version is not of its last attempt", job.id);
    for file in &version.files {
        let destination = tempfile::NamedTempFile::new().unwrap();
        client.download_file(job.id, version.attempt, &file.path, destination.path()).await.unwrap();
        let bytes = std::fs::read(destination.path()).unwrap();
        assert_eq!((bytes.len() as u64, sha256_hex(&bytes)), (file.size, file.sha256.clone()), "{}", file.path);
    }
    // A version without files is its record alone: it has no directory.
    if let Some(data_dir) = data_dir.filter(|_| !version.files.is_empty()) {
        let root = data_dir.join(&version.path);
        let mut on_disk: Vec<String> = walkdir(&root)
            .into_iter()
            .map(|path| path.strip_prefix(&root).unwrap().to_string_lossy().into_owned())
            .filter(|path| !path.starts_with(".app/"))
            .collect();
        on_disk.sort();
        let mut listed: Vec<String> = version.files.iter().map(|file| file.path.clone()).collect();
        listed.sort();
        assert_eq!(on_disk, listed, "the version's directory holds exactly its manifest");
    }
    version
}

/// Every file under `root`, recursively.
fn walkdir(root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|error| panic!("reading {}: {error}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files
}

/// The uploads in flight on the server: `.part` files in its staging area.
fn incoming_parts(data_dir: &Path) -> Vec<(PathBuf, u64)> {
    let Ok(entries) = std::fs::read_dir(data_dir.join("results/.staging/.incoming")) else { return Vec::new() };
    entries
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            let size = std::fs::metadata(&path).ok()?.len();
            path.extension().is_some_and(|extension| extension == "part").then_some((path, size))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_mid_sweep_loses_and_duplicates_nothing_once_restarted() {
    const JOBS: usize = 200;
    let mut server = ServerProcess::start();
    let workers: Vec<WorkerProcess> =
        (0..4).map(|n| WorkerProcess::start(&server.url, &format!("box-{n}"), &["--max-jobs", "3"])).collect();
    let command = r#"sleep 0.1; echo "{i}" > "$APP_OUTPUT_DIR/index.txt""#;
    let indices: Vec<String> = (0..JOBS).map(|i| i.to_string()).collect();
    server.submit(&format!("name: crash\ncommand: '{command}'\ngrid:\n  i: [{}]\n", indices.join(", "))).await;
    let query = JobQuery {
        sweep: Some("crash".into()),
        status: Some(JobStatus::Succeeded),
        limit: Some(1),
        ..JobQuery::default()
    };
    wait_until("a quarter of the sweep succeeded", LONG, || async {
        (server.client().jobs(&query).await.unwrap().total >= JOBS as u64 / 4).then_some(())
    })
    .await;
    // A worker slow to start on a loaded machine could still be registering: it would retry
    // its registration, never a heartbeat, and the wait below would wait for ever.
    wait_until("every worker registered", LONG, || async {
        (server.client().workers().await.ok()?.len() == workers.len()).then_some(())
    })
    .await;
    let running = server.jobs_of("crash").await.iter().filter(|job| job.status == JobStatus::Running).count();
    kill_server(&mut server);
    // Down until every worker has noticed (heartbeats every 0.5 s), so that all of them go
    // through their retry paths.
    noticed_the_server_is_gone(&workers.iter().collect::<Vec<_>>()).await;
    server.restart();
    let jobs = finished(&server, "crash").await;
    assert_eq!(jobs.len(), JOBS);
    let client = server.client();
    let mut retried = 0;
    for job in &jobs {
        assert_eq!(job.status, JobStatus::Succeeded, "{job:#?}");
        retried += usize::from(job.attempt > 1);
        let version = only_version(&server, job, Some(&server.data_dir())).await;
        assert_eq!(version.params["i"], job.params["i"]);
        let destination = tempfile::NamedTempFile::new().unwrap();
        client.download_file(job.id, version.attempt, "index.txt", destination.path()).await.unwrap();
        assert_eq!(std::fs::read_to_string(destination.path()).unwrap().trim(), job.params["i"].to_string());
        let events = client.job_events(job.id).await.unwrap();
        let successes: Vec<_> = events
            .iter()
            .filter(|event| event.from == Some(JobStatus::Running) && event.to == JobStatus::Succeeded)
            .collect();
        assert_eq!(successes.len(), 1, "job {} succeeded {} times: {events:#?}", job.id, successes.len());
        assert_eq!(successes[0].attempt, job.attempt);
    }
    // Not an assertion on timing, only what the run exercised.
    eprintln!("{running} jobs were running at the kill; {retried} jobs needed a second attempt");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_frozen_past_its_lease_loses_its_job_and_its_late_report_changes_nothing() {
    // A lease of 3 s: the frozen worker's job goes back to the queue 3 s after its last beat.
    let server = ServerProcess::start();
    let frozen = WorkerProcess::start(&server.url, "frozen", &[]);
    let command = r#"sleep 1; echo "$APP_ATTEMPT" > "$APP_OUTPUT_DIR/who.txt""#;
    server.submit(&format!("name: stale\ncommand: '{command}'\n")).await;
    let job = job_in(&server, "stale", JobStatus::Running).await;
    assert_eq!((job.worker.as_deref(), job.attempt), (Some("frozen"), 1));
    let frozen_id = job.worker_id.unwrap();
    frozen.signal("STOP");
    // The job's own process keeps running (its own process group) and ends while its worker
    // is frozen; the lease runs out and another worker reruns it.
    let _rescuer = WorkerProcess::start(&server.url, "rescuer", &[]);
    let job = wait_until("the job succeeded on the rescuer", LONG, || async {
        let job = server.client().job(job.id).await.unwrap();
        (job.status == JobStatus::Succeeded).then_some(job)
    })
    .await;
    assert_eq!((job.worker.as_deref(), job.attempt), (Some("rescuer"), 2));
    let before = only_version(&server, &job, Some(&server.data_dir())).await;
    assert_eq!(before.record.worker, "rescuer");
    frozen.signal("CONT");
    // The frozen worker wakes up with a finished attempt 1. Whichever comes first, its
    // heartbeat or a delivery, the server says the attempt is no longer the worker's, and the
    // worker drops it.
    wait_until("the woken worker dropped its stale attempt", LONG, || async {
        let log = frozen.log();
        ["no longer ours", "no longer holds this attempt", "stopping an attempt at the server's word"]
            .iter()
            .any(|said| log.contains(said))
            .then_some(())
    })
    .await;
    // Its own late deliveries were 409s it dropped (its log above). Sent by anyone else (who
    // lacks its session), the same report, upload and seal are refused outright: each a 401
    // that changes nothing.
    let client = server.client();
    let report = ReportRequest { worker_id: frozen_id, attempt: 1, outcome: Outcome::Exited { code: 0 } };
    let refused = client.report(job.id, &report).await.unwrap_err();
    assert_eq!(refused.status(), Some(401), "{refused}");
    let late = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(late.path(), "1 on the frozen box").unwrap();
    let file = tokio::fs::File::open(late.path()).await.unwrap();
    let refused = client.upload_file(job.id, 1, "who.txt", frozen_id, file).await.unwrap_err();
    assert_eq!(refused.status(), Some(401), "{refused}");
    let upload = ResultUpload { worker_id: frozen_id, manifest: Vec::new(), record: before.record.clone() };
    let refused = client.seal_result(job.id, 1, &upload).await.unwrap_err();
    assert_eq!(refused.status(), Some(401), "{refused}");
    let after = client.job(job.id).await.unwrap();
    assert_eq!((after.status, after.attempt, after.worker.as_deref()), (JobStatus::Succeeded, 2, Some("rescuer")));
    let version = only_version(&server, &after, Some(&server.data_dir())).await;
    assert_eq!((version.attempt, version.record.worker.as_str()), (2, "rescuer"));
    assert_eq!(version.files, before.files, "the stored files did not change");
    let events = client.job_events(job.id).await.unwrap();
    let ends: Vec<(Option<JobStatus>, JobStatus, u32)> = events
        .iter()
        .filter(|event| event.from == Some(JobStatus::Running))
        .map(|e| (e.from, e.to, e.attempt))
        .collect();
    assert_eq!(
        ends,
        [(Some(JobStatus::Running), JobStatus::Queued, 1), (Some(JobStatus::Running), JobStatus::Succeeded, 2)],
        "attempt 1 ended by its lease, attempt 2 by its success: {events:#?}"
    );
    assert!(alive(frozen.child.id()), "the woken worker carries on");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_during_a_long_poll_claim_leaves_the_worker_claiming_from_the_new_one() {
    let mut server = ServerProcess::start();
    let worker = WorkerProcess::start(&server.url, "poller", &[]);
    // An idle worker parks a claim (a long poll) right after registering; two heartbeats
    // later it is surely waiting on the server.
    let first_seen = wait_until("the worker registered", LONG, || async {
        server.client().workers().await.ok()?.into_iter().find(|worker| worker.name == "poller").map(|w| w.last_seen_at)
    })
    .await;
    wait_until("the worker heartbeated twice", LONG, || async {
        let workers = server.client().workers().await.ok()?;
        workers.iter().any(|worker| worker.name == "poller" && worker.last_seen_at > first_seen + 500).then_some(())
    })
    .await;
    kill_server(&mut server);
    noticed_the_server_is_gone(&[&worker]).await;
    server.restart();
    server.submit("name: after-poll\ncommand: 'echo claimed > \"$APP_OUTPUT_DIR/claimed.txt\"'\n").await;
    let job = finished(&server, "after-poll").await.remove(0);
    assert_eq!((job.status, job.attempt, job.worker.as_deref()), (JobStatus::Succeeded, 1, Some("poller")));
    let version = only_version(&server, &job, Some(&server.data_dir())).await;
    assert_eq!(version.files.len(), 1);
    let workers = server.client().workers().await.unwrap();
    assert_eq!(workers.len(), 1, "the worker came back as itself: {workers:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_directory_left_unrecorded_by_a_crash_does_not_block_the_next_seal_and_is_kept_aside() {
    // The worker here is this test, through the typed client: a long lease, no heartbeats.
    let server = ServerProcess::start_with("lease_secs = 300\n");
    let client = server.client();
    server.submit("name: leftover\ncommand: 'true'\n").await;
    let capacity = Capacity { job_slots: 1, gpus: Vec::new(), ..Capacity::default() };
    let register = RegisterRequest {
        name: "by-hand".into(),
        protocol: shared::PROTOCOL_VERSION,
        key: None,
        capacity: capacity.clone(),
        holding: Vec::new(),
    };
    let worker_id = client.register(&register).await.unwrap().worker_id;
    let job = client.claim(worker_id, &ClaimRequest { capacity, wait_ms: 0, reserve: 0 }).await.unwrap().jobs.remove(0);
    // What a server killed between renaming a staged version into place and recording it
    // leaves behind: a complete version directory that the database does not know.
    let leftover = server.data_dir().join("results/leftover/0/v1");
    std::fs::create_dir_all(leftover.join(".app")).unwrap();
    std::fs::write(leftover.join("out.txt"), "sent before the crash").unwrap();
    std::fs::write(leftover.join(".app/manifest.json"), "[]").unwrap();
    // The worker, its answer lost, sends everything again.
    let source = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(source.path(), "sent again").unwrap();
    let file = tokio::fs::File::open(source.path()).await.unwrap();
    let entry = client.upload_file(job.id, job.attempt, "out.txt", worker_id, file).await.unwrap();
    let upload = ResultUpload { worker_id, manifest: vec![entry], record: AttemptRecord::default() };
    let sealed = client.seal_result(job.id, job.attempt, &upload).await;
    assert!(sealed.is_ok(), "the seal is not blocked by the unrecorded directory: {sealed:?}");
    let report = ReportRequest { worker_id, attempt: job.attempt, outcome: Outcome::Exited { code: 0 } };
    client.report(job.id, &report).await.unwrap();
    let job = client.job(job.id).await.unwrap();
    assert_eq!(job.status, JobStatus::Succeeded);
    let version = only_version(&server, &job, Some(&server.data_dir())).await;
    let destination = tempfile::NamedTempFile::new().unwrap();
    client.download_file(job.id, version.attempt, "out.txt", destination.path()).await.unwrap();
    assert_eq!(std::fs::read_to_string(destination.path()).unwrap(), "sent again");
    // The unrecorded directory was set aside, not deleted: it may be another run's results that
    // a database restored from an older backup does not know.
    let aside: Vec<_> = std::fs::read_dir(server.data_dir().join("results/.unrecorded"))
        .expect("set aside under results/.unrecorded")
        .map(|entry| entry.unwrap().path())
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert!(aside[0].file_name().unwrap().to_string_lossy().ends_with("-leftover_0_v1"), "{aside:?}");
    assert_eq!(std::fs::read_to_string(aside[0].join("out.txt")).unwrap(), "sent before the crash");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bodies_from_workers_get_a_4xx_and_the_queue_keeps_working() {
    let server = ServerProcess::start();
    let client = server.client();
    let gpu =
        |index| GpuSlot { index, memory_total: 1 << 34, memory_free: 1 << 34, exclusive_held: false, shared_jobs: 0 };
    let twice = Capacity { job_slots: 2, gpus: vec![gpu(0), gpu(0)], ..Capacity::default() };
    let register = |capacity| RegisterRequest {
        name: "twice".into(),
        protocol: shared::PROTOCOL_VERSION,
        key: None,
        capacity,
        holding: Vec::new(),
    };
    let refused = client.register(&register(twice.clone())).await.unwrap_err();
    assert_eq!(refused.status(), Some(400), "{refused}");
    assert!(refused.to_string().contains("GPU 0 is listed twice"), "{refused}");
    let worker_id = client
        .register(&register(Capacity { job_slots: 2, gpus: vec![gpu(0), gpu(1)], ..Capacity::default() }))
        .await
        .unwrap()
        .worker_id;
    let refused = client.claim(worker_id, &ClaimRequest { capacity: twice, wait_ms: 0, reserve: 0 }).await.unwrap_err();
    assert_eq!(refused.status(), Some(400), "{refused}");
    // Garbage where JSON is expected: refused, never a server error.
    let http = reqwest::Client::new();
    let garbage: [&[u8]; 5] = [b"", b"{", b"null", b"{\"capacity\": {\"job_slots\": -1}}", &[0xff, 0xfe, 0x00]];
    for path in [
        "/api/workers".to_string(),
        format!("/api/workers/{worker_id}/claim"),
        format!("/api/workers/{worker_id}/heartbeat"),
        "/api/jobs/1/report".to_string(),
    ] {
        for body in garbage {
            let response = http
                .post(format!("{}{path}", server.url))
                .header("content-type", "application/json")
                .body(body.to_vec())
                .send()
                .await
                .unwrap();
            assert!(response.status().is_client_error(), "POST {path} {body:?}: {}", response.status());
        }
    }
    // The queue is unharmed: a real worker runs a job to its result.
    let _worker = WorkerProcess::start(&server.url, "sane", &[]);
    server.submit("name: after-garbage\ncommand: 'echo ok > \"$APP_OUTPUT_DIR/ok.txt\"'\n").await;
    let job = finished(&server, "after-garbage").await.remove(0);
    assert_eq!(job.status, JobStatus::Succeeded, "{job:#?}");
    only_version(&server, &job, Some(&server.data_dir())).await;
}

/// Size of each of the two large files of the upload tests.
const BIG: u64 = 64 << 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_cut_by_a_server_kill_is_sent_again_in_full_and_sealed_once() {
    let mut server = ServerProcess::start();
    let _worker = WorkerProcess::start(&server.url, "uploader", &[]);
    let mib = BIG >> 20;
    let command = format!(
        "head -c {mib}M /dev/urandom > \"$APP_OUTPUT_DIR/a.bin\"; head -c {mib}M /dev/urandom > \"$APP_OUTPUT_DIR/b.bin\"; echo small > \"$APP_OUTPUT_DIR/c.txt\""
    );
    server.submit(&format!("name: cut\ncommand: '{command}'\n")).await;
    let job = server.jobs_of("cut").await.remove(0);
    // Catch a file half-way through its upload, then freeze the server there and kill it.
    let data_dir = server.data_dir();
    let caught = tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + LONG;
        loop {
            if let Some(part) = incoming_parts(&data_dir).into_iter().find(|(_, size)| *size > 0 && *size < BIG) {
                return part;
            }
            assert!(Instant::now() < deadline, "no upload was ever seen in flight");
            std::thread::sleep(Duration::from_millis(2));
        }
    });
    let (part, _) = caught.await.unwrap();
    signal(&server.child, "STOP");
    let size = std::fs::metadata(&part).map(|meta| meta.len()).unwrap_or(0);
    assert!(size < BIG, "the upload was cut part-way ({size} of {BIG} bytes)");
    kill_server(&mut server);
    assert!(!server.data_dir().join("results/cut/0/v1").exists(), "nothing sealed before the kill");
    server.restart();
    let job = wait_until("the job succeeded", LONG, || async {
        let job = server.client().job(job.id).await.ok()?;
        job.status.is_terminal().then_some(job)
    })
    .await;
    assert_eq!((job.status, job.attempt), (JobStatus::Succeeded, 1), "{job:#?}");
    let version = only_version(&server, &job, Some(&server.data_dir())).await;
    let sizes: Vec<(&str, u64)> = version.files.iter().map(|file| (file.path.as_str(), file.size)).collect();
    assert_eq!(sizes, [("a.bin", BIG), ("b.bin", BIG), ("c.txt", 6)]);
    assert!(incoming_parts(&server.data_dir()).is_empty(), "no partial upload is left behind");
    assert!(!server.data_dir().join(format!("results/.staging/{}-1", job.id)).exists(), "staging is gone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_the_upload_keeps_serving_and_takes_it_once_space_is_freed() {
    // 48 MiB, of which a filler takes 24: a 32 MiB output cannot fit until the filler goes.
    let server = ServerProcess::on_small_disk(48);
    let data = server.outside(&server.data_dir());
    let filler = data.join("filler");
    std::fs::write(&filler, vec![0u8; 24 << 20]).unwrap();
    let worker = WorkerProcess::start(&server.url, "filler-up", &["--max-jobs", "2"]);
    server.submit("name: huge\ncommand: 'head -c 32M /dev/urandom > \"$APP_OUTPUT_DIR/huge.bin\"'\n").await;
    wait_until("the worker was told the server's disk is full", LONG, || async {
        worker.log().contains("disk is full").then_some(())
    })
    .await;
    let log = worker.log();
    assert!(log.contains("No space left on device") || log.contains("no space"), "{log}");
    // The refused file takes none of the space left while its worker retries (it is refused by
    // its declared length before a byte is written), so the other jobs' small writes fit.
    for _ in 0..20 {
        let stat = std::process::Command::new("stat").args(["-f", "-c", "%a %S"]).arg(&data).output().unwrap();
        let numbers: Vec<u64> =
            String::from_utf8_lossy(&stat.stdout).split_whitespace().map(|word| word.parse().unwrap()).collect();
        let free = numbers[0] * numbers[1];
        assert!(free > 16 << 20, "a refused upload is filling the disk: {free} bytes free");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The server keeps serving: health, and a small job from submission to result.
    let client = server.client();
    assert_eq!(client.health().await.unwrap().status, "ok");
    server.submit("name: tiny\ncommand: 'echo fits > \"$APP_OUTPUT_DIR/tiny.txt\"'\n").await;
    let tiny = finished(&server, "tiny").await.remove(0);
    assert_eq!(tiny.status, JobStatus::Succeeded, "{tiny:#?}");
    only_version(&server, &tiny, Some(&data)).await;
    // Nothing of the big one is recorded: no version, neither listed nor on disk.
    let huge = server.jobs_of("huge").await.remove(0);
    assert_eq!(huge.status, JobStatus::Running, "its worker keeps retrying the upload: {huge:#?}");
    assert!(client.results(huge.id).await.unwrap().is_empty());
    assert!(!data.join("results/huge").exists(), "no version directory for the refused upload");
    std::fs::remove_file(&filler).unwrap();
    let huge = wait_until("the big job's upload went through", LONG, || async {
        let job = server.client().job(huge.id).await.ok()?;
        job.status.is_terminal().then_some(job)
    })
    .await;
    assert_eq!((huge.status, huge.attempt), (JobStatus::Succeeded, 1), "{huge:#?}");
    let version = only_version(&server, &huge, Some(&data)).await;
    assert_eq!(version.files.iter().map(|file| file.size).collect::<Vec<_>>(), [32 << 20]);
    assert!(incoming_parts(&data).is_empty(), "no partial upload is left behind");
    assert!(alive(server.child.id()), "the server never went down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn result_versions_set_aside_as_unrecorded_are_removed_after_their_retention() {
    // Upkeep every second (a tenth of the telemetry retention); set-aside versions kept an hour.
    let server = ServerProcess::start_with("telemetry_retention_secs = 10\nunrecorded_retention_secs = 3600\n");
    let aside = server.data_dir().join("results").join(".unrecorded");
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    // Named as the server names them: when they were set aside, then where they were.
    let old = aside.join(format!("{}-sweep_0_v1", now_ms - 2 * 3_600_000));
    let recent = aside.join(format!("{}-sweep_1_v1", now_ms - 60_000));
    for dir in [&old, &recent] {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("result.json"), "{}").unwrap();
    }
    testkit::wait_until_sync("the version set aside two hours ago is removed", LONG, || !old.exists());
    assert!(recent.join("result.json").exists(), "a version set aside a minute ago is kept");
    testkit::wait_until_sync("the removal is logged", LONG, || {
        server.log().contains("removed result versions set aside")
    });
}
