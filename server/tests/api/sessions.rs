//! Worker sessions (issue 10.2): a request speaks for a worker only with that worker's
//! session, and a worker that registered with another server instance is told to register
//! again; a holder of the shared worker token cannot act as another worker.

use client::Client;
use shared::api::{RegisterRequest, ReportRequest, INSTANCE_HEADER, SESSION_HEADER};
use shared::job::{JobStatus, Outcome};
use testkit::{cpu, sweep_of, TestApp};

fn registration(name: &str, key: &str) -> RegisterRequest {
    RegisterRequest {
        name: name.into(),
        protocol: shared::PROTOCOL_VERSION,
        key: Some(key.into()),
        capacity: cpu(1),
        holding: Vec::new(),
    }
}

#[tokio::test]
async fn a_worker_cannot_report_for_another_workers_job() {
    let app = TestApp::spawn().await;
    app.submit(&sweep_of("mine", 1)).await;
    let (owner, intruder) = (app.register("owner", 1).await, app.register("intruder", 1).await);
    let job = app.claim(owner, 1).await.pop().unwrap();
    // The intruder, with its own valid session, posts a success in the owner's name...
    let forged = ReportRequest { worker_id: owner, attempt: job.attempt, outcome: Outcome::Exited { code: 0 } };
    let intruders_client = Client::new(&app.url).unwrap();
    let response = app.registered.lock().unwrap().iter().find(|r| r.worker_id == intruder).cloned().unwrap();
    let intruders_client = intruders_client.with_session(&response).unwrap();
    let refused = intruders_client.report(job.id, &forged).await.unwrap_err();
    assert_eq!(refused.status(), Some(403), "{refused}");
    // ...or in its own: it does not hold the attempt.
    let own = ReportRequest { worker_id: intruder, ..forged.clone() };
    assert_eq!(intruders_client.report(job.id, &own).await.unwrap_err().status(), Some(409));
    // A made-up session for the owner's id is no session at all.
    let http = reqwest::Client::new();
    let guessed = http
        .post(format!("{}/api/jobs/{}/report", app.url, job.id))
        .header(SESSION_HEADER, format!("{owner}:{}", "0".repeat(64)))
        .json(&forged)
        .send()
        .await
        .unwrap();
    assert_eq!(guessed.status(), 401);
    assert_eq!(app.client.job(job.id).await.unwrap().status, JobStatus::Running, "nothing changed");
    // The owner's own report goes through.
    assert_eq!(app.client.report(job.id, &forged).await.unwrap().status, JobStatus::Succeeded);
}

#[tokio::test]
async fn a_session_from_another_server_instance_is_refused_with_why() {
    let app = TestApp::spawn().await;
    let worker = app.register("w", 1).await;
    let session = app.session_of(worker);
    let other_instance = "0".repeat(32);
    let refused = reqwest::Client::new()
        .post(format!("{}/api/workers/{worker}/heartbeat", app.url))
        .header(SESSION_HEADER, session)
        .header(INSTANCE_HEADER, &other_instance)
        .json(&shared::api::HeartbeatRequest::default())
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    let body: shared::api::ErrorBody = refused.json().await.unwrap();
    assert!(body.error.contains("instance") && body.error.contains("register again"), "{}", body.error);
}

#[tokio::test]
async fn the_same_worker_registering_again_keeps_its_id_and_a_stranger_with_its_name_does_not() {
    let app = TestApp::spawn().await;
    let first = app.client.register(&registration("gpu-box", "key-of-the-first-box-0123456789")).await.unwrap();
    let again = app.client.register(&registration("gpu-box", "key-of-the-first-box-0123456789")).await.unwrap();
    assert_eq!((again.worker_id, again.name.as_str()), (first.worker_id, "gpu-box"));
    assert_ne!(again.session, first.session, "every registration gets its own session");
    // The first session is over: only the latest registration speaks for the worker.
    let stale = Client::new(&app.url).unwrap().with_session(&first).unwrap();
    let beat = shared::api::HeartbeatRequest::default();
    assert_eq!(stale.heartbeat(first.worker_id, &beat).await.unwrap_err().status(), Some(401));
    let stranger = app.client.register(&registration("gpu-box", "key-of-another-box-9876543210")).await.unwrap();
    assert_ne!(stranger.worker_id, first.worker_id);
    assert_eq!(stranger.name, "gpu-box-2");
    assert_eq!(app.client.workers().await.unwrap().len(), 2);
}
