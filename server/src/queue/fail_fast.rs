//! Sweeps whose runs keep failing pause themselves, as W&B's agent gives up after
//! `WANDB_AGENT_MAX_INITIAL_FAILURES`: after every final failure the sweep's failures since its
//! last success (or resume) are counted, `shared::sweep::FailFast` decides, and a pause is
//! recorded in the same write unit. A paused sweep's queued jobs wait (the claim texts skip
//! them, `db::fail_fast::NOT_PAUSED`) and an adaptive one proposes nothing, until
//! `app sweeps resume` (`Queue::resume_sweep`).

use super::{Change, LogStore, Queue, Tx};
use crate::db::{self, now_ms};
use crate::error::{ApiError, ApiResult};
use shared::api::{ResumeResponse, SweepId};

/// Called in the unit that failed a job of `sweep_id` for good; `logs` gives the reason the
/// last lines of the last failure's log (none for attempts lost with their worker).
pub(super) async fn after_failure(tx: &mut Tx, sweep_id: SweepId, logs: Option<&LogStore>) -> ApiResult<()> {
    let Some(failures) = db::fail_fast::failures(tx.conn().await?, sweep_id).await? else { return Ok(()) };
    let in_a_row = failures.failed_in_a_row.len() as u64;
    if failures.paused || !failures.fail_fast.pauses(in_a_row, failures.any_succeeded) {
        return Ok(());
    }
    let jobs: Vec<String> = failures.failed_in_a_row.iter().rev().map(|run| run.job.to_string()).collect();
    let last = &failures.failed_in_a_row[0];
    let how = match (last.exit_code, last.reason.as_deref()) {
        (_, Some(reason)) if !reason.is_empty() => reason.to_string(),
        (Some(code), _) => format!("exit code {code}"),
        _ => "failed".to_string(),
    };
    let what = match failures.any_succeeded {
        false => format!("{in_a_row} runs failed and none has succeeded"),
        true => format!("{in_a_row} runs failed in a row"),
    };
    let mut reason = format!(
        "paused: {what} (jobs {}; job {}: {how}). `app sweeps resume {sweep_id}` continues it.",
        jobs.join(", "),
        last.job
    );
    if let Some(logs) = logs {
        let tail = logs.tail(sweep_id, last.job, last.attempt, 5);
        if !tail.is_empty() {
            reason.push_str(&format!("\nThe end of job {}'s log:\n{tail}", last.job));
        }
    }
    if db::fail_fast::pause(tx.conn().await?, sweep_id, &reason, now_ms()).await? {
        tracing::warn!(sweep = %sweep_id, failed = in_a_row, "sweep paused: its runs keep failing");
        tx.note(Change::Page);
    }
    Ok(())
}

impl Queue {
    /// Resumes a paused sweep (by id or name): its queued jobs may be claimed again, and its
    /// failures are counted afresh.
    pub async fn resume_sweep(&self, caller: &crate::auth::Caller, key: &str) -> ApiResult<ResumeResponse> {
        let sweep = self.find_sweep(key).await?;
        super::owners::sweep(caller, &sweep.info)?;
        let id = sweep.info.id;
        let search = self.search.clone();
        let resumed = self
            .write(move |tx| {
                Box::pin(async move {
                    let resumed = db::fail_fast::resume(tx.conn().await?, id, now_ms()).await?;
                    if resumed {
                        // An adaptive sweep proposes again: the claims' hint must look (set in
                        // this unit, so a claim batch after it sees it).
                        search.reopen();
                        tx.note(Change::Claimable);
                        tx.note(Change::Page);
                    }
                    Ok::<_, ApiError>(resumed)
                })
            })
            .await?;
        if resumed {
            tracing::info!(sweep = %sweep.info.name, "sweep resumed");
        }
        Ok(ResumeResponse { resumed })
    }
}
