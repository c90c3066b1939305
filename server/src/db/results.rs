//! `staged_files` (uploads waiting for their seal) and `results` (sealed result versions).

use super::backend::{on_conn, on_exec, on_pool, Conn, DbRow, Exec, PoolRef};
use super::sql;
use shared::api::{JobAttempt, JobId, ManifestEntry, ResultVersion};
use std::collections::HashMap;

/// Forgets an uploaded path (before its file is replaced, so a crash in between leaves the
/// path unrecorded rather than recorded with the old hash).
pub async fn unstage(conn: impl Into<Conn<'_>>, job: JobId, attempt: u32, path: &str) -> sql::Result<()> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        sql::query("DELETE FROM staged_files WHERE job_id = $1 AND attempt = $2 AND path = $3")
            .bind(job.get())
            .bind(i64::from(attempt))
            .bind(path)
            .execute(&mut *conn)
            .await?;
        Ok(())
    })
}

pub async fn stage(conn: impl Into<Conn<'_>>, job: JobId, attempt: u32, entry: &ManifestEntry) -> sql::Result<()> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        sql::query(
            "INSERT INTO staged_files (job_id, attempt, path, size, sha256) VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (job_id, attempt, path) DO UPDATE SET size = excluded.size, sha256 = excluded.sha256",
        )
        .bind(job.get())
        .bind(i64::from(attempt))
        .bind(entry.path.as_str())
        .bind(entry.size as i64)
        .bind(entry.sha256.as_str())
        .execute(&mut *conn)
        .await?;
        Ok(())
    })
}

/// The uploaded files of an attempt, by path.
pub async fn staged(db: impl Into<Exec<'_>>, job: JobId, attempt: u32) -> sql::Result<HashMap<String, ManifestEntry>> {
    let db = db.into();
    on_exec!(db, |db, engine| {
        let rows = sql::query("SELECT path, size, sha256 FROM staged_files WHERE job_id = $1 AND attempt = $2")
            .bind(job.get())
            .bind(i64::from(attempt))
            .fetch_all(db)
            .await?;
        rows.iter()
            .map(|row| {
                let entry = ManifestEntry {
                    path: row.get_as("path")?,
                    size: row.get_as::<i64>("size")? as u64,
                    sha256: row.get_as("sha256")?,
                };
                Ok((entry.path.clone(), entry))
            })
            .collect()
    })
}

/// Bytes already staged for an attempt, leaving out `except` (a file being uploaded again
/// replaces its earlier upload).
pub async fn staged_bytes(pool: impl Into<PoolRef<'_>>, job: JobId, attempt: u32, except: &str) -> sql::Result<u64> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let total: i64 = sql::query_scalar(
            "SELECT CAST(coalesce(sum(size), 0) AS BIGINT) FROM staged_files WHERE job_id = $1 AND attempt = $2 AND path <> $3",
        )
        .bind(job.get())
        .bind(i64::from(attempt))
        .bind(except)
        .fetch_one(pool)
        .await?;
        Ok(total as u64)
    })
}

/// Forgets every upload of an attempt (sealed, or its staging removed).
pub async fn unstage_attempt(conn: impl Into<Conn<'_>>, job: JobId, attempt: u32) -> sql::Result<()> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        sql::query("DELETE FROM staged_files WHERE job_id = $1 AND attempt = $2")
            .bind(job.get())
            .bind(i64::from(attempt))
            .execute(&mut *conn)
            .await?;
        Ok(())
    })
}

/// The INSERT of a sealed version; it returns a row only if it inserted (an attempt keeps its
/// first version).
const INSERT_SQL: &str = "INSERT INTO results (job_id, attempt, path, manifest, record, params, metrics, stored_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (job_id, attempt) DO NOTHING RETURNING job_id";

/// A version's JSON columns, as stored.
pub(crate) struct VersionColumns {
    pub manifest: String,
    pub record: String,
    pub params: String,
    pub metrics: String,
}

impl VersionColumns {
    pub fn of(version: &ResultVersion) -> serde_json::Result<VersionColumns> {
        Ok(VersionColumns {
            manifest: serde_json::to_string(&version.files)?,
            record: serde_json::to_string(&version.record)?,
            params: serde_json::to_string(&version.params)?,
            metrics: serde_json::to_string(&version.metrics)?,
        })
    }
}

/// Records a sealed version, and what its attempt held (GPU time, or a job slot's time) as its
/// owner's (`usage`); false if the attempt already has one (nothing is counted again).
pub async fn insert(conn: impl Into<Conn<'_>>, version: &ResultVersion) -> anyhow::Result<bool> {
    insert_charging(conn, version, shared::fair_share::charge(&version.record)).await
}

/// Records a version as the finish+claim steps store one, without its charge: a step's record
/// holds no GPU time (`queue::finish::is_bare`), and the slot time its finish adds up in
/// memory (`queue::shares`) rather than in one more statement on the hot path.
pub async fn insert_uncharged(conn: impl Into<Conn<'_>>, version: &ResultVersion) -> anyhow::Result<bool> {
    insert_charging(conn, version, None).await
}

async fn insert_charging(
    conn: impl Into<Conn<'_>>,
    version: &ResultVersion,
    charge: Option<shared::fair_share::Charge>,
) -> anyhow::Result<bool> {
    let mut conn = conn.into();
    let columns = VersionColumns::of(version)?;
    on_conn!(conn, |conn, engine| {
        let inserted = sql::query(INSERT_SQL)
            .bind(version.job_id.get())
            .bind(version.attempt)
            .bind(version.path.as_str())
            .bind(columns.manifest.as_str())
            .bind(columns.record.as_str())
            .bind(columns.params.as_str())
            .bind(columns.metrics.as_str())
            .bind(version.stored_at)
            .fetch_optional(&mut *conn)
            .await?;
        if let (Some(_), Some(charge)) = (&inserted, charge) {
            super::usage::add(&mut *conn, version.job_id, version.stored_at, charge).await?;
        }
        Ok(inserted.is_some())
    })
}

fn version_of(row: &impl DbRow) -> anyhow::Result<ResultVersion> {
    let text = |column: &str| -> anyhow::Result<String> { Ok(row.get_as(column)?) };
    Ok(ResultVersion {
        job_id: JobId::new(row.get_as("job_id")?),
        attempt: row.u32_at("attempt")?,
        path: row.get_as("path")?,
        files: serde_json::from_str(&text("manifest")?)?,
        record: serde_json::from_str(&text("record")?)?,
        params: serde_json::from_str(&text("params")?)?,
        metrics: serde_json::from_str(&text("metrics")?)?,
        stored_at: row.get_as("stored_at")?,
    })
}

/// A job's versions, oldest first.
pub async fn list(pool: impl Into<PoolRef<'_>>, job: JobId) -> anyhow::Result<Vec<ResultVersion>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let rows = sql::query("SELECT * FROM results WHERE job_id = $1 ORDER BY attempt")
            .bind(job.get())
            .fetch_all(pool)
            .await?;
        rows.iter().map(version_of).collect()
    })
}

pub async fn get(pool: impl Into<PoolRef<'_>>, job: JobId, attempt: u32) -> anyhow::Result<Option<ResultVersion>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let row = sql::query("SELECT * FROM results WHERE job_id = $1 AND attempt = $2")
            .bind(job.get())
            .bind(i64::from(attempt))
            .fetch_optional(pool)
            .await?;
        row.as_ref().map(version_of).transpose()
    })
}

pub async fn exists(db: impl Into<Exec<'_>>, job: JobId, attempt: u32) -> sql::Result<bool> {
    let db = db.into();
    on_exec!(db, |db, engine| {
        let found: Option<i64> =
            sql::query_scalar("SELECT CAST(1 AS BIGINT) FROM results WHERE job_id = $1 AND attempt = $2")
                .bind(job.get())
                .bind(i64::from(attempt))
                .fetch_optional(db)
                .await?;
        Ok(found.is_some())
    })
}

/// Which of `attempts` are running now (their staging is still wanted).
pub async fn running(pool: impl Into<PoolRef<'_>>, attempts: &[JobAttempt]) -> anyhow::Result<Vec<JobAttempt>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        if attempts.is_empty() {
            return Ok(Vec::new());
        }
        let pairs =
            serde_json::to_string(&attempts.iter().map(|a| [a.job_id.get(), a.attempt as i64]).collect::<Vec<_>>())?;
        let rows = sql::query(engine.pick(
            "SELECT id, attempt FROM jobs WHERE status = 'running'
           AND (id, attempt) IN (SELECT value ->> 0, value ->> 1 FROM json_each($1))",
            "SELECT id, attempt FROM jobs WHERE status = 'running'
           AND (id, attempt) IN (SELECT (value ->> 0)::bigint, (value ->> 1)::bigint
                                 FROM jsonb_array_elements($1::jsonb) AS e(value))",
        ))
        .bind(pairs)
        .fetch_all(pool)
        .await?;
        rows.iter()
            .map(|row| Ok(JobAttempt { job_id: JobId::new(row.get_as("id")?), attempt: row.u32_at("attempt")? }))
            .collect()
    })
}
