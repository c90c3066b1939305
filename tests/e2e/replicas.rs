//! Two server replicas on one PostgreSQL database, as processes: one is killed with SIGKILL, or
//! stopped with SIGSTOP (it hangs: connections are accepted, nothing is answered), in the
//! middle of a sweep, and the workers, given both URLs, go on through the other; every job
//! succeeds once (issue 15's failover, end to end).

use std::process::{Child, Stdio};
use std::time::Duration;
use testkit::{app, free_port, wait_until, PgServer, WorkerProcess};

fn replica(port: u16, data_dir: &std::path::Path, database: &str, log: &std::path::Path) -> Child {
    replica_with(port, data_dir, database, log, "")
}

/// A replica with `settings` (lines of its settings file's `[server]` table).
fn replica_with(port: u16, data_dir: &std::path::Path, database: &str, log: &std::path::Path, settings: &str) -> Child {
    let config = log.with_extension("toml");
    std::fs::write(&config, format!("[server]\n{settings}")).unwrap();
    let child = app()
        .args(["--server-only", "--bind", &format!("127.0.0.1:{port}"), "--config"])
        .arg(&config)
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--database-url", database])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    testkit::wait_until_sync("the replica listens", Duration::from_secs(30), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    child
}

/// What a replica started with `config` says as it refuses to start; fails the test if it
/// starts instead (killed, so that the test ends rather than waits on a serving replica).
fn refused_start(config: &std::path::Path, data_dir: &std::path::Path, database: &str) -> String {
    let mut replica = app()
        .args(["--server-only", "--bind", &format!("127.0.0.1:{}", free_port()), "--config"])
        .arg(config)
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--database-url", database])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while replica.try_wait().unwrap().is_none() {
        if std::time::Instant::now() >= deadline {
            let _ = replica.kill();
            let _ = replica.wait();
            panic!("the replica started (or hung) instead of refusing to");
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    let output = replica.wait_with_output().unwrap();
    assert!(!output.status.success(), "the replica started");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Each of `jobs` jobs left exactly one line (its index) in `ran`: it ran once, whatever its
/// attempts say.
fn assert_each_ran_once(ran: &std::path::Path, jobs: usize) {
    let mut runs = vec![0; jobs];
    for line in std::fs::read_to_string(ran).unwrap().lines() {
        runs[line.trim().parse::<usize>().unwrap()] += 1;
    }
    for (index, count) in runs.iter().enumerate() {
        assert_eq!(*count, 1, "job {index} ran {count} times");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_sweep_loses_nothing_and_the_workers_go_on_through_the_other() {
    const JOBS: usize = 120;
    let pg = PgServer::start();
    let shared = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let (a_port, b_port) = (free_port(), free_port());
    let mut a = replica(a_port, shared.path(), &pg.url, &logs.path().join("a.log"));
    let mut b = replica(b_port, shared.path(), &pg.url, &logs.path().join("b.log"));
    // Workers try the URLs in order: they start on A.
    let urls = format!("http://127.0.0.1:{a_port},http://127.0.0.1:{b_port}");
    let workers: Vec<WorkerProcess> =
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
    assert_each_ran_once(&ran, JOBS);
    // Each worker says that it moved on (both were on A): at the request that found B, or at
    // the one that got no answer from A and was not sent again.
    for worker in &workers {
        assert!(worker.log().contains("next server URL"), "{}", worker.log());
    }
    let _ = b.kill();
    let _ = b.wait();
}

/// Whether heartbeats answered by the replica on `port` (its /metrics; no tokens here) rise by
/// two within `within`: a worker sticks to one URL, so then it is there.
async fn heartbeats_through(port: u16, within: Duration) -> bool {
    let count = || async move {
        let text = reqwest::get(format!("http://127.0.0.1:{port}/metrics")).await.ok()?.text().await.ok()?;
        text.lines()
            .filter(|line| {
                line.starts_with("app_http_request_duration_seconds_count")
                    && line.contains("route=\"/api/workers/{id}/heartbeat\"")
            })
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .reduce(|a, b| a + b)
    };
    let before = count().await.unwrap_or(0.0);
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        if count().await.is_some_and(|now| now >= before + 2.0) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// A replica that hangs (SIGSTOP: the kernel still accepts connections, nothing answers) must
/// not keep its workers' heartbeats waiting past their leases: before, a worker's request
/// waited 60 s against a 30 s lease, the other replica's reaper took its running jobs back,
/// and they ran twice. Now a registered worker gives a heartbeat a quarter of the lease (at
/// least 5 s) and its next request starts at the other URL; so is a finish or a claim, and a
/// finish goes to B at once. The worker's stall (the longest pause between two job starts
/// after A stopped) is measured: a minute when finishes waited 60 s on A, seconds now. B starts first, so B holds the
/// reaper's lock (a stopped A would hold it, and nothing would expire at all); the worker is
/// seen heartbeating through A (A's request counts) before A stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_hangs_mid_sweep_runs_nothing_twice() {
    const JOBS: usize = 24;
    let pg = PgServer::start();
    let shared = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let settings = "lease_secs = 20\nheartbeat_secs = 1\n";
    let (a_port, b_port) = (free_port(), free_port());
    let mut b = replica_with(b_port, shared.path(), &pg.url, &logs.path().join("b.log"), settings);
    let mut a = replica_with(a_port, shared.path(), &pg.url, &logs.path().join("a.log"), settings);
    let urls = format!("http://127.0.0.1:{a_port},http://127.0.0.1:{b_port}");
    let worker = WorkerProcess::start(&urls, "w0", &["--max-jobs", "4"]);
    let on_b = client::Client::new(&format!("http://127.0.0.1:{b_port}")).unwrap();
    let values: Vec<String> = (0..JOBS).map(|i| i.to_string()).collect();
    let ran = logs.path().join("ran");
    let starts = logs.path().join("starts");
    // Jobs long enough that the worker holds running jobs (and their leases) while A hangs.
    let yaml = format!(
        "name: hang\ncommand: \"sh -c 'date +%s.%N >> {}; echo {{i}} >> {}; sleep 1'\"\ngrid:\n  i: [{}]\n",
        starts.display(),
        ran.display(),
        values.join(", ")
    );
    on_b.submit(&yaml, &shared::api::SubmitQuery::default()).await.unwrap();
    let succeeded = || async {
        let sweep = on_b.sweep("hang").await.ok()?;
        Some(sweep.info.counts.succeeded as usize)
    };
    wait_until("the first jobs succeeded", Duration::from_secs(60), || async {
        succeeded().await.filter(|done| *done >= 4)
    })
    .await;
    // The worker sticks to the URL that answered last; it can start on B (an answer from A
    // it did not wait for sends it there). Then B hangs until the worker's requests go back to
    // A, and goes on (its reaper's lock is still its own).
    if !heartbeats_through(a_port, Duration::from_secs(10)).await {
        let b_pid = nix::unistd::Pid::from_raw(b.id() as i32);
        nix::sys::signal::kill(b_pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
        let back = heartbeats_through(a_port, Duration::from_secs(30)).await;
        nix::sys::signal::kill(b_pid, nix::sys::signal::Signal::SIGCONT).unwrap();
        let replica_log = |name: &str| std::fs::read_to_string(logs.path().join(name)).unwrap_or_default();
        assert!(
            back,
            "the worker does not heartbeat through A:\n{}\nA:\n{}\nB:\n{}",
            worker.log(),
            replica_log("a.log"),
            replica_log("b.log")
        );
    }
    let a_pid = nix::unistd::Pid::from_raw(a.id() as i32);
    nix::sys::signal::kill(a_pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let stopped_at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    // Past the leases the worker held when A stopped: with heartbeats waiting 60 s on A, B's
    // reaper would have taken its running jobs back by then, and they would run again. (A
    // claim A committed and never answered is handed out again, unrun: attempt 2 is allowed,
    // a second run is not.)
    wait_until("the whole sweep succeeded through the other replica", Duration::from_secs(150), || async {
        succeeded().await.filter(|done| *done == JOBS)
    })
    .await;
    let query = shared::api::JobQuery { sweep: Some("hang".into()), limit: Some(JOBS as u32), ..Default::default() };
    let jobs = on_b.jobs(&query).await.unwrap().jobs;
    assert_eq!(jobs.len(), JOBS);
    for job in &jobs {
        assert_eq!(job.status, shared::job::JobStatus::Succeeded, "{job:?}");
    }
    assert_each_ran_once(&ran, JOBS);
    // The stall: from A's stop, the longest wait for the next job start. Every finish and
    // claim the worker had sent to A was stuck there; they time out after a quarter of the
    // 20 s lease (5 s) and a finish goes on to B at once.
    let mut times: Vec<f64> = std::fs::read_to_string(&starts)
        .unwrap()
        .lines()
        .filter_map(|line| line.trim().parse().ok())
        .filter(|time| *time >= stopped_at)
        .collect();
    times.sort_by(f64::total_cmp);
    let stall = std::iter::once(stopped_at)
        .chain(times.iter().copied())
        .zip(times.iter().copied())
        .map(|(before, after)| after - before)
        .fold(0.0, f64::max);
    eprintln!("a hung replica stalled the worker for {stall:.1} s ({} job starts after it stopped)", times.len());
    assert!(!times.is_empty(), "no job started after A stopped");
    assert!(stall < 15.0, "a hung replica stalled the worker for {stall:.1} s");
    let _ = a.kill(); // SIGKILL ends a stopped process too
    let _ = a.wait();
    let _ = b.kill();
    let _ = b.wait();
}

#[tokio::test]
async fn a_replica_with_other_scheduler_settings_than_the_running_ones_is_refused_saying_which() {
    let pg = PgServer::start();
    let shared = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let mut a =
        replica_with(free_port(), shared.path(), &pg.url, &logs.path().join("a.log"), "min_runtime_secs = 60\n");
    // Another minimum runtime: refused at start, naming the group it is in.
    let config = logs.path().join("b.toml");
    std::fs::write(&config, "[server]\nmin_runtime_secs = 600\n").unwrap();
    let said = refused_start(&config, shared.path(), &pg.url);
    assert!(said.contains("other scheduler settings in its [server] table (preemption and backfill:"), "{said}");
    assert!(!said.contains("the quotas"), "{said}");
    // The same settings are fine.
    let mut c =
        replica_with(free_port(), shared.path(), &pg.url, &logs.path().join("c.log"), "min_runtime_secs = 60\n");
    assert!(c.try_wait().unwrap().is_none(), "{}", std::fs::read_to_string(logs.path().join("c.log")).unwrap());
    for replica in [&mut a, &mut c] {
        let _ = replica.kill();
        let _ = replica.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_with_another_lease_than_the_running_ones_is_refused_naming_both() {
    let pg = PgServer::start();
    let shared = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let mut a = replica_with(free_port(), shared.path(), &pg.url, &logs.path().join("a.log"), "lease_secs = 20\n");
    // Another lease: refused at start, saying both.
    let config = logs.path().join("b.toml");
    std::fs::write(&config, "[server]\nlease_secs = 30\n").unwrap();
    let said = refused_start(&config, shared.path(), &pg.url);
    assert!(said.contains("runs with lease_secs = 20, this one with lease_secs = 30"), "{said}");
    // The same lease is fine.
    let mut c = replica_with(free_port(), shared.path(), &pg.url, &logs.path().join("c.log"), "lease_secs = 20\n");
    assert!(c.try_wait().unwrap().is_none(), "{}", std::fs::read_to_string(logs.path().join("c.log")).unwrap());
    // With every replica gone, a new lease may start.
    for replica in [&mut a, &mut c] {
        let _ = replica.kill();
        let _ = replica.wait();
    }
    // (PostgreSQL ends the killed replicas' sessions as it reads their closed sockets: a start
    // in that moment may still see them, so a refused start is tried again.)
    let config = logs.path().join("d.toml");
    std::fs::write(&config, "[server]\nlease_secs = 30\n").unwrap();
    let port = free_port();
    let mut said = String::new();
    for _ in 0..20 {
        let mut d = app()
            .args(["--server-only", "--bind", &format!("127.0.0.1:{port}"), "--config"])
            .arg(&config)
            .arg("--data-dir")
            .arg(shared.path())
            .args(["--database-url", &pg.url])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() && d.try_wait().unwrap().is_none() {
            assert!(std::time::Instant::now() < deadline, "the replica neither listened nor ended");
            std::thread::sleep(Duration::from_millis(25));
        }
        if d.try_wait().unwrap().is_none() {
            let _ = d.kill();
            let _ = d.wait();
            return;
        }
        said = String::from_utf8_lossy(&d.wait_with_output().unwrap().stderr).into_owned();
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!("a replica with a new lease never started once the others were gone: {said}");
}
