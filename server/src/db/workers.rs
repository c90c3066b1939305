//! `workers`: registration (an upsert by name) and liveness.

use shared::api::{JobId, WorkerId, WorkerInfo, WorkerState};
use shared::placement::Capacity;
use sqlx::SqliteConnection;
use sqlx::{Row, SqlitePool};

/// Registers `name`, or re-registers it (same id) after a restart or reconnect.
pub async fn upsert(
    conn: &mut SqliteConnection,
    name: &str,
    capacity: &Capacity,
    now: i64,
) -> anyhow::Result<WorkerId> {
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO workers (name, capacity, registered_at, last_seen_at) VALUES (?, ?, ?, ?)
         ON CONFLICT (name) DO UPDATE SET capacity = excluded.capacity,
             registered_at = excluded.registered_at, last_seen_at = excluded.last_seen_at
         RETURNING id",
    )
    .bind(name)
    .bind(serde_json::to_string(capacity)?)
    .bind(now)
    .bind(now)
    .fetch_one(&mut *conn)
    .await?;
    Ok(WorkerId::new(id))
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
