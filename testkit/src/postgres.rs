//! A real PostgreSQL server for a test: Debian's binaries (`initdb`, `postgres`), a fresh
//! cluster in a temporary directory, listening on a free port of 127.0.0.1 with trust
//! authentication, stopped when dropped. PostgreSQL refuses to run as root: as root, the cluster
//! belongs to `nobody` and the server runs as it.

use crate::free_port;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct PgServer {
    /// `postgres://app@127.0.0.1:<port>/app`.
    pub url: String,
    pub port: u16,
    child: Child,
    /// The cluster's files, removed with the server.
    _dir: tempfile::TempDir,
}

/// The name every cluster's temporary directory starts with.
const PREFIX: &str = "app-test-pg-";

/// Removes the clusters of test processes that have ended (their server ended with them: it
/// runs under a parent-death signal).
fn remove_orphans() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(PREFIX) {
            continue;
        }
        let owner =
            std::fs::read_to_string(entry.path().join("owner.pid")).ok().and_then(|pid| pid.trim().parse::<i32>().ok());
        let alive = owner.is_some_and(|pid| nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok());
        if owner.is_some() && !alive {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// The user the cluster belongs to when the tests run as root.
const NOBODY: u32 = 65534;

impl PgServer {
    pub fn start() -> PgServer {
        PgServer::start_with(None)
    }

    /// A server that also takes TLS connections (`ssl=on`), with `cert_pem` as its certificate
    /// and `key_pem` as its key (PEM; PostgreSQL's default file names in its data directory).
    pub fn start_with_tls(cert_pem: &str, key_pem: &str) -> PgServer {
        PgServer::start_with(Some((cert_pem, key_pem)))
    }

    fn start_with(tls: Option<(&str, &str)>) -> PgServer {
        let bin = bin_dir();
        remove_orphans();
        let dir = tempfile::Builder::new().prefix(PREFIX).tempdir().expect("a temporary directory");
        // Whose it is: a server kept for a whole test process (the API suite's) is never
        // dropped, so the next test process removes its files once that process is gone.
        std::fs::write(dir.path().join("owner.pid"), std::process::id().to_string()).expect("the owner file");
        let as_root = is_root();
        if as_root {
            std::os::unix::fs::chown(dir.path(), Some(NOBODY), Some(NOBODY)).expect("giving the cluster to nobody");
        }
        let data = dir.path().join("data");
        let initdb = run_as(as_root, &bin.join("initdb"))
            .args(["-D", path(&data), "-U", "app", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"])
            .stdout(Stdio::null())
            .output()
            .expect("running initdb (scripts/install-test-deps.sh installs PostgreSQL)");
        assert!(initdb.status.success(), "initdb failed: {}", String::from_utf8_lossy(&initdb.stderr));
        let mut settings: Vec<String> = Vec::new();
        if let Some((cert, key)) = tls {
            // PostgreSQL reads its key only if no one else may: the cluster's user, mode 0600.
            for (name, pem) in [("server.crt", cert), ("server.key", key)] {
                let file = data.join(name);
                std::fs::write(&file, pem).expect("the TLS files");
                std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
                if as_root {
                    std::os::unix::fs::chown(&file, Some(NOBODY), Some(NOBODY)).unwrap();
                }
            }
            settings.extend(["-c", "ssl=on"].map(String::from));
        }
        // A port found free may be taken again before postgres binds it: a few tries.
        let mut tries = 0;
        let (port, child) = loop {
            tries += 1;
            let port = free_port();
            let log = std::fs::File::create(dir.path().join("server.log")).expect("the server's log");
            if as_root {
                std::os::unix::fs::chown(dir.path().join("server.log"), Some(NOBODY), Some(NOBODY)).unwrap();
            }
            let mut child = run_as(as_root, &bin.join("postgres"))
                .args(["-D", path(&data), "-p", &port.to_string(), "-k", path(dir.path())])
                // Loopback only; durability is not what these tests are about.
                .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "full_page_writes=off"])
                .args(["-c", "synchronous_commit=off", "-c", "max_connections=100"])
                .args(&settings)
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("starting postgres");
            match wait_ready(&mut child, &bin, port) {
                Ok(()) => break (port, child),
                Err(why) if tries < 3 => {
                    eprintln!("postgres on port {port} did not start ({why}); trying another port")
                }
                Err(why) => {
                    let log = std::fs::read_to_string(dir.path().join("server.log")).unwrap_or_default();
                    panic!("postgres did not start: {why}\n{log}");
                }
            }
        };
        let mut server = PgServer { url: format!("postgres://app@127.0.0.1:{port}/postgres"), port, child, _dir: dir };
        server.create_database("app");
        server.url = format!("postgres://app@127.0.0.1:{port}/app");
        server
    }

    /// A new, empty database on this server; its URL (for the API suite's binary).
    pub fn fresh_database(&self) -> String {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
        let name = format!("test{}", NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        self.create_database(&name);
        format!("postgres://app@127.0.0.1:{}/{name}", self.port)
    }

    fn create_database(&self, name: &str) {
        let created = Command::new(bin_dir().join("psql"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "app", "-d", "postgres", "-v"])
            .arg("ON_ERROR_STOP=1")
            .args(["-c", &format!("CREATE DATABASE \"{name}\"")])
            .output()
            .expect("running psql");
        assert!(created.status.success(), "creating database {name}: {}", String::from_utf8_lossy(&created.stderr));
    }
}

/// With `APP_TEST_BACKEND=postgres`, a fresh database on this test binary's own PostgreSQL
/// server (Debian's, started once, gone with the process) for each server the tests start;
/// otherwise `None`: the server's SQLite file in its data directory.
pub fn test_database() -> Option<String> {
    static SERVER: std::sync::OnceLock<PgServer> = std::sync::OnceLock::new();
    on_postgres().then(|| {
        // Started from a thread that lives as long as the process: the server's parent-death
        // signal follows the thread that started it, and a test's thread ends with the test.
        let server = SERVER.get_or_init(|| {
            let (sender, started) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let _ = sender.send(PgServer::start());
                loop {
                    std::thread::park();
                }
            });
            started.recv().expect("the PostgreSQL server started")
        });
        server.fresh_database()
    })
}

/// Whether the tests run against PostgreSQL (`APP_TEST_BACKEND=postgres`).
pub fn on_postgres() -> bool {
    match std::env::var("APP_TEST_BACKEND").as_deref() {
        Ok("postgres") => true,
        Ok("sqlite") | Err(_) => false,
        Ok(other) => panic!("APP_TEST_BACKEND is sqlite or postgres, not {other}"),
    }
}

/// Waits (bounded) until the server on `port` accepts connections.
fn wait_ready(child: &mut Child, bin: &Path, port: u16) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Err(format!("postgres exited with {status}"));
        }
        let ready = Command::new(bin.join("pg_isready"))
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "app", "-d", "postgres"])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if ready {
            return Ok(());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err("no connection within 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        // SIGINT: PostgreSQL's fast shutdown (clients disconnected, no checkpoint wait).
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.child.try_wait().ok().flatten().is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Where PostgreSQL's server programs are: `$APP_PG_BIN`, the directory of an `initdb` on
/// `PATH`, or Debian's newest `/usr/lib/postgresql/<version>/bin`.
fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("APP_PG_BIN") {
        return PathBuf::from(dir);
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths).find(|dir| dir.join("initdb").is_file() && dir.join("pg_isready").is_file())
    });
    if let Some(dir) = on_path {
        return dir;
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL is not installed: run scripts/install-test-deps.sh")
        .flatten()
        .filter_map(|entry| Some((entry.file_name().to_str()?.parse().ok()?, entry.path().join("bin"))))
        .collect();
    versions.sort();
    versions.pop().expect("no /usr/lib/postgresql/<version>/bin: run scripts/install-test-deps.sh").1
}

/// `program` under `setpriv`: it gets SIGINT (PostgreSQL's fast shutdown) should the test
/// process die without dropping its server (a timeout's SIGKILL), and runs as `nobody` when the
/// tests run as root.
fn run_as(as_root: bool, program: &Path) -> Command {
    let mut command = Command::new("setpriv");
    command.args(["--pdeathsig", "INT"]);
    if as_root {
        command.args(["--reuid", &NOBODY.to_string(), "--regid", &NOBODY.to_string(), "--clear-groups"]);
    }
    command.arg(program);
    command
}

/// Whether this process runs as root (`/proc/self` belongs to the effective user).
fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|meta| meta.uid() == 0)
}

fn path(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 temporary path")
}
