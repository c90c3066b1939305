//! `app --server-only` and the embedded default (`app`).

use super::ServerArgs;
use anyhow::Context;
use server::config::ConfigFile;
use server::ServerConfig;

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

pub async fn run(args: &ServerArgs, server_only: bool) -> anyhow::Result<()> {
    let (config, bind) = server_config(args)?;
    let listener = tokio::net::TcpListener::bind(&bind).await.with_context(|| format!("listening on {bind}"))?;
    if !server_only {
        tracing::warn!("no local worker yet: this build runs the server only (the worker daemon is issue 3)");
    }
    server::run(listener, config, shutdown_signal()).await
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
    tracing::info!("shutting down");
}
