//! Sweeps: submission (parsed off the async executor, inserted in one write unit) and cancel.

use super::{Change, Queue};
use crate::auth::Caller;
use crate::db::{self, now_ms};
use crate::error::{ApiError, ApiResult};
use shared::api::{CancelResponse, SetClassResponse, SweepDetail, SweepId, SweepInfo, Workspace};
use shared::metric_check::MetricMissing;
use shared::sweep::{ExpandOptions, Sweep};
use std::sync::Arc;

/// A stored sweep: its id, unique name and job count.
pub struct Submitted {
    pub sweep_id: SweepId,
    pub name: String,
    pub count: u64,
}

impl Queue {
    /// Parses and validates a sweep file. Parsing runs on a blocking thread: a hostile file can
    /// take a while to refuse, and must not hold up the requests served beside it.
    pub async fn parse_sweep(&self, source: Arc<String>, command: Option<String>) -> ApiResult<Sweep> {
        let options =
            ExpandOptions { max_jobs: self.config.max_jobs_per_sweep, command, max_depth: self.config.max_yaml_depth };
        tokio::task::spawn_blocking(move || Sweep::parse(&source, &options))
            .await
            .map_err(|error| anyhow::anyhow!("parsing a sweep file: {error}"))?
            .map_err(|error| ApiError::BadRequest(error.to_string()))
    }

    /// The value of the priority class `sweep` names, as `caller` may submit it: 400 for a
    /// class the server does not have, 403 for one above the default from someone not an admin.
    pub fn class_of(&self, sweep: &Sweep, caller: &crate::auth::Caller) -> ApiResult<i64> {
        self.class_value(sweep.priority_class.as_deref(), caller)
    }

    fn class_value(&self, named: Option<&str>, caller: &Caller) -> ApiResult<i64> {
        shared::fair_share::class_value(&self.config.priority_classes, named, caller.admin).map_err(|refused| {
            match refused {
                shared::fair_share::ClassRefused::Unknown { .. } => ApiError::BadRequest(refused.to_string()),
                shared::fair_share::ClassRefused::NotAdmin { .. } => ApiError::Forbidden(refused.to_string()),
            }
        })
    }

    /// Moves sweep `key` to the priority class `named` (none: the default), as its owner or an
    /// admin may, and into a class above the default only as an admin (as at submission; an
    /// owner may move their sweep to any class at or below the default, out of one an admin
    /// put it in too). Its
    /// queued jobs are claimed by the new class from the next claim on, and its running ones
    /// may be preempted by the classes above it.
    pub async fn set_class(&self, caller: &Caller, key: &str, named: Option<String>) -> ApiResult<SetClassResponse> {
        let sweep = self.find_sweep(key).await?;
        super::owners::sweep(caller, &sweep.info)?;
        let value = self.class_value(named.as_deref(), caller)?;
        let (id, owner, stored, gone) = (sweep.info.id, sweep.info.owner.clone(), named.clone(), key.to_string());
        self.write(move |tx| {
            Box::pin(async move {
                if !db::sweeps::set_class(tx.conn().await?, (id, &owner), stored.as_deref(), value).await? {
                    return Err(ApiError::NotFound(format!("sweep {gone}")));
                }
                tx.note(Change::Claimable);
                tx.note(Change::Page);
                Ok(())
            })
        })
        .await?;
        tracing::info!(sweep = %sweep.info.name, class = ?named, value, by = %caller.name, "sweep moved to another priority class");
        Ok(SetClassResponse { priority_class: named, value })
    }

    /// Stores a parsed sweep and its jobs in one transaction (a large sweep's first jobs, the
    /// others following in the background: see `expansions`), under a name made unique,
    /// owned by `owner`, in its priority class of value `class` ([`Queue::class_of`]), with the
    /// workspace its jobs run in (see `code`).
    pub async fn submit(
        &self,
        sweep: Arc<Sweep>,
        source: Arc<String>,
        (base_name, owner, class): (String, String, i64),
        workspace: Workspace,
    ) -> ApiResult<Submitted> {
        let form = sweep.form;
        let workspace = Arc::new(workspace);
        let stored_workspace = workspace.clone();
        let (parsed, search) = (sweep.clone(), self.search.clone());
        let submitter = owner.clone();
        let now = now_ms();
        let (engine, ready) = (self.db().engine(), sweep.clone());
        // Rendering and encoding many jobs takes a while (a million: 0.4 s): not on the executor.
        let prepared = match db::sweep_jobs::Prepared::worth_a_thread(&sweep) {
            false => db::sweep_jobs::Prepared::of(&sweep, engine, now),
            true => tokio::task::spawn_blocking(move || db::sweep_jobs::Prepared::of(&ready, engine, now))
                .await
                .map_err(|error| anyhow::anyhow!("preparing a sweep's jobs: {error}"))?,
        };
        let expanding = prepared.expanding();
        // Before its jobs can be claimed: the claims they wake see another user waiting.
        self.shares.submitted(&submitter);
        let submitted = self
            .write(move |tx| {
                Box::pin(async move {
                    let name = db::sweeps::unique_name(tx.conn().await?, &base_name).await?;
                    let sweep_id =
                        db::sweeps::insert(tx.conn().await?, (&name, &owner, class), &sweep, &source, now).await?;
                    let count = db::sweep_jobs::insert(tx.conn().await?, sweep_id, &sweep, &prepared, now).await?;
                    super::code::set_workspace(tx, sweep_id, &stored_workspace).await?;
                    search.on_submit(tx, sweep_id, &sweep).await?;
                    tx.note(Change::Claimable);
                    Ok(Submitted { sweep_id, name, count })
                })
            })
            .await?;
        // Again: a look made before the commit may have left the owner out.
        self.shares.submitted(&submitter);
        if expanding {
            self.rows_left();
        }
        if let Ok(mut names) = self.sweep_names.write() {
            names.insert(submitted.sweep_id, (submitted.name.clone(), form));
        }
        self.meters.submitted(submitted.count);
        self.db().jobs_added(submitted.count);
        // Replaces whatever a removed sweep that had this id left.
        if let Ok(mut workspaces) = self.workspaces.write() {
            workspaces.insert(submitted.sweep_id, workspace);
        }
        self.search.submitted(submitted.sweep_id, parsed);
        tracing::info!(sweep = %submitted.name, jobs = submitted.count, owner = %submitter, "sweep submitted");
        Ok(submitted)
    }

    /// The sweep's metric, when runs have succeeded and none of its finished runs reported it
    /// (a run that crashed before reporting anything is not a sign of a misnamed metric).
    pub async fn metric_missing(&self, sweep: &SweepInfo) -> ApiResult<Option<MetricMissing>> {
        let Some(metric) = &sweep.metric else { return Ok(None) };
        if sweep.counts.succeeded == 0 {
            return Ok(None);
        }
        let arrived = db::metrics::arrived_names(self.reader(), sweep.id, &metric.name).await?;
        Ok(MetricMissing::check(&metric.name, sweep.counts.succeeded, arrived))
    }

    /// A sweep by id or name.
    pub async fn find_sweep(&self, key: &str) -> ApiResult<SweepDetail> {
        db::sweeps::find(self.reader(), key).await?.ok_or_else(|| ApiError::NotFound(format!("no sweep `{key}`")))
    }

    /// Cancels a sweep: its queued jobs at once, its running ones at their workers.
    pub async fn cancel_sweep(&self, caller: &Caller, key: &str) -> ApiResult<CancelResponse> {
        let sweep = self.find_sweep(key).await?;
        super::owners::sweep(caller, &sweep.info)?;
        let id = sweep.info.id;
        let response = self
            .write(move |tx| {
                Box::pin(async move {
                    let (cancelled, cancel_requested) = db::jobs::cancel_sweep(tx.conn().await?, id, now_ms()).await?;
                    super::search::Controller::on_cancel(tx, id).await?;
                    tx.note(Change::Page);
                    // Followers of a job's log that wait for it to start learn it never will.
                    for job in &cancelled {
                        tx.note(Change::Job(*job));
                    }
                    Ok(CancelResponse { cancelled: cancelled.len() as u64, cancel_requested })
                })
            })
            .await?;
        tracing::info!(sweep = %sweep.info.name, cancelled = response.cancelled, cancel_requested = response.cancel_requested, "sweep cancelled");
        Ok(response)
    }
}
