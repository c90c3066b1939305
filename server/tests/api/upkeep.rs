//! Upkeep that keeps a long-lived server small: the write-ahead log is truncated once a burst
//! of writes is over (it would stay at its peak size on disk otherwise).

use std::time::Duration;
use testkit::{sweep_of, wait_until, TestApp};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_write_ahead_log_shrinks_back_once_writes_pause() {
    if testkit::on_postgres() {
        return; // about the SQLite file itself (PostgreSQL: server/tests/postgres)
    }
    let app = TestApp::spawn().await;
    let wal = app.data_path().join("queue.db-wal");
    let size = || std::fs::metadata(&wal).map(|meta| meta.len()).unwrap_or(0);
    // A burst of writes in one unit: 8,000 jobs (written in their submission's unit, as a sweep
    // of more is not) with 3 KB commands grow the log past the 16 MiB threshold.
    let values: Vec<String> = (0..8_000).map(|i| i.to_string()).collect();
    let padding = "x".repeat(3_000);
    app.submit(&format!("name: burst\ncommand: \"echo {{i}} {padding}\"\ngrid:\n  i: [{}]\n", values.join(", "))).await;
    let peak = size();
    assert!(peak > 16 << 20, "the burst did not grow the log ({peak} bytes)");
    wait_until("the log is truncated after the writes paused", Duration::from_secs(30), || async {
        (size() < 1 << 20).then_some(())
    })
    .await;
    app.submit(&sweep_of("after", 3)).await;
    let counts = app.client.sweep("burst").await.unwrap().info.counts;
    assert_eq!(counts.queued, 8_000, "nothing was lost by the truncation");
}
