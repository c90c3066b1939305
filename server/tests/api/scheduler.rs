//! The scheduler's preemption pass (issue 29, item 3): when a user below their share waits
//! and no GPU is free, the youngest preemptible jobs of a user above theirs are ordered to
//! stop, through their worker's heartbeat, saying whose sweep they make room for; the GPUs
//! they free go to the waiting user at the next claim. Which jobs are preemptible: the sweep
//! says, or else (the server's default) those that have stored a checkpoint.

use client::{Client, ClientOptions};
use server::auth::Role;
use shared::api::{
    ClaimRequest, ClaimedJob, HeartbeatRequest, JobAttempt, RegisterRequest, ReportRequest, SaveNote, WorkerId,
};
use shared::job::{JobStatus, Outcome};
use shared::placement::Capacity;
use std::time::Duration;
use testkit::{cpu_worker, wait_until, TestApp};

const USER_A: &str = "sched-a-token-0123456789";
const USER_B: &str = "sched-b-token-0123456789";
const WORKER: &str = "sched-worker-token-01234";

fn as_token(app: &TestApp, token: &str) -> Client {
    Client::with_options(&app.url, &ClientOptions { token: Some(token.into()), ca_pem: None }).unwrap()
}

/// A server with users `user-a` (its own client) and `user-b` and a worker token, preempting
/// at once (no minimum runtime, a pass every 100 ms), set up further by `tweak`.
async fn lab(tweak: impl FnOnce(&mut server::config::ServerConfig)) -> TestApp {
    TestApp::spawn_secure(
        |config| {
            config.tokens.add_users(&format!("user-a:{USER_A},user-b:{USER_B}"), "test").unwrap();
            config.tokens.add(Role::Worker, WORKER, "test").unwrap();
            config.min_runtime = Duration::ZERO;
            config.reaper_interval = Duration::from_millis(100);
            tweak(config);
        },
        ClientOptions { token: Some(USER_A.into()), ca_pem: None },
    )
    .await
}

/// The worker's client and a worker `name` of `gpus` GPUs registered with it.
async fn register(app: &TestApp, name: &str, gpus: u32) -> (Client, WorkerId) {
    let worker = as_token(app, WORKER);
    let register = RegisterRequest { capacity: Capacity::idle_gpus(gpus, gpus, 24 << 30), ..cpu_worker(name) };
    let id = worker.register(&register).await.unwrap().worker_id;
    (worker, id)
}

/// An admin `boss`'s token.
const BOSS: &str = "sched-boss-token-0123456";

/// [`lab`] with the admin `boss` and the priority classes `urgent` (100) and `low` (-10).
async fn lab_with_classes() -> TestApp {
    lab(|config| {
        config.tokens.add_users(&format!("admin:boss:{BOSS}"), "test").unwrap();
        config.priority_classes = [("urgent".to_string(), 100), ("low".to_string(), -10)].into();
    })
    .await
}

fn attempt(job: &ClaimedJob) -> JobAttempt {
    JobAttempt { job_id: job.id, attempt: job.attempt }
}

#[tokio::test]
async fn a_user_below_their_share_gets_the_gpus_of_preemptible_jobs_only() {
    let app = lab(|_| {}).await;
    let (worker, id) = register(&app, "box", 4).await;
    // user-a: two jobs whose sweep forbids preemption, two that leave it to the server.
    app.submit("name: kept\ncommand: \"true\"\npreemptible: false\nresources: {gpus: 1}\ngrid: {i: [0, 1]}\n").await;
    app.submit("name: grid-a\ncommand: \"true\"\nresources: {gpus: 1}\ngrid: {i: [0, 1]}\n").await;
    let claim =
        |gpus: u32| ClaimRequest { capacity: Capacity::idle_gpus(gpus, gpus, 24 << 30), wait_ms: 0, reserve: 0 };
    let jobs = worker.claim(id, &claim(4)).await.unwrap().jobs;
    assert_eq!(jobs.len(), 4);
    let running: Vec<JobAttempt> = jobs.iter().map(attempt).collect();
    // Each of them stored a checkpoint but one of grid-a's: that one is not preemptible by
    // default (it would start over), nor are `kept`'s, checkpoint or not.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ckpt");
    std::fs::write(&file, b"weights").unwrap();
    let grid_a: Vec<&ClaimedJob> = jobs.iter().filter(|job| job.sweep == "grid-a").collect();
    for job in jobs.iter().filter(|job| job.id != grid_a[1].id) {
        let open = tokio::fs::File::open(&file).await.unwrap();
        worker.upload_checkpoint(job.id, job.attempt, id, open).await.unwrap();
    }

    let user_b = as_token(&app, USER_B);
    user_b
        .submit("name: grid-b\ncommand: \"true\"\nresources: {gpus: 1}\ngrid: {i: [0, 1, 2]}\n", &Default::default())
        .await
        .unwrap();
    let heartbeat = HeartbeatRequest { running: running.clone(), gpus: Vec::new(), saves: Vec::new() };
    let told = wait_until("the pass orders a preemption", Duration::from_secs(20), || async {
        let told = worker.heartbeat(id, &heartbeat).await.unwrap();
        (!told.preempt.is_empty()).then_some(told)
    })
    .await;
    // user-b's share is 2 of 4, but only one job may be taken.
    assert_eq!(told.preempt, [attempt(grid_a[0])]);
    let report = ReportRequest { worker_id: id, attempt: grid_a[0].attempt, outcome: Outcome::Preempted };
    assert_eq!(worker.report(grid_a[0].id, &report).await.unwrap().status, JobStatus::Queued);
    let attempts = app.client.job_attempts(grid_a[0].id).await.unwrap();
    assert_eq!(attempts[0].reason.as_deref(), Some("preempted for user-b's sweep grid-b"));
    let freed = worker.claim(id, &claim(1)).await.unwrap().jobs;
    assert_eq!(freed.iter().map(|job| job.sweep.as_str()).collect::<Vec<_>>(), ["grid-b"], "the GPU went to user-b");

    let listed = app.client.sweeps().await.unwrap();
    let preempted: Vec<(&str, u64)> = listed.iter().map(|sweep| (sweep.name.as_str(), sweep.preempted)).collect();
    assert_eq!(preempted, [("grid-b", 0), ("grid-a", 1), ("kept", 0)]);
    assert_eq!(app.client.sweep("grid-a").await.unwrap().info.preempted, 1);
    let metrics = crate::metrics_text(&app, Some(USER_A)).await;
    assert!(metrics.contains("app_preemptions_total{by=\"scheduler\"} 1\n"), "{metrics}");
}

#[tokio::test]
async fn the_job_that_checkpointed_last_is_preempted_before_the_youngest() {
    let app = lab(|_| {}).await;
    let (worker, id) = register(&app, "box", 3).await;
    app.submit("name: grid-a\ncommand: \"true\"\npreemptible: true\nresources: {gpus: 1}\ngrid: {i: [0, 1, 2]}\n")
        .await;
    // Started one after the other: the first is the oldest.
    let mut jobs = Vec::new();
    for gpu in 0..3 {
        let mut capacity = Capacity::idle_gpus(1, 3, 24 << 30);
        capacity.gpus.retain(|free| free.index == gpu);
        let claim = ClaimRequest { capacity, wait_ms: 0, reserve: 0 };
        jobs.extend(worker.claim(id, &claim).await.unwrap().jobs);
        tokio::time::sleep(Duration::from_millis(5)).await; // distinct start times (ms)
    }
    assert_eq!(jobs.len(), 3);
    // The oldest stores a checkpoint now: stopping it loses the least.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ckpt"), b"weights").unwrap();
    let open = tokio::fs::File::open(dir.path().join("ckpt")).await.unwrap();
    worker.upload_checkpoint(jobs[0].id, jobs[0].attempt, id, open).await.unwrap();

    let user_b = as_token(&app, USER_B);
    user_b
        .submit("name: grid-b\ncommand: \"true\"\nresources: {gpus: 1}\ngrid: {i: [0]}\n", &Default::default())
        .await
        .unwrap();
    let heartbeat =
        HeartbeatRequest { running: jobs.iter().map(attempt).collect(), gpus: Vec::new(), saves: Vec::new() };
    let told = wait_until("the pass orders a preemption", Duration::from_secs(20), || async {
        let told = worker.heartbeat(id, &heartbeat).await.unwrap();
        (!told.preempt.is_empty()).then_some(told)
    })
    .await;
    assert_eq!(told.preempt, [attempt(&jobs[0])], "not the youngest, {}", jobs[2].id);
}

#[tokio::test]
async fn a_job_whose_worker_will_wait_for_its_next_save_goes_before_one_that_checkpointed_last() {
    let app = lab(|_| {}).await;
    let (worker, id) = register(&app, "box", 3).await;
    app.submit("name: grid-a\ncommand: \"true\"\npreemptible: true\nresources: {gpus: 1}\ngrid: {i: [0, 1, 2]}\n")
        .await;
    let claim = ClaimRequest { capacity: Capacity::idle_gpus(3, 3, 24 << 30), wait_ms: 0, reserve: 0 };
    let jobs = worker.claim(id, &claim).await.unwrap().jobs;
    assert_eq!(jobs.len(), 3);
    // The first stores a checkpoint now; the second's worker saw it save 15 s ago, every 20 s:
    // it will wait for the next (due in 5 s, within half the grace), losing nothing.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ckpt"), b"weights").unwrap();
    let open = tokio::fs::File::open(dir.path().join("ckpt")).await.unwrap();
    worker.upload_checkpoint(jobs[0].id, jobs[0].attempt, id, open).await.unwrap();
    let save = SaveNote { attempt: attempt(&jobs[1]), at: server::db::now_ms() - 15_000, every_ms: Some(20_000) };
    let running: Vec<JobAttempt> = jobs.iter().map(attempt).collect();
    let told = HeartbeatRequest { running: running.clone(), gpus: Vec::new(), saves: vec![save] };
    worker.heartbeat(id, &told).await.unwrap();

    let user_b = as_token(&app, USER_B);
    user_b
        .submit("name: grid-b\ncommand: \"true\"\nresources: {gpus: 1}\ngrid: {i: [0]}\n", &Default::default())
        .await
        .unwrap();
    let heartbeat = HeartbeatRequest { running, gpus: Vec::new(), saves: Vec::new() };
    let ordered = wait_until("the pass orders a preemption", Duration::from_secs(20), || async {
        let answer = worker.heartbeat(id, &heartbeat).await.unwrap();
        (!answer.preempt.is_empty()).then_some(answer)
    })
    .await;
    assert_eq!(ordered.preempt, [attempt(&jobs[1])], "not {} (checkpointed last)", jobs[0].id);
}

#[tokio::test]
async fn room_for_a_job_holding_a_worker_is_made_on_that_worker_alone() {
    let app = lab(|config| {
        // Long enough for the hold to be made before any job may be preempted (the
        // reservation pass runs after the preemption pass in each reaper tick).
        config.min_runtime = Duration::from_secs(4);
        config.backfill_after = Duration::ZERO;
    })
    .await;
    let worker = as_token(&app, WORKER);
    let two_gpus = Capacity::idle_gpus(2, 2, 24 << 30);
    let mut ids = Vec::new();
    for name in ["near", "far"] {
        let register = RegisterRequest { capacity: two_gpus.clone(), ..cpu_worker(name) };
        ids.push(worker.register(&register).await.unwrap().worker_id);
    }
    // user-a fills both: jobs that time out in 10 minutes on `near`, in an hour on `far`.
    let claim = ClaimRequest { capacity: two_gpus.clone(), wait_ms: 0, reserve: 0 };
    let mut jobs = Vec::new();
    for (name, timeout, id) in [("soon", "10m", ids[0]), ("late", "1h", ids[1])] {
        let yaml = format!(
            "name: {name}\ncommand: \"true\"\npreemptible: true\ntimeout: {timeout}\nresources: {{gpus: 1}}\ngrid: {{i: [0, 1]}}\n"
        );
        app.submit(&yaml).await;
        let claimed = worker.claim(id, &claim).await.unwrap().jobs;
        assert_eq!(claimed.iter().filter(|job| job.sweep == name).count(), 2);
        jobs.push(claimed);
    }
    // `far`'s jobs store checkpoints: stopping them would lose least.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ckpt"), b"weights").unwrap();
    for job in &jobs[1] {
        let open = tokio::fs::File::open(dir.path().join("ckpt")).await.unwrap();
        worker.upload_checkpoint(job.id, job.attempt, ids[1], open).await.unwrap();
    }
    // user-b's 2-GPU job holds `near`, where it could start first (by the timeouts).
    let user_b = as_token(&app, USER_B);
    user_b.submit("name: pair\ncommand: \"true\"\nresources: {gpus: 2}\n", &Default::default()).await.unwrap();
    let reserved = wait_until("the pair holds a worker", Duration::from_secs(20), || async {
        app.client.sweep("pair").await.unwrap().info.reserved
    })
    .await;
    assert_eq!(reserved.worker, "near");
    // Room is made there, not on `far` (where the claims would not give it to the pair).
    let told = wait_until("the pass orders preemptions", Duration::from_secs(20), || async {
        let mut told = Vec::new();
        for (id, running) in ids.iter().zip(&jobs) {
            let heartbeat = HeartbeatRequest {
                running: running.iter().map(attempt).collect(),
                gpus: Vec::new(),
                saves: Vec::new(),
            };
            told.extend(worker.heartbeat(*id, &heartbeat).await.unwrap().preempt);
        }
        (!told.is_empty()).then_some(told)
    })
    .await;
    let mut expected: Vec<JobAttempt> = jobs[0].iter().map(attempt).collect();
    expected.sort_by_key(|at| at.job_id);
    let mut told = told;
    told.sort_by_key(|at| at.job_id);
    assert_eq!(told, expected);
}

#[tokio::test]
async fn a_higher_priority_class_preempts_a_lower_one_whatever_the_shares_and_is_an_admins_to_give() {
    let app = lab_with_classes().await;
    // Classes: unknown ones are refused, one above the default is an admin's to give, and
    // anyone may name one below it.
    let one_gpu = |name: &str, class: &str| {
        format!("name: {name}\ncommand: \"true\"\npreemptible: true\npriority_class: {class}\nresources: {{gpus: 1}}\n")
    };
    let user_b = as_token(&app, USER_B);
    let unknown = user_b.submit(&one_gpu("x", "high"), &Default::default()).await.unwrap_err();
    assert_eq!(unknown.status(), Some(400), "{unknown}");
    assert!(unknown.to_string().contains("this server's are `low`, `urgent`"), "{unknown}");
    let not_admin = user_b.submit(&one_gpu("x", "urgent"), &Default::default()).await.unwrap_err();
    assert_eq!(not_admin.status(), Some(403), "{not_admin}");
    user_b.submit(&one_gpu("later", "low"), &Default::default()).await.unwrap();
    assert_eq!(app.client.sweep("later").await.unwrap().info.priority_class.as_deref(), Some("low"));

    // user-a and the admin hold two GPUs each of four: each at their share.
    let (worker, id) = register(&app, "box", 4).await;
    let boss = as_token(&app, BOSS);
    app.submit("name: grid-a\ncommand: \"true\"\npreemptible: true\nresources: {gpus: 1}\ngrid: {i: [0, 1]}\n").await;
    boss.submit("name: grid-boss\ncommand: \"true\"\nresources: {gpus: 1}\ngrid: {i: [0, 1]}\n", &Default::default())
        .await
        .unwrap();
    let claim =
        |gpus: u32| ClaimRequest { capacity: Capacity::idle_gpus(gpus, gpus, 24 << 30), wait_ms: 0, reserve: 0 };
    let running = worker.claim(id, &claim(4)).await.unwrap().jobs;
    let grid_a: Vec<&ClaimedJob> = running.iter().filter(|job| job.sweep == "grid-a").collect();
    assert_eq!((grid_a.len(), running.len()), (2, 4), "{running:?}");
    // The admin's urgent job: user-a's (class 0) gives way though the admin is at its share.
    boss.submit(&one_gpu("rush", "urgent"), &Default::default()).await.unwrap();
    let heartbeat =
        HeartbeatRequest { running: running.iter().map(attempt).collect(), gpus: Vec::new(), saves: Vec::new() };
    let told = wait_until("the pass orders a preemption", Duration::from_secs(20), || async {
        let told = worker.heartbeat(id, &heartbeat).await.unwrap();
        (!told.preempt.is_empty()).then_some(told)
    })
    .await;
    assert_eq!(told.preempt.len(), 1, "{:?}", told.preempt);
    let stopped = grid_a.iter().find(|job| attempt(job) == told.preempt[0]).expect("one of user-a's");
    let report = ReportRequest { worker_id: id, attempt: stopped.attempt, outcome: Outcome::Preempted };
    worker.report(stopped.id, &report).await.unwrap();
    assert_eq!(
        app.client.job_attempts(stopped.id).await.unwrap()[0].reason.as_deref(),
        Some("preempted for boss's sweep rush")
    );
    // The freed GPU goes to the urgent job, ahead of user-a (below its share now) and user-b.
    let freed = worker.claim(id, &claim(1)).await.unwrap().jobs;
    assert_eq!(freed.iter().map(|job| job.sweep.as_str()).collect::<Vec<_>>(), ["rush"]);
}

#[tokio::test]
async fn a_sweep_moved_between_classes_is_claimed_by_its_new_class_and_only_an_admin_moves_one_up() {
    let app = lab_with_classes().await;
    let (user_b, boss) = (as_token(&app, USER_B), as_token(&app, BOSS));
    app.submit("name: grid-a\ncommand: \"true\"\nresources: {gpus: 1}\ngrid: {i: [0, 1, 2]}\n").await;
    user_b
        .submit("name: grid-b\ncommand: \"true\"\nresources: {gpus: 1}\ngrid: {i: [0, 1, 2]}\n", &Default::default())
        .await
        .unwrap();
    // Who may move what: the owner (or an admin), into a class above the default only an admin.
    let others = user_b.set_sweep_class("grid-a", Some("low")).await.unwrap_err();
    assert_eq!(others.status(), Some(403), "{others}");
    assert!(others.to_string().contains("user-a"), "names the owner: {others}");
    let up = app.client.set_sweep_class("grid-a", Some("urgent")).await.unwrap_err();
    assert_eq!(up.status(), Some(403), "{up}");
    let unknown = app.client.set_sweep_class("grid-a", Some("high")).await.unwrap_err();
    assert_eq!(unknown.status(), Some(400), "{unknown}");
    let missing = app.client.set_sweep_class("no-such-sweep", None).await.unwrap_err();
    assert_eq!(missing.status(), Some(404), "{missing}");

    let (worker, id) = register(&app, "box", 4).await;
    let claim_one = || async {
        let request = ClaimRequest { capacity: Capacity::idle_gpus(1, 1, 24 << 30), wait_ms: 0, reserve: 0 };
        let jobs = worker.claim(id, &request).await.unwrap().jobs;
        assert_eq!(jobs.len(), 1, "{jobs:?}");
        jobs[0].sweep.clone()
    };
    // Both users at no usage: the tie goes to user-a, unless its sweep is in a lower class.
    let moved = app.client.set_sweep_class("grid-a", Some("low")).await.unwrap();
    assert_eq!((moved.priority_class.as_deref(), moved.value), (Some("low"), -10));
    assert_eq!(app.client.sweep("grid-a").await.unwrap().info.priority_class.as_deref(), Some("low"));
    assert_eq!(claim_one().await, "grid-b");
    assert_eq!(claim_one().await, "grid-b", "a lower class waits though its user holds fewer GPUs");
    // The admin moves it above everyone: its jobs go before grid-b's last.
    let moved = boss.set_sweep_class("grid-a", Some("urgent")).await.unwrap();
    assert_eq!(moved.value, 100);
    assert_eq!(claim_one().await, "grid-a");
    // And its owner may move it back down to the default.
    let back = app.client.set_sweep_class("grid-a", None).await.unwrap();
    assert_eq!((back.priority_class, back.value), (None, 0));
    assert_eq!(app.client.sweep("grid-a").await.unwrap().info.priority_class, None);
}
