//! The rows a large sweep's submission left for later (`db::sweep_jobs`), written one chunk
//! per background write unit (`Writer::write_in_background`: when the writer is idle, else
//! one every 100 ms), so that the submission returns in tens of milliseconds and claims are
//! served before the chunks rather than behind them all.

use super::{Change, Queue};
use crate::db;
use crate::db::sweep_jobs::Filled;
use shared::api::SweepId;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// After a chunk that could not be written, the next try waits this long.
const AFTER_FAILURE: Duration = Duration::from_secs(5);

impl Queue {
    /// Tells the background writer that a submission left rows.
    pub(super) fn rows_left(&self) {
        self.expansions.notify_one();
    }

    /// Writes the next chunk left, but those of the sweeps in `skip`, in the writer's idle time
    /// (or its bounded share of a busy writer's).
    async fn fill_next(&self, skip: Vec<SweepId>) -> crate::error::ApiResult<Filled> {
        self.writer
            .write_in_background(move |tx| {
                Box::pin(async move {
                    let filled = db::sweep_jobs::fill_next(tx.conn().await?, &skip).await?;
                    if let Filled::Wrote(_) = filled {
                        tx.note(Change::Claimable);
                        tx.note(Change::Page);
                    }
                    Ok(filled)
                })
            })
            .await
    }
}

/// Writes the rows left by submissions (and by a server stopped before it had written them all)
/// until the server shuts down.
pub async fn run(queue: Arc<Queue>, mut shutting_down: watch::Receiver<bool>) {
    // Sweeps whose next chunk cannot be written: the others' go on (tried again at a restart).
    let mut stuck: Vec<SweepId> = Vec::new();
    // Rows an earlier run of the server left.
    queue.rows_left();
    loop {
        tokio::select! {
            _ = queue.expansions.notified() => {}
            _ = shutting_down.wait_for(|stop| *stop) => return,
        }
        loop {
            if *shutting_down.borrow() {
                return;
            }
            match queue.fill_next(stuck.clone()).await {
                Ok(Filled::Wrote(_)) => {}
                Ok(Filled::Nothing) => break,
                Ok(Filled::Refused(sweep, why)) => {
                    tracing::error!(%sweep, %why, "the rest of a large sweep's jobs cannot be written; its other jobs run");
                    stuck.push(sweep);
                }
                Err(_) if *shutting_down.borrow() => return,
                Err(error) => {
                    tracing::error!(%error, "writing the rows of a large sweep; trying again in 5 s");
                    tokio::select! {
                        _ = tokio::time::sleep(AFTER_FAILURE) => {}
                        _ = shutting_down.wait_for(|stop| *stop) => return,
                    }
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "expansions_tests.rs"]
mod tests;
