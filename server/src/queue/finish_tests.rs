//! The bare finish decided on a reader's view: when the job changes between that view and the
//! write unit, the finish is decided again on the writer's own reading.

use super::*;
use crate::config::ServerConfig;
use shared::api::{AttemptRecord, JobId, SweepId};
use shared::job::Outcome;
use std::sync::Arc;

/// A queue over a fresh data directory with one job running as attempt 1 on worker 1, in a
/// sweep of two (the other job queued).
async fn queue_with_a_running_job() -> (tempfile::TempDir, Arc<Queue>, super::super::Tasks) {
    let directory = tempfile::tempdir().unwrap();
    let db = db::Db::open(directory.path()).await.unwrap();
    let setup =
        "INSERT INTO sweeps (id, name, form, source, job_count, created_at) VALUES (1, 's', 'native', '', 2, 0);
         INSERT INTO workers (id, name, capacity, registered_at, last_seen_at) VALUES (1, 'w', '{}', 0, 0);
         INSERT INTO jobs (id, sweep_id, idx, params, command, priority, created_at) VALUES
             (1, 1, 0, '{}', 'true', 0, 0), (2, 1, 1, '{}', 'true', 0, 0);
         UPDATE jobs SET status = 'running', attempt = 1, worker_id = 1 WHERE id = 1;";
    db.sqlite_connection().unwrap().unwrap().execute_batch(setup).unwrap();
    let config = Arc::new(ServerConfig { data_dir: directory.path().to_path_buf(), ..ServerConfig::default() });
    let (_stop, shutting_down) = tokio::sync::watch::channel(false);
    let (queue, tasks) = Queue::start(db, config, "test".into(), shutting_down);
    // As after a server's first claim and finish: no adaptive sweep is open and the sweep is
    // cached, so bare finishes may go quickly.
    let (search, asking) =
        (queue.search.clone(), [(WorkerId::new(1), Capacity { job_slots: 1, ..Capacity::default() })]);
    let caches = (queue.sweep_names.clone(), queue.workspaces.clone());
    queue
        .write(move |tx| {
            Box::pin(async move {
                search.top_up(tx, &asking).await?;
                search.has_target(tx, SweepId::new(1)).await?;
                super::super::claims::sweep_of(tx, SweepId::new(1), (&caches.0, &caches.1)).await.map(|_| ())
            })
        })
        .await
        .unwrap();
    assert!(!queue.search.may_be_open());
    (directory, queue, tasks)
}

/// Finishes applied on each path so far: (fast, fallback, general).
fn paths(queue: &Queue) -> (u64, u64, u64) {
    let meters = queue.meters();
    (
        meters.finishes_on(FinishPath::Fast),
        meters.finishes_on(FinishPath::Fallback),
        meters.finishes_on(FinishPath::General),
    )
}

fn bare_finish(claim: bool) -> FinishRequest {
    FinishRequest {
        job_id: JobId::new(1),
        attempt: 1,
        outcome: Outcome::Exited { code: 0 },
        log: None,
        metrics: None,
        result: Some(InlineResult { files: Vec::new(), streamed: Vec::new(), record: AttemptRecord::default() }),
        notes: Vec::new(),
        claim: claim.then(|| shared::api::ClaimRequest {
            capacity: Capacity { job_slots: 1, ..Capacity::default() },
            wait_ms: 0,
            reserve: 0,
        }),
    }
}

async fn status_of(queue: &Queue, id: i64) -> String {
    db::sql::query_scalar("SELECT status FROM jobs WHERE id = $1")
        .bind(id)
        .fetch_one(queue.reader().sqlite().unwrap())
        .await
        .unwrap()
}

/// Sends a bare finish (claiming one job) whose view is read while `between`, a write queued
/// behind a held writer, has not committed yet, and whose unit runs right after it.
async fn finish_after<F>(queue: &Arc<Queue>, between: F) -> ApiResult<shared::api::FinishResponse>
where
    F: std::future::Future<Output = ApiResult<()>> + Send + 'static,
{
    let (release, held) = queue.writer.hold().await;
    let between = tokio::spawn(between);
    queue.writer.wait_for_queued(1).await;
    let finisher = queue.clone();
    let finish = tokio::spawn(async move { finisher.finish(WorkerId::new(1), bare_finish(true)).await });
    queue.writer.wait_for_queued(2).await;
    release.send(()).unwrap();
    held.await.unwrap().unwrap();
    between.await.unwrap().unwrap();
    finish.await.unwrap()
}

/// A write unit running `sql`.
fn statement(
    queue: &Arc<Queue>,
    sql: &'static str,
) -> impl std::future::Future<Output = ApiResult<()>> + Send + 'static {
    let queue = queue.clone();
    async move {
        queue
            .write(move |tx| {
                Box::pin(async move {
                    db::sql::query(sql).execute(tx.conn().await?.into_sqlite().unwrap()).await?;
                    Ok(())
                })
            })
            .await
    }
}

async fn versions(queue: &Queue) -> i64 {
    db::sql::query_scalar("SELECT count(*) FROM results").fetch_one(queue.reader().sqlite().unwrap()).await.unwrap()
}

#[tokio::test]
async fn a_cancel_between_the_readers_view_and_the_write_decides_the_finish() {
    let (_directory, queue, _tasks) = queue_with_a_running_job().await;
    let cancel = statement(&queue, "UPDATE jobs SET cancel_requested = 1 WHERE id = 1");
    let response = finish_after(&queue, cancel).await.unwrap();
    assert_eq!(response.status, JobStatus::Cancelled, "decided on the cancel that landed first");
    assert_eq!(status_of(&queue, 1).await, "cancelled");
    assert_eq!(response.jobs.len(), 1, "the finish still claims the worker's next job");
    assert_eq!(status_of(&queue, 2).await, "running");
    assert_eq!(versions(&queue).await, 1, "the record is stored once");
    assert_eq!(paths(&queue), (0, 1, 0), "the quick step saw the guard fail and handed over");
}

#[tokio::test]
async fn metrics_that_land_between_the_view_and_the_write_are_in_the_version() {
    let (_directory, queue, _tasks) = queue_with_a_running_job().await;
    let recorder = queue.clone();
    let point = shared::api::MetricPoint { step: Some(1), name: "loss".into(), value: 0.25 };
    let metrics =
        async move { recorder.record_metrics(JobId::new(1), 1, WorkerId::new(1), 10, vec![point]).await.map(|_| ()) };
    let response = finish_after(&queue, metrics).await.unwrap();
    assert_eq!(response.status, JobStatus::Succeeded);
    let stored: String = db::sql::query_scalar("SELECT metrics FROM results WHERE job_id = 1 AND attempt = 1")
        .fetch_one(queue.reader().sqlite().unwrap())
        .await
        .unwrap();
    assert!(stored.contains("loss"), "the version has the summaries recorded before it: {stored}");
    assert_eq!(paths(&queue), (0, 1, 0));
}

#[tokio::test]
async fn a_job_lost_between_the_view_and_the_write_keeps_nothing_of_the_finish() {
    let (_directory, queue, _tasks) = queue_with_a_running_job().await;
    // As the reaper does with an attempt whose lease ran out: back to the queue.
    let requeue = statement(&queue, "UPDATE jobs SET status = 'queued', worker_id = NULL WHERE id = 1");
    let refused = finish_after(&queue, requeue).await.unwrap_err();
    assert!(matches!(refused, ApiError::Conflict(_)), "{refused:?}");
    assert_eq!(versions(&queue).await, 0, "the quick step's refused finish stored no version");
    assert_eq!(status_of(&queue, 1).await, "queued");
    assert_eq!(status_of(&queue, 2).await, "queued", "nothing claimed");
}

#[tokio::test]
async fn a_bare_finish_of_an_attempt_the_worker_no_longer_holds_is_refused_whole() {
    let (_directory, queue, _tasks) = queue_with_a_running_job().await;
    let stale = FinishRequest { attempt: 2, ..bare_finish(true) };
    let refused = queue.finish(WorkerId::new(1), stale).await.unwrap_err();
    assert!(matches!(refused, ApiError::Conflict(_)), "{refused:?}");
    assert_eq!(status_of(&queue, 1).await, "running");
    assert_eq!(status_of(&queue, 2).await, "queued", "nothing claimed");
    assert_eq!(versions(&queue).await, 0);
    let done = queue.finish(WorkerId::new(1), bare_finish(false)).await.unwrap();
    assert_eq!((done.status, done.jobs.len()), (JobStatus::Succeeded, 0));
    assert_eq!(paths(&queue), (1, 0, 0), "the refused finish counted nothing; the next one went quickly");
}

#[tokio::test]
async fn a_quick_claim_that_reaches_a_sweep_not_cached_reads_it_and_hands_the_job_out_once() {
    let (_directory, queue, _tasks) = queue_with_a_running_job().await;
    // A second sweep, never looked at, whose job comes first in the queue.
    statement(
        &queue,
        "INSERT INTO sweeps (id, name, form, source, job_count, created_at) VALUES (2, 'other', 'native', '', 1, 0)",
    )
    .await
    .unwrap();
    statement(&queue, "INSERT INTO jobs (id, sweep_id, idx, params, command, priority, created_at) VALUES (3, 2, 0, '{}', 'true', 5, 0)")
        .await
        .unwrap();
    let response = queue.finish(WorkerId::new(1), bare_finish(true)).await.unwrap();
    assert_eq!(response.status, JobStatus::Succeeded);
    assert_eq!(
        response.jobs.iter().map(|job| (job.id, job.sweep.as_str())).collect::<Vec<_>>(),
        [(JobId::new(3), "other")]
    );
    assert_eq!(paths(&queue), (1, 0, 0), "the conclusion read the sweep's name and workspace");
    // One version, one claim, one transition of each job.
    assert_eq!(versions(&queue).await, 1);
    assert_eq!(
        (status_of(&queue, 1).await, status_of(&queue, 2).await, status_of(&queue, 3).await),
        ("succeeded".into(), "queued".into(), "running".into())
    );
    let attempts: i64 = db::sql::query_scalar("SELECT attempt FROM jobs WHERE id = 3")
        .fetch_one(queue.reader().sqlite().unwrap())
        .await
        .unwrap();
    assert_eq!(attempts, 1);
    let events: i64 = db::sql::query_scalar("SELECT count(*) FROM job_events WHERE job_id IN (1, 3)")
        .fetch_one(queue.reader().sqlite().unwrap())
        .await
        .unwrap();
    assert_eq!(events, 3, "job 1's setup claim and its finish, job 3's claim");
    // The first finish of sweep 2 looks up whether it has a `metric.target` (general path).
    let finish = FinishRequest { job_id: JobId::new(3), ..bare_finish(false) };
    assert_eq!(queue.finish(WorkerId::new(1), finish).await.unwrap().status, JobStatus::Succeeded);
    assert_eq!(paths(&queue), (1, 0, 1));
}

/// Finishes job 1 claiming job 2 plainly, so that job 2's view is kept; returns job 2's attempt.
async fn claim_job_2(queue: &Arc<Queue>) -> u32 {
    let response = queue.finish(WorkerId::new(1), bare_finish(true)).await.unwrap();
    assert_eq!(response.jobs.iter().map(|job| job.id).collect::<Vec<_>>(), [JobId::new(2)]);
    let attempt = response.jobs[0].attempt;
    assert_eq!(paths(queue).0, 1, "quickly");
    let (state, source) = queue.views.take(JobId::new(2), attempt).expect("the claim kept its view");
    assert_eq!(
        (state.status, state.worker_id, state.cancel_requested),
        (JobStatus::Running, Some(WorkerId::new(1)), false)
    );
    queue.views.keep(state, source);
    attempt
}

fn bare_finish_of_job_2(attempt: u32) -> FinishRequest {
    FinishRequest { job_id: JobId::new(2), attempt, ..bare_finish(false) }
}

#[tokio::test]
async fn a_cancel_after_the_claims_view_still_decides_the_finish() {
    let (_directory, queue, _tasks) = queue_with_a_running_job().await;
    let attempt = claim_job_2(&queue).await;
    statement(&queue, "UPDATE jobs SET cancel_requested = 1 WHERE id = 2").await.unwrap();
    let response = queue.finish(WorkerId::new(1), bare_finish_of_job_2(attempt)).await.unwrap();
    assert_eq!(response.status, JobStatus::Cancelled, "the view said nothing of the cancel");
    assert_eq!(status_of(&queue, 2).await, "cancelled");
    assert_eq!(versions(&queue).await, 2, "each job's record stored once");
    assert!(queue.views.take(JobId::new(2), attempt).is_none(), "the finish took the view");
    assert_eq!(paths(&queue), (1, 1, 0));
}

#[tokio::test]
async fn a_view_of_an_attempt_requeued_since_finishes_nothing() {
    let (_directory, queue, _tasks) = queue_with_a_running_job().await;
    let attempt = claim_job_2(&queue).await;
    // Its lease expired: back in the queue, as the reaper leaves it.
    statement(&queue, "UPDATE jobs SET status = 'queued', worker_id = NULL, lease_expires_at = NULL WHERE id = 2")
        .await
        .unwrap();
    let refused = queue.finish(WorkerId::new(1), bare_finish_of_job_2(attempt)).await;
    assert!(matches!(refused, Err(ApiError::Conflict(_))), "{refused:?}");
    assert_eq!(status_of(&queue, 2).await, "queued");
    assert_eq!(versions(&queue).await, 1, "no record of the refused attempt");
}

#[tokio::test]
async fn a_claim_that_keeps_no_view_drops_an_older_one() {
    let (_directory, queue, _tasks) = queue_with_a_running_job().await;
    // A view left of an earlier job with job 2's id (ids are reused after a sweep is removed).
    let state = db::jobs::JobState::running_on_worker_1(2, 9, 1);
    let source =
        db::jobs::ResultSource { sweep: "gone".into(), index: 7, params: serde_json::json!({}), has_metrics: false };
    queue.views.keep(state, source);
    // A box with a GPU is served by the general claim, which keeps no view.
    let gpu = shared::placement::GpuSlot {
        index: 0,
        memory_total: 24 << 30,
        memory_free: 24 << 30,
        exclusive_held: false,
        shared_jobs: 0,
    };
    let capacity = Capacity { job_slots: 1, gpus: vec![gpu], ..Capacity::default() };
    let jobs = queue.claim(WorkerId::new(1), capacity, std::time::Duration::ZERO).await.unwrap();
    assert_eq!(jobs.iter().map(|job| (job.id, job.attempt)).collect::<Vec<_>>(), [(JobId::new(2), 1)]);
    assert!(queue.views.take(JobId::new(2), 1).is_none(), "the new attempt's finish reads the job");
}
