//! An experiment: claim+finish write units through (a) a sqlx SQLite connection (one
//! async round trip per unit + BEGIN/COMMIT, as the server's writer) and (b) a rusqlite
//! connection owned by its own thread (one hand-off per group). Same schema (the real
//! migrations), same SQL, group commit of whatever is waiting, 64 client tasks.
//!
//! The statements are copies of the server's (`FINISH_SQL` in server/src/db/jobs.rs, with the
//! `RETURNING` the bare finish adds, and `claim_sql` in server/src/db/plain_claims.rs): this
//! crate stands outside the workspace so that the main build gains no rusqlite, and so cannot
//! use them. Keep them in step when those change. The two writers' group loops are alike on
//! purpose: they differ only in how a statement reaches SQLite.

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection, Row};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

const FINISH: &str =
    "UPDATE jobs SET status = ?1, retries_left = ?2, exit_code = ?3, reason = ?4, lease_expires_at = NULL,
            finished_at = CASE WHEN ?5 THEN ?6 ELSE NULL END,
            worker_id = CASE WHEN ?1 = 'queued' THEN NULL ELSE worker_id END,
            gpu_ids = CASE WHEN ?1 = 'queued' THEN NULL ELSE gpu_ids END,
            started_at = CASE WHEN ?1 = 'queued' THEN NULL ELSE started_at END
     WHERE id = ?7 AND status = 'running' AND attempt = ?8 AND worker_id = ?9
       AND retries_left = ?10 AND cancel_requested = ?11 RETURNING id AS finished";

fn claim_sql(first: usize, fence: &str) -> String {
    let at = |n: usize| format!("?{}", first + n - 1);
    format!(
        "UPDATE jobs SET status = 'running', attempt = attempt + 1, worker_id = {w}, gpu_ids = '[]',
                lease_expires_at = {lease}, started_at = {now}, finished_at = NULL, exit_code = NULL,
                reason = NULL, cancel_requested = 0
         WHERE {fence}status = 'queued' AND id IN (
             SELECT id FROM jobs INDEXED BY jobs_queue
             WHERE status = 'queued' AND (gpus IS NULL OR gpus <= 0) AND (gpu_memory IS NULL OR gpu_memory <= 0)
               AND (needs_trainer = 0 OR {trainer})
             ORDER BY priority DESC, id LIMIT {slots})
         RETURNING id, attempt, sweep_id, idx, params, command, config, gpus, gpu_memory, exclusive,
                   needs_trainer, timeout_secs, lease_expires_at, priority, worker_id, retries_left, crash_count",
        w = at(1),
        lease = at(2),
        now = at(3),
        trainer = at(4),
        slots = at(5),
    )
}

/// One unit: finish (job, attempt) of worker w, claim its next job.
struct Unit {
    job: i64,
    attempt: i64,
    worker: i64,
    reply: oneshot::Sender<(i64, i64)>,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

async fn prepare(path: &std::path::Path, jobs: i64, workers: i64) {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal);
    let mut conn = options.connect().await.unwrap();
    let migrator =
        sqlx::migrate::Migrator::new(std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../migrations")))
            .await
            .unwrap();
    migrator.run(&mut conn).await.unwrap();
    sqlx::query(
        "INSERT INTO sweeps (id, name, form, source, job_count, created_at) VALUES (1, 's', 'native', '', ?, 0)",
    )
    .bind(jobs)
    .execute(&mut conn)
    .await
    .unwrap();
    for w in 1..=workers {
        sqlx::query("INSERT INTO workers (id, name, capacity, registered_at, last_seen_at) VALUES (?, ?, '{}', 0, 0)")
            .bind(w)
            .bind(format!("w{w}"))
            .execute(&mut conn)
            .await
            .unwrap();
    }
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
         INSERT INTO jobs (id, sweep_id, idx, params, command, priority, gpus, needs_trainer, created_at)
         SELECT i, 1, i - 1, '{}', 'true', 0, NULL, 0, 0 FROM n",
    )
    .bind(jobs)
    .execute(&mut conn)
    .await
    .unwrap();
    sqlx::query("INSERT INTO sweep_counts (sweep_id, status, jobs) VALUES (1, 'queued', ?) ON CONFLICT DO NOTHING")
        .bind(jobs)
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::query("UPDATE jobs SET status = 'running', attempt = 1, worker_id = id, lease_expires_at = 0 WHERE id <= ?")
        .bind(workers)
        .execute(&mut conn)
        .await
        .unwrap();
    conn.close().await.unwrap();
}

fn step_sql() -> String {
    format!("{FINISH};\n{}", claim_sql(12, "changes() = 1 AND "))
}

async fn sqlx_writer(path: std::path::PathBuf, mut receiver: mpsc::Receiver<Unit>) {
    let options = SqliteConnectOptions::new()
        .filename(&path)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .pragma("wal_autocheckpoint", "0")
        .pragma("cache_size", "-32000");
    let mut conn = options.connect().await.unwrap();
    let step = step_sql();
    let with_begin = format!("BEGIN IMMEDIATE;\n{step}");
    let mut group = Vec::new();
    while let Some(first) = receiver.recv().await {
        group.push(first);
        while group.len() < 256 {
            match receiver.try_recv() {
                Ok(unit) => group.push(unit),
                Err(_) => break,
            }
        }
        let several = group.len() > 1;
        let mut answers = Vec::new();
        for (i, unit) in group.iter().enumerate() {
            let sql = match (i, several) {
                (0, false) => with_begin.clone(),
                (0, true) => format!("BEGIN IMMEDIATE; SAVEPOINT unit;\n{step}"),
                (_, _) => format!("RELEASE unit; SAVEPOINT unit;\n{step}"),
            };
            let now = now_ms();
            let mut query = sqlx::query(&sql)
                .bind("succeeded")
                .bind(0i64)
                .bind(0i64)
                .bind(None::<String>)
                .bind(true)
                .bind(now)
                .bind(unit.job)
                .bind(unit.attempt)
                .bind(unit.worker)
                .bind(0i64)
                .bind(false)
                .bind(unit.worker)
                .bind(now + 60_000)
                .bind(now)
                .bind(false)
                .bind(1i64);
            for _ in 0..32 {
                query = query.bind(None::<i64>);
            }
            let rows = query.fetch_all(&mut conn).await.unwrap();
            let next = rows
                .iter()
                .find(|row| row.try_get::<i64, _>("priority").is_ok())
                .map(|row| (row.get::<i64, _>("id"), row.get::<i64, _>("attempt")))
                .unwrap_or((0, 0));
            answers.push(next);
        }
        sqlx::query("COMMIT").execute(&mut conn).await.unwrap();
        for (unit, answer) in group.drain(..).zip(answers) {
            let _ = unit.reply.send(answer);
        }
    }
}

fn rusqlite_writer(path: std::path::PathBuf, mut receiver: mpsc::Receiver<Unit>) {
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA wal_autocheckpoint = 0; PRAGMA cache_size = -32000; PRAGMA foreign_keys = ON;").unwrap();
    let claim = claim_sql(1, "");
    let mut group = Vec::new();
    while let Some(first) = receiver.blocking_recv() {
        group.push(first);
        while group.len() < 256 {
            match receiver.try_recv() {
                Ok(unit) => group.push(unit),
                Err(_) => break,
            }
        }
        let several = group.len() > 1;
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        let mut answers = Vec::new();
        for (i, unit) in group.iter().enumerate() {
            if several {
                conn.execute_batch(if i == 0 { "SAVEPOINT unit" } else { "RELEASE unit; SAVEPOINT unit" }).unwrap();
            }
            let now = now_ms();
            let mut finish = conn.prepare_cached(FINISH).unwrap();
            let finished = finish
                .query_map(
                    rusqlite::params![
                        "succeeded",
                        0i64,
                        0i64,
                        None::<String>,
                        true,
                        now,
                        unit.job,
                        unit.attempt,
                        unit.worker,
                        0i64,
                        false
                    ],
                    |row| row.get::<_, i64>(0),
                )
                .unwrap()
                .count();
            let mut next = (0, 0);
            if finished == 1 {
                let mut claim = conn.prepare_cached(&claim).unwrap();
                let mut rows = claim.query(rusqlite::params![unit.worker, now + 60_000, now, false, 1i64]).unwrap();
                while let Some(row) = rows.next().unwrap() {
                    next = (row.get::<_, i64>(0).unwrap(), row.get::<_, i64>(1).unwrap());
                }
            }
            answers.push(next);
        }
        conn.execute_batch("COMMIT").unwrap();
        for (unit, answer) in group.drain(..).zip(answers) {
            let _ = unit.reply.send(answer);
        }
    }
}

fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap().split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

async fn run(kind: &str, workers: i64, seconds: u64) {
    let dir = tempfile_dir();
    let path = dir.join("queue.db");
    prepare(&path, 2_000_000, workers).await;
    let (sender, receiver) = mpsc::channel::<Unit>(4096);
    let writer = match kind {
        "sqlx" => tokio::spawn(sqlx_writer(path.clone(), receiver)),
        _ => {
            let path = path.clone();
            let thread = std::thread::spawn(move || rusqlite_writer(path, receiver));
            tokio::task::spawn_blocking(move || {
                thread.join().unwrap();
            })
        }
    };
    let cycles = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let started_cpu = cpu_seconds();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for worker in 1..=workers {
        let sender = sender.clone();
        let cycles = cycles.clone();
        tasks.push(tokio::spawn(async move {
            // Worker w starts holding job w (attempt 1): `prepare` marked it running.
            let (mut job, mut attempt) = (worker, 1i64);
            loop {
                let (reply, answer) = oneshot::channel();
                if sender.send(Unit { job, attempt, worker, reply }).await.is_err() {
                    return;
                }
                let next = answer.await.unwrap();
                cycles.fetch_add(1, Ordering::Relaxed);
                (job, attempt) = next;
                if Instant::now() >= deadline {
                    return;
                }
                if job == 0 {
                    return;
                }
            }
        }));
    }
    drop(sender);
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - started_cpu;
    writer.await.unwrap();
    let n = cycles.load(Ordering::Relaxed);
    println!(
        "{kind}: {n} cycles in {elapsed:.1} s = {:.0} cycles/s; process CPU {:.1} us per cycle",
        n as f64 / elapsed,
        cpu * 1e6 / n as f64
    );
    // Both variants must have done the same work: every cycle one job succeeded (with its
    // transition events written by the schema's triggers) and the counts kept.
    let mut check = SqliteConnectOptions::new().filename(&path).connect().await.unwrap();
    let succeeded: i64 =
        sqlx::query_scalar("SELECT count(*) FROM jobs WHERE status = 'succeeded'").fetch_one(&mut check).await.unwrap();
    let counted: i64 = sqlx::query_scalar("SELECT jobs FROM sweep_counts WHERE sweep_id = 1 AND status = 'succeeded'")
        .fetch_one(&mut check)
        .await
        .unwrap();
    let events: i64 = sqlx::query_scalar("SELECT count(*) FROM job_events WHERE to_status = 'succeeded'")
        .fetch_one(&mut check)
        .await
        .unwrap();
    assert_eq!((succeeded, counted, events), (n as i64, n as i64, n as i64), "{kind}: work done differs from cycles");
    check.close().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("hopbench-{}-{}", std::process::id(), now_ms()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let kind = args.get(1).map(String::as_str).unwrap_or("sqlx");
    let seconds = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(5);
    run(kind, 64, seconds).await;
}
