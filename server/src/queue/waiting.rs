//! Why queued jobs wait: the reason no connected worker can ever run one (decided by the pure
//! `shared::waiting::could_ever_place` over the capacities the workers registered with), and
//! otherwise its place in the queue, and which sweeps wait for their owner's quota. Reads only.

use super::Queue;
use crate::db;
use crate::error::ApiResult;
use shared::api::{Job, SweepId, SweepInfo, Waiting, WorkerState};
use shared::job::JobStatus;
use shared::placement::Capacity;
use shared::sweep::Resources;
use shared::waiting::could_ever_place;

impl Queue {
    /// The whole-box capacities of the workers not lost (healthy or stale), as registered.
    async fn connected_capacities(&self) -> ApiResult<Vec<Capacity>> {
        let workers = self.workers().await?;
        Ok(workers
            .into_iter()
            .filter(|worker| worker.state != WorkerState::Lost)
            .map(|worker| worker.capacity)
            .collect())
    }

    /// Says why each queued job of `jobs` waits: why no connected worker can run it, and (for a
    /// single job, or when `positions`) how many queued jobs go before it.
    pub async fn explain_waiting(&self, jobs: &mut [Job], positions: bool) -> ApiResult<()> {
        let queued: Vec<usize> = (0..jobs.len()).filter(|at| jobs[*at].status == JobStatus::Queued).collect();
        if queued.is_empty() {
            return Ok(());
        }
        let capacities = self.connected_capacities().await?;
        for at in &queued {
            let reason = could_ever_place(&jobs[*at].resources, &capacities).err().map(|why| why.to_string());
            jobs[*at].waiting = Some(Waiting { position: None, reason });
        }
        if let [only] = queued.as_slice() {
            let job = &mut jobs[*only];
            let position = db::job_pages::queue_position(self.reader(), job.id, job.priority).await?;
            job.waiting.get_or_insert_with(Waiting::default).position = Some(position);
        } else if positions {
            let ids: Vec<_> = queued.iter().map(|at| jobs[*at].id).collect();
            for (id, position) in db::job_pages::queue_positions(self.reader(), &ids).await? {
                if let Some(job) = jobs.iter_mut().find(|job| job.id == id) {
                    job.waiting.get_or_insert_with(Waiting::default).position = Some(position);
                }
            }
        }
        Ok(())
    }

    /// Why the queued jobs of a sweep cannot run on any connected worker, when they cannot.
    pub async fn sweep_unplaceable(&self, sweep: SweepId) -> ApiResult<Option<String>> {
        let Some(resources) = db::jobs::queued_resources_of_sweep(self.reader(), sweep).await? else { return Ok(None) };
        self.unplaceable(&resources).await
    }

    /// Why a job asking for `resources` cannot run on any connected worker, if it cannot.
    pub async fn unplaceable(&self, resources: &Resources) -> ApiResult<Option<String>> {
        let capacities = self.connected_capacities().await?;
        Ok(could_ever_place(resources, &capacities).err().map(|why| why.to_string()))
    }

    /// Says, for each sweep of `sweeps` with queued jobs, whether its owner's quota holds them
    /// back (`SweepInfo::held_back`), as the claims decide it (`shared::fair_share::admits`)
    /// on what the owner holds now and the GPUs its queued jobs ask for.
    pub async fn explain_quotas(&self, sweeps: &mut [SweepInfo]) -> ApiResult<()> {
        let policy = self.shares.policy();
        if !self.shares.has_quotas() || sweeps.iter().all(|sweep| sweep.counts.queued == 0) {
            return Ok(());
        }
        let holdings = {
            let mut reader = self.reader().acquire().await?;
            db::shares::holdings(reader.conn(), db::now_ms()).await?
        };
        // A job that does not say how many GPUs takes none on a box without GPUs, one elsewhere.
        let cpu_box = self.connected_capacities().await?.iter().any(|capacity| capacity.gpus.is_empty());
        for sweep in sweeps.iter_mut().filter(|sweep| sweep.counts.queued > 0 && sweep.paused.is_none()) {
            let held = holdings.iter().find(|holding| holding.owner == sweep.owner).map(|holding| holding.held);
            let Some(resources) = db::jobs::queued_resources_of_sweep(self.reader(), sweep.id).await? else { continue };
            let gpus = resources.gpus.unwrap_or(if cpu_box { 0 } else { 1 });
            sweep.held_back = shared::fair_share::admits(&sweep.owner, held.unwrap_or_default(), gpus, policy)
                .err()
                .map(|why| why.to_string());
        }
        Ok(())
    }
}
