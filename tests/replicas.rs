//! Two server replicas on one PostgreSQL database, as processes: one is killed with SIGKILL in
//! the middle of a sweep, and the workers, given both URLs, go on through the other; every
//! job succeeds once (issue 15's failover, end to end).

mod common;

use common::{app, free_port, pg_server, wait_until, WorkerProcess};
use std::process::{Child, Stdio};
use std::time::Duration;

fn replica(port: u16, data_dir: &std::path::Path, database: &str, log: &std::path::Path) -> Child {
    let child = app()
        .args(["--server-only", "--bind", &format!("127.0.0.1:{port}"), "--data-dir"])
        .arg(data_dir)
        .args(["--database-url", database])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    common::wait_until_sync("the replica listens", Duration::from_secs(30), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    child
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_sweep_loses_nothing_and_the_workers_go_on_through_the_other() {
    const JOBS: usize = 120;
    let pg = pg_server::PgServer::start();
    let shared = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let (a_port, b_port) = (free_port(), free_port());
    let mut a = replica(a_port, shared.path(), &pg.url, &logs.path().join("a.log"));
    let mut b = replica(b_port, shared.path(), &pg.url, &logs.path().join("b.log"));
    // Workers try the URLs in order: they start on A.
    let urls = format!("http://127.0.0.1:{a_port},http://127.0.0.1:{b_port}");
    let _workers: Vec<WorkerProcess> =
        (0..2).map(|n| WorkerProcess::start(&urls, &format!("w{n}"), &["--max-jobs", "2"])).collect();
    let on_b = client::Client::new(&format!("http://127.0.0.1:{b_port}")).unwrap();
    let values: Vec<String> = (0..JOBS).map(|i| i.to_string()).collect();
    // Each run of a job leaves a line: how many times each ran, whatever its attempts say (a
    // job claimed in an answer the killed replica never sent is claimed again, unrun).
    let ran = logs.path().join("ran");
    let yaml = format!(
        "name: failover\ncommand: \"sh -c 'echo {{i}} >> {}; sleep 0.05'\"\ngrid:\n  i: [{}]\n",
        ran.display(),
        values.join(", ")
    );
    on_b.submit(&yaml, &shared::api::SubmitQuery::default()).await.unwrap();
    let succeeded = || async {
        let sweep = on_b.sweep("failover").await.ok()?;
        Some(sweep.info.counts.succeeded as usize)
    };
    wait_until("a quarter of the sweep succeeded", Duration::from_secs(60), || async {
        succeeded().await.filter(|done| *done >= JOBS / 4)
    })
    .await;
    a.kill().unwrap(); // SIGKILL
    a.wait().unwrap();
    wait_until("the whole sweep succeeded through the other replica", Duration::from_secs(120), || async {
        succeeded().await.filter(|done| *done == JOBS)
    })
    .await;
    let query =
        shared::api::JobQuery { sweep: Some("failover".into()), limit: Some(JOBS as u32), ..Default::default() };
    let jobs = on_b.jobs(&query).await.unwrap().jobs;
    assert_eq!(jobs.len(), JOBS);
    for job in &jobs {
        assert_eq!(job.status, shared::job::JobStatus::Succeeded, "{job:?}");
    }
    let lines = std::fs::read_to_string(&ran).unwrap();
    let mut runs = vec![0; JOBS];
    for line in lines.lines() {
        runs[line.trim().parse::<usize>().unwrap()] += 1;
    }
    for (index, count) in runs.iter().enumerate() {
        assert_eq!(*count, 1, "job {index} ran {count} times");
    }
    let _ = b.kill();
    let _ = b.wait();
}
