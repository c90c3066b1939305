//! What attempts used of their GPUs, as their workers measured it: read from the attempt's
//! record in `results` (the record is where the worker sends it, and what `result.json` holds).

use super::backend::{on_pool, PoolRef};
use super::sql;
use shared::api::{GpuPoint, GpuUsage, JobId};
use std::collections::HashMap;

/// The GPU use of each job's latest attempt that recorded one (jobs without are left out).
pub async fn usage_of(pool: impl Into<PoolRef<'_>>, ids: &[JobId]) -> anyhow::Result<HashMap<JobId, GpuUsage>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        if ids.is_empty() {
            return Ok(HashMap::new());
        }
        let rows: Vec<(i64, String)> = sql::query_as(engine.pick(
            "SELECT r.job_id, json_extract(r.record, '$.gpu_usage')
         FROM results r JOIN jobs j ON j.id = r.job_id AND j.attempt = r.attempt
         WHERE r.job_id IN (SELECT value FROM json_each($1))
           AND json_extract(r.record, '$.gpu_usage') IS NOT NULL",
            "SELECT r.job_id, nullif(r.record::jsonb -> 'gpu_usage', 'null')::text
         FROM results r JOIN jobs j ON j.id = r.job_id AND j.attempt = r.attempt
         WHERE r.job_id IN (SELECT value::bigint FROM jsonb_array_elements_text($1::jsonb) AS e(value))
           AND nullif(r.record::jsonb -> 'gpu_usage', 'null') IS NOT NULL",
        ))
        .bind(serde_json::to_string(ids)?)
        .fetch_all(pool)
        .await?;
        rows.into_iter().map(|(id, usage)| Ok((JobId::new(id), serde_json::from_str(&usage)?))).collect()
    })
}

/// One attempt's GPU use and timeline, if its record has them.
pub async fn attempt_usage(
    pool: impl Into<PoolRef<'_>>,
    job: JobId,
    attempt: u32,
) -> anyhow::Result<Option<(GpuUsage, Vec<GpuPoint>)>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let row: Option<(Option<String>, Option<String>)> = sql::query_as(engine.pick(
            "SELECT json_extract(record, '$.gpu_usage'), json_extract(record, '$.gpu_timeline')
         FROM results WHERE job_id = $1 AND attempt = $2",
            "SELECT nullif(record::jsonb -> 'gpu_usage', 'null')::text, nullif(record::jsonb -> 'gpu_timeline', 'null')::text
         FROM results WHERE job_id = $1 AND attempt = $2",
        ))
        .bind(job.get())
        .bind(i64::from(attempt))
        .fetch_optional(pool)
        .await?;
        let Some((Some(usage), timeline)) = row else { return Ok(None) };
        let timeline = timeline.as_deref().map(serde_json::from_str).transpose()?.unwrap_or_default();
        Ok(Some((serde_json::from_str(&usage)?, timeline)))
    })
}
