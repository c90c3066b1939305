//! One `db::` function for both backends: a connection or pool of either, and the macros that
//! run one statement on whichever it is.
//!
//! A function takes `impl Into<Conn>` (a connection inside the writer's transaction) or
//! `impl Into<PoolRef>` (a reader pool), so callers pass what they hold, a SQLite connection
//! or a PostgreSQL one, unchanged. Its statement is written once where both engines read it
//! the same: parameters as `$1, $2, ...` (`db::sql` binds them by number on SQLite;
//! `server/tests/postgres` checks both), and [`Engine`] picks the text where they differ (JSON
//! functions, `INSERT OR IGNORE`). The body is compiled once per backend by [`on_conn!`] and
//! [`on_pool!`] (`on_conn!(conn, |conn, engine| body)`), with `conn` the backend's own
//! connection or pool.

use super::sqlite::{ReaderConn, Readers};
use rusqlite::Connection as SqliteConnection;
use sqlx::{PgConnection, PgPool};

pub use super::sql::{DbRow, Decodable};

/// Which engine a statement runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Sqlite,
    Postgres,
}

impl Engine {
    /// The rows of parameter `$n`, a JSON array of integers (ids), as a subquery's body:
    /// `id IN (SELECT {ids})`.
    pub fn json_ids(self, n: usize) -> String {
        match self {
            Engine::Sqlite => format!("value FROM json_each(${n})"),
            Engine::Postgres => format!("value::bigint FROM jsonb_array_elements_text(${n}::jsonb) AS e(value)"),
        }
    }

    /// [`Engine::json_ids`] for a JSON array of strings.
    pub fn json_texts(self, n: usize) -> String {
        match self {
            Engine::Sqlite => format!("value FROM json_each(${n})"),
            Engine::Postgres => format!("value FROM jsonb_array_elements_text(${n}::jsonb) AS e(value)"),
        }
    }

    /// `sqlite` on SQLite, `postgres` on PostgreSQL: the statement text where they differ.
    pub fn pick<T>(self, sqlite: T, postgres: T) -> T {
        match self {
            Engine::Sqlite => sqlite,
            Engine::Postgres => postgres,
        }
    }
}

/// A connection of either backend, borrowed for one call.
#[derive(Debug)]
pub enum Conn<'c> {
    Sqlite(&'c mut SqliteConnection),
    Postgres(&'c mut PgConnection),
}

impl Conn<'_> {
    /// The same connection for a nested call, this one usable again after it.
    pub fn reborrow(&mut self) -> Conn<'_> {
        match self {
            Conn::Sqlite(conn) => Conn::Sqlite(conn),
            Conn::Postgres(conn) => Conn::Postgres(conn),
        }
    }

    pub fn engine(&self) -> Engine {
        match self {
            Conn::Sqlite(_) => Engine::Sqlite,
            Conn::Postgres(_) => Engine::Postgres,
        }
    }
}

impl<'c> Conn<'c> {
    /// The SQLite connection, for tests that run statements of their own.
    pub fn into_sqlite(self) -> Option<&'c mut SqliteConnection> {
        match self {
            Conn::Sqlite(conn) => Some(conn),
            Conn::Postgres(_) => None,
        }
    }
}

impl<'c> From<&'c mut SqliteConnection> for Conn<'c> {
    fn from(conn: &'c mut SqliteConnection) -> Self {
        Conn::Sqlite(conn)
    }
}

impl<'c> From<&'c mut PgConnection> for Conn<'c> {
    fn from(conn: &'c mut PgConnection) -> Self {
        Conn::Postgres(conn)
    }
}

impl<'c, 'd: 'c> From<&'c mut Conn<'d>> for Conn<'c> {
    fn from(conn: &'c mut Conn<'d>) -> Self {
        conn.reborrow()
    }
}

/// A pool of either backend.
#[derive(Debug, Clone)]
pub enum Pool {
    Sqlite(Readers),
    Postgres(PgPool),
}

impl Pool {
    pub fn engine(&self) -> Engine {
        match self {
            Pool::Sqlite(_) => Engine::Sqlite,
            Pool::Postgres(_) => Engine::Postgres,
        }
    }

    /// One connection of the pool, for several reads in a row.
    pub async fn acquire(&self) -> super::sql::Result<PooledConn> {
        Ok(match self {
            Pool::Sqlite(pool) => PooledConn::Sqlite(pool.acquire().await?),
            Pool::Postgres(pool) => PooledConn::Postgres(pool.acquire().await.map_err(super::sql::Error::from)?),
        })
    }

    /// One trivial query: whether the database answers at all.
    pub async fn ping(&self) -> super::sql::Result<()> {
        match self {
            Pool::Sqlite(pool) => super::sql::query("SELECT 1").execute(pool).await.map(drop),
            Pool::Postgres(pool) => super::sql::query("SELECT 1").execute(pool).await.map(drop),
        }
    }

    pub async fn close(&self) {
        match self {
            Pool::Sqlite(pool) => pool.close(),
            Pool::Postgres(pool) => pool.close().await,
        }
    }

    /// The SQLite readers, for tests that run statements of their own.
    pub fn sqlite(&self) -> Option<&Readers> {
        match self {
            Pool::Sqlite(pool) => Some(pool),
            Pool::Postgres(_) => None,
        }
    }
}

/// A connection taken from a [`Pool`].
#[derive(Debug)]
pub enum PooledConn {
    Sqlite(ReaderConn),
    Postgres(sqlx::pool::PoolConnection<sqlx::Postgres>),
}

impl PooledConn {
    pub fn conn(&mut self) -> Conn<'_> {
        match self {
            PooledConn::Sqlite(conn) => Conn::Sqlite(conn.connection()),
            PooledConn::Postgres(conn) => Conn::Postgres(conn),
        }
    }
}

/// A pool of either backend, borrowed for one call.
#[derive(Debug, Clone, Copy)]
pub enum PoolRef<'p> {
    Sqlite(&'p Readers),
    Postgres(&'p PgPool),
}

impl PoolRef<'_> {
    pub fn engine(&self) -> Engine {
        match self {
            PoolRef::Sqlite(_) => Engine::Sqlite,
            PoolRef::Postgres(_) => Engine::Postgres,
        }
    }
}

impl<'p> From<&'p Readers> for PoolRef<'p> {
    fn from(pool: &'p Readers) -> Self {
        PoolRef::Sqlite(pool)
    }
}

impl<'p> From<&'p PgPool> for PoolRef<'p> {
    fn from(pool: &'p PgPool) -> Self {
        PoolRef::Postgres(pool)
    }
}

impl<'p> From<&'p Pool> for PoolRef<'p> {
    fn from(pool: &'p Pool) -> Self {
        match pool {
            Pool::Sqlite(pool) => PoolRef::Sqlite(pool),
            Pool::Postgres(pool) => PoolRef::Postgres(pool),
        }
    }
}

/// Runs `$body` with `$c` rebound to the backend's own connection (`&mut SqliteConnection` or
/// `&mut PgConnection`) of the [`Conn`] `$conn`, and `$engine` to its [`Engine`]; `$conn` stays
/// usable after it.
macro_rules! on_conn {
    ($conn:ident, |$c:ident, $engine:ident| $body:expr) => {
        match $conn.reborrow() {
            $crate::db::backend::Conn::Sqlite($c) => {
                #[allow(unused_variables)]
                let $engine = $crate::db::backend::Engine::Sqlite;
                $body
            }
            $crate::db::backend::Conn::Postgres($c) => {
                // Boxed, so that the caller's future holds a `dyn Future + Send`: proving a
                // PostgreSQL statement's future `Send` inside the writer's higher-ranked unit
                // closures trips rustc ("implementation of `Executor` is not general enough").
                let boxed: futures_util::future::BoxFuture<'_, _> = Box::pin(async move {
                    #[allow(unused_variables)]
                    let $engine = $crate::db::backend::Engine::Postgres;
                    $body
                });
                boxed.await
            }
        }
    };
}

/// [`on_conn!`] for a [`PoolRef`]: `$p` is the backend's own `&SqlitePool` or `&PgPool`.
macro_rules! on_pool {
    ($pool:ident, |$p:ident, $engine:ident| $body:expr) => {
        match $pool {
            $crate::db::backend::PoolRef::Sqlite($p) => {
                #[allow(unused_variables)]
                let $engine = $crate::db::backend::Engine::Sqlite;
                $body
            }
            $crate::db::backend::PoolRef::Postgres($p) => {
                // Boxed: see `on_conn!`.
                let boxed: futures_util::future::BoxFuture<'_, _> = Box::pin(async move {
                    #[allow(unused_variables)]
                    let $engine = $crate::db::backend::Engine::Postgres;
                    $body
                });
                boxed.await
            }
        }
    };
}

/// A connection or a pool of either backend, for a function that runs one statement on
/// whichever the caller holds.
#[derive(Debug)]
pub enum Exec<'a> {
    Conn(Conn<'a>),
    Pool(PoolRef<'a>),
}

impl<'a> From<Conn<'a>> for Exec<'a> {
    fn from(conn: Conn<'a>) -> Self {
        Exec::Conn(conn)
    }
}

impl<'a> From<&'a mut SqliteConnection> for Exec<'a> {
    fn from(conn: &'a mut SqliteConnection) -> Self {
        Exec::Conn(conn.into())
    }
}

impl<'a> From<&'a mut PgConnection> for Exec<'a> {
    fn from(conn: &'a mut PgConnection) -> Self {
        Exec::Conn(conn.into())
    }
}

impl<'a> From<&'a Pool> for Exec<'a> {
    fn from(pool: &'a Pool) -> Self {
        Exec::Pool(pool.into())
    }
}

/// [`on_conn!`] for an [`Exec`]: `$e` is the backend's own connection or pool, used once.
macro_rules! on_exec {
    ($exec:ident, |$e:ident, $engine:ident| $body:expr) => {
        match $exec {
            $crate::db::backend::Exec::Conn(mut conn) => $crate::db::backend::on_conn!(conn, |$e, $engine| $body),
            $crate::db::backend::Exec::Pool(pool) => $crate::db::backend::on_pool!(pool, |$e, $engine| $body),
        }
    };
}

pub(crate) use {on_conn, on_exec, on_pool};
