//! The only place SQL lives, for both backends: SQLite (`queue.db` in the data directory) and
//! PostgreSQL (a database named by URL, shared by the replicas). The database is opened here,
//! once, and its migrations run at start-up (`migrations/` or `migrations-postgres/`). Each
//! function's statement is written once and compiled for both engines ([`backend`]).
//!
//! SQLite is opened with WAL, foreign keys and a busy timeout. Writes go through a pool of
//! exactly one connection: SQLite allows one writer at a time anyway, and queueing writers in
//! the pool (fair, async) is far faster under contention than letting several connections
//! collide and sleep in SQLite's busy handler. Reads use their own pool and never wait for
//! writers (WAL). The writer thread's own rusqlite connection for the hot path is in [`fast`].
//!
//! PostgreSQL has one pool for everything; the writer takes one connection of it for its
//! transactions, and its bare finishes go through the one-statement lane in [`bulk`]. What
//! only PostgreSQL has (the URL, notifications between replicas, the reaper's lock) is in
//! [`postgres`].

pub mod analysis;
pub mod backend;
pub mod bulk;
pub mod checkpoints;
pub mod code;
pub mod events;
pub mod fast;
pub mod gpu;
pub mod jobs;
pub mod logs;
pub mod maintenance;
pub mod metrics;
pub mod plain_claims;
pub mod postgres;
pub mod results;
pub mod scrape;
pub mod search;
pub mod sweeps;
pub mod telemetry;
pub mod workers;

use anyhow::Context;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::SqlitePool;
use std::path::Path;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Db {
    /// Readers.
    pub reader: backend::Pool,
    kind: Kind,
    /// Whether this start made the database (no migration had been applied to it before).
    pub created: bool,
}

/// What each backend keeps besides its readers.
#[derive(Debug, Clone)]
enum Kind {
    Sqlite {
        /// The single writer connection.
        writer: SqlitePool,
        /// Copies the write-ahead log into the database file, off the writer's path.
        checkpointer: SqlitePool,
        wal_path: std::path::PathBuf,
    },
    /// One pool for everything: the writer takes one connection of it for its transactions.
    Postgres { pool: sqlx::PgPool },
}

/// What the writer thread writes through.
#[derive(Debug, Clone)]
pub enum WriterPool {
    /// The single-connection writer pool, and the file its own (fast) connection opens.
    Sqlite(SqlitePool, std::path::PathBuf),
    Postgres(sqlx::PgPool),
}

impl Db {
    /// Opens (creating if missing) `<data_dir>/queue.db` and brings its schema up to date.
    pub async fn open(data_dir: &Path) -> anyhow::Result<Db> {
        std::fs::create_dir_all(data_dir).with_context(|| format!("creating data directory {}", data_dir.display()))?;
        // SQLite would say only "unable to open database file" for a directory it cannot write.
        let probe = data_dir.join(format!(".write-test-{}", std::process::id()));
        std::fs::write(&probe, b"")
            .and_then(|()| std::fs::remove_file(&probe))
            .with_context(|| format!("the data directory {} is not writable", data_dir.display()))?;
        let path = data_dir.join("queue.db");
        let options = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // With WAL, NORMAL loses no committed transaction on a process crash, only possibly
            // the last ones on a power cut, and saves an fsync per commit.
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(10))
            .pragma("cache_size", "-32000")
            .pragma("temp_store", "memory");
        // The writer never checkpoints on commit (that would stall a submission or a claim
        // now and then); the checkpointer connection does it in the background instead.
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options.clone().pragma("wal_autocheckpoint", "0"))
            .await
            .with_context(|| format!("opening database {}", path.display()))?;
        let migrator = sqlx::migrate!("../migrations");
        let created = schema_before(&writer, &migrator, &path).await?.is_none();
        migrator.run(&writer).await.with_context(|| format!("migrating database {}", path.display()))?;
        // No ping before each use (sqlx's default): a local file's connection does not drop
        // away, and the ping was a second round trip to the connection's thread on every read.
        let reader = SqlitePoolOptions::new()
            .max_connections(4)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options.clone().read_only(true))
            .await
            .with_context(|| format!("opening database {} for reading", path.display()))?;
        let checkpointer = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options.clone())
            .await
            .with_context(|| format!("opening database {} for checkpoints", path.display()))?;
        Ok(Db {
            reader: backend::Pool::Sqlite(reader),
            kind: Kind::Sqlite { writer, checkpointer, wal_path: data_dir.join("queue.db-wal") },
            created,
        })
    }

    /// Opens the PostgreSQL database at `url` as a replica with a lease of `lease_ms` and
    /// brings its schema up to date (see [`postgres::open`]).
    pub async fn open_postgres(url: &str, lease_ms: u64) -> anyhow::Result<Db> {
        let opened = postgres::open(url, lease_ms).await?;
        Ok(Db {
            reader: backend::Pool::Postgres(opened.pool.clone()),
            kind: Kind::Postgres { pool: opened.pool },
            created: opened.created,
        })
    }

    /// Told that `jobs` jobs were just added (and committed): on PostgreSQL, after many, the
    /// planner's statistics of `jobs` are brought up to date in the background. Until then a
    /// new database has none (autovacuum looks once a minute), and the claim, planned for an
    /// empty table, sorted every queued job: 25 ms a claim with 72,000 queued, 0.2 ms after.
    pub fn jobs_added(&self, jobs: u64) {
        let Kind::Postgres { pool } = &self.kind else { return };
        if jobs < postgres::ANALYZE_AFTER_JOBS {
            return;
        }
        let pool = pool.clone();
        tokio::spawn(async move {
            if let Err(error) = sqlx::query("ANALYZE jobs").execute(&pool).await {
                tracing::warn!(%error, "updating the planner's statistics of the jobs");
            }
        });
    }

    /// The database, for messages: its file, or PostgreSQL's host, port, name and user.
    pub fn describe(&self) -> String {
        match &self.kind {
            Kind::Sqlite { .. } => self.path().display().to_string(),
            Kind::Postgres { pool } => postgres::describe(&pool.connect_options()),
        }
    }

    /// The engine behind this database.
    pub fn engine(&self) -> backend::Engine {
        match self.kind {
            Kind::Sqlite { .. } => backend::Engine::Sqlite,
            Kind::Postgres { .. } => backend::Engine::Postgres,
        }
    }

    /// What the writer thread writes through.
    pub fn writer_pool(&self) -> WriterPool {
        match &self.kind {
            Kind::Sqlite { writer, .. } => WriterPool::Sqlite(writer.clone(), self.path()),
            Kind::Postgres { pool } => WriterPool::Postgres(pool.clone()),
        }
    }

    /// The PostgreSQL pool (`None` on SQLite), for what only PostgreSQL has (`db::postgres`).
    pub fn postgres_pool(&self) -> Option<&sqlx::PgPool> {
        match &self.kind {
            Kind::Sqlite { .. } => None,
            Kind::Postgres { pool } => Some(pool),
        }
    }

    /// The SQLite writer pool (`None` on PostgreSQL), for tests and maintenance that run
    /// SQLite statements of their own.
    pub fn sqlite_writer(&self) -> Option<&SqlitePool> {
        match &self.kind {
            Kind::Sqlite { writer, .. } => Some(writer),
            Kind::Postgres { .. } => None,
        }
    }

    /// Whether any sweep was ever kept (or is still): a database without one has never run a
    /// job that left files.
    pub async fn holds_sweeps(&self) -> sqlx::Result<bool> {
        match &self.reader {
            backend::Pool::Sqlite(pool) => {
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM sweeps)").fetch_one(pool).await
            }
            backend::Pool::Postgres(pool) => {
                sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM sweeps)").fetch_one(pool).await
            }
        }
    }

    /// Closes a database this start made and removes its files (only for `created`). A
    /// PostgreSQL schema stays: the database is the operator's, not this process's.
    pub async fn discard(self) {
        let Kind::Sqlite { writer, checkpointer, .. } = &self.kind else {
            return self.close().await;
        };
        let path = self.path();
        writer.close().await;
        self.reader.close().await;
        checkpointer.close().await;
        for suffix in ["", "-wal", "-shm"] {
            let file = format!("{}{suffix}", path.display());
            if let Err(error) = std::fs::remove_file(&file) {
                if error.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(%error, file, "could not remove the database this start made");
                }
            }
        }
    }

    /// Moves what it can of the WAL into the database without blocking readers or the writer;
    /// returns the WAL's size in pages (0 on PostgreSQL, which keeps its own log).
    pub async fn checkpoint(&self) -> sqlx::Result<i64> {
        let checkpointer = match &self.kind {
            Kind::Sqlite { checkpointer, .. } => checkpointer,
            // PostgreSQL writes its own log to disk; what is folded after writes there is the
            // count moves (`sweeps::fold_count_moves`).
            Kind::Postgres { pool } => return sweeps::fold_count_moves(pool).await.map(|_| 0),
        };
        let (_busy, wal_pages, _copied): (i64, i64, i64) =
            sqlx::query_as("PRAGMA wal_checkpoint(PASSIVE)").fetch_one(checkpointer).await?;
        Ok(wal_pages)
    }

    /// Copies the rest of the WAL into the database with writes held off, so that the next
    /// write starts the log again from its beginning; returns the WAL's size in pages before.
    /// Under a steady stream of writes a passive checkpoint never catches up with the end of
    /// the log, the log is never restarted and grows without bound (1.6 GB a minute with 500
    /// workers heartbeating: `app dev bench load`). Waits for readers (busy timeout) meanwhile.
    /// The caller holds writes off meanwhile (`Queue::restart_wal` runs it between two write
    /// groups).
    pub async fn restart_wal(&self) -> sqlx::Result<i64> {
        let Kind::Sqlite { checkpointer, .. } = &self.kind else { return Ok(0) };
        let (_busy, wal_pages, _copied): (i64, i64, i64) =
            sqlx::query_as("PRAGMA wal_checkpoint(RESTART)").fetch_one(checkpointer).await?;
        Ok(wal_pages)
    }

    /// Copies the whole WAL into the database and truncates the file to nothing (it keeps its
    /// largest size otherwise). The caller holds writes off meanwhile.
    pub async fn truncate_wal(&self) -> sqlx::Result<()> {
        let Kind::Sqlite { checkpointer, .. } = &self.kind else { return Ok(()) };
        sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)").execute(checkpointer).await.map(|_| ())
    }

    /// The SQLite database file (a name that exists nowhere on PostgreSQL).
    pub fn path(&self) -> std::path::PathBuf {
        match &self.kind {
            Kind::Sqlite { wal_path, .. } => wal_path.with_file_name("queue.db"),
            Kind::Postgres { .. } => std::path::PathBuf::new(),
        }
    }

    /// The size of the write-ahead log file on disk (0 on PostgreSQL).
    pub fn wal_bytes(&self) -> u64 {
        match &self.kind {
            Kind::Sqlite { wal_path, .. } => std::fs::metadata(wal_path).map(|meta| meta.len()).unwrap_or(0),
            Kind::Postgres { .. } => 0,
        }
    }

    /// Checkpoints fully and closes every connection, leaving a compact database file.
    pub async fn close(&self) {
        self.reader.close().await;
        match &self.kind {
            Kind::Sqlite { writer, checkpointer, .. } => {
                writer.close().await;
                if let Err(error) = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)").execute(checkpointer).await {
                    tracing::warn!(%error, "final checkpoint failed; the WAL is replayed at the next start");
                }
                checkpointer.close().await;
            }
            Kind::Postgres { pool } => pool.close().await,
        }
    }
}

/// The schema version the database had before this start (None: no migration was ever
/// applied, a new database). A database written by a newer build has migrations this build
/// does not know: refused with both versions (sqlx's own words name only the first unknown
/// migration), before anything is changed.
async fn schema_before(
    writer: &SqlitePool,
    migrator: &sqlx::migrate::Migrator,
    path: &Path,
) -> anyhow::Result<Option<i64>> {
    let known = migrator.iter().map(|migration| migration.version).max().unwrap_or(0);
    let table: Option<String> =
        sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'")
            .fetch_optional(writer)
            .await
            .with_context(|| format!("reading the schema version of {}", path.display()))?;
    if table.is_none() {
        return Ok(None);
    }
    let applied: Option<i64> = sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations")
        .fetch_one(writer)
        .await
        .with_context(|| format!("reading the schema version of {}", path.display()))?;
    match applied {
        Some(applied) if applied > known => anyhow::bail!(
            "the database {} has schema version {applied}, newer than this build's {known}: a newer version of \
             app wrote it; run that version (or a newer one) on this data directory, or point this one at another",
            path.display()
        ),
        applied => Ok(applied),
    }
}

/// Wall-clock now in Unix milliseconds, the unit of every time column.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_database_from_a_newer_build_is_refused_with_both_versions_and_left_as_it_was() {
        let directory = tempfile::tempdir().unwrap();
        let db = Db::open(directory.path()).await.unwrap();
        let known = sqlx::migrate!("../migrations").iter().map(|migration| migration.version).max().unwrap();
        sqlx::query(
            "INSERT INTO _sqlx_migrations (version, description, installed_on, success, checksum, execution_time)
             VALUES (?, 'from a newer build', '2030-01-01', 1, x'00', 1)",
        )
        .bind(known + 5)
        .execute(db.sqlite_writer().unwrap())
        .await
        .unwrap();
        db.close().await;
        let refused = Db::open(directory.path()).await.unwrap_err().to_string();
        assert!(refused.contains(&format!("schema version {}", known + 5)), "{refused}");
        assert!(refused.contains(&format!("newer than this build's {known}")), "{refused}");
        // The refusal changed nothing: the migrations recorded are the same; with the newer
        // one gone, this build opens the database again.
        let file = directory.path().join("queue.db");
        let options = SqliteConnectOptions::new().filename(&file);
        let pool = SqlitePoolOptions::new().max_connections(1).connect_with(options).await.unwrap();
        let recorded: Vec<i64> =
            sqlx::query_scalar("SELECT version FROM _sqlx_migrations ORDER BY version").fetch_all(&pool).await.unwrap();
        let mut expected: Vec<i64> =
            sqlx::migrate!("../migrations").iter().map(|migration| migration.version).collect();
        expected.push(known + 5);
        assert_eq!(recorded, expected);
        sqlx::query("DELETE FROM _sqlx_migrations WHERE version > ?").bind(known).execute(&pool).await.unwrap();
        pool.close().await;
        Db::open(directory.path()).await.unwrap().close().await;
    }
}
