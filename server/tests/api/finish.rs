//! The one-request end of an attempt (`POST /api/workers/{id}/finish`): everything applied in
//! one transaction or nothing, the next jobs claimed with it, and its refusals.

use sha2::{Digest, Sha256};
use shared::api::{
    AttemptRecord, ClaimRequest, FinishRequest, InlineFile, InlineResult, JobQuery, LogQuery, LogTail, MetricPoint,
    MetricsTail, MAX_INLINE_BYTES,
};
use shared::job::{JobStatus, Outcome};
use testkit::{cpu, sweep_of, TestApp};

fn record() -> AttemptRecord {
    AttemptRecord {
        exit_code: Some(0),
        outcome: "exited with code 0".into(),
        started_at: 1,
        finished_at: 2,
        worker: "w".into(),
        hostname: "h".into(),
        gpus: Vec::new(),
        cuda_visible_devices: None,
        git_commit: None,
        ..AttemptRecord::default()
    }
}

fn inline(path: &str, data: &[u8]) -> InlineFile {
    InlineFile { path: path.into(), sha256: hex::encode(Sha256::digest(data)), data: data.to_vec() }
}

pub fn finish(job: &shared::api::ClaimedJob) -> FinishRequest {
    FinishRequest {
        job_id: job.id,
        attempt: job.attempt,
        outcome: Outcome::Exited { code: 0 },
        log: Some(LogTail { offset: 0, data: b"hello\n".to_vec() }),
        metrics: Some(MetricsTail {
            offset: 20,
            points: vec![MetricPoint { step: Some(1), name: "loss".into(), value: 0.25 }],
        }),
        result: Some(InlineResult {
            files: vec![inline("out/a.txt", b"result")],
            streamed: Vec::new(),
            record: record(),
        }),
        notes: Vec::new(),
        claim: None,
    }
}

#[tokio::test]
async fn a_finish_stores_log_metrics_result_and_outcome_and_claims_the_next_job() {
    let app = TestApp::spawn().await;
    app.submit(&sweep_of("lean", 3)).await;
    let worker = app.register("w", 1).await;
    let job = app.claim(worker, 1).await.pop().unwrap();
    let mut request = finish(&job);
    request.claim = Some(ClaimRequest { capacity: cpu(1), wait_ms: 0, reserve: 0 });
    let response = app.client.finish(worker, &request).await.unwrap();
    assert_eq!(response.status, JobStatus::Succeeded);
    assert_eq!(response.jobs.len(), 1, "the next job came with the answer");
    assert_eq!(response.jobs[0].index, 1);
    let stored = app.client.job(job.id).await.unwrap();
    assert_eq!(stored.metrics["loss"].last, 0.25);
    assert_eq!(app.client.log(job.id, &LogQuery::default()).await.unwrap().text, "hello\n");
    let versions = app.client.results(job.id).await.unwrap();
    assert_eq!(versions.len(), 1);
    assert_eq!(versions[0].files[0].path, "out/a.txt");
    assert_eq!(versions[0].metrics["loss"].last, 0.25, "the result records the final metrics");
    let file = tempfile::NamedTempFile::new().unwrap();
    app.client.download_file(job.id, 1, "out/a.txt", file.path()).await.unwrap();
    assert_eq!(std::fs::read(file.path()).unwrap(), b"result");
}

#[tokio::test]
async fn a_finish_with_inline_files_sets_an_unrecorded_version_aside_and_stores_its_own() {
    // Another run's results where this attempt's version goes, which the database does not
    // know (a database restored from an older backup): kept aside, not deleted.
    let app = TestApp::spawn().await;
    app.submit(&sweep_of("restored", 1)).await;
    let worker = app.register("w", 1).await;
    let job = app.claim(worker, 1).await.pop().unwrap();
    let unknown = app.data_path().join("results/restored/0/v1");
    std::fs::create_dir_all(&unknown).unwrap();
    std::fs::write(unknown.join("model.bin"), b"another run's weights").unwrap();
    let response = app.client.finish(worker, &finish(&job)).await.unwrap();
    assert_eq!(response.status, JobStatus::Succeeded);
    let file = tempfile::NamedTempFile::new().unwrap();
    app.client.download_file(job.id, 1, "out/a.txt", file.path()).await.unwrap();
    assert_eq!(std::fs::read(file.path()).unwrap(), b"result");
    assert!(!unknown.join("model.bin").exists(), "the version directory is this attempt's now");
    let aside: Vec<_> = std::fs::read_dir(app.data_path().join("results/.unrecorded"))
        .expect("set aside under results/.unrecorded")
        .map(|entry| entry.unwrap().path())
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(std::fs::read(aside[0].join("model.bin")).unwrap(), b"another run's weights");
}

#[tokio::test]
async fn a_stale_finish_is_refused_whole_and_applies_nothing() {
    let app = TestApp::spawn_with(|config| config.lease = std::time::Duration::from_millis(300)).await;
    app.submit(&sweep_of("stale", 1)).await;
    let worker = app.register("w", 1).await;
    let job = app.claim(worker, 1).await.pop().unwrap();
    testkit::wait_until("the lease ran out", std::time::Duration::from_secs(10), || async {
        (app.client.job(job.id).await.ok()?.status == JobStatus::Queued).then_some(())
    })
    .await;
    let mut request = finish(&job);
    request.claim = Some(ClaimRequest { capacity: cpu(1), wait_ms: 0, reserve: 0 });
    let refused = app.client.finish(worker, &request).await.unwrap_err();
    assert_eq!(refused.status(), Some(409), "{refused}");
    let after = app.client.job(job.id).await.unwrap();
    assert_eq!((after.status, after.metrics.len()), (JobStatus::Queued, 0), "{after:#?}");
    assert!(app.client.results(job.id).await.unwrap().is_empty());
    assert_eq!(app.client.log(job.id, &LogQuery { attempt: Some(1), ..LogQuery::default() }).await.unwrap().text, "");
    assert!(after.worker.is_none() && after.gpus.is_empty() && after.started_at.is_none(), "{after:#?}");
}

#[tokio::test]
async fn inline_files_over_the_cap_are_413_and_a_draining_worker_claims_nothing() {
    let app = TestApp::spawn().await;
    app.submit(&sweep_of("caps", 3)).await;
    let worker = app.register("w", 1).await;
    let job = app.claim(worker, 1).await.pop().unwrap();
    let mut too_big = finish(&job);
    let big = vec![1u8; (MAX_INLINE_BYTES / 2 + 1) as usize];
    too_big.result.as_mut().unwrap().files = vec![inline("a.bin", &big), inline("b.bin", &big)];
    let refused = app.client.finish(worker, &too_big).await.unwrap_err();
    assert_eq!(refused.status(), Some(413));
    assert!(refused.to_string().contains("upload them"), "{refused}");
    let mut lying = finish(&job);
    lying.result.as_mut().unwrap().files[0].sha256 = "0".repeat(64);
    assert_eq!(app.client.finish(worker, &lying).await.unwrap_err().status(), Some(400));
    assert_eq!(app.client.job(job.id).await.unwrap().status, JobStatus::Running, "refusals applied nothing");
    app.client.drain(worker).await.unwrap();
    let mut request = finish(&job);
    request.claim = Some(ClaimRequest { capacity: cpu(1), wait_ms: 0, reserve: 0 });
    let response = app.client.finish(worker, &request).await.unwrap();
    assert_eq!(response.status, JobStatus::Succeeded);
    assert!(response.jobs.is_empty(), "a draining worker gets no new job");
    assert!(app.claim(worker, 1).await.is_empty());
}

#[tokio::test]
async fn a_finish_with_notes_keeps_them_on_the_job_and_in_its_log() {
    let app = TestApp::spawn().await;
    app.submit(&sweep_of("noted", 1)).await;
    let worker = app.register("w", 1).await;
    let job = app.claim(worker, 1).await.pop().unwrap();
    let mut request = finish(&job);
    request.notes = vec!["worker disk full: log truncated after about 6 bytes".into()];
    app.client.finish(worker, &request).await.unwrap();
    let stored = app.client.job(job.id).await.unwrap();
    assert_eq!(stored.notes, request.notes);
    let log = app.client.log(job.id, &LogQuery::default()).await.unwrap().text;
    assert_eq!(log, "hello\n[app] worker disk full: log truncated after about 6 bytes\n");
}

#[tokio::test]
async fn a_finish_hands_a_worker_without_gpus_the_best_jobs_it_can_run_in_dispatch_order() {
    let app = TestApp::spawn().await;
    app.submit(&sweep_of("low", 2)).await;
    app.submit("name: gpu\ncommand: \"true\"\npriority: 9\nresources: {gpus: 1}\n").await;
    app.submit("name: high\ncommand: \"true\"\npriority: 5\ngrid:\n  i: [0, 1, 2]\n").await;
    let worker = app.register("w", 3).await;
    let job = app.claim(worker, 1).await.pop().unwrap();
    assert_eq!((job.sweep.as_str(), job.index), ("high", 0));
    let mut request = finish(&job);
    request.claim = Some(ClaimRequest { capacity: cpu(3), wait_ms: 0, reserve: 0 });
    let jobs = app.client.finish(worker, &request).await.unwrap().jobs;
    let got: Vec<(&str, u64)> = jobs.iter().map(|job| (job.sweep.as_str(), job.index)).collect();
    assert_eq!(got, [("high", 1), ("high", 2), ("low", 0)], "priority first, then age; never the GPU job");
    assert!(jobs.iter().all(|job| job.placement.gpus.is_empty() && job.attempt == 1));
    let gpu = app.client.jobs(&JobQuery { sweep: Some("gpu".into()), ..JobQuery::default() }).await.unwrap();
    assert_eq!(gpu.jobs[0].status, JobStatus::Queued);
}

#[tokio::test]
async fn a_finish_without_metrics_records_those_sent_before_and_none_when_there_were_none() {
    let app = TestApp::spawn().await;
    app.submit(&sweep_of("measured", 2)).await;
    let worker = app.register("w", 2).await;
    let jobs = app.claim(worker, 2).await;
    let points = vec![MetricPoint { step: Some(3), name: "acc".into(), value: 0.75 }];
    let batch = shared::api::MetricsBatch { worker_id: worker, attempt: jobs[0].attempt, offset: 10, points };
    app.client.send_metrics(jobs[0].id, &batch).await.unwrap();
    for job in &jobs {
        let mut request = finish(job);
        request.metrics = None;
        app.client.finish(worker, &request).await.unwrap();
    }
    let sent_before = app.client.results(jobs[0].id).await.unwrap();
    assert_eq!(sent_before[0].metrics["acc"].last, 0.75, "{:?}", sent_before[0].metrics);
    let never = app.client.results(jobs[1].id).await.unwrap();
    assert!(never[0].metrics.is_empty(), "{:?}", never[0].metrics);
}

#[tokio::test]
async fn a_finish_s_reserve_is_granted_beyond_the_free_slots_up_to_its_cap_and_never_with_gpus() {
    let app = TestApp::spawn().await;
    app.submit(&sweep_of("many", 40)).await;
    let worker = app.register("w", 1).await;
    let job = app.claim(worker, 1).await.pop().unwrap();
    let mut request = finish(&job);
    request.claim = Some(ClaimRequest { capacity: cpu(1), wait_ms: 0, reserve: 2 });
    let jobs = app.client.finish(worker, &request).await.unwrap().jobs;
    assert_eq!(jobs.len(), 3, "the free slot and a reserve of two");
    let mut request = finish(&jobs[0]);
    request.claim = Some(ClaimRequest { capacity: cpu(0), wait_ms: 0, reserve: u32::MAX });
    let jobs = app.client.finish(worker, &request).await.unwrap().jobs;
    assert_eq!(jobs.len(), shared::api::MAX_RESERVE as usize, "a reserve is capped");
    // A box with GPUs places each job on the GPUs as they are when it starts: no reserve.
    let gpu = |index| shared::placement::GpuSlot {
        index,
        memory_total: 24 << 30,
        memory_free: 24 << 30,
        exclusive_held: false,
        shared_jobs: 0,
    };
    let gpus = shared::placement::Capacity { job_slots: 1, gpus: (0..8).map(gpu).collect(), ..Default::default() };
    let mut request = finish(&jobs[0]);
    request.claim = Some(ClaimRequest { capacity: gpus, wait_ms: 0, reserve: 4 });
    let jobs = app.client.finish(worker, &request).await.unwrap().jobs;
    assert_eq!(jobs.len(), 1, "{jobs:?}");
}
