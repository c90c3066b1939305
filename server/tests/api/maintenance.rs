//! Queue maintenance: bulk retries (listed ids, a sweep's failed jobs) and removing a finished
//! sweep with its records and result files, refused while any of its jobs may still run.

use shared::api::{AttemptRecord, ClaimedJob, JobId, JobQuery, ReportRequest, ResultUpload, WorkerId};
use shared::job::{JobStatus, Outcome};
use testkit::{sweep_of, TestApp};

async fn finish(app: &TestApp, worker: WorkerId, job: &ClaimedJob, code: i32) {
    let report = ReportRequest { worker_id: worker, attempt: job.attempt, outcome: Outcome::Exited { code } };
    app.client.report(job.id, &report).await.expect("report");
}

async fn status_of(app: &TestApp, id: JobId) -> JobStatus {
    app.client.job(id).await.expect("job").status
}

/// Claims every job of a fresh `count`-job sweep on one worker and ends them with `codes`.
async fn finished_sweep(app: &TestApp, name: &str, codes: &[i32]) -> (WorkerId, Vec<ClaimedJob>) {
    app.submit(&sweep_of(name, codes.len())).await;
    let worker = app.register(&format!("{name}-w"), codes.len() as u32).await;
    let jobs = app.claim(worker, codes.len() as u32).await;
    assert_eq!(jobs.len(), codes.len());
    for (job, code) in jobs.iter().zip(codes) {
        finish(app, worker, job, *code).await;
    }
    (worker, jobs)
}

#[tokio::test]
async fn a_bulk_retry_queues_the_failed_and_cancelled_jobs_listed_and_skips_the_rest() {
    let app = TestApp::spawn().await;
    let (_, jobs) = finished_sweep(&app, "bulk", &[1, 0, 2]).await;
    let queued = app.submit(&sweep_of("waiting", 1)).await;
    let waiting = app.client.jobs(&JobQuery { sweep: Some(queued.name), ..JobQuery::default() }).await.unwrap();
    let waiting_id = waiting.jobs[0].id;
    app.client.cancel_job(waiting_id).await.unwrap();
    let ids = [jobs[0].id, jobs[1].id, jobs[2].id, waiting_id, JobId::new(999_999)];

    let response = app.client.retry_jobs(&ids).await.unwrap();

    assert_eq!(response.retried, vec![jobs[0].id, jobs[2].id, waiting_id]);
    assert_eq!(response.skipped, vec![jobs[1].id, JobId::new(999_999)], "the succeeded job and the unknown id");
    for id in response.retried {
        assert_eq!(status_of(&app, id).await, JobStatus::Queued);
    }
    assert_eq!(status_of(&app, jobs[1].id).await, JobStatus::Succeeded);
    let history = app.client.job_events(jobs[0].id).await.unwrap();
    assert_eq!(history.last().map(|event| event.reason.as_deref()), Some(Some("retried")));
    // Queued again means claimable again.
    let worker = app.register("again", 4).await;
    assert_eq!(app.claim(worker, 4).await.len(), 3);
}

#[tokio::test]
async fn a_sweep_retry_queues_only_its_failed_jobs() {
    let app = TestApp::spawn().await;
    let (_, jobs) = finished_sweep(&app, "flaky", &[1, 0, 3]).await;
    let (_, other) = finished_sweep(&app, "other", &[1]).await;
    let cancelled = app.submit(&sweep_of("flaky-cancel", 1)).await;
    app.client.cancel_sweep(&cancelled.name).await.unwrap();

    let response = app.client.retry_sweep("flaky").await.unwrap();

    assert_eq!(response.retried, vec![jobs[0].id, jobs[2].id]);
    assert_eq!(status_of(&app, jobs[1].id).await, JobStatus::Succeeded);
    assert_eq!(status_of(&app, other[0].id).await, JobStatus::Failed, "another sweep is untouched");
    assert!(app.client.retry_sweep("flaky").await.unwrap().retried.is_empty(), "nothing failed any more");
    assert_eq!(app.client.retry_sweep("nope").await.unwrap_err().status(), Some(404));
}

#[tokio::test]
async fn too_many_ids_in_one_retry_are_refused() {
    let app = TestApp::spawn().await;
    let ids: Vec<JobId> = (1..=1001).map(JobId::new).collect();
    let error = app.client.retry_jobs(&ids).await.unwrap_err();
    assert_eq!(error.status(), Some(400), "{error}");
    assert!(error.to_string().contains("at most 1000"), "{error}");
}

#[tokio::test]
async fn a_sweep_with_queued_or_running_jobs_is_not_removed() {
    let app = TestApp::spawn().await;
    app.submit(&sweep_of("busy", 2)).await;
    let worker = app.register("busy-w", 1).await;
    let running = app.claim(worker, 1).await.pop().unwrap();

    let error = app.client.delete_sweep("busy").await.unwrap_err();
    assert_eq!(error.status(), Some(409), "{error}");
    assert!(error.to_string().contains("cancel it first"), "{error}");

    // Still refused with one job finished and one queued; nothing was removed either time.
    finish(&app, worker, &running, 0).await;
    assert_eq!(app.client.delete_sweep("busy").await.unwrap_err().status(), Some(409));
    assert_eq!(app.client.sweep("busy").await.unwrap().info.counts.total(), 2);
    assert_eq!(app.client.job_events(running.id).await.unwrap().len(), 2);
    assert_eq!(app.client.delete_sweep("nope").await.unwrap_err().status(), Some(404));
}

#[tokio::test]
async fn removing_a_finished_sweep_removes_its_jobs_records_and_result_files_only() {
    let app = TestApp::spawn().await;
    app.submit(&sweep_of("done", 2)).await;
    app.submit(&sweep_of("kept", 1)).await;
    let worker = app.register("w", 3).await;
    let jobs = app.claim(worker, 3).await;
    let (done, kept) = (&jobs[..2], &jobs[2]);
    assert_eq!((done[0].sweep.as_str(), kept.sweep.as_str()), ("done", "kept"));
    // Result versions are sealed while the attempt runs, as the worker does before reporting.
    seal_a_file(&app, worker, &done[0]).await;
    seal_a_file(&app, worker, kept).await;
    finish(&app, worker, &done[0], 0).await;
    finish(&app, worker, &done[1], 1).await;
    finish(&app, worker, kept, 0).await;
    let done_dir = app.config.data_dir.join("results").join("done");
    let kept_dir = app.config.data_dir.join("results").join("kept");
    assert!(done_dir.join("0").is_dir() && kept_dir.join("0").is_dir());

    let removed = app.client.delete_sweep("done").await.unwrap();

    assert_eq!((removed.name.as_str(), removed.jobs, removed.result_versions), ("done", 2, 1));
    assert_eq!(app.client.sweep("done").await.unwrap_err().status(), Some(404));
    for job in done {
        assert_eq!(app.client.job(job.id).await.unwrap_err().status(), Some(404));
    }
    assert!(!done_dir.exists(), "the result files went with the sweep");
    let results = std::fs::read_dir(app.config.data_dir.join("results")).unwrap();
    let names: Vec<String> = results.map(|entry| entry.unwrap().file_name().to_string_lossy().to_string()).collect();
    assert!(!names.iter().any(|name| name.starts_with(".removed")), "{names:?}");
    // The other sweep is whole.
    assert!(kept_dir.join("0").is_dir());
    assert_eq!(app.client.results(kept.id).await.unwrap().len(), 1);
    assert_eq!(app.client.job_events(kept.id).await.unwrap().len(), 2);
    // The name is free again, and a new sweep of that name starts empty.
    assert_eq!(app.submit(&sweep_of("done", 1)).await.name, "done");
    let fresh = app.client.jobs(&JobQuery { sweep: Some("done".into()), ..JobQuery::default() }).await.unwrap();
    assert_eq!(fresh.total, 1);
    assert!(app.client.results(fresh.jobs[0].id).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_removed_sweep_survives_a_restart_removed() {
    let app = TestApp::spawn().await;
    finished_sweep(&app, "gone", &[0, 0]).await;
    finished_sweep(&app, "stays", &[1]).await;
    app.client.delete_sweep("gone").await.unwrap();
    let app = app.restart().await;
    let names: Vec<String> = app.client.sweeps().await.unwrap().into_iter().map(|sweep| sweep.name).collect();
    assert_eq!(names, ["stays"]);
    let overview = app.client.overview().await.unwrap();
    assert_eq!((overview.counts.total(), overview.sweeps), (1, 1));
}

/// Uploads and seals one small file as the attempt's result version.
async fn seal_a_file(app: &TestApp, worker: WorkerId, job: &ClaimedJob) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.pt");
    std::fs::write(&path, b"weights").unwrap();
    let file = tokio::fs::File::open(&path).await.unwrap();
    let entry = app.client.upload_file(job.id, job.attempt, "model.pt", worker, file).await.unwrap();
    let record = AttemptRecord { exit_code: Some(0), outcome: "exited with code 0".into(), ..AttemptRecord::default() };
    let upload = ResultUpload { worker_id: worker, manifest: vec![entry], record };
    app.client.seal_result(job.id, job.attempt, &upload).await.unwrap();
}

/// The refusal does not rest on the route's early count: the deletes themselves leave a sweep
/// with a queued or running job whole, and say so.
#[tokio::test]
async fn the_deletes_are_guarded_by_the_jobs_statuses() {
    if testkit::on_postgres() {
        return; // it opens the SQLite file itself
    }
    let mut app = TestApp::spawn().await;
    app.submit(&sweep_of("guarded", 3)).await;
    let worker = app.register("guarded-w", 2).await;
    let jobs = app.claim(worker, 2).await;
    finish(&app, worker, &jobs[0], 0).await;
    let sweep_id = app.client.sweep("guarded").await.unwrap().info.id;
    app.stop().await;

    let db = server::db::Db::open(&app.config.data_dir).await.unwrap();
    let mut conn = db.sqlite_connection().unwrap().unwrap();
    conn.execute_batch("BEGIN").unwrap();
    let removal = server::db::maintenance::delete_sweep(&mut conn, sweep_id).await.unwrap();
    assert!(removal.is_none(), "a running and a queued job keep the sweep");
    conn.execute_batch("ROLLBACK").unwrap();
    let readers = db.reader.sqlite().unwrap();
    let remaining: i64 = server::db::sql::query_scalar("SELECT count(*) FROM jobs WHERE sweep_id = $1")
        .bind(sweep_id.get())
        .fetch_one(readers)
        .await
        .unwrap();
    let history: i64 =
        server::db::sql::query_scalar("SELECT count(*) FROM job_events").fetch_one(readers).await.unwrap();
    assert_eq!((remaining, history), (3, 3), "the rollback kept every job and its history");
    db.close().await;
}
