//! The sweep page's analysis through the typed client: each metric's direction on the
//! leaderboard, parameter importance, the best-so-far curve, the finish estimate, and the GPU
//! readings of a job's attempt.

use shared::api::{
    AnalysisQuery, ClaimRequest, ClaimedJob, DirectionBasis, GpuSample, HeartbeatRequest, JobAttempt, JobGpuQuery,
    MetricPoint, MetricsBatch, RegisterRequest, ReportRequest, WorkerId,
};
use shared::job::Outcome;
use shared::placement::{Capacity, GpuSlot};
use shared::sweep::Goal;
use std::time::Duration;
use testkit::{wait_until, TestApp};

fn point(step: i64, name: &str, value: f64) -> MetricPoint {
    MetricPoint { step: Some(step), name: name.into(), value }
}

async fn send(app: &TestApp, worker: WorkerId, job: &ClaimedJob, points: Vec<MetricPoint>) {
    let batch = MetricsBatch { worker_id: worker, attempt: job.attempt, offset: 10, points };
    app.client.send_metrics(job.id, &batch).await.unwrap();
}

async fn report(app: &TestApp, worker: WorkerId, job: &ClaimedJob, code: i32) {
    let request = ReportRequest { worker_id: worker, attempt: job.attempt, outcome: Outcome::Exited { code } };
    app.client.report(job.id, &request).await.unwrap();
}

/// Waits until the server's clock (the same host's) has moved past `at`, so two events
/// written around it get distinct millisecond timestamps.
async fn clock_past(at: i64) {
    wait_until("the clock moves on", Duration::from_secs(2), || async { (now_ms() > at + 2).then_some(()) }).await;
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

#[tokio::test]
async fn the_leaderboard_gives_each_metric_its_own_direction_and_the_csv_agrees() {
    let app = TestApp::spawn().await;
    app.submit("name: dirs\ncommand: echo {i}\nmetric: {name: val_loss, goal: minimize}\ngrid:\n  i: [1, 2]\n").await;
    let worker = app.register("dirs-w", 2).await;
    for job in app.claim(worker, 2).await {
        let points = vec![
            point(1, "val_loss", 0.9),
            point(1, "val_accuracy", 0.5),
            point(2, "val_accuracy", 0.8),
            point(3, "val_accuracy", 0.6),
            point(1, "lr", 0.1),
            point(2, "lr", 0.01),
        ];
        send(&app, worker, &job, points).await;
    }
    let board = app.client.leaderboard("dirs", None).await.unwrap();
    let found: Vec<(&str, Option<Goal>, DirectionBasis)> =
        board.directions.iter().map(|d| (d.name.as_str(), d.goal, d.basis)).collect();
    assert_eq!(
        found,
        [
            ("lr", None, DirectionBasis::Unknown),
            ("val_accuracy", Some(Goal::Maximize), DirectionBasis::Name),
            ("val_loss", Some(Goal::Minimize), DirectionBasis::SweepGoal),
        ]
    );
    assert_eq!(board.summary.rows.len(), 2);
    // The CSV's best of accuracy is its max (0.8), not the min the sweep's goal would pick.
    let csv = app.client.summary_csv("dirs", None).await.unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let first: Vec<&str> = csv.lines().nth(1).unwrap().split(',').collect();
    let column = |name: &str| header.iter().position(|field| *field == name).unwrap_or_else(|| panic!("{name}"));
    assert_eq!(first[column("val_accuracy.best")], "0.8");
    assert_eq!(first[column("val_loss.best")], "0.9");
    assert!(!header.contains(&"lr.best"), "an unknown direction has no best: {header:?}");
}

#[tokio::test]
async fn importance_puts_the_parameter_that_drives_the_metric_first() {
    let app = TestApp::spawn().await;
    let yaml = "name: imp\ncommand: echo {lr} {batch}\nmetric: {name: loss, goal: minimize}\n\
                grid:\n  lr: [0.1, 0.01, 0.001, 0.0001]\n  batch: [16, 32, 64, 128]\n";
    app.submit(yaml).await;
    let worker = app.register("imp-w", 16).await;
    let jobs = app.claim(worker, 16).await;
    assert_eq!(jobs.len(), 16);
    for job in &jobs {
        let lr = job.params["lr"].as_f64().unwrap();
        let batch = job.params["batch"].as_f64().unwrap();
        // The loss follows lr; batch only wiggles it a little, in no order.
        let wiggle = [0.01, -0.02, 0.015, -0.005][((batch as u32).trailing_zeros() % 4) as usize];
        send(&app, worker, job, vec![point(1, "loss", -lr.log10() + wiggle)]).await;
    }
    let analysis = app.client.sweep_analysis("imp", &AnalysisQuery::default()).await.unwrap();
    let metric = analysis.metric.unwrap();
    assert_eq!((metric.name.as_str(), metric.goal), ("loss", Some(Goal::Minimize)));
    assert_eq!(analysis.runs_used, 16);
    assert!(analysis.importance_method.contains("ANOVA"), "{}", analysis.importance_method);
    let names: Vec<&str> = analysis.importance.iter().map(|item| item.name.as_str()).collect();
    assert_eq!(names, ["lr", "batch"]);
    assert!(analysis.importance[0].importance > 0.95, "{:?}", analysis.importance);
    assert!(analysis.importance[1].importance < 0.05, "{:?}", analysis.importance);

    // Another metric by name; one nobody reported has nothing to say; an empty name is refused.
    let other = AnalysisQuery { metric: Some("nope".into()) };
    let nothing = app.client.sweep_analysis("imp", &other).await.unwrap();
    assert_eq!((nothing.runs_used, nothing.importance.len()), (0, 0));
    let empty = AnalysisQuery { metric: Some(" ".into()) };
    let refused = app.client.sweep_analysis("imp", &empty).await.unwrap_err();
    assert_eq!(refused.status(), Some(400), "{refused}");
    assert!(refused.to_string().contains("`metric`"), "{refused}");
    let missing = app.client.sweep_analysis("no-such", &AnalysisQuery::default()).await.unwrap_err();
    assert_eq!(missing.status(), Some(404), "{missing}");
}

#[tokio::test]
async fn the_best_so_far_follows_finishing_order_and_the_eta_needs_a_finished_and_a_running_run() {
    let app = TestApp::spawn().await;
    app.submit("name: pace\ncommand: echo {i}\nmetric: {name: acc, goal: maximize}\ngrid:\n  i: [1, 2, 3, 4]\n").await;
    let worker = app.register("pace-w", 4).await;
    let request = ClaimRequest { capacity: testkit::cpu(2), wait_ms: 0, reserve: 0 };
    let mut jobs = app.client.claim(worker, &request).await.unwrap().jobs;
    jobs.sort_by_key(|job| job.index);
    let before = app.client.sweep_analysis("pace", &AnalysisQuery::default()).await.unwrap();
    assert_eq!((before.eta.queued, before.eta.running, before.eta.remaining_ms), (2, 2, None));
    assert!(before.eta.note.contains("once a run has finished"), "{}", before.eta.note);

    // The second job finishes first with 0.6, then the first with 0.4: the best stays 0.6.
    send(&app, worker, &jobs[1], vec![point(1, "acc", 0.6)]).await;
    send(&app, worker, &jobs[0], vec![point(1, "acc", 0.4)]).await;
    report(&app, worker, &jobs[1], 0).await;
    clock_past(now_ms()).await;
    report(&app, worker, &jobs[0], 1).await;
    let after = app.client.sweep_analysis("pace", &AnalysisQuery::default()).await.unwrap();
    let curve: Vec<(shared::api::JobId, f64, f64)> =
        after.best_so_far.iter().map(|p| (p.job_id, p.value, p.best)).collect();
    assert_eq!(curve, [(jobs[1].id, 0.6, 0.6), (jobs[0].id, 0.4, 0.6)]);
    // Two ended (one failed), none runs, two wait: no estimate until something runs.
    assert_eq!((after.eta.finished, after.eta.running, after.eta.queued), (2, 0, 2));
    assert!(after.eta.remaining_ms.is_none() && after.eta.note.contains("wait for a worker"), "{:?}", after.eta);

    let more = app.claim(worker, 1).await;
    assert_eq!(more.len(), 1);
    let running = app.client.sweep_analysis("pace", &AnalysisQuery::default()).await.unwrap();
    assert!(running.eta.remaining_ms.is_some(), "{:?}", running.eta);
    assert!(running.eta.note.contains("1 at a time"), "{:?}", running.eta);
}

fn gpu(index: u32, free: u64) -> GpuSlot {
    GpuSlot { index, memory_total: 8 << 30, memory_free: free, exclusive_held: false, shared_jobs: 0 }
}

fn reading(index: u32, utilization: u32) -> GpuSample {
    GpuSample {
        index,
        uuid: format!("GPU-{index}"),
        name: "Test GPU".into(),
        memory_total: 8 << 30,
        memory_used: (utilization as u64) << 20,
        utilization: Some(utilization),
        temperature: Some(50),
        power_watts: Some(100.0),
        at: 0,
    }
}

#[tokio::test]
async fn a_jobs_gpu_view_has_the_readings_of_its_gpus_within_its_attempt_and_who_shared_them() {
    let app = TestApp::spawn().await;
    app.submit("name: gpus\ncommand: echo {i}\nresources: {gpus: 1, gpu_memory: 1GiB}\ngrid:\n  i: [1, 2, 3]\n").await;
    // GPU 1 is full, so both claimed jobs share GPU 0.
    let capacity = Capacity { job_slots: 2, gpus: vec![gpu(0, 8 << 30), gpu(1, 0)], ..Capacity::default() };
    let register = RegisterRequest {
        name: "box".into(),
        protocol: shared::PROTOCOL_VERSION,
        key: None,
        capacity: capacity.clone(),
        holding: Vec::new(),
    };
    let worker = app.client.register(&register).await.unwrap().worker_id;
    let beat = |running: Vec<JobAttempt>, util: u32| HeartbeatRequest {
        running,
        gpus: vec![reading(0, util), reading(1, util + 1)],
        saves: Vec::new(),
    };
    app.client.heartbeat(worker, &beat(vec![], 5)).await.unwrap();
    clock_past(now_ms()).await;
    let jobs = app.client.claim(worker, &ClaimRequest { capacity, wait_ms: 0, reserve: 0 }).await.unwrap().jobs;
    assert_eq!(jobs.iter().map(|job| job.placement.gpus.clone()).collect::<Vec<_>>(), [vec![0], vec![0]]);
    let held: Vec<JobAttempt> = jobs.iter().map(|job| JobAttempt { job_id: job.id, attempt: job.attempt }).collect();
    clock_past(now_ms()).await;
    for util in [40, 60] {
        app.client.heartbeat(worker, &beat(held.clone(), util)).await.unwrap();
    }
    clock_past(now_ms()).await;
    report(&app, worker, &jobs[0], 0).await;
    clock_past(now_ms()).await;
    app.client.heartbeat(worker, &beat(held[1..].to_vec(), 99)).await.unwrap();

    let usage = app.client.job_gpu(jobs[0].id, &JobGpuQuery::default()).await.unwrap();
    assert_eq!((usage.attempt, usage.worker.as_deref(), usage.gpus.clone()), (1, Some("box"), vec![0]));
    assert!(usage.to.is_some(), "the attempt has ended");
    // Only GPU 0, only while the attempt ran: not the reading before the claim or after the end.
    let seen: Vec<(u32, Option<u32>)> = usage.samples.iter().map(|s| (s.index, s.utilization)).collect();
    assert_eq!(seen, [(0, Some(40)), (0, Some(60))]);
    assert_eq!(usage.shared_with, [jobs[1].id]);
    assert_eq!(usage.gpu_memory, Some(1 << 30));
    assert_eq!(usage.retention_ms, app.config.telemetry_retention.as_millis() as u64);
    // The running one sees the readings up to now.
    let live = app.client.job_gpu(jobs[1].id, &JobGpuQuery::default()).await.unwrap();
    assert_eq!(live.to, None);
    assert_eq!(live.samples.iter().filter_map(|s| s.utilization).collect::<Vec<_>>(), [40, 60, 99]);

    let queued = app.client.jobs(&Default::default()).await.unwrap().jobs.into_iter().find(|job| job.index == 2);
    let never = app.client.job_gpu(queued.unwrap().id, &JobGpuQuery::default()).await.unwrap_err();
    assert_eq!(never.status(), Some(404));
    assert!(never.to_string().contains("has not started"), "{never}");
    let no_attempt = app.client.job_gpu(jobs[0].id, &JobGpuQuery { attempt: Some(9) }).await.unwrap_err();
    assert!(no_attempt.to_string().contains("no attempt 9"), "{no_attempt}");
    let unknown = app.client.job_gpu(999.into(), &JobGpuQuery::default()).await.unwrap_err();
    assert_eq!(unknown.status(), Some(404));
    let bad = reqwest::get(format!("{}/api/jobs/abc/gpu", app.url)).await.unwrap();
    assert_eq!(bad.status(), 400);
    assert!(bad.text().await.unwrap().starts_with("{\"error\""));
}
