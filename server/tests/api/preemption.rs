//! Preemption by hand (issue 29, item 3's mechanics): `POST /api/jobs/{id}/preempt` orders a
//! running attempt stopped; its worker's heartbeat carries the order with the server's grace;
//! the attempt's `preempted` outcome requeues the job with the order's reason, no retry spent
//! and no crash counted, and charges the GPU time it held to its owner. Only the owner or an
//! admin may preempt; the order is keyed by attempt, so the next attempt runs undisturbed.

use client::{Client, ClientOptions};
use server::auth::Role;
use shared::api::{ClaimRequest, FinishRequest, HeartbeatRequest, JobAttempt, ReportRequest, WorkerId};
use shared::job::{JobStatus, Outcome};
use shared::placement::Capacity;
use testkit::{cpu, cpu_worker, sweep_of, TestApp};

const USER_A: &str = "preempt-a-token-0123456789";
const USER_B: &str = "preempt-b-token-0123456789";
const WORKER: &str = "preempt-worker-token-012345";

async fn lab() -> TestApp {
    TestApp::spawn_secure(
        |config| {
            config.tokens.add_users(&format!("user-a:{USER_A},user-b:{USER_B}"), "test").unwrap();
            config.tokens.add(Role::Worker, WORKER, "test").unwrap();
            config.preempt_grace = std::time::Duration::from_secs(7);
        },
        ClientOptions { token: Some(USER_A.into()), ca_pem: None },
    )
    .await
}

fn as_token(app: &TestApp, token: &str) -> Client {
    Client::with_options(&app.url, &ClientOptions { token: Some(token.into()), ca_pem: None }).unwrap()
}

async fn heartbeat(worker: &Client, id: WorkerId, running: &[JobAttempt]) -> shared::api::HeartbeatResponse {
    worker
        .heartbeat(id, &HeartbeatRequest { running: running.to_vec(), gpus: Vec::new(), saves: Vec::new() })
        .await
        .unwrap()
}

#[tokio::test]
async fn a_preempted_attempt_is_stopped_at_its_heartbeat_and_requeued_with_its_reason_no_retry_spent() {
    let app = lab().await;
    let worker = as_token(&app, WORKER);
    let id = worker.register(&cpu_worker("w")).await.unwrap().worker_id;
    app.submit(&format!("{}retries: 2\n", sweep_of("grid-a", 1))).await;
    let claim = ClaimRequest { capacity: cpu(1), wait_ms: 0, reserve: 0 };
    let job = worker.claim(id, &claim).await.unwrap().jobs.pop().unwrap();
    let first = JobAttempt { job_id: job.id, attempt: job.attempt };
    assert!(heartbeat(&worker, id, &[first]).await.preempt.is_empty(), "nothing ordered yet");

    // Another user may not; a queued job cannot be; the owner may, once.
    let error = as_token(&app, USER_B).preempt_job(job.id).await.unwrap_err();
    assert_eq!(error.status(), Some(403), "{error}");
    assert!(error.to_string().contains("belongs to user-a"), "{error}");
    let ordered = app.client.preempt_job(job.id).await.unwrap();
    assert_eq!((ordered.attempt, ordered.reason.as_str()), (first, "preempted by user-a"));
    let again = app.client.preempt_job(job.id).await.unwrap_err();
    assert_eq!(again.status(), Some(409), "{again}");

    let told = heartbeat(&worker, id, &[first]).await;
    assert_eq!((told.preempt, told.preempt_grace_ms, told.cancel), (vec![first], 7_000, Vec::new()));
    let report = ReportRequest { worker_id: id, attempt: first.attempt, outcome: Outcome::Preempted };
    assert_eq!(worker.report(job.id, &report).await.unwrap().status, JobStatus::Queued);
    let requeued = app.client.job(job.id).await.unwrap();
    assert_eq!((requeued.status, requeued.retries_left, requeued.crash_count), (JobStatus::Queued, 2, 0));
    let attempts = app.client.job_attempts(job.id).await.unwrap();
    assert_eq!(attempts[0].reason.as_deref(), Some("preempted by user-a"));
    assert_eq!(app.client.preempt_job(job.id).await.unwrap_err().status(), Some(409), "a queued job is not preempted");

    // The next attempt is not stopped by the first one's order.
    let next = worker.claim(id, &claim).await.unwrap().jobs.pop().unwrap();
    let second = JobAttempt { job_id: next.id, attempt: next.attempt };
    assert_eq!(second, JobAttempt { job_id: job.id, attempt: 2 });
    assert!(heartbeat(&worker, id, &[second]).await.preempt.is_empty());
}

#[tokio::test]
async fn a_preempted_gpu_attempt_charges_the_time_it_held_and_a_cancel_wins_over_the_order() {
    let app = lab().await;
    let worker = as_token(&app, WORKER);
    let capacity = Capacity::idle_gpus(2, 2, 24 << 30);
    let id = worker.register(&cpu_worker("gpu-box")).await.unwrap().worker_id;
    app.submit("name: grid-a\ncommand: \"true\"\nresources: {gpus: 2}\ngrid: {i: [0, 1]}\n").await;
    let claim = ClaimRequest { capacity: capacity.clone(), wait_ms: 0, reserve: 0 };
    let job = worker.claim(id, &claim).await.unwrap().jobs.pop().unwrap();
    app.client.preempt_job(job.id).await.unwrap();
    // Finished through the one-request finish, as a worker does.
    let finish = FinishRequest {
        notes: vec!["it did not exit within its grace after SIGTERM and was killed with SIGKILL".into()],
        ..FinishRequest::outcome(job.id, job.attempt, Outcome::Preempted)
    };
    assert_eq!(worker.finish(id, &finish).await.unwrap().status, JobStatus::Queued);
    let usage = app.client.usage().await.unwrap();
    let held = usage.users.iter().find(|user| user.user == "user-a").map_or(0.0, |user| user.gpu_hours_24h);
    assert!(held > 0.0, "two GPUs held from claim to finish count: {usage:?}");

    // A cancel ordered after the preemption wins: the worker is told to kill, not to preempt.
    let job = worker.claim(id, &claim).await.unwrap().jobs.pop().unwrap();
    app.client.preempt_job(job.id).await.unwrap();
    app.client.cancel_job(job.id).await.unwrap();
    let told = heartbeat(&worker, id, &[JobAttempt { job_id: job.id, attempt: job.attempt }]).await;
    assert_eq!((told.cancel.len(), told.preempt.len()), (1, 0));
    let report = ReportRequest { worker_id: id, attempt: job.attempt, outcome: Outcome::Preempted };
    assert_eq!(worker.report(job.id, &report).await.unwrap().status, JobStatus::Cancelled);
}
