//! Logs: appends fenced by attempt and idempotent by offset, reads by page, follow mode, and
//! the per-attempt cap.

use shared::api::{JobId, LogAppend, LogQuery, ReportRequest, WorkerId};
use shared::job::{JobStatus, Outcome};
use std::time::{Duration, Instant};
use testkit::{wait_until, TestApp};

fn at(worker_id: WorkerId, attempt: u32, offset: u64) -> LogAppend {
    LogAppend { worker_id, attempt, offset }
}

fn from(offset: u64) -> LogQuery {
    LogQuery { attempt: None, offset, wait_ms: 0 }
}

#[tokio::test]
async fn appends_read_back_and_a_retry_is_stored_once() {
    let app = TestApp::spawn().await;
    let (worker, job) = app.start_one("logs").await;
    let client = &app.client;
    let ack = client.append_log(job.id, &at(worker, job.attempt, 0), b"epoch 1\n".to_vec()).await.unwrap();
    assert_eq!(ack.length, 8);
    // The ack was lost: the worker resends from 0 with more bytes; only the new tail is kept.
    let ack = client.append_log(job.id, &at(worker, job.attempt, 0), b"epoch 1\nepoch 2\n".to_vec()).await.unwrap();
    assert_eq!(ack.length, 16);
    let ack = client.append_log(job.id, &at(worker, job.attempt, 8), b"epoch 2\n".to_vec()).await.unwrap();
    assert_eq!(ack.length, 16, "a pure duplicate changes nothing");
    let chunk = client.log(job.id, &from(0)).await.unwrap();
    assert_eq!((chunk.attempt, chunk.text.as_str(), chunk.next_offset), (job.attempt, "epoch 1\nepoch 2\n", 16));
    assert!(!chunk.finished);
    let tail = client.log(job.id, &from(8)).await.unwrap();
    assert_eq!(tail.text, "epoch 2\n");
    assert_eq!(client.log(job.id, &from(16)).await.unwrap().text, "");
}

#[tokio::test]
async fn a_gap_a_stale_attempt_or_another_worker_is_refused() {
    let app = TestApp::spawn().await;
    let (worker, job) = app.start_one("fenced").await;
    let client = &app.client;
    client.append_log(job.id, &at(worker, job.attempt, 0), b"0123".to_vec()).await.unwrap();
    let gap = client.append_log(job.id, &at(worker, job.attempt, 9), b"x".to_vec()).await.unwrap_err();
    assert_eq!(gap.status(), Some(409), "{gap}");
    assert!(gap.to_string().contains("resend from byte 4"), "{gap}");
    let stale = client.append_log(job.id, &at(worker, job.attempt + 1, 0), b"x".to_vec()).await.unwrap_err();
    assert_eq!(stale.status(), Some(409));
    assert!(stale.to_string().contains("stale"), "{stale}");
    let other = app.register("intruder", 1).await;
    let intruder = client.append_log(job.id, &at(other, job.attempt, 4), b"x".to_vec()).await.unwrap_err();
    assert_eq!(intruder.status(), Some(409));
    let missing =
        client.append_log(JobId::new(job.id.get() + 100), &at(worker, 1, 0), b"x".to_vec()).await.unwrap_err();
    assert_eq!(missing.status(), Some(404));
    assert_eq!(client.log(JobId::new(job.id.get() + 100), &from(0)).await.unwrap_err().status(), Some(404));
    // After the report the attempt is over: appends are stale, readers see it finished.
    let report = ReportRequest { worker_id: worker, attempt: job.attempt, outcome: Outcome::Exited { code: 0 } };
    client.report(job.id, &report).await.unwrap();
    let late = client.append_log(job.id, &at(worker, job.attempt, 4), b"late".to_vec()).await.unwrap_err();
    assert_eq!(late.status(), Some(409));
    let chunk = client.log(job.id, &from(0)).await.unwrap();
    assert_eq!((chunk.text.as_str(), chunk.finished), ("0123", true));
}

#[tokio::test]
async fn a_queued_job_has_an_empty_unfinished_log() {
    let app = TestApp::spawn().await;
    app.submit(&testkit::sweep_of("waiting", 1)).await;
    let job = app.client.jobs(&Default::default()).await.unwrap().jobs.remove(0);
    let chunk = app.client.log(job.id, &from(0)).await.unwrap();
    assert_eq!((chunk.attempt, chunk.text.as_str(), chunk.next_offset, chunk.finished), (0, "", 0, false));
}

#[tokio::test]
async fn a_follower_of_a_queued_job_gets_the_first_lines_of_its_first_attempt() {
    let app = TestApp::spawn().await;
    app.submit(&testkit::sweep_of("later", 1)).await;
    let id = app.client.jobs(&Default::default()).await.unwrap().jobs[0].id;
    let client = app.client.clone();
    // As `app logs -f` does after an empty first answer: attempt 0 pinned.
    let query = LogQuery { attempt: Some(0), offset: 0, wait_ms: 20_000 };
    let follower = tokio::spawn(async move { client.log(id, &query).await.unwrap() });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let worker = app.register("w", 1).await;
    let job = app.claim(worker, 1).await.pop().unwrap();
    app.client.append_log(job.id, &at(worker, job.attempt, 0), b"started\n".to_vec()).await.unwrap();
    let chunk = tokio::time::timeout(Duration::from_secs(2), follower).await.expect("within 2 s").unwrap();
    assert_eq!((chunk.attempt, chunk.text.as_str(), chunk.finished), (1, "started\n", false));
}

#[tokio::test]
async fn a_follower_sees_a_new_line_at_once_and_learns_when_the_attempt_ends() {
    let app = TestApp::spawn().await;
    let (worker, job) = app.start_one("follow").await;
    let client = app.client.clone();
    let follower = tokio::spawn(async move {
        let chunk = client.log(job.id, &LogQuery { attempt: None, offset: 0, wait_ms: 20_000 }).await.unwrap();
        (chunk, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!follower.is_finished(), "the follower returned before anything was written");
    let appended = Instant::now();
    app.client.append_log(job.id, &at(worker, job.attempt, 0), b"step 1 loss 0.5\n".to_vec()).await.unwrap();
    let (chunk, returned) = tokio::time::timeout(Duration::from_secs(2), follower).await.expect("within 2 s").unwrap();
    assert_eq!(chunk.text, "step 1 loss 0.5\n");
    assert!(returned.duration_since(appended) < Duration::from_secs(2));
    // A follower waiting at the end is released by the end of the attempt.
    let client = app.client.clone();
    let next = chunk.next_offset;
    let follower = tokio::spawn(async move {
        client.log(job.id, &LogQuery { attempt: None, offset: next, wait_ms: 20_000 }).await.unwrap()
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let report = ReportRequest { worker_id: worker, attempt: job.attempt, outcome: Outcome::Exited { code: 0 } };
    assert_eq!(app.client.report(job.id, &report).await.unwrap().status, JobStatus::Succeeded);
    let last = tokio::time::timeout(Duration::from_secs(2), follower).await.expect("within 2 s").unwrap();
    assert!(last.finished && last.text.is_empty(), "{last:?}");
}

#[tokio::test]
async fn a_log_past_the_cap_is_truncated_once_and_still_acked() {
    let app = TestApp::spawn_with(|config| config.max_log_bytes_per_job = 100).await;
    let (worker, job) = app.start_one("chatty").await;
    let client = &app.client;
    let line = "x".repeat(59) + "\n";
    let mut offset = 0;
    for _ in 0..4 {
        let ack = client.append_log(job.id, &at(worker, job.attempt, offset), line.clone().into_bytes()).await.unwrap();
        offset += line.len() as u64;
        assert_eq!(ack.length, offset, "every byte is acked, kept or not");
    }
    let log =
        wait_until("the log can be read", Duration::from_secs(5), || async { client.log(job.id, &from(0)).await.ok() })
            .await;
    let marker = "[app: log truncated at 100 bytes]";
    assert!(log.text.starts_with(&line), "{:?}", log.text);
    assert_eq!(log.text.matches(marker).count(), 1, "{:?}", log.text);
    assert_eq!(log.text.len(), 100 + marker.len() + 2);
    assert_eq!(log.next_offset, log.text.len() as u64);
}
