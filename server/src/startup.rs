//! Wiring: open the database and the results directory, start the reaper, serve until told
//! to stop.

use crate::config::ServerConfig;
use crate::db::Db;
use crate::queue::Queue;
use crate::routes;
use crate::state::AppState;
use crate::tls::TlsListener;
use anyhow::Context;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Serves the API on `listener` (bound by the caller, so port 0 works) until `shutdown`
/// completes; then ends long polls, lets requests in flight finish and closes the database.
pub async fn run(
    listener: TcpListener,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    // Certificate problems are start-up errors, before anything else is touched.
    let tls = config.tls.as_ref().map(crate::tls::server_config).transpose()?;
    let db = match &config.database_url {
        Some(url) => Db::open_postgres(url, &config.replica_agreement()).await?,
        None => Db::open(&config.data_dir).await?,
    };
    let instance = match own_data_dir(&db, &config.data_dir).await {
        Ok(instance) => instance,
        Err(error) => {
            // A database this start made is removed again, so the refusal leaves the directory
            // as it was (and the next start is refused the same way).
            match db.created {
                true => db.discard().await,
                false => db.close().await,
            }
            return Err(error);
        }
    };
    crate::storage::Layout::new(&config.data_dir)
        .prepare(db.engine() == crate::db::backend::Engine::Postgres)
        .await
        .with_context(|| format!("preparing the results directory in {}", config.data_dir.display()))?;
    let logs = crate::queue::LogStore::new(&config.data_dir);
    let exported = crate::queue::logs::export_database_logs(&db, &logs)
        .await
        .with_context(|| format!("moving job logs out of the database into {}", config.data_dir.display()))?;
    if exported > 0 {
        tracing::info!(attempts = exported, "moved the logs that were kept in the database into files");
    }
    let (stop, shutting_down) = watch::channel(false);
    let config = Arc::new(config);
    let (queue, tasks) = Queue::start(db.clone(), config.clone(), instance, shutting_down.clone());
    // While the server was down no worker could heartbeat; give them a lease to reconnect
    // before their jobs count as lost. Not when another replica of the database is running
    // (it runs the reaper): the workers could reach it meanwhile, and every restart of a
    // replica would hold off the reaping of jobs truly lost.
    let others_serve = match db.postgres_pool() {
        Some(pool) => crate::db::postgres::reaper_is_led(pool).await.context("looking for other replicas")?,
        None => false,
    };
    if others_serve {
        tracing::info!("another replica runs the reaper; running jobs keep the leases they have");
    } else {
        let extended = queue.extend_all_leases().await.map_err(|error| anyhow::anyhow!("{error}"))?;
        if extended > 0 {
            tracing::info!(jobs = extended, "running jobs keep their leases while workers reconnect");
        }
    }
    let state = AppState { queue: queue.clone(), config, shutting_down: shutting_down.clone() };
    let reaper = tokio::spawn(crate::reaper::run(queue.clone(), shutting_down.clone()));
    let expansions = tokio::spawn(crate::queue::expansions::run(queue.clone(), shutting_down.clone()));
    let checkpointer = tokio::spawn(crate::reaper::run_checkpointer(queue.clone(), shutting_down));
    // Kept to add, once the routes are done, the slot time the fair share's loop has not yet.
    let stopping = queue.clone();
    drop(queue);
    if let Ok(address) = listener.local_addr() {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let auth = if state.config.tokens.is_empty() { "off" } else { "bearer tokens" };
        tracing::info!(%address, scheme, auth, data_dir = %state.config.data_dir.display(), "server listening");
    }
    let descriptors = crate::serve::raise_descriptor_limit();
    let limits = crate::serve::ConnectionLimits {
        header_timeout: state.config.header_timeout,
        body_idle_timeout: state.config.body_idle_timeout,
        max_connections: state.config.max_connections.unwrap_or(crate::serve::default_max_connections(descriptors)),
        max_per_address: state.config.max_connections_per_address,
    };
    let router = routes::router(state);
    let shutdown = async move {
        shutdown.await;
        let _ = stop.send(true);
    };
    match tls {
        Some(tls) => crate::serve::serve(TlsListener::new(listener, tls)?, router, limits, shutdown).await,
        None => crate::serve::serve(listener, router, limits, shutdown).await,
    };
    let _ = reaper.await;
    let _ = checkpointer.await;
    let _ = expansions.await;
    stopping.add_slot_time().await;
    drop(stopping);
    // The writer and the dispatcher end once the last handle on the queue (in the state the
    // routes held) is gone.
    tasks.finish().await;
    db.close().await;
    Ok(())
}

/// How long after a shared database was made its maker may still be marking the shared
/// directory (it does so right after migrating: milliseconds, seconds under load).
const MARKING_GRACE: Duration = Duration::from_secs(5);

/// Replicas started together on a new database: one makes it, and marks the shared directory
/// just after; another that finds the database made may look before the mark is there. Such a
/// replica waits for the mark while the database is younger than [`MARKING_GRACE`] (an older
/// one's directory was marked long ago: a missing mark is refused at once).
async fn wait_for_the_makers_marker(db: &Db, data_dir: &std::path::Path) {
    let marker = data_dir.join(crate::data_owner::MARKER);
    let Some(pool) = db.postgres_pool() else { return };
    let age = crate::db::postgres::seconds_since_made(pool).await.unwrap_or(f64::INFINITY);
    let left = MARKING_GRACE.saturating_sub(Duration::try_from_secs_f64(age.max(0.0)).unwrap_or(Duration::MAX));
    let deadline = tokio::time::Instant::now() + left;
    if !marker.exists() && !left.is_zero() {
        tracing::info!(marker = %marker.display(), "the database is new: waiting for the server that made it to mark the data directory");
    }
    while !marker.exists() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Checks that the data directory's files belong to this database (marking it if unmarked);
/// returns the database's instance id.
async fn own_data_dir(db: &Db, data_dir: &std::path::Path) -> anyhow::Result<String> {
    let instance = crate::db::workers::instance(&db.reader).await.context("reading the server's instance id")?;
    if db.engine() == crate::db::backend::Engine::Postgres {
        // Replicas share one directory, marked by the server that made the database: any other
        // unmarked directory is not the shared one.
        let database = db.describe();
        if db.created {
            // The first server of a new database makes the shared directory (SQLite's
            // `Db::open` makes its own); any other must find it made and marked.
            std::fs::create_dir_all(data_dir)
                .with_context(|| format!("creating data directory {}", data_dir.display()))?;
        }
        if !db.created {
            wait_for_the_makers_marker(db, data_dir).await;
        }
        crate::data_owner::check_shared(data_dir, &database, &instance, db.created)?;
        return Ok(instance);
    }
    // A first start that failed after migrating leaves an empty database: as new as none.
    let new = db.created || !db.holds_sweeps().await.context("reading the database")?;
    let database = data_dir.join("queue.db").display().to_string();
    crate::data_owner::check(data_dir, &database, &instance, new)?;
    Ok(instance)
}
