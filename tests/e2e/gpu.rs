//! End-to-end tests of the GPU side of the queue with fake GPUs: per-job accounting from
//! scripted readings, the idle flag, capabilities (the trainer) in the claim, why a job waits,
//! the worker's own CUDA_VISIBLE_DEVICES, and the threads CPU jobs get.

use shared::api::{ClaimRequest, Job, RegisterRequest};
use shared::capabilities::Capabilities;
use shared::job::JobStatus;
use shared::placement::Capacity;
use std::time::Duration;
use testkit::{app, wait_until, ServerProcess, WorkerProcess};

const LONG: Duration = Duration::from_secs(60);
const GIB: u64 = 1 << 30;

async fn finished(server: &ServerProcess, sweep: &str) -> Vec<Job> {
    wait_until(&format!("every job of {sweep} finished"), LONG, || async {
        let jobs = server.jobs_of(sweep).await;
        jobs.iter().all(|job| job.status.is_terminal()).then_some(jobs)
    })
    .await
}

/// A worker with fake GPUs whose readings `script` scripts, reading them every 0.1 s.
fn scripted_worker(server: &ServerProcess, name: &str, gpus: &str, script: &std::path::Path) -> WorkerProcess {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("worker.toml");
    std::fs::write(&config, "[worker]\ntelemetry_secs = 0.1\n").unwrap();
    let spec = format!("{gpus}@{}", script.display());
    let config = config.to_string_lossy().to_string();
    WorkerProcess::start_in(dir, &server.url, name, &["--fake-gpus", &spec, "--config", &config])
}

fn app_output(args: &[&str]) -> (bool, String, String) {
    let output = app().args(args).env_remove("COLUMNS").output().unwrap();
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).to_string();
    (output.status.success(), text(&output.stdout), text(&output.stderr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_job_records_its_own_gpu_use_and_a_mostly_idle_gpu_is_flagged() {
    let server = ServerProcess::start();
    let scripts = tempfile::tempdir().unwrap();
    let script = scripts.path().join("readings.txt");
    // GPU 0 is busy, GPU 1 mostly idle, for the whole run.
    std::fs::write(&script, "gpu=0 utilization=90\ngpu=1 utilization=12\n").unwrap();
    let _worker = scripted_worker(&server, "gpu-box", "2x24GiB", &script);
    // Each job says which process holds how much of its GPU, as NVML would list it: the
    // shell's pid is its process group's, which carries the job's variables.
    let command = format!(
        "echo \"gpu=$CUDA_VISIBLE_DEVICES pid=$$ memory={{memory}}\" >> {}; sleep 2; echo done > \"$APP_OUTPUT_DIR/out.txt\"",
        script.display()
    );
    let yaml = format!("name: measured\ncommand: '{command}'\nresources: {{gpus: 1}}\ngrid:\n  memory: [3GiB, 5GiB]\n");
    server.submit(&yaml).await;
    let jobs = finished(&server, "measured").await;
    for job in &jobs {
        assert_eq!(job.status, JobStatus::Succeeded, "{job:#?}");
        let usage = job.gpu_usage.as_ref().unwrap_or_else(|| panic!("job {} has no GPU use: {job:#?}", job.id));
        let memory = if job.params["memory"] == "3GiB" { 3 * GIB } else { 5 * GIB };
        assert_eq!(usage.gpus, job.gpus);
        assert_eq!(usage.memory_peak, Some(memory), "{usage:?}");
        assert!(usage.samples >= 5, "{usage:?}");
        // Held alone for about two seconds.
        assert!(usage.gpu_hours > 1.5 / 3600.0 && usage.gpu_hours < 20.0 / 3600.0, "{usage:?}");
        let idle_note = job.notes.iter().any(|note| note.starts_with("GPU mostly idle: input-bound?"));
        match job.gpus.as_slice() {
            [0] => {
                assert_eq!((usage.utilization_mean, usage.utilization_p95), (Some(90.0), Some(90.0)));
                assert!(usage.idle_gpus.is_empty() && !idle_note, "{job:#?}");
            }
            [1] => {
                assert_eq!((usage.utilization_mean, usage.utilization_p95), (Some(12.0), Some(12.0)));
                assert_eq!(usage.idle_gpus, vec![1]);
                assert!(idle_note, "{:?}", job.notes);
            }
            other => panic!("job {} held GPUs {other:?}", job.id),
        }
        // result.json keeps it with the rest of the attempt's record.
        let result = server.data_dir().join(format!("results/measured/{}/v1/.app/result.json", job.index));
        let result: serde_json::Value = serde_json::from_slice(&std::fs::read(&result).unwrap()).unwrap();
        assert_eq!(result["record"]["gpu_usage"]["memory_peak"], memory);
        // The job page's chart reads the attempt's own timeline.
        let gpu = server.client().job_gpu(job.id, &Default::default()).await.unwrap();
        assert_eq!(gpu.usage.as_ref(), Some(usage));
        assert!(gpu.timeline.len() >= 5 && gpu.timeline.iter().any(|point| point.memory == Some(memory)), "{gpu:?}");
    }
    assert_ne!(jobs[0].gpus, jobs[1].gpus, "two exclusive jobs shared a GPU");
    // The leaderboard shows it, as JSON and CSV.
    let board = server.client().leaderboard("measured", None).await.unwrap();
    assert!(board.summary.rows.iter().all(|row| row.gpu_usage.is_some()));
    let csv = server.client().summary_csv("measured", None).await.unwrap();
    assert!(
        csv.lines().next().unwrap().ends_with("gpu.util_mean,gpu.util_p95,gpu.memory_peak,gpu.hours,gpu.idle"),
        "{csv}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_asking_for_more_gpus_than_any_worker_has_waits_with_the_reason() {
    let server = ServerProcess::start();
    let mut worker = WorkerProcess::start(&server.url, "one-gpu", &["--fake-gpus", "1x24GiB"]);
    let scripts = tempfile::tempdir().unwrap();
    let file = scripts.path().join("two.yaml");
    std::fs::write(&file, "name: two\ncommand: 'true'\nresources: {gpus: 2}\n").unwrap();
    let (ok, stdout, stderr) = app_output(&["submit", file.to_str().unwrap(), "--url", &server.url]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("submitted sweep two"), "{stdout}");
    let reason = "it asks for 2 GPUs; the largest connected worker has 1";
    let job = wait_until("the job says why it waits", LONG, || async {
        let job = server.jobs_of("two").await.pop()?;
        (job.waiting.as_ref()?.reason.as_deref() == Some(reason)).then_some(job)
    })
    .await;
    assert_eq!(job.status, JobStatus::Queued);
    assert_eq!(server.client().job(job.id).await.unwrap().waiting.unwrap().reason.as_deref(), Some(reason));
    assert_eq!(server.client().sweep("two").await.unwrap().unplaceable.as_deref(), Some(reason));
    let (_, status, _) = app_output(&["status", "two", "--url", &server.url]);
    assert!(status.contains(&format!("cannot run: {reason}")), "{status}");
    // The dry run asks the server named by --url the same question.
    let (ok, dry, _) = app_output(&["submit", file.to_str().unwrap(), "--dry-run", "--url", &server.url]);
    assert!(ok);
    assert!(dry.contains(&format!("no worker connected to {} can run these jobs: {reason}", server.url)), "{dry}");
    // `submit --wait` says so rather than waiting silently (it keeps waiting: a worker may come).
    let mut waiting = app()
        .args(["submit", file.to_str().unwrap(), "--wait", "--url", &server.url])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = waiting.stderr.take().unwrap();
    let said = std::thread::spawn(move || {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stderr), &mut line).map(|_| line)
    });
    let line = tokio::time::timeout(LONG, tokio::task::spawn_blocking(move || said.join().unwrap().unwrap()))
        .await
        .expect("submit --wait said nothing about the job that cannot run")
        .unwrap();
    assert!(line.contains(&format!("queued jobs cannot run on any connected worker: {reason}")), "{line}");
    let _ = waiting.kill();
    let _ = waiting.wait();
    // The worker is unharmed and runs what fits.
    assert!(worker.child.try_wait().unwrap().is_none(), "the worker exited: {}", worker.log());
    server.submit("name: one\ncommand: 'true'\nresources: {gpus: 1}\n").await;
    assert_eq!(finished(&server, "one").await[0].status, JobStatus::Succeeded);
    assert_eq!(server.jobs_of("two").await[0].status, JobStatus::Queued);
    let _ = worker.child.kill();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_waiting_for_a_busy_worker_shows_its_place_in_the_queue() {
    let server = ServerProcess::start();
    let _worker = WorkerProcess::start(&server.url, "busy", &["--fake-gpus", "1x24GiB"]);
    server.submit("name: line\ncommand: 'sleep 30'\nresources: {gpus: 1}\ngrid:\n  i: [0, 1, 2]\n").await;
    let jobs = wait_until("one job runs, two wait", LONG, || async {
        let jobs = server.jobs_of("line").await;
        (jobs.iter().filter(|job| job.status == JobStatus::Running).count() == 1).then_some(jobs)
    })
    .await;
    let queued: Vec<&Job> = jobs.iter().filter(|job| job.status == JobStatus::Queued).collect();
    assert_eq!(queued.len(), 2);
    for (ahead, job) in queued.iter().enumerate() {
        let waiting = server.client().job(job.id).await.unwrap().waiting.unwrap();
        assert_eq!(waiting, shared::api::Waiting { position: Some(ahead as u64), reason: None });
    }
    let (_, status, _) = app_output(&["status", "line", "--url", &server.url]);
    assert!(status.contains("next in the queue") && status.contains("1 ahead in the queue"), "{status}");
    server.client().cancel_sweep("line").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn train_jobs_go_only_to_workers_that_have_the_trainer() {
    let server = ServerProcess::start();
    let client = server.client();
    let register = |name: &str, trainer: bool| RegisterRequest {
        name: name.into(),
        protocol: shared::PROTOCOL_VERSION,
        key: None,
        capacity: Capacity {
            job_slots: 2,
            gpus: Vec::new(),
            capabilities: Capabilities { trainer, ..Capabilities::default() },
        },
        holding: Vec::new(),
    };
    let plain = client.register(&register("plain", false)).await.unwrap();
    let plain_client = client.with_session(&plain).unwrap();
    server.submit("name: trained\ntrain: {model: mlp, epochs: 1}\n").await;
    server.submit("name: scripted\ncommand: 'true'\n").await;
    let job = server.jobs_of("trained").await.pop().unwrap();
    assert!(job.resources.trainer);
    let reason = job.waiting.and_then(|waiting| waiting.reason).unwrap_or_default();
    assert!(reason.starts_with("it runs the built-in trainer (app train) and no connected worker has it"), "{reason}");
    // A worker without the trainer gets the command job, never the trainer's.
    let claim = |slots| ClaimRequest {
        capacity: Capacity { job_slots: slots, gpus: Vec::new(), capabilities: Capabilities::default() },
        wait_ms: 0,
        reserve: 0,
    };
    let claimed = plain_client.claim(plain.worker_id, &claim(2)).await.unwrap().jobs;
    assert_eq!(claimed.iter().map(|job| job.sweep.as_str()).collect::<Vec<_>>(), ["scripted"]);
    // One that has it takes it.
    let trainer = client.register(&register("trainer", true)).await.unwrap();
    let trainer_client = client.with_session(&trainer).unwrap();
    let mut request = claim(2);
    request.capacity.capabilities.trainer = true;
    let claimed = trainer_client.claim(trainer.worker_id, &request).await.unwrap().jobs;
    assert_eq!(claimed.iter().map(|job| job.sweep.as_str()).collect::<Vec<_>>(), ["trained"]);
    assert!(claimed[0].resources.trainer);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workers_cuda_visible_devices_picks_its_gpus_and_an_unknown_one_stops_it() {
    let server = ServerProcess::start();
    let uuid = "GPU-fa4e0000-0000-4000-8000-000000000002";
    let _slurm = WorkerProcess::start_with_env_args(
        &server.url,
        "slurm-node",
        &[("CUDA_VISIBLE_DEVICES", &format!("{uuid},0"))],
        &["--fake-gpus", "4x24GiB"],
    );
    let workers = wait_until("the worker registers", LONG, || async {
        let workers = server.client().workers().await.ok()?;
        (!workers.is_empty()).then_some(workers)
    })
    .await;
    let indices: Vec<u32> = workers[0].capacity.gpus.iter().map(|gpu| gpu.index).collect();
    assert_eq!(indices, [0, 2]);
    let mut wrong = WorkerProcess::start_with_env_args(
        &server.url,
        "wrong-node",
        &[("CUDA_VISIBLE_DEVICES", "GPU-0badc0de")],
        &["--fake-gpus", "2x24GiB"],
    );
    let status = wrong.wait_exit(LONG);
    assert!(!status.success());
    let log = wrong.log();
    assert!(log.contains("CUDA_VISIBLE_DEVICES names GPU-0badc0de, which NVML does not see"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_jobs_sharing_a_box_get_their_share_of_the_cores() {
    let yaml =
        "name: threads\ncommand: 'echo \"$OMP_NUM_THREADS\" > \"$APP_OUTPUT_DIR/threads\"'\ngrid:\n  i: [0, 1, 2]\n";
    let cores = std::thread::available_parallelism().map_or(1, usize::from) as u32;
    let share = (cores / 2).max(1).to_string();
    // The worker's own setting wins over the share; one job at a time shares nothing.
    for (env, flags, expected) in [
        (vec![], vec!["--max-jobs", "2"], share.as_str()),
        (vec![("OMP_NUM_THREADS", "3")], vec!["--max-jobs", "2"], "3"),
        (vec![], vec!["--max-jobs", "1"], ""),
    ] {
        let server = ServerProcess::start();
        let _worker = WorkerProcess::start_with_env_args(&server.url, "cpu-box", &env, &flags);
        server.submit(yaml).await;
        for job in finished(&server, "threads").await {
            assert_eq!(job.status, JobStatus::Succeeded);
            let destination = tempfile::NamedTempFile::new().unwrap();
            server.client().download_file(job.id, 1, "threads", destination.path()).await.unwrap();
            let threads = std::fs::read_to_string(destination.path()).unwrap();
            assert_eq!(threads.trim(), expected, "job {} with {env:?} {flags:?}", job.id);
        }
    }
}
