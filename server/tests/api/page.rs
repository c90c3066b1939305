//! What the web page reads: the page itself, the event stream, sorted job pages, attempts,
//! bulk cancel, the overview and worker states.

use futures_util::StreamExt;
use shared::api::{ClaimRequest, JobId, JobQuery, JobSort, RegisterRequest, ReportRequest, SortOrder, WorkerState};
use shared::job::{JobStatus, Outcome};
use shared::placement::Capacity;
use std::time::Duration;
use testkit::{sweep_of, wait_until, TestApp};

fn two_gpus(job_slots: u32) -> Capacity {
    Capacity::idle_gpus(job_slots, 2, 24 << 30)
}

#[tokio::test]
async fn the_page_is_served_at_the_root_and_unknown_assets_are_not_found() {
    let app = TestApp::spawn().await;
    let page = reqwest::get(format!("{}/", app.url)).await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.headers()["content-type"].to_str().unwrap().starts_with("text/html"));
    assert!(page.text().await.unwrap().contains("<html"));
    let missing = reqwest::get(format!("{}/assets/nope.js", app.url)).await.unwrap();
    assert_eq!(missing.status(), 404);
}

/// Reads server-sent events from `response` until one named `change` arrives; returns its seq.
async fn next_change<S, B>(body: &mut S, buffer: &mut String) -> u64
where
    S: futures_util::Stream<Item = reqwest::Result<B>> + Unpin,
    B: AsRef<[u8]>,
{
    loop {
        if let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            if let Some(data) = event.lines().find_map(|line| line.strip_prefix("data: ")) {
                assert!(event.contains("event: change"), "{event}");
                let value: serde_json::Value = serde_json::from_str(data).unwrap();
                return value["seq"].as_u64().unwrap();
            }
            continue;
        }
        let chunk = tokio::time::timeout(Duration::from_secs(10), body.next())
            .await
            .expect("an event within 10 s")
            .expect("the stream stays open")
            .unwrap();
        buffer.push_str(std::str::from_utf8(chunk.as_ref()).unwrap());
    }
}

#[tokio::test]
async fn the_event_stream_announces_changes_and_ends_when_the_server_stops() {
    let mut app = TestApp::spawn().await;
    let response = reqwest::get(format!("{}/api/events", app.url)).await.unwrap();
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut body = response.bytes_stream();
    let mut buffer = String::new();
    let first = next_change(&mut body, &mut buffer).await;
    app.submit(&sweep_of("live", 2)).await;
    let second = next_change(&mut body, &mut buffer).await;
    assert!(second > first, "a submit is announced: {first} then {second}");
    // Reads change nothing and announce nothing; a cancel does.
    app.client.jobs(&JobQuery::default()).await.unwrap();
    app.client.cancel_sweep("live").await.unwrap();
    let third = next_change(&mut body, &mut buffer).await;
    assert!(third > second);
    // A graceful stop does not wait for the page to close its stream.
    tokio::time::timeout(Duration::from_secs(10), app.stop()).await.expect("the server stops with a follower open");
    let rest =
        tokio::time::timeout(Duration::from_secs(10), async { while let Some(Ok(_)) = body.next().await {} }).await;
    assert!(rest.is_ok(), "the stream ended");
}

#[tokio::test]
async fn jobs_sort_by_any_column_in_either_order_with_stable_pages() {
    let app = TestApp::spawn().await;
    app.submit(&sweep_of("sorted", 6)).await;
    let ids: Vec<JobId> = app.client.jobs(&JobQuery::default()).await.unwrap().jobs.iter().map(|job| job.id).collect();
    for (id, priority) in ids.iter().zip([3, 1, 3, 0, 2, 1]) {
        app.client.set_priority(*id, priority).await.unwrap();
    }
    let query = JobQuery { sort: Some(JobSort::Priority), order: Some(SortOrder::Desc), ..JobQuery::default() };
    let page = app.client.jobs(&query).await.unwrap();
    let order: Vec<(i64, JobId)> = page.jobs.iter().map(|job| (job.priority, job.id)).collect();
    let expected = vec![(3, ids[2]), (3, ids[0]), (2, ids[4]), (1, ids[5]), (1, ids[1]), (0, ids[3])];
    assert_eq!(order, expected);
    // Pages of two walk the same order without overlap.
    let mut walked = Vec::new();
    for offset in [0, 2, 4] {
        let page = app.client.jobs(&JobQuery { limit: Some(2), offset: Some(offset), ..query.clone() }).await.unwrap();
        assert_eq!(page.total, 6);
        walked.extend(page.jobs.iter().map(|job| (job.priority, job.id)));
    }
    assert_eq!(walked, expected);
    // Never-started jobs go last when sorting by start time, whichever the order.
    let worker = app.register("w", 1).await;
    let started = app.claim(worker, 1).await.pop().unwrap();
    for order in [SortOrder::Asc, SortOrder::Desc] {
        let query = JobQuery { sort: Some(JobSort::StartedAt), order: Some(order), ..JobQuery::default() };
        let first = &app.client.jobs(&query).await.unwrap().jobs[0];
        assert_eq!(first.id, started.id);
    }
    let bad = reqwest::get(format!("{}/api/jobs?sort=params", app.url)).await.unwrap();
    assert_eq!(bad.status(), 400);
    assert!(bad.text().await.unwrap().contains("sort"));
}

#[tokio::test]
async fn attempts_record_the_worker_gpus_end_and_exit_code_of_each_run() {
    let app = TestApp::spawn().await;
    app.submit("name: flaky\ncommand: \"exit 3\"\nretries: 1\nresources: {gpus: 1}\n").await;
    let register = RegisterRequest {
        name: "gpu-box".into(),
        protocol: shared::PROTOCOL_VERSION,
        key: None,
        capacity: two_gpus(2),
        holding: Vec::new(),
    };
    let worker = app.client.register(&register).await.unwrap().worker_id;
    let claim = |capacity| ClaimRequest { capacity, wait_ms: 0, reserve: 0 };
    let first = app.client.claim(worker, &claim(two_gpus(2))).await.unwrap().jobs.pop().unwrap();
    let report = |attempt| ReportRequest { worker_id: worker, attempt, outcome: Outcome::Exited { code: 3 } };
    app.client.report(first.id, &report(first.attempt)).await.unwrap();
    // GPU 0 is busy now: the second attempt is placed on GPU 1, and the job records that.
    let mut busy = two_gpus(2);
    busy.gpus[0].exclusive_held = true;
    let second = app.client.claim(worker, &claim(busy)).await.unwrap().jobs.pop().unwrap();
    assert_eq!(second.placement.gpus, [1]);
    assert_eq!(app.client.job(first.id).await.unwrap().gpus, [1]);
    let attempts = app.client.job_attempts(first.id).await.unwrap();
    assert_eq!(attempts.len(), 2);
    assert_eq!((attempts[0].gpus.as_slice(), attempts[0].status), (&[0][..], JobStatus::Queued));
    assert_eq!((attempts[0].exit_code, attempts[0].worker.as_deref()), (Some(3), Some("gpu-box")));
    assert!(attempts[0].ended_at.is_some());
    assert_eq!(
        (attempts[1].gpus.as_slice(), attempts[1].status, attempts[1].ended_at),
        (&[1][..], JobStatus::Running, None)
    );
    app.client.report(second.id, &report(second.attempt)).await.unwrap();
    let last = app.client.job_attempts(first.id).await.unwrap().pop().unwrap();
    assert_eq!((last.status, last.exit_code), (JobStatus::Failed, Some(3)));
    let missing = app.client.job_attempts(999_999.into()).await.unwrap_err();
    assert_eq!(missing.status(), Some(404));
}

#[tokio::test]
async fn bulk_cancel_cancels_queued_flags_running_and_skips_the_rest() {
    let app = TestApp::spawn().await;
    app.submit(&sweep_of("many", 4)).await;
    let worker = app.register("w", 1).await;
    let running = app.claim(worker, 1).await.pop().unwrap();
    let ids: Vec<JobId> = app.client.jobs(&JobQuery::default()).await.unwrap().jobs.iter().map(|job| job.id).collect();
    let done = ids.iter().copied().find(|id| *id != running.id).unwrap();
    app.client.cancel_job(done).await.unwrap();
    let mut asked = ids.clone();
    asked.push(JobId::new(999_999));
    let response = app.client.cancel_jobs(&asked).await.unwrap();
    assert_eq!((response.cancelled, response.cancel_requested), (2, 1));
    assert_eq!(response.skipped, vec![done, JobId::new(999_999)]);
    let flagged = app.client.job(running.id).await.unwrap();
    assert_eq!((flagged.status, flagged.cancel_requested), (JobStatus::Running, true));
    let overview = app.client.overview().await.unwrap();
    assert_eq!((overview.counts.cancelled, overview.counts.running, overview.sweeps), (3, 1, 1));
    let too_many: Vec<JobId> = (0..1001).map(JobId::new).collect();
    let refused = app.client.cancel_jobs(&too_many).await.unwrap_err();
    assert_eq!(refused.status(), Some(400), "{refused}");
}

#[tokio::test]
async fn workers_are_healthy_while_they_heartbeat_then_stale_then_lost() {
    let app = TestApp::spawn_with(|config| {
        config.heartbeat = Duration::from_millis(100);
        config.lease = Duration::from_millis(600);
    })
    .await;
    app.submit(&sweep_of("one", 1)).await;
    let worker = app.register("quiet", 1).await;
    let job = app.claim(worker, 1).await.pop().unwrap();
    let listed = app.client.workers().await.unwrap().pop().unwrap();
    assert_eq!((listed.state, listed.running_jobs.as_slice()), (WorkerState::Healthy, &[job.id][..]));
    assert_eq!(app.client.overview().await.unwrap().workers.healthy, 1);
    wait_until("the silent worker turns stale", Duration::from_secs(5), || async {
        (app.client.workers().await.unwrap()[0].state == WorkerState::Stale).then_some(())
    })
    .await;
    wait_until("the silent worker is lost and its job requeued", Duration::from_secs(5), || async {
        let worker = app.client.workers().await.unwrap().pop().unwrap();
        (worker.state == WorkerState::Lost && worker.running_jobs.is_empty()).then_some(())
    })
    .await;
    assert_eq!(app.client.overview().await.unwrap().workers.lost, 1);
}
