//! The data directory's files belong to one database: a server whose `queue.db` was removed or
//! replaced beside them refuses to start, names both sides and touches nothing; a directory from
//! before the marker existed is adopted with its own database.

use super::finish::finish;
use server::ServerConfig;
use sha2::Digest;
use shared::api::JobId;
use std::path::{Path, PathBuf};
use testkit::TestApp;

/// A server with one finished job: a result version and a log on disk. Returns it stopped,
/// with the job and the path of its result file.
async fn with_a_result() -> (TestApp, JobId, PathBuf) {
    let mut app = TestApp::spawn().await;
    let (worker, job) = app.start_one("kept").await;
    app.client.finish(worker, &finish(&job)).await.unwrap();
    let version = app.client.results(job.id).await.unwrap().pop().expect("a result version");
    let file = app.data_path().join(&version.path).join("out/a.txt");
    assert_eq!(std::fs::read(&file).unwrap(), b"result");
    app.stop().await;
    (app, job.id, file)
}

/// Starts a server on `data_dir` and returns why it would not start.
async fn refusal(data_dir: &Path) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = ServerConfig { data_dir: data_dir.to_path_buf(), ..ServerConfig::default() };
    server::run(listener, config, std::future::pending())
        .await
        .expect_err("the server must refuse to start")
        .to_string()
}

fn marker(data_dir: &Path) -> String {
    std::fs::read_to_string(data_dir.join(".app-instance")).expect("the directory is marked").trim().to_string()
}

fn remove_database(data_dir: &Path) {
    for name in ["queue.db", "queue.db-wal", "queue.db-shm"] {
        let _ = std::fs::remove_file(data_dir.join(name));
    }
}

/// Every file under `dir`, with its content's SHA-256; SQLite's own transient files (`-wal`,
/// `-shm`, emptied or removed when a connection closes) aside.
fn files(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(next) = stack.pop() {
        for entry in std::fs::read_dir(&next).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if path.is_dir() {
                stack.push(path);
            } else if !name.ends_with("-wal") && !name.ends_with("-shm") {
                let digest = hex::encode(sha2::Sha256::digest(std::fs::read(&path).unwrap()));
                found.push((path, digest));
            }
        }
    }
    found.sort();
    found
}

#[tokio::test]
async fn a_removed_database_beside_its_files_is_refused_and_nothing_is_touched() {
    let (app, _, result) = with_a_result().await;
    let data = app.data_path();
    let ours = marker(data);
    remove_database(data);
    let before = files(data);
    for _ in 0..2 {
        let refused = refusal(data).await;
        assert!(
            refused.contains(&format!("holds the files (results, logs, checkpoints) of database instance {ours}")),
            "{refused}"
        );
        assert!(refused.contains("queue.db is new (instance "), "{refused}");
        assert!(refused.contains("was it removed or replaced?"), "{refused}");
        assert!(refused.contains(&data.display().to_string()), "{refused}");
        assert!(refused.contains("move results/, logs/, checkpoints/ and .app-instance out of"), "{refused}");
        // The database the refused start made is gone again, so a second start is refused
        // the same way rather than taking the files for its own.
        assert_eq!(files(data), before, "the refusal left the directory as it was");
    }
    assert_eq!(std::fs::read(&result).unwrap(), b"result");
}

#[tokio::test]
async fn a_database_of_another_instance_is_refused_naming_both() {
    if testkit::on_postgres() {
        return; // about the SQLite file itself (PostgreSQL: server/tests/postgres)
    }
    let (app, _, _) = with_a_result().await;
    let data = app.data_path();
    let ours = marker(data);
    let mut other = TestApp::spawn().await;
    other.submit(&testkit::sweep_of("theirs", 1)).await;
    other.stop().await;
    let theirs = marker(other.data_path());
    assert_ne!(ours, theirs, "each database is its own instance");
    remove_database(data);
    // Stopped cleanly, the other server left its whole database in the main file.
    std::fs::copy(other.data_path().join("queue.db"), data.join("queue.db")).unwrap();
    let before = files(data);
    let refused = refusal(data).await;
    assert!(refused.contains(&format!("of database instance {ours}")), "{refused}");
    assert!(refused.contains(&format!("queue.db is instance {theirs}:")), "{refused}");
    assert!(refused.contains("Start with the database those files belong to"), "{refused}");
    assert_eq!(files(data), before, "the other database and the files are as they were");
}

#[tokio::test]
async fn a_directory_from_before_the_marker_is_adopted_with_its_database() {
    if testkit::on_postgres() {
        return; // about the SQLite file itself (PostgreSQL: server/tests/postgres)
    }
    let (app, job, result) = with_a_result().await;
    let instance = marker(app.data_path());
    std::fs::remove_file(app.data_path().join(".app-instance")).unwrap();
    let app = app.restart().await;
    assert_eq!(marker(app.data_path()), instance, "marked again with its own database's instance");
    let version = app.client.results(job).await.unwrap().pop().expect("the result is still served");
    assert_eq!(app.data_path().join(&version.path).join("out/a.txt"), result);
    assert_eq!(std::fs::read(&result).unwrap(), b"result");
}

#[tokio::test]
async fn an_unmarked_directory_whose_database_was_removed_is_refused() {
    let (app, _, result) = with_a_result().await;
    let data = app.data_path();
    std::fs::remove_file(data.join(".app-instance")).unwrap();
    remove_database(data);
    let before = files(data);
    let refused = refusal(data).await;
    assert!(refused.contains("holds results, logs or checkpoints of an earlier database"), "{refused}");
    assert!(refused.contains("queue.db is new"), "{refused}");
    assert_eq!(files(data), before, "no database and no marker were left behind");
    // A first start that failed after migrating leaves an empty database: as new as none.
    server::db::Db::open(data).await.unwrap().close().await;
    let refused = refusal(data).await;
    assert!(refused.contains("queue.db is new"), "{refused}");
    assert!(!data.join(".app-instance").exists(), "the old files were not adopted");
    assert_eq!(std::fs::read(&result).unwrap(), b"result");
}
