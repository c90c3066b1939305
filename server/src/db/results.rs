//! `staged_files` (uploads waiting for their seal) and `results` (sealed result versions).

use super::backend::{dollars, on_conn, on_exec, on_pool, Conn, DbRow, Exec, PoolRef};
use shared::api::{JobAttempt, JobId, ManifestEntry, ResultVersion};
use sqlx::query::Query;
use std::collections::HashMap;

/// Forgets an uploaded path (before its file is replaced, so a crash in between leaves the
/// path unrecorded rather than recorded with the old hash).
pub async fn unstage(conn: impl Into<Conn<'_>>, job: JobId, attempt: u32, path: &str) -> sqlx::Result<()> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        sqlx::query("DELETE FROM staged_files WHERE job_id = $1 AND attempt = $2 AND path = $3")
            .bind(job.get())
            .bind(i64::from(attempt))
            .bind(path)
            .execute(&mut *conn)
            .await?;
        Ok(())
    })
}

pub async fn stage(conn: impl Into<Conn<'_>>, job: JobId, attempt: u32, entry: &ManifestEntry) -> sqlx::Result<()> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        sqlx::query(
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
pub async fn staged(db: impl Into<Exec<'_>>, job: JobId, attempt: u32) -> sqlx::Result<HashMap<String, ManifestEntry>> {
    let db = db.into();
    on_exec!(db, |db, engine| {
        let rows = sqlx::query("SELECT path, size, sha256 FROM staged_files WHERE job_id = $1 AND attempt = $2")
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
pub async fn staged_bytes(pool: impl Into<PoolRef<'_>>, job: JobId, attempt: u32, except: &str) -> sqlx::Result<u64> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let total: i64 = sqlx::query_scalar(
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
pub async fn unstage_attempt(conn: impl Into<Conn<'_>>, job: JobId, attempt: u32) -> sqlx::Result<()> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        sqlx::query("DELETE FROM staged_files WHERE job_id = $1 AND attempt = $2")
            .bind(job.get())
            .bind(i64::from(attempt))
            .execute(&mut *conn)
            .await?;
        Ok(())
    })
}

/// The INSERT of a sealed version with its parameters numbered from `?first`; it returns a
/// `stored` column only if it inserted (an attempt keeps its first version). With
/// `unless_metrics` it inserts nothing if the attempt has metric summaries (a version made
/// without them would miss them).
pub(crate) fn insert_sql(first: usize, unless_metrics: bool) -> String {
    let values: Vec<String> = (first..first + 8).map(|n| format!("?{n}")).collect();
    let source = match unless_metrics {
        false => format!("VALUES ({})", values.join(", ")),
        true => format!(
            "SELECT {} WHERE NOT EXISTS (SELECT 1 FROM job_metric_summaries m WHERE m.job_id = ?{first} AND m.attempt = ?{})",
            values.join(", "),
            first + 1
        ),
    };
    format!(
        "INSERT INTO results (job_id, attempt, path, manifest, record, params, metrics, stored_at)
         {source} ON CONFLICT (job_id, attempt) DO NOTHING RETURNING 1 AS stored"
    )
}

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

/// Binds `version` to the parameters of [`insert_sql`], in their order.
pub(crate) fn bind_version<'q, DB>(
    query: Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>>,
    version: &'q ResultVersion,
) -> anyhow::Result<Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>>>
where
    DB: sqlx::Database,
    i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    let columns = VersionColumns::of(version)?;
    Ok(query
        .bind(version.job_id.get())
        .bind(i64::from(version.attempt))
        .bind(version.path.as_str())
        .bind(columns.manifest)
        .bind(columns.record)
        .bind(columns.params)
        .bind(columns.metrics)
        .bind(version.stored_at))
}

/// Records a sealed version; false if the attempt already has one.
pub async fn insert(conn: impl Into<Conn<'_>>, version: &ResultVersion) -> anyhow::Result<bool> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        static SQL: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        let query = bind_version(sqlx::query(SQL.get_or_init(|| dollars(&insert_sql(1, false)))), version)?;
        Ok(query.fetch_optional(&mut *conn).await?.is_some())
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
        let rows = sqlx::query("SELECT * FROM results WHERE job_id = $1 ORDER BY attempt")
            .bind(job.get())
            .fetch_all(pool)
            .await?;
        rows.iter().map(version_of).collect()
    })
}

pub async fn get(pool: impl Into<PoolRef<'_>>, job: JobId, attempt: u32) -> anyhow::Result<Option<ResultVersion>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let row = sqlx::query("SELECT * FROM results WHERE job_id = $1 AND attempt = $2")
            .bind(job.get())
            .bind(i64::from(attempt))
            .fetch_optional(pool)
            .await?;
        row.as_ref().map(version_of).transpose()
    })
}

pub async fn exists(db: impl Into<Exec<'_>>, job: JobId, attempt: u32) -> sqlx::Result<bool> {
    let db = db.into();
    on_exec!(db, |db, engine| {
        let found: Option<i64> =
            sqlx::query_scalar("SELECT CAST(1 AS BIGINT) FROM results WHERE job_id = $1 AND attempt = $2")
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
        let rows = sqlx::query(engine.pick(
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
