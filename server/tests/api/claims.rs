//! Claiming: atomic hand-out under concurrency, priority order, long-poll, placement fit.

use shared::api::{ClaimRequest, JobId, JobQuery};
use shared::job::JobStatus;
use shared::placement::{Capacity, GpuSlot};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use testkit::{cpu, sweep_of, TestApp};
use tokio::sync::Barrier;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_concurrent_claimers_get_a_thousand_distinct_jobs() {
    let app = Arc::new(TestApp::spawn().await);
    app.submit(&sweep_of("race", 1000)).await;
    let start = Arc::new(Barrier::new(32));
    let mut claimers = Vec::new();
    for number in 0..32 {
        let app = app.clone();
        let start = start.clone();
        claimers.push(tokio::spawn(async move {
            let worker = app.register(&format!("claimer-{number}"), 4).await;
            start.wait().await;
            let mut mine = Vec::new();
            loop {
                let jobs = app.claim(worker, 4).await;
                if jobs.is_empty() {
                    return mine;
                }
                mine.extend(jobs.iter().map(|job| (job.id, job.attempt)));
            }
        }));
    }
    let mut all: Vec<(JobId, u32)> = Vec::new();
    for claimer in claimers {
        all.extend(claimer.await.unwrap());
    }
    let distinct: HashSet<JobId> = all.iter().map(|(id, _)| *id).collect();
    assert_eq!(all.len(), 1000, "every job claimed exactly once");
    assert_eq!(distinct.len(), 1000);
    assert!(all.iter().all(|(_, attempt)| *attempt == 1));
    let running = JobQuery { status: Some(JobStatus::Running), limit: Some(1), ..JobQuery::default() };
    assert_eq!(app.client.jobs(&running).await.unwrap().total, 1000);
}

#[tokio::test]
async fn higher_priority_jobs_are_claimed_first_then_oldest() {
    let app = TestApp::spawn().await;
    app.submit(&sweep_of("low", 3)).await;
    app.submit("name: high\ncommand: \"true\"\npriority: 5\ngrid:\n  i: [0, 1]\n").await;
    let worker = app.register("w", 1).await;
    let order: Vec<(String, u64)> = {
        let mut order = Vec::new();
        for _ in 0..5 {
            let job = app.claim(worker, 1).await.pop().unwrap();
            order.push((job.sweep, job.index));
        }
        order
    };
    let expected = [("high", 0), ("high", 1), ("low", 0), ("low", 1), ("low", 2)];
    let expected: Vec<(String, u64)> = expected.iter().map(|(sweep, index)| (sweep.to_string(), *index)).collect();
    assert_eq!(order, expected);
    // Raising a queued job's priority moves it to the front.
    app.submit(&sweep_of("later", 3)).await;
    let last = app.client.jobs(&JobQuery { sweep: Some("later".into()), ..JobQuery::default() }).await.unwrap();
    app.client.set_priority(last.jobs[2].id, 100).await.unwrap();
    assert_eq!(app.claim(worker, 1).await[0].id, last.jobs[2].id);
}

#[tokio::test]
async fn a_parked_claim_returns_as_soon_as_a_job_is_submitted() {
    let app = Arc::new(TestApp::spawn().await);
    let worker = app.register("poller", 1).await;
    let claimer = {
        let app = app.clone();
        tokio::spawn(async move {
            let request = ClaimRequest { capacity: cpu(1), wait_ms: 20_000, reserve: 0 };
            let response = app.client.claim(worker, &request).await.unwrap();
            (Instant::now(), response.jobs)
        })
    };
    // The claim is parked once the server has seen the worker poll; give it a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!claimer.is_finished(), "an idle claim waits instead of returning empty");
    let submitted = Instant::now();
    app.submit(&sweep_of("wake", 1)).await;
    let (claimed_at, jobs) = tokio::time::timeout(Duration::from_secs(5), claimer).await.unwrap().unwrap();
    assert_eq!(jobs.len(), 1);
    assert!(claimed_at.duration_since(submitted) < Duration::from_secs(2), "woken, not timed out");
}

#[tokio::test]
async fn an_empty_long_poll_returns_empty_after_its_wait() {
    let app = TestApp::spawn().await;
    let worker = app.register("idle", 1).await;
    let started = Instant::now();
    let response =
        app.client.claim(worker, &ClaimRequest { capacity: cpu(1), wait_ms: 300, reserve: 0 }).await.unwrap();
    assert!(response.jobs.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn claims_hand_out_only_what_the_worker_can_place() {
    let app = TestApp::spawn().await;
    app.submit("name: two-gpu\ncommand: \"true\"\nresources: {gpus: 2}\n").await;
    app.submit("name: packed\ncommand: \"true\"\nresources: {gpus: 1, gpu_memory: 8GiB}\ngrid: {i: [1, 2, 3, 4, 5]}\n")
        .await;
    let worker = app.register("gpu-box", 8).await;
    let one_gpu = one_gpu(8, 24, 0);
    let jobs =
        app.client.claim(worker, &ClaimRequest { capacity: one_gpu, wait_ms: 0, reserve: 0 }).await.unwrap().jobs;
    assert_eq!(jobs.len(), 3, "three 8 GiB jobs fit on one 24 GiB GPU; the 2-GPU job does not fit at all");
    assert!(jobs.iter().all(|job| job.sweep == "packed" && job.placement.gpus == [0]));
    let queued = app.client.jobs(&JobQuery { status: Some(JobStatus::Queued), ..JobQuery::default() }).await.unwrap();
    assert_eq!(queued.total, 3);
}

#[tokio::test]
async fn an_explicitly_exclusive_job_never_shares_its_gpu() {
    let app = TestApp::spawn().await;
    let yaml =
        "name: alone\ncommand: \"true\"\nresources: {gpus: 1, gpu_memory: 4GiB, exclusive: true}\ngrid: {i: [1, 2]}\n";
    app.submit(yaml).await;
    let worker = app.register("one-gpu", 4).await;
    let capacity = one_gpu(4, 24, 0);
    let jobs = app.client.claim(worker, &ClaimRequest { capacity, wait_ms: 0, reserve: 0 }).await.unwrap().jobs;
    assert_eq!(jobs.len(), 1, "two exclusive jobs were handed out for one GPU");
    assert_eq!(jobs[0].resources.exclusive, Some(true));
}

#[tokio::test]
async fn jobs_that_fit_are_found_behind_a_long_run_of_jobs_that_do_not() {
    let app = TestApp::spawn().await;
    let axis = (0..40).map(|i| i.to_string()).collect::<Vec<_>>().join(", ");
    app.submit(&format!("name: blocked\ncommand: \"true\"\nresources: {{gpus: 1}}\ngrid: {{i: [{axis}]}}\n")).await;
    app.submit("name: cpu\ncommand: \"true\"\nresources: {gpus: 0}\ngrid: {i: [1, 2]}\n").await;
    let worker = app.register("busy-gpu", 4).await;
    // The only GPU already runs a shared job: no exclusive job fits, CPU jobs do.
    let capacity = one_gpu(4, 20, 1);
    let jobs = app.client.claim(worker, &ClaimRequest { capacity, wait_ms: 0, reserve: 0 }).await.unwrap().jobs;
    let sweeps: Vec<&str> = jobs.iter().map(|job| job.sweep.as_str()).collect();
    assert_eq!(sweeps, ["cpu", "cpu"]);
}

/// A worker with one 24 GiB GPU, `free_gib` of it free and `shared_jobs` on it.
fn one_gpu(job_slots: u32, free_gib: u64, shared_jobs: u32) -> Capacity {
    let gib = 1u64 << 30;
    Capacity {
        job_slots,
        gpus: vec![GpuSlot {
            index: 0,
            memory_total: 24 * gib,
            memory_free: free_gib * gib,
            exclusive_held: false,
            shared_jobs,
        }],
        ..Capacity::default()
    }
}

/// A thousand workers behind one address (NAT, an ingress): their long polls, each on a
/// connection of its own, are all answered; the per-address cap (256) counts only connections
/// that hold without use, never workers using theirs. Health answers meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_workers_behind_one_address_are_all_served() {
    const WORKERS: usize = 1000;
    let app = Arc::new(TestApp::spawn().await);
    assert_eq!(app.config.max_connections_per_address, 256);
    let mut workers = Vec::new();
    for number in 0..WORKERS {
        let worker = app.register(&format!("nat-{number}"), 1).await;
        // A client of its own: a connection of its own, as a worker on another box has.
        let client = client::Client::new(&app.url).unwrap();
        let response = app.registered.lock().unwrap().last().unwrap().clone();
        client.remember_session(&response).unwrap();
        workers.push((worker, Arc::new(client)));
    }
    let claim_all = |wait_ms: u64| {
        let mut claims = tokio::task::JoinSet::new();
        for (worker, client) in &workers {
            let (worker, client) = (*worker, client.clone());
            claims.spawn(async move {
                let request = ClaimRequest { capacity: testkit::cpu(1), wait_ms, reserve: 0 };
                client.claim(worker, &request).await
            });
        }
        claims
    };
    // Every worker parked at once: 1,000 long polls from 127.0.0.1.
    let started = Instant::now();
    let mut parked = claim_all(2_000);
    let asked = Instant::now();
    assert_eq!(app.client.health().await.unwrap().status, "ok");
    assert!(asked.elapsed() < Duration::from_secs(1), "health took {:?}", asked.elapsed());
    let mut answered = 0;
    while let Some(claim) = parked.join_next().await {
        let response = claim.unwrap().expect("a long poll was refused or cut");
        assert!(response.jobs.is_empty());
        answered += 1;
    }
    assert_eq!(answered, WORKERS);
    assert!(started.elapsed() < Duration::from_secs(30), "the long polls took {:?}", started.elapsed());
    // And all at once again with work for each: 1,000 distinct jobs.
    app.submit(&sweep_of("nat", WORKERS)).await;
    let mut claims = claim_all(5_000);
    let mut jobs = HashSet::new();
    while let Some(claim) = claims.join_next().await {
        for job in claim.unwrap().expect("a claim was refused or cut").jobs {
            assert!(jobs.insert(job.id), "job {} handed out twice", job.id);
        }
    }
    assert_eq!(jobs.len(), WORKERS);
}
