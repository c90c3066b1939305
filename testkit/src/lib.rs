//! What the workspace's integration tests share (a dev-dependency only, never shipped):
//! - [`process`]: the real `app` binary as server and worker processes on loopback;
//! - [`in_process`]: the server library on a loopback port in the test's own runtime ([`TestApp`]);
//! - [`postgres`]: a real PostgreSQL cluster per test process (`APP_TEST_BACKEND=postgres`);
//! - [`disk`]: small tmpfs disks in a mount namespace of their own, for the disk-full tests;
//! - here: one `wait_until` (and its blocking twin), free ports, sweep and worker builders.

pub mod disk;
pub mod in_process;
pub mod postgres;
pub mod process;

pub use in_process::TestApp;
pub use postgres::{on_postgres, test_database, PgServer};
pub use process::{alive, app, app_binary, signal, wait_exit, ServerProcess, WorkerProcess};

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How often both waits look again.
const POLL: Duration = Duration::from_millis(25);

/// Polls `check` until it gives `Some`, or panics after `timeout` naming `what`.
pub async fn wait_until<T, F, Fut>(what: &str, timeout: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    wait_until_or(timeout, check, || format!("waiting until {what}")).await
}

/// [`wait_until`] whose panic says what `explain` tells at the timeout (the state that kept
/// the wait going, read only then).
pub async fn wait_until_or<T, F, Fut>(timeout: Duration, mut check: F, explain: impl FnOnce() -> String) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} {}", explain());
        }
        tokio::time::sleep(POLL).await;
    }
}

/// [`wait_until`] for a blocking `check`, from a thread that may block.
pub fn wait_until_sync(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !check() {
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting until {what}");
        std::thread::sleep(POLL);
    }
}

/// `path` under the workspace's root.
pub fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("testkit lies in the workspace").join(path)
}

/// A free loopback port (bound and released; a restart can reuse it).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A CPU-only capacity of `job_slots` slots.
pub fn cpu(job_slots: u32) -> shared::placement::Capacity {
    shared::placement::Capacity { job_slots, gpus: Vec::new(), ..shared::placement::Capacity::default() }
}

/// A CPU-only worker's registration, for tests that speak for a worker through the client.
pub fn cpu_worker(name: &str) -> shared::api::RegisterRequest {
    shared::api::RegisterRequest {
        name: name.into(),
        protocol: shared::PROTOCOL_VERSION,
        key: None,
        capacity: cpu(1),
        holding: Vec::new(),
    }
}

/// A native sweep of `count` trivial jobs (`count` <= 1000, one axis).
pub fn sweep_of(name: &str, count: usize) -> String {
    let values = (0..count).map(|i| i.to_string()).collect::<Vec<_>>().join(", ");
    format!("name: {name}\ncommand: \"echo {{i}}\"\ngrid:\n  i: [{values}]\n")
}
