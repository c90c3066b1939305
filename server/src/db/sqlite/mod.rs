//! What only SQLite has: the database file (`queue.db` in the data directory), opened here with
//! rusqlite, the one SQLite driver; its migrations; the readers' pool; the checkpointer; and the
//! finish+claim owner of this backend ([`steps`]).
//!
//! Every connection is called synchronously by the thread that holds it: the writer's by the
//! writer thread (`queue::writer`), a reader's by the task that took it from [`Readers`]. No
//! statement is a hop to another thread (decision 0069).

pub mod steps;

use super::sql;
use anyhow::Context;
use rusqlite::{Connection, OpenFlags};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long a connection waits for another one's write lock before it says the database is busy.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);
/// Statements each connection keeps prepared (the store has about 150).
const STATEMENT_CACHE: usize = 128;
/// Readers open at once at most.
const READERS: usize = 4;
/// How long a read waits for a reader to come free.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);

/// The settings every connection gets: foreign keys, a 32 MB page cache, temporary tables in
/// memory, a busy timeout.
fn configure(conn: &Connection) -> rusqlite::Result<()> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.execute_batch("PRAGMA foreign_keys = ON; PRAGMA cache_size = -32000; PRAGMA temp_store = memory;")?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(())
}

/// Opens the database file for writing, as the writer does: WAL (the file's own mode),
/// synchronous NORMAL (with WAL, a process crash loses no committed transaction; a power cut
/// may lose the last ones, and each commit saves an fsync), no checkpoint on commit (that
/// would stall a submission or a claim now and then: the checkpointer does them). Never
/// creates the file: [`create`] made and migrated it.
pub fn open_writer(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX)?;
    configure(&conn)?;
    conn.execute_batch("PRAGMA synchronous = NORMAL; PRAGMA wal_autocheckpoint = 0;")?;
    Ok(conn)
}

fn open_reader(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX)?;
    configure(&conn)?;
    Ok(conn)
}

/// Opens (creating if missing) the database file in WAL mode and brings its schema up to date;
/// returns whether this made it (no migration had been applied to it before).
pub fn create(path: &Path) -> anyhow::Result<bool> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let mut conn =
        Connection::open_with_flags(path, flags).with_context(|| format!("opening database {}", path.display()))?;
    configure(&conn).with_context(|| format!("opening database {}", path.display()))?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .with_context(|| format!("opening database {}", path.display()))?;
    anyhow::ensure!(mode.eq_ignore_ascii_case("wal"), "database {} cannot use a write-ahead log", path.display());
    conn.execute_batch("PRAGMA synchronous = NORMAL")?;
    let migrator = sqlx::migrate!("../migrations");
    let created = schema_before(&conn, &migrator, path)?.is_none();
    migrate(&mut conn, &migrator).with_context(|| format!("migrating database {}", path.display()))?;
    Ok(created)
}

/// The schema version the database had before this start (None: no migration was ever
/// applied, a new database). A database written by a newer build has migrations this build
/// does not know: refused with both versions, before anything is changed.
fn schema_before(conn: &Connection, migrator: &sqlx::migrate::Migrator, path: &Path) -> anyhow::Result<Option<i64>> {
    let known = migrator.iter().map(|migration| migration.version).max().unwrap_or(0);
    let reading = || format!("reading the schema version of {}", path.display());
    let table: bool = conn
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations')",
            [],
            |row| row.get(0),
        )
        .with_context(reading)?;
    if !table {
        return Ok(None);
    }
    let applied: Option<i64> =
        conn.query_row("SELECT max(version) FROM _sqlx_migrations", [], |row| row.get(0)).with_context(reading)?;
    match applied {
        Some(applied) if applied > known => anyhow::bail!(
            "the database {} has schema version {applied}, newer than this build's {known}: a newer version of \
             app wrote it; run that version (or a newer one) on this data directory, or point this one at another",
            path.display()
        ),
        applied => Ok(applied),
    }
}

/// Applies the migrations `conn` lacks, each in a transaction with its record, in the table and
/// form sqlx's migrator keeps (`_sqlx_migrations`: databases made by earlier builds, migrated
/// by sqlx, carry on). A migration recorded as failed, or recorded with another checksum (its
/// file was edited after it ran), is refused.
fn migrate(conn: &mut Connection, migrator: &sqlx::migrate::Migrator) -> anyhow::Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS _sqlx_migrations (
             version BIGINT PRIMARY KEY,
             description TEXT NOT NULL,
             installed_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP,
             success BOOLEAN NOT NULL,
             checksum BLOB NOT NULL,
             execution_time BIGINT NOT NULL
         )",
    )?;
    let dirty: Option<i64> = conn
        .query_row("SELECT version FROM _sqlx_migrations WHERE success = false ORDER BY version LIMIT 1", [], |row| {
            row.get(0)
        })
        .map(Some)
        .or_else(|error| match error {
            rusqlite::Error::QueryReturnedNoRows => Ok(None),
            error => Err(error),
        })?;
    if let Some(version) = dirty {
        anyhow::bail!("migration {version} was applied partly (it failed); restore the database from a backup");
    }
    let applied: std::collections::HashMap<i64, Vec<u8>> = conn
        .prepare("SELECT version, checksum FROM _sqlx_migrations")?
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect::<rusqlite::Result<_>>()?;
    for migration in migrator.iter().filter(|migration| !migration.migration_type.is_down_migration()) {
        if let Some(checksum) = applied.get(&migration.version) {
            anyhow::ensure!(
                checksum.as_slice() == &*migration.checksum,
                "migration {} was applied with other text than this build's (its file was changed)",
                migration.version
            );
            continue;
        }
        let started = std::time::Instant::now();
        let tx = conn.transaction()?;
        tx.execute_batch(&migration.sql).with_context(|| format!("applying migration {}", migration.version))?;
        tx.execute(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
             VALUES (?1, ?2, TRUE, ?3, ?4)",
            rusqlite::params![
                migration.version,
                &*migration.description,
                &*migration.checksum,
                started.elapsed().as_nanos() as i64
            ],
        )?;
        tx.commit()?;
    }
    Ok(())
}

/// The readers: read-only connections, opened as needed up to [`READERS`], each lent to one
/// task at a time. They never wait for the writer (WAL).
#[derive(Debug, Clone)]
pub struct Readers(Arc<Shared>);

#[derive(Debug)]
struct Shared {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
    permits: Arc<Semaphore>,
    closed: AtomicBool,
}

/// A reader lent to one task; back to the pool when dropped.
#[derive(Debug)]
pub struct ReaderConn {
    conn: Option<Connection>,
    pool: Arc<Shared>,
    _permit: OwnedSemaphorePermit,
}

impl Readers {
    /// The pool of readers of `path`; one is opened now, to say at once if none can be.
    pub fn open(path: &Path) -> anyhow::Result<Readers> {
        let first = open_reader(path).with_context(|| format!("opening database {} for reading", path.display()))?;
        Ok(Readers(Arc::new(Shared {
            path: path.to_path_buf(),
            idle: Mutex::new(vec![first]),
            permits: Arc::new(Semaphore::new(READERS)),
            closed: AtomicBool::new(false),
        })))
    }

    /// A reader, waiting up to 30 s for one to come free.
    pub async fn acquire(&self) -> sql::Result<ReaderConn> {
        let waiting = self.0.permits.clone().acquire_owned();
        let permit = match tokio::time::timeout(ACQUIRE_TIMEOUT, waiting).await {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) => return Err(sql::Error::PoolClosed),
            Err(_) => return Err(sql::Error::PoolTimedOut),
        };
        let idle = self.0.idle.lock().ok().and_then(|mut idle| idle.pop());
        let conn = match idle {
            Some(conn) => conn,
            None => open_reader(&self.0.path)?,
        };
        Ok(ReaderConn { conn: Some(conn), pool: self.0.clone(), _permit: permit })
    }

    /// Closes the idle readers; those lent out close when they come back.
    pub fn close(&self) {
        self.0.closed.store(true, Ordering::SeqCst);
        self.0.permits.close();
        if let Ok(mut idle) = self.0.idle.lock() {
            idle.clear();
        }
    }
}

impl ReaderConn {
    pub fn connection(&mut self) -> &mut Connection {
        self.conn.as_mut().expect("a lent reader has its connection until dropped")
    }
}

impl Drop for ReaderConn {
    fn drop(&mut self) {
        if self.pool.closed.load(Ordering::SeqCst) {
            return;
        }
        if let (Some(conn), Ok(mut idle)) = (self.conn.take(), self.pool.idle.lock()) {
            idle.push(conn);
        }
    }
}

/// The connection that copies the write-ahead log into the database, off the writer's path;
/// its calls run on the runtime's blocking threads (a checkpoint may wait for readers).
#[derive(Debug, Clone)]
pub struct Checkpointer(Arc<Mutex<Connection>>);

impl Checkpointer {
    pub fn open(path: &Path) -> anyhow::Result<Checkpointer> {
        let conn = open_writer(path).with_context(|| format!("opening database {} for checkpoints", path.display()))?;
        Ok(Checkpointer(Arc::new(Mutex::new(conn))))
    }

    /// Runs `PRAGMA wal_checkpoint(mode)`; returns the WAL's size in pages before.
    pub async fn checkpoint(&self, mode: &'static str) -> sql::Result<i64> {
        let conn = self.0.clone();
        let ran = tokio::task::spawn_blocking(move || {
            let conn = conn.lock().map_err(|_| sql::Error::PoolClosed)?;
            let (_busy, wal_pages): (i64, i64) =
                conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |row| Ok((row.get(0)?, row.get(1)?)))?;
            Ok(wal_pages)
        });
        ran.await.map_err(|_| sql::Error::PoolClosed)?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn readers_are_lent_one_task_at_a_time_and_come_back() {
        let directory = tempfile::tempdir().unwrap();
        let path = directory.path().join("queue.db");
        assert!(create(&path).unwrap(), "a new file is made");
        assert!(!create(&path).unwrap(), "and found the second time");
        let readers = Readers::open(&path).unwrap();
        let mut lent = Vec::new();
        for _ in 0..READERS {
            lent.push(readers.acquire().await.unwrap());
        }
        let waiting = tokio::time::timeout(Duration::from_millis(50), readers.acquire()).await;
        assert!(waiting.is_err(), "a fifth waits while four are lent");
        let one: i64 = sql::query_scalar("SELECT count(*) FROM jobs").fetch_one(&mut lent[0]).await.unwrap();
        assert_eq!(one, 0);
        drop(lent);
        assert_eq!(readers.0.idle.lock().unwrap().len(), READERS);
        let written =
            sql::query("INSERT INTO workers (name, capacity, registered_at, last_seen_at) VALUES ('w', '{}', 0, 0)")
                .execute(&readers)
                .await;
        assert!(written.is_err(), "readers are read-only");
        readers.close();
        assert!(matches!(readers.acquire().await, Err(sql::Error::PoolClosed)));
    }
}
