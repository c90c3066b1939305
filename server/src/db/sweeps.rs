//! `sweeps` (a sweep's jobs are `sweep_jobs`).

use super::backend::{on_conn, on_pool, Conn, DbRow, PoolRef};
use super::sql;
use shared::api::{JobId, Paused, StatusCounts, SweepDetail, SweepId, SweepInfo};
use shared::job::JobStatus;
use shared::sweep::{Goal, Metric, Sweep, SweepForm};

/// Returns `base`, or `base-2`, `base-3`, ... whichever is free (shortening `base` so the
/// name stays within the 100 characters names may have). The suffix goes on the last part of
/// a `project/sweep` name (`myproj/sweep-2`); a cut just after its `/` drops the `/`.
pub async fn unique_name(conn: impl Into<Conn<'_>>, base: &str) -> sql::Result<String> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let base = if base.len() > 90 { base[..90].trim_end_matches('/') } else { base };
        let taken: Vec<String> = sql::query_scalar("SELECT name FROM sweeps WHERE name = $1 OR name LIKE $2 || '-%'")
            .bind(base)
            .bind(base)
            .fetch_all(&mut *conn)
            .await?;
        if !taken.iter().any(|name| name == base) {
            return Ok(base.to_string());
        }
        let name = (2u64..)
            .map(|suffix| format!("{base}-{suffix}"))
            .find(|candidate| !taken.contains(candidate))
            .unwrap_or_else(|| base.to_string());
        Ok(name)
    })
}

/// Inserts the sweep's row, owned by `owner` (for good: nothing changes a sweep's owner), in
/// the priority class it names, of value `class`.
pub async fn insert(
    conn: impl Into<Conn<'_>>,
    (name, owner, class): (&str, &str, i64),
    sweep: &Sweep,
    source: &str,
    now: i64,
) -> sql::Result<SweepId> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        sql::query_scalar::<i64>(
            "INSERT INTO sweeps (name, form, source, metric_name, metric_goal, job_count, created_at,
                             max_initial_failures, max_consecutive_failures, owner, preemptible, priority_class,
                             class_value)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) RETURNING id",
        )
        .bind(name)
        .bind(form_text(sweep.form))
        .bind(source)
        .bind(sweep.metric.as_ref().map(|metric| metric.name.as_str()))
        .bind(sweep.metric.as_ref().map(|metric| goal_text(metric.goal)))
        .bind(sweep.count() as i64)
        .bind(now)
        .bind(i64::from(sweep.fail_fast.initial))
        .bind(i64::from(sweep.fail_fast.consecutive))
        .bind(owner)
        .bind(sweep.preemptible.map(i64::from))
        .bind(sweep.priority_class.as_deref())
        .bind(class)
        .fetch_one(&mut *conn)
        .await
        .map(SweepId::new)
    })
}

/// Adds `jobs` new queued jobs of `sweep_id` to `sweep_counts` (see migrations/0004): every
/// function that inserts jobs calls it in the same transaction.
pub async fn count_new_jobs(conn: impl Into<Conn<'_>>, sweep_id: SweepId, jobs: u64) -> sql::Result<()> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        sql::query(
            "INSERT INTO sweep_counts (sweep_id, status, jobs) VALUES ($1, 'queued', $2)
         ON CONFLICT (sweep_id, status) DO UPDATE SET jobs = sweep_counts.jobs + excluded.jobs",
        )
        .bind(sweep_id.get())
        .bind(jobs as i64)
        .execute(&mut *conn)
        .await?;
        Ok(())
    })
}

/// The sweep's name and form.
pub async fn name_and_form_of(conn: impl Into<Conn<'_>>, id: SweepId) -> sql::Result<(String, SweepForm)> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let (name, form): (String, String) =
            sql::query_as("SELECT name, form FROM sweeps WHERE id = $1").bind(id.get()).fetch_one(&mut *conn).await?;
        Ok((name, parse_form(&form)))
    })
}

/// Moves `owner`'s sweep `id` to a priority class: its name (none: the default) and value.
/// False when no such sweep is `owner`'s (removed meanwhile).
pub async fn set_class(
    conn: impl Into<Conn<'_>>,
    (id, owner): (SweepId, &str),
    name: Option<&str>,
    value: i64,
) -> sql::Result<bool> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        let done = sql::query("UPDATE sweeps SET priority_class = $1, class_value = $2 WHERE id = $3 AND owner = $4")
            .bind(name)
            .bind(value)
            .bind(id.get())
            .bind(owner)
            .execute(&mut *conn)
            .await?;
        Ok(done.rows_affected() == 1)
    })
}

/// The sweep's name and owner.
pub async fn name_and_owner_of(conn: impl Into<Conn<'_>>, id: SweepId) -> sql::Result<(String, String)> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        sql::query_as("SELECT name, owner FROM sweeps WHERE id = $1").bind(id.get()).fetch_one(&mut *conn).await
    })
}

/// The first of `ids` (in id order) whose sweep is not `owner`'s: the job, its sweep's name and
/// its sweep's owner. Ids of no job are left to the caller.
pub async fn first_job_not_owned(
    conn: impl Into<Conn<'_>>,
    ids: &[JobId],
    owner: &str,
) -> anyhow::Result<Option<(JobId, String, String)>> {
    let mut conn = conn.into();
    let ids = serde_json::to_string(ids)?;
    on_conn!(conn, |conn, engine| {
        let row: Option<(i64, String, String)> = sql::query_as(engine.pick(
            "SELECT j.id, s.name, s.owner FROM jobs j JOIN sweeps s ON s.id = j.sweep_id
             WHERE j.id IN (SELECT value FROM json_each($1)) AND s.owner <> $2 ORDER BY j.id LIMIT 1",
            "SELECT j.id, s.name, s.owner FROM jobs j JOIN sweeps s ON s.id = j.sweep_id
             WHERE j.id IN (SELECT value::bigint FROM jsonb_array_elements_text($1::jsonb) AS e(value))
               AND s.owner <> $2 ORDER BY j.id LIMIT 1",
        ))
        .bind(ids.as_str())
        .bind(owner)
        .fetch_optional(&mut *conn)
        .await?;
        Ok(row.map(|(id, name, owner)| (JobId::new(id), name, owner)))
    })
}

pub async fn name_of(conn: impl Into<Conn<'_>>, id: SweepId) -> sql::Result<String> {
    let mut conn = conn.into();
    on_conn!(conn, |conn, engine| {
        sql::query_scalar("SELECT name FROM sweeps WHERE id = $1").bind(id.get()).fetch_one(&mut *conn).await
    })
}

fn form_text(form: SweepForm) -> &'static str {
    match form {
        SweepForm::Native => "native",
        SweepForm::Wandb => "wandb",
        SweepForm::Cvlab => "cvlab",
    }
}

fn parse_form(text: &str) -> SweepForm {
    match text {
        "wandb" => SweepForm::Wandb,
        "cvlab" => SweepForm::Cvlab,
        _ => SweepForm::Native,
    }
}

fn goal_text(goal: Goal) -> &'static str {
    match goal {
        Goal::Minimize => "minimize",
        Goal::Maximize => "maximize",
    }
}

fn info_from_row(row: &impl DbRow) -> sql::Result<SweepInfo> {
    let metric_name: Option<String> = row.get_as("metric_name")?;
    let metric_goal: Option<String> = row.get_as("metric_goal")?;
    let form: String = row.get_as("form")?;
    Ok(SweepInfo {
        id: SweepId::new(row.get_as("id")?),
        name: row.get_as("name")?,
        owner: row.get_as("owner")?,
        form: parse_form(&form),
        metric: metric_name.map(|name| Metric {
            name,
            goal: if metric_goal.as_deref() == Some("maximize") { Goal::Maximize } else { Goal::Minimize },
        }),
        created_at: row.get_as("created_at")?,
        counts: StatusCounts::default(),
        paused: match row.get_as::<Option<i64>>("paused_at")? {
            Some(at) => Some(Paused { at, reason: row.get_as::<Option<String>>("paused_reason")?.unwrap_or_default() }),
            None => None,
        },
        held_back: None,
        preempted: 0,
        reserved: None,
        priority_class: row.get_as("priority_class")?,
    })
}

/// A sweep by id (all digits) or by name.
pub async fn find(pool: impl Into<PoolRef<'_>>, key: &str) -> anyhow::Result<Option<SweepDetail>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let row = match key.parse::<i64>() {
            Ok(id) => {
                sql::query("SELECT * FROM sweeps WHERE id = $1 OR name = $2 ORDER BY id = $3 DESC LIMIT 1")
                    .bind(id)
                    .bind(key)
                    .bind(id)
                    .fetch_optional(pool)
                    .await?
            }
            Err(_) => sql::query("SELECT * FROM sweeps WHERE name = $1").bind(key).fetch_optional(pool).await?,
        };
        let Some(row) = row else { return Ok(None) };
        let mut info = info_from_row(&row)?;
        info.counts = counts(pool, Some(info.id)).await?;
        info.preempted = sql::query_scalar::<i64>(
            "SELECT count(*) FROM preemptions p JOIN jobs j ON j.id = p.job_id WHERE j.sweep_id = $1",
        )
        .bind(info.id.get())
        .fetch_one(pool)
        .await?
        .max(0) as u64;
        info.reserved =
            super::reservations::of_sweeps(pool).await?.into_iter().find(|(id, _)| *id == info.id).map(|(_, r)| r);
        let search = super::search::state(pool, info.id).await?;
        Ok(Some(SweepDetail { info, source: row.get_as("source")?, search, unplaceable: None, metric_missing: None }))
    })
}

/// The jobs of each sweep by status, as a relation `(sweep_id, status, jobs)`: on SQLite the
/// count rows; on PostgreSQL the count rows plus the moves not folded into them yet
/// (migrations-postgres/0008).
pub fn counted(engine: super::backend::Engine) -> &'static str {
    engine.pick(
        "sweep_counts",
        "(SELECT sweep_id, status, CAST(sum(jobs) AS BIGINT) AS jobs FROM (
              SELECT sweep_id, status, jobs FROM sweep_counts
              UNION ALL SELECT sweep_id, status, jobs FROM sweep_count_moves) AS moved
          GROUP BY sweep_id, status)",
    )
}

/// Folds PostgreSQL's count moves into the count rows, in one transaction (readers see the
/// same sums before and after); returns the moves folded. Replicas may fold at once: a move
/// one of them deletes is skipped by the other.
pub async fn fold_count_moves(pool: &sqlx::PgPool) -> sql::Result<u64> {
    let folded = sql::query(
        "WITH moved AS (DELETE FROM sweep_count_moves RETURNING sweep_id, status, jobs),
              summed AS (SELECT sweep_id, status, sum(jobs) AS jobs, count(*) AS moves FROM moved
                         GROUP BY sweep_id, status),
              upserted AS (
                  INSERT INTO sweep_counts AS c (sweep_id, status, jobs)
                  SELECT sweep_id, status, jobs FROM summed ORDER BY sweep_id, status
                  ON CONFLICT (sweep_id, status) DO UPDATE SET jobs = c.jobs + excluded.jobs)
         SELECT CAST(coalesce(sum(moves), 0) AS BIGINT) FROM summed",
    )
    .fetch_one(pool)
    .await?;
    Ok(folded.get_at::<i64>(0)? as u64)
}

/// Newest first; only `owner`'s when given.
pub async fn list(pool: impl Into<PoolRef<'_>>, owner: Option<&str>) -> anyhow::Result<Vec<SweepInfo>> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let rows = match owner {
            Some(owner) => {
                sql::query("SELECT * FROM sweeps WHERE owner = $1 ORDER BY id DESC").bind(owner).fetch_all(pool).await?
            }
            None => sql::query("SELECT * FROM sweeps ORDER BY id DESC").fetch_all(pool).await?,
        };
        let mut sweeps = rows.iter().map(info_from_row).collect::<sql::Result<Vec<_>>>()?;
        let per_sweep = sql::query(&format!("SELECT sweep_id, status, jobs AS n FROM {} AS c", counted(engine)))
            .fetch_all(pool)
            .await?;
        for row in per_sweep {
            let sweep_id = SweepId::new(row.get_as("sweep_id")?);
            let status: String = row.get_as("status")?;
            let count: i64 = row.get_as("n")?;
            if let Some(sweep) = sweeps.iter_mut().find(|sweep| sweep.id == sweep_id) {
                sweep.counts.add(status.parse().map_err(anyhow::Error::msg)?, count as u64);
            }
        }
        for (sweep_id, count) in super::preemptions::counts_by_sweep(pool).await? {
            if let Some(sweep) = sweeps.iter_mut().find(|sweep| sweep.id == sweep_id) {
                sweep.preempted = count;
            }
        }
        for (sweep_id, reserved) in super::reservations::of_sweeps(pool).await? {
            if let Some(sweep) = sweeps.iter_mut().find(|sweep| sweep.id == sweep_id) {
                sweep.reserved = Some(reserved);
            }
        }
        Ok(sweeps)
    })
}

/// Jobs by status, of one sweep or of the whole queue.
pub async fn counts(pool: impl Into<PoolRef<'_>>, sweep_id: Option<SweepId>) -> anyhow::Result<StatusCounts> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        // Kept current by the transition trigger and the job inserts (migrations/0004).
        let rows = match sweep_id {
            Some(id) => {
                sql::query(&format!("SELECT status, jobs AS n FROM {} AS c WHERE sweep_id = $1", counted(engine)))
                    .bind(id.get())
                    .fetch_all(pool)
                    .await?
            }
            None => {
                let sql = format!(
                    "SELECT status, CAST(sum(jobs) AS BIGINT) AS n FROM {} AS c GROUP BY status",
                    counted(engine)
                );
                sql::query(&sql).fetch_all(pool).await?
            }
        };
        let mut counts = StatusCounts::default();
        for row in rows {
            let status: String = row.get_as("status")?;
            let status: JobStatus = status.parse().map_err(anyhow::Error::msg)?;
            counts.add(status, row.get_as::<i64>("n")? as u64);
        }
        Ok(counts)
    })
}

/// How many sweeps were submitted.
pub async fn count(pool: impl Into<PoolRef<'_>>) -> sql::Result<u64> {
    let pool = pool.into();
    on_pool!(pool, |pool, engine| {
        let count: i64 = sql::query_scalar("SELECT count(*) FROM sweeps").fetch_one(pool).await?;
        Ok(count as u64)
    })
}
