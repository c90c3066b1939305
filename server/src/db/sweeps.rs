//! `sweeps`, and the bulk insert of a sweep's jobs.

use shared::api::{StatusCounts, SweepDetail, SweepId, SweepInfo};
use shared::job::JobStatus;
use shared::sweep::{Goal, Metric, Sweep, SweepForm};
use sqlx::sqlite::SqliteRow;
use sqlx::SqliteConnection;
use sqlx::{Row, SqlitePool};

/// Jobs per INSERT statement: 4 bound values per job stays under SQLite's 32,766-variable
/// limit, and few statements is what makes a 100,000-job sweep insert in a fraction of a second.
const JOBS_PER_STATEMENT: usize = 4_000;

/// Returns `base`, or `base-2`, `base-3`, ... whichever is free (shortening `base` so the
/// name stays within the 100 characters names may have).
pub async fn unique_name(conn: &mut SqliteConnection, base: &str) -> sqlx::Result<String> {
    let base = if base.len() > 90 { &base[..90] } else { base };
    let taken: Vec<String> = sqlx::query_scalar("SELECT name FROM sweeps WHERE name = ? OR name LIKE ? || '-%'")
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
}

pub async fn insert(
    conn: &mut SqliteConnection,
    name: &str,
    sweep: &Sweep,
    source: &str,
    now: i64,
) -> sqlx::Result<SweepId> {
    sqlx::query_scalar::<_, i64>(
        "INSERT INTO sweeps (name, form, source, metric_name, metric_goal, job_count, created_at)
         VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
    )
    .bind(name)
    .bind(form_text(sweep.form))
    .bind(source)
    .bind(sweep.metric.as_ref().map(|metric| metric.name.as_str()))
    .bind(sweep.metric.as_ref().map(|metric| goal_text(metric.goal)))
    .bind(sweep.count() as i64)
    .bind(now)
    .fetch_one(&mut *conn)
    .await
    .map(SweepId::new)
}

/// Inserts every job of the sweep, in index order, a few thousand per statement.
pub async fn insert_jobs(conn: &mut SqliteConnection, sweep_id: SweepId, sweep: &Sweep, now: i64) -> sqlx::Result<u64> {
    let resources = &sweep.resources;
    let mut jobs = sweep.jobs().peekable();
    let mut inserted = 0;
    let mut batch = Vec::with_capacity(JOBS_PER_STATEMENT);
    while jobs.peek().is_some() {
        batch.clear();
        batch.extend(jobs.by_ref().take(JOBS_PER_STATEMENT));
        // Values shared by the whole sweep are bound once; each row binds only its own four.
        // Every parameter is an anonymous `?`: sqlx looks up each numbered `?NNN` by name, which
        // SQLite answers with a linear scan, quadratic over a statement with thousands of them.
        let mut sql = String::with_capacity(300 + batch.len() * 10);
        sql.push_str(
            "INSERT INTO jobs (sweep_id, idx, params, command, config, gpus, gpu_memory, exclusive,
                               timeout_secs, priority, retries_left, created_at, needs_trainer)
             SELECT ?, column1, column2, column3, column4, ?, ?, ?, ?, ?, ?, ?, ? FROM (VALUES ",
        );
        for position in 0..batch.len() {
            sql.push_str(if position == 0 { "(?,?,?,?)" } else { ",(?,?,?,?)" });
        }
        sql.push(')');
        let mut query = sqlx::query(&sql)
            .bind(sweep_id.get())
            .bind(resources.gpus)
            .bind(resources.gpu_memory.map(|bytes| bytes as i64))
            .bind(resources.exclusive)
            .bind(sweep.timeout_secs.map(|secs| secs as i64))
            .bind(sweep.priority)
            .bind(sweep.retries)
            .bind(now)
            .bind(resources.trainer);
        for job in batch.drain(..) {
            query = query.bind(job.index as i64).bind(job.params).bind(job.command).bind(job.config);
        }
        inserted += query.execute(&mut *conn).await?.rows_affected();
    }
    count_new_jobs(conn, sweep_id, inserted).await?;
    Ok(inserted)
}

/// Adds `jobs` new queued jobs of `sweep_id` to `sweep_counts` (see migrations/0004): every
/// function that inserts jobs calls it in the same transaction.
pub async fn count_new_jobs(conn: &mut SqliteConnection, sweep_id: SweepId, jobs: u64) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO sweep_counts (sweep_id, status, jobs) VALUES (?, 'queued', ?)
         ON CONFLICT (sweep_id, status) DO UPDATE SET jobs = jobs + excluded.jobs",
    )
    .bind(sweep_id.get())
    .bind(jobs as i64)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The sweep's name and form.
pub async fn name_and_form_of(conn: &mut SqliteConnection, id: SweepId) -> sqlx::Result<(String, SweepForm)> {
    let (name, form): (String, String) =
        sqlx::query_as("SELECT name, form FROM sweeps WHERE id = ?").bind(id.get()).fetch_one(&mut *conn).await?;
    Ok((name, parse_form(&form)))
}

pub async fn name_of(conn: &mut SqliteConnection, id: SweepId) -> sqlx::Result<String> {
    sqlx::query_scalar("SELECT name FROM sweeps WHERE id = ?").bind(id.get()).fetch_one(&mut *conn).await
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

fn info_from_row(row: &SqliteRow) -> sqlx::Result<SweepInfo> {
    let metric_name: Option<String> = row.try_get("metric_name")?;
    let metric_goal: Option<String> = row.try_get("metric_goal")?;
    let form: String = row.try_get("form")?;
    Ok(SweepInfo {
        id: SweepId::new(row.try_get("id")?),
        name: row.try_get("name")?,
        form: parse_form(&form),
        metric: metric_name.map(|name| Metric {
            name,
            goal: if metric_goal.as_deref() == Some("maximize") { Goal::Maximize } else { Goal::Minimize },
        }),
        created_at: row.try_get("created_at")?,
        counts: StatusCounts::default(),
    })
}

/// A sweep by id (all digits) or by name.
pub async fn find(pool: &SqlitePool, key: &str) -> anyhow::Result<Option<SweepDetail>> {
    let row = match key.parse::<i64>() {
        Ok(id) => {
            sqlx::query("SELECT * FROM sweeps WHERE id = ? OR name = ? ORDER BY id = ? DESC LIMIT 1")
                .bind(id)
                .bind(key)
                .bind(id)
                .fetch_optional(pool)
                .await?
        }
        Err(_) => sqlx::query("SELECT * FROM sweeps WHERE name = ?").bind(key).fetch_optional(pool).await?,
    };
    let Some(row) = row else { return Ok(None) };
    let mut info = info_from_row(&row)?;
    info.counts = counts(pool, Some(info.id)).await?;
    let search = super::search::state(pool, info.id).await?;
    Ok(Some(SweepDetail { info, source: row.try_get("source")?, search, unplaceable: None }))
}

/// Newest first.
pub async fn list(pool: &SqlitePool) -> anyhow::Result<Vec<SweepInfo>> {
    let rows = sqlx::query("SELECT * FROM sweeps ORDER BY id DESC").fetch_all(pool).await?;
    let mut sweeps = rows.iter().map(info_from_row).collect::<sqlx::Result<Vec<_>>>()?;
    let per_sweep = sqlx::query("SELECT sweep_id, status, jobs AS n FROM sweep_counts").fetch_all(pool).await?;
    for row in per_sweep {
        let sweep_id = SweepId::new(row.try_get("sweep_id")?);
        let status: String = row.try_get("status")?;
        let count: i64 = row.try_get("n")?;
        if let Some(sweep) = sweeps.iter_mut().find(|sweep| sweep.id == sweep_id) {
            sweep.counts.add(status.parse().map_err(anyhow::Error::msg)?, count as u64);
        }
    }
    Ok(sweeps)
}

/// Jobs by status, of one sweep or of the whole queue.
pub async fn counts(pool: &SqlitePool, sweep_id: Option<SweepId>) -> anyhow::Result<StatusCounts> {
    // Kept current by the transition trigger and the job inserts (migrations/0004).
    let rows = match sweep_id {
        Some(id) => {
            sqlx::query("SELECT status, jobs AS n FROM sweep_counts WHERE sweep_id = ?")
                .bind(id.get())
                .fetch_all(pool)
                .await?
        }
        None => sqlx::query("SELECT status, sum(jobs) AS n FROM sweep_counts GROUP BY status").fetch_all(pool).await?,
    };
    let mut counts = StatusCounts::default();
    for row in rows {
        let status: String = row.try_get("status")?;
        let status: JobStatus = status.parse().map_err(anyhow::Error::msg)?;
        counts.add(status, row.try_get::<i64, _>("n")? as u64);
    }
    Ok(counts)
}

/// How many sweeps were submitted.
pub async fn count(pool: &SqlitePool) -> sqlx::Result<u64> {
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM sweeps").fetch_one(pool).await?;
    Ok(count as u64)
}
