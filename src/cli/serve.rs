//! The daemon modes: `app --server-only`, `app --client-only --url URL`, and the embedded
//! default `app` (server and one local worker in one process).

use super::{ServerArgs, WorkerArgs};
use anyhow::Context;
use server::config::ConfigFile;
use server::ServerConfig;
use std::sync::Arc;
use tokio::sync::mpsc;
use worker::config::WorkerFile;
use worker::WorkerConfig;

const DEFAULT_BIND: &str = "127.0.0.1:8000";

/// Defaults, then the config file, then APP_* variables and flags (clap merges those two).
pub fn server_config(args: &ServerArgs) -> anyhow::Result<(ServerConfig, String)> {
    let mut config = ServerConfig::default();
    let mut bind = DEFAULT_BIND.to_string();
    if let Some(path) = &args.config {
        let file = ConfigFile::load(path)?;
        config.apply_file(&file.server)?;
        if let Some(address) = file.server.bind {
            bind = address;
        }
    }
    if let Some(dir) = &args.data_dir {
        config.data_dir = dir.clone();
    }
    if let Some(address) = &args.bind {
        bind = address.clone();
    }
    Ok((config, bind))
}

/// Worker settings: defaults, then the config file's `[worker]` table, then flags.
pub fn worker_config(server: &ServerArgs, args: &WorkerArgs, url: String) -> anyhow::Result<WorkerConfig> {
    let mut config = WorkerConfig::new(url);
    if let Some(path) = &server.config {
        WorkerFile::load(path)?.apply(&mut config)?;
    }
    // Flags override the file the same way the file overrides the defaults.
    let flags = WorkerFile {
        url: args.url.clone(),
        name: args.name.clone(),
        gpus: args.gpus.clone(),
        max_jobs: args.max_jobs,
        work_dir: args.work_dir.clone(),
        fake_gpus: args.fake_gpus.clone(),
        telemetry_secs: None,
        kill_grace_secs: args.kill_grace_secs,
        keep_work_dirs: args.keep_work_dirs.then_some(true),
    };
    flags.apply(&mut config)?;
    shared::names::check_name("worker", &config.name).map_err(anyhow::Error::msg)?;
    Ok(config)
}

/// `app --client-only`: the worker daemon alone.
pub async fn run_worker(server: &ServerArgs, args: &WorkerArgs) -> anyhow::Result<()> {
    let file_url = server.config.as_ref().map(|path| WorkerFile::load(path)).transpose()?.and_then(|file| file.url);
    let url = args.url.clone().or(file_url).context("--client-only needs --url http://HEAD:8000 (or APP_URL)")?;
    let config = worker_config(server, args, url)?;
    let inventory = worker::detect(config.fake_gpus.as_deref(), config.gpus.as_deref())?;
    worker::run(config, Arc::from(inventory), stop_signals()).await
}

/// `app --server-only`, or the embedded default with a local worker.
pub async fn run(args: &ServerArgs, worker_args: &WorkerArgs, server_only: bool) -> anyhow::Result<()> {
    let (config, bind) = server_config(args)?;
    let listener = tokio::net::TcpListener::bind(&bind).await.with_context(|| format!("listening on {bind}"))?;
    if server_only {
        let mut stops = stop_signals();
        return server::run(listener, config, async move {
            stops.recv().await;
        })
        .await;
    }
    // The embedded default: the local worker talks to this server over loopback, exactly as
    // a remote one would. Stopping drains the worker first, then the server stops.
    let address = listener.local_addr()?;
    let host = if address.ip().is_unspecified() { "127.0.0.1".to_string() } else { address.ip().to_string() };
    let url = format!("http://{host}:{}", address.port());
    let mut worker_config = worker_config(args, worker_args, url)?;
    if worker_args.name.is_none() {
        worker_config.name = "local".into();
    }
    let inventory = worker::detect(worker_config.fake_gpus.as_deref(), worker_config.gpus.as_deref())?;
    let (worker_done, server_stop) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(server::run(listener, config, async move {
        let _ = server_stop.await;
    }));
    tracing::info!(%address, "open http://{address}/api/health; submit with `app submit FILE`");
    let worked = worker::run(worker_config, Arc::from(inventory), stop_signals()).await;
    let _ = worker_done.send(());
    server.await.context("server task")??;
    worked
}

/// Every Ctrl-C or SIGTERM becomes one message: the first drains, the second aborts.
pub fn stop_signals() -> mpsc::UnboundedReceiver<()> {
    let (sender, receiver) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            shutdown_signal().await;
            if sender.send(()).is_err() {
                return;
            }
        }
    });
    receiver
}

/// Completes on Ctrl-C or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = terminate => {}
    }
    tracing::info!("stop requested");
}
