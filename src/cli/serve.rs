//! The daemon modes: `app --server-only`, `app --client-only --url URL`, and the embedded
//! default `app` (server and one local worker in one process).

use super::settings::{self, Mode, ServeArgs, Settings};
use anyhow::Context;
use server::auth::Role;
use server::ServerConfig;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Runs the mode the flags ask for, with the settings assembled once.
pub async fn run(args: &ServeArgs) -> anyhow::Result<()> {
    let settings = settings::load(args)?;
    match settings.mode {
        Mode::ClientOnly => run_worker(settings).await,
        Mode::ServerOnly | Mode::Embedded => run_server(settings).await,
    }
}

/// Without tokens, anyone who can reach the port can run commands on every worker: refuse
/// to listen beyond loopback unless told `--insecure-no-auth`.
fn check_exposure(config: &ServerConfig, address: std::net::SocketAddr, insecure: bool) -> anyhow::Result<()> {
    if config.tokens.is_empty() && !address.ip().is_loopback() && !insecure {
        anyhow::bail!(
            "refusing to listen on {address} without tokens: anyone who reaches it could run commands on your \
             workers. Set APP_USER_TOKEN and APP_WORKER_TOKEN (or --user-token-file/--worker-token-file), bind \
             127.0.0.1, or pass --insecure-no-auth"
        );
    }
    for (role, variable) in [(Role::User, "APP_USER_TOKEN"), (Role::Worker, "APP_WORKER_TOKEN")] {
        if !config.tokens.is_empty() && !config.tokens.has(role) {
            tracing::warn!("no {variable} (or token file) is set: nothing can do what that role does");
        }
    }
    if !config.tokens.is_empty() && config.tls.is_none() && !address.ip().is_loopback() {
        tracing::warn!(%address, "tokens travel in clear text without TLS; use --tls-cert/--tls-key or a TLS proxy");
    }
    Ok(())
}

/// `app --client-only`: the worker daemon alone.
async fn run_worker(settings: Settings) -> anyhow::Result<()> {
    let mut config = settings.worker;
    let inventory = inventory(&config)?;
    config.capabilities = super::capabilities::detect().await;
    worker::run(config, Arc::from(inventory), stop_signals()).await
}

/// The GPUs this worker may use: its own `CUDA_VISIBLE_DEVICES` (as Slurm or Kubernetes set
/// it), then `--gpus`, over NVML or `--fake-gpus`.
fn inventory(config: &worker::WorkerConfig) -> anyhow::Result<Box<dyn worker::GpuInventory>> {
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    worker::detect(config.fake_gpus.as_deref(), config.gpus.as_deref(), visible.as_deref())
}

/// `app --server-only`, or the embedded default with a local worker.
async fn run_server(settings: Settings) -> anyhow::Result<()> {
    let Settings { mode, server: config, bind, insecure_no_auth, worker: mut worker_config } = settings;
    let listener = tokio::net::TcpListener::bind(&bind).await.with_context(|| format!("listening on {bind}"))?;
    check_exposure(&config, listener.local_addr()?, insecure_no_auth)?;
    if mode == Mode::ServerOnly {
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
    let scheme = if config.tls.is_some() { "https" } else { "http" };
    worker_config.url = format!("{scheme}://{host}:{}", address.port());
    if let (Some(tls), None) = (&config.tls, &worker_config.connection.ca_pem) {
        // A self-signed certificate is its own CA; otherwise pass --ca.
        worker_config.connection.ca_pem = std::fs::read(&tls.cert).ok();
    }
    let inventory = inventory(&worker_config)?;
    worker_config.capabilities = super::capabilities::detect().await;
    let (worker_done, server_stop) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(server::run(listener, config, async move {
        let _ = server_stop.await;
    }));
    tracing::info!(%address, "open http://{address}/ for the queue page; submit with `app submit FILE`");
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
