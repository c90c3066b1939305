//! People (issue 29, item 1): a sweep records the user whose token submitted it; only that user
//! or an admin may change it (403 naming the owner), everyone may read everything, and each
//! user's GPU-hours are counted.

use client::{Client, ClientOptions};
use server::auth::Role;
use shared::api::{
    AttemptRecord, ClaimRequest, FinishRequest, GpuUsage, InlineResult, JobId, JobQuery, LogTail, SweepQuery, Whoami,
};
use shared::job::{JobStatus, Outcome};
use testkit::{cpu, cpu_worker, sweep_of, TestApp};

const USER_A: &str = "user-a-token-0123456789";
const USER_B: &str = "user-b-token-0123456789";
const ROOT: &str = "root-token-0123456789ab";
const PLAIN: &str = "plain-token-0123456789";
const WORKER: &str = "worker-token-0123456789";

/// A server with three named users (root an admin), a token without a name, and a worker;
/// its own client is user-a's.
async fn lab() -> TestApp {
    TestApp::spawn_secure(
        |config| {
            let users = format!("user-a:{USER_A},user-b:{USER_B},admin:root:{ROOT},{PLAIN}");
            config.tokens.add_users(&users, "test").unwrap();
            config.tokens.add(Role::Worker, WORKER, "test").unwrap();
        },
        ClientOptions { token: Some(USER_A.into()), ca_pem: None },
    )
    .await
}

fn as_user(app: &TestApp, token: &str) -> Client {
    Client::with_options(&app.url, &ClientOptions { token: Some(token.into()), ca_pem: None }).unwrap()
}

async fn job_ids(client: &Client, sweep: &str) -> Vec<JobId> {
    let query = JobQuery { sweep: Some(sweep.into()), ..JobQuery::default() };
    client.jobs(&query).await.unwrap().jobs.into_iter().map(|job| job.id).collect()
}

#[tokio::test]
async fn sweeps_record_their_owner_and_every_user_reads_every_sweep() {
    let app = lab().await;
    let (user_b, plain) = (as_user(&app, USER_B), as_user(&app, PLAIN));
    app.submit(&sweep_of("grid-a", 2)).await;
    user_b.submit(&sweep_of("grid-b", 3), &Default::default()).await.unwrap();
    plain.submit(&sweep_of("grid-plain", 1), &Default::default()).await.unwrap();

    let whoami = |name: &str, admin| Whoami { name: name.into(), admin, auth_required: true };
    assert_eq!(app.client.whoami().await.unwrap(), whoami("user-a", false));
    assert_eq!(as_user(&app, ROOT).whoami().await.unwrap(), whoami("root", true));
    assert_eq!(plain.whoami().await.unwrap(), whoami("default", false), "a token without a name is `default`");

    // Reading is open: user-b lists everyone's sweeps and jobs, with their owners.
    let owners: Vec<(String, String)> =
        user_b.sweeps().await.unwrap().into_iter().map(|sweep| (sweep.name, sweep.owner)).collect();
    let expected = [("grid-plain", "default"), ("grid-b", "user-b"), ("grid-a", "user-a")];
    assert_eq!(owners, expected.map(|(name, owner)| (name.to_string(), owner.to_string())));
    assert_eq!(user_b.sweep("grid-a").await.unwrap().info.owner, "user-a");
    let a_jobs = user_b.jobs(&JobQuery { sweep: Some("grid-a".into()), ..JobQuery::default() }).await.unwrap();
    assert!(a_jobs.jobs.iter().all(|job| job.owner == "user-a") && a_jobs.total == 2, "{a_jobs:?}");

    // Filtered by owner, on the server: sweeps and jobs.
    let mine = app.client.sweeps_where(&SweepQuery { owner: Some("user-b".into()) }).await.unwrap();
    assert_eq!(mine.iter().map(|sweep| sweep.name.as_str()).collect::<Vec<_>>(), ["grid-b"]);
    let query = JobQuery { owner: Some("user-b".into()), ..JobQuery::default() };
    assert_eq!(app.client.jobs(&query).await.unwrap().total, 3);
    let nobody = app.client.sweeps_where(&SweepQuery { owner: Some("nobody".into()) }).await.unwrap();
    assert!(nobody.is_empty());

    // The worker's token reads nothing of this, as before.
    let worker = as_user(&app, WORKER);
    assert_eq!(worker.whoami().await.unwrap_err().status(), Some(403));
}

#[tokio::test]
async fn another_users_sweep_is_refused_with_its_owner_named_and_an_admin_may_change_it() {
    let app = lab().await;
    let (user_b, root) = (as_user(&app, USER_B), as_user(&app, ROOT));
    app.submit(&sweep_of("grid-a", 2)).await;
    user_b.submit(&sweep_of("grid-b", 2), &Default::default()).await.unwrap();
    let (a_jobs, b_jobs) = (job_ids(&app.client, "grid-a").await, job_ids(&app.client, "grid-b").await);

    let refused = |error: client::ClientError, what: &str| {
        assert_eq!(error.status(), Some(403), "{what}: {error}");
        let text = error.to_string();
        assert!(text.contains("belongs to user-a") && text.contains("grid-a"), "{what}: {text}");
    };
    refused(user_b.cancel_sweep("grid-a").await.unwrap_err(), "cancel a sweep");
    refused(user_b.resume_sweep("grid-a").await.unwrap_err(), "resume");
    refused(user_b.retry_sweep("grid-a").await.unwrap_err(), "retry a sweep");
    refused(user_b.delete_sweep("grid-a").await.unwrap_err(), "remove");
    refused(user_b.cancel_job(a_jobs[0]).await.unwrap_err(), "cancel a job");
    refused(user_b.set_priority(a_jobs[0], 9).await.unwrap_err(), "change a priority");
    refused(user_b.retry_job(a_jobs[0]).await.unwrap_err(), "retry a job");
    refused(user_b.retry_jobs(&[b_jobs[0], a_jobs[1]]).await.unwrap_err(), "retry jobs");
    // A bulk cancel naming one job of another's is refused whole: user-b's own job stays queued.
    refused(user_b.cancel_jobs(&[b_jobs[0], a_jobs[1]]).await.unwrap_err(), "cancel jobs");
    let counts = app.client.overview().await.unwrap().counts;
    assert_eq!((counts.queued, counts.cancelled), (4, 0), "nothing changed");
    assert!(app.client.jobs(&JobQuery::default()).await.unwrap().jobs.iter().all(|job| job.priority == 0));

    // Each changes their own; the admin changes anyone's.
    assert_eq!(user_b.cancel_jobs(&[b_jobs[0]]).await.unwrap().cancelled, 1);
    assert_eq!(app.client.set_priority(a_jobs[0], 5).await.unwrap().priority, 5);
    assert_eq!(root.set_priority(b_jobs[1], 7).await.unwrap().priority, 7);
    assert_eq!(root.cancel_sweep("grid-a").await.unwrap().cancelled, 2);
    assert_eq!(root.retry_job(a_jobs[0]).await.unwrap().status, JobStatus::Queued);
    // The owner changes its own sweep; the admin removes it.
    assert_eq!(app.client.cancel_sweep("grid-a").await.unwrap().cancelled, 1);
    assert_eq!(root.delete_sweep("grid-a").await.unwrap().jobs, 2);
    // And the other way round: user-a may not change user-b's.
    let error = app.client.cancel_job(b_jobs[1]).await.unwrap_err();
    assert_eq!(error.status(), Some(403));
    let expected = format!("job {}'s sweep grid-b belongs to user-b: only user-b or an admin may change it", b_jobs[1]);
    assert_eq!(error.to_string(), expected);
}

#[tokio::test]
async fn without_tokens_every_request_is_the_user_default_who_may_change_everything() {
    let app = TestApp::spawn().await;
    app.submit(&sweep_of("open", 1)).await;
    let me = app.client.whoami().await.unwrap();
    assert_eq!(me, Whoami { name: "default".into(), admin: true, auth_required: false });
    assert_eq!(app.client.sweeps().await.unwrap()[0].owner, "default");
    assert_eq!(app.client.cancel_sweep("open").await.unwrap().cancelled, 1);
}

fn gpu_record(gpu_hours: f64) -> AttemptRecord {
    AttemptRecord {
        exit_code: Some(0),
        outcome: "exited with code 0".into(),
        worker: "w".into(),
        gpu_usage: Some(GpuUsage { gpus: vec![0], samples: 3, gpu_hours, ..GpuUsage::default() }),
        ..AttemptRecord::default()
    }
}

#[tokio::test]
async fn each_users_gpu_hours_are_counted_by_their_sweeps_and_shown_per_user() {
    let app = lab().await;
    let user_b = as_user(&app, USER_B);
    app.submit(&sweep_of("gpu-a", 2)).await;
    user_b.submit(&sweep_of("gpu-b", 1), &Default::default()).await.unwrap();
    let worker = as_user(&app, WORKER);
    let id = worker.register(&cpu_worker("w")).await.unwrap().worker_id;
    let claim = ClaimRequest { capacity: cpu(3), wait_ms: 0, reserve: 0 };
    let jobs = worker.claim(id, &claim).await.unwrap().jobs;
    assert_eq!(jobs.len(), 3);
    // Each record carries GPU time (a finish that is stored on the general path); the first
    // brings its log too. The two users' jobs come by fair share, alternating: each job's hours
    // by its sweep, gpu-a's 0.5 then 0.25, gpu-b's 2.0.
    let mut a_hours = [0.5, 0.25].into_iter();
    let hours: Vec<f64> =
        jobs.iter().map(|job| if job.sweep == "gpu-b" { 2.0 } else { a_hours.next().unwrap() }).collect();
    for (at, (job, hours)) in jobs.iter().zip(hours).enumerate() {
        let finish = FinishRequest {
            job_id: job.id,
            attempt: job.attempt,
            outcome: Outcome::Exited { code: 0 },
            log: (at == 0).then(|| LogTail { offset: 0, data: b"trained\n".to_vec() }),
            metrics: None,
            result: Some(InlineResult { files: Vec::new(), streamed: Vec::new(), record: gpu_record(hours) }),
            notes: Vec::new(),
            claim: None,
        };
        worker.finish(id, &finish).await.unwrap();
    }
    // gpu-a's two (0.5 + 0.25), gpu-b's one (2.0).
    let usage = user_b.usage().await.unwrap();
    let hours: Vec<(&str, f64, f64)> =
        usage.users.iter().map(|user| (user.user.as_str(), user.gpu_hours_24h, user.gpu_hours_7d)).collect();
    assert_eq!(hours, [("default", 0.0, 0.0), ("root", 0.0, 0.0), ("user-a", 0.75, 0.75), ("user-b", 2.0, 2.0)]);

    let metrics = crate::metrics_text(&app, Some(USER_B)).await;
    for line in [
        r#"app_user_gpu_seconds{user="user-a",window="24h"} 2700.0"#,
        r#"app_user_gpu_seconds{user="user-b",window="7d"} 7200.0"#,
        r#"app_user_gpu_seconds{user="root",window="7d"} 0.0"#,
    ] {
        assert!(metrics.contains(line), "{line} missing:\n{metrics}");
    }
}
