//! Preemption by the scheduler through real processes (issue 29, item 3's "done when"): two
//! users on two workers of 4 fake GPUs (on PostgreSQL, two replicas with a worker each).
//! user-a's preemptible jobs fill all 8 GPUs; user-b's sweep arrives and holds half of them
//! within one `min_runtime` + grace; user-a's stopped jobs saved their epoch on SIGTERM and
//! resume from it, and in the end every job of both users succeeds, none failed, no epoch run
//! twice.

use crate::shares::{of, standing, Cluster, USER_A, USER_B};
use shared::api::{JobQuery, LogQuery, SubmitQuery};
use shared::job::JobStatus;
use std::time::{Duration, Instant};
use testkit::wait_until;

const MIN_RUNTIME_SECS: u64 = 4;
const GRACE_SECS: u64 = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_user_gets_half_the_gpus_by_preemption_and_the_preempted_jobs_resume_and_finish() {
    let cluster =
        Cluster::start(&format!("min_runtime_secs = {MIN_RUNTIME_SECS}\npreempt_grace_secs = {GRACE_SECS}\n"));
    let (user_a, user_b) = (cluster.client(USER_A), cluster.client(USER_B));
    // Eight jobs of 40 epochs of 0.3 s (12 s each) that save each epoch and on SIGTERM.
    let script = testkit::repo("examples/quickstart/train.py");
    let yaml = format!(
        "name: long-a\ncommand: python3 {} --epochs 40 --epoch-seconds 0.3 --seed {{seed}}\npreemptible: true\n\
         resources: {{gpus: 1}}\nenv: {{PYTHONUNBUFFERED: \"1\"}}\ngrid:\n  seed: [0, 1, 2, 3, 4, 5, 6, 7]\n",
        script.display()
    );
    user_a.submit(&yaml, &SubmitQuery::default()).await.unwrap();
    wait_until("user-a holds all 8 GPUs", Duration::from_secs(30), || async {
        (of(&standing(&user_a).await, "long-a").1 == 8).then_some(())
    })
    .await;
    user_b.submit(&crate::shares::gpu_sweep("grid-b", 8, 2), &SubmitQuery::default()).await.unwrap();
    let arrived = Instant::now();
    let bound = Duration::from_secs(MIN_RUNTIME_SECS + GRACE_SECS);
    let half = loop {
        let now = standing(&user_b).await;
        // (No check that user-a's and user-b's running jobs fit the 8 GPUs: a stopped job's
        // GPU is free once its process exits, and the worker may start the next job on it while
        // the stopped one's checkpoint is still uploading and its status says running.)
        let (_, b_running) = of(&now, "grid-b");
        if b_running >= 4 {
            break arrived.elapsed();
        }
        assert!(arrived.elapsed() < bound, "user-b did not get half the GPUs within min_runtime + grace: {now:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    eprintln!("user-b held half the GPUs {:.2} s after its submission", half.as_secs_f64());

    for (name, count) in [("long-a", 8), ("grid-b", 8)] {
        wait_until(&format!("{name} is through"), Duration::from_secs(180), || async {
            let sweep = user_a.sweep(name).await.ok()?;
            (sweep.info.counts.succeeded + sweep.info.counts.failed == count).then_some(sweep)
        })
        .await;
    }
    let query = |sweep: &str| JobQuery { sweep: Some(sweep.into()), limit: Some(100), ..JobQuery::default() };
    let jobs_b = user_a.jobs(&query("grid-b")).await.unwrap().jobs;
    assert!(jobs_b.iter().all(|job| job.status == JobStatus::Succeeded && job.attempt == 1), "{jobs_b:?}");
    let sweep_a = user_a.sweep("long-a").await.unwrap().info;
    assert!(sweep_a.preempted >= 4, "at least half of user-a's GPUs were freed by preemption: {sweep_a:?}");
    let mut resumed = 0;
    for job in user_a.jobs(&query("long-a")).await.unwrap().jobs {
        assert_eq!(job.status, JobStatus::Succeeded, "job {} of long-a", job.index);
        assert_eq!(job.crash_count, 0, "a preemption is not a crash");
        let attempts = user_a.job_attempts(job.id).await.unwrap();
        let mut next_epoch = 1;
        for attempt in 1..=job.attempt {
            let log =
                user_a.log(job.id, &LogQuery { attempt: Some(attempt), offset: 0, wait_ms: 0 }).await.unwrap().text;
            let epochs: Vec<u64> = log
                .lines()
                .filter_map(|line| line.strip_prefix("epoch ")?.split_whitespace().next()?.parse().ok())
                .collect();
            assert_eq!(epochs.first().copied(), Some(next_epoch), "job {} attempt {attempt}:\n{log}", job.index);
            assert!(epochs.windows(2).all(|pair| pair[1] == pair[0] + 1), "{log}");
            next_epoch = epochs.last().unwrap() + 1;
            if attempt < job.attempt {
                let reason = attempts[attempt as usize - 1].reason.clone().unwrap_or_default();
                assert_eq!(reason, "preempted for user-b's sweep grid-b", "job {} attempt {attempt}", job.index);
                assert!(log.contains(&format!("stopped by SIGTERM after epoch {}", next_epoch - 1)), "{log}");
            } else {
                resumed += usize::from(attempt > 1);
            }
        }
        assert_eq!(next_epoch, 41, "job {}: every epoch once, 1 to 40", job.index);
    }
    assert!(resumed >= 4, "{resumed} of user-a's jobs resumed");
}
