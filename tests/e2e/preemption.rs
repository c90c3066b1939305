//! Preemption that resumes, through real processes (issue 29, item 3's mechanics): a running
//! job preempted by hand (`app preempt`'s endpoint) is stopped by its worker with SIGTERM; the
//! quick start's script saves the epoch under way and exits; its checkpoint is uploaded, the
//! job goes back to the queue with no retry spent, and its next attempt resumes from it with
//! `APP_RESUMED_FROM`. A job that ignores SIGTERM is killed after the server's grace and is
//! requeued all the same, never failed.

use shared::api::{JobId, LogQuery, SubmitQuery};
use shared::job::JobStatus;
use std::time::Duration;
use testkit::{wait_until, ServerProcess, WorkerProcess};

async fn log_of(server: &ServerProcess, job: JobId, attempt: u32) -> String {
    let query = LogQuery { attempt: Some(attempt), offset: 0, wait_ms: 0 };
    server.client().log(job, &query).await.map(|chunk| chunk.text).unwrap_or_default()
}

async fn running(server: &ServerProcess, sweep: &str, attempt: u32) -> shared::api::Job {
    wait_until(&format!("attempt {attempt} of {sweep} runs"), Duration::from_secs(30), || async {
        server.jobs_of(sweep).await.into_iter().find(|job| job.status == JobStatus::Running && job.attempt == attempt)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preempted_script_saves_on_sigterm_and_its_next_attempt_resumes_from_that_checkpoint() {
    let server = ServerProcess::start_with("lease_secs = 3\nheartbeat_secs = 0.5\npreempt_grace_secs = 10\n");
    let _worker = WorkerProcess::start(&server.url, "box", &[]);
    let script = testkit::repo("examples/quickstart/train.py");
    let yaml = format!(
        "name: long\ncommand: python3 {} --epochs 60 --epoch-seconds 0.2\nresources: {{gpus: 0}}\n\
         env: {{PYTHONUNBUFFERED: \"1\"}}\n",
        script.display()
    );
    let client = server.client();
    client.submit(&yaml, &SubmitQuery::default()).await.unwrap();
    let job = running(&server, "long", 1).await;
    wait_until("three epochs are done", Duration::from_secs(30), || async {
        log_of(&server, job.id, 1).await.contains("epoch   3").then_some(())
    })
    .await;
    let ordered = client.preempt_job(job.id).await.unwrap();
    assert_eq!(ordered.reason, "preempted by default", "a server without tokens: the user `default`");

    let finished = wait_until("the job finished", Duration::from_secs(60), || async {
        client.job(job.id).await.ok().filter(|job| job.status.is_terminal())
    })
    .await;
    let (first, second) = (log_of(&server, job.id, 1).await, log_of(&server, job.id, 2).await);
    assert_eq!(finished.status, JobStatus::Succeeded, "{first}\n{second}");
    assert_eq!((finished.attempt, finished.retries_left, finished.crash_count), (2, job.retries_left, 0));
    let saved = first
        .lines()
        .find_map(|line| line.strip_prefix("stopped by SIGTERM after epoch ")?.split(',').next()?.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no clean stop in attempt 1's log:\n{first}"));
    assert!(second.contains("[app] resuming from the checkpoint of attempt 1"), "{second}");
    assert!(second.contains(&format!("resuming at epoch {} from attempt 1's checkpoint", saved + 1)), "{second}");
    let attempts = client.job_attempts(job.id).await.unwrap();
    assert_eq!(attempts[0].status, JobStatus::Queued);
    assert_eq!(attempts[0].reason.as_deref(), Some("preempted by default"));
    let version = client.results(job.id).await.unwrap().pop().expect("the finished attempt's result");
    assert_eq!((version.attempt, version.record.resumed_from), (2, Some(1)), "one result: the resumed attempt's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_ignores_sigterm_is_killed_after_the_grace_and_requeued_not_failed() {
    let server = ServerProcess::start_with("lease_secs = 3\nheartbeat_secs = 0.5\npreempt_grace_secs = 1\n");
    let _worker = WorkerProcess::start(&server.url, "box", &[]);
    // An ignored signal stays ignored across exec: neither the shell nor its sleep hears SIGTERM.
    let yaml = "name: deaf\ncommand: \"sh -c 'trap \\\"\\\" TERM; echo deaf; sleep 60'\"\nresources: {gpus: 0}\n";
    let client = server.client();
    client.submit(yaml, &SubmitQuery::default()).await.unwrap();
    let job = running(&server, "deaf", 1).await;
    wait_until("it has started", Duration::from_secs(30), || async {
        log_of(&server, job.id, 1).await.contains("deaf").then_some(())
    })
    .await;
    client.preempt_job(job.id).await.unwrap();
    // Requeued and claimed again by the same worker: attempt 2 runs.
    let again = running(&server, "deaf", 2).await;
    assert_eq!((again.retries_left, again.crash_count), (job.retries_left, 0), "no retry spent, no crash");
    let attempts = client.job_attempts(job.id).await.unwrap();
    assert_eq!((attempts[0].status, attempts[0].reason.as_deref()), (JobStatus::Queued, Some("preempted by default")));
    let first = log_of(&server, job.id, 1).await;
    assert!(first.contains("did not exit within its grace after SIGTERM and was killed with SIGKILL"), "{first}");
    // It stored no checkpoint: the next attempt says it starts from zero.
    wait_until("attempt 2 has started", Duration::from_secs(30), || async {
        log_of(&server, job.id, 2).await.contains("deaf").then_some(())
    })
    .await;
    let second = log_of(&server, job.id, 2).await;
    assert!(second.contains("[app] no earlier attempt stored a checkpoint; attempt 2 starts from zero"), "{second}");
    client.cancel_job(job.id).await.unwrap();
}

/// Saves its step every 6 s (to a file renamed into place) and nothing on SIGTERM, which it
/// does not handle (it dies of it) or, with the argument `trap`, handles by saying so and
/// exiting; says "half" midway between saves.
const SAVES_EVERY_6_S: &str = r#"i=0
[ -f "$APP_CHECKPOINT_DIR/step" ] && i=$(cat "$APP_CHECKPOINT_DIR/step") && echo "resumed at $i"
[ "$1" = trap ] && trap 'echo "caught SIGTERM after save $i"; exit 0' TERM
while true; do
  sleep 3; echo "half $i"; sleep 3
  i=$((i + 1)); echo "$i" > "$APP_CHECKPOINT_DIR/step.tmp"; mv "$APP_CHECKPOINT_DIR/step.tmp" "$APP_CHECKPOINT_DIR/step"
  echo "saved $i"
done
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_dies_of_sigterm_is_stopped_right_after_its_next_checkpoint_one_that_handles_it_at_once() {
    // A grace of 16 s: the worker may wait up to 8 s for the next save (decision 0088).
    let server = ServerProcess::start_with("lease_secs = 3\nheartbeat_secs = 0.5\npreempt_grace_secs = 16\n");
    let _worker = WorkerProcess::start(&server.url, "box", &[]);
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("saves.sh");
    std::fs::write(&script, SAVES_EVERY_6_S).unwrap();
    let client = server.client();
    for (name, argument) in [("saver", ""), ("trapper", " trap")] {
        let yaml = format!("name: {name}\ncommand: sh {}{argument}\nresources: {{gpus: 0}}\n", script.display());
        client.submit(&yaml, &SubmitQuery::default()).await.unwrap();
    }
    let (job, trapper) = (running(&server, "saver", 1).await, running(&server, "trapper", 1).await);
    // Two saves tell the worker the interval; midway to the third, the orders come.
    for job in [&job, &trapper] {
        wait_until("two saves and half an interval", Duration::from_secs(60), || async {
            log_of(&server, job.id, 1).await.contains("half 2").then_some(())
        })
        .await;
        client.preempt_job(job.id).await.unwrap();
    }
    // The one that handles SIGTERM hears it at once: before its third save.
    running(&server, "trapper", 2).await;
    let trapped = log_of(&server, trapper.id, 1).await;
    assert!(
        trapped.contains("caught SIGTERM after save 2")
            && !trapped.contains("checkpoint was written")
            && !trapped.contains("next checkpoint"),
        "{trapped}"
    );
    client.cancel_job(trapper.id).await.unwrap();
    let second = running(&server, "saver", 2).await;
    assert_eq!((second.retries_left, second.crash_count), (job.retries_left, 0));
    let first = log_of(&server, job.id, 1).await;
    // Stopped at once, it would have lost the 3 s since save 2, and resumed from it.
    assert!(first.contains("saved 3") && first.contains("once the job's checkpoint was written"), "{first}");
    assert!(!first.contains("half 3"), "stopped right after save 3:\n{first}");
    wait_until("attempt 2 resumes from save 3", Duration::from_secs(30), || async {
        log_of(&server, job.id, 2).await.contains("resumed at 3").then_some(())
    })
    .await;
    client.cancel_job(job.id).await.unwrap();
}
