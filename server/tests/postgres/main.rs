//! The PostgreSQL backend's start-up half against real servers (Debian's PostgreSQL, started per
//! test in a temporary directory): its schema is the SQLite one, table for table and trigger for
//! trigger; opening refuses what it must, with words that say why.

use server::db::backend::Engine;
use server::db::{postgres, sql};
use sqlx::{PgPool, Row};
use std::collections::{BTreeMap, BTreeSet};
use testkit::PgServer;

/// One table as both backends can describe it.
#[derive(Debug, Default, PartialEq, Eq)]
struct Table {
    /// Name, type family, NOT NULL, default (as written, without PostgreSQL's casts), in order.
    columns: Vec<(String, String, bool, Option<String>)>,
    primary_key: Vec<String>,
    unique: BTreeSet<Vec<String>>,
    /// Name -> (unique, WHERE of a partial one, columns with their direction).
    indexes: BTreeMap<String, (bool, Option<String>, Vec<String>)>,
    /// Column, referenced table, referenced column, on delete.
    foreign_keys: BTreeSet<(String, String, String, String)>,
    triggers: BTreeSet<String>,
}

/// A column type of either backend as one name: SQLite's INTEGER (64-bit) is PostgreSQL's
/// BIGINT, never its 32-bit `integer`.
fn family(sqlite: bool, declared: &str) -> String {
    match (sqlite, declared.to_ascii_lowercase().as_str()) {
        (true, "integer") | (false, "bigint") => "64-bit integer".into(),
        (_, "text") => "text".into(),
        (true, "real") | (false, "double precision") => "double".into(),
        (true, "blob") | (false, "bytea") => "bytes".into(),
        (sqlite, other) => format!("{other} ({})", if sqlite { "SQLite" } else { "PostgreSQL" }),
    }
}

/// An index's WHERE as both backends can write it: `(status = 'queued'::text)` is
/// `status = 'queued'`.
fn predicate(text: &str) -> String {
    let text = text.to_ascii_lowercase().replace("::text", "").replace("::bigint", "");
    text.replace(['(', ')'], "").split_whitespace().collect::<Vec<_>>().join(" ")
}

fn on_delete(action: &str) -> String {
    match action {
        "a" | "NO ACTION" => "no action".into(),
        "c" | "CASCADE" => "cascade".into(),
        other => other.to_ascii_lowercase(),
    }
}

/// The rows of `sql` with `?1` bound to `name`, each value read as `T`.
fn rows<T: rusqlite::types::FromSql>(conn: &rusqlite::Connection, sql: &str, name: &str) -> Vec<Vec<T>> {
    let mut statement = conn.prepare(sql).unwrap();
    let columns = statement.column_count();
    let read = statement.query_map([name], |row| (0..columns).map(|column| row.get::<_, T>(column)).collect());
    read.unwrap().map(Result::unwrap).collect()
}

fn sqlite_schema(conn: &rusqlite::Connection) -> BTreeMap<String, Table> {
    use rusqlite::types::Value;
    let text = |value: &Value| match value {
        Value::Text(text) => Some(text.clone()),
        _ => None,
    };
    let int = |value: &Value| match value {
        Value::Integer(int) => *int,
        _ => 0,
    };
    let names = rows::<String>(
        conn,
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name <> '_sqlx_migrations'
           AND ?1 = ?1",
        "",
    );
    let mut schema = BTreeMap::new();
    for name in names.into_iter().map(|mut row| row.remove(0)) {
        let mut table = Table::default();
        let mut key = Vec::new();
        let sql = "SELECT name, type, \"notnull\", dflt_value, pk FROM pragma_table_info(?1) ORDER BY cid";
        for row in rows::<Value>(conn, sql, &name) {
            let (column, pk) = (text(&row[0]).unwrap(), int(&row[4]));
            let not_null = int(&row[2]) == 1 || pk > 0;
            table.columns.push((column.clone(), family(true, &text(&row[1]).unwrap()), not_null, text(&row[3])));
            if pk > 0 {
                key.push((pk, column));
            }
        }
        key.sort();
        table.primary_key = key.into_iter().map(|(_, column)| column).collect();
        let sql = "SELECT l.name, l.\"unique\", l.origin, m.sql FROM pragma_index_list(?1) l
                   LEFT JOIN sqlite_master m ON m.type = 'index' AND m.name = l.name";
        for row in rows::<Value>(conn, sql, &name) {
            let index = text(&row[0]).unwrap();
            let columns: Vec<String> = rows::<String>(
                conn,
                "SELECT name || CASE WHEN \"desc\" THEN ' DESC' ELSE '' END FROM pragma_index_xinfo(?1)
                 WHERE key = 1 ORDER BY seqno",
                &index,
            )
            .into_iter()
            .map(|mut row| row.remove(0))
            .collect();
            let partial = text(&row[3]).and_then(|sql| {
                let at = sql.to_ascii_uppercase().rfind(" WHERE ")?;
                Some(predicate(&sql[at + 7..]))
            });
            match text(&row[2]).unwrap().as_str() {
                "pk" => {}
                "u" => {
                    table.unique.insert(columns);
                }
                _ => {
                    table.indexes.insert(index, (int(&row[1]) == 1, partial, columns));
                }
            }
        }
        let sql = "SELECT \"from\", \"table\", \"to\", on_delete FROM pragma_foreign_key_list(?1)";
        for row in rows::<String>(conn, sql, &name) {
            table.foreign_keys.insert((row[0].clone(), row[1].clone(), row[2].clone(), on_delete(&row[3])));
        }
        let sql = "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = ?1";
        table.triggers = rows::<String>(conn, sql, &name).into_iter().map(|mut row| row.remove(0)).collect();
        schema.insert(name, table);
    }
    schema
}

async fn postgres_schema(pool: &PgPool) -> BTreeMap<String, Table> {
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::TEXT FROM information_schema.tables
         WHERE table_schema = current_schema() AND table_type = 'BASE TABLE' AND table_name <> '_sqlx_migrations'",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    // The columns of a key or constraint, in its order.
    let columns_of = |keys: &str, table: &str| {
        format!(
            "array(SELECT a.attname::TEXT FROM unnest({keys}) WITH ORDINALITY k(attnum, n)
                   JOIN pg_attribute a ON a.attrelid = {table} AND a.attnum = k.attnum ORDER BY k.n)"
        )
    };
    let mut schema = BTreeMap::new();
    for name in names {
        let mut table = Table::default();
        for row in sqlx::query(
            "SELECT column_name::TEXT, data_type::TEXT, is_nullable::TEXT, column_default::TEXT
             FROM information_schema.columns
             WHERE table_schema = current_schema() AND table_name = $1 ORDER BY ordinal_position",
        )
        .bind(&name)
        .fetch_all(pool)
        .await
        .unwrap()
        {
            let default: Option<String> = row.get(3);
            // `'queued'::text` is SQLite's `'queued'`.
            let default = default.map(|value| value.split("::").next().unwrap_or_default().to_string());
            table.columns.push((row.get(0), family(false, row.get(1)), row.get::<String, _>(2) == "NO", default));
        }
        let key = columns_of("i.indkey::INT2[]", "i.indrelid");
        table.primary_key = sqlx::query_scalar(&format!(
            "SELECT {key} FROM pg_index i WHERE i.indrelid = $1::regclass AND i.indisprimary"
        ))
        .bind(&name)
        .fetch_optional(pool)
        .await
        .unwrap()
        .unwrap_or_default();
        let constrained = columns_of("c.conkey", "c.conrelid");
        table.unique = sqlx::query_scalar(&format!(
            "SELECT {constrained} FROM pg_constraint c WHERE c.conrelid = $1::regclass AND c.contype = 'u'"
        ))
        .bind(&name)
        .fetch_all(pool)
        .await
        .unwrap()
        .into_iter()
        .collect();
        // indoption's bit 1 is DESC (0-based, as int2vector is).
        for row in sqlx::query(
            "SELECT x.relname::TEXT, i.indisunique, pg_get_expr(i.indpred, i.indrelid),
                    array(SELECT a.attname::TEXT || CASE WHEN i.indoption[k.n - 1] & 1 = 1 THEN ' DESC' ELSE '' END
                          FROM unnest(i.indkey::INT2[]) WITH ORDINALITY k(attnum, n)
                          JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum ORDER BY k.n)
             FROM pg_index i JOIN pg_class x ON x.oid = i.indexrelid
             WHERE i.indrelid = $1::regclass AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)",
        )
        .bind(&name)
        .fetch_all(pool)
        .await
        .unwrap()
        {
            let partial: Option<String> = row.get(2);
            table.indexes.insert(row.get(0), (row.get(1), partial.as_deref().map(predicate), row.get(3)));
        }
        for row in sqlx::query(
            "SELECT (SELECT attname::TEXT FROM pg_attribute WHERE attrelid = c.conrelid AND attnum = c.conkey[1]),
                    c.confrelid::regclass::TEXT,
                    (SELECT attname::TEXT FROM pg_attribute WHERE attrelid = c.confrelid AND attnum = c.confkey[1]),
                    c.confdeltype::TEXT
             FROM pg_constraint c WHERE c.conrelid = $1::regclass AND c.contype = 'f'",
        )
        .bind(&name)
        .fetch_all(pool)
        .await
        .unwrap()
        {
            table.foreign_keys.insert((row.get(0), row.get(1), row.get(2), on_delete(row.get(3))));
        }
        table.triggers =
            sqlx::query_scalar("SELECT tgname::TEXT FROM pg_trigger WHERE tgrelid = $1::regclass AND NOT tgisinternal")
                .bind(&name)
                .fetch_all(pool)
                .await
                .unwrap()
                .into_iter()
                .collect();
        schema.insert(name, table);
    }
    schema
}

#[tokio::test]
async fn the_postgres_schema_is_the_sqlite_schema_version_for_version() {
    let pg = PgServer::start();
    let opened = postgres::open(&pg.url, 30_000).await.unwrap();
    assert!(opened.created, "a new database's schema is made by this start");
    let directory = tempfile::tempdir().unwrap();
    let sqlite = server::db::Db::open(directory.path()).await.unwrap();

    let known = |migrator: sqlx::migrate::Migrator| -> Vec<(i64, String)> {
        migrator.iter().map(|migration| (migration.version, migration.description.to_string())).collect()
    };
    assert_eq!(
        known(sqlx::migrate!("../migrations-postgres")),
        known(sqlx::migrate!("../migrations")),
        "the same versions, under the same names"
    );
    let conn = sqlite.sqlite_connection().unwrap().unwrap();
    let (expected, actual) = (sqlite_schema(&conn), postgres_schema(&opened.pool).await);
    assert!(expected.len() >= 16, "every table is compared: {:?}", expected.keys());
    assert_eq!(expected.keys().collect::<Vec<_>>(), actual.keys().collect::<Vec<_>>(), "the same tables");
    for (name, table) in &expected {
        assert_eq!(Some(table), actual.get(name), "table {name}: SQLite (left) and PostgreSQL (right) differ");
    }
    sqlite.close().await;
}

/// What the triggers leave: each transition with its worker, GPUs, exit code and reason; the
/// counts by status; the checkpoints of deleted jobs gone.
const SCRIPT: &str = "
    INSERT INTO sweeps (id, name, form, source, job_count, created_at) VALUES (1, 's', 'native', 'x', 2, 0);
    INSERT INTO jobs (id, sweep_id, idx, params, command, created_at) VALUES (1, 1, 0, '{}', 'true', 0), (2, 1, 1, '{}', 'true', 0);
    INSERT INTO sweep_counts (sweep_id, status, jobs) VALUES (1, 'queued', 2);
    INSERT INTO workers (id, name, capacity, registered_at, last_seen_at) VALUES (1, 'w', '{}', 0, 0);
    UPDATE jobs SET status = 'running', attempt = 1, worker_id = 1, gpu_ids = '[0]' WHERE id = 1;
    UPDATE jobs SET status = 'queued', worker_id = NULL, gpu_ids = NULL, reason = 'lease expired' WHERE id = 1;
    UPDATE jobs SET status = 'running', attempt = 2, worker_id = 1, gpu_ids = '[1]', reason = NULL WHERE id = 1;
    UPDATE jobs SET priority = 5, lease_expires_at = 9 WHERE id = 1;
    INSERT INTO early_stops (job_id, attempt, rung, cutoff, reason, stopped_at) VALUES (1, 2, 10, 0.5, 'stopped early at step 10', 0);
    UPDATE jobs SET status = 'cancelled', exit_code = 143, reason = 'cancelled' WHERE id = 1;
    UPDATE jobs SET attempt = 3 WHERE id = 1;
    UPDATE jobs SET status = status, reason = reason WHERE id = 1;
    UPDATE jobs SET status = 'running', attempt = 1, worker_id = 1 WHERE id = 2;
    UPDATE jobs SET status = 'failed', exit_code = 2, reason = 'exit code 2' WHERE id = 2;
    INSERT INTO checkpoints (job_id, attempt, size, sha256, uploaded_at) VALUES (1, 2, 1, 'a', 0), (2, 1, 1, 'b', 0);
    DELETE FROM job_events WHERE job_id = 2;
    DELETE FROM jobs WHERE id = 2;
";

type Event = (i64, Option<String>, String, i64, Option<i64>, Option<String>, Option<String>, Option<i64>);

const EVENTS: &str =
    "SELECT job_id, from_status, to_status, attempt, worker_id, reason, gpu_ids, exit_code FROM job_events ORDER BY id";
const JOBS: &str = "SELECT id, status, reason FROM jobs ORDER BY id";
/// The counts by status, as the server reads them on `engine` (on PostgreSQL, the count rows
/// and the moves not folded into them yet).
fn counts_sql(engine: Engine) -> String {
    format!("SELECT status, jobs FROM {} AS c ORDER BY status", server::db::sweeps::counted(engine))
}
const CHECKPOINTS: &str = "SELECT job_id FROM checkpoints ORDER BY job_id";
const TIMES: &str = "SELECT min(at), max(at) FROM job_events";

#[tokio::test]
async fn the_triggers_do_on_postgres_what_they_do_on_sqlite() {
    let pg = PgServer::start();
    let opened = postgres::open(&pg.url, 30_000).await.unwrap();
    let directory = tempfile::tempdir().unwrap();
    let sqlite = server::db::Db::open(directory.path()).await.unwrap();
    let before = server::db::now_ms();
    sqlite.sqlite_connection().unwrap().unwrap().execute_batch(SCRIPT).unwrap();
    sqlx::raw_sql(SCRIPT).execute(&opened.pool).await.unwrap();
    let after = server::db::now_ms();

    let readers = sqlite.reader.sqlite().unwrap();
    let events: Vec<Event> = sql::query_as(EVENTS).fetch_all(readers).await.unwrap();
    assert_eq!(events.len(), 5, "four transitions of job 1 and a change of its attempt alone: {events:#?}");
    assert_eq!(events[1].4, Some(1), "a requeue keeps the worker that lost the attempt: {events:#?}");
    assert_eq!(events[3].5.as_deref(), Some("stopped early at step 10"), "{events:#?}");
    assert_eq!((events[4].1.as_deref(), events[4].3), (Some("cancelled"), 3), "{events:#?}");
    assert_eq!(
        events[4].5.as_deref(),
        Some("stopped early at step 10"),
        "the row's reason, not a new stop: {events:#?}"
    );
    assert_eq!(events, sqlx::query_as::<_, Event>(EVENTS).fetch_all(&opened.pool).await.unwrap());
    let jobs: Vec<(i64, String, Option<String>)> = sql::query_as(JOBS).fetch_all(readers).await.unwrap();
    assert_eq!(jobs, vec![(1, "cancelled".to_string(), Some("stopped early at step 10".to_string()))]);
    assert_eq!(jobs, sqlx::query_as::<_, (i64, String, Option<String>)>(JOBS).fetch_all(&opened.pool).await.unwrap());
    let counts: Vec<(String, i64)> = sql::query_as(&counts_sql(Engine::Sqlite)).fetch_all(readers).await.unwrap();
    assert_eq!(
        counts,
        [("cancelled", 1), ("failed", 1), ("queued", 0), ("running", 0)].map(|(s, n)| (s.to_string(), n))
    );
    let on_postgres = || async {
        sqlx::query_as::<_, (String, i64)>(&counts_sql(Engine::Postgres)).fetch_all(&opened.pool).await.unwrap()
    };
    assert_eq!(counts, on_postgres().await);
    // Folded into the count rows, the sums are the same and no move is left.
    let folded = server::db::sweeps::fold_count_moves(&opened.pool).await.unwrap();
    assert_eq!(folded, 12, "six transitions, each a move out of one status and into another");
    assert_eq!(counts, on_postgres().await);
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM sweep_count_moves").fetch_one(&opened.pool).await.unwrap();
    assert_eq!(left, 0);
    let kept: Vec<i64> = sql::query_scalar(CHECKPOINTS).fetch_all(readers).await.unwrap();
    assert_eq!(kept, vec![1], "a deleted job's checkpoint goes with it");
    assert_eq!(kept, sqlx::query_scalar::<_, i64>(CHECKPOINTS).fetch_all(&opened.pool).await.unwrap());
    for (first, last) in [
        sql::query_as::<(i64, i64)>(TIMES).fetch_one(readers).await.unwrap(),
        sqlx::query_as::<_, (i64, i64)>(TIMES).fetch_one(&opened.pool).await.unwrap(),
    ] {
        assert!(before <= first && last <= after, "transitions are stamped in Unix ms: {first}..{last}");
    }
    sqlite.close().await;
}

/// The last schema version before sweeps had owners (migrations/0011).
const BEFORE_OWNERS: i64 = 10;

/// Rows of a database from before owners: a sweep, its job, and three attempts' records, one with
/// half an hour of GPU time (stored at 02:00:00.123 on the first day of 1970), one saying
/// nothing of it, and one without GPUs that held its job slot for a minute (migration 0017).
const BEFORE_OWNERS_ROWS: &str = r#"
    INSERT INTO sweeps (id, name, form, source, job_count, created_at) VALUES (1, 'old', 'native', 'x', 1, 0);
    INSERT INTO jobs (id, sweep_id, idx, params, command, created_at) VALUES (1, 1, 0, '{}', 'true', 0);
    INSERT INTO results (job_id, attempt, path, manifest, record, params, metrics, stored_at) VALUES
        (1, 1, 'a', '[]', '{"gpu_usage":{"gpus":[0],"samples":1,"gpu_hours":0.5}}', '{}', '{}', 7200123),
        (1, 2, 'b', '[]', '{"outcome":"exited with code 0"}', '{}', '{}', 7200999),
        (1, 3, 'c', '[]', '{"started_at":7140000,"finished_at":7200000,"gpus":[]}', '{}', '{}', 7201000);
"#;

/// Then a sweep of user-a's. (GPU time is added by the server as records are stored, on both
/// backends alike: `owners::each_users_gpu_hours_are_counted...` in server/tests/api.)
const AFTER_OWNERS_ROWS: &str = "
    INSERT INTO sweeps (id, name, form, source, job_count, created_at, owner) VALUES (2, 'new', 'native', 'x', 1, 0, 'user-a');
";

const OWNERS: &str = "SELECT name, owner FROM sweeps ORDER BY id";
const USAGE: &str = "SELECT owner, hour_at, gpu_seconds, slot_seconds FROM user_gpu_usage ORDER BY owner";

#[tokio::test]
async fn a_database_from_before_owners_gives_its_sweeps_to_default_on_both_backends() {
    // SQLite: migrated by hand up to the version before owners, as an older build left it.
    let directory = tempfile::tempdir().unwrap();
    let migrator = sqlx::migrate!("../migrations");
    {
        let conn = rusqlite::Connection::open(directory.path().join("queue.db")).unwrap();
        conn.execute_batch(
            "CREATE TABLE _sqlx_migrations (version BIGINT PRIMARY KEY, description TEXT NOT NULL,
                 installed_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP, success BOOLEAN NOT NULL,
                 checksum BLOB NOT NULL, execution_time BIGINT NOT NULL)",
        )
        .unwrap();
        for migration in migrator.iter().filter(|migration| migration.version <= BEFORE_OWNERS) {
            conn.execute_batch(&migration.sql).unwrap();
            conn.execute(
                "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
                 VALUES (?1, ?2, TRUE, ?3, 1)",
                rusqlite::params![migration.version, &*migration.description, &*migration.checksum],
            )
            .unwrap();
        }
        conn.execute_batch(BEFORE_OWNERS_ROWS).unwrap();
    }
    let sqlite = server::db::Db::open(directory.path()).await.unwrap();
    sqlite.sqlite_connection().unwrap().unwrap().execute_batch(AFTER_OWNERS_ROWS).unwrap();
    let readers = sqlite.reader.sqlite().unwrap();
    let owners: Vec<(String, String)> = sql::query_as(OWNERS).fetch_all(readers).await.unwrap();
    let usage: Vec<(String, i64, f64, f64)> = sql::query_as(USAGE).fetch_all(readers).await.unwrap();

    // PostgreSQL: the same, by sqlx's migrator given the migrations before owners only.
    let pg = PgServer::start();
    let pool = PgPool::connect(&pg.url).await.unwrap();
    let mut before = sqlx::migrate!("../migrations-postgres");
    before.migrations =
        before.iter().filter(|migration| migration.version <= BEFORE_OWNERS).cloned().collect::<Vec<_>>().into();
    before.run(&pool).await.unwrap();
    sqlx::raw_sql(BEFORE_OWNERS_ROWS).execute(&pool).await.unwrap();
    let opened = postgres::open(&pg.url, 30_000).await.unwrap();
    assert!(!opened.created, "an existing database, migrated on");
    sqlx::raw_sql(AFTER_OWNERS_ROWS).execute(&opened.pool).await.unwrap();

    let expected_owners = [("old", "default"), ("new", "user-a")].map(|(name, owner)| (name.into(), owner.into()));
    assert_eq!(owners, expected_owners, "sweeps from before owners are the user default's");
    assert_eq!(owners, sqlx::query_as::<_, (String, String)>(OWNERS).fetch_all(&opened.pool).await.unwrap());
    // The records stored before counted once, as default's, in the hour they were stored in
    // (02:00): the GPU time, and the minute a job without GPUs held its slot; the record that
    // says neither counts nothing.
    assert_eq!(usage, [("default".to_string(), 7_200_000, 1800.0, 60.0)]);
    assert_eq!(usage, sqlx::query_as::<_, (String, i64, f64, f64)>(USAGE).fetch_all(&opened.pool).await.unwrap());
    sqlite.close().await;
}

#[tokio::test]
async fn replicas_opening_one_new_database_together_migrate_it_once() {
    let pg = PgServer::start();
    let (a, b, c) =
        tokio::join!(postgres::open(&pg.url, 30_000), postgres::open(&pg.url, 30_000), postgres::open(&pg.url, 30_000));
    let opened = [a.unwrap(), b.unwrap(), c.unwrap()];
    let made: Vec<bool> = opened.iter().map(|opened| opened.created).collect();
    assert_eq!(made.iter().filter(|created| **created).count(), 1, "one replica made the schema: {made:?}");
    let applied: Vec<i64> = sqlx::query_scalar("SELECT version FROM _sqlx_migrations ORDER BY version")
        .fetch_all(&opened[0].pool)
        .await
        .unwrap();
    let known: Vec<i64> = sqlx::migrate!("../migrations-postgres").iter().map(|migration| migration.version).collect();
    assert_eq!(applied, known, "each migration applied once");
    let instances: i64 =
        sqlx::query_scalar("SELECT count(*) FROM server_instance").fetch_one(&opened[0].pool).await.unwrap();
    assert_eq!(instances, 1, "one server identity, whichever replica made the schema");
    // Opening a database that is up to date changes nothing.
    let again = postgres::open(&pg.url, 30_000).await.unwrap();
    assert!(!again.created);
}

#[tokio::test]
async fn a_database_from_a_newer_build_is_refused_with_both_versions_and_left_as_it_was() {
    let pg = PgServer::start();
    let opened = postgres::open(&pg.url, 30_000).await.unwrap();
    let known = sqlx::migrate!("../migrations-postgres").iter().map(|migration| migration.version).max().unwrap();
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES ($1, 'from a newer build', true, '\\x00', 1)",
    )
    .bind(known + 5)
    .execute(&opened.pool)
    .await
    .unwrap();
    let refused = postgres::open(&pg.url, 30_000).await.unwrap_err().to_string();
    assert!(refused.contains(&format!("schema version {}", known + 5)), "{refused}");
    assert!(refused.contains(&format!("newer than this build's {known}")), "{refused}");
    assert!(refused.contains(&format!("127.0.0.1:{}", pg.port)), "the message names the server: {refused}");
    let recorded: i64 =
        sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations").fetch_one(&opened.pool).await.unwrap();
    assert_eq!(recorded, known + 1, "nothing was applied or removed");
    sqlx::query("DELETE FROM _sqlx_migrations WHERE version > $1").bind(known).execute(&opened.pool).await.unwrap();
    assert!(
        !postgres::open(&pg.url, 30_000).await.unwrap().created,
        "with the newer one gone, this build opens it again"
    );
}

#[tokio::test]
async fn an_unreachable_server_or_a_missing_database_is_named_with_its_cause() {
    let pg = PgServer::start();
    // A port nothing listens on.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let started = std::time::Instant::now();
    let refused = postgres::open(&format!("postgres://app:hunter2@127.0.0.1:{closed}/app"), 30_000)
        .await
        .unwrap_err()
        .to_string();
    assert!(started.elapsed() < std::time::Duration::from_secs(15), "no endless retry: {:?}", started.elapsed());
    assert!(refused.contains(&format!("PostgreSQL at 127.0.0.1:{closed}")), "{refused}");
    assert!(refused.to_lowercase().contains("refused"), "the cause: {refused}");
    assert!(!refused.contains("hunter2"), "never the password: {refused}");
    let missing =
        postgres::open(&format!("postgres://app@127.0.0.1:{}/nowhere", pg.port), 30_000).await.unwrap_err().to_string();
    assert!(missing.contains("database nowhere") && missing.contains("does not exist"), "{missing}");
    let wrong = postgres::open("mysql://app@127.0.0.1/app", 30_000).await.unwrap_err().to_string();
    assert!(wrong.contains("must start with postgres://"), "{wrong}");
}

#[tokio::test]
async fn two_transactions_moving_jobs_of_one_sweep_neither_wait_nor_deadlock() {
    let pg = PgServer::start();
    let opened = postgres::open(&pg.url, 30_000).await.unwrap();
    sqlx::raw_sql(
        "INSERT INTO sweeps (id, name, form, source, job_count, created_at) VALUES (1, 's', 'native', 'x', 3, 0);
         INSERT INTO jobs (id, sweep_id, idx, params, command, created_at, status, attempt)
             VALUES (1, 1, 0, '{}', 'true', 0, 'running', 1), (2, 1, 1, '{}', 'true', 0, 'queued', 0),
                    (3, 1, 2, '{}', 'true', 0, 'queued', 0);
         INSERT INTO sweep_counts (sweep_id, status, jobs) VALUES (1, 'queued', 2), (1, 'running', 1), (1, 'succeeded', 0);",
    )
    .execute(&opened.pool)
    .await
    .unwrap();
    // A finish with its claim (running -> succeeded, then queued -> running) against a plain
    // claim (queued -> running), over the same sweep's counts: with count rows locked per
    // transition, the claim waited for the finish's end (or, locked in the other order, they
    // deadlocked). Counted as moves, the claim commits while the finish is still open.
    let mut finish = opened.pool.begin().await.unwrap();
    sqlx::query("UPDATE jobs SET status = 'succeeded' WHERE id = 1").execute(&mut *finish).await.unwrap();
    let mut claim = opened.pool.begin().await.unwrap();
    let claimed = sqlx::query("UPDATE jobs SET status = 'running', attempt = 1 WHERE id = 3").execute(&mut *claim);
    tokio::time::timeout(std::time::Duration::from_secs(10), claimed)
        .await
        .expect("the claim did not wait for the open finish")
        .unwrap();
    claim.commit().await.unwrap();
    sqlx::query("UPDATE jobs SET status = 'running', attempt = 1 WHERE id = 2").execute(&mut *finish).await.unwrap();
    finish.commit().await.unwrap();
    let counts: Vec<(String, i64)> =
        sqlx::query_as(&counts_sql(Engine::Postgres)).fetch_all(&opened.pool).await.unwrap();
    assert_eq!(counts, [("queued", 0), ("running", 2), ("succeeded", 1)].map(|(s, n)| (s.to_string(), n)));
}

#[tokio::test]
async fn a_statement_with_numbered_parameters_is_one_text_for_both_backends() {
    // The port's premise (decision 0056): `db::sql` binds `$N` by its number on SQLite as sqlx
    // does on PostgreSQL, whatever order and however often they appear.
    let pg = PgServer::start();
    let opened = postgres::open(&pg.url, 30_000).await.unwrap();
    let directory = tempfile::tempdir().unwrap();
    let sqlite = server::db::Db::open(directory.path()).await.unwrap();
    let sql = "INSERT INTO sweeps (name, form, source, job_count, created_at)
               VALUES ($2, 'native', $2 || '.yaml', $1, $1 * 1000) RETURNING id, name, source, job_count, created_at";
    type Row = (i64, String, String, i64, i64);
    let mut conn = sqlite.sqlite_connection().unwrap().unwrap();
    let on_sqlite: Row = sql::query_as(sql).bind(3i64).bind("s").fetch_one(&mut conn).await.unwrap();
    let on_postgres: Row = sql::query_as(sql).bind(3i64).bind("s").fetch_one(&opened.pool).await.unwrap();
    assert_eq!(on_sqlite, (1, "s".to_string(), "s.yaml".to_string(), 3, 3000));
    assert_eq!(on_postgres, on_sqlite);
    sqlite.close().await;
}

/// Three queued jobs of one sweep, none of which needs a GPU.
const QUEUED: &str = "
    INSERT INTO sweeps (name, form, source, job_count, created_at) VALUES ('s', 'native', 'x', 3, 0);
    INSERT INTO jobs (sweep_id, idx, params, command, priority, created_at)
        VALUES (1, 0, '{}', 'true', 0, 0), (1, 1, '{}', 'true', 5, 0), (1, 2, '{}', 'true', 0, 0);
    INSERT INTO sweep_counts (sweep_id, status, jobs) VALUES (1, 'queued', 3);
    INSERT INTO workers (name, capacity, registered_at, last_seen_at) VALUES ('a', '{}', 0, 0), ('b', '{}', 0, 0);
";

fn plain(worker: i64, slots: u32) -> server::db::claims::PlainClaim {
    server::db::claims::PlainClaim {
        worker_id: shared::api::WorkerId::new(worker),
        slots,
        trainer: false,
        lease_until: 10,
        now: 1,
    }
}

#[tokio::test]
async fn a_plain_claim_takes_its_slots_in_dispatch_order_and_two_at_once_never_take_one_job_twice() {
    let pg = PgServer::start();
    let opened = postgres::open(&pg.url, 30_000).await.unwrap();
    sqlx::raw_sql(QUEUED).execute(&opened.pool).await.unwrap();
    let ids = |rows: &[server::db::claims::ClaimedRow]| rows.iter().map(|row| row.id.get()).collect::<Vec<_>>();
    // One transaction holds the job it claimed while another claims: the second skips it
    // (SKIP LOCKED), takes the next in dispatch order and commits without waiting for the first
    // (the counts are moves, not rows both would lock).
    let mut first = opened.pool.begin().await.unwrap();
    let claimed = server::db::claims::claim(&mut *first, plain(1, 1)).await.unwrap();
    assert_eq!(ids(&claimed), [2], "one slot, the job of the highest priority");
    let pool = opened.pool.clone();
    let second = tokio::spawn(async move {
        let mut second = pool.begin().await.unwrap();
        let rows = server::db::claims::claim(&mut *second, plain(2, 1)).await.unwrap();
        second.commit().await.unwrap();
        rows
    });
    let other = tokio::time::timeout(std::time::Duration::from_secs(10), second)
        .await
        .expect("the second claim did not wait for the first")
        .unwrap();
    assert_eq!(ids(&other), [1], "the next job, not the one the first claim held");
    first.commit().await.unwrap();
    let rest = server::db::claims::claim(&mut *opened.pool.acquire().await.unwrap(), plain(1, 5)).await.unwrap();
    assert_eq!(ids(&rest), [3], "what is left, and no more");
    let running: Vec<(i64, i64)> =
        sqlx::query_as("SELECT id, worker_id FROM jobs WHERE status = 'running' ORDER BY id")
            .fetch_all(&opened.pool)
            .await
            .unwrap();
    assert_eq!(running, [(1, 2), (2, 1), (3, 1)]);
}

/// Starts a server on `url` with `data_dir` and stops it once it serves; its start-up error
/// otherwise.
async fn start_and_stop(url: &str, data_dir: &std::path::Path) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = server::ServerConfig {
        data_dir: data_dir.to_path_buf(),
        database_url: Some(url.to_string()),
        ..server::ServerConfig::default()
    };
    server::run(listener, config, async {}).await
}

#[tokio::test]
async fn a_replica_whose_data_directory_is_not_the_shared_one_is_refused_naming_both() {
    let pg = PgServer::start();
    let (shared, own) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    start_and_stop(&pg.url, shared.path()).await.expect("the first server makes the database and marks its directory");
    let refused = start_and_stop(&pg.url, own.path()).await.expect_err("a directory of its own is refused").to_string();
    assert!(refused.contains(&own.path().display().to_string()), "{refused}");
    assert!(refused.contains("is not the one the servers of PostgreSQL at 127.0.0.1"), "{refused}");
    assert!(refused.contains(".app-instance"), "{refused}");
    assert_eq!(std::fs::read_dir(own.path()).unwrap().count(), 0, "nothing was written into it");
    start_and_stop(&pg.url, shared.path()).await.expect("the shared directory serves again");
}

/// Replicas started together on a new database: the one that did not make it may look for the
/// shared directory's marker before its maker wrote it (the replicas test's second server was
/// refused so, now and then). It waits for the mark while the database is new.
#[tokio::test]
async fn a_replica_started_with_the_one_making_the_database_waits_for_its_mark() {
    let pg = PgServer::start();
    let shared = tempfile::tempdir().unwrap();
    start_and_stop(&pg.url, shared.path()).await.expect("the first server makes the database and marks its directory");
    // As the second replica sees it in the race: the database made, the mark not yet written.
    let marker = shared.path().join(".app-instance");
    let mark = std::fs::read(&marker).unwrap();
    std::fs::remove_file(&marker).unwrap();
    let started = std::time::Instant::now();
    let second = tokio::spawn({
        let (url, dir) = (pg.url.clone(), shared.path().to_path_buf());
        async move { start_and_stop(&url, &dir).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    assert!(!second.is_finished(), "the second replica waits for the mark");
    std::fs::write(&marker, &mark).unwrap();
    second.await.unwrap().expect("it starts once the maker marked the directory");
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
    // Past the grace, a missing mark is refused (as on a directory of its own), and waits no more.
    std::fs::remove_file(&marker).unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
    let started = std::time::Instant::now();
    let refused = start_and_stop(&pg.url, shared.path()).await.expect_err("an old database's unmarked directory");
    assert!(refused.to_string().contains("is not the one the servers of PostgreSQL"), "{refused}");
    assert!(started.elapsed() < std::time::Duration::from_secs(3), "refused at once: {:?}", started.elapsed());
}

/// A server replica on `url` serving `data_dir` on a loopback port, stopped when dropped.
struct Replica {
    client: client::Client,
    address: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

impl Replica {
    async fn start(url: &str, data_dir: &std::path::Path) -> Replica {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = format!("http://{}", listener.local_addr().unwrap());
        let config = server::ServerConfig {
            data_dir: data_dir.to_path_buf(),
            database_url: Some(url.to_string()),
            reaper_interval: std::time::Duration::from_millis(100),
            ..server::ServerConfig::default()
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(server::run(listener, config, async move {
            let _ = stopped.await;
        }));
        let client = client::Client::with_options(&address, &client::ClientOptions::default()).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while client.health().await.is_err() {
            assert!(std::time::Instant::now() < deadline, "the replica never answered");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        Replica { client, address, stop: Some(stop), task: Some(task) }
    }

    async fn stop(mut self) {
        let _ = self.stop.take().map(|stop| stop.send(()));
        if let Some(task) = self.task.take() {
            task.await.unwrap().unwrap();
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.stop.take().map(|stop| stop.send(()));
    }
}

/// Registers worker `w` with `job_slots` CPU slots; its id.
async fn register(client: &client::Client, job_slots: u32) -> shared::api::WorkerId {
    let request = shared::api::RegisterRequest {
        name: "w".into(),
        protocol: shared::PROTOCOL_VERSION,
        key: None,
        capacity: cpu(job_slots),
        holding: Vec::new(),
    };
    client.register(&request).await.unwrap().worker_id
}

fn cpu(job_slots: u32) -> shared::placement::Capacity {
    shared::placement::Capacity { job_slots, gpus: Vec::new(), ..shared::placement::Capacity::default() }
}

/// A CA and a certificate it signed for 127.0.0.1, as PEM: (certificate, key, CA).
fn certificates() -> (String, String, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "app test database CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert =
        rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap().signed_by(&key, &ca, &ca_key).unwrap();
    (cert.pem(), key.serialize_pem(), ca.pem())
}

/// Whether the pool's connection is encrypted, as the server sees it.
async fn over_tls(pool: &PgPool) -> bool {
    sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetch_one(pool).await.unwrap()
}

/// A database reached over TLS, as a managed PostgreSQL asks: `sslmode=require` encrypts,
/// `verify-full` with `sslrootcert` also checks the server's certificate against that CA, and
/// `verify-full` without it is refused with a reason naming the certificate (the public roots
/// do not know a private CA), before any table is made.
#[tokio::test]
async fn a_database_is_reached_over_tls_and_its_certificate_checked_when_asked() {
    let (cert, key, ca) = certificates();
    let pg = PgServer::start_with_tls(&cert, &key);
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca).unwrap();
    let plain = postgres::open(&format!("{}?sslmode=disable", pg.url), 30_000).await.unwrap();
    assert!(!over_tls(&plain.pool).await, "sslmode=disable stays in the clear");
    let required = postgres::open(&format!("{}?sslmode=require", pg.url), 30_000).await.unwrap();
    assert!(over_tls(&required.pool).await);
    let verified = postgres::open(&format!("{}?sslmode=verify-full&sslrootcert={}", pg.url, ca_file.display()), 30_000)
        .await
        .unwrap();
    assert!(over_tls(&verified.pool).await);
    let Err(refused) = postgres::open(&format!("{}?sslmode=verify-full", pg.url), 30_000).await else {
        panic!("a server certificate of an unknown CA is accepted");
    };
    let message = format!("{refused:#}");
    assert!(message.contains("127.0.0.1") && message.to_lowercase().contains("certificate"), "{message}");
}

/// `/api/ready` is a readiness probe: it answers 200 while the database answers and 503,
/// naming the database, once PostgreSQL is gone, while `/api/health` (liveness) stays 200: a
/// replica whose database is down is taken out of rotation, not restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_follows_the_database_and_health_follows_the_process() {
    let pg = PgServer::start();
    let shared = tempfile::tempdir().unwrap();
    let replica = Replica::start(&pg.url, shared.path()).await;
    let http = reqwest::Client::new();
    let get = |path: &str| {
        let (http, url) = (http.clone(), format!("{}{path}", replica.address));
        async move {
            let response = http.get(url).send().await.unwrap();
            (response.status().as_u16(), response.json::<shared::api::Health>().await.unwrap().status)
        }
    };
    assert_eq!(get("/api/ready").await, (200, "ok".to_string()));
    drop(pg); // PostgreSQL's fast shutdown
    let (status, said) = get("/api/ready").await;
    assert_eq!(status, 503, "{said}");
    assert!(said.contains("database"), "{said}");
    assert_eq!(get("/api/health").await, (200, "ok".to_string()));
    drop(replica);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_waiting_on_one_replica_wakes_for_a_sweep_submitted_on_another() {
    let pg = PgServer::start();
    let shared = tempfile::tempdir().unwrap();
    let a = Replica::start(&pg.url, shared.path()).await;
    let b = Replica::start(&pg.url, shared.path()).await;
    let worker = register(&b.client, 1).await;
    // Long enough that only a wake-up from the other replica can end it in time.
    let claim = shared::api::ClaimRequest { capacity: cpu(1), wait_ms: 20_000, reserve: 0 };
    let claiming = {
        let client = b.client.clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let jobs = client.claim(worker, &claim).await.unwrap().jobs;
            (jobs, started.elapsed())
        })
    };
    // The claim is parked on B before anything is submitted (it found nothing).
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!claiming.is_finished(), "nothing to claim yet");
    a.client.submit("name: across\ncommand: 'true'\n", &shared::api::SubmitQuery::default()).await.unwrap();
    let (jobs, waited) =
        tokio::time::timeout(std::time::Duration::from_secs(10), claiming).await.expect("woken").unwrap();
    assert_eq!(jobs.len(), 1, "the job submitted on the other replica");
    assert!(waited < std::time::Duration::from_secs(10), "woken, not timed out: {waited:?}");
    // Either replica reads it as running on the worker.
    let on_a = a.client.sweep("across").await.unwrap();
    assert_eq!(on_a.info.counts.running, 1, "{on_a:?}");
    a.stop().await;
    b.stop().await;
}

#[tokio::test]
async fn one_replica_reaps_at_a_time_and_another_takes_over_when_it_goes() {
    let pg = PgServer::start();
    let opened = postgres::open(&pg.url, 30_000).await.unwrap();
    let mut first = postgres::Leadership::new(opened.pool.clone());
    let mut second = postgres::Leadership::new(opened.pool.clone());
    assert!(first.lead().await, "the first to try leads");
    assert!(!second.lead().await, "one leader at a time");
    assert!(first.lead().await, "and it keeps leading");
    assert!(!second.lead().await);
    drop(first); // its connection closes, as when its process dies
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !second.lead().await {
        assert!(std::time::Instant::now() < deadline, "nobody took over");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adaptive_sweep_submitted_on_one_replica_gets_runs_claimed_on_another() {
    let pg = PgServer::start();
    let shared = tempfile::tempdir().unwrap();
    let a = Replica::start(&pg.url, shared.path()).await;
    let b = Replica::start(&pg.url, shared.path()).await;
    let worker = register(&b.client, 2).await;
    let claim = shared::api::ClaimRequest { capacity: cpu(2), wait_ms: 0, reserve: 0 };
    // B looks once and finds no adaptive sweep open (the hint B keeps goes off).
    assert!(b.client.claim(worker, &claim).await.unwrap().jobs.is_empty());
    let yaml = "name: adaptive\nmethod: random\nparameters: {x: {values: [1, 2, 3]}}\ncommand: 'true'\n";
    a.client.submit(yaml, &shared::api::SubmitQuery::default()).await.unwrap();
    // Its change reaches B by notification: B's next claims propose runs.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let jobs = loop {
        let jobs = b.client.claim(worker, &claim).await.unwrap().jobs;
        if !jobs.is_empty() {
            break jobs;
        }
        assert!(std::time::Instant::now() < deadline, "replica B never proposed a run of the sweep submitted on A");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert!(jobs.iter().all(|job| job.sweep == "adaptive"), "{jobs:?}");
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_replaced_on_one_replica_is_refused_on_another_within_its_time_to_live() {
    let pg = PgServer::start();
    let shared = tempfile::tempdir().unwrap();
    let a = Replica::start(&pg.url, shared.path()).await;
    let b = Replica::start(&pg.url, shared.path()).await;
    let request = shared::api::RegisterRequest {
        name: "w".into(),
        protocol: shared::PROTOCOL_VERSION,
        key: None,
        capacity: cpu(1),
        holding: Vec::new(),
    };
    let first = a.client.register(&request).await.unwrap();
    let old = b.client.with_session(&first).unwrap();
    let heartbeat = shared::api::HeartbeatRequest::default();
    old.heartbeat(first.worker_id, &heartbeat).await.expect("B reads the session A made, and keeps it");
    // The worker registers again on A (a restart): a new secret replaces the old one.
    let second = a.client.register(&request).await.unwrap();
    assert_eq!(second.worker_id, first.worker_id);
    let new = b.client.with_session(&second).unwrap();
    new.heartbeat(second.worker_id, &heartbeat).await.expect("the new session is good on B at once");
    // B trusted the old digest for a while; once its time is up, the old secret is refused.
    let started = std::time::Instant::now();
    loop {
        match old.heartbeat(first.worker_id, &heartbeat).await {
            Ok(_) => {
                let waited = started.elapsed();
                assert!(
                    waited < server::queue::SHARED_SESSION_TTL + std::time::Duration::from_secs(5),
                    "the replaced session still works on B after {waited:?}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(error) => {
                assert_eq!(error.status(), Some(401), "{error}");
                break;
            }
        }
    }
    a.stop().await;
    b.stop().await;
}

/// The value of the counter line starting with `name` in `/metrics` of `replica`.
async fn counter(replica: &Replica, name: &str) -> f64 {
    let text = reqwest::get(format!("{}/metrics", replica.address)).await.unwrap().text().await.unwrap();
    let line = text.lines().find(|line| line.starts_with(name)).unwrap_or_else(|| panic!("no {name} in {text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bare_finishes_on_postgres_go_as_set_statements_and_each_claims_its_own_next_job() {
    let pg = PgServer::start();
    let shared = tempfile::tempdir().unwrap();
    let a = Replica::start(&pg.url, shared.path()).await;
    let values = (0..60).map(|i| i.to_string()).collect::<Vec<_>>().join(", ");
    let yaml = format!("name: bulk\ncommand: 'true'\ngrid:\n  i: [{values}]\n");
    a.client.submit(&yaml, &shared::api::SubmitQuery::default()).await.unwrap();
    let claim = shared::api::ClaimRequest { capacity: cpu(1), wait_ms: 0, reserve: 0 };
    let mut workers = Vec::new();
    for number in 0..16 {
        let request = shared::api::RegisterRequest {
            name: format!("w{number}"),
            protocol: shared::PROTOCOL_VERSION,
            key: None,
            capacity: cpu(1),
            holding: Vec::new(),
        };
        let registered = a.client.register(&request).await.unwrap();
        let client = a.client.with_session(&registered).unwrap();
        let jobs = client.claim(registered.worker_id, &claim).await.unwrap().jobs;
        assert_eq!(jobs.len(), 1);
        workers.push((client, registered.worker_id, jobs[0].clone()));
    }
    let finish = |job: &shared::api::ClaimedJob, attempt: u32| shared::api::FinishRequest {
        job_id: job.id,
        attempt,
        outcome: shared::job::Outcome::Exited { code: 0 },
        log: None,
        metrics: None,
        result: Some(shared::api::InlineResult {
            files: Vec::new(),
            streamed: Vec::new(),
            record: shared::api::AttemptRecord::default(),
        }),
        notes: Vec::new(),
        claim: Some(claim.clone()),
    };
    let mut finished = std::collections::BTreeSet::new();
    for round in 0..2 {
        // Every worker finishes at once, each asking for its next job; one stale finish (of an
        // attempt its job never had) goes with them.
        let stale = {
            let (client, worker, job) = &workers[0];
            let (client, worker, request) = (client.clone(), *worker, finish(job, job.attempt + 1));
            tokio::spawn(async move { client.finish(worker, &request).await })
        };
        let mut sent = Vec::new();
        for (client, worker, job) in &workers {
            let (client, worker, request) = (client.clone(), *worker, finish(job, job.attempt));
            sent.push(tokio::spawn(async move { client.finish(worker, &request).await }));
        }
        let error = stale.await.unwrap().unwrap_err();
        assert_eq!(error.status(), Some(409), "round {round}: {error}");
        for ((_, _, job), answer) in workers.iter_mut().zip(sent) {
            let answer = answer.await.unwrap().unwrap();
            assert_eq!(answer.status, shared::job::JobStatus::Succeeded, "round {round}");
            assert!(finished.insert(job.id), "job {} finished twice", job.id);
            assert_eq!(answer.jobs.len(), 1, "round {round}: each finish claims the worker's next job");
            *job = answer.jobs[0].clone();
        }
        let next: std::collections::BTreeSet<_> = workers.iter().map(|(_, _, job)| job.id).collect();
        assert_eq!(next.len(), workers.len(), "round {round}: no job handed to two workers");
        assert!(next.is_disjoint(&finished), "round {round}: a finished job handed out again");
    }
    // Once the sweep's settings are cached (its first finishes), bare finishes take the bulk
    // lane: at least the whole second round did.
    let fast = counter(&a, "app_finishes_total{path=\"fast\"}").await;
    assert!(fast >= 16.0, "{fast} finishes in the bulk lane");
    let sweep = a.client.sweep("bulk").await.unwrap();
    assert_eq!((sweep.info.counts.succeeded, sweep.info.counts.running, sweep.info.counts.queued), (32, 16, 12));
    for (_, worker, job) in &workers {
        let stored = a.client.job(job.id).await.unwrap();
        assert_eq!(
            (stored.status, stored.worker_id, stored.attempt),
            (shared::job::JobStatus::Running, Some(*worker), job.attempt)
        );
    }
    for job in &finished {
        let versions = a.client.results(*job).await.unwrap();
        assert_eq!(versions.len(), 1, "job {job}: its record stored once");
    }
    a.stop().await;
}

#[tokio::test]
async fn a_bulk_finish_applies_only_as_its_unit_saw_the_job_and_stores_a_record_only_with_its_finish() {
    bulk_finishes(true).await;
}

#[tokio::test]
async fn bulk_finishes_in_a_transaction_of_several_statements_do_the_same() {
    bulk_finishes(false).await;
}

#[tokio::test]
async fn the_one_statement_group_has_a_generic_plan_that_never_scans_every_job() {
    let pg = PgServer::start();
    let opened = postgres::open(&pg.url, 30_000).await.unwrap();
    // Enough queued jobs, with statistics, that a scan of them all would be planned if any
    // estimate allowed it (a parameter LIMIT is taken as a tenth of them).
    sqlx::raw_sql(
        "INSERT INTO sweeps (id, name, form, source, job_count, created_at) VALUES (1, 's', 'native', 'x', 20000, 0);
         INSERT INTO jobs (sweep_id, idx, params, command, created_at, status, attempt, needs_trainer)
             SELECT 1, i, '{}', 'true', 0, 'queued', 0, 0 FROM generate_series(0, 19999) AS i;
         ANALYZE jobs;",
    )
    .execute(&opened.pool)
    .await
    .unwrap();
    let mut lane = server::db::postgres::steps::open_lane(&opened.pool).await.unwrap();
    sqlx::raw_sql(&format!("PREPARE at_once AS {}", server::db::postgres::steps::at_once_sql()))
        .execute(&mut lane)
        .await
        .unwrap();
    let nulls = vec!["NULL"; 27].join(", ");
    let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN (COSTS OFF) EXECUTE at_once({nulls})"))
        .fetch_all(&mut lane)
        .await
        .unwrap();
    let plan = plan.join("\n");
    assert!(!plan.contains("Seq Scan on jobs"), "a scan of every job:\n{plan}");
    assert!(plan.contains("jobs_queue"), "the queued jobs are picked through their index:\n{plan}");
    // The slots and the ranks of the jobs picked are made once, not again for each row joined.
    for cte in ["CTE Scan on slots", "CTE Scan on ranked"] {
        assert!(plan.contains(cte), "no {cte}:\n{plan}");
    }
}

/// A group of three finishes, as one statement (`at_once`) or as several in a transaction.
async fn bulk_finishes(at_once: bool) {
    use server::db::claims::Step;
    use shared::api::{JobId, SweepId, WorkerId};
    use shared::job::{Finish, JobStatus};
    let pg = PgServer::start();
    let opened = postgres::open(&pg.url, 30_000).await.unwrap();
    sqlx::raw_sql(
        "INSERT INTO sweeps (id, name, form, source, job_count, created_at) VALUES (1, 's', 'native', 'x', 4, 0);
         INSERT INTO workers (id, name, capacity, registered_at, last_seen_at) VALUES (1, 'w', '{}', 0, 0);
         INSERT INTO jobs (id, sweep_id, idx, params, command, created_at, status, attempt, worker_id, needs_trainer)
             VALUES (1, 1, 0, '{}', 'true', 0, 'running', 1, 1, 0), (2, 1, 1, '{}', 'true', 0, 'running', 1, 1, 0),
                    (3, 1, 2, '{}', 'true', 0, 'queued', 0, NULL, 0), (4, 1, 3, '{}', 'true', 0, 'queued', 0, NULL, 1);
         INSERT INTO sweep_counts (sweep_id, status, jobs) VALUES (1, 'queued', 2), (1, 'running', 2);
         INSERT INTO job_metric_summaries (job_id, name, attempt, last_value, min_value, max_value, point_count)
             VALUES (2, 'loss', 1, 0.5, 0.5, 0.5, 1);",
    )
    .execute(&opened.pool)
    .await
    .unwrap();
    let seen = |id: i64| server::db::jobs::JobState {
        id: JobId::new(id),
        sweep_id: SweepId::new(1),
        status: JobStatus::Running,
        attempt: 1,
        worker_id: Some(WorkerId::new(1)),
        retries_left: 0,
        crash_count: 0,
        cancel_requested: false,
    };
    let version = |id: i64| shared::api::ResultVersion {
        job_id: JobId::new(id),
        attempt: 1,
        path: format!("s/{id}/v1"),
        files: Vec::new(),
        record: shared::api::AttemptRecord::default(),
        params: serde_json::json!({}),
        metrics: Default::default(),
        stored_at: 7,
    };
    let step = |id: i64| Step {
        seen: seen(id),
        worker_id: WorkerId::new(1),
        decision: Finish { status: JobStatus::Succeeded, retries_left: 0, exit_code: Some(0), reason: None },
        now: 5,
        version: Some(version(id)),
        claim: Some(plain(1, 2)),
    };
    // Job 1 as its unit saw it; job 2 has metric summaries its record was made without; job 3
    // is not running at all.
    let steps = [step(1), step(2), step(3)];
    let steps: Vec<&Step> = steps.iter().collect();
    assert!(server::db::postgres::steps::fits_one_statement(&steps), "the claims all ask without the trainer");
    let mut with_trainer = step(9);
    with_trainer.claim = Some(server::db::claims::PlainClaim { trainer: true, ..plain(1, 1) });
    let mixed = [steps[0], &with_trainer];
    assert!(!server::db::postgres::steps::fits_one_statement(&mixed), "a claim with the trainer and one without");
    let done = match at_once {
        true => {
            // On the writer's lane: planned generic, as the writer runs it.
            let mut conn = server::db::postgres::steps::open_lane(&opened.pool).await.unwrap();
            server::db::postgres::steps::finish_and_claim_at_once(&mut conn, &steps).await.unwrap()
        }
        false => {
            let mut conn = opened.pool.begin().await.unwrap();
            let done = server::db::postgres::steps::finish_and_claim(&mut conn, &steps).await.unwrap();
            conn.commit().await.unwrap();
            done
        }
    };
    let seen_done: Vec<(bool, bool, Vec<i64>)> = done
        .iter()
        .map(|done| (done.applied, done.stored, done.claimed.iter().map(|row| row.id.get()).collect()))
        .collect();
    assert_eq!(
        seen_done,
        [(true, true, vec![3]), (false, false, vec![]), (false, false, vec![])],
        "only job 1's finish applies, with its record, and its claim takes the one job without the trainer"
    );
    let jobs: Vec<(i64, String)> =
        sqlx::query_as("SELECT id, status FROM jobs ORDER BY id").fetch_all(&opened.pool).await.unwrap();
    assert_eq!(
        jobs,
        [(1, "succeeded"), (2, "running"), (3, "running"), (4, "queued")].map(|(id, s)| (id, s.to_string()))
    );
    let stored: Vec<i64> = sqlx::query_scalar("SELECT job_id FROM results").fetch_all(&opened.pool).await.unwrap();
    assert_eq!(stored, [1]);
    // Both transitions recorded once, the finish's and the claim's, though one statement made both.
    let events: Vec<(i64, String, String, i64)> =
        sqlx::query_as("SELECT job_id, from_status, to_status, attempt FROM job_events ORDER BY job_id")
            .fetch_all(&opened.pool)
            .await
            .unwrap();
    assert_eq!(
        events,
        [(1, "running", "succeeded", 1), (3, "queued", "running", 1)].map(|(id, from, to, attempt)| (
            id,
            from.to_string(),
            to.to_string(),
            attempt
        ))
    );
    let counts: Vec<(String, i64)> =
        sqlx::query_as(&counts_sql(Engine::Postgres)).fetch_all(&opened.pool).await.unwrap();
    assert_eq!(counts, [("queued", 1), ("running", 2), ("succeeded", 1)].map(|(s, n)| (s.to_string(), n)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_turned_read_only_is_a_503_saying_so_and_the_replica_keeps_serving() {
    let pg = PgServer::start();
    let shared = tempfile::tempdir().unwrap();
    let a = Replica::start(&pg.url, shared.path()).await;
    let queue_db: sqlx::postgres::PgConnectOptions = pg.url.parse().unwrap();
    let database = queue_db.get_database().unwrap().to_string();
    // From another database of the server: what is done to the queue's does not reach it.
    let admin = PgPool::connect_with(queue_db.database("postgres")).await.unwrap();
    // Every connection from now on starts read-only (as on a standby); the replica's open ones
    // are ended, so it reconnects into that.
    let turn = |on: bool| {
        let (admin, database) = (admin.clone(), database.clone());
        async move {
            sqlx::query(&format!("ALTER DATABASE \"{database}\" SET default_transaction_read_only = {on}"))
                .execute(&admin)
                .await
                .unwrap();
            sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1")
                .bind(&database)
                .execute(&admin)
                .await
                .unwrap();
        }
    };
    turn(true).await;
    let query = shared::api::SubmitQuery::default();
    let submit = || a.client.submit("name: ro\ncommand: 'true'\n", &query);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let error = loop {
        let error = submit().await.expect_err("nothing can be written");
        // The first request after the connections ended may meet one of them closing.
        if error.to_string().contains("read-only") || std::time::Instant::now() > deadline {
            break error;
        }
    };
    assert_eq!(error.status(), Some(503), "{error}");
    assert!(error.to_string().contains("read-only"), "{error}");
    a.client.sweeps().await.expect("reads are still served");
    turn(false).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while submit().await.is_err() {
        assert!(std::time::Instant::now() < deadline, "writes never came back");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(a.client.sweep("ro").await.unwrap().info.counts.queued, 1, "the write after it, once, complete");
    admin.close().await;
    a.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metrics_batch_sent_to_two_replicas_at_once_is_stored_once() {
    let pg = PgServer::start();
    let shared = tempfile::tempdir().unwrap();
    let a = Replica::start(&pg.url, shared.path()).await;
    let b = Replica::start(&pg.url, shared.path()).await;
    a.client.submit("name: curves\ncommand: 'true'\n", &shared::api::SubmitQuery::default()).await.unwrap();
    let registered = a
        .client
        .register(&shared::api::RegisterRequest {
            name: "w".into(),
            protocol: shared::PROTOCOL_VERSION,
            key: None,
            capacity: cpu(1),
            holding: Vec::new(),
        })
        .await
        .unwrap();
    let (on_a, on_b) = (a.client.with_session(&registered).unwrap(), b.client.with_session(&registered).unwrap());
    let claim = shared::api::ClaimRequest { capacity: cpu(1), wait_ms: 0, reserve: 0 };
    let job = on_a.claim(registered.worker_id, &claim).await.unwrap().jobs.remove(0);
    // A worker that got no answer sends its batch again, here to the other replica while the
    // first is still being written: the offset makes the second one a no-op.
    let batches = 30;
    for offset in 1..=batches {
        let batch = shared::api::MetricsBatch {
            worker_id: registered.worker_id,
            attempt: job.attempt,
            offset,
            points: vec![shared::api::MetricPoint { step: Some(offset as i64), name: "loss".into(), value: 0.5 }],
        };
        let (first, second) = tokio::join!(on_a.send_metrics(job.id, &batch), on_b.send_metrics(job.id, &batch));
        assert_eq!((first.unwrap().offset, second.unwrap().offset), (offset, offset));
    }
    let series = a.client.metrics(job.id).await.unwrap();
    let points: usize = series.iter().map(|series| series.values.len()).sum();
    assert_eq!(points, batches as usize, "each batch's point once");
    a.stop().await;
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_starting_beside_a_running_one_leaves_the_leases_and_a_first_start_extends_them() {
    let pg = PgServer::start();
    let shared = tempfile::tempdir().unwrap();
    let admin = PgPool::connect(&pg.url).await.unwrap();
    let a = Replica::start(&pg.url, shared.path()).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !postgres::reaper_is_led(&admin).await.unwrap() {
        assert!(std::time::Instant::now() < deadline, "the first replica never took the reaper's lock");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    a.client.submit("name: leased\ncommand: 'true'\n", &shared::api::SubmitQuery::default()).await.unwrap();
    let worker = register(&a.client, 1).await;
    let claim = shared::api::ClaimRequest { capacity: cpu(1), wait_ms: 0, reserve: 0 };
    assert_eq!(a.client.claim(worker, &claim).await.unwrap().jobs.len(), 1);
    let lease = || async {
        sqlx::query_scalar::<_, i64>("SELECT lease_expires_at FROM jobs WHERE status = 'running'")
            .fetch_one(&admin)
            .await
            .unwrap()
    };
    let claimed = lease().await;
    let b = Replica::start(&pg.url, shared.path()).await;
    assert_eq!(lease().await, claimed, "a second replica's start extends nothing");
    b.stop().await;
    a.stop().await;
    // Nobody serves the database now: a start gives the workers a lease to come back.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let c = Replica::start(&pg.url, shared.path()).await;
    assert!(lease().await > claimed, "the first start after all stopped extends the leases");
    c.stop().await;
    admin.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_jobs_checkpoints_are_placed_by_one_replica_at_a_time() {
    use server::db::postgres::lock_checkpoints;
    use shared::api::JobId;
    use std::time::Duration;
    let pg = PgServer::start();
    let a = postgres::open(&pg.url, 30_000).await.unwrap();
    let b = postgres::open(&pg.url, 30_000).await.unwrap();
    let held = lock_checkpoints(&a.pool, JobId::new(7)).await.unwrap();
    let other_job = tokio::time::timeout(Duration::from_secs(10), lock_checkpoints(&b.pool, JobId::new(8)))
        .await
        .expect("another job's checkpoints are not held up")
        .unwrap();
    other_job.rollback().await.unwrap();
    let pool = b.pool.clone();
    let waiting = tokio::spawn(async move { lock_checkpoints(&pool, JobId::new(7)).await.map(drop) });
    // The other replica waits for the lock (PostgreSQL shows it waiting), and goes on once the
    // first lets go.
    let waiting_seen = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted";
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while sqlx::query_scalar::<_, i64>(waiting_seen).fetch_one(&a.pool).await.unwrap() == 0 {
        assert!(std::time::Instant::now() < deadline, "the second replica never waited for the lock");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!waiting.is_finished(), "taken while the first replica holds it");
    held.rollback().await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("taken once the first replica let go")
        .unwrap()
        .unwrap();
}

/// Set in the child process of the test below: the database it holds a row lock in.
const HOLDER: &str = "APP_TEST_LOCK_HOLDER_URL";

/// A replica stopped (SIGSTOP) inside a transaction keeps its row locks only for a while:
/// every replica session has `idle_in_transaction_session_timeout` and `lock_timeout`
/// (postgres::SESSION_LIMITS). A child process (this test binary, run again) opens a session
/// as a replica does, locks a row in a transaction and is stopped; a second replica session
/// waiting for that row gives up after the lock timeout instead of waiting for ever, and gets
/// the row once PostgreSQL has ended the stopped session.
#[tokio::test]
async fn a_replica_stopped_inside_a_transaction_keeps_its_row_locks_only_for_a_while() {
    use sqlx::Connection;
    if let Ok(url) = std::env::var(HOLDER) {
        // The child: lock the row, say so, and wait to be stopped and killed.
        let mut held = sqlx::PgConnection::connect_with(
            &postgres::replica_options(&url, &postgres::Agreement::lease(20_000)).unwrap(),
        )
        .await
        .unwrap();
        sqlx::query("BEGIN").execute(&mut held).await.unwrap();
        sqlx::query("SELECT id FROM held WHERE id = 1 FOR UPDATE").execute(&mut held).await.unwrap();
        println!("locked");
        tokio::time::sleep(std::time::Duration::from_secs(300)).await;
        return;
    }
    let pg = PgServer::start();
    let options = postgres::replica_options(&pg.url, &postgres::Agreement::lease(20_000)).unwrap();
    let mut waiting = sqlx::PgConnection::connect_with(&options).await.unwrap();
    sqlx::query("CREATE TABLE held (id INTEGER PRIMARY KEY)").execute(&mut waiting).await.unwrap();
    sqlx::query("INSERT INTO held VALUES (1)").execute(&mut waiting).await.unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["a_replica_stopped_inside_a_transaction_keeps_its_row_locks_only_for_a_while", "--exact", "--nocapture"])
        .env(HOLDER, &pg.url)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
    assert!(lines.any(|line| line.is_ok_and(|line| line == "locked")), "the child never locked the row");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGSTOP).unwrap();
    let stopped = std::time::Instant::now();
    let mut refusals = Vec::new();
    loop {
        let update = sqlx::query("UPDATE held SET id = 1 WHERE id = 1").execute(&mut waiting);
        match tokio::time::timeout(std::time::Duration::from_secs(60), update).await {
            Ok(Ok(_)) => break,
            Ok(Err(error)) => refusals.push((stopped.elapsed(), error.to_string())),
            Err(_) => panic!("a wait for the stopped session's lock never ended"),
        }
        assert!(
            stopped.elapsed() < std::time::Duration::from_secs(60),
            "the stopped session kept its lock: {refusals:?}"
        );
    }
    let got = stopped.elapsed();
    let _ = child.kill();
    let _ = child.wait();
    eprintln!("the stopped session's lock was free after {got:?}; waits refused: {refusals:?}");
    let (first_wait, first) = refusals.first().expect("the first wait gives up after the lock timeout");
    assert!(first.contains("lock timeout"), "{first}");
    assert!(*first_wait >= std::time::Duration::from_secs(9), "{first_wait:?}");
    assert!(got >= std::time::Duration::from_secs(14) && got < std::time::Duration::from_secs(30), "{got:?}");
}
