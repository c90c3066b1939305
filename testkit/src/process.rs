//! The real `app` binary as server and worker processes on loopback, each with its own
//! temporary directory, killed when dropped.

use crate::{disk, free_port, postgres, wait_until_sync};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `app` (the binary of this workspace), with none of the caller's app settings in its
/// environment.
pub fn app() -> Command {
    let mut command = Command::new(app_binary());
    command
        .env_remove("APP_URL")
        .env_remove("APP_WORKER_NAME")
        .env_remove("APP_FAKE_GPUS")
        .env_remove("RUST_LOG")
        .env_remove("APP_TOKEN")
        .env_remove("APP_TOKEN_FILE")
        .env_remove("APP_USER_TOKEN")
        .env_remove("APP_WORKER_TOKEN")
        .env_remove("APP_CA")
        // The GPUs and threads a worker uses follow these; tests set them when they mean to.
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env_remove("OMP_NUM_THREADS")
        .stdin(Stdio::null());
    command
}

/// The `app` binary Cargo built beside this test: `NEXTEST_BIN_EXE_app` under nextest, else
/// the profile directory above the test's own `deps/` (Cargo builds a package's binaries for
/// its integration tests).
pub fn app_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("NEXTEST_BIN_EXE_app") {
        return PathBuf::from(path);
    }
    let test = std::env::current_exe().expect("the test's own path");
    let profile = test.parent().and_then(Path::parent).expect("the test binary lies in <profile>/deps/");
    let app = profile.join("app");
    assert!(app.is_file(), "no app binary at {} (run the tests of the app package)", app.display());
    app
}

/// `app --server-only` on a fixed loopback port with short leases and heartbeats; with
/// `APP_TEST_BACKEND=postgres`, on a fresh database of the test process's own PostgreSQL
/// (`postgres::test_database`), else on the SQLite file in its data directory.
pub struct ServerProcess {
    pub child: Child,
    pub port: u16,
    pub url: String,
    pub dir: tempfile::TempDir,
    /// The PostgreSQL database it runs on, kept across restarts.
    pub database: Option<String>,
}

impl ServerProcess {
    pub fn start() -> ServerProcess {
        Self::start_with("lease_secs = 3\nheartbeat_secs = 0.5\n")
    }

    /// On a port chosen beforehand (a worker may already be trying it).
    pub fn start_on(port: u16) -> ServerProcess {
        Self::start_at(port, "lease_secs = 3\nheartbeat_secs = 0.5\n")
    }

    /// `settings` are lines of the `[server]` table of its config file.
    pub fn start_with(settings: &str) -> ServerProcess {
        Self::start_at(free_port(), settings)
    }

    /// On a port chosen beforehand, with `settings` as in [`ServerProcess::start_with`].
    pub fn start_at(port: u16, settings: &str) -> ServerProcess {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("server.toml"), format!("[server]\n{settings}")).unwrap();
        Self::start_in_dir_on(dir, port, postgres::test_database())
    }

    fn start_in_dir_on(dir: tempfile::TempDir, port: u16, database: Option<String>) -> ServerProcess {
        let child = Self::spawn(dir.path(), port, database.as_deref());
        let server = ServerProcess { child, port, url: format!("http://127.0.0.1:{port}"), dir, database };
        server.wait_listening();
        server
    }

    fn spawn(dir: &Path, port: u16, database: Option<&str>) -> Child {
        let mut app = app();
        app.args(["--server-only", "--bind", &format!("127.0.0.1:{port}"), "--config"])
            .arg(dir.join("server.toml"))
            .arg("--data-dir")
            .arg(dir.join("data"));
        if let Some(database) = database {
            app.args(["--database-url", database]);
        }
        app.stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("server-{}.log", now_nanos()))).unwrap())
            .spawn()
            .unwrap()
    }

    fn wait_listening(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "the server did not start listening");
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// What the server logged, every start of it in order.
    pub fn log(&self) -> String {
        let mut logs: Vec<PathBuf> = std::fs::read_dir(self.dir.path())
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.path())
            .filter(|path| path.file_name().is_some_and(|name| name.to_string_lossy().starts_with("server-")))
            .collect();
        logs.sort();
        logs.iter().map(|path| std::fs::read_to_string(path).unwrap_or_default()).collect()
    }

    pub fn client(&self) -> client::Client {
        client::Client::new(&self.url).unwrap()
    }

    /// Submits a sweep through the typed client; answers the sweep's name.
    pub async fn submit(&self, yaml: &str) -> String {
        self.client().submit(yaml, &shared::api::SubmitQuery::default()).await.unwrap().name
    }

    /// The jobs of a sweep (up to 1,000).
    pub async fn jobs_of(&self, sweep: &str) -> Vec<shared::api::Job> {
        let query = shared::api::JobQuery { sweep: Some(sweep.into()), limit: Some(1000), ..Default::default() };
        self.client().jobs(&query).await.unwrap().jobs
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Stops the server (SIGTERM) and waits for it to exit.
    pub fn stop(&mut self) {
        signal(&self.child, "TERM");
        wait_exit(&mut self.child, Duration::from_secs(20));
    }

    /// On a directory prepared beforehand (its `server.toml` and `data/`).
    pub fn start_in_dir(dir: tempfile::TempDir) -> ServerProcess {
        Self::start_in_dir_on(dir, free_port(), postgres::test_database())
    }

    /// On a directory prepared beforehand with a `data/queue.db`: SQLite on either backend.
    pub fn start_on_sqlite_in_dir(dir: tempfile::TempDir) -> ServerProcess {
        Self::start_in_dir_on(dir, free_port(), None)
    }

    /// `app --server-only` whose data directory is a tmpfs of `mib` MiB in its own mount
    /// namespace, so that its disk fills up without touching the machine's; SQLite on either
    /// backend (the database file is what fills up). Outside, the data directory is seen
    /// through `/proc/<pid>/root` ([`ServerProcess::outside`]).
    pub fn on_small_disk(mib: u64) -> ServerProcess {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let data = dir.path().join("data");
        std::fs::write(dir.path().join("server.toml"), "[server]\nlease_secs = 3\nheartbeat_secs = 0.5\n").unwrap();
        let mut app = app();
        app.args(["--server-only", "--bind", &format!("127.0.0.1:{port}"), "--config"])
            .arg(dir.path().join("server.toml"))
            .arg("--data-dir")
            .arg(&data);
        let log = dir.path().join("server.log");
        let mut child = disk::on_small_disk(&app, &data, mib)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("the server on a small disk exited ({status}): {}", std::fs::read_to_string(&log).unwrap());
            }
            assert!(Instant::now() < deadline, "the server on a small disk did not start listening");
            std::thread::sleep(Duration::from_millis(25));
        }
        disk::assert_own_tmpfs(child.id(), &data);
        ServerProcess { child, port, url: format!("http://127.0.0.1:{port}"), dir, database: None }
    }

    /// `path` as this server sees it (in its own mount namespace, for `on_small_disk`).
    pub fn outside(&self, path: &Path) -> PathBuf {
        disk::seen_from_outside(self.child.id(), path)
    }

    /// On PostgreSQL, a second replica: another process on the same database and data
    /// directory, with the same settings, on its own port; `None` on SQLite.
    pub fn replica(&self) -> Option<ServerProcess> {
        let database = self.database.clone()?;
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(self.dir.path().join("server.toml"), dir.path().join("server.toml")).unwrap();
        std::os::unix::fs::symlink(self.data_dir(), dir.path().join("data")).unwrap();
        Some(Self::start_in_dir_on(dir, free_port(), Some(database)))
    }

    /// Starts it again on the same port and data directory.
    pub fn restart(&mut self) {
        self.child = Self::spawn(self.dir.path(), self.port, self.database.as_deref());
        self.wait_listening();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `app --client-only` with its own work directory; stderr kept in a file for assertions.
pub struct WorkerProcess {
    pub child: Child,
    pub name: String,
    pub dir: tempfile::TempDir,
}

impl WorkerProcess {
    pub fn start(url: &str, name: &str, extra: &[&str]) -> WorkerProcess {
        Self::start_in(tempfile::tempdir().unwrap(), url, name, extra)
    }

    /// With its work directory at `dir/work`, for a `dir` prepared beforehand.
    pub fn start_in(dir: tempfile::TempDir, url: &str, name: &str, extra: &[&str]) -> WorkerProcess {
        let command = Self::command(&dir, url, name, extra);
        Self::spawn(dir, command, name)
    }

    /// With these variables in its environment (as an operator's shell would have them).
    pub fn start_with_env(url: &str, name: &str, env: &[(&str, &str)]) -> WorkerProcess {
        let dir = tempfile::tempdir().unwrap();
        let mut command = Self::command(&dir, url, name, &[]);
        command.envs(env.iter().copied());
        Self::spawn(dir, command, name)
    }

    /// With these variables in its environment and these extra flags.
    pub fn start_with_env_args(url: &str, name: &str, env: &[(&str, &str)], extra: &[&str]) -> WorkerProcess {
        let dir = tempfile::tempdir().unwrap();
        let mut command = Self::command(&dir, url, name, extra);
        command.envs(env.iter().copied());
        Self::spawn(dir, command, name)
    }

    /// With its work directory on a tmpfs of `mib` MiB of its own (see [`disk`]).
    pub fn on_small_disk(url: &str, name: &str, mib: u64) -> WorkerProcess {
        let dir = tempfile::tempdir().unwrap();
        let command = disk::on_small_disk(&Self::command(&dir, url, name, &[]), &dir.path().join("work"), mib);
        let worker = Self::spawn(dir, command, name);
        let work = worker.dir.path().join("work");
        wait_until_sync("the worker's work directory is its own tmpfs", Duration::from_secs(20), || {
            std::fs::read_to_string(format!("/proc/{}/mountinfo", worker.child.id()))
                .is_ok_and(|mounts| mounts.contains(&format!(" {} ", work.display())))
        });
        worker
    }

    fn command(dir: &tempfile::TempDir, url: &str, name: &str, extra: &[&str]) -> Command {
        let mut command = app();
        command
            .args(["--client-only", "--url", url, "--name", name, "--kill-grace-secs", "2", "--work-dir"])
            .arg(dir.path().join("work"))
            .args(extra)
            .env("RUST_LOG", "info");
        command
    }

    fn spawn(dir: tempfile::TempDir, mut command: Command, name: &str) -> WorkerProcess {
        let child = command
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("worker.log")).unwrap())
            .spawn()
            .unwrap();
        WorkerProcess { child, name: name.to_string(), dir }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("worker.log")).unwrap_or_default()
    }

    pub fn signal(&self, name: &str) {
        signal(&self.child, name);
    }

    pub fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        wait_exit(&mut self.child, timeout)
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn signal(child: &Child, name: &str) {
    let status = Command::new("kill").arg(format!("-{name}")).arg(child.id().to_string()).status().unwrap();
    assert!(status.success(), "kill -{name} {}", child.id());
}

pub fn wait_exit(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "process {} did not exit within {timeout:?}", child.id());
        std::thread::sleep(Duration::from_millis(25));
    }
}

fn now_nanos() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
}

/// Whether a process id is still alive (and not a zombie).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses and may hold spaces.
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.split_whitespace().next() != Some("Z")),
        Err(_) => false,
    }
}
