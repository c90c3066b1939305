//! Sweeps whose runs keep failing pause themselves: after their first failures (3 unless
//! `max_initial_failures` says otherwise) or, once a run succeeded, after
//! `max_consecutive_failures` in a row. Paused, nothing of them is claimed; resumed, the
//! failures are counted afresh.

use shared::api::{FinishRequest, ReportRequest, WorkerId};
use shared::job::{JobStatus, Outcome};
use testkit::TestApp;

fn grid(name: &str, jobs: usize, extra: &str) -> String {
    let values = (0..jobs).map(|i| i.to_string()).collect::<Vec<_>>().join(", ");
    format!("name: {name}\ncommand: \"echo {{i}}\"\ngrid:\n  i: [{values}]\n{extra}")
}

/// Claims one job and reports it ended with `code` (through the report endpoint); `None` when
/// nothing could be claimed.
async fn run_one(app: &TestApp, worker: WorkerId, code: i32) -> Option<JobStatus> {
    let job = app.claim(worker, 1).await.pop()?;
    let report = ReportRequest { worker_id: worker, attempt: job.attempt, outcome: Outcome::Exited { code } };
    Some(app.client.report(job.id, &report).await.unwrap().status)
}

#[tokio::test]
async fn three_failed_runs_pause_a_new_sweep_until_it_is_resumed() {
    let app = TestApp::spawn().await;
    app.submit(&grid("typo", 8, "")).await;
    let worker = app.register("w", 1).await;
    for _ in 0..2 {
        assert_eq!(run_one(&app, worker, 2).await, Some(JobStatus::Failed));
    }
    assert!(app.client.sweep("typo").await.unwrap().info.paused.is_none(), "two failures do not pause");
    // The third fails through the one-request finish, with a log: its last lines are quoted.
    let job = app.claim(worker, 1).await.pop().unwrap();
    let finish = FinishRequest {
        job_id: job.id,
        attempt: job.attempt,
        outcome: Outcome::Exited { code: 2 },
        log: Some(shared::api::LogTail {
            offset: 0,
            data: b"python3: can't open file 'trian.py': [Errno 2] No such file or directory\n".to_vec(),
        }),
        metrics: None,
        notes: Vec::new(),
        result: None,
        claim: None,
    };
    app.client.finish(worker, &finish).await.unwrap();
    let sweep = app.client.sweep("typo").await.unwrap().info;
    let paused = sweep.paused.expect("paused after three failed runs");
    assert!(paused.reason.contains("3 runs failed and none has succeeded"), "{}", paused.reason);
    assert!(
        paused.reason.contains(&format!("job {}", job.id)) && paused.reason.contains("trian.py"),
        "{}",
        paused.reason
    );
    assert!(paused.reason.contains("app sweeps resume"), "{}", paused.reason);
    // Nothing of it is claimed while paused, by either kind of claim.
    assert!(app.claim(worker, 1).await.is_empty(), "a paused sweep's jobs are not claimed");
    assert_eq!(app.client.sweep("typo").await.unwrap().info.counts.queued, 5);
    // A failed job retried while its sweep is paused is queued, and held like the others.
    app.client.retry_job(job.id).await.unwrap();
    assert_eq!(app.client.job(job.id).await.unwrap().status, JobStatus::Queued);
    assert!(app.claim(worker, 1).await.is_empty(), "a retried job of a paused sweep waits too");
    assert_eq!(app.client.sweep("typo").await.unwrap().info.counts.queued, 6);
    // Another sweep's jobs still run.
    app.submit(&grid("other", 1, "")).await;
    assert_eq!(run_one(&app, worker, 0).await, Some(JobStatus::Succeeded));
    // Resumed: claimed again, and three more failures (still none succeeded) pause it again.
    assert!(app.client.resume_sweep("typo").await.unwrap().resumed);
    assert!(!app.client.resume_sweep("typo").await.unwrap().resumed, "resuming twice changes nothing");
    assert!(app.client.sweep("typo").await.unwrap().info.paused.is_none());
    let first = app.claim(worker, 1).await.pop().expect("claimed again once resumed");
    let report = ReportRequest { worker_id: worker, attempt: first.attempt, outcome: Outcome::Exited { code: 1 } };
    app.client.report(first.id, &report).await.unwrap();
    for _ in 0..2 {
        assert_eq!(run_one(&app, worker, 1).await, Some(JobStatus::Failed));
    }
    assert!(app.client.sweep("typo").await.unwrap().info.paused.is_some(), "paused again after 3 more");
    assert_eq!(run_one(&app, worker, 0).await, None);
    assert_eq!(app.client.sweep("typo").await.unwrap().info.counts.queued, 3, "the retried job ran with the others");
    let missing = app.client.resume_sweep("no-such-sweep").await.unwrap_err();
    assert_eq!(missing.status(), Some(404), "{missing}");
}

#[tokio::test]
async fn after_a_success_only_the_consecutive_limit_pauses_and_zero_never_does() {
    let app = TestApp::spawn().await;
    app.submit(&grid("flaky", 10, "max_consecutive_failures: 3\n")).await;
    let worker = app.register("w", 1).await;
    assert_eq!(run_one(&app, worker, 0).await, Some(JobStatus::Succeeded));
    for code in [1, 1, 0, 1, 1] {
        run_one(&app, worker, code).await.unwrap();
    }
    assert!(app.client.sweep("flaky").await.unwrap().info.paused.is_none(), "a success breaks the run of failures");
    assert_eq!(run_one(&app, worker, 1).await, Some(JobStatus::Failed));
    let paused = app.client.sweep("flaky").await.unwrap().info.paused.expect("3 in a row");
    assert!(paused.reason.contains("3 runs failed in a row"), "{}", paused.reason);

    app.submit(&grid("never", 5, "max_initial_failures: 0\n")).await;
    for _ in 0..5 {
        assert_eq!(run_one(&app, worker, 1).await, Some(JobStatus::Failed));
    }
    assert!(app.client.sweep("never").await.unwrap().info.paused.is_none(), "0 turns the limit off");
    let refused = app.client.submit(&grid("bad", 1, "max_initial_failures: -1\n"), &Default::default()).await;
    let error = refused.unwrap_err();
    assert!(error.status() == Some(400) && error.to_string().contains("max_initial_failures"), "{error}");
}

#[tokio::test]
async fn a_resumed_adaptive_sweep_proposes_runs_again() {
    let app = TestApp::spawn().await;
    app.submit("name: adapt\ncommand: \"echo {lr}\"\nsearch: random\ngrid: {lr: [1, 2, 3]}\n").await;
    let worker = app.register("w", 1).await;
    for _ in 0..3 {
        assert_eq!(run_one(&app, worker, 1).await, Some(JobStatus::Failed), "a run is made for each claim");
    }
    assert!(app.client.sweep("adapt").await.unwrap().info.paused.is_some());
    // Paused: no run is proposed, and the claim that found none leaves the controller's hint off.
    assert_eq!(run_one(&app, worker, 0).await, None);
    assert_eq!(run_one(&app, worker, 0).await, None);
    assert!(app.client.resume_sweep("adapt").await.unwrap().resumed);
    assert_eq!(run_one(&app, worker, 0).await, Some(JobStatus::Succeeded), "resumed, it proposes again");
}
