//! Fair share at claim time (issue 29, item 2): with several users waiting, each free place goes
//! to the user furthest below their share (usage over weight); quotas hold a user back at
//! claim time, and the sweep listing says why. Claims through the typed client, as a worker
//! makes them.

use client::{Client, ClientOptions};
use server::auth::Role;
use server::config::ServerConfig;
use shared::api::{AttemptRecord, ClaimRequest, ClaimedJob, FinishRequest, GpuUsage, InlineResult, WorkerId};
use shared::fair_share::Quota;
use shared::job::Outcome;
use shared::placement::Capacity;
use std::time::{Duration, Instant};
use testkit::{cpu, cpu_worker, sweep_of, TestApp};

const USER_A: &str = "share-a-token-0123456789";
const USER_B: &str = "share-b-token-0123456789";
const WORKER: &str = "share-worker-token-01234";

/// A server with users `user-a` and `user-b` and a worker token, set up further by `tweak`;
/// its own client is user-a's.
async fn lab(tweak: impl FnOnce(&mut ServerConfig)) -> TestApp {
    TestApp::spawn_secure(
        |config| {
            config.tokens.add_users(&format!("user-a:{USER_A},user-b:{USER_B}"), "test").unwrap();
            config.tokens.add(Role::Worker, WORKER, "test").unwrap();
            tweak(config);
        },
        ClientOptions { token: Some(USER_A.into()), ca_pem: None },
    )
    .await
}

fn as_token(app: &TestApp, token: &str) -> Client {
    Client::with_options(&app.url, &ClientOptions { token: Some(token.into()), ca_pem: None }).unwrap()
}

struct Worker {
    client: Client,
    id: WorkerId,
}

impl Worker {
    async fn register(app: &TestApp) -> Worker {
        Self::register_as(app, "w").await
    }

    async fn register_as(app: &TestApp, name: &str) -> Worker {
        let client = as_token(app, WORKER);
        let id = client.register(&cpu_worker(name)).await.unwrap().worker_id;
        Worker { client, id }
    }

    async fn claim(&self, capacity: Capacity) -> Vec<ClaimedJob> {
        self.client.claim(self.id, &ClaimRequest { capacity, wait_ms: 0, reserve: 0 }).await.unwrap().jobs
    }

    async fn finish(&self, job: &ClaimedJob, record: Option<AttemptRecord>) {
        let finish = FinishRequest {
            result: record.map(|record| InlineResult { files: Vec::new(), streamed: Vec::new(), record }),
            ..FinishRequest::outcome(job.id, job.attempt, Outcome::Exited { code: 0 })
        };
        self.client.finish(self.id, &finish).await.unwrap();
    }
}

/// How many of `jobs` are of each sweep: (`grid-a`'s, `grid-b`'s).
fn split(jobs: &[ClaimedJob]) -> (usize, usize) {
    let of = |name: &str| jobs.iter().filter(|job| job.sweep == name).count();
    (of("grid-a"), of("grid-b"))
}

/// A worker's capacity of `gpus` free GPUs and as many slots.
fn gpus(count: u32) -> Capacity {
    Capacity::idle_gpus(count, count, 24 << 30)
}

#[tokio::test]
async fn a_user_alone_gets_every_place_and_a_second_one_catches_up() {
    let app = lab(|_| {}).await;
    let user_b = as_token(&app, USER_B);
    let worker = Worker::register(&app).await;
    app.submit(&sweep_of("grid-a", 12)).await;
    assert_eq!(split(&worker.claim(cpu(2)).await), (2, 0), "alone, user-a takes what is free");
    user_b.submit(&sweep_of("grid-b", 12), &Default::default()).await.unwrap();
    // user-a holds two running jobs (each counts a minute at least); user-b none: user-b gets
    // places until it stands as user-a does, then they alternate.
    assert_eq!(split(&worker.claim(cpu(4)).await), (1, 3));
    assert_eq!(split(&worker.claim(cpu(2)).await), (1, 1), "equal standing: one each");
    // Within a user, today's order holds: priority, then submission.
    let claimed = worker.claim(cpu(2)).await;
    let indices: Vec<(String, u64)> = claimed.iter().map(|job| (job.sweep.clone(), job.index)).collect();
    assert_eq!(indices, [("grid-a".to_string(), 4), ("grid-b".to_string(), 4)]);
}

#[tokio::test]
async fn weights_split_the_places_and_recorded_gpu_time_counts_against_its_user() {
    let app = lab(|config| {
        config.shares.weights.insert("user-b".into(), 3.0);
    })
    .await;
    let user_b = as_token(&app, USER_B);
    let worker = Worker::register(&app).await;
    app.submit(&sweep_of("grid-a", 20)).await;
    user_b.submit(&sweep_of("grid-b", 20), &Default::default()).await.unwrap();
    let first = worker.claim(cpu(8)).await;
    assert_eq!(split(&first), (2, 6), "user-b weighs 3: three places in four");
    for job in &first {
        worker.finish(job, None).await;
    }
    // An hour of GPU time recorded for user-a's next run puts user-a behind by that much:
    // user-b (weight 3) gets every place until its own use passes an hour over 3.
    let a_job = worker.claim(cpu(8)).await.into_iter().find(|job| job.sweep == "grid-a").unwrap();
    let record = AttemptRecord {
        exit_code: Some(0),
        outcome: "exited with code 0".into(),
        worker: "w".into(),
        gpu_usage: Some(GpuUsage { gpus: vec![0], samples: 3, gpu_hours: 1.0, ..GpuUsage::default() }),
        ..AttemptRecord::default()
    };
    worker.finish(&a_job, Some(record)).await;
    let next = worker.claim(cpu(4)).await;
    assert_eq!(split(&next), (0, 4), "{next:?}");
    // A fresh server reads it from what is stored (`user_gpu_usage`), decayed by its age.
    let app = app.restart().await;
    let worker = Worker::register(&app).await;
    assert_eq!(split(&worker.claim(cpu(2)).await), (0, 2), "user-a's hour still counts");
}

/// A record of an attempt without GPUs that held its job slot for `seconds`.
fn slot_record(seconds: i64) -> AttemptRecord {
    let finished_at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    AttemptRecord {
        exit_code: Some(0),
        outcome: "exited with code 0".into(),
        worker: "w".into(),
        started_at: finished_at - seconds * 1000,
        finished_at,
        ..AttemptRecord::default()
    }
}

async fn fast_finishes(app: &TestApp) -> f64 {
    let metrics = reqwest::Client::new().get(format!("{}/metrics", app.url)).bearer_auth(USER_A).send().await.unwrap();
    let text = metrics.error_for_status().unwrap().text().await.unwrap();
    let name = "app_finishes_total{path=\"fast\"}";
    let line = text.lines().find(|line| line.starts_with(name));
    line.map_or(0.0, |line| line.rsplit(' ').next().unwrap().parse().unwrap())
}

#[tokio::test]
async fn jobs_without_gpus_count_the_time_they_held_their_slots_on_either_finish_path() {
    const USER_C: &str = "share-c-token-0123456789";
    let app = lab(|config| config.tokens.add_users(&format!("user-c:{USER_C}"), "test").unwrap()).await;
    let (user_b, user_c) = (as_token(&app, USER_B), as_token(&app, USER_C));
    let worker = Worker::register(&app).await;
    app.submit(&sweep_of("grid-a", 20)).await;
    user_b.submit(&sweep_of("grid-b", 20), &Default::default()).await.unwrap();
    user_c.submit(&sweep_of("grid-c", 20), &Default::default()).await.unwrap();
    let running = worker.claim(cpu(6)).await;
    let of = |sweep: &str| running.iter().filter(|job| job.sweep == sweep).collect::<Vec<_>>();
    let (of_a, of_b, of_c) = (of("grid-a"), of("grid-b"), of("grid-c"));
    assert_eq!((of_a.len(), of_b.len(), of_c.len()), (2, 2, 2));
    // The first finish of each sweep goes the general path (which caches the sweep).
    for job in [of_a[0], of_b[0], of_c[0]] {
        worker.finish(job, None).await;
    }
    // 110 s of user-b's slot time, stored with a log: the general path.
    let with_log = FinishRequest {
        log: Some(shared::api::LogTail { offset: 0, data: b"done\n".to_vec() }),
        result: Some(InlineResult { files: Vec::new(), streamed: Vec::new(), record: slot_record(110) }),
        ..FinishRequest::outcome(of_b[1].id, of_b[1].attempt, Outcome::Exited { code: 0 })
    };
    worker.client.finish(worker.id, &with_log).await.unwrap();
    // 200 s of user-a's through the finish+claim step (bare: its record alone).
    let fast = fast_finishes(&app).await;
    worker.finish(of_a[1], Some(slot_record(200))).await;
    assert_eq!(fast_finishes(&app).await, fast + 1.0, "the bare finish took the step");
    worker.finish(of_c[1], None).await;
    // Kept across a restart (the step's slot time is added before the server stops). Nothing
    // runs: user-a stands at 200 s, user-b at 110, user-c at 0, and each job chosen adds its
    // minute: c (60), c (120), b (170), c (180), b (230), c.
    let app = app.restart().await;
    let worker = Worker::register(&app).await;
    let claimed = worker.claim(cpu(6)).await;
    let count = |sweep: &str| claimed.iter().filter(|job| job.sweep == sweep).count();
    assert_eq!((count("grid-a"), count("grid-b"), count("grid-c")), (0, 2, 4), "{claimed:?}");
}

#[tokio::test]
async fn quotas_hold_a_user_back_at_claim_time_and_the_listing_says_why() {
    let app = lab(|config| {
        config.shares.quotas.insert("user-a".into(), Quota { max_gpus: Some(3), max_running: None });
        config.shares.default_quota = Quota { max_gpus: None, max_running: Some(2) };
    })
    .await;
    let user_b = as_token(&app, USER_B);
    let worker = Worker::register(&app).await;
    app.submit("name: grid-a\ncommand: \"true\"\nresources: {gpus: 1}\ngrid: {i: [0, 1, 2, 3, 4, 5]}\n").await;
    // Alone on 4 free GPUs, user-a gets its quota's 3.
    let held = worker.claim(gpus(4)).await;
    assert_eq!(split(&held), (3, 0));
    let listed = app.client.sweeps().await.unwrap();
    assert_eq!(listed[0].held_back.as_deref(), Some("user-a holds 3 of 3 allowed GPUs"));
    assert_eq!(app.client.sweep("grid-a").await.unwrap().info.held_back, listed[0].held_back);
    // Nothing more for user-a while it holds them, even on a second free box.
    assert!(worker.claim(gpus(4)).await.is_empty());

    // user-b has the default quota: 2 running jobs (CPU ones count too).
    user_b.submit(&sweep_of("grid-b", 4), &Default::default()).await.unwrap();
    assert_eq!(split(&worker.claim(cpu(4)).await), (0, 2));
    let listed = app.client.sweeps().await.unwrap();
    let held_back: Vec<(&str, Option<&str>)> =
        listed.iter().map(|sweep| (sweep.name.as_str(), sweep.held_back.as_deref())).collect();
    assert_eq!(
        held_back,
        [("grid-b", Some("user-b runs 2 of 2 allowed jobs")), ("grid-a", Some("user-a holds 3 of 3 allowed GPUs"))]
    );

    // A finished run frees its place under the quota.
    worker.finish(&held[0], None).await;
    assert_eq!(split(&worker.claim(gpus(4)).await), (1, 0));
    let after = app.client.sweep("grid-a").await.unwrap().info;
    assert_eq!(after.held_back.as_deref(), Some("user-a holds 3 of 3 allowed GPUs"));
}

#[tokio::test]
async fn a_job_that_ends_wakes_the_claims_waiting_for_room_under_a_quota() {
    let app = lab(|config| {
        config.shares.default_quota = Quota { max_gpus: None, max_running: Some(1) };
    })
    .await;
    let (first, second) = (Worker::register_as(&app, "first").await, Worker::register_as(&app, "second").await);
    app.submit(&sweep_of("grid-a", 2)).await;
    let running = first.claim(cpu(2)).await;
    assert_eq!(running.len(), 1, "one job at a time for user-a");
    // The second worker parks its claim: nothing queued is claimable while user-a runs one.
    let request = ClaimRequest { capacity: cpu(1), wait_ms: 20_000, reserve: 0 };
    let parked = {
        let (client, id) = (second.client.clone(), second.id);
        tokio::spawn(async move { client.claim(id, &request).await.unwrap().jobs })
    };
    // Parked once the server has seen the poll (as claims.rs's parked-claim test): a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!parked.is_finished(), "a claim with no room waits");
    let finished = Instant::now();
    first.finish(&running[0], None).await;
    let jobs = tokio::time::timeout(Duration::from_secs(10), parked).await.expect("woken by the finish").unwrap();
    assert_eq!(jobs.len(), 1, "the room the finish made went to the parked claim");
    assert!(finished.elapsed() < Duration::from_secs(5), "woken, not timed out");
}
