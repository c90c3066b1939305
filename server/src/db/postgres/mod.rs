//! PostgreSQL, the second backend (issue 15): opening a database named by URL and bringing its
//! schema up to date from `migrations-postgres/`, whose versions are the SQLite ones, table for
//! table (server/tests/postgres compares the two schemas and their triggers on real servers).
//!
//! What is here is what only PostgreSQL has: the URL, the connection and its errors, the schema
//! version check and the migrations ([`open`]); the notifications that carry one replica's
//! changes to the others ([`notify`], [`listen`]); and the advisory lock that makes one replica
//! the reaper ([`Leadership`]). The queue's statements are in the other `db` modules, for both
//! backends.

mod agreement;
pub mod steps;

pub use agreement::Agreement;
use agreement::REPLICA_NAME;

use anyhow::Context;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};
use std::str::FromStr;
use std::time::Duration;

/// Jobs added at once after which the jobs table's statistics are updated (`Db::jobs_added`).
pub const ANALYZE_AFTER_JOBS: u64 = 1000;

/// How long connecting may take before start-up fails with the reason.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The limits every session of a replica runs under. A replica stopped (SIGSTOP, swapping)
/// inside a transaction would keep its row locks for as long as it stays stopped: PostgreSQL
/// ends such a session after `idle_in_transaction_session_timeout`, releasing them; and a
/// statement waiting on a lock gives up after `lock_timeout` (its unit is answered "retry")
/// instead of holding a writer. Both are far longer than anything a healthy replica does inside
/// a transaction (milliseconds), and shorter than a lease.
pub const SESSION_LIMITS: [(&str, &str); 2] = [("idle_in_transaction_session_timeout", "15s"), ("lock_timeout", "10s")];

/// The options of a replica's sessions at `url`: its name with what it must agree on with the
/// other replicas (`agreement`), and [`SESSION_LIMITS`].
pub fn replica_options(url: &str, agreement: &Agreement) -> anyhow::Result<PgConnectOptions> {
    Ok(options(url)?.application_name(&agreement.application_name()).options(SESSION_LIMITS))
}

/// An open PostgreSQL database with its schema up to date.
#[derive(Debug, Clone)]
pub struct Postgres {
    pub pool: PgPool,
    /// Whether this start made the schema (no migration had been applied to it before).
    pub created: bool,
}

/// Where a URL points, for messages: user, host, port and database, never the password.
pub fn describe(options: &PgConnectOptions) -> String {
    format!(
        "PostgreSQL at {}:{} (database {}, user {})",
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or("named as the user"),
        options.get_username()
    )
}

/// Parses a `postgres://` (or `postgresql://`) URL. The error never repeats the URL, which
/// may hold a password.
pub fn options(url: &str) -> anyhow::Result<PgConnectOptions> {
    let scheme = url.split_once("://").map(|(scheme, _)| scheme);
    if !matches!(scheme, Some("postgres" | "postgresql")) {
        anyhow::bail!(
            "the database URL must start with postgres:// or postgresql:// (as postgres://user@host:5432/app), \
             not {}",
            scheme.map_or_else(|| "a string without a scheme".to_string(), |scheme| format!("{scheme}://"))
        );
    }
    PgConnectOptions::from_str(url).map_err(|error| {
        // sqlx's message for a malformed URL does not quote it; keep only its kind.
        anyhow::anyhow!("the database URL is not a valid PostgreSQL URL: {}", without_url(&error.to_string(), url))
    })
}

/// Connects to the database at `url` as a replica with a lease of `lease_ms` (and no scheduler
/// settings to agree on: see [`open_agreeing`]).
pub async fn open(url: &str, lease_ms: u64) -> anyhow::Result<Postgres> {
    open_agreeing(url, &Agreement::lease(lease_ms)).await
}

/// Connects to the database at `url` as a replica, refuses a schema newer than this build's
/// and an `agreement` (lease, scheduler settings) other running replicas do not share, and
/// applies the migrations it lacks, under an advisory lock: replicas that start together check
/// and migrate one after the other.
pub async fn open_agreeing(url: &str, agreement: &Agreement) -> anyhow::Result<Postgres> {
    let options = replica_options(url, agreement)?;
    let place = describe(&options);
    // One connection first, for its error: the pool would retry a refused connection until its
    // timeout and then say only that it timed out.
    let cannot = |why: String| anyhow::anyhow!("cannot connect to {place}: {why}");
    match tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(&options)).await {
        Err(_) => return Err(cannot(cause(&sqlx::Error::PoolTimedOut))),
        Ok(Err(error)) => return Err(cannot(cause(&error))),
        Ok(Ok(probe)) => {
            let _ = probe.close().await;
        }
    }
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect_with(options)
        .await
        .map_err(|error| cannot(cause(&error)))?;
    // Replicas starting together look and migrate one at a time, so exactly one of them finds
    // the database new. (sqlx's migrator takes a lock of its own, under another key.)
    let mut lock = pool.acquire().await.map_err(|error| cannot(cause(&error)))?;
    // Another replica's migration may take longer than the session's lock_timeout.
    sqlx::query("SET lock_timeout = 0").execute(&mut *lock).await?;
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(START_LOCK)
        .execute(&mut *lock)
        .await
        .with_context(|| format!("waiting for the start-up lock of {place}"))?;
    let agreed = agree(&mut lock, agreement).await;
    let migrated = match agreed {
        Ok(()) => migrate(&pool, &mut lock, &place).await,
        Err(error) => Err(error),
    };
    let _ = sqlx::query("SELECT pg_advisory_unlock($1)").bind(START_LOCK).execute(&mut *lock).await;
    let _ = sqlx::query("RESET lock_timeout").execute(&mut *lock).await;
    drop(lock);
    match migrated {
        Ok(created) => Ok(Postgres { pool, created }),
        Err(error) => {
            pool.close().await;
            Err(error)
        }
    }
}

/// Refuses to start beside running replicas of this database that do not share `agreement`.
async fn agree(connection: &mut PgConnection, agreement: &Agreement) -> anyhow::Result<()> {
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT application_name FROM pg_stat_activity
         WHERE datname = current_database() AND application_name LIKE $1",
    )
    .bind(format!("{REPLICA_NAME}%"))
    .fetch_all(&mut *connection)
    .await
    .context("looking for the other replicas of this database")?;
    agreement.check(&names)
}

/// The advisory lock held while a replica checks and migrates the schema at start-up.
const START_LOCK: i64 = 0x6170_705f_7374_6172; // "app_star"

/// Refuses a schema newer than this build's and applies the migrations it lacks; true when the
/// database had none (this start made it).
async fn migrate(pool: &PgPool, connection: &mut PgConnection, place: &str) -> anyhow::Result<bool> {
    let migrator = sqlx::migrate!("../migrations-postgres");
    let known = migrator.iter().map(|migration| migration.version).max().unwrap_or(0);
    let table: Option<String> = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations')::TEXT")
        .fetch_one(&mut *connection)
        .await
        .with_context(|| format!("reading the schema version of {place}"))?;
    let applied: Option<i64> = match table {
        None => None,
        Some(_) => sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations")
            .fetch_one(&mut *connection)
            .await
            .with_context(|| format!("reading the schema version of {place}"))?,
    };
    if let Some(applied) = applied.filter(|applied| *applied > known) {
        anyhow::bail!(
            "the database {place} has schema version {applied}, newer than this build's {known}: a newer version \
             of app wrote it; run that version (or a newer one) against it, or point this one at another database"
        );
    }
    migrator.run(pool).await.with_context(|| format!("migrating {place}"))?;
    Ok(applied.is_none())
}

/// How long ago the database was made (its first migration applied), in seconds.
pub async fn seconds_since_made(pool: &PgPool) -> sqlx::Result<f64> {
    sqlx::query_scalar("SELECT EXTRACT(EPOCH FROM now() - min(installed_on))::DOUBLE PRECISION FROM _sqlx_migrations")
        .fetch_one(pool)
        .await
}

/// The cause of a failed connection in a few words: the I/O error (refused, no route, unknown
/// host), the server's own message (no such database, authentication failed), or the timeout.
fn cause(error: &sqlx::Error) -> String {
    match error {
        sqlx::Error::Io(io) => io.to_string(),
        sqlx::Error::Database(database) => database.message().to_string(),
        sqlx::Error::PoolTimedOut => {
            format!("no answer within {} s (a firewall, or the wrong host or port)", CONNECT_TIMEOUT.as_secs())
        }
        sqlx::Error::Tls(tls) => format!("TLS: {tls}"),
        other => other.to_string(),
    }
}

fn without_url(message: &str, url: &str) -> String {
    message.replace(url, "<the URL>")
}

/// The channel replicas announce their committed changes on.
pub const CHANGES: &str = "app_changes";

/// Sends `payload` to every replica listening on [`CHANGES`] (this one included).
pub async fn notify(pool: &PgPool, payload: &str) -> sqlx::Result<()> {
    sqlx::query("SELECT pg_notify($1, $2)").bind(CHANGES).bind(payload).execute(pool).await.map(|_| ())
}

/// A listener on [`CHANGES`], on a connection of its own (it reconnects by itself).
pub async fn listen(pool: &PgPool) -> sqlx::Result<sqlx::postgres::PgListener> {
    let mut listener = sqlx::postgres::PgListener::connect_with(pool).await?;
    listener.listen(CHANGES).await?;
    Ok(listener)
}

/// The advisory lock one replica holds while it runs the reaper.
const REAPER_LOCK: i64 = 0x6170_705f_7265_6170; // "app_reap"

/// The first key of the advisory locks over one job's checkpoints (the second is the job's
/// id; ids past 2^31 share a lock with a smaller one, which only serialises them).
const CHECKPOINT_LOCKS: i32 = 0x6170_636b; // "apck"

/// Holds the lock over `job`'s checkpoint files until the returned transaction ends (it is
/// never committed: dropped, it rolls back and the lock goes with it, even when the task
/// holding it is cancelled). Replicas place and prune one job's checkpoints one at a time, as
/// the threads of one server do (`Queue::checkpoint_lock`): else a replica pruning the files
/// that are not current could remove the one another has just placed and not yet recorded.
pub async fn lock_checkpoints(
    pool: &PgPool,
    job: shared::api::JobId,
) -> sqlx::Result<sqlx::Transaction<'static, sqlx::Postgres>> {
    let pool = pool.clone();
    let locked: futures_util::future::BoxFuture<'static, sqlx::Result<sqlx::Transaction<'static, sqlx::Postgres>>> =
        Box::pin(async move {
            let mut tx = pool.begin().await?;
            sqlx::query("SELECT pg_advisory_xact_lock($1, $2)")
                .bind(CHECKPOINT_LOCKS)
                .bind(job.get() as i32)
                .execute(&mut *tx)
                .await?;
            Ok(tx)
        });
    locked.await
}

/// Whether this replica runs the reaper: it holds the reaper's advisory lock on a connection of
/// its own. The lock goes with the connection, so a replica that dies (or loses its
/// connection) hands it on: another takes it at its next try.
pub struct Leadership {
    pool: PgPool,
    /// A connection of its own (never a pooled one, which another task could be handed).
    conn: Option<PgConnection>,
    leading: bool,
}

/// Settings of the connection that holds the reaper's lock: the database server probes a
/// silent client after 5 s, every 2 s, and gives up after 3 unanswered probes, so a leader
/// whose host vanished (no FIN, no RST) loses the lock within about 11 s instead of the
/// system's TCP timeout (hours), and another replica takes over the reaping.
const LEADER_KEEPALIVES: [&str; 3] =
    ["SET tcp_keepalives_idle = 5", "SET tcp_keepalives_interval = 2", "SET tcp_keepalives_count = 3"];

/// How long the leader's check of its connection may take before it steps down (a database
/// it cannot reach in that time is one its reaping could not write to anyway).
const LEADER_CHECK: Duration = Duration::from_secs(5);

/// Whether some server runs the reaper on this database now: its advisory lock is held. A
/// server starting beside a running replica leaves the leases as they are (the workers could
/// heartbeat meanwhile); the first of them to start extends them.
pub async fn reaper_is_led(pool: &PgPool) -> sqlx::Result<bool> {
    let mut conn = pool.acquire().await?;
    let free: bool =
        sqlx::query_scalar("SELECT pg_try_advisory_lock($1)").bind(REAPER_LOCK).fetch_one(&mut *conn).await?;
    if free {
        sqlx::query("SELECT pg_advisory_unlock($1)").bind(REAPER_LOCK).execute(&mut *conn).await?;
    }
    Ok(!free)
}

impl Leadership {
    pub fn new(pool: PgPool) -> Leadership {
        Leadership { pool, conn: None, leading: false }
    }

    async fn connect(&self) -> Option<PgConnection> {
        let mut conn = PgConnection::connect_with(&self.pool.connect_options()).await.ok()?;
        for setting in LEADER_KEEPALIVES {
            // Boxed: see `backend::on_conn!`.
            let set: futures_util::future::BoxFuture<'_, sqlx::Result<sqlx::postgres::PgQueryResult>> =
                Box::pin(sqlx::query(setting).execute(&mut conn));
            // Best effort (a pooler in between may refuse SET): leading without it is better
            // than no replica leading.
            if let Err(error) = set.await {
                tracing::warn!(%error, setting, "the reaper's lock connection keeps the system's TCP keepalives");
            }
        }
        Some(conn)
    }

    /// Whether this replica leads now: keeps the lock while its connection answers, else tries
    /// to take it (without waiting).
    pub async fn lead(&mut self) -> bool {
        if self.conn.is_none() {
            self.conn = self.connect().await;
        }
        let Some(conn) = self.conn.as_mut() else { return false };
        let query = match self.leading {
            true => sqlx::query_scalar("SELECT true"),
            false => sqlx::query_scalar("SELECT pg_try_advisory_lock($1)").bind(REAPER_LOCK),
        };
        // Boxed: see `backend::on_conn!` (the reaper's future must be Send for every lifetime).
        let fetch: futures_util::future::BoxFuture<'_, sqlx::Result<bool>> = Box::pin(query.fetch_one(&mut *conn));
        let answer = match tokio::time::timeout(LEADER_CHECK, fetch).await {
            Ok(answer) => answer,
            Err(_) => Err(sqlx::Error::PoolTimedOut),
        };
        match answer {
            Ok(leading) => {
                if leading && !self.leading {
                    tracing::info!("this replica runs the reaper");
                }
                self.leading = leading;
            }
            Err(error) => {
                if self.leading {
                    tracing::warn!(%error, "lost the connection holding the reaper's lock; another replica may take it");
                }
                self.conn = None;
                self.leading = false;
            }
        }
        self.leading
    }
}

/// Makes a new database `name` (letters, digits and `_`) on the server `url` points to (any of
/// its databases); the new database's URL. For benchmarks and tests.
pub async fn create_database(url: &str, name: &str) -> anyhow::Result<String> {
    anyhow::ensure!(
        !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
        "a database name of letters, digits and _, not {name:?}"
    );
    let options = options(url)?;
    let mut conn = PgConnection::connect_with(&options)
        .await
        .with_context(|| format!("cannot connect to {}", describe(&options)))?;
    sqlx::query(&format!("CREATE DATABASE \"{name}\"")).execute(&mut conn).await?;
    let _ = conn.close().await;
    let (base, _) = url
        .split('?')
        .next()
        .unwrap_or(url)
        .rsplit_once('/')
        .ok_or_else(|| anyhow::anyhow!("the URL names no database"))?;
    Ok(format!("{base}/{name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_for_their_scheme_and_never_echoed_with_their_password() {
        let wrong = options("mysql://root:hunter2@db/app").unwrap_err().to_string();
        assert!(wrong.contains("postgres://") && wrong.contains("not mysql://"), "{wrong}");
        assert!(!wrong.contains("hunter2"), "{wrong}");
        let bare = options("db.example.org/app").unwrap_err().to_string();
        assert!(bare.contains("without a scheme"), "{bare}");
        let malformed = options("postgres://app:hunter2@db:notaport/app").unwrap_err().to_string();
        assert!(malformed.contains("not a valid PostgreSQL URL") && !malformed.contains("hunter2"), "{malformed}");
        let good = options("postgresql://app:hunter2@db.example.org:6543/queue").unwrap();
        let described = describe(&good);
        assert_eq!(described, "PostgreSQL at db.example.org:6543 (database queue, user app)");
    }
}
