//! Wiring: open the database, start the reaper, serve until told to stop.

use crate::config::ServerConfig;
use crate::db::Db;
use crate::routes;
use crate::state::AppState;
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
    let db = Db::open(&config.data_dir).await?;
    let (stop, shutting_down) = watch::channel(false);
    let state = AppState {
        db: db.clone(),
        config: Arc::new(config),
        work_available: Arc::new(Notify::new()),
        shutting_down,
        sweep_names: Arc::default(),
        known_workers: Arc::default(),
    };
    let reaper = tokio::spawn(crate::reaper::run(state.clone()));
    let checkpointer = tokio::spawn(crate::reaper::run_checkpointer(state.clone()));
    if let Ok(address) = listener.local_addr() {
        tracing::info!(%address, data_dir = %state.config.data_dir.display(), "server listening");
    }
    let served = axum::serve(listener, routes::router(state))
        .with_graceful_shutdown(async move {
            shutdown.await;
            let _ = stop.send(true);
        })
        .await;
    let _ = reaper.await;
    let _ = checkpointer.await;
    db.close().await;
    served.map_err(Into::into)
}
