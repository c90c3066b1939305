//! Workers: registration (which also settles what a restarted worker no longer runs), the
//! heartbeat (leases, telemetry, cancels), and the list the page and the CLI show.

use super::leases::lose;
use super::{Change, Queue};
use crate::db::{self, now_ms};
use crate::error::{ApiError, ApiResult};
use shared::api::{
    HeartbeatRequest, HeartbeatResponse, JobAttempt, JobId, RegisterRequest, RegisterResponse, WorkerId, WorkerInfo,
};
use shared::names::check_name;
use std::collections::HashSet;

pub fn unknown_worker(id: WorkerId) -> ApiError {
    ApiError::NotFound(format!("no worker {id}; register first"))
}

impl Queue {
    /// Registers a worker (again), telling it its id, its session and the server's timings.
    ///
    /// The name is looked up first. The same worker coming back (the key it keeps in its work
    /// directory matches) keeps its id; jobs the server believes it runs but that it does not
    /// list as held died with its box, and are lost now rather than a lease later. A second
    /// worker using the name of a live one elsewhere gets its own id and name (`name-2`), so
    /// neither requeues the other's jobs; the name of a lost worker is taken over.
    pub async fn register(&self, request: RegisterRequest) -> ApiResult<RegisterResponse> {
        check_name("worker", &request.name).map_err(ApiError::BadRequest)?;
        if request.protocol != shared::PROTOCOL_VERSION {
            return Err(ApiError::BadRequest(format!(
                "worker speaks protocol {} but this server speaks {}; run the same app version on both",
                request.protocol,
                shared::PROTOCOL_VERSION
            )));
        }
        let secret = super::sessions::random_hex()?;
        let secret_digest = super::sessions::digest(&secret);
        let (lease, max_crashes) = (self.config.lease, self.config.max_crashes);
        let asked = request.name.clone();
        let (worker_id, name, requeued) = self
            .write(move |tx| {
                Box::pin(async move {
                    let now = now_ms();
                    let session_hash = hex::encode(secret_digest);
                    let key_hash = request.key.as_deref().map(|key| hex::encode(super::sessions::digest(key)));
                    let hashes = (key_hash.as_deref(), session_hash.as_str());
                    let live = |seen: i64| now.saturating_sub(seen) <= lease.as_millis() as i64;
                    let (worker_id, name) = match db::workers::by_name(tx.conn().await?, &request.name).await? {
                        None => {
                            let id =
                                db::workers::insert(tx.conn().await?, &request.name, &request.capacity, hashes, now)
                                    .await?;
                            (id, request.name.clone())
                        }
                        Some(known)
                            if known.key_hash.is_some() && known.key_hash != key_hash && live(known.last_seen_at) =>
                        {
                            let name = db::workers::unique_name(tx.conn().await?, &request.name).await?;
                            let id =
                                db::workers::insert(tx.conn().await?, &name, &request.capacity, hashes, now).await?;
                            (id, name)
                        }
                        Some(known) => {
                            let id = WorkerId::new(known.id);
                            db::workers::renew(tx.conn().await?, id, &request.capacity, hashes, now).await?;
                            (id, request.name.clone())
                        }
                    };
                    let holding: HashSet<JobAttempt> = request.holding.iter().copied().collect();
                    let (mut held, mut lost) = (Vec::new(), Vec::new());
                    for job in db::jobs::running_on(tx.conn().await?, worker_id).await? {
                        let attempt = JobAttempt { job_id: job.id, attempt: job.attempt };
                        if holding.contains(&attempt) {
                            held.push(attempt);
                        } else {
                            lost.push(job);
                        }
                    }
                    lose(tx, &lost, max_crashes, now).await?;
                    let until = now + lease.as_millis() as i64;
                    db::jobs::extend_leases(tx.conn().await?, worker_id, &held, until).await?;
                    tx.note(Change::Page);
                    let requeued: Vec<JobId> = lost.iter().map(|job| job.id).collect();
                    Ok((worker_id, name, requeued))
                })
            })
            .await?;
        self.sessions.remember(worker_id, secret_digest);
        self.set_draining(worker_id, false);
        if name != asked {
            tracing::warn!(asked = %asked, registered = %name, "a live worker on another box uses this name; registered under another");
        }
        self.meters.lost_on_restart(requeued.len());
        if !requeued.is_empty() {
            tracing::warn!(worker = %name, jobs = ?requeued, "worker re-registered without its jobs; they are lost");
        }
        tracing::info!(worker = %name, id = %worker_id, "worker registered");
        Ok(RegisterResponse {
            worker_id,
            name,
            session: format!("{worker_id}:{secret}"),
            instance: self.instance.clone(),
            lease_ms: self.config.lease.as_millis() as u64,
            heartbeat_ms: self.config.heartbeat.as_millis() as u64,
            requeued,
        })
    }

    /// A worker stops taking jobs (it drains): its parked claim returns at once, empty, and
    /// no claim of it gets a job until it registers again.
    pub fn drain(&self, worker: WorkerId) {
        self.set_draining(worker, true);
        tracing::info!(worker = %worker, "worker draining: no new jobs for it");
        self.events.work().notify_waiters();
    }

    /// A worker stopped cleanly: it shows as `left` (not `lost`) until it registers again.
    /// Jobs still leased to it are not touched here: their leases end as usual.
    pub async fn leave(&self, worker: WorkerId) -> ApiResult<()> {
        self.write(move |tx| {
            Box::pin(async move {
                if !db::workers::leave(tx.conn().await?, worker, now_ms()).await? {
                    return Err(unknown_worker(worker));
                }
                tx.note(Change::Page);
                Ok(())
            })
        })
        .await?;
        tracing::info!(worker = %worker, "worker left (stopped cleanly)");
        Ok(())
    }

    fn set_draining(&self, worker: WorkerId, draining: bool) {
        if let Ok(mut set) = self.draining.lock() {
            if draining {
                set.insert(worker);
            } else {
                set.remove(&worker);
            }
        }
    }

    pub(super) fn is_draining(&self, worker: WorkerId) -> bool {
        self.draining.lock().is_ok_and(|set| set.contains(&worker))
    }

    /// Marks the worker alive, extends the leases of the attempts it really holds, stores its
    /// telemetry; answers which attempts to cancel and which are no longer its own.
    ///
    /// Jobs the database has running on the worker that it does not list, claimed longer ago
    /// than [`unheard_after`], are lost as if their lease had run out (a crash counted, so a
    /// job whose finish is refused every time fails after `max_crashes` instead of going round
    /// for ever): the answer that handed them out never reached the worker, or the worker
    /// dropped them. The first happens when a server commits a finish with its next claim and
    /// dies before answering (a replica killed): the worker sends its finish again elsewhere,
    /// is told the attempt is over, and never learns of the claimed job, which waited for its
    /// whole lease (30 s in the failover benchmark).
    pub async fn heartbeat(&self, worker: WorkerId, request: HeartbeatRequest) -> ApiResult<HeartbeatResponse> {
        let (lease, max_crashes) = (self.config.lease, self.config.max_crashes);
        let grace = unheard_after(&self.config);
        let preempt_grace = self.config.preempt_grace;
        self.write(move |tx| {
            Box::pin(async move {
                let now = now_ms();
                let lease_expires_at = now + lease.as_millis() as i64;
                if !db::workers::touch(tx.conn().await?, worker, now).await? {
                    return Err(unknown_worker(worker));
                }
                let reported: HashSet<JobAttempt> = request.running.iter().copied().collect();
                let started_before = now - grace.as_millis() as i64;
                let unheard: Vec<_> = db::jobs::running_on_since(tx.conn().await?, worker, started_before)
                    .await?
                    .into_iter()
                    .filter(|job| !reported.contains(&JobAttempt { job_id: job.id, attempt: job.attempt }))
                    .collect();
                let lost = lose(tx, &unheard, max_crashes, now).await?;
                let held =
                    db::jobs::extend_leases(tx.conn().await?, worker, &request.running, lease_expires_at).await?;
                if !request.gpus.is_empty() {
                    db::telemetry::insert(tx.conn().await?, worker, now, &request.gpus).await?;
                    tx.note(Change::Page);
                }
                let known: HashSet<JobAttempt> = held.iter().map(|held| held.attempt).collect();
                // Saves of the attempts it still holds (for the preemption pass's choice), never
                // later than now (a file's time is the worker's clock, or whatever the job set).
                let saves: Vec<_> = request
                    .saves
                    .iter()
                    .filter(|save| known.contains(&save.attempt))
                    .map(|save| shared::api::SaveNote { at: save.at.min(now), ..*save })
                    .collect();
                if !saves.is_empty() {
                    db::checkpoints::note_saves(tx.conn().await?, &saves).await?;
                }
                let response = HeartbeatResponse {
                    cancel: held.iter().filter(|held| held.cancel).map(|held| held.attempt).collect(),
                    unknown: request.running.iter().filter(|attempt| !known.contains(attempt)).copied().collect(),
                    lease_expires_at,
                    // A cancel wins: a cancelled attempt is killed, not preempted.
                    preempt: held.iter().filter(|held| held.preempt && !held.cancel).map(|held| held.attempt).collect(),
                    preempt_grace_ms: preempt_grace.as_millis() as u64,
                };
                Ok((response, lost))
            })
        })
        .await
        // Lost as a lease that ran out is, and counted with them.
        .map(|(response, lost)| {
            self.meters.leases_expired(&lost);
            response
        })
    }

    /// Every worker, with its state judged by this server's heartbeat interval and lease.
    pub async fn workers(&self) -> ApiResult<Vec<WorkerInfo>> {
        let (heartbeat, lease) = (self.config.heartbeat.as_millis() as u64, self.config.lease.as_millis() as u64);
        Ok(db::workers::list(self.reader(), now_ms(), heartbeat, lease).await?)
    }
}

/// Puts `job`, running on `worker` but never started there, back in the queue as abandoned
/// (no crash counted), guarded by the state read.
pub(super) async fn hand_back(
    tx: &mut super::Tx,
    job: &db::jobs::JobState,
    worker: WorkerId,
    why: &str,
) -> ApiResult<()> {
    let decision = shared::job::finish(&shared::job::Outcome::Abandoned, job.retries_left, job.cancel_requested);
    if db::jobs::finish(tx.conn().await?, job, worker, &decision, now_ms(), false).await? {
        tracing::warn!(job = %job.id, attempt = job.attempt, worker = %worker, "claimed but {why}; back in the queue");
        tx.note(Change::Job(job.id));
        tx.note(Change::Claimable);
    }
    Ok(())
}

/// How long after its claim a job the worker's heartbeats do not list counts as lost: two
/// heartbeats, and at least half a lease, so that a heartbeat built just before an answer
/// arrived and delivered late (sent on to another replica after a 5xx) does not take a job the
/// worker has just started.
fn unheard_after(config: &crate::config::ServerConfig) -> std::time::Duration {
    config.heartbeat.saturating_mul(2).max(config.lease / 2)
}
