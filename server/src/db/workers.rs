//! `workers`: registration (by name, told apart by key), sessions, liveness; and the
//! server's instance id.

use shared::api::{JobId, WorkerId, WorkerInfo, WorkerState};
use shared::placement::Capacity;
use sqlx::SqliteConnection;
use sqlx::{Row, SqlitePool};

/// What registration decides on about a worker already known by a name.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Registered {
    pub id: i64,
    pub key_hash: Option<String>,
    pub last_seen_at: i64,
}

pub async fn by_name(conn: &mut SqliteConnection, name: &str) -> sqlx::Result<Option<Registered>> {
    sqlx::query_as("SELECT id, key_hash, last_seen_at FROM workers WHERE name = ?")
        .bind(name)
        .fetch_optional(&mut *conn)
        .await
}

/// The first of `base`, `base-2`, `base-3`, ... that no worker uses.
pub async fn unique_name(conn: &mut SqliteConnection, base: &str) -> sqlx::Result<String> {
    for n in 2u32.. {
        let name = format!("{base}-{n}");
        if by_name(conn, &name).await?.is_none() {
            return Ok(name);
        }
    }
    unreachable!("some suffix is free")
}

/// A new worker.
pub async fn insert(
    conn: &mut SqliteConnection,
    name: &str,
    capacity: &Capacity,
    (key_hash, session_hash): (Option<&str>, &str),
    now: i64,
) -> anyhow::Result<WorkerId> {
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO workers (name, capacity, registered_at, last_seen_at, key_hash, session_hash)
         VALUES (?, ?, ?, ?, ?, ?) RETURNING id",
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
}

/// A worker registering again (restarted, or taking over the name of a lost one): new
/// capacity, key and session, same id.
pub async fn renew(
    conn: &mut SqliteConnection,
    id: WorkerId,
    capacity: &Capacity,
    (key_hash, session_hash): (Option<&str>, &str),
    now: i64,
) -> anyhow::Result<()> {
    sqlx::query(
        "UPDATE workers SET capacity = ?, registered_at = ?, last_seen_at = ?, key_hash = ?, session_hash = ?
         WHERE id = ?",
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
}

/// The SHA-256 (hex) of the worker's current session secret, if it is registered.
pub async fn session_hash(pool: &SqlitePool, id: WorkerId) -> sqlx::Result<Option<String>> {
    let hash: Option<Option<String>> =
        sqlx::query_scalar("SELECT session_hash FROM workers WHERE id = ?").bind(id.get()).fetch_optional(pool).await?;
    Ok(hash.flatten())
}

/// This database's instance id (made by the migration that created the table).
pub async fn instance(pool: &SqlitePool) -> sqlx::Result<String> {
    sqlx::query_scalar("SELECT id FROM server_instance LIMIT 1").fetch_one(pool).await
}

/// Marks the worker alive; false when no such worker is registered.
pub async fn touch(conn: &mut SqliteConnection, id: WorkerId, now: i64) -> sqlx::Result<bool> {
    let done = sqlx::query("UPDATE workers SET last_seen_at = ? WHERE id = ?")
        .bind(now)
        .bind(id.get())
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

pub async fn exists(pool: &SqlitePool, id: WorkerId) -> sqlx::Result<bool> {
    let found: Option<i64> =
        sqlx::query_scalar("SELECT 1 FROM workers WHERE id = ?").bind(id.get()).fetch_optional(pool).await?;
    Ok(found.is_some())
}

pub async fn id_by_name(pool: &SqlitePool, name: &str) -> sqlx::Result<Option<WorkerId>> {
    let id: Option<i64> =
        sqlx::query_scalar("SELECT id FROM workers WHERE name = ?").bind(name).fetch_optional(pool).await?;
    Ok(id.map(WorkerId::new))
}

/// Every worker with the ids of its running jobs and its state as of `now`.
pub async fn list(pool: &SqlitePool, now: i64, heartbeat_ms: u64, lease_ms: u64) -> anyhow::Result<Vec<WorkerInfo>> {
    let rows = sqlx::query(
        "SELECT w.*, (SELECT json_group_array(j.id) FROM jobs j INDEXED BY jobs_running_by_worker
                 WHERE j.worker_id = w.id AND j.status = 'running')
                AS running_jobs
         FROM workers w ORDER BY w.name",
    )
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|row| {
            let capacity: String = row.try_get("capacity")?;
            let running_jobs: Vec<JobId> = serde_json::from_str(row.try_get("running_jobs")?)?;
            let last_seen_at = row.try_get("last_seen_at")?;
            Ok(WorkerInfo {
                id: WorkerId::new(row.try_get("id")?),
                name: row.try_get("name")?,
                capacity: serde_json::from_str(&capacity)?,
                registered_at: row.try_get("registered_at")?,
                last_seen_at,
                running: running_jobs.len() as u64,
                state: WorkerState::of(last_seen_at, now, heartbeat_ms, lease_ms),
                running_jobs,
            })
        })
        .collect()
}
