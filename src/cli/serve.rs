//! The daemon modes: `app --server-only`, `app --client-only --url URL`, and the embedded
//! default `app` (server and one local worker in one process).

use super::{ServerArgs, WorkerArgs};
use anyhow::Context;
use client::ClientOptions;
use server::auth::Role;
use server::config::{ConfigFile, TlsFiles};
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
    add_tokens(&mut config, args)?;
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        config.tls = Some(TlsFiles { cert: cert.clone(), key: key.clone() });
    }
    Ok((config, bind))
}

/// Tokens from APP_USER_TOKEN / APP_WORKER_TOKEN and the token files (the config file's were
/// added by `apply_file`).
fn add_tokens(config: &mut ServerConfig, args: &ServerArgs) -> anyhow::Result<()> {
    for (role, variable, file) in [
        (Role::User, "APP_USER_TOKEN", &args.user_token_file),
        (Role::Worker, "APP_WORKER_TOKEN", &args.worker_token_file),
    ] {
        if let Some(token) = std::env::var(variable).ok().filter(|token| !token.trim().is_empty()) {
            config.tokens.add(role, &token, variable)?;
        }
        if let Some(path) = file {
            config.tokens.add_file(role, path)?;
        }
    }
    Ok(())
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

/// The worker token the embedded local worker uses: the first one configured.
fn local_worker_token(args: &ServerArgs) -> anyhow::Result<Option<String>> {
    if let Some(token) = std::env::var("APP_WORKER_TOKEN").ok().filter(|token| !token.trim().is_empty()) {
        return Ok(Some(token.trim().to_string()));
    }
    let from_config = match &args.config {
        Some(path) => ConfigFile::load(path)?.server.worker_token_file,
        None => None,
    };
    match args.worker_token_file.clone().or(from_config) {
        Some(path) => Ok(ClientOptions::load(None, Some(&path), None).map_err(anyhow::Error::msg)?.token),
        None => Ok(None),
    }
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
        token_file: args.token_file.clone(),
        ca_file: args.ca.clone(),
    };
    flags.apply(&mut config)?;
    if let Some(token) = std::env::var("APP_TOKEN").ok().filter(|token| !token.trim().is_empty()) {
        if args.token_file.is_none() {
            config.connection.token = Some(token.trim().to_string());
        }
    }
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
    check_exposure(&config, listener.local_addr()?, args.insecure_no_auth)?;
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
    let scheme = if config.tls.is_some() { "https" } else { "http" };
    let url = format!("{scheme}://{host}:{}", address.port());
    let mut worker_config = worker_config(args, worker_args, url)?;
    if worker_args.name.is_none() {
        worker_config.name = "local".into();
    }
    if !config.tokens.is_empty() {
        worker_config.connection.token = local_worker_token(args)?;
    }
    if let (Some(tls), None) = (&config.tls, &worker_config.connection.ca_pem) {
        // A self-signed certificate is its own CA; otherwise pass --ca.
        worker_config.connection.ca_pem = std::fs::read(&tls.cert).ok();
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
