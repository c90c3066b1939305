//! A sweep whose program is misspelt (`python3 trian.py`) pauses itself after three failed
//! runs, with real server and worker processes, instead of failing every run it has; `app
//! wait` stops with the reason, and `app sweeps resume` lets it go on.

use shared::job::JobStatus;
use std::time::Duration;
use testkit::{app, wait_until, ServerProcess, WorkerProcess};

const LONG: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_misspelt_program_pauses_its_sweep_after_three_runs() {
    let server = ServerProcess::start();
    let _worker = WorkerProcess::start(&server.url, "box", &["--max-jobs", "1"]);
    let yaml = "name: typo\ncommand: python3 trian.py --lr {lr}\ngrid:\n  lr: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\n";
    server.submit(yaml).await;
    let paused = wait_until("the sweep pauses", LONG, || async {
        server.client().sweep("typo").await.ok().and_then(|sweep| sweep.info.paused)
    })
    .await;
    assert!(paused.reason.contains("3 runs failed and none has succeeded"), "{}", paused.reason);
    assert!(paused.reason.contains("trian.py"), "the reason quotes the log: {}", paused.reason);
    // One job at a time, but the worker may hold its next job already (`reserve`): that one
    // runs and fails too. The rest wait, and keep waiting.
    let count = |jobs: &[shared::api::Job], status| jobs.iter().filter(|job| job.status == status).count();
    let jobs = wait_until("nothing of it runs", LONG, || async {
        let jobs = server.jobs_of("typo").await;
        (count(&jobs, JobStatus::Running) == 0).then_some(jobs)
    })
    .await;
    let failed = count(&jobs, JobStatus::Failed);
    assert!((3..=4).contains(&failed) && count(&jobs, JobStatus::Queued) == 10 - failed, "{jobs:?}");

    let wait = app().args(["wait", "typo", "--url", &server.url]).output().unwrap();
    let said = String::from_utf8_lossy(&wait.stderr);
    assert!(!wait.status.success() && said.contains("paused") && said.contains("app sweeps resume"), "{said}");
    let listed = app().args(["status", "--url", &server.url]).output().unwrap();
    assert!(String::from_utf8_lossy(&listed.stdout).contains("typo (paused)"));
    let jobs = server.jobs_of("typo").await;
    assert_eq!(count(&jobs, JobStatus::Queued), 10 - failed, "nothing ran while paused");

    let resumed = app().args(["sweeps", "resume", "typo", "--url", &server.url]).output().unwrap();
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    assert!(String::from_utf8_lossy(&resumed.stdout).contains("resumed typo"));
    // Resumed, it runs again, and three more failures with none succeeded pause it again.
    let jobs = wait_until("it pauses again after three more runs", LONG, || async {
        let jobs = server.jobs_of("typo").await;
        let settled = count(&jobs, JobStatus::Running) == 0 && count(&jobs, JobStatus::Failed) >= failed + 3;
        (settled && server.client().sweep("typo").await.ok()?.info.paused.is_some()).then_some(jobs)
    })
    .await;
    assert!(count(&jobs, JobStatus::Failed) <= failed + 4 && count(&jobs, JobStatus::Queued) > 0, "{jobs:?}");
}

/// A script that reports `val/loss` in a sweep ranked by `val_loss`: `app submit --wait` says
/// so as soon as a run has finished, naming what did arrive; `app status SWEEP` and `app
/// results` say it too, and the dry run says where the metric must come from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metric_that_never_arrives_is_said_with_what_did() {
    let server = ServerProcess::start();
    let _worker = WorkerProcess::start(&server.url, "box", &["--max-jobs", "2"]);
    let project = tempfile::tempdir().unwrap();
    std::fs::write(
        project.path().join("report.sh"),
        "printf '{\"val/loss\": %s}\\n' \"$1\" >> \"$APP_METRICS_FILE\"\n",
    )
    .unwrap();
    let yaml =
        "name: blind\ncommand: sh report.sh {x}\nmetric: {name: val_loss, goal: minimize}\ngrid: {x: [1, 2, 3]}\n";
    std::fs::write(project.path().join("sweep.yaml"), yaml).unwrap();
    let submit = |extra: &[&str]| {
        app()
            .current_dir(project.path())
            .args(["submit", "sweep.yaml", "--url", &server.url])
            .args(extra)
            .output()
            .unwrap()
    };
    let dry = submit(&["--dry-run"]);
    let said = String::from_utf8_lossy(&dry.stdout);
    assert!(
        said.contains(
            "metric val_loss: each job reports it through wandb.log({\"val_loss\": ...}), TensorBoard scalars"
        ) && said.contains("or JSON lines appended to $APP_METRICS_FILE"),
        "{said}"
    );
    let waited = submit(&["--wait"]);
    let warned = String::from_utf8_lossy(&waited.stderr);
    assert!(waited.status.success(), "{warned}");
    assert!(
        warned.matches("has not arrived").count() == 1 && warned.contains("did you mean `val/loss`?"),
        "said once, with the likely name: {warned}"
    );
    let status = app().args(["status", "blind", "--url", &server.url]).output().unwrap();
    assert!(String::from_utf8_lossy(&status.stdout).contains("did you mean `val/loss`?"));
    let results = app().args(["results", "blind", "--url", &server.url]).output().unwrap();
    assert!(String::from_utf8_lossy(&results.stderr).contains("the metric `val_loss` has not arrived"));
}
