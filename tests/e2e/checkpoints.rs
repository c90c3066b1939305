//! End-to-end tests of checkpoints: a job that counts epochs and keeps its state in
//! `$APP_CHECKPOINT_DIR` loses its worker to `kill -9`; another worker runs the next attempt from
//! the last uploaded checkpoint, and the final metrics show the count continued rather than
//! restarted. A checkpoint over the worker's cap is not uploaded, with a warning in the job's
//! log, and the job keeps running.

use shared::api::{JobId, LogQuery, SubmitQuery};
use shared::job::JobStatus;
use std::path::Path;
use std::time::{Duration, Instant};
use testkit::{wait_until, ServerProcess, WorkerProcess};

const EPOCHS: u64 = 40;
const EPOCH_SECONDS: f64 = 0.2;

/// Counts epochs from the one after its checkpoint's, one metric line each, replacing its
/// checkpoint atomically after every epoch.
const COUNTER: &str = r#"
import json, os, sys, time
epochs, seconds, progress = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
state = os.path.join(os.environ["APP_CHECKPOINT_DIR"], "state.json")
start = json.load(open(state))["epoch"] + 1 if os.path.exists(state) else 1
print("attempt", os.environ["APP_ATTEMPT"], "resumed from", os.environ.get("APP_RESUMED_FROM", "-"), "at epoch", start, flush=True)
for epoch in range(start, epochs + 1):
    time.sleep(seconds)
    with open(os.environ["APP_METRICS_FILE"], "a") as metrics:
        metrics.write(json.dumps({"step": epoch, "epoch": epoch, "at": time.time()}) + "\n")
    with open(state + ".tmp", "w") as out:
        json.dump({"epoch": epoch, "at": time.time()}, out)
    os.replace(state + ".tmp", state)
    with open(progress, "a") as out:
        out.write(f"{epoch}\n")
"#;

fn worker_config(dir: &Path, lines: &str) -> String {
    let path = dir.join("worker.toml");
    std::fs::write(&path, format!("[worker]\n{lines}")).unwrap();
    path.to_string_lossy().into_owned()
}

/// The epoch in the job's stored checkpoint.
async fn stored_epoch(server: &ServerProcess, job: JobId) -> Option<u64> {
    let info = server.client().checkpoint_info(job).await.ok()?;
    let path = server.data_dir().join(format!("checkpoints/{job}/{}.tar.zst", info.sha256));
    let unpacked = tempfile::tempdir().unwrap();
    archive::unpack_verified(std::fs::File::open(path).ok()?, None, unpacked.path(), u64::MAX).ok()?;
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(unpacked.path().join("state.json")).ok()?).ok()?;
    state["epoch"].as_u64()
}

/// The epochs the job's latest attempt reported, in order.
async fn reported_epochs(server: &ServerProcess, job: JobId) -> Vec<u64> {
    let series = server.client().metrics(job).await.unwrap_or_default();
    series
        .into_iter()
        .find(|series| series.name == "epoch")
        .map(|epoch| epoch.values.iter().map(|v| *v as u64).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_whose_worker_is_killed_continues_from_its_last_checkpoint_on_another_worker() {
    let server = ServerProcess::start();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("counter.py");
    std::fs::write(&script, COUNTER).unwrap();
    let config = worker_config(dir.path(), "checkpoint_secs = 0.5\n");
    let mut first = WorkerProcess::start(&server.url, "doomed", &["--config", &config]);
    let progress = dir.path().join("progress");
    let yaml = format!(
        "name: counting\ncommand: python3 {} {EPOCHS} {EPOCH_SECONDS} {}\n",
        script.display(),
        progress.display()
    );
    let client = server.client();
    client.submit(&yaml, &SubmitQuery::default()).await.unwrap();
    let job = wait_until("the job runs", Duration::from_secs(30), || async {
        server.jobs_of("counting").await.into_iter().find(|job| job.status == JobStatus::Running)
    })
    .await;

    // Mid-run, with a checkpoint uploaded: kill -9 the worker (and so its job).
    let uploaded = wait_until("a checkpoint of epoch 8 or later is uploaded", Duration::from_secs(30), || async {
        stored_epoch(&server, job.id).await.filter(|epoch| *epoch >= 8)
    })
    .await;
    first.child.kill().unwrap();
    let _ = first.child.wait();
    let killed_at = Instant::now();
    // The last epoch the killed attempt finished (its metrics may not all have been shipped).
    let reached = std::fs::read_to_string(&progress).unwrap().lines().last().unwrap().parse::<u64>().unwrap();
    let _second = WorkerProcess::start(&server.url, "rescuer", &["--config", &config]);

    let finished = wait_until("the job finished on the second worker", Duration::from_secs(60), || async {
        client.job(job.id).await.ok().filter(|job| job.status.is_terminal())
    })
    .await;
    let log = client.log(job.id, &LogQuery::default()).await.unwrap().text;
    assert_eq!(finished.status, JobStatus::Succeeded, "{log}");
    assert_eq!((finished.attempt, finished.worker.as_deref()), (2, Some("rescuer")));
    let epochs = reported_epochs(&server, job.id).await;
    let start = epochs[0];
    assert!(start > uploaded, "the second attempt starts after the uploaded epoch {uploaded}: {epochs:?}");
    assert_eq!(epochs, (start..=EPOCHS).collect::<Vec<_>>(), "continued to the end, each epoch once");
    assert!(log.contains("[app] resuming from the checkpoint of attempt 1"), "{log}");
    assert!(log.contains(&format!("attempt 2 resumed from 1 at epoch {start}")), "{log}");
    let version = client.results(job.id).await.unwrap().pop().unwrap();
    assert_eq!(version.record.resumed_from, Some(1));
    let lost = reached.saturating_sub(start - 1);
    eprintln!(
        "killed at epoch {reached}, resumed at epoch {start}: {lost} epochs ({:.1} s) of work lost; \
         resumed {:.1} s after the kill (lease 3 s)",
        lost as f64 * EPOCH_SECONDS,
        killed_at.elapsed().as_secs_f64() - (EPOCHS - start + 1) as f64 * EPOCH_SECONDS
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_over_the_cap_is_not_uploaded_and_the_job_keeps_running() {
    let server = ServerProcess::start();
    let dir = tempfile::tempdir().unwrap();
    let config = worker_config(dir.path(), "checkpoint_secs = 0.2\ncheckpoint_max_size = \"4KiB\"\n");
    let _worker = WorkerProcess::start(&server.url, "small", &["--config", &config]);
    let yaml =
        "name: heavy\ncommand: 'head -c 65536 /dev/zero > \"$APP_CHECKPOINT_DIR/weights.bin\"; sleep 1.5; echo done'\n";
    let client = server.client();
    client.submit(yaml, &SubmitQuery::default()).await.unwrap();
    let job = wait_until("the job finished", Duration::from_secs(30), || async {
        server.jobs_of("heavy").await.into_iter().find(|job| job.status.is_terminal())
    })
    .await;
    let log = client.log(job.id, &LogQuery::default()).await.unwrap().text;
    assert_eq!(job.status, JobStatus::Succeeded, "{log}");
    assert!(log.contains("[app] checkpoint not uploaded: $APP_CHECKPOINT_DIR holds 65536 bytes"), "{log}");
    assert!(log.contains("cap of 4096 bytes (checkpoint_max_size); the job keeps running"), "{log}");
    assert_eq!(log.matches("checkpoint not uploaded").count(), 1, "said once: {log}");
    assert!(log.ends_with("done\n"), "{log}");
    assert_eq!(client.checkpoint_info(job.id).await.unwrap_err().status(), Some(404));
}
