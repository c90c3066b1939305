//! The group commit against a real SQLite file: units that wait together share a transaction,
//! a refused unit's writes are undone while its neighbours' are kept, and every unit is
//! answered.

use super::*;
use sqlx::sqlite::SqlitePoolOptions;

async fn writer_on_file() -> (tempfile::TempDir, SqlitePool, Writer) {
    let directory = tempfile::tempdir().unwrap();
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(directory.path().join("writer.db"))
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal);
    let pool = SqlitePoolOptions::new().max_connections(1).connect_with(options.clone()).await.unwrap();
    sqlx::query("CREATE TABLE rows (value INTEGER NOT NULL)").execute(&pool).await.unwrap();
    // The writer keeps its pool's one connection; the test reads through its own.
    let (writer, _task) = start(pool, Events::default());
    let reader = SqlitePoolOptions::new().max_connections(1).connect_with(options).await.unwrap();
    (directory, reader, writer)
}

/// A unit that inserts `value`, then refuses when `refuse` is set.
fn insert(writer: &Writer, value: i64, refuse: bool) -> impl std::future::Future<Output = ApiResult<i64>> + '_ {
    writer.write(move |tx| {
        Box::pin(async move {
            sqlx::query("INSERT INTO rows (value) VALUES (?)").bind(value).execute(tx.conn().await?).await?;
            if refuse {
                return Err(ApiError::Conflict(format!("unit {value} refuses")));
            }
            Ok(value)
        })
    })
}

async fn stored(pool: &SqlitePool) -> Vec<i64> {
    sqlx::query_scalar("SELECT value FROM rows ORDER BY value").fetch_all(pool).await.unwrap()
}

// One thread: the units are all queued before the writer task first runs, so they form one
// group (the case that uses savepoints).
#[tokio::test(flavor = "current_thread")]
async fn refused_units_in_a_group_leave_no_trace_and_the_others_commit() {
    let (_directory, pool, writer) = writer_on_file().await;
    let (first, second, third, fourth, fifth) = tokio::join!(
        insert(&writer, 1, true),
        insert(&writer, 2, false),
        insert(&writer, 3, true),
        insert(&writer, 4, true),
        insert(&writer, 5, false),
    );
    assert!(matches!(first, Err(ApiError::Conflict(_))), "{first:?}");
    assert_eq!(second.unwrap(), 2);
    assert!(matches!(third, Err(ApiError::Conflict(_))), "{third:?}");
    assert!(matches!(fourth, Err(ApiError::Conflict(_))), "{fourth:?}");
    assert_eq!(fifth.unwrap(), 5);
    assert_eq!(stored(&pool).await, vec![2, 5]);
}

#[tokio::test(flavor = "current_thread")]
async fn a_group_of_successes_commits_every_unit_and_a_lone_refusal_rolls_back() {
    let (_directory, pool, writer) = writer_on_file().await;
    let results = futures_util::future::join_all((10..20).map(|value| insert(&writer, value, false))).await;
    assert_eq!(results.into_iter().map(Result::unwrap).collect::<Vec<_>>(), (10..20).collect::<Vec<_>>());
    let alone = insert(&writer, 99, true).await;
    assert!(matches!(alone, Err(ApiError::Conflict(_))), "{alone:?}");
    assert_eq!(stored(&pool).await, (10..20).collect::<Vec<_>>());
    // The connection is sound afterwards: the next write commits.
    assert_eq!(insert(&writer, 20, false).await.unwrap(), 20);
    assert_eq!(stored(&pool).await.len(), 11);
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
    let (_directory, pool, writer) = writer_on_file().await;
    let (first, second, third, fourth, fifth, sixth) = tokio::join!(
        untouched(&writer, false),
        insert(&writer, 1, false),
        untouched(&writer, true),
        insert(&writer, 2, true),
        untouched(&writer, true),
        insert(&writer, 3, false),
    );
    assert_eq!(first.unwrap(), 0);
    assert_eq!(second.unwrap(), 1);
    assert!(matches!(third, Err(ApiError::Conflict(_))), "{third:?}");
    assert!(matches!(fourth, Err(ApiError::Conflict(_))), "{fourth:?}");
    assert!(matches!(fifth, Err(ApiError::Conflict(_))), "{fifth:?}");
    assert_eq!(sixth.unwrap(), 3);
    assert_eq!(stored(&pool).await, vec![1, 3], "unit 1 survives the refusals after it; unit 2 is undone");
    // Groups where no unit reaches the database: nothing to commit, and the connection is
    // left as it was.
    let (alone, answered) = tokio::join!(untouched(&writer, true), untouched(&writer, false));
    assert!(matches!(alone, Err(ApiError::Conflict(_))), "{alone:?}");
    assert_eq!(answered.unwrap(), 0);
    let lone = untouched(&writer, true).await;
    assert!(matches!(lone, Err(ApiError::Conflict(_))), "{lone:?}");
    assert_eq!(insert(&writer, 4, false).await.unwrap(), 4);
    assert_eq!(stored(&pool).await, vec![1, 3, 4]);
}
