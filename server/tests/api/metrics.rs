//! Metrics batches (fenced, idempotent by offset) and their summaries on jobs; GPU telemetry
//! carried by heartbeats.

use shared::api::{
    GpuSample, HeartbeatRequest, JobAttempt, JobQuery, MetricPoint, MetricSummary, MetricsBatch, ReportRequest,
    WorkerId,
};
use shared::job::{JobStatus, Outcome};
use std::time::Duration;
use testkit::{sweep_of, wait_until, TestApp};

fn point(step: i64, name: &str, value: f64) -> MetricPoint {
    MetricPoint { step: Some(step), name: name.into(), value }
}

fn batch(worker_id: WorkerId, attempt: u32, offset: u64, points: Vec<MetricPoint>) -> MetricsBatch {
    MetricsBatch { worker_id, attempt, offset, points }
}

#[tokio::test]
async fn batches_build_series_and_summaries_and_a_resent_batch_is_ignored() {
    let app = TestApp::spawn().await;
    let (worker, job) = app.start_one("curves").await;
    let client = &app.client;
    let first =
        batch(worker, job.attempt, 40, vec![point(1, "loss", 0.9), point(1, "acc", 0.5), point(2, "loss", 0.4)]);
    assert_eq!(client.send_metrics(job.id, &first).await.unwrap().offset, 40);
    assert_eq!(client.send_metrics(job.id, &first).await.unwrap().offset, 40, "a resent batch is acked");
    // NaN and infinities travel as JSON null; they are dropped, the rest of the batch is kept.
    let second = batch(
        worker,
        job.attempt,
        80,
        vec![point(3, "loss", 0.6), point(3, "loss", f64::NAN), point(3, "acc", f64::INFINITY)],
    );
    assert_eq!(client.send_metrics(job.id, &second).await.unwrap().offset, 80);
    let stale = client.send_metrics(job.id, &batch(worker, job.attempt + 1, 120, vec![])).await.unwrap_err();
    assert_eq!(stale.status(), Some(409), "{stale}");

    let stored = client.job(job.id).await.unwrap();
    assert_eq!(stored.metrics["loss"], MetricSummary { last: 0.6, min: 0.4, max: 0.9, step: Some(3), count: 3 });
    assert_eq!(stored.metrics["acc"].count, 1);
    let listed = client.jobs(&JobQuery::default()).await.unwrap();
    assert_eq!(listed.jobs[0].metrics, stored.metrics);

    let series = client.metrics(job.id).await.unwrap();
    let names: Vec<_> = series.iter().map(|series| series.name.as_str()).collect();
    assert_eq!(names, ["loss", "acc"], "in the order first written");
    assert_eq!(series[0].values, [0.9, 0.4, 0.6]);
    assert_eq!(series[0].steps, [Some(1), Some(2), Some(3)]);
}

#[tokio::test]
async fn job_lists_carry_each_jobs_own_metrics() {
    let app = TestApp::spawn().await;
    app.submit(&sweep_of("many", 3)).await;
    let worker = app.register("w", 3).await;
    let jobs = app.claim(worker, 3).await;
    for (position, job) in jobs.iter().enumerate() {
        let points = vec![point(1, "loss", position as f64)];
        app.client.send_metrics(job.id, &batch(worker, job.attempt, 10, points)).await.unwrap();
    }
    let page = app.client.jobs(&JobQuery::default()).await.unwrap();
    for (position, job) in page.jobs.iter().enumerate() {
        assert_eq!(job.metrics["loss"].last, position as f64, "job {}", job.id);
    }
}

#[tokio::test]
async fn a_new_attempt_starts_with_a_fresh_summary() {
    let app = TestApp::spawn().await;
    app.submit("name: again\ncommand: \"exit 1\"\nretries: 1\n").await;
    let worker = app.register("w", 1).await;
    let first = app.claim(worker, 1).await.pop().unwrap();
    let points = vec![point(1, "loss", 0.1), point(1, "old_only", 1.0)];
    app.client.send_metrics(first.id, &batch(worker, first.attempt, 50, points)).await.unwrap();
    let report = ReportRequest { worker_id: worker, attempt: first.attempt, outcome: Outcome::Exited { code: 1 } };
    assert_eq!(app.client.report(first.id, &report).await.unwrap().status, JobStatus::Queued);
    assert_eq!(app.client.job(first.id).await.unwrap().metrics["loss"].last, 0.1, "kept while it waits");

    let second = app.claim(worker, 1).await.pop().unwrap();
    assert_eq!(second.attempt, 2);
    assert!(app.client.job(second.id).await.unwrap().metrics.is_empty(), "the new attempt has sent nothing yet");
    // Offsets are per attempt: the new attempt's file starts over.
    app.client.send_metrics(second.id, &batch(worker, 2, 20, vec![point(1, "loss", 0.7)])).await.unwrap();
    let job = app.client.job(second.id).await.unwrap();
    assert_eq!(job.metrics.keys().collect::<Vec<_>>(), ["loss"]);
    assert_eq!((job.metrics["loss"].min, job.metrics["loss"].count), (0.7, 1));
    assert_eq!(app.client.metrics(second.id).await.unwrap()[0].values, [0.7]);
}

fn sample(index: u32, used: u64) -> GpuSample {
    GpuSample {
        index,
        uuid: format!("GPU-{index}"),
        name: "NVIDIA H100".into(),
        memory_total: 80 << 30,
        memory_used: used,
        utilization: Some(97),
        temperature: Some(64),
        power_watts: Some(512.5),
        at: 0,
    }
}

#[tokio::test]
async fn heartbeats_store_telemetry_read_back_per_worker() {
    let app = TestApp::spawn().await;
    let (worker, job) = app.start_one("gpus").await;
    let running = vec![JobAttempt { job_id: job.id, attempt: job.attempt }];
    let before = server::db::now_ms();
    for used in [1 << 30, 2 << 30] {
        let request = HeartbeatRequest {
            running: running.clone(),
            gpus: vec![sample(0, used), sample(1, used)],
            saves: Vec::new(),
        };
        app.client.heartbeat(worker, &request).await.unwrap();
    }
    let samples = app.client.telemetry("gpus-w").await.unwrap();
    assert_eq!(samples.len(), 4);
    assert_eq!(samples[0], GpuSample { at: samples[0].at, ..sample(0, 1 << 30) });
    assert_eq!(samples[3].memory_used, 2 << 30);
    assert!(samples.iter().all(|sample| sample.at >= before), "the server stamps each sample");
    assert!(samples.windows(2).all(|pair| pair[0].at <= pair[1].at), "oldest first");
    let other = app.register("idle", 1).await;
    app.client.heartbeat(other, &HeartbeatRequest::default()).await.unwrap();
    assert!(app.client.telemetry("idle").await.unwrap().is_empty());
    assert_eq!(app.client.telemetry("nobody").await.unwrap_err().status(), Some(404));
}

#[tokio::test]
async fn telemetry_past_the_retention_window_is_pruned() {
    if testkit::on_postgres() {
        return; // about the SQLite file itself (PostgreSQL: server/tests/postgres)
    }
    let app = TestApp::spawn_with(|config| config.telemetry_retention = Duration::from_millis(300)).await;
    let worker = app.register("hot", 1).await;
    let request = HeartbeatRequest { running: Vec::new(), gpus: vec![sample(0, 1), sample(1, 1)], saves: Vec::new() };
    app.client.heartbeat(worker, &request).await.unwrap();
    assert_eq!(app.client.telemetry("hot").await.unwrap().len(), 2);
    // Look at the table itself: the rows must be gone, not merely hidden by the read.
    let path = app.config.data_dir.join("queue.db");
    let db = rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    wait_until("the reaper prunes old telemetry", Duration::from_secs(10), || async {
        let rows: i64 = db.query_row("SELECT count(*) FROM gpu_telemetry", [], |row| row.get(0)).unwrap();
        (rows == 0).then_some(())
    })
    .await;
    assert!(app.client.telemetry("hot").await.unwrap().is_empty());
}
