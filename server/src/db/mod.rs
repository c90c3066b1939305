//! The only place SQL lives, for both backends: SQLite (`queue.db` in the data directory,
//! through rusqlite) and PostgreSQL (a database named by URL, shared by the replicas, through
//! sqlx). The database is opened here, once, and its migrations run at start-up (`migrations/`
//! or `migrations-postgres/`). Each function's statement is written once and compiled for both
//! engines ([`backend`], [`sql`]).
//!
//! SQLite has one writer connection, the writer thread's own (SQLite allows one writer at a
//! time anyway), readers that never wait for it (WAL) and a checkpointer ([`sqlite`]).
//! PostgreSQL has one pool for everything; the writer takes one connection of it for its
//! transactions. Each backend has one owner of the hot path, a group of bare finishes with
//! their workers' next claims ([`sqlite::steps`], [`postgres::steps`]). What only PostgreSQL
//! has (the URL, notifications between replicas, the reaper's lock) is in [`postgres`].

pub mod analysis;
pub mod backend;
pub mod checkpoints;
pub mod claims;
pub mod code;
pub mod events;
pub mod fail_fast;
pub mod gpu;
pub mod job_pages;
pub mod jobs;
pub mod logs;
pub mod maintenance;
pub mod metrics;
pub mod postgres;
pub mod preemptions;
pub mod reservations;
pub mod results;
pub mod scrape;
pub mod search;
pub mod shares;
pub mod sql;
pub mod sqlite;
pub mod sweep_jobs;
pub mod sweeps;
pub mod telemetry;
pub mod usage;
pub mod workers;

use anyhow::Context;
use std::path::Path;

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
        /// Copies the write-ahead log into the database file, off the writer's path.
        checkpointer: sqlite::Checkpointer,
        wal_path: std::path::PathBuf,
    },
    /// One pool for everything: the writer takes one connection of it for its transactions.
    Postgres { pool: sqlx::PgPool },
}

/// What the writer thread writes through.
#[derive(Debug, Clone)]
pub enum WriterPool {
    /// The database file the writer opens its connection to.
    Sqlite(std::path::PathBuf),
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
        let created = {
            let path = path.clone();
            tokio::task::spawn_blocking(move || sqlite::create(&path)).await??
        };
        let reader = sqlite::Readers::open(&path)?;
        let checkpointer = sqlite::Checkpointer::open(&path)?;
        Ok(Db {
            reader: backend::Pool::Sqlite(reader),
            kind: Kind::Sqlite { checkpointer, wal_path: data_dir.join("queue.db-wal") },
            created,
        })
    }

    /// Opens the PostgreSQL database at `url` as a replica that runs by `agreement` (its lease
    /// and scheduler settings, which the running replicas must share) and brings its schema up
    /// to date (see [`postgres::open_agreeing`]).
    pub async fn open_postgres(url: &str, agreement: &postgres::Agreement) -> anyhow::Result<Db> {
        let opened = postgres::open_agreeing(url, agreement).await?;
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
            if let Err(error) = sql::query("ANALYZE jobs").execute(&pool).await {
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
            Kind::Sqlite { .. } => WriterPool::Sqlite(self.path()),
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

    /// A connection of its own that writes to the SQLite database (`None` on PostgreSQL), for
    /// tests and maintenance that run SQLite statements of their own.
    pub fn sqlite_connection(&self) -> sql::Result<Option<rusqlite::Connection>> {
        match &self.kind {
            Kind::Sqlite { .. } => Ok(Some(sqlite::open_writer(&self.path())?)),
            Kind::Postgres { .. } => Ok(None),
        }
    }

    /// Whether any sweep was ever kept (or is still): a database without one has never run a
    /// job that left files.
    pub async fn holds_sweeps(&self) -> sql::Result<bool> {
        match &self.reader {
            backend::Pool::Sqlite(pool) => {
                sql::query_scalar("SELECT EXISTS (SELECT 1 FROM sweeps)").fetch_one(pool).await
            }
            backend::Pool::Postgres(pool) => {
                sql::query_scalar("SELECT EXISTS (SELECT 1 FROM sweeps)").fetch_one(pool).await
            }
        }
    }

    /// Closes a database this start made and removes its files (only for `created`). A
    /// PostgreSQL schema stays: the database is the operator's, not this process's.
    pub async fn discard(self) {
        let Kind::Sqlite { .. } = &self.kind else {
            return self.close().await;
        };
        let path = self.path();
        self.reader.close().await;
        drop(self);
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
    pub async fn checkpoint(&self) -> sql::Result<i64> {
        let checkpointer = match &self.kind {
            Kind::Sqlite { checkpointer, .. } => checkpointer,
            // PostgreSQL writes its own log to disk; what is folded after writes there is the
            // count moves (`sweeps::fold_count_moves`).
            Kind::Postgres { pool } => return sweeps::fold_count_moves(pool).await.map(|_| 0),
        };
        checkpointer.checkpoint("PASSIVE").await
    }

    /// Copies the rest of the WAL into the database with writes held off, so that the next
    /// write starts the log again from its beginning; returns the WAL's size in pages before.
    /// Under a steady stream of writes a passive checkpoint never catches up with the end of
    /// the log, the log is never restarted and grows without bound (1.6 GB a minute with 500
    /// workers heartbeating: `app-bench load`). Waits for readers (busy timeout) meanwhile.
    /// The caller holds writes off meanwhile (`Queue::restart_wal` runs it between two write
    /// groups).
    pub async fn restart_wal(&self) -> sql::Result<i64> {
        let Kind::Sqlite { checkpointer, .. } = &self.kind else { return Ok(0) };
        checkpointer.checkpoint("RESTART").await
    }

    /// Copies the whole WAL into the database and truncates the file to nothing (it keeps its
    /// largest size otherwise). The caller holds writes off meanwhile.
    pub async fn truncate_wal(&self) -> sql::Result<()> {
        let Kind::Sqlite { checkpointer, .. } = &self.kind else { return Ok(()) };
        checkpointer.checkpoint("TRUNCATE").await.map(drop)
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
            Kind::Sqlite { checkpointer, .. } => {
                if let Err(error) = checkpointer.checkpoint("TRUNCATE").await {
                    tracing::warn!(%error, "final checkpoint failed; the WAL is replayed at the next start");
                }
            }
            Kind::Postgres { pool } => pool.close().await,
        }
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
        let conn = db.sqlite_connection().unwrap().unwrap();
        conn.execute(
            "INSERT INTO _sqlx_migrations (version, description, installed_on, success, checksum, execution_time)
             VALUES (?1, 'from a newer build', '2030-01-01', 1, x'00', 1)",
            [known + 5],
        )
        .unwrap();
        db.close().await;
        let refused = Db::open(directory.path()).await.unwrap_err().to_string();
        assert!(refused.contains(&format!("schema version {}", known + 5)), "{refused}");
        assert!(refused.contains(&format!("newer than this build's {known}")), "{refused}");
        // The refusal changed nothing: the migrations recorded are the same; with the newer
        // one gone, this build opens the database again.
        let recorded: Vec<i64> = conn
            .prepare("SELECT version FROM _sqlx_migrations ORDER BY version")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        let mut expected: Vec<i64> =
            sqlx::migrate!("../migrations").iter().map(|migration| migration.version).collect();
        expected.push(known + 5);
        assert_eq!(recorded, expected);
        conn.execute("DELETE FROM _sqlx_migrations WHERE version > ?1", [known]).unwrap();
        drop(conn);
        Db::open(directory.path()).await.unwrap().close().await;
    }

    /// A database made and migrated by sqlx (every build before rusqlite became the one SQLite
    /// driver) carries on: its records are read, nothing is applied twice.
    #[tokio::test]
    async fn a_database_migrated_by_earlier_builds_opens_as_it_was() {
        let directory = tempfile::tempdir().unwrap();
        Db::open(directory.path()).await.unwrap().close().await;
        let db = Db::open(directory.path()).await.unwrap();
        assert!(!db.created);
        let conn = db.sqlite_connection().unwrap().unwrap();
        let checksum: Vec<u8> =
            conn.query_row("SELECT checksum FROM _sqlx_migrations WHERE version = 1", [], |row| row.get(0)).unwrap();
        let migrator = sqlx::migrate!("../migrations");
        assert_eq!(checksum.as_slice(), &*migrator.iter().next().unwrap().checksum, "sqlx's SHA-384 of the file");
        conn.execute("UPDATE _sqlx_migrations SET checksum = x'00' WHERE version = 1", []).unwrap();
        db.close().await;
        let refused = Db::open(directory.path()).await.unwrap_err();
        assert!(format!("{refused:#}").contains("migration 1 was applied with other text"), "{refused:#}");
    }
}
