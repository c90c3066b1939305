//! The writer's connection: SQLite's own (rusqlite) or one of PostgreSQL's pool.

use super::*;

/// The writer's connection.
pub enum WriterConn {
    Sqlite(rusqlite::Connection),
    Postgres(PoolConnection<Postgres>),
}

impl WriterConn {
    pub(super) async fn acquire(pool: &WriterPool) -> crate::db::sql::Result<WriterConn> {
        Ok(match pool {
            WriterPool::Sqlite(path) => WriterConn::Sqlite(crate::db::sqlite::open_writer(path)?),
            WriterPool::Postgres(pool) => WriterConn::Postgres(pool.acquire().await?),
        })
    }

    pub(super) fn borrow(&mut self) -> Conn<'_> {
        match self {
            WriterConn::Sqlite(conn) => Conn::Sqlite(conn),
            WriterConn::Postgres(conn) => Conn::Postgres(conn),
        }
    }

    /// Runs one or more statements without arguments.
    pub(super) async fn execute(&mut self, statements: &'static str) -> crate::db::sql::Result<()> {
        match self {
            WriterConn::Sqlite(conn) => Ok(conn.execute_batch(statements)?),
            WriterConn::Postgres(conn) => {
                // One statement each (a prepared statement holds one); boxed: see
                // `db::backend::on_conn!`.
                let conn: &mut sqlx::PgConnection = conn;
                let boxed: BoxFuture<'_, sqlx::Result<()>> = Box::pin(async move {
                    for statement in statements.split(';') {
                        sqlx::query(statement.trim()).execute(&mut *conn).await?;
                    }
                    Ok(())
                });
                Ok(boxed.await?)
            }
        }
    }
}

/// Closes a connection for good: the database rolls back whatever transaction it still had
/// open.
pub(super) fn close(conn: WriterConn) {
    use sqlx::Connection;
    match conn {
        WriterConn::Sqlite(conn) => {
            if let Err((_, error)) = conn.close() {
                tracing::warn!(%error, "closing the writer's connection");
            }
        }
        WriterConn::Postgres(conn) => {
            let detached = conn.detach();
            tokio::spawn(async move {
                let _ = detached.close().await;
            });
        }
    }
}
