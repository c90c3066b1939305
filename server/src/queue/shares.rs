//! Fair share at claim time (issue 29, item 2; decision 0077). When several users' jobs wait,
//! or quotas are set, a claim batch reads each waiting user's queue, what each one holds and
//! has used, and lets `shared::fair_share::allot` choose; otherwise the claim is today's (one
//! queue in dispatch order, the one-statement claims and the finish+claim steps).
//!
//! Which users wait is looked at every second from a reader ([`keep_looking`]; a submission
//! here adds its owner at once, a replica's is seen within the second), so a claim goes by the
//! last look. Quotas are exact: with quotas set every claim goes this way, looks and reads what
//! users hold in its own unit and, on PostgreSQL, holds a transaction lock that orders the
//! replicas' claims.

use super::Tx;
use crate::db;
use crate::db::claims::{Candidate, Fitting};
use crate::error::ApiResult;
use shared::api::{JobId, SweepId, WorkerId};
use shared::fair_share::{allot, Contender, Held, Policy, Quota, START_CHARGE_SECS};
use shared::placement::{Capacity, Placement};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a look at the waiting users stands.
const WAITING_FOR: Duration = Duration::from_secs(1);
/// A look older than this (the looks fail) is not trusted: claims go the fair way.
const LOOK_TRUSTED_FOR: Duration = Duration::from_secs(5);
/// How long a read of the users' recorded usage stands (it changes as attempts end).
const USAGE_FOR: Duration = Duration::from_secs(30);
/// Every how many looks the finish+claim steps' slot time is added to the database: a crash
/// loses at most that many seconds of it.
const SLOTS_EVERY: u32 = 10;
const HOUR_MS: i64 = 3_600_000;

/// The queue's fair share: its policy and what it last saw.
pub(super) struct Shares {
    policy: Policy,
    seen: Mutex<Seen>,
    /// Told when users start to wait: the preemption pass (`Queue::preemption_wanted`) wakes.
    started_waiting: tokio::sync::Notify,
    /// Workers held for jobs of several GPUs, as last seen (`queue::reservations`).
    pub reservations: super::reservations::Reservations,
    /// Job slots' time in the records the finish+claim steps stored, by sweep and hour (Unix
    /// ms), not yet in the database: [`keep_looking`] adds it every [`SLOTS_EVERY`] looks.
    slots: Mutex<BTreeMap<(SweepId, i64), f64>>,
}

#[derive(Default)]
struct Seen {
    /// The users with claimable jobs at the last look.
    waiting: Vec<String>,
    looked: Option<Instant>,
    /// Owners who submitted here, and when: a look that started before keeps them.
    submitted: Vec<(String, Instant)>,
    /// Each user's recorded GPU time, decayed to `usage_at` (Unix ms).
    usage: Arc<BTreeMap<String, f64>>,
    usage_at: i64,
    usage_read: Option<Instant>,
}

/// A claim batch's choices: each job's claim (its place in the batch) and GPUs, the (job,
/// worker) pairs in the order chosen, whether some claim still has room, whether a queue read
/// was cut at its limit (a longer read might fill that room), and where each waiting user
/// stands after the choice (for what a held worker lends next: `reservations::lend`).
pub(super) type Choices = (HashMap<JobId, (usize, Placement)>, Vec<(JobId, WorkerId)>, bool, bool, Vec<Standing>);

/// A waiting user after a batch's choice: their usage as the fair share ranks it (the jobs
/// just chosen charged their start) and what they hold (those jobs included).
#[derive(Debug, Clone)]
pub(super) struct Standing {
    pub user: String,
    pub usage: f64,
    pub held: Held,
}

impl Shares {
    pub fn new(policy: Policy) -> Shares {
        Shares {
            policy,
            seen: Mutex::default(),
            started_waiting: tokio::sync::Notify::new(),
            reservations: Default::default(),
            slots: Mutex::default(),
        }
    }

    /// A job of `sweep` without GPUs held its slot for `seconds`, recorded at `at` (Unix ms)
    /// by a finish+claim step (which stores records without their usage: the hot path).
    pub fn slot_held(&self, sweep: SweepId, at: i64, seconds: f64) {
        if let Ok(mut slots) = self.slots.lock() {
            *slots.entry((sweep, at - at.rem_euclid(HOUR_MS))).or_default() += seconds;
        }
    }

    /// Adds the slot time [`Shares::slot_held`] summed to the database in one unit; kept for
    /// the next time if that fails. The next claim that needs usage reads it again.
    pub async fn add_slot_time(&self, queue: &super::Queue) {
        let held: Vec<((SweepId, i64), f64)> = match self.slots.lock() {
            Ok(mut slots) => std::mem::take(&mut *slots).into_iter().collect(),
            Err(_) => return,
        };
        if held.is_empty() {
            return;
        }
        let adding = held.clone();
        let added = queue
            .write(move |tx| {
                Box::pin(async move {
                    // By (hour, owner): the rows written, in one order on every replica (two
                    // replicas' units locking the same rows in opposite orders would deadlock).
                    let mut rows: BTreeMap<(i64, String), f64> = BTreeMap::new();
                    for ((sweep, hour_at), seconds) in adding {
                        // (A sweep removed since has no owner left to charge.)
                        if let Some(owner) = db::usage::owner_of_sweep(tx.conn().await?, sweep).await? {
                            *rows.entry((hour_at, owner)).or_default() += seconds;
                        }
                    }
                    for ((hour_at, owner), seconds) in rows {
                        db::usage::add_slots(tx.conn().await?, &owner, hour_at, seconds).await?;
                    }
                    Ok(())
                })
            })
            .await;
        match added {
            Ok(()) => self.usage_changed(),
            Err(error) => {
                tracing::warn!(%error, "adding jobs' slot time to their users' usage; trying again later");
                if let Ok(mut slots) = self.slots.lock() {
                    for (key, seconds) in held {
                        *slots.entry(key).or_default() += seconds;
                    }
                }
            }
        }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Whether any user has a quota.
    pub fn has_quotas(&self) -> bool {
        self.policy.default_quota != Quota::default() || self.policy.quotas.values().any(|q| *q != Quota::default())
    }

    /// Whether a claim must go the fair way, as last seen: quotas are set, or several users
    /// wait ([`keep_looking`] looks every second, a submission here at once), or no look is
    /// to be trusted (none yet, after a start: the claims there read who waits themselves).
    pub fn engaged(&self) -> bool {
        if self.has_quotas() {
            return true;
        }
        self.seen.lock().map_or(true, |seen| {
            seen.waiting.len() > 1 || seen.looked.is_none_or(|at| at.elapsed() >= LOOK_TRUSTED_FOR)
        })
    }

    /// Looks at which users wait, from a reader (off the writer).
    async fn look(&self, reader: &db::backend::Pool) -> ApiResult<()> {
        let asked = Instant::now();
        let waiting = {
            let mut conn = reader.acquire().await?;
            db::shares::waiting_owners(conn.conn()).await?
        };
        self.store_look(waiting, asked);
        Ok(())
    }

    /// Keeps a look at the waiting users begun at `asked`, with the owners submitted here since
    /// (their rows may have committed after the read began); returns what is kept.
    fn store_look(&self, mut waiting: Vec<String>, asked: Instant) -> Vec<String> {
        if let Ok(mut seen) = self.seen.lock() {
            seen.submitted.retain(|(_, at)| *at >= asked);
            for (owner, _) in &seen.submitted {
                if !waiting.contains(owner) {
                    waiting.push(owner.clone());
                }
            }
            if seen.waiting.is_empty() && !waiting.is_empty() {
                self.started_waiting.notify_one();
            }
            (seen.waiting, seen.looked) = (waiting.clone(), Some(Instant::now()));
        }
        waiting
    }

    /// `owner` queued jobs here: they wait from now on.
    pub fn submitted(&self, owner: &str) {
        if let Ok(mut seen) = self.seen.lock() {
            if !seen.waiting.iter().any(|user| user == owner) {
                seen.waiting.push(owner.to_string());
                // A user who was not waiting starts to: the scheduler's passes run now.
                self.started_waiting.notify_one();
            }
            seen.submitted.push((owner.to_string(), Instant::now()));
        }
    }

    /// Resolves when users start to wait (at once if they did since the last call).
    pub async fn started_waiting(&self) {
        self.started_waiting.notified().await
    }

    /// The users whose queues a claim in `tx` reads, looked at again if stale; `None` when one
    /// user (or none) waits and no quota applies: the plain claim serves. With quotas, the
    /// look is made in the claim's unit every time, after the quota lock (`db::shares::
    /// lock_quotas`): on PostgreSQL a job committed after a look taken before it could
    /// otherwise be claimed unchecked.
    pub async fn waiting(&self, tx: &mut Tx) -> ApiResult<Option<Vec<String>>> {
        if self.has_quotas() {
            db::shares::lock_quotas(tx.conn().await?).await?;
        }
        let fresh = match self.seen.lock() {
            Ok(seen) if !self.has_quotas() && seen.looked.is_some_and(|at| at.elapsed() < WAITING_FOR) => {
                Some(seen.waiting.clone())
            }
            _ => None,
        };
        let waiting = match fresh {
            Some(waiting) => waiting,
            None => {
                let asked = Instant::now();
                let waiting = db::shares::waiting_owners(tx.conn().await?).await?;
                self.store_look(waiting, asked)
            }
        };
        Ok((waiting.len() > 1 || self.has_quotas()).then_some(waiting))
    }

    /// Recorded usage changed in a way only a read sees: the next claim that needs it reads it.
    pub fn usage_changed(&self) {
        if let Ok(mut seen) = self.seen.lock() {
            seen.usage_read = None;
        }
    }

    /// Whether recorded usage has been read (a fair share was engaged): only then does a new
    /// record need its owner looked up ([`Shares::recorded`]).
    pub fn tracks_usage(&self) -> bool {
        self.seen.lock().is_ok_and(|seen| seen.usage_read.is_some())
    }

    /// `seconds` of GPU time were recorded for `owner` here: they count from the next claim on
    /// (a replica's records count from its next read).
    pub fn recorded(&self, owner: &str, seconds: f64) {
        if let Ok(mut seen) = self.seen.lock() {
            if seen.usage_read.is_none() {
                return; // never read: the first read finds it stored
            }
            // The map is decayed to now first, so that the new seconds count in full.
            let now = db::now_ms();
            let age = (now - seen.usage_at) as f64 / 1000.0;
            let half_life = self.policy.half_life_secs;
            let usage = Arc::make_mut(&mut seen.usage);
            for value in usage.values_mut() {
                *value = shared::fair_share::decay(*value, age, half_life);
            }
            *usage.entry(owner.to_string()).or_default() += seconds;
            seen.usage_at = now;
        }
    }

    /// Reads the users' recorded usage again if the last read is stale (from a reader, before
    /// the claim's unit: never on the writer).
    pub async fn refresh_usage(&self, reader: &db::backend::Pool, now: i64) {
        let stale = match self.seen.lock() {
            Ok(seen) => seen.usage_read.is_none_or(|at| at.elapsed() >= USAGE_FOR),
            Err(_) => false,
        };
        if !stale {
            return;
        }
        let read = db::shares::decayed_usage(reader, now, self.policy.half_life_secs).await;
        match (read, self.seen.lock()) {
            (Ok(usage), Ok(mut seen)) => {
                seen.usage = Arc::new(usage.into_iter().collect());
                (seen.usage_at, seen.usage_read) = (now, Some(Instant::now()));
            }
            (Err(error), _) => {
                tracing::warn!(%error, "reading users' GPU time for the fair share; using the last read")
            }
            _ => {}
        }
    }

    /// Whether the last look saw users waiting.
    pub fn anyone_waits(&self) -> bool {
        self.seen.lock().is_ok_and(|seen| !seen.waiting.is_empty() || !seen.submitted.is_empty())
    }

    /// Each user's recorded usage decayed to `now`.
    pub fn usage_at(&self, now: i64) -> BTreeMap<String, f64> {
        let Ok(seen) = self.seen.lock() else { return BTreeMap::new() };
        let age = (now - seen.usage_at) as f64 / 1000.0;
        let decay = |usage| shared::fair_share::decay(usage, age, self.policy.half_life_secs);
        seen.usage.iter().map(|(user, usage)| (user.clone(), decay(*usage))).collect()
    }

    /// Chooses a batch's jobs from the queues of `waiting` (read up to `fitting.limit` each):
    /// each free place to the user furthest below their share whose quota admits the job.
    pub async fn choose(
        &self,
        tx: &mut Tx,
        requests: &[(WorkerId, Capacity)],
        waiting: &[String],
        (fitting, excluded, charged): (Fitting, &std::collections::HashSet<JobId>, &[(String, u32)]),
        now: i64,
    ) -> ApiResult<Choices> {
        let mut holdings = db::shares::holdings(tx.conn().await?, now).await?;
        // Jobs this batch takes already (a held worker's job): theirs for the quotas too.
        for (owner, gpus) in charged {
            match holdings.iter_mut().find(|holding| holding.owner == *owner) {
                Some(holding) => {
                    (holding.held.gpus, holding.held.running) = (holding.held.gpus + gpus, holding.held.running + 1)
                }
                None => holdings.push(db::shares::Holding {
                    owner: owner.clone(),
                    held: Held { gpus: *gpus, running: 1 },
                    running_secs: 0.0,
                }),
            }
        }
        let held = |user: &str| holdings.iter().find(|holding| holding.owner == user);
        // A user whose quota refuses even a job without GPUs gets nothing: their queue is not read.
        let open = |user: &str| {
            let holding = held(user).map(|holding| holding.held).unwrap_or_default();
            shared::fair_share::admits(user, holding, 0, &self.policy).is_ok()
        };
        let mut queues: Vec<Vec<Candidate>> = Vec::with_capacity(waiting.len());
        for user in waiting {
            let mut queue = match open(user) {
                true => db::claims::queued_candidates(tx.conn().await?, fitting, Some(user)).await?,
                false => Vec::new(),
            };
            queue.retain(|candidate| !excluded.contains(&candidate.id));
            queues.push(queue);
        }
        let usage = self.usage_at(now);
        let contenders: Vec<Contender<'_>> = waiting
            .iter()
            .zip(&queues)
            .map(|(user, queue)| {
                let holding = held(user);
                Contender {
                    user,
                    usage: usage.get(user).copied().unwrap_or(0.0) + holding.map_or(0.0, |h| h.running_secs),
                    held: holding.map(|holding| holding.held).unwrap_or_default(),
                    jobs: queue.iter().map(|candidate| &candidate.resources).collect(),
                    classes: queue.iter().map(|candidate| candidate.class).collect(),
                }
            })
            .collect();
        let capacities: Vec<Capacity> = requests.iter().map(|(_, capacity)| capacity.clone()).collect();
        let picks = allot(&capacities, &contenders, &self.policy);
        let mut filled = vec![0u32; requests.len()];
        let mut after: Vec<Held> = contenders.iter().map(|contender| contender.held).collect();
        let mut charged: Vec<f64> = contenders.iter().map(|contender| contender.usage).collect();
        let mut chosen = HashMap::with_capacity(picks.len());
        let mut order = Vec::with_capacity(picks.len());
        for pick in picks {
            let id = queues[pick.user][pick.job].id;
            filled[pick.request] += 1;
            after[pick.user].gpus += pick.placement.gpus.len() as u32;
            after[pick.user].running += 1;
            charged[pick.user] += f64::from((pick.placement.gpus.len() as u32).max(1)) * START_CHARGE_SECS;
            order.push((id, requests[pick.request].0));
            chosen.insert(id, (pick.request, pick.placement));
        }
        let unfilled = requests.iter().zip(&filled).any(|((_, capacity), filled)| capacity.job_slots > *filled);
        // Reading further helps only a user whose read was cut and whose quota still admits a
        // one-GPU job: jobs past a refused user's first ones would be refused too.
        let cut = waiting.iter().zip(&queues).zip(&after).any(|((user, queue), held)| {
            queue.len() as u32 >= fitting.limit && shared::fair_share::admits(user, *held, 1, &self.policy).is_ok()
        });
        let standing = waiting
            .iter()
            .zip(after.iter().zip(&charged))
            .map(|(user, (held, usage))| Standing { user: user.clone(), usage: *usage, held: *held })
            .collect();
        Ok((chosen, order, unfilled, cut, standing))
    }
}

/// Looks at which users wait every [`WAITING_FOR`] until the queue is gone, so that a claim
/// that goes the plain way (the finish+claim steps) knows when several do: this replica's
/// submissions say so at once, another replica's are seen here within the second.
pub(super) async fn keep_looking(queue: std::sync::Weak<super::Queue>) {
    let mut warned: Option<Instant> = None;
    let mut looks: u32 = 0;
    loop {
        looks = looks.wrapping_add(1);
        let Some(queue) = queue.upgrade() else { return };
        if looks.is_multiple_of(SLOTS_EVERY) {
            queue.shares.add_slot_time(&queue).await;
        }
        let looked = match queue.shares.look(queue.reader()).await {
            Ok(()) => queue.shares.reservations.look(queue.reader()).await,
            Err(error) => Err(error),
        };
        if let Err(error) = looked {
            // Claims take the fair way meanwhile (`engaged`); said once a minute at most.
            if warned.is_none_or(|at| at.elapsed() >= Duration::from_secs(60)) {
                tracing::warn!(error = %error, "looking at which users wait; claims share by user until it works");
                warned = Some(Instant::now());
            }
        }
        drop(queue);
        tokio::time::sleep(WAITING_FOR).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_look_begun_before_a_submission_keeps_its_owner_and_a_later_one_trusts_the_read() {
        let shares = Shares::new(Policy::default());
        assert!(shares.engaged(), "before any look (a server just started): the fair way");
        let before = Instant::now();
        shares.submitted("user-b");
        assert_eq!(
            shares.store_look(vec!["user-a".into()], before),
            ["user-a", "user-b"],
            "the read may have missed it"
        );
        assert!(shares.engaged(), "two users wait");
        let after = Instant::now();
        assert_eq!(
            shares.store_look(vec!["user-a".into()], after),
            ["user-a"],
            "a read begun after sees what is there"
        );
        assert!(!shares.engaged());
    }
}
