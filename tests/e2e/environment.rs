//! End-to-end tests of where and how jobs run: `workdir:` (a fixed directory, or a clear
//! failure when the worker lacks it), `env:` after the worker's own variables, and `setup:` in
//! the command's shell (its failure fails the job as "setup failed", its output in the log).

use shared::api::{Job, LogQuery, SubmitQuery};
use shared::job::JobStatus;
use std::time::Duration;
use testkit::{wait_until, ServerProcess, WorkerProcess};

async fn run_to_end(server: &ServerProcess, yaml: &str) -> (Job, String) {
    let client = server.client();
    let name = client.submit(yaml, &SubmitQuery::default()).await.unwrap().name;
    let job = wait_until(&format!("{name} finished"), Duration::from_secs(60), || async {
        server.jobs_of(&name).await.into_iter().find(|job| job.status.is_terminal())
    })
    .await;
    let log = client.log(job.id, &LogQuery::default()).await.map(|chunk| chunk.text).unwrap_or_default();
    (job, log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workdir_env_and_setup_shape_the_job_and_their_failures_say_what_failed() {
    let server = ServerProcess::start();
    let _worker = WorkerProcess::start(&server.url, "lab-box", &[]);
    let shared = tempfile::tempdir().unwrap();
    std::fs::write(shared.path().join("marker.txt"), "on the shared filesystem\n").unwrap();
    let shared_dir = shared.path().canonicalize().unwrap();

    let yaml = format!("name: fixed\nworkdir: {}\ncommand: 'pwd; cat marker.txt'\n", shared_dir.display());
    let (job, log) = run_to_end(&server, &yaml).await;
    assert_eq!(job.status, JobStatus::Succeeded, "{log}");
    assert_eq!(log, format!("{}\non the shared filesystem\n", shared_dir.display()));

    let (job, log) = run_to_end(&server, "name: missing\nworkdir: /nonexistent/lab/project\ncommand: 'true'\n").await;
    assert_eq!(job.status, JobStatus::Failed);
    let reason = job.reason.unwrap_or_default();
    assert_eq!(reason, "workdir `/nonexistent/lab/project` does not exist on worker lab-box");
    assert!(log.contains(&reason), "said in the job's log too: {log}");

    // A virtual environment's `activate`, as `source` reads it.
    let activate = shared_dir.join("activate");
    std::fs::write(&activate, "export WHO=world\n").unwrap();
    let yaml = format!(
        "name: shaped\nenv: {{GREETING: hello, COUNT: 3}}\nsetup: 'echo preparing; source {}'\n\
         command: 'echo \"$GREETING $WHO $COUNT $APP_ATTEMPT\"'\n",
        activate.display()
    );
    let (job, log) = run_to_end(&server, &yaml).await;
    assert_eq!(job.status, JobStatus::Succeeded, "{log}");
    assert_eq!(log, "preparing\nhello world 3 1\n", "setup's variables hold in the command's shell");

    let yaml = "name: broken\nsetup: 'echo activating; source /nonexistent/venv/bin/activate'\ncommand: 'echo never'\n";
    let (job, log) = run_to_end(&server, yaml).await;
    assert_eq!(job.status, JobStatus::Failed);
    let reason = job.reason.unwrap_or_default();
    assert!(
        reason.starts_with("setup failed: `echo activating; source /nonexistent/venv/bin/activate` exited with code"),
        "{reason}"
    );
    // Its output (stdout and stderr, in either order) is in the log; the command never ran.
    assert!(log.contains("activating\n") && log.contains("No such file or directory"), "{log}");
    assert!(!log.contains("never"), "{log}");

    // The command's own failure stays the command's.
    let (job, _) = run_to_end(&server, "name: own\nsetup: 'true'\ncommand: 'exit 4'\n").await;
    assert_eq!(job.reason.as_deref(), Some("exited with code 4"));
}
