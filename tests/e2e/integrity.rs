//! Integrity under faults (issue 10): a full or read-only disk on the server, a server reset
//! under a running worker, two workers with one name, credentials in a job's environment, a
//! worker killed with SIGKILL, a full disk on the worker, idle and half-sent connections. Each
//! runs the real `app` binaries as processes on loopback.

use shared::api::{LogQuery, SubmitQuery};
use shared::job::JobStatus;
use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};
use testkit::{alive, disk, wait_until, wait_until_sync, ServerProcess, WorkerProcess};

const LONG: Duration = Duration::from_secs(90);

async fn finished_job(server: &ServerProcess, sweep: &str) -> shared::api::Job {
    wait_until(&format!("the job of {sweep} finished"), LONG, || async {
        let job = server.jobs_of(sweep).await.pop()?;
        job.status.is_terminal().then_some(job)
    })
    .await
}

/// Fills the filesystem under `dir` with one file until it is full; returns the file.
fn fill(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    let chunk = vec![7u8; 64 << 10];
    while file.write_all(&chunk).is_ok() {}
    let _ = file.sync_all();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_answers_507_keeps_serving_and_every_acknowledged_write_survives() {
    let server = ServerProcess::on_small_disk(24);
    let client = server.client();
    let data = server.outside(&server.data_dir());
    let mut acknowledged = vec![server.submit("name: before\ncommand: 'true'\ngrid: {i: [1, 2, 3]}\n").await];
    let filler = fill(&data);
    // Writes on a full disk: each is refused with 507 (never a bare 500) or, while a page of the
    // write-ahead log is still free, acknowledged; nothing in between.
    let mut refused = 0;
    for round in 0..40 {
        let yaml = format!("name: full-{round}\ncommand: 'echo {{i}}'\ngrid: {{i: [{}]}}\n", "1, ".repeat(50) + "2");
        match client.submit(&yaml, &SubmitQuery::default()).await {
            Ok(response) => acknowledged.push(response.name),
            Err(error) => {
                assert_eq!(error.status(), Some(507), "{error}");
                assert!(error.to_string().contains("disk is full"), "{error}");
                refused += 1;
            }
        }
    }
    assert!(refused > 0, "the disk never filled up");
    assert_eq!(client.health().await.unwrap().status, "ok", "reads go on");
    std::fs::remove_file(&filler).unwrap();
    // As soon as there is room again, writes succeed: no restart, no wedged connection.
    for round in 0..5 {
        let name = format!("after-{round}");
        acknowledged.push(server.submit(&format!("name: {name}\ncommand: 'true'\n")).await);
    }
    // What the server acknowledged is in its database: copy it (the server idle) and open the
    // copy with a new server, as a restart would.
    let copy = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(copy.path().join("data")).unwrap();
    for file in ["queue.db", "queue.db-wal"] {
        if data.join(file).exists() {
            std::fs::copy(data.join(file), copy.path().join("data").join(file)).unwrap();
        }
    }
    std::fs::write(copy.path().join("server.toml"), "[server]\n").unwrap();
    let restarted = ServerProcess::start_on_sqlite_in_dir(copy);
    let stored: Vec<String> = restarted.client().sweeps().await.unwrap().into_iter().map(|sweep| sweep.name).collect();
    for name in &acknowledged {
        assert!(stored.contains(name), "acknowledged sweep {name} is missing after the restart: {stored:?}");
    }
    assert!(alive(server.child.id()), "the server never went down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_data_directory_answers_503_saying_so_and_recovers_when_writable() {
    let server = ServerProcess::on_small_disk(24);
    let client = server.client();
    server.submit("name: logged\ncommand: 'true'\n").await;
    let worker = client.register(&testkit::cpu_worker("reader")).await.unwrap();
    let claim = shared::api::ClaimRequest { capacity: testkit::cpu(1), wait_ms: 0, reserve: 0 };
    let job = client.claim(worker.worker_id, &claim).await.unwrap().jobs.remove(0);
    let append = |offset| shared::api::LogAppend { worker_id: worker.worker_id, attempt: job.attempt, offset };
    client.append_log(job.id, &append(0), b"first\n".to_vec()).await.unwrap();
    // The logs become read-only under the running server (a read-only bind mount over them;
    // a remount of the whole disk is refused while the database is open for writing).
    let logs = server.data_dir().join("logs");
    let pid = server.child.id();
    disk::run_inside(pid, &format!("mount --bind '{0}' '{0}' && mount -o remount,bind,ro '{0}'", logs.display()));
    let error = client.append_log(job.id, &append(6), b"second\n".to_vec()).await.unwrap_err();
    assert_eq!(error.status(), Some(503), "{error}");
    assert!(error.to_string().contains("cannot write its data directory"), "{error}");
    assert_eq!(client.health().await.unwrap().status, "ok", "the server keeps serving");
    disk::run_inside(pid, &format!("umount '{}'", logs.display()));
    client.append_log(job.id, &append(6), b"second\n".to_vec()).await.unwrap();
    let text = client.log(job.id, &LogQuery::default()).await.unwrap().text;
    assert_eq!(text, "first\nsecond\n", "the refused append was taken whole once it could be");
}

#[test]
fn a_server_on_a_read_only_data_directory_refuses_to_start_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut app = testkit::app();
    app.args(["--server-only", "--bind", "127.0.0.1:0", "--data-dir"]).arg(&data);
    // A tmpfs mounted read-only where the data directory is.
    let mut wrapped = std::process::Command::new("unshare");
    wrapped
        .args([disk::namespace_flags(), "sh", "-c", r#"mount -t tmpfs -o ro tmpfs "$1" && shift && exec "$@""#, "sh"])
        .arg(&data)
        .arg(app.get_program())
        .args(app.get_args());
    std::fs::create_dir_all(&data).unwrap();
    let output = wrapped.stdin(std::process::Stdio::null()).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("is not writable") && stderr.contains("Read-only file system"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_reset_under_a_running_worker_never_takes_the_old_jobs_report_for_a_new_one() {
    let port = testkit::free_port();
    let first = ServerProcess::start_on(port);
    let worker = WorkerProcess::start(&first.url, "survivor", &[]);
    let pid_file = worker.dir.path().join("old.pid");
    first
        .submit(&format!(
            "name: old\ncommand: 'echo $$ > {}; echo old-job; sleep 30; echo old > \"$APP_OUTPUT_DIR/who.txt\"'\n",
            pid_file.display()
        ))
        .await;
    wait_until("the old job runs", LONG, || async {
        first.jobs_of("old").await.pop().filter(|job| job.status == JobStatus::Running)
    })
    .await;
    drop(first);
    // A new server on the same port, with an empty database: its job ids start at 1 again.
    let second = ServerProcess::start_on(port);
    second.submit("name: new\ncommand: 'echo new-job; echo new > \"$APP_OUTPUT_DIR/who.txt\"'\n").await;
    let job = finished_job(&second, "new").await;
    assert_eq!((job.status, job.attempt), (JobStatus::Succeeded, 1), "{job:#?}");
    let client = second.client();
    let log = client.log(job.id, &LogQuery::default()).await.unwrap().text;
    assert!(log.contains("new-job") && !log.contains("old-job"), "{log}");
    let versions = client.results(job.id).await.unwrap();
    assert_eq!(versions.len(), 1);
    let file = tempfile::NamedTempFile::new().unwrap();
    client.download_file(job.id, 1, "who.txt", file.path()).await.unwrap();
    assert_eq!(std::fs::read_to_string(file.path()).unwrap().trim(), "new");
    assert!(worker.log().contains("no longer knows this worker's session"), "{}", worker.log());
    // The old attempt was stopped, not finished late into the new server.
    let old: u32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
    wait_until_sync("the old job's process is gone", LONG, || !alive(old));
}

/// An HTTP/1.1 proxy on loopback in front of the server at `target`, which holds each claim's
/// answer for `hold` before passing it on (bodies by Content-Length, as the worker's requests
/// and their answers have them). Returns its port.
async fn proxy_holding_claims(target: u16, hold: Duration) -> u16 {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    /// One message (head and body) from `from`, or None at the end of the stream.
    async fn message(from: &mut BufReader<tokio::net::tcp::OwnedReadHalf>) -> Option<(String, Vec<u8>)> {
        let mut head = String::new();
        loop {
            let mut line = String::new();
            if from.read_line(&mut line).await.ok()? == 0 {
                return None;
            }
            head.push_str(&line);
            if line == "\r\n" {
                break;
            }
        }
        let length = head
            .lines()
            .find_map(|line| line.to_ascii_lowercase().strip_prefix("content-length:").map(|n| n.trim().to_string()))
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        let mut body = vec![0; length];
        from.read_exact(&mut body).await.ok()?;
        Some((head, body))
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await else { return };
                let (client_read, mut client_write) = client.into_split();
                let (server_read, mut server_write) = server.into_split();
                let (mut client_read, mut server_read) = (BufReader::new(client_read), BufReader::new(server_read));
                while let Some((head, body)) = message(&mut client_read).await {
                    let claim = head.lines().next().is_some_and(|line| line.contains("/claim "));
                    if server_write.write_all(head.as_bytes()).await.is_err()
                        || server_write.write_all(&body).await.is_err()
                    {
                        return;
                    }
                    let Some((head, body)) = message(&mut server_read).await else { return };
                    if claim {
                        tokio::time::sleep(hold).await;
                    }
                    if client_write.write_all(head.as_bytes()).await.is_err()
                        || client_write.write_all(&body).await.is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_answering_an_earlier_registration_does_not_make_the_worker_register_twice() {
    // Claims are held 1.5 s on their way back: a claim sent just after the server was reset is
    // refused (401) only after a heartbeat's refusal made the worker register again. The second
    // server's lease is 6 s: a job its worker's heartbeats do not list counts as lost half a
    // lease after its claim, and with 3 s that was the hold itself (the job claimed by the
    // second registration was taken back as often as not).
    let port = testkit::free_port();
    let first = ServerProcess::start_on(port);
    let proxy = proxy_holding_claims(port, Duration::from_millis(1500)).await;
    let worker = WorkerProcess::start(&format!("http://127.0.0.1:{proxy}"), "steady", &["--max-jobs", "1"]);
    wait_until("the worker registered", LONG, || async {
        (!first.client().workers().await.ok()?.is_empty()).then_some(())
    })
    .await;
    drop(first);
    let second = ServerProcess::start_at(port, "lease_secs = 6\nheartbeat_secs = 0.5\n");
    second.submit("name: after\ncommand: 'sleep 6'\n").await;
    let job = finished_job(&second, "after").await;
    // The job started under the worker's second registration ran to its end at attempt 1: a
    // third registration (holding nothing) would have stopped it and handed it back.
    assert_eq!((job.status, job.attempt), (JobStatus::Succeeded, 1), "{job:#?}\n{}", worker.log());
    let registrations = worker.log().matches("registered with the server").count();
    assert_eq!(registrations, 2, "{}", worker.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_live_workers_with_one_name_get_their_own_ids_and_leave_each_others_jobs_alone() {
    let server = ServerProcess::start();
    let first = WorkerProcess::start(&server.url, "twin", &["--max-jobs", "1"]);
    server.submit("name: long\ncommand: 'sleep 3'\n").await;
    let running = wait_until("the first twin runs the job", LONG, || async {
        server.jobs_of("long").await.pop().filter(|job| job.status == JobStatus::Running)
    })
    .await;
    let second = WorkerProcess::start(&server.url, "twin", &["--max-jobs", "1"]);
    let workers = wait_until("both twins registered", LONG, || async {
        let workers = server.client().workers().await.ok()?;
        (workers.len() == 2).then_some(workers)
    })
    .await;
    let names: Vec<&str> = workers.iter().map(|worker| worker.name.as_str()).collect();
    assert_eq!(names, ["twin", "twin-2"]);
    assert_ne!(workers[0].id, workers[1].id);
    assert!(second.log().contains("registered under another"), "{}", second.log());
    let job = finished_job(&server, "long").await;
    assert_eq!((job.status, job.attempt, job.crash_count), (JobStatus::Succeeded, 1, 0), "{job:#?}");
    assert_eq!(job.worker_id, running.worker_id, "the first twin kept its job");
    drop(first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_never_see_the_credentials_in_their_workers_environment() {
    let server = ServerProcess::start();
    let token_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(token_file.path(), "file-token-hhhhhhhhhhhhhhhh\n").unwrap();
    let token_path = token_file.path().to_str().unwrap();
    let secrets = [
        ("APP_TOKEN", "token-aaaaaaaaaaaaaaaaaaaa"),
        ("APP_USER_TOKEN", "user-bbbbbbbbbbbbbbbbbbbb"),
        ("APP_WORKER_TOKEN", "worker-cccccccccccccccccc"),
        ("APP_USER_TOKEN_FILE", "/run/secrets/user-dddddddd"),
        ("APP_WORKER_TOKEN_FILE", "/run/secrets/worker-eeeeee"),
        ("APP_TOKEN_FILE", token_path),
    ];
    // With no token configured on the server, a worker's bearer token is simply not checked.
    let _worker = WorkerProcess::start_with_env(&server.url, "careful", &secrets);
    server.submit("name: env\ncommand: 'env | sort'\n").await;
    let job = finished_job(&server, "env").await;
    assert_eq!(job.status, JobStatus::Succeeded, "{job:#?}");
    let log = server.client().log(job.id, &LogQuery::default()).await.unwrap().text;
    assert!(log.contains("APP_JOB_ID="), "{log}");
    for (name, value) in secrets {
        assert!(!log.contains(value), "{name}'s value reached the job:\n{log}");
        assert!(!log.contains(&format!("{name}=")), "{name} reached the job:\n{log}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_with_sigkill_takes_its_jobs_processes_with_it() {
    let server = ServerProcess::start();
    let mut worker = WorkerProcess::start(&server.url, "doomed", &[]);
    let pids = tempfile::tempdir().unwrap();
    let dir = pids.path().display();
    server
        .submit(&format!("name: orphan\ncommand: 'echo $$ > {dir}/leader; sleep 1000 & echo $! > {dir}/child; wait'\n"))
        .await;
    let read = |name: &str| std::fs::read_to_string(pids.path().join(name)).ok()?.trim().parse::<u32>().ok();
    let (leader, child) = {
        let mut found = None;
        wait_until_sync("the job wrote its pids", LONG, || {
            found = read("leader").zip(read("child"));
            found.is_some()
        });
        found.unwrap()
    };
    assert!(alive(leader) && alive(child));
    worker.child.kill().unwrap();
    worker.child.wait().unwrap();
    let killed = Instant::now();
    wait_until_sync("the job's processes died with their worker", Duration::from_secs(10), || {
        !alive(leader) && !alive(child)
    });
    assert!(killed.elapsed() < Duration::from_secs(10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_on_the_worker_marks_the_job_and_says_so_in_its_log() {
    let server = ServerProcess::start();
    let _worker = WorkerProcess::on_small_disk(&server.url, "cramped", 8);
    // The job fills the worker's disk and prints 1,001 lines the worker cannot keep. The disk
    // stays full until the worker releases the slot: freed by the job itself, it could be free
    // again before the worker, waiting for a CPU on a loaded box, wrote a line.
    server
        .submit(
            "name: cramped\ncommand: 'head -c 64M /dev/zero > filler 2>/dev/null; \
             for i in $(seq 1 1001); do echo \"line $i of the output\"; done'\n",
        )
        .await;
    let job = finished_job(&server, "cramped").await;
    assert_eq!(job.status, JobStatus::Succeeded, "{job:#?}");
    assert!(job.notes.iter().any(|note| note.contains("worker disk full")), "{:?}", job.notes);
    let log = server.client().log(job.id, &LogQuery::default()).await.unwrap().text;
    assert!(log.contains("[app] worker disk full"), "{log}");
}

/// The HTTP/2 connection preface a client sends first.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// An empty HTTP/2 SETTINGS frame.
const H2_SETTINGS: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];
/// A HEADERS frame on stream 1 without END_HEADERS (its CONTINUATION never comes): one
/// literal header, `:method: GET`, indexed (0x82).
const H2_HEADERS_OPEN: &[u8] = &[0, 0, 1, 1, 0x1, 0, 0, 0, 1, 0x82];

/// What a client may send and then fall silent with.
#[derive(Debug, Clone, Copy)]
enum Silence {
    Nothing,
    OneByte,
    HalfHead,
    H2Preface,
    H2Settings,
    H2OpenHeaders,
    StalledBody,
}

impl Silence {
    const ALL: [Silence; 7] = [
        Silence::Nothing,
        Silence::OneByte,
        Silence::HalfHead,
        Silence::H2Preface,
        Silence::H2Settings,
        Silence::H2OpenHeaders,
        Silence::StalledBody,
    ];

    fn bytes(self) -> Vec<u8> {
        match self {
            Silence::Nothing => Vec::new(),
            Silence::OneByte => b"P".to_vec(),
            Silence::HalfHead => b"GET /api/health HTTP/1.1\r\nHost: x\r\n".to_vec(),
            Silence::H2Preface => H2_PREFACE.to_vec(),
            Silence::H2Settings => [H2_PREFACE, H2_SETTINGS].concat(),
            Silence::H2OpenHeaders => [H2_PREFACE, H2_SETTINGS, H2_HEADERS_OPEN].concat(),
            // A whole head promising a body that never comes.
            Silence::StalledBody => {
                b"POST /api/sweeps HTTP/1.1\r\nHost: x\r\nContent-Type: application/yaml\r\nContent-Length: 100\r\n\r\n"
                    .to_vec()
            }
        }
    }
}

/// A socket from `from` (a loopback address) to the server that sends `silence` and then
/// nothing more.
async fn silent_connection(from: [u8; 4], port: u16, silence: Silence) -> std::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(std::net::SocketAddr::from((from, 0))).unwrap();
    let stream = socket.connect(std::net::SocketAddr::from(([127, 0, 0, 1], port))).await.unwrap();
    let mut stream = stream.into_std().unwrap();
    stream.set_nonblocking(false).unwrap();
    let _ = stream.write_all(&silence.bytes());
    stream
}

/// Whether the server closed `stream` (reading reaches its end or a reset) within `limit`;
/// what it said before closing must be an error status, never a success.
fn closed_within(stream: &mut std::net::TcpStream, limit: Duration) -> bool {
    stream.set_read_timeout(Some(limit)).unwrap();
    let mut said = Vec::new();
    let closed = match stream.read_to_end(&mut said) {
        Ok(_) => true,
        Err(error) => error.kind() == std::io::ErrorKind::ConnectionReset,
    };
    let said = String::from_utf8_lossy(&said);
    assert!(!said.contains(" 200 ") && !said.contains(" 201 "), "{said}");
    closed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_that_never_deliver_a_request_are_closed_whatever_they_sent() {
    let server = ServerProcess::start_with("header_timeout_secs = 1\nbody_idle_secs = 1\n");
    let mut held = Vec::new();
    for silence in Silence::ALL {
        held.push((silence, silent_connection([127, 0, 0, 2], server.port, silence).await));
    }
    // Others are served meanwhile, and a long poll longer than the header timeout completes.
    let started = Instant::now();
    assert_eq!(server.client().health().await.unwrap().status, "ok");
    assert!(started.elapsed() < Duration::from_secs(1), "health took {:?}", started.elapsed());
    let follow = LogQuery { attempt: None, offset: 0, wait_ms: 2_500 };
    server.submit("name: waiting\ncommand: 'true'\nresources: {gpus: 8}\n").await;
    let job = server.jobs_of("waiting").await.pop().unwrap();
    let polled = Instant::now();
    server.client().log(job.id, &follow).await.unwrap();
    assert!(polled.elapsed() >= Duration::from_secs(2), "the long poll was cut short");
    // Every silent connection was closed within its timeout (1 s, checked every 0.25 s or so),
    // whatever it had sent.
    for (silence, stream) in &mut held {
        assert!(closed_within(stream, Duration::from_secs(5)), "{silence:?} is still open");
    }
    let open = std::fs::read_dir(format!("/proc/{}/fd", server.child.id())).unwrap().count();
    assert!(open < 40, "the server still holds {open} descriptors");
    // A client that sends requests and never reads the answers: once hyper cannot hand an
    // answer on for the body-idle time, the connection goes (it would be busy for ever).
    let mut unread = silent_connection([127, 0, 0, 3], server.port, Silence::Nothing).await;
    unread.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    let request = b"GET /api/health HTTP/1.1\r\nHost: x\r\n\r\n".repeat(1000);
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) && unread.write_all(&request).is_ok() {}
    assert!(closed_within_unread(&mut unread, Duration::from_secs(10)), "a connection that never reads stays open");
}

/// Whether the server closed `stream` within `limit`, whatever it answered (read and dropped).
fn closed_within_unread(stream: &mut std::net::TcpStream, limit: Duration) -> bool {
    stream.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let deadline = Instant::now() + limit;
    let mut buffer = vec![0u8; 1 << 20];
    // Read slowly (a few reads, then wait): the server must give up on it, not this reader.
    while Instant::now() < deadline {
        match stream.read(&mut buffer) {
            Ok(0) => return true,
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => return true,
            _ => std::thread::sleep(Duration::from_millis(1500)),
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twice_the_connection_cap_of_silent_clients_leaves_health_and_a_worker_served() {
    // Long timeouts: what keeps everyone served here is eviction at the caps, not the timers.
    const CAP: usize = 48;
    let server = ServerProcess::start_with(&format!(
        "header_timeout_secs = 600\nbody_idle_secs = 600\nmax_connections = {CAP}\nmax_connections_per_address = 16\n"
    ));
    let worker = WorkerProcess::start(&server.url, "busy", &["--max-jobs", "2"]);
    let client = server.client();
    wait_until("the worker registered", LONG, || async { (!client.workers().await.ok()?.is_empty()).then_some(()) })
        .await;
    server.submit("name: first\ncommand: 'true'\ngrid: {i: [1, 2, 3, 4]}\n").await;
    // 2 x the cap from four other loopback addresses: idle, HTTP/2 prefaces, stalled bodies...
    let mut held = Vec::new();
    for number in 0..2 * CAP {
        let from = [127, 0, 0, 2 + (number % 4) as u8];
        held.push(silent_connection(from, server.port, Silence::ALL[number % Silence::ALL.len()]).await);
        if number % 8 == 7 {
            // ... and health checks keep being answered, each within a second.
            let asked = Instant::now();
            assert_eq!(client.health().await.unwrap().status, "ok");
            assert!(asked.elapsed() < Duration::from_secs(1), "health took {:?} after {number}", asked.elapsed());
        }
    }
    // The worker goes on: a sweep submitted now runs to its end.
    server.submit("name: second\ncommand: 'true'\ngrid: {i: [1, 2, 3, 4]}\n").await;
    for sweep in ["first", "second"] {
        let jobs = wait_until(&format!("{sweep} ended"), LONG, || async {
            let jobs = server.jobs_of(sweep).await;
            jobs.iter().all(|job| job.status.is_terminal()).then_some(jobs)
        })
        .await;
        assert!(jobs.iter().all(|job| job.status == JobStatus::Succeeded), "{jobs:#?}");
    }
    let asked = Instant::now();
    assert_eq!(client.health().await.unwrap().status, "ok");
    assert!(asked.elapsed() < Duration::from_secs(1), "health took {:?}", asked.elapsed());
    // The oldest silent connections were evicted to make room: most are closed by now.
    let closed = held
        .iter_mut()
        .map(|stream| closed_within(stream, Duration::from_millis(200)))
        .filter(|closed| *closed)
        .count();
    assert!(closed >= CAP, "only {closed} of {} silent connections were closed", held.len());
    let open = std::fs::read_dir(format!("/proc/{}/fd", server.child.id())).unwrap().count();
    assert!(open < CAP + 40, "the server holds {open} descriptors");
    // One address past its own cap (16): its oldest unused connections go, once they have held
    // for the eviction grace (250 ms), and one warning is said.
    let mut crowd = Vec::new();
    for _ in 0..16 {
        crowd.push(silent_connection([127, 0, 0, 9], server.port, Silence::Nothing).await);
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    for _ in 0..8 {
        crowd.push(silent_connection([127, 0, 0, 9], server.port, Silence::Nothing).await);
    }
    let closed =
        crowd.iter_mut().map(|stream| closed_within(stream, Duration::from_millis(500))).filter(|c| *c).count();
    assert!(closed >= 8, "one address holds {} unused connections past its cap of 16", 24 - closed);
    // Warnings are said once a minute (per address), not once per eviction.
    let log = server.log();
    let warnings_of = |address: &str| {
        log.lines()
            .filter(|line| line.contains("holds its most unused") && line.contains(&format!("address={address} ")))
            .count()
    };
    for address in ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"] {
        assert!(warnings_of(address) <= 1, "{address} warned more than once:\n{log}");
    }
    assert_eq!(warnings_of("127.0.0.9"), 1, "{log}");
    assert_eq!(log.matches("the server holds its most connections").count(), 1, "{log}");
    drop(worker);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_while_finishes_claim_the_next_jobs_loses_and_duplicates_nothing() {
    // Short jobs: nearly every moment some worker is between its report and its next claim,
    // which the one-request finish makes one transaction.
    const JOBS: u64 = 600;
    let mut server = ServerProcess::start();
    let workers: Vec<WorkerProcess> =
        (0..2).map(|n| WorkerProcess::start(&server.url, &format!("quick-{n}"), &["--max-jobs", "2"])).collect();
    let values: Vec<String> = (0..JOBS).map(|i| i.to_string()).collect();
    server.submit(&format!("name: quick\ncommand: 'true'\ngrid:\n  i: [{}]\n", values.join(", "))).await;
    let done = shared::api::JobQuery {
        sweep: Some("quick".into()),
        status: Some(JobStatus::Succeeded),
        limit: Some(1),
        ..Default::default()
    };
    wait_until("a third of the sweep succeeded", LONG, || async {
        (server.client().jobs(&done).await.ok()?.total >= JOBS / 3).then_some(())
    })
    .await;
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    wait_until("the workers noticed", LONG, || async {
        workers.iter().all(|worker| worker.log().contains("failed")).then_some(())
    })
    .await;
    server.restart();
    let jobs = wait_until("every job ended", LONG, || async {
        let jobs = server.jobs_of("quick").await;
        jobs.iter().all(|job| job.status.is_terminal()).then_some(jobs)
    })
    .await;
    assert_eq!(jobs.len() as u64, JOBS);
    let client = server.client();
    for job in &jobs {
        assert_eq!(job.status, JobStatus::Succeeded, "{job:#?}");
        let events = client.job_events(job.id).await.unwrap();
        let successes = events.iter().filter(|event| event.to == JobStatus::Succeeded).count();
        assert_eq!(successes, 1, "job {} succeeded {successes} times", job.id);
        assert_eq!(client.results(job.id).await.unwrap().len(), 1, "job {} has one result version", job.id);
    }
}
