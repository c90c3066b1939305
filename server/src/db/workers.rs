//! `workers`: registration (by name, told apart by key), sessions, liveness; and the
//! server's instance id.

use super::backend::{on_conn, on_pool, Conn, DbRow, PoolRef};
use super::sql;
use shared::api::{JobId, WorkerId, WorkerInfo, WorkerState};
use shared::placement::Capacity;

/// What registration decides on about a worker already known by a name.
#[derive(Debug, Clone)]
pub struct Registered {
    pub id: i64,
    pub key_hash: Option<String>,
    pub last_seen_at: i64,
}

impl sql::FromRow for Registered {
    fn from_row(row: &sql::Row) -> sql::Result<Self> {
        Ok(Registered {
            id: row.get_as("id")?,
            key_hash: row.get_as("key_hash")?,
            last_seen_at: row.get_as("last_seen_at")?,
        })
    }
}

pub async fn by_name(conn: impl Into<Conn<'_>>, name: &str) -> sql::Result<Option<Registered>> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        sql::query_as("SELECT id, key_hash, last_seen_at FROM workers WHERE name = $1")
            .bind(name)
            .fetch_optional(&mut *conn)
            .await
    })
}

/// The first of `base`, `base-2`, `base-3`, ... that no worker uses.
pub async fn unique_name(conn: impl Into<Conn<'_>>, base: &str) -> sql::Result<String> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        for n in 2u32.. {
            let name = format!("{base}-{n}");
            if by_name(&mut *conn, &name).await?.is_none() {
                return Ok(name);
            }
        }
        unreachable!("some suffix is free")
    })
}

/// A new worker.
pub async fn insert(
    conn: impl Into<Conn<'_>>,
    name: &str,
    capacity: &Capacity,
    (key_hash, session_hash): (Option<&str>, &str),
    now: i64,
) -> anyhow::Result<WorkerId> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let id: i64 = sql::query_scalar(
            "INSERT INTO workers (name, capacity, registered_at, last_seen_at, key_hash, session_hash)
         VALUES ($1, $2, $3, $4, $5, $6) RETURNING id",
        )
        .bind(name)
        .bind(serde_json::to_string(capacity)?)
        .bind(now)
        .bind(now)
        .bind(key_hash)
        .bind(session_hash)
        .fetch_one(&mut *conn)
        .await?;
        Ok(WorkerId::new(id))
    })
}

/// A worker registering again (restarted, or taking over the name of a lost one): new
/// capacity, key and session, same id.
pub async fn renew(
    conn: impl Into<Conn<'_>>,
    id: WorkerId,
    capacity: &Capacity,
    (key_hash, session_hash): (Option<&str>, &str),
    now: i64,
) -> anyhow::Result<()> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        sql::query(
            "UPDATE workers SET capacity = $1, registered_at = $2, last_seen_at = $3, key_hash = $4, session_hash = $5,
                left_at = NULL
         WHERE id = $6",
        )
        .bind(serde_json::to_string(capacity)?)
        .bind(now)
        .bind(now)
        .bind(key_hash)
        .bind(session_hash)
        .bind(id.get())
        .execute(&mut *conn)
        .await?;
        Ok(())
    })
}

/// The SHA-256 (hex) of the worker's current session secret, if it is registered.
pub async fn session_hash(pool: impl Into<PoolRef<'_>>, id: WorkerId) -> sql::Result<Option<String>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let hash: Option<Option<String>> = sql::query_scalar("SELECT session_hash FROM workers WHERE id = $1")
            .bind(id.get())
            .fetch_optional(pool)
            .await?;
        Ok(hash.flatten())
    })
}

/// This database's instance id (made by the migration that created the table).
pub async fn instance(pool: impl Into<PoolRef<'_>>) -> sql::Result<String> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| sql::query_scalar("SELECT id FROM server_instance LIMIT 1").fetch_one(pool).await)
}

/// Marks the worker alive (and not left); false when no such worker is registered.
pub async fn touch(conn: impl Into<Conn<'_>>, id: WorkerId, now: i64) -> sql::Result<bool> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let done = sql::query("UPDATE workers SET last_seen_at = $1, left_at = NULL WHERE id = $2")
            .bind(now)
            .bind(id.get())
            .execute(&mut *conn)
            .await?;
        Ok(done.rows_affected() == 1)
    })
}

pub async fn exists(pool: impl Into<PoolRef<'_>>, id: WorkerId) -> sql::Result<bool> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let found: Option<i64> = sql::query_scalar("SELECT CAST(1 AS BIGINT) FROM workers WHERE id = $1")
            .bind(id.get())
            .fetch_optional(pool)
            .await?;
        Ok(found.is_some())
    })
}

pub async fn id_by_name(pool: impl Into<PoolRef<'_>>, name: &str) -> sql::Result<Option<WorkerId>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let id: Option<i64> =
            sql::query_scalar("SELECT id FROM workers WHERE name = $1").bind(name).fetch_optional(pool).await?;
        Ok(id.map(WorkerId::new))
    })
}

/// The worker stopped cleanly (it said so): `left` until it registers or heartbeats again.
pub async fn leave(conn: impl Into<Conn<'_>>, id: WorkerId, now: i64) -> sql::Result<bool> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let done = sql::query("UPDATE workers SET left_at = $1, last_seen_at = $1 WHERE id = $2")
            .bind(now)
            .bind(id.get())
            .execute(&mut *conn)
            .await?;
        Ok(done.rows_affected() == 1)
    })
}

/// Every worker with the ids of its running jobs and its state as of `now`.
pub async fn list(
    pool: impl Into<PoolRef<'_>>,
    now: i64,
    heartbeat_ms: u64,
    lease_ms: u64,
) -> anyhow::Result<Vec<WorkerInfo>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let rows = sql::query(engine.pick(
            "SELECT w.*, (SELECT json_group_array(j.id) FROM jobs j INDEXED BY jobs_running_by_worker
                 WHERE j.worker_id = w.id AND j.status = 'running')
                AS running_jobs
         FROM workers w ORDER BY w.name",
            "SELECT w.*, (SELECT coalesce(json_agg(j.id), '[]')::text FROM jobs j
                 WHERE j.worker_id = w.id AND j.status = 'running')
                AS running_jobs
         FROM workers w ORDER BY w.name COLLATE \"C\"",
        ))
        .fetch_all(pool)
        .await?;
        rows.iter()
            .map(|row| {
                let capacity: String = row.get_as("capacity")?;
                let running_jobs: Vec<JobId> = serde_json::from_str(&row.get_as::<String>("running_jobs")?)?;
                let last_seen_at = row.get_as("last_seen_at")?;
                let left_at: Option<i64> = row.get_as("left_at")?;
                Ok(WorkerInfo {
                    id: WorkerId::new(row.get_as("id")?),
                    name: row.get_as("name")?,
                    capacity: serde_json::from_str(&capacity)?,
                    registered_at: row.get_as("registered_at")?,
                    last_seen_at,
                    running: running_jobs.len() as u64,
                    state: match left_at {
                        Some(_) => WorkerState::Left,
                        None => WorkerState::of(last_seen_at, now, heartbeat_ms, lease_ms),
                    },
                    running_jobs,
                })
            })
            .collect()
    })
}
