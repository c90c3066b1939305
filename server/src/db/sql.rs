//! One statement API over the two drivers: rusqlite for SQLite, sqlx for PostgreSQL.
//!
//! `query(sql).bind(a).bind(b).fetch_all(conn)` reads as sqlx's API, and runs on whichever the
//! caller holds ([`On`]): the writer's or a reader's SQLite connection, called synchronously
//! (no hop to another thread: the measured cost of sqlx's SQLite driver, decision 0069), or a
//! PostgreSQL connection or pool through sqlx. Arguments keep their type ([`Arg`]) so that
//! PostgreSQL, which types every parameter, gets what it expects; statements number their
//! parameters `$1, $2, ...`, which both engines read (SQLite as names, bound here by number).
//! Rows come back as [`Row`], read by column name or position with [`DbRow`].

use super::sqlite::{ReaderConn, Readers};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, PgPool};
use std::borrow::Cow;
use std::sync::Arc;

#[path = "sql_args.rs"]
mod args;
#[path = "sql_rows.rs"]
mod rows;
pub use args::{Arg, Encode, Kind};
pub use rows::{DbRow, Decodable, FromRow, Row, SqliteRow};

/// A database error of either driver, or of reading a row.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Postgres(#[from] sqlx::Error),
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    #[error("encoding an argument: {0}")]
    Encode(String),
    #[error("reading column {column}: {why}")]
    Decode { column: String, why: String },
    #[error("the statement returned no row")]
    RowNotFound,
    #[error("no connection to the database came free in time")]
    PoolTimedOut,
    #[error("the database was closed")]
    PoolClosed,
    #[error("parameter {0} of the statement has no argument")]
    Unbound(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Where a statement runs: a connection or a pool of either engine.
pub enum On<'e> {
    Sqlite(&'e mut rusqlite::Connection),
    Readers(&'e Readers),
    Postgres(&'e mut PgConnection),
    PgPool(&'e PgPool),
}

impl<'e> From<&'e mut rusqlite::Connection> for On<'e> {
    fn from(conn: &'e mut rusqlite::Connection) -> Self {
        On::Sqlite(conn)
    }
}

impl<'e> From<&'e mut ReaderConn> for On<'e> {
    fn from(conn: &'e mut ReaderConn) -> Self {
        On::Sqlite(conn.connection())
    }
}

impl<'e> From<&'e Readers> for On<'e> {
    fn from(readers: &'e Readers) -> Self {
        On::Readers(readers)
    }
}

impl<'e> From<&'e mut PgConnection> for On<'e> {
    fn from(conn: &'e mut PgConnection) -> Self {
        On::Postgres(conn)
    }
}

impl<'e> From<&'e PgPool> for On<'e> {
    fn from(pool: &'e PgPool) -> Self {
        On::PgPool(pool)
    }
}

/// What a statement that returns no rows did.
#[derive(Debug, Clone, Copy)]
pub struct Done {
    rows: u64,
}

impl Done {
    pub fn rows_affected(&self) -> u64 {
        self.rows
    }
}

/// A statement with its arguments.
#[derive(Debug, Clone)]
pub struct Query<'q> {
    sql: Cow<'q, str>,
    args: Vec<Arg<'q>>,
    /// Whether SQLite keeps the statement prepared for the next call with the same text (not
    /// for built ones, whose texts vary with their rows: they would push the others out).
    cached: bool,
}

/// A statement, to bind and run.
pub fn query(sql: &str) -> Query<'_> {
    Query { sql: Cow::Borrowed(sql), args: Vec::new(), cached: true }
}

/// A statement whose rows are one value each (the first column).
pub fn query_scalar<T: Decodable>(sql: &str) -> Scalar<'_, T> {
    Scalar { query: query(sql), row: std::marker::PhantomData }
}

/// A statement whose rows are read as `T` ([`FromRow`]: tuples by position).
pub fn query_as<T: FromRow>(sql: &str) -> As<'_, T> {
    As { query: query(sql), row: std::marker::PhantomData }
}

impl<'q> Query<'q> {
    /// The statement with its own copies of its text and arguments.
    fn into_owned(self) -> Query<'static> {
        let args = self.args.into_iter().map(Arg::into_owned).collect();
        Query { sql: Cow::Owned(self.sql.into_owned()), args, cached: self.cached }
    }

    pub fn bind(mut self, value: impl Encode<'q>) -> Self {
        self.args.push(value.encode());
        self
    }

    pub async fn execute<'e>(self, on: impl Into<On<'e>>) -> Result<Done> {
        match on.into() {
            On::Sqlite(conn) => sqlite_execute(conn, &self),
            On::Readers(readers) => on_reader(readers, self, sqlite_execute).await,
            On::Postgres(conn) => {
                let done = self.postgres().execute(conn).await?;
                Ok(Done { rows: done.rows_affected() })
            }
            On::PgPool(pool) => {
                let done = self.postgres().execute(pool).await?;
                Ok(Done { rows: done.rows_affected() })
            }
        }
    }

    pub async fn fetch_all<'e>(self, on: impl Into<On<'e>>) -> Result<Vec<Row>> {
        self.rows(on.into(), usize::MAX).await
    }

    pub async fn fetch_optional<'e>(self, on: impl Into<On<'e>>) -> Result<Option<Row>> {
        Ok(self.rows(on.into(), 1).await?.pop())
    }

    pub async fn fetch_one<'e>(self, on: impl Into<On<'e>>) -> Result<Row> {
        self.fetch_optional(on).await?.ok_or(Error::RowNotFound)
    }

    /// Up to `limit` rows (the rest are not read: a `fetch_optional` on SQLite stops at the
    /// first, as sqlx's does).
    async fn rows(self, on: On<'_>, limit: usize) -> Result<Vec<Row>> {
        match on {
            On::Sqlite(conn) => sqlite_rows(conn, &self, limit),
            On::Readers(readers) => on_reader(readers, self, move |conn, query| sqlite_rows(conn, query, limit)).await,
            On::Postgres(conn) => Ok(postgres_rows(self.postgres(), conn, limit).await?),
            On::PgPool(pool) => Ok(postgres_rows(self.postgres(), pool, limit).await?),
        }
    }

    /// The statement for sqlx's PostgreSQL driver, each argument bound with its own type.
    fn postgres(&self) -> sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments> {
        let mut query = sqlx::query(&self.sql);
        for arg in &self.args {
            query = match arg {
                Arg::Int(value) => query.bind(*value),
                Arg::Real(value) => query.bind(*value),
                Arg::Bool(value) => query.bind(*value),
                Arg::Text(text) => query.bind(text.as_ref()),
                Arg::Blob(bytes) => query.bind(bytes.as_ref()),
                Arg::Null(Kind::Int) => query.bind(None::<i64>),
                Arg::Null(Kind::Real) => query.bind(None::<f64>),
                Arg::Null(Kind::Bool) => query.bind(None::<bool>),
                Arg::Null(Kind::Text) => query.bind(None::<&str>),
                Arg::Null(Kind::Blob) => query.bind(None::<&[u8]>),
            };
        }
        query
    }
}

async fn postgres_rows<'q, 'e, E>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    on: E,
    limit: usize,
) -> sqlx::Result<Vec<Row>>
where
    E: sqlx::Executor<'e, Database = sqlx::Postgres>,
    'q: 'e,
{
    let rows = match limit {
        1 => query.fetch_optional(on).await?.into_iter().collect(),
        _ => query.fetch_all(on).await?,
    };
    Ok(rows.into_iter().map(Row::Postgres).collect())
}

/// Runs a statement on a reader from the pool, on the runtime's blocking threads: a read may
/// scan a 100k-job sweep, and a runtime thread it held would stall every request queued on it
/// (on a 2-core head, half of them), as sqlx's SQLite driver never did (each of its connections
/// had a thread).
async fn on_reader<T, F>(readers: &Readers, query: Query<'_>, work: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce(&rusqlite::Connection, &Query<'static>) -> Result<T> + Send + 'static,
{
    let mut reader = readers.acquire().await?;
    let query = query.into_owned();
    match tokio::task::spawn_blocking(move || work(reader.connection(), &query)).await {
        Ok(result) => result,
        Err(failed) if failed.is_panic() => std::panic::resume_unwind(failed.into_panic()),
        Err(_) => Err(Error::PoolClosed),
    }
}

/// Binds `query`'s arguments to `statement` by number: SQLite reads `$N` as a name, and gives
/// names their places in the order they first appear.
fn bind_numbered(statement: &mut rusqlite::Statement<'_>, query: &Query<'_>) -> Result<()> {
    for index in 1..=statement.parameter_count() {
        let name = statement.parameter_name(index).unwrap_or("?");
        let number = name.strip_prefix(['$', '?']).and_then(|number| number.parse::<usize>().ok());
        let arg = match number {
            Some(number) if number >= 1 => query.args.get(number - 1),
            // A bare `?` takes the argument in its place.
            None if name == "?" => query.args.get(index - 1),
            _ => None,
        };
        let arg = arg.ok_or_else(|| Error::Unbound(name.to_string()))?;
        statement.raw_bind_parameter(index, arg)?;
    }
    Ok(())
}

/// Runs `work` on `query`'s statement, prepared (or taken from the cache) with its arguments
/// bound.
fn with_statement<T>(
    conn: &rusqlite::Connection,
    query: &Query<'_>,
    work: impl FnOnce(&mut rusqlite::Statement<'_>) -> Result<T>,
) -> Result<T> {
    if query.cached {
        let mut statement = conn.prepare_cached(&query.sql)?;
        bind_numbered(&mut statement, query)?;
        work(&mut statement)
    } else {
        let mut statement = conn.prepare(&query.sql)?;
        bind_numbered(&mut statement, query)?;
        work(&mut statement)
    }
}

fn sqlite_execute(conn: &rusqlite::Connection, query: &Query<'_>) -> Result<Done> {
    let readonly = with_statement(conn, query, |statement| {
        // Stepped to the end, so that a statement that also returns rows (`RETURNING`, a
        // `PRAGMA`) runs whole, as sqlx's `execute` runs it.
        let readonly = statement.readonly();
        let mut rows = statement.raw_query();
        while rows.next()?.is_some() {}
        Ok(readonly)
    })?;
    Ok(Done { rows: if readonly { 0 } else { conn.changes() } })
}

fn sqlite_rows(conn: &rusqlite::Connection, query: &Query<'_>, limit: usize) -> Result<Vec<Row>> {
    with_statement(conn, query, |statement| {
        let count = statement.column_count();
        let columns: Arc<[String]> = statement.column_names().into_iter().map(str::to_owned).collect();
        let mut rows = statement.raw_query();
        let mut out = Vec::new();
        while out.len() < limit {
            let Some(row) = rows.next()? else { break };
            let mut values = Vec::with_capacity(count);
            for index in 0..count {
                values.push(row.get::<_, rusqlite::types::Value>(index)?);
            }
            out.push(Row::Sqlite(SqliteRow { columns: columns.clone(), values }));
        }
        Ok(out)
    })
}

/// A statement whose rows are one value each.
pub struct Scalar<'q, T> {
    query: Query<'q>,
    row: std::marker::PhantomData<fn() -> T>,
}

impl<'q, T: Decodable> Scalar<'q, T> {
    pub fn bind(mut self, value: impl Encode<'q>) -> Self {
        self.query = self.query.bind(value);
        self
    }

    pub async fn fetch_one<'e>(self, on: impl Into<On<'e>>) -> Result<T> {
        self.query.fetch_one(on).await?.get_at(0)
    }

    pub async fn fetch_optional<'e>(self, on: impl Into<On<'e>>) -> Result<Option<T>> {
        self.query.fetch_optional(on).await?.map(|row| row.get_at(0)).transpose()
    }

    pub async fn fetch_all<'e>(self, on: impl Into<On<'e>>) -> Result<Vec<T>> {
        self.query.fetch_all(on).await?.iter().map(|row| row.get_at(0)).collect()
    }
}

/// A statement whose rows are read as `T`.
pub struct As<'q, T> {
    query: Query<'q>,
    row: std::marker::PhantomData<fn() -> T>,
}

impl<'q, T: FromRow> As<'q, T> {
    pub fn bind(mut self, value: impl Encode<'q>) -> Self {
        self.query = self.query.bind(value);
        self
    }

    pub async fn fetch_one<'e>(self, on: impl Into<On<'e>>) -> Result<T> {
        T::from_row(&self.query.fetch_one(on).await?)
    }

    pub async fn fetch_optional<'e>(self, on: impl Into<On<'e>>) -> Result<Option<T>> {
        self.query.fetch_optional(on).await?.as_ref().map(T::from_row).transpose()
    }

    pub async fn fetch_all<'e>(self, on: impl Into<On<'e>>) -> Result<Vec<T>> {
        self.query.fetch_all(on).await?.iter().map(T::from_row).collect()
    }
}

/// A statement put together piece by piece: text, and arguments numbered as they are pushed.
pub struct Builder<'q> {
    sql: String,
    args: Vec<Arg<'q>>,
}

impl<'q> Builder<'q> {
    pub fn new(sql: impl Into<String>) -> Self {
        Builder { sql: sql.into(), args: Vec::new() }
    }

    pub fn push(&mut self, sql: impl std::fmt::Display) -> &mut Self {
        use std::fmt::Write;
        let _ = write!(self.sql, "{sql}");
        self
    }

    /// Appends the next parameter (`$N`) and its argument.
    pub fn push_bind(&mut self, value: impl Encode<'q>) -> &mut Self {
        self.args.push(value.encode());
        let number = self.args.len();
        self.push(format_args!("${number}"))
    }

    pub fn build(self) -> Query<'q> {
        Query { sql: Cow::Owned(self.sql), args: self.args, cached: false }
    }

    pub fn build_scalar<T: Decodable>(self) -> Scalar<'q, T> {
        Scalar { query: self.build(), row: std::marker::PhantomData }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memory() -> rusqlite::Connection {
        rusqlite::Connection::open_in_memory().unwrap()
    }

    #[tokio::test]
    async fn parameters_are_bound_by_number_wherever_they_first_appear() {
        let mut conn = memory();
        let row: (String, i64, Option<i64>) = query_as("SELECT $2 || $2, $1 + 1, $3")
            .bind(41)
            .bind("ab")
            .bind(None::<i64>)
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(row, ("abab".to_string(), 42, None));
        let unbound = query("SELECT $1, $2").bind(1).fetch_one(&mut conn).await.unwrap_err();
        assert!(matches!(unbound, Error::Unbound(ref name) if name == "$2"), "{unbound:?}");
    }

    #[tokio::test]
    async fn rows_are_read_by_name_and_a_wrong_type_says_which_column() {
        let mut conn = memory();
        query("CREATE TABLE t (a INTEGER, b TEXT, c REAL, d BLOB)").execute(&mut conn).await.unwrap();
        let done = query("INSERT INTO t VALUES ($1, $2, $3, $4), ($1, NULL, 1, NULL)")
            .bind(7)
            .bind(String::from("x"))
            .bind(0.5)
            .bind(vec![1u8, 2])
            .execute(&mut conn)
            .await
            .unwrap();
        assert_eq!(done.rows_affected(), 2);
        let rows = query("SELECT * FROM t ORDER BY c").fetch_all(&mut conn).await.unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].get_as::<i64>("a").unwrap(), 7);
        assert_eq!(rows[0].get_as::<Option<String>>("b").unwrap().as_deref(), Some("x"));
        assert_eq!(rows[0].get_as::<Vec<u8>>("d").unwrap(), [1, 2]);
        assert_eq!(rows[1].get_as::<f64>("c").unwrap(), 1.0);
        assert!(rows[1].flag_at("a").unwrap());
        let wrong = rows[0].get_as::<i64>("b").unwrap_err().to_string();
        assert!(wrong.contains("column b"), "{wrong}");
        assert!(rows[0].get_as::<i64>("nothing").is_err());
        let none: Option<i64> = query_scalar("SELECT a FROM t WHERE a > 100").fetch_optional(&mut conn).await.unwrap();
        assert_eq!(none, None);
        assert!(matches!(query("SELECT 1 WHERE 0").fetch_one(&mut conn).await, Err(Error::RowNotFound)));
    }

    #[tokio::test]
    async fn a_built_statement_numbers_its_arguments_as_they_are_pushed() {
        let mut conn = memory();
        let mut built = Builder::new("SELECT 1");
        built.push(" + ").push_bind(2).push(" + ").push_bind(3u32);
        let sum: i64 = built.build_scalar().fetch_one(&mut conn).await.unwrap();
        assert_eq!(sum, 6);
    }
}
