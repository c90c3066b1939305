//! The group commit against a real SQLite file: units that wait together share a transaction,
//! a refused unit's writes are undone while its neighbours' are kept, a failing or panicking
//! unit abandons its group without a false answer, and every unit is answered.

use super::*;
use rusqlite::Connection;

async fn writer_on_file() -> (tempfile::TempDir, Connection, Writer) {
    writer_with_events(Events::default()).await
}

async fn writer_with_events(events: Events) -> (tempfile::TempDir, Connection, Writer) {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("writer.db");
    let reader = Connection::open(&path).unwrap();
    reader.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(())).unwrap();
    reader.execute("CREATE TABLE rows (value INTEGER NOT NULL)", []).unwrap();
    // The writer opens its own connection; the test reads through this one.
    let (writer, _ended) = start(WriterPool::Sqlite(path), events);
    (directory, reader, writer)
}

/// A unit that inserts `value`, then refuses, fails in the database or panics as `how` says.
fn unit<'w>(
    writer: &'w Writer,
    value: i64,
    how: &'static str,
) -> impl std::future::Future<Output = ApiResult<i64>> + 'w {
    writer.write(move |tx| {
        Box::pin(async move {
            crate::db::sql::query("INSERT INTO rows (value) VALUES ($1)")
                .bind(value)
                .execute(tx.conn().await?.into_sqlite().unwrap())
                .await?;
            tx.note(Change::Page);
            match how {
                "refuse" => Err(ApiError::Conflict(format!("unit {value} refuses"))),
                "fail" => {
                    let failed = crate::db::sql::query("INSERT INTO missing VALUES (1)")
                        .execute(tx.conn().await?.into_sqlite().unwrap())
                        .await
                        .unwrap_err();
                    Err(ApiError::from(failed))
                }
                "panic" => panic!("unit {value} panics"),
                _ => Ok(value),
            }
        })
    })
}

/// A unit that inserts `value`, then refuses when `refuse` is set.
fn insert(writer: &Writer, value: i64, refuse: bool) -> impl std::future::Future<Output = ApiResult<i64>> + '_ {
    unit(writer, value, if refuse { "refuse" } else { "ok" })
}

fn stored(conn: &Connection) -> Vec<i64> {
    let mut statement = conn.prepare("SELECT value FROM rows ORDER BY value").unwrap();
    statement.query_map([], |row| row.get(0)).unwrap().map(Result::unwrap).collect()
}

/// Runs `units` as one group: queued behind a held writer, then released.
async fn as_group<T>(writer: &Writer, count: usize, units: impl std::future::Future<Output = T>) -> T {
    let (release, _held) = writer.hold().await;
    let units = std::pin::pin!(units);
    let mut units = units;
    let queued = async {
        writer.wait_for_queued(count).await;
        drop(release);
        std::future::pending::<()>().await
    };
    tokio::select! {
        done = &mut units => done,
        _ = queued => unreachable!(),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn refused_units_in_a_group_leave_no_trace_and_the_others_commit() {
    let (_directory, reader, writer) = writer_on_file().await;
    let (first, second, third, fourth, fifth) = as_group(&writer, 5, async {
        tokio::join!(
            insert(&writer, 1, true),
            insert(&writer, 2, false),
            insert(&writer, 3, true),
            insert(&writer, 4, true),
            insert(&writer, 5, false),
        )
    })
    .await;
    assert!(matches!(first, Err(ApiError::Conflict(_))), "{first:?}");
    assert_eq!(second.unwrap(), 2);
    assert!(matches!(third, Err(ApiError::Conflict(_))), "{third:?}");
    assert!(matches!(fourth, Err(ApiError::Conflict(_))), "{fourth:?}");
    assert_eq!(fifth.unwrap(), 5);
    assert_eq!(stored(&reader), vec![2, 5]);
}

#[tokio::test(flavor = "current_thread")]
async fn a_group_of_successes_commits_every_unit_and_a_lone_refusal_rolls_back() {
    let (_directory, reader, writer) = writer_on_file().await;
    let units = futures_util::future::join_all((10..20).map(|value| insert(&writer, value, false)));
    let results = as_group(&writer, 10, units).await;
    assert_eq!(results.into_iter().map(Result::unwrap).collect::<Vec<_>>(), (10..20).collect::<Vec<_>>());
    let alone = insert(&writer, 99, true).await;
    assert!(matches!(alone, Err(ApiError::Conflict(_))), "{alone:?}");
    assert_eq!(stored(&reader), (10..20).collect::<Vec<_>>());
    // The connection is sound afterwards: the next write commits.
    assert_eq!(insert(&writer, 20, false).await.unwrap(), 20);
    assert_eq!(stored(&reader).len(), 11);
}

/// A unit that refuses (or answers) before reaching the database.
fn untouched(writer: &Writer, refuse: bool) -> impl std::future::Future<Output = ApiResult<i64>> + '_ {
    writer.write(move |_tx| {
        Box::pin(async move {
            match refuse {
                true => Err(ApiError::Conflict("refused before any statement".into())),
                false => Ok(0),
            }
        })
    })
}

/// The statements that open the transaction and each unit's savepoint are owed until a unit
/// reaches the database: a unit that never does must neither roll back the unit before it
/// nor leave the next one outside a savepoint, and a group where none does ends cleanly.
#[tokio::test(flavor = "current_thread")]
async fn units_that_never_reach_the_database_change_nothing_around_them() {
    let (_directory, reader, writer) = writer_on_file().await;
    let (first, second, third, fourth, fifth, sixth) = as_group(&writer, 6, async {
        tokio::join!(
            untouched(&writer, false),
            insert(&writer, 1, false),
            untouched(&writer, true),
            insert(&writer, 2, true),
            untouched(&writer, true),
            insert(&writer, 3, false),
        )
    })
    .await;
    assert_eq!(first.unwrap(), 0);
    assert_eq!(second.unwrap(), 1);
    assert!(matches!(third, Err(ApiError::Conflict(_))), "{third:?}");
    assert!(matches!(fourth, Err(ApiError::Conflict(_))), "{fourth:?}");
    assert!(matches!(fifth, Err(ApiError::Conflict(_))), "{fifth:?}");
    assert_eq!(sixth.unwrap(), 3);
    assert_eq!(stored(&reader), vec![1, 3], "unit 1 survives the refusals after it; unit 2 is undone");
    // Groups where no unit reaches the database: nothing to commit, and the connection is
    // left as it was.
    let (alone, answered) =
        as_group(&writer, 2, async { tokio::join!(untouched(&writer, true), untouched(&writer, false)) }).await;
    assert!(matches!(alone, Err(ApiError::Conflict(_))), "{alone:?}");
    assert_eq!(answered.unwrap(), 0);
    let lone = untouched(&writer, true).await;
    assert!(matches!(lone, Err(ApiError::Conflict(_))), "{lone:?}");
    assert_eq!(insert(&writer, 4, false).await.unwrap(), 4);
    assert_eq!(stored(&reader), vec![1, 3, 4]);
}

/// A database failure or a panic under a unit abandons its group: nobody in it is told their
/// write was done, nothing of it is committed, and the writer goes on with a fresh connection.
#[tokio::test(flavor = "current_thread")]
async fn a_failing_or_panicking_unit_abandons_its_group_and_the_writer_goes_on() {
    let (_directory, reader, writer) = writer_on_file().await;
    for how in ["fail", "panic"] {
        let (before, failing, after) = as_group(&writer, 3, async {
            tokio::join!(unit(&writer, 1, "ok"), unit(&writer, 2, how), unit(&writer, 3, "ok"))
        })
        .await;
        assert!(matches!(before, Err(ApiError::Unavailable(_))), "{how}: {before:?}");
        assert!(failing.is_err(), "{how}: {failing:?}");
        // The unit after the failure runs in a new transaction.
        assert_eq!(after.unwrap(), 3, "{how}");
        assert_eq!(stored(&reader), vec![3], "{how}");
        reader.execute("DELETE FROM rows", []).unwrap();
    }
    assert_eq!(insert(&writer, 9, false).await.unwrap(), 9);
    assert_eq!(stored(&reader), vec![9]);
}

/// The changes a unit noted are announced after its commit, and a refused unit's are not.
#[tokio::test(flavor = "current_thread")]
async fn a_units_changes_are_announced_once_committed() {
    let events = Events::default();
    let mut page = events.page_changes();
    let (_directory, _reader, writer) = writer_with_events(events).await;
    let seen = *page.borrow_and_update();
    assert!(insert(&writer, 1, true).await.is_err());
    insert(&writer, 2, false).await.unwrap();
    // Announced right after the answers (each page change counts one).
    let changed = tokio::time::timeout(std::time::Duration::from_secs(10), page.wait_for(|now| *now > seen)).await;
    assert_eq!(*changed.unwrap().unwrap(), seen + 1, "the refused unit announced nothing, the other once");
}

/// A unit that inserts `value` and notes it in `order`, in the background or not.
async fn noted(writer: Writer, value: i64, order: Arc<Mutex<Vec<i64>>>, background: bool) -> ApiResult<()> {
    fn unit(tx: &mut Tx, value: i64, order: Arc<Mutex<Vec<i64>>>) -> BoxFuture<'_, ApiResult<()>> {
        Box::pin(async move {
            crate::db::sql::query("INSERT INTO rows (value) VALUES ($1)")
                .bind(value)
                .execute(tx.conn().await?.into_sqlite().unwrap())
                .await?;
            order.lock().unwrap().push(value);
            Ok(())
        })
    }
    match background {
        true => writer.write_in_background(move |tx| unit(tx, value, order)).await,
        false => writer.write(move |tx| unit(tx, value, order)).await,
    }
}

/// The order two units ran in on a writer whose background units are due `every` after they
/// became the next one: a background unit (1), then a unit waited on (2), both sent while the
/// writer was busy. Checks that both committed.
async fn order_of_two_units(every: Duration) -> Vec<i64> {
    let (directory, reader, _) = writer_on_file().await;
    let (writer, _ended) = start_with(WriterPool::Sqlite(directory.path().join("writer.db")), Events::default(), every);
    let order = Arc::new(Mutex::new(Vec::new()));
    let (release, _held) = writer.hold().await;
    let background = tokio::spawn(noted(writer.clone(), 1, order.clone(), true));
    writer.wait_for_queued(1).await;
    let waited_on = tokio::spawn(noted(writer.clone(), 2, order.clone(), false));
    writer.wait_for_queued(2).await;
    drop(release);
    waited_on.await.unwrap().unwrap();
    background.await.unwrap().unwrap();
    assert_eq!(stored(&reader), [1, 2], "both committed");
    let order = order.lock().unwrap().clone();
    order
}

/// A background unit sent before a unit that is waited on runs after it, and on its own once
/// the writer is idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_unit_gives_way_to_the_units_waited_on() {
    // Never due while other units wait: only the order is under test.
    assert_eq!(order_of_two_units(Duration::from_secs(3600)).await, [2, 1], "the unit waited on went first");
}

/// A background unit that has waited its time runs before the units that keep coming.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_unit_due_runs_before_the_units_waiting() {
    assert_eq!(order_of_two_units(Duration::ZERO).await, [1, 2], "the background unit was due");
}
