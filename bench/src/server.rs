//! What every benchmark starts first: the real server in this process on 127.0.0.1:0, with a
//! temporary directory, stopped gracefully at the end. Also the GPU readings the benchmarks
//! send as fake telemetry.

use anyhow::Context;
use shared::api::GpuSample;
use std::path::{Path, PathBuf};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub struct BenchServer {
    pub url: String,
    /// Holds the server's data directory (`data/`) and room for the benchmark's own files.
    scratch: tempfile::TempDir,
    stop: oneshot::Sender<()>,
    task: JoinHandle<anyhow::Result<()>>,
}

impl BenchServer {
    /// Starts the server with the default settings changed by `tweak`.
    pub async fn start(tweak: impl FnOnce(&mut server::ServerConfig)) -> anyhow::Result<BenchServer> {
        let scratch = tempfile::tempdir().context("creating a temporary directory")?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let mut config =
            server::ServerConfig { data_dir: scratch.path().join("data"), ..server::ServerConfig::default() };
        tweak(&mut config);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server::run(listener, config, async move {
            let _ = stopped.await;
        }));
        let client = client::Client::new(&url)?;
        for _ in 0..200 {
            if client.health().await.is_ok() {
                return Ok(BenchServer { url, scratch, stop, task });
            }
            tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        }
        anyhow::bail!("the in-process server did not answer /api/health within 5 s")
    }

    pub fn data_dir(&self) -> PathBuf {
        self.scratch.path().join("data")
    }

    /// A directory for the benchmark's own files, removed with the server's.
    pub fn scratch(&self) -> &Path {
        self.scratch.path()
    }

    /// Stops the server and waits until it has closed its database.
    pub async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        self.task.await??;
        Ok(())
    }
}

/// Readings of `gpus` simulated 80 GiB GPUs that change with `tick`.
pub fn gpu_samples(gpus: u32, tick: u64) -> Vec<GpuSample> {
    (0..gpus)
        .map(|index| GpuSample {
            index,
            uuid: format!("GPU-bench-{index}"),
            name: "Bench GPU".into(),
            memory_total: 80 << 30,
            memory_used: (tick % 80) << 30,
            utilization: Some((tick % 100) as u32),
            temperature: Some(60),
            power_watts: Some(300.0),
            at: 0,
        })
        .collect()
}
