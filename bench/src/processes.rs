//! The real processes a benchmark starts (`lab --live`, `search --queue`): killed when dropped,
//! a server of app's own binary on a free loopback port, and waits with a limit.

use client::ClientOptions;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Processes killed when dropped.
pub(crate) struct Processes(pub(crate) Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Processes {
    /// Starts `app --server-only` on a free port of 127.0.0.1 with `args` (a `--config`), its
    /// data in `dir/data` and its log in `dir/server.log`; returns its URL (not yet serving:
    /// wait for its health).
    pub(crate) fn server(&mut self, app: &Path, dir: &Path, args: &[&std::ffi::OsStr]) -> anyhow::Result<String> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new(app)
            .args(["--server-only", "--bind", &format!("127.0.0.1:{port}")])
            .args(args)
            .arg("--data-dir")
            .arg(dir.join("data"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("server.log"))?)
            .spawn()?;
        self.0.push(child);
        Ok(format!("http://127.0.0.1:{port}"))
    }
}

pub(crate) fn options(token: Option<String>) -> ClientOptions {
    ClientOptions { token, ca_pem: None }
}

/// Waits until `check` holds, looking every 50 ms; an error after `limit`.
pub(crate) async fn wait_for<F, Fut>(limit: Duration, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !check().await {
        anyhow::ensure!(Instant::now() < deadline, "not ready within {limit:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}
