//! Wiring: open the database and the results directory, start the reaper, serve until told
//! to stop.

use crate::config::ServerConfig;
use crate::db::Db;
use crate::routes;
use crate::state::AppState;
use crate::tls::TlsListener;
use anyhow::Context;
use std::future::Future;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};

/// Serves the API on `listener` (bound by the caller, so port 0 works) until `shutdown`
/// completes; then ends long polls, lets requests in flight finish and closes the database.
pub async fn run(
    listener: TcpListener,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // Certificate problems are start-up errors, before anything else is touched.
    let tls = config.tls.as_ref().map(crate::tls::server_config).transpose()?;
    let db = Db::open(&config.data_dir).await?;
    crate::storage::Layout::new(&config.data_dir)
        .prepare()
        .await
        .with_context(|| format!("preparing the results directory in {}", config.data_dir.display()))?;
    // While the server was down no worker could heartbeat; give them a lease to reconnect
    // before their jobs count as lost.
    let until = crate::db::now_ms() + config.lease.as_millis() as i64;
    let extended = crate::db::jobs::extend_running_leases(&mut *db.writer.acquire().await?, until).await?;
    if extended > 0 {
        tracing::info!(jobs = extended, "running jobs keep their leases while workers reconnect");
    }
    let (stop, shutting_down) = watch::channel(false);
    let (claims, tickets) = tokio::sync::mpsc::channel(1024);
    let state = AppState {
        db: db.clone(),
        config: Arc::new(config),
        work_available: Arc::new(Notify::new()),
        shutting_down,
        sweep_names: Arc::default(),
        known_workers: Arc::default(),
        job_signals: Arc::default(),
        claims,
        changes: Arc::new(watch::channel(0).0),
    };
    let dispatcher = tokio::spawn(crate::dispatch::run(state.clone(), tickets));
    let reaper = tokio::spawn(crate::reaper::run(state.clone()));
    let checkpointer = tokio::spawn(crate::reaper::run_checkpointer(state.clone()));
    if let Ok(address) = listener.local_addr() {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let auth = if state.config.tokens.is_empty() { "off" } else { "bearer tokens" };
        tracing::info!(%address, scheme, auth, data_dir = %state.config.data_dir.display(), "server listening");
    }
    let router = routes::router(state);
    let shutdown = async move {
        shutdown.await;
        let _ = stop.send(true);
    };
    let served = match tls {
        Some(tls) => axum::serve(TlsListener::new(listener, tls)?, router).with_graceful_shutdown(shutdown).await,
        None => axum::serve(listener, router).with_graceful_shutdown(shutdown).await,
    };
    let _ = reaper.await;
    let _ = checkpointer.await;
    // The dispatcher ends when the last sender (in the state the routes held) is gone.
    dispatcher.abort();
    let _ = dispatcher.await;
    db.close().await;
    served.map_err(Into::into)
}
