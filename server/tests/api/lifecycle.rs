//! The job lifecycle: reports fenced by attempt, retries, leases, cancels, restarts.

use shared::api::{HeartbeatRequest, JobAttempt, JobQuery, RegisterRequest, ReportRequest, WorkerId};
use shared::job::{JobStatus, Outcome};
use std::time::Duration;
use testkit::{cpu, sweep_of, wait_until, TestApp};

fn exited(worker_id: WorkerId, attempt: u32, code: i32) -> ReportRequest {
    ReportRequest { worker_id, attempt, outcome: Outcome::Exited { code } }
}

#[tokio::test]
async fn a_finished_attempt_is_recorded_once_and_a_stale_report_changes_nothing() {
    let app = TestApp::spawn().await;
    app.submit(&sweep_of("once", 1)).await;
    let worker = app.register("w", 1).await;
    let job = app.claim(worker, 1).await.pop().unwrap();
    let response = app.client.report(job.id, &exited(worker, job.attempt, 0)).await.unwrap();
    assert_eq!(response.status, JobStatus::Succeeded);
    let again = app.client.report(job.id, &exited(worker, job.attempt, 1)).await.unwrap_err();
    assert_eq!(again.status(), Some(409), "{again}");
    let stale = app.client.report(job.id, &exited(worker, job.attempt + 7, 0)).await.unwrap_err();
    assert_eq!(stale.status(), Some(409));
    let stored = app.client.job(job.id).await.unwrap();
    assert_eq!((stored.status, stored.exit_code), (JobStatus::Succeeded, Some(0)));
    let events = app.client.job_events(job.id).await.unwrap();
    let path: Vec<_> = events.iter().map(|event| event.to).collect();
    assert_eq!(path, [JobStatus::Running, JobStatus::Succeeded]);
    assert_eq!(events[0].worker.as_deref(), Some("w"));
}

#[tokio::test]
async fn a_failing_job_runs_again_while_retries_last_then_fails_with_its_exit_code() {
    let app = TestApp::spawn().await;
    app.submit("name: flaky\ncommand: \"exit 3\"\nretries: 1\n").await;
    let worker = app.register("w", 1).await;
    let first = app.claim(worker, 1).await.pop().unwrap();
    let status = app.client.report(first.id, &exited(worker, first.attempt, 3)).await.unwrap().status;
    assert_eq!(status, JobStatus::Queued);
    let second = app.claim(worker, 1).await.pop().unwrap();
    assert_eq!((second.id, second.attempt), (first.id, 2));
    let status = app.client.report(second.id, &exited(worker, second.attempt, 3)).await.unwrap().status;
    assert_eq!(status, JobStatus::Failed);
    let job = app.client.job(first.id).await.unwrap();
    assert_eq!((job.exit_code, job.reason.as_deref()), (Some(3), Some("exited with code 3")));
    // A failed job can be retried by hand, and then a report of the old attempt is stale.
    assert_eq!(app.client.retry_job(job.id).await.unwrap().status, JobStatus::Queued);
    let third = app.claim(worker, 1).await.pop().unwrap();
    assert_eq!(third.attempt, 3);
    let stale = app.client.report(third.id, &exited(worker, 2, 0)).await.unwrap_err();
    assert_eq!(stale.status(), Some(409));
}

#[tokio::test]
async fn a_silent_worker_loses_its_job_to_the_queue_and_after_max_crashes_it_fails() {
    let app = TestApp::spawn_with(|config| {
        config.lease = Duration::from_millis(400);
        config.max_crashes = 2;
    })
    .await;
    app.submit(&sweep_of("lost", 1)).await;
    let worker = app.register("vanishing", 1).await;
    let first = app.claim(worker, 1).await.pop().unwrap();
    let job = wait_until("the expired lease puts the job back in the queue", Duration::from_secs(10), || async {
        let job = app.client.job(first.id).await.unwrap();
        (job.status == JobStatus::Queued).then_some(job)
    })
    .await;
    assert_eq!((job.crash_count, job.reason.as_deref()), (1, Some("lease_expired")));
    let late = app.client.report(first.id, &exited(worker, first.attempt, 0)).await.unwrap_err();
    assert_eq!(late.status(), Some(409), "the lost attempt's report is fenced off");
    let second = app.claim(worker, 1).await.pop().unwrap();
    assert_eq!(second.attempt, 2);
    let job = wait_until("the second crash fails the job", Duration::from_secs(10), || async {
        let job = app.client.job(first.id).await.unwrap();
        (job.status == JobStatus::Failed).then_some(job)
    })
    .await;
    assert_eq!((job.crash_count, job.reason.as_deref()), (2, Some("worker_lost")));
}

#[tokio::test]
async fn heartbeats_keep_leases_alive_carry_cancels_and_name_unknown_attempts() {
    let app = TestApp::spawn_with(|config| config.lease = Duration::from_millis(600)).await;
    app.submit(&sweep_of("beat", 2)).await;
    let worker = app.register("w", 2).await;
    let jobs = app.claim(worker, 2).await;
    let held: Vec<JobAttempt> = jobs.iter().map(|job| JobAttempt { job_id: job.id, attempt: job.attempt }).collect();
    let bogus = JobAttempt { job_id: held[0].job_id, attempt: 99 };
    // Heartbeat for twice the lease: nothing expires.
    for _ in 0..12 {
        let request = HeartbeatRequest { running: held.clone(), ..HeartbeatRequest::default() };
        let response = app.client.heartbeat(worker, &request).await.unwrap();
        assert!(response.cancel.is_empty() && response.unknown.is_empty());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let running = JobQuery { status: Some(JobStatus::Running), ..JobQuery::default() };
    assert_eq!(app.client.jobs(&running).await.unwrap().total, 2);
    let cancel = app.client.cancel_job(held[1].job_id).await.unwrap();
    assert_eq!((cancel.cancelled, cancel.cancel_requested), (0, 1));
    let request = HeartbeatRequest { running: vec![held[0], held[1], bogus], ..HeartbeatRequest::default() };
    let response = app.client.heartbeat(worker, &request).await.unwrap();
    assert_eq!(response.cancel, [held[1]]);
    assert_eq!(response.unknown, [bogus]);
    let killed = ReportRequest {
        worker_id: worker,
        attempt: held[1].attempt,
        outcome: Outcome::Killed { reason: "cancelled".into() },
    };
    assert_eq!(app.client.report(held[1].job_id, &killed).await.unwrap().status, JobStatus::Cancelled);
    let unknown =
        app.client.heartbeat(WorkerId::new(worker.get() + 100), &HeartbeatRequest::default()).await.unwrap_err();
    assert_eq!(unknown.status(), Some(401), "a worker this server never registered has no session: {unknown}");
}

#[tokio::test]
async fn a_job_claimed_for_a_worker_that_never_lists_it_is_lost_before_its_lease_runs_out() {
    // As when a server commits a finish with the worker's next claim and dies before it
    // answers: the job is running on the worker in the database, and the worker never heard.
    // The reaper does not run here (its interval is an hour): only the heartbeats can see it.
    let app = TestApp::spawn_with(|config| {
        config.heartbeat = Duration::from_millis(200);
        config.lease = Duration::from_millis(600);
        config.reaper_interval = Duration::from_secs(3600);
    })
    .await;
    app.submit(&sweep_of("unheard", 2)).await;
    let worker = app.register("w", 2).await;
    let jobs = app.claim(worker, 2).await;
    let (held, unheard) = (JobAttempt { job_id: jobs[0].id, attempt: jobs[0].attempt }, jobs[1].id);
    let beat = HeartbeatRequest { running: vec![held], ..HeartbeatRequest::default() };
    app.client.heartbeat(worker, &beat).await.unwrap();
    assert_eq!(app.client.job(unheard).await.unwrap().status, JobStatus::Running, "an answer may still be on its way");
    let requeued = wait_until("the unheard job back in the queue", Duration::from_secs(10), || async {
        app.client.heartbeat(worker, &beat).await.unwrap();
        let job = app.client.job(unheard).await.unwrap();
        (job.status == JobStatus::Queued).then_some(job)
    })
    .await;
    // Counted as a crash, as a lease that ran out is: a job whose every finish is refused (and
    // so dropped by its worker) fails after the crashes allowed instead of going round for ever.
    assert_eq!(requeued.crash_count, 1);
    let metrics = crate::metrics_text(&app, None).await;
    assert!(metrics.lines().any(|line| line == "app_lease_expiries_total 1"), "counted with the expiries: {metrics}");
    let kept = app.client.job(held.job_id).await.unwrap();
    assert_eq!((kept.status, kept.attempt), (JobStatus::Running, held.attempt), "the job it lists stays its own");
    // Claimed again, it runs as its next attempt.
    let again = app.claim(worker, 1).await;
    assert_eq!(again.iter().map(|job| job.id).collect::<Vec<_>>(), [unheard]);
}

#[tokio::test]
async fn cancelling_a_sweep_cancels_queued_jobs_now_and_flags_running_ones() {
    let app = TestApp::spawn().await;
    app.submit(&sweep_of("stop-me", 5)).await;
    let worker = app.register("w", 2).await;
    assert_eq!(app.claim(worker, 2).await.len(), 2);
    let response = app.client.cancel_sweep("stop-me").await.unwrap();
    assert_eq!((response.cancelled, response.cancel_requested), (3, 2));
    let counts = app.client.sweep("stop-me").await.unwrap().info.counts;
    assert_eq!((counts.cancelled, counts.running), (3, 2));
    assert!(app.claim(worker, 2).await.is_empty());
    let cancelled = app.client.jobs(&JobQuery { status: Some(JobStatus::Cancelled), ..JobQuery::default() }).await;
    let retried = app.client.retry_job(cancelled.unwrap().jobs[0].id).await.unwrap();
    assert_eq!(retried.status, JobStatus::Queued);
}

#[tokio::test]
async fn a_worker_that_comes_back_without_its_jobs_gets_them_requeued_at_once() {
    let app = TestApp::spawn().await;
    app.submit(&sweep_of("reboot", 2)).await;
    let worker = app.register("box", 2).await;
    let jobs = app.claim(worker, 2).await;
    let kept = JobAttempt { job_id: jobs[0].id, attempt: jobs[0].attempt };
    let request = RegisterRequest {
        name: "box".into(),
        protocol: shared::PROTOCOL_VERSION,
        key: None,
        capacity: cpu(2),
        holding: vec![kept],
    };
    let response = app.client.register(&request).await.unwrap();
    assert_eq!(response.worker_id, worker, "same name, same worker");
    assert_eq!(response.requeued, [jobs[1].id]);
    assert_eq!(app.client.job(jobs[0].id).await.unwrap().status, JobStatus::Running);
    let requeued = app.client.job(jobs[1].id).await.unwrap();
    assert_eq!((requeued.status, requeued.crash_count), (JobStatus::Queued, 1));
}

#[tokio::test]
async fn a_restarted_server_loses_nothing_and_running_attempts_can_still_report() {
    let app = TestApp::spawn().await;
    app.submit(&sweep_of("durable", 50)).await;
    let worker = app.register("w", 5).await;
    let claimed = app.claim(worker, 5).await;
    let done = &claimed[0];
    app.client.report(done.id, &exited(worker, done.attempt, 0)).await.unwrap();
    let app = app.restart().await;
    let counts = app.client.sweep("durable").await.unwrap().info.counts;
    assert_eq!((counts.queued, counts.running, counts.succeeded), (45, 4, 1));
    let still_running = &claimed[1];
    let status = app.client.report(still_running.id, &exited(worker, still_running.attempt, 0)).await.unwrap().status;
    assert_eq!(status, JobStatus::Succeeded);
    let next = app.claim(worker, 1).await.pop().unwrap();
    assert_eq!(next.index, 5, "the queue resumes where it was");
}

#[tokio::test]
async fn the_kept_counts_agree_with_the_jobs_through_every_kind_of_transition() {
    let app = TestApp::spawn_with(|config| config.lease = Duration::from_millis(300)).await;
    app.submit(&sweep_of("counted", 12)).await;
    app.submit(&sweep_of("other", 3)).await;
    let worker = app.register("w", 6).await;
    let claimed = app.claim(worker, 6).await;
    app.client.report(claimed[0].id, &exited(worker, claimed[0].attempt, 0)).await.unwrap();
    app.client.report(claimed[1].id, &exited(worker, claimed[1].attempt, 2)).await.unwrap();
    app.client.cancel_job(claimed[2].id).await.unwrap();
    app.client.retry_job(claimed[1].id).await.unwrap();
    // The others lose their lease (the one flagged for cancelling ends cancelled); a queued job
    // is cancelled.
    let queued = JobQuery { status: Some(JobStatus::Queued), sweep: Some("counted".into()), ..JobQuery::default() };
    let waiting = app.client.jobs(&queued).await.unwrap().jobs;
    app.client.cancel_job(waiting[0].id).await.unwrap();
    wait_until("the leases ran out", Duration::from_secs(10), || async {
        let running = JobQuery { status: Some(JobStatus::Running), ..JobQuery::default() };
        let jobs = app.client.jobs(&running).await.ok()?;
        (jobs.total == 0).then_some(())
    })
    .await;
    let overview = app.client.overview().await.unwrap().counts;
    let mut total = shared::api::StatusCounts::default();
    for name in ["counted", "other"] {
        let kept = app.client.sweep(name).await.unwrap().info.counts;
        let mut counted = shared::api::StatusCounts::default();
        for status in JobStatus::ALL {
            let query =
                JobQuery { status: Some(status), sweep: Some(name.into()), limit: Some(1), ..JobQuery::default() };
            let jobs = app.client.jobs(&query).await.unwrap().total;
            counted.add(status, jobs);
            total.add(status, jobs);
        }
        assert_eq!(kept, counted, "{name}");
    }
    assert_eq!(overview, total);
    assert_eq!(total.total(), 15);
}
