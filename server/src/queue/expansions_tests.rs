//! A large sweep on SQLite: its first rows in the submission, the rest after it, in order, across
//! a restart, completed first by a cancel or a pause, and kept from removal until written.

use super::*;
use crate::auth::Caller;
use crate::config::ServerConfig;
use shared::api::{SweepId, Workspace};

/// 24,001 jobs: the first 4,000 and the last job at submission, ten chunks of 2,000 left.
const JOBS: u64 = 24_001;

fn grid(name: &str) -> String {
    let values: Vec<String> = (0..JOBS).map(|value| value.to_string()).collect();
    format!("name: {name}\ncommand: \"true {{a}}\"\ngrid:\n  a: [{}]\n", values.join(", "))
}

async fn start(directory: &tempfile::TempDir) -> (Arc<Queue>, super::super::Tasks, watch::Sender<bool>) {
    let db = db::Db::open(directory.path()).await.unwrap();
    let config = Arc::new(ServerConfig { data_dir: directory.path().to_path_buf(), ..ServerConfig::default() });
    let (stop, shutting_down) = watch::channel(false);
    let (queue, tasks) = Queue::start(db, config, "test".into(), shutting_down);
    (queue, tasks, stop)
}

async fn submit(queue: &Queue, name: &str) -> SweepId {
    let source = Arc::new(grid(name));
    let sweep = queue.parse_sweep(source.clone(), None).await.unwrap();
    let submitted =
        queue.submit(Arc::new(sweep), source, (name.into(), "default".into(), 0), Workspace::default()).await;
    let submitted = submitted.unwrap();
    assert_eq!(submitted.count, JOBS);
    submitted.sweep_id
}

/// (rows, held rows, chunks left, smallest id, ids that are not the smallest plus the index).
fn rows_of(directory: &tempfile::TempDir, sweep: SweepId) -> (i64, i64, i64, i64, i64) {
    let conn = rusqlite::Connection::open(directory.path().join("queue.db")).unwrap();
    conn.query_row(
        "SELECT count(*), coalesce(sum(held), 0),
                (SELECT count(*) FROM job_expansions WHERE sweep_id = ?1), coalesce(min(id), 0),
                (SELECT count(*) FROM jobs j WHERE j.sweep_id = ?1 AND j.id - j.idx <> (SELECT min(id) FROM jobs WHERE sweep_id = ?1))
         FROM jobs WHERE sweep_id = ?1",
        [sweep.get()],
        |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?)),
    )
    .unwrap()
}

async fn wait_for_rows(directory: &tempfile::TempDir, sweep: SweepId) -> (i64, i64, i64, i64, i64) {
    testkit::wait_until("every row of the sweep", std::time::Duration::from_secs(60), || async {
        let rows = rows_of(directory, sweep);
        (rows.0 == JOBS as i64 && rows.2 == 0).then_some(rows)
    })
    .await
}

#[tokio::test]
async fn the_rows_left_by_a_submission_are_written_in_order_even_after_a_restart() {
    let directory = tempfile::tempdir().unwrap();
    let (queue, tasks, _stop) = start(&directory).await;
    let first = submit(&queue, "first").await;
    let second = submit(&queue, "second").await;
    // The background writer is not running: what the submissions wrote themselves.
    let (rows, held, chunks, first_id, _) = rows_of(&directory, first);
    assert_eq!((rows, held, chunks), (4_001, 1, 10), "the first rows, the held last job, ten chunks left");
    let counts = db::sweeps::counts(queue.reader(), Some(first)).await.unwrap();
    assert_eq!(counts.queued, JOBS, "counted as queued from the start");
    let second_id = rows_of(&directory, second).3;
    assert_eq!(second_id, first_id + JOBS as i64, "the next sweep's ids come after the whole of the first");
    // A server stopped here, and started again, writes the rest.
    drop(queue);
    tasks.finish().await;
    let (queue, tasks, stop) = start(&directory).await;
    let background = tokio::spawn(run(queue.clone(), stop.subscribe()));
    for sweep in [first, second] {
        let (rows, held, _, _, out_of_place) = wait_for_rows(&directory, sweep).await;
        assert_eq!((rows, held, out_of_place), (JOBS as i64, 0, 0), "every job at base + index, none held");
    }
    let counts = db::sweeps::counts(queue.reader(), Some(second)).await.unwrap();
    assert_eq!(counts.queued, JOBS, "counted once");
    stop.send(true).unwrap();
    background.await.unwrap();
    drop(queue);
    tasks.finish().await;
}

/// Pauses (`true`) or resumes the sweep in a write unit.
async fn set_paused(queue: &Queue, sweep: SweepId, paused: bool) {
    let changed = queue
        .write(move |tx| {
            Box::pin(async move {
                Ok(match paused {
                    true => db::fail_fast::pause(tx.conn().await?, sweep, "a test", 1).await?,
                    false => db::fail_fast::resume(tx.conn().await?, sweep, 2).await?,
                })
            })
        })
        .await
        .unwrap();
    assert!(changed);
}

#[tokio::test]
async fn a_cancel_writes_the_rows_left_first_a_pause_holds_them_and_removal_waits() {
    let directory = tempfile::tempdir().unwrap();
    let (queue, tasks, stop) = start(&directory).await;
    let cancelled = submit(&queue, "cancelled").await;
    let response = queue.cancel_sweep(&Caller::open(), "cancelled").await.unwrap();
    assert_eq!(response.cancelled, JOBS);
    assert_eq!(rows_of(&directory, cancelled).2, 0, "no chunk left behind to be written as queued");
    let counts = db::sweeps::counts(queue.reader(), Some(cancelled)).await.unwrap();
    assert_eq!((counts.queued, counts.cancelled), (0, JOBS));

    // Every job written so far ended one by one: the sweep still has jobs to come, and stays.
    let ended = submit(&queue, "ended").await;
    let removed = queue
        .write(move |tx| {
            Box::pin(async move {
                let mut conn = tx.conn().await?;
                let conn = &mut conn;
                crate::db::backend::on_conn!(conn, |c, engine| {
                    crate::db::sql::query("UPDATE jobs SET status = 'cancelled', finished_at = 1 WHERE sweep_id = $1")
                        .bind(ended.get())
                        .execute(&mut *c)
                        .await?;
                    Ok::<_, crate::db::sql::Error>(())
                })?;
                Ok(db::maintenance::delete_sweep(tx.conn().await?, ended).await?.is_some())
            })
        })
        .await
        .unwrap();
    assert!(!removed, "a sweep with rows still to be written is not removed");
    assert_eq!(rows_of(&directory, ended).2, 10, "nor are its rows");
    queue.cancel_sweep(&Caller::open(), "ended").await.unwrap();

    // A pause holds what is written and leaves the rest to the background, which writes it held.
    let paused = submit(&queue, "paused").await;
    set_paused(&queue, paused, true).await;
    let (rows, held, chunks, _, _) = rows_of(&directory, paused);
    assert_eq!((rows, held, chunks), (4_001, 4_001, 10), "every job written is held, the rest left");
    set_paused(&queue, paused, false).await;
    assert_eq!(rows_of(&directory, paused).1, 1, "resumed, the last job stays held while rows are to come");
    set_paused(&queue, paused, true).await;
    let background = tokio::spawn(run(queue.clone(), stop.subscribe()));
    let (rows, held, _, _, out_of_place) = wait_for_rows(&directory, paused).await;
    assert_eq!((rows, held, out_of_place), (JOBS as i64, JOBS as i64, 0), "written held, the last one too");
    set_paused(&queue, paused, false).await;
    assert_eq!(rows_of(&directory, paused).1, 0, "a resumed sweep holds none, its last job included");
    stop.send(true).unwrap();
    background.await.unwrap();
    drop(queue);
    tasks.finish().await;
}

#[tokio::test]
async fn a_chunk_that_cannot_be_written_stops_its_sweep_only() {
    let directory = tempfile::tempdir().unwrap();
    let (queue, tasks, stop) = start(&directory).await;
    let damaged = submit(&queue, "damaged").await;
    let sound = submit(&queue, "sound").await;
    let conn = rusqlite::Connection::open(directory.path().join("queue.db")).unwrap();
    conn.execute("UPDATE job_expansions SET rows = x'09' WHERE sweep_id = ?1", [damaged.get()]).unwrap();
    let background = tokio::spawn(run(queue.clone(), stop.subscribe()));
    let (rows, held, _, _, out_of_place) = wait_for_rows(&directory, sound).await;
    assert_eq!((rows, held, out_of_place), (JOBS as i64, 0, 0), "the later sweep was written in full");
    let (rows, held, chunks, _, _) = rows_of(&directory, damaged);
    assert_eq!((rows, held, chunks), (4_001, 1, 10), "the damaged one keeps what it had, its last job held");
    stop.send(true).unwrap();
    background.await.unwrap();
    drop(queue);
    tasks.finish().await;
}
