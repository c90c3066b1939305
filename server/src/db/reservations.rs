//! Reservations for jobs of several GPUs (issue 29, item 4; migration 0016): the rows the
//! scheduler's pass keeps, what it reads to choose a worker, and what a claim reads of a held
//! worker's job and of the jobs that may backfill its GPUs. The decisions are
//! `shared::backfill`'s.

use super::backend::{on_conn, on_pool, Conn, PoolRef};
use super::claims::{Candidate, CLAIMABLE, CLASS_OF_JOB, DISPATCH_ORDER};
use super::sql::{self, DbRow};
use shared::api::{JobId, Reserved, SweepId, WorkerId};

/// A worker held for a queued job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    pub job: JobId,
    pub worker: WorkerId,
    pub gpus: u32,
    /// When the job could start there, by the running jobs' timeouts; `None`: unknown.
    pub starts_at: Option<i64>,
}

/// Every reservation.
pub async fn all(pool: impl Into<PoolRef<'_>>) -> sql::Result<Vec<Reservation>> {
    let pool = pool.into();
    let rows: Vec<(i64, i64, i64, Option<i64>)> = on_pool!(pool, |pool, engine| {
        sql::query_as("SELECT job_id, worker_id, gpus, starts_at FROM reservations ORDER BY job_id")
            .fetch_all(pool)
            .await
    })?;
    Ok(rows
        .into_iter()
        .map(|(job, worker, gpus, starts_at)| Reservation {
            job: JobId::new(job),
            worker: WorkerId::new(worker),
            gpus: gpus.clamp(0, i64::from(u32::MAX)) as u32,
            starts_at,
        })
        .collect())
}

/// Claimable jobs of more than one GPU queued since `before` (Unix ms) or earlier, in dispatch
/// order, `limit` at most, and with `class` only those of that priority class: those a
/// reservation may be made for.
pub async fn waited_long(
    pool: impl Into<PoolRef<'_>>,
    before: i64,
    limit: u32,
    class: Option<i64>,
) -> anyhow::Result<Vec<Candidate>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let hint = engine.pick(" INDEXED BY jobs_queue", "");
        let of_class = match class {
            Some(_) => "AND (SELECT class_value FROM sweeps s WHERE s.id = jobs.sweep_id) = $3",
            None => "AND $3 IS NULL",
        };
        let rows = sql::query(&format!(
            "SELECT id, gpus, gpu_memory, exclusive, needs_trainer, timeout_secs, {CLASS_OF_JOB} FROM jobs{hint}
             WHERE {CLAIMABLE} AND gpus > 1 AND created_at <= $1 {of_class} ORDER BY {DISPATCH_ORDER} LIMIT $2"
        ))
        .bind(before)
        .bind(limit)
        .bind(class)
        .fetch_all(pool)
        .await?;
        rows.iter().map(Candidate::from_row).collect()
    })
}

/// The highest priority class value of the sweeps with claimable jobs; `None` when none wait.
pub async fn highest_waiting_class(pool: impl Into<PoolRef<'_>>) -> sql::Result<Option<i64>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        sql::query_scalar(
            "SELECT MAX(s.class_value) FROM sweeps s
             WHERE EXISTS (SELECT 1 FROM jobs j WHERE j.sweep_id = s.id AND j.status = 'queued' AND j.held = 0)",
        )
        .fetch_one(pool)
        .await
    })
}

/// Makes the reservations `wanted` the only ones, changing only the rows that differ.
pub async fn replace(conn: impl Into<Conn<'_>>, wanted: &[Reservation], now: i64) -> sql::Result<()> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let current: Vec<(i64, i64, i64, Option<i64>)> =
            sql::query_as("SELECT job_id, worker_id, gpus, starts_at FROM reservations").fetch_all(&mut *conn).await?;
        let key = |r: &Reservation| (r.job.get(), r.worker.get(), i64::from(r.gpus), r.starts_at);
        let wanted_keys: Vec<_> = wanted.iter().map(key).collect();
        for row in current.iter().filter(|row| !wanted_keys.contains(row)) {
            sql::query("DELETE FROM reservations WHERE job_id = $1").bind(row.0).execute(&mut *conn).await?;
        }
        for reservation in wanted.iter().filter(|r| !current.contains(&key(r))) {
            // A worker held for another job before is taken over (one reservation per worker).
            sql::query("DELETE FROM reservations WHERE worker_id = $1 OR job_id = $2")
                .bind(reservation.worker.get())
                .bind(reservation.job.get())
                .execute(&mut *conn)
                .await?;
            sql::query(
                "INSERT INTO reservations (job_id, worker_id, gpus, starts_at, made_at) VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(reservation.job.get())
            .bind(reservation.worker.get())
            .bind(i64::from(reservation.gpus))
            .bind(reservation.starts_at)
            .bind(now)
            .execute(&mut *conn)
            .await?;
        }
        Ok(())
    })
}

/// `job` as a claim may take it, with its owner, if it is still claimable.
pub async fn claimable(conn: impl Into<Conn<'_>>, job: JobId) -> anyhow::Result<Option<(Candidate, String)>> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let row = sql::query(&format!(
            "SELECT id, gpus, gpu_memory, exclusive, needs_trainer, timeout_secs, owner, {CLASS_OF_JOB} FROM jobs
             WHERE id = $1 AND {CLAIMABLE}"
        ))
        .bind(job.get())
        .fetch_optional(&mut *conn)
        .await?;
        match row {
            Some(row) => Ok(Some((Candidate::from_row(&row)?, row.get_as("owner")?))),
            None => Ok(None),
        }
    })
}

/// Claimable jobs that end within `within_secs` by their timeout, with their owners, in
/// dispatch order, `limit` at most: those that may backfill a held worker's GPUs.
pub async fn backfill_candidates(
    conn: impl Into<Conn<'_>>,
    within_secs: i64,
    limit: u32,
) -> anyhow::Result<Vec<(Candidate, String)>> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let hint = engine.pick(" INDEXED BY jobs_queue", "");
        let rows = sql::query(&format!(
            "SELECT id, gpus, gpu_memory, exclusive, needs_trainer, timeout_secs, owner, {CLASS_OF_JOB} FROM jobs{hint}
             WHERE {CLAIMABLE} AND timeout_secs IS NOT NULL AND timeout_secs <= $1
             ORDER BY {DISPATCH_ORDER} LIMIT $2"
        ))
        .bind(within_secs)
        .bind(limit)
        .fetch_all(&mut *conn)
        .await?;
        rows.iter().map(|row| Ok((Candidate::from_row(row)?, row.get_as("owner")?))).collect()
    })
}

/// The reservations of queued jobs, by their sweep, with the held worker's name.
pub async fn of_sweeps(pool: impl Into<PoolRef<'_>>) -> sql::Result<Vec<(SweepId, Reserved)>> {
    let pool = pool.into();
    let rows: Vec<(i64, i64, String, Option<i64>)> = on_pool!(pool, |pool, engine| {
        sql::query_as(
            "SELECT j.sweep_id, r.job_id, w.name, r.starts_at FROM reservations r
             JOIN jobs j ON j.id = r.job_id JOIN workers w ON w.id = r.worker_id
             WHERE j.status = 'queued' ORDER BY r.job_id",
        )
        .fetch_all(pool)
        .await
    })?;
    Ok(rows
        .into_iter()
        .map(|(sweep, job, worker, starts_at)| {
            (SweepId::new(sweep), Reserved { job: JobId::new(job), worker, starts_at })
        })
        .collect())
}
