//! Reservations for jobs of several GPUs, and backfill (issue 29, item 4): a 4-GPU job that
//! waited `backfill_after_secs` on a worker busy with 1-GPU jobs holds that worker; the GPUs
//! that free go to no other job unless it ends (by its timeout) before the held job could
//! start, and the held job gets the worker once its GPUs are free, ahead of the queue.

use client::{Client, ClientOptions};
use server::auth::Role;
use server::config::ServerConfig;
use shared::api::{
    ClaimRequest, ClaimedJob, FinishRequest, HeartbeatRequest, JobAttempt, RegisterRequest, ReportRequest, SaveNote,
    WorkerId,
};
use shared::fair_share::Quota;
use shared::job::{JobStatus, Outcome};
use shared::placement::Capacity;
use std::time::Duration;
use testkit::{cpu_worker, wait_until, TestApp};

const USER_A: &str = "lend-a-token-0123456789";
const USER_B: &str = "lend-b-token-0123456789";
const WORKER: &str = "lend-worker-token-01234";

/// The worker's capacity with the GPUs `busy` taken (exclusively) and a slot per free GPU.
fn with_busy(busy: &[u32]) -> Capacity {
    let mut capacity = Capacity::idle_gpus(4 - busy.len() as u32, 4, 24 << 30);
    for gpu in capacity.gpus.iter_mut().filter(|gpu| busy.contains(&gpu.index)) {
        gpu.exclusive_held = true;
    }
    capacity
}

#[tokio::test]
async fn a_large_job_holds_a_worker_and_small_ones_backfill_only_what_ends_before_it_starts() {
    let app = TestApp::spawn_with(|config| config.backfill_after = Duration::ZERO).await;
    let register = RegisterRequest { capacity: Capacity::idle_gpus(4, 4, 24 << 30), ..cpu_worker("box") };
    let id: WorkerId = app.client.register(&register).await.unwrap().worker_id;
    let claim = |busy: &[u32]| ClaimRequest { capacity: with_busy(busy), wait_ms: 0, reserve: 0 };
    let finish = |job: &ClaimedJob| FinishRequest::outcome(job.id, job.attempt, Outcome::Exited { code: 0 });
    app.submit("name: small\ncommand: \"true\"\ntimeout: 10m\nresources: {gpus: 1}\ngrid: {i: [0, 1, 2, 3, 4, 5]}\n")
        .await;
    let small = app.client.claim(id, &claim(&[])).await.unwrap().jobs;
    assert_eq!(small.len(), 4);
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    app.submit("name: big\ncommand: \"true\"\nresources: {gpus: 4}\n").await;
    let reserved = wait_until("the big job holds the worker", Duration::from_secs(20), || async {
        app.client.sweep("big").await.unwrap().info.reserved
    })
    .await;
    assert_eq!(reserved.worker, "box");
    // It could start when the four small jobs' 10-minute timeouts end.
    let starts_at = reserved.starts_at.expect("known: every running job has a timeout");
    assert!((starts_at - (started + 600_000)).abs() < 10_000, "{starts_at} vs {started}");
    assert_eq!(app.client.sweeps().await.unwrap().iter().find(|s| s.name == "big").unwrap().reserved, Some(reserved));

    // A small job ends: its GPU is held; the next small job (10 minutes) would end too late.
    app.client.finish(id, &finish(&small[0])).await.unwrap();
    let freed = small[0].placement.gpus.clone();
    let busy: Vec<u32> = (0..4).filter(|gpu| !freed.contains(gpu)).collect();
    assert!(app.client.claim(id, &claim(&busy)).await.unwrap().jobs.is_empty(), "the GPU is held for big");
    // A one-minute job ends before big could start: it backfills the held GPU.
    app.submit("name: quick\ncommand: \"true\"\ntimeout: 1m\nresources: {gpus: 1}\n").await;
    let lent = app.client.claim(id, &claim(&busy)).await.unwrap().jobs;
    assert_eq!(lent.iter().map(|job| job.sweep.as_str()).collect::<Vec<_>>(), ["quick"]);

    // Everything on the worker ends: big starts there, ahead of the two small jobs queued first.
    for job in small[1..].iter().chain(&lent) {
        app.client.finish(id, &finish(job)).await.unwrap();
    }
    // (With one job slot left: the held job takes it.)
    let one_slot = ClaimRequest { capacity: Capacity { job_slots: 1, ..with_busy(&[]) }, wait_ms: 0, reserve: 0 };
    let next = app.client.claim(id, &one_slot).await.unwrap().jobs;
    assert_eq!(next.first().map(|job| (job.sweep.as_str(), job.placement.gpus.len())), Some(("big", 4)), "{next:?}");
    assert_eq!(next.len(), 1, "all four GPUs are big's");
    wait_until("the reservation is gone", Duration::from_secs(20), || async {
        app.client.sweep("big").await.unwrap().info.reserved.is_none().then_some(())
    })
    .await;
}

/// A server with users `user-a` (its own client) and `user-b` and a worker token, holding a
/// worker for a large job at once, set up further by `tweak`; user-b's client and the
/// worker's.
async fn two_users(tweak: impl FnOnce(&mut ServerConfig)) -> (TestApp, Client, Client) {
    let app = TestApp::spawn_secure(
        |config| {
            config.tokens.add_users(&format!("user-a:{USER_A},user-b:{USER_B}"), "test").unwrap();
            config.tokens.add(Role::Worker, WORKER, "test").unwrap();
            config.backfill_after = Duration::ZERO;
            tweak(config);
        },
        ClientOptions { token: Some(USER_A.into()), ca_pem: None },
    )
    .await;
    let (user_b, worker) = (as_token(&app, USER_B), as_token(&app, WORKER));
    (app, user_b, worker)
}

fn as_token(app: &TestApp, token: &str) -> Client {
    Client::with_options(&app.url, &ClientOptions { token: Some(token.into()), ca_pem: None }).unwrap()
}

/// The worker reports `job` ended well.
async fn succeed(worker: &Client, id: WorkerId, job: &ClaimedJob) {
    worker.finish(id, &FinishRequest::outcome(job.id, job.attempt, Outcome::Exited { code: 0 })).await.unwrap();
}

/// user-a's 10-minute jobs on `box` (4 GPUs) as many as `claim` gives, then user-b's 4-GPU job
/// holding `box`; returns the worker's id and user-a's running jobs.
async fn held_box(app: &TestApp, user_b: &Client, worker: &Client) -> (WorkerId, Vec<ClaimedJob>) {
    let register = RegisterRequest { capacity: Capacity::idle_gpus(4, 4, 24 << 30), ..cpu_worker("box") };
    let id = worker.register(&register).await.unwrap().worker_id;
    app.submit("name: small\ncommand: \"true\"\ntimeout: 10m\nresources: {gpus: 1}\ngrid: {i: [0, 1, 2, 3, 4, 5]}\n")
        .await;
    let small =
        worker.claim(id, &ClaimRequest { capacity: with_busy(&[]), wait_ms: 0, reserve: 0 }).await.unwrap().jobs;
    user_b.submit("name: big\ncommand: \"true\"\nresources: {gpus: 4}\n", &Default::default()).await.unwrap();
    wait_until("the big job holds the worker", Duration::from_secs(20), || async {
        app.client.sweep("big").await.unwrap().info.reserved
    })
    .await;
    (id, small)
}

fn busy_with(jobs: &[ClaimedJob]) -> Vec<u32> {
    jobs.iter().flat_map(|job| job.placement.gpus.clone()).collect()
}

#[tokio::test]
async fn a_held_worker_lends_its_gpus_in_fair_share_order() {
    let (app, user_b, worker) = two_users(|_| {}).await;
    let (id, small) = held_box(&app, &user_b, &worker).await;
    assert_eq!(small.len(), 4);
    // user-a's one-minute job is queued before user-b's.
    app.submit("name: quick-a\ncommand: \"true\"\ntimeout: 1m\nresources: {gpus: 1}\n").await;
    user_b
        .submit("name: quick-b\ncommand: \"true\"\ntimeout: 1m\nresources: {gpus: 1}\n", &Default::default())
        .await
        .unwrap();
    succeed(&worker, id, &small[0]).await;
    let claim = ClaimRequest { capacity: with_busy(&busy_with(&small[1..])), wait_ms: 0, reserve: 0 };
    let lent = worker.claim(id, &claim).await.unwrap().jobs;
    // user-a holds three GPUs, user-b none: the GPU goes to user-b.
    assert_eq!(lent.iter().map(|job| job.sweep.as_str()).collect::<Vec<_>>(), ["quick-b"]);
}

#[tokio::test]
async fn a_held_worker_lends_under_quotas_and_never_past_one() {
    let (app, user_b, worker) = two_users(|config| {
        config.shares.quotas.insert("user-a".into(), Quota { max_gpus: Some(3), max_running: None });
    })
    .await;
    let (id, small) = held_box(&app, &user_b, &worker).await;
    assert_eq!(small.len(), 3, "user-a's quota");
    app.submit("name: quick-a\ncommand: \"true\"\ntimeout: 1m\nresources: {gpus: 1}\ngrid: {i: [0, 1]}\n").await;
    let claim =
        |running: &[ClaimedJob]| ClaimRequest { capacity: with_busy(&busy_with(running)), wait_ms: 0, reserve: 0 };
    // One GPU free, but user-a holds 3 of 3.
    assert!(worker.claim(id, &claim(&small)).await.unwrap().jobs.is_empty());
    // Two free once a job ends: one lent, as user-a then holds 3 again.
    succeed(&worker, id, &small[0]).await;
    let lent = worker.claim(id, &claim(&small[1..])).await.unwrap().jobs;
    assert_eq!(lent.iter().map(|job| job.sweep.as_str()).collect::<Vec<_>>(), ["quick-a"]);
}

#[tokio::test]
async fn a_worker_is_held_only_for_the_highest_class_waiting() {
    const BOSS: &str = "lend-boss-token-01234567";
    let (app, user_b, worker) = two_users(|config| {
        config.tokens.add_users(&format!("admin:boss:{BOSS}"), "test").unwrap();
        config.priority_classes = [("urgent".to_string(), 100)].into();
    })
    .await;
    let (id, small) = held_box(&app, &user_b, &worker).await;
    // The admin's urgent one-GPU job declares no timeout: a held GPU would never be lent to it.
    let boss = as_token(&app, BOSS);
    let rush = "name: rush\ncommand: \"true\"\npriority_class: urgent\nresources: {gpus: 1}\n";
    boss.submit(rush, &Default::default()).await.unwrap();
    wait_until("the hold is let go while urgent work waits", Duration::from_secs(20), || async {
        app.client.sweep("big").await.unwrap().info.reserved.is_none().then_some(())
    })
    .await;
    // The GPU a small job frees goes to the urgent job, ahead of user-a's queued ones.
    succeed(&worker, id, &small[0]).await;
    let claim = ClaimRequest { capacity: with_busy(&busy_with(&small[1..])), wait_ms: 0, reserve: 0 };
    let freed = worker.claim(id, &claim).await.unwrap().jobs;
    assert_eq!(freed.iter().map(|job| job.sweep.as_str()).collect::<Vec<_>>(), ["rush"]);
    // No urgent work waits now: the large job holds the worker again.
    wait_until("the large job holds the worker again", Duration::from_secs(20), || async {
        app.client.sweep("big").await.unwrap().info.reserved
    })
    .await;
}

/// user-a's heartbeat for `jobs` on `id`, telling the saves its worker saw: each `(job, saved
/// ms ago, every ms)`; the jobs it is told to preempt.
async fn beat(worker: &Client, id: WorkerId, jobs: &[&ClaimedJob], saves: &[(&ClaimedJob, i64, i64)]) -> Vec<i64> {
    let attempt = |job: &ClaimedJob| JobAttempt { job_id: job.id, attempt: job.attempt };
    let now = server::db::now_ms();
    let saves =
        saves.iter().map(|(job, ago, every)| SaveNote { attempt: attempt(job), at: now - ago, every_ms: Some(*every) });
    let heartbeat = HeartbeatRequest {
        running: jobs.iter().map(|job| attempt(job)).collect(),
        gpus: Vec::new(),
        saves: saves.collect(),
    };
    let mut told: Vec<i64> =
        worker.heartbeat(id, &heartbeat).await.unwrap().preempt.iter().map(|at| at.job_id.get()).collect();
    told.sort_unstable();
    told
}

#[tokio::test]
async fn a_held_worker_drains_at_its_jobs_last_saves_before_the_room_is_complete() {
    let (app, user_b, worker) = two_users(|config| {
        config.min_runtime = Duration::ZERO;
        config.reaper_interval = Duration::from_millis(100);
    })
    .await;
    let register = RegisterRequest { capacity: Capacity::idle_gpus(4, 4, 24 << 30), ..cpu_worker("box") };
    let id = worker.register(&register).await.unwrap().worker_id;
    let yaml = "name: small\ncommand: \"true\"\npreemptible: true\ntimeout: 1h\nresources: {gpus: 1}\ngrid: {i: [0, 1, 2, 3]}\n";
    app.submit(yaml).await;
    let small =
        worker.claim(id, &ClaimRequest { capacity: with_busy(&[]), wait_ms: 0, reserve: 0 }).await.unwrap().jobs;
    assert_eq!(small.len(), 4);
    let all: Vec<&ClaimedJob> = small.iter().collect();
    // Every heartbeat tells the saves as of its own time (a loaded machine's delays move
    // nothing): two save every 20 s and are due in 5 s (within the worker's wait, half the
    // 120 s grace); the third saves every 10 minutes and is due in 1 s, or in 8 minutes; the
    // last never saved.
    let often = [(&small[0], 15_000, 20_000), (&small[1], 15_000, 20_000)];
    let with_third = |ago: i64| [often[0], often[1], (&small[2], ago, 600_000)];
    assert!(beat(&worker, id, &all, &with_third(599_000)).await.is_empty());
    // user-b's 4-GPU job is above user-b's share (2 of 4): only the hold makes room for it.
    user_b.submit("name: big\ncommand: \"true\"\nresources: {gpus: 4}\n", &Default::default()).await.unwrap();
    let hold = wait_until("the big job holds the worker", Duration::from_secs(20), || async {
        app.client.sweep("big").await.unwrap().info.reserved
    })
    .await;
    assert!(hold.starts_at.is_some(), "known by the running jobs' timeouts: {hold:?}");
    // No pass (ten a second) stops any job while it would not bring the start closer:
    // (1) the job that never saved stands between the free GPUs and the need, though the three
    // others are due; (2) once it ended, the third's save is 8 minutes away, and the two due
    // now will save again before then.
    for (phase, jobs, third_ago) in [(1, &all[..], 599_000), (2, &all[..3], 120_000)] {
        if phase == 2 {
            // (The third's save as phase 2 has it before the fourth ends: no pass between the
            // two sees the three due with room for them.)
            beat(&worker, id, &all, &with_third(third_ago)).await;
            succeed(&worker, id, &small[3]).await;
        }
        let deadline = std::time::Instant::now() + Duration::from_millis(1_500);
        while std::time::Instant::now() < deadline {
            assert_eq!(beat(&worker, id, jobs, &with_third(third_ago)).await, Vec::<i64>::new(), "phase {phase}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // Meanwhile big starts when the drain completes its room (the third's save, 8 minutes
    // away), not when the jobs' one-hour timeouts end: only jobs that end by then borrow GPUs.
    let by_timeouts = hold.starts_at.unwrap();
    wait_until("the hold starts when the drain completes", Duration::from_secs(20), || async {
        beat(&worker, id, &all[..3], &with_third(120_000)).await;
        let at = app.client.sweep("big").await.unwrap().info.reserved?.starts_at?;
        let complete = server::db::now_ms() + 480_000;
        ((complete - at).abs() < 30_000 && at < by_timeouts - 1_800_000).then_some(())
    })
    .await;
    // The third's save is due: all three are stopped at their saves, for big.
    let stopped = wait_until("the pass drains the held worker", Duration::from_secs(20), || async {
        let told = beat(&worker, id, &all[..3], &with_third(599_000)).await;
        (!told.is_empty()).then_some(told)
    })
    .await;
    assert_eq!(stopped, small[..3].iter().map(|job| job.id.get()).collect::<Vec<_>>());
    // Stopped, they go back to the queue; big gets the worker.
    for job in &small[..3] {
        let report = ReportRequest { worker_id: id, attempt: job.attempt, outcome: Outcome::Preempted };
        assert_eq!(worker.report(job.id, &report).await.unwrap().status, JobStatus::Queued);
        let reason = app.client.job_attempts(job.id).await.unwrap()[0].reason.clone();
        assert_eq!(reason.as_deref(), Some("preempted for user-b's sweep big"));
    }
    let next = worker.claim(id, &ClaimRequest { capacity: with_busy(&[]), wait_ms: 0, reserve: 0 }).await.unwrap().jobs;
    assert_eq!(next.first().map(|job| (job.sweep.as_str(), job.placement.gpus.len())), Some(("big", 4)), "{next:?}");
}
