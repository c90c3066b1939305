//! Fair share between a lab's users (issue 29, item 2), decided without the database: the order
//! in which waiting users get freed GPUs, and whether a user's quota lets them start a job.
//!
//! As Slurm's fair-share factor: a user's usage is GPU-seconds (a job without GPUs counts as one
//! GPU) decayed with a half-life, and the user whose decayed usage per unit of weight is
//! lowest is the furthest below their share and goes first. Within one user, the queue's own
//! order (priority, then submission) holds; a user alone gets everything. A claim batch feeds
//! [`allot`] what the database holds (`server::queue::claims`).

use crate::api::AttemptRecord;
use crate::placement::{place, Capacity, Placement};
use crate::sweep::Resources;
use std::collections::BTreeMap;
use std::fmt;

/// Slurm's default `PriorityDecayHalfLife`: 7 days.
pub const DEFAULT_HALF_LIFE_SECS: f64 = 7.0 * 24.0 * 3600.0;

/// What one user may hold at once; `None` is no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Quota {
    pub max_gpus: Option<u32>,
    pub max_running: Option<u32>,
}

/// The server's fair-share settings (`[server.shares]`, `[server.quotas]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub half_life_secs: f64,
    /// Users' weights; a user not listed weighs 1.
    pub weights: BTreeMap<String, f64>,
    /// Users' quotas; a user not listed has `default_quota`.
    pub quotas: BTreeMap<String, Quota>,
    pub default_quota: Quota,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            half_life_secs: DEFAULT_HALF_LIFE_SECS,
            weights: BTreeMap::new(),
            quotas: BTreeMap::new(),
            default_quota: Quota::default(),
        }
    }
}

impl Policy {
    pub fn weight(&self, user: &str) -> f64 {
        self.weights.get(user).copied().unwrap_or(1.0)
    }

    pub fn quota(&self, user: &str) -> Quota {
        self.quotas.get(user).copied().unwrap_or(self.default_quota)
    }
}

/// A weight as the configuration gives it: a finite number above 0, else why not.
pub fn check_weight(user: &str, weight: f64) -> Result<f64, String> {
    match weight.is_finite() && weight > 0.0 {
        true => Ok(weight),
        false => Err(format!("the share of `{user}` must be a number above 0, not {weight}")),
    }
}

/// Why a sweep may not be in the priority class it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClassRefused {
    /// The server has no class of that name; its classes, by name.
    Unknown { class: String, known: Vec<String> },
    /// A class above the default (0) is an admin's to give.
    NotAdmin { class: String, value: i64 },
}

impl fmt::Display for ClassRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClassRefused::Unknown { class, known } if known.is_empty() => {
                write!(f, "no priority class `{class}`: this server has none ([server.priority_classes])")
            }
            ClassRefused::Unknown { class, known } => write!(
                f,
                "no priority class `{class}`: this server's are {} ([server.priority_classes])",
                known.iter().map(|name| format!("`{name}`")).collect::<Vec<_>>().join(", ")
            ),
            ClassRefused::NotAdmin { class, value } => write!(
                f,
                "priority class `{class}` ({value}) is above the default: only an admin may submit a sweep in it"
            ),
        }
    }
}

/// The value of the priority class a sweep names (`None`: the default, 0) among the server's
/// `classes`, submitted by an admin or not. As Kubernetes' priority classes, a higher value
/// goes first across users and may preempt lower ones; unlike them, a class above 0 is an
/// admin's to give (a lab's users could otherwise all name the highest), while anyone may
/// name one at or below it (to volunteer their jobs to go last).
pub fn class_value(classes: &BTreeMap<String, i64>, named: Option<&str>, admin: bool) -> Result<i64, ClassRefused> {
    let Some(class) = named else { return Ok(0) };
    let Some(&value) = classes.get(class) else {
        return Err(ClassRefused::Unknown { class: class.into(), known: classes.keys().cloned().collect() });
    };
    match value > 0 && !admin {
        true => Err(ClassRefused::NotAdmin { class: class.into(), value }),
        false => Ok(value),
    }
}

/// Usage recorded `age_secs` ago, as it counts now: it halves every `half_life_secs`.
pub fn decay(usage: f64, age_secs: f64, half_life_secs: f64) -> f64 {
    usage * 0.5f64.powf(age_secs.max(0.0) / half_life_secs)
}

/// What an ended attempt's record charges its owner's usage: the GPU time it held, or for an
/// attempt without GPUs the time it held its job slot (counted as one GPU, as a running job
/// without GPUs is). Nothing for a record that says neither.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Charge {
    Gpu(f64),
    Slot(f64),
}

impl Charge {
    pub fn seconds(self) -> f64 {
        match self {
            Charge::Gpu(seconds) | Charge::Slot(seconds) => seconds,
        }
    }
}

/// The [`Charge`] of an attempt's record (its times are Unix ms).
pub fn charge(record: &AttemptRecord) -> Option<Charge> {
    let positive = |seconds: f64| seconds.is_finite() && seconds > 0.0;
    match &record.gpu_usage {
        Some(usage) => Some(Charge::Gpu(usage.gpu_hours * 3600.0)).filter(|charge| positive(charge.seconds())),
        None if record.gpus.is_empty() => {
            let held = record.finished_at.saturating_sub(record.started_at) as f64 / 1000.0;
            Some(Charge::Slot(held)).filter(|charge| positive(charge.seconds()))
        }
        None => None,
    }
}

/// The order in which waiting users get free places, from each one's usage now (`(user,
/// GPU-seconds)`): their indices, the lowest usage per unit of weight first (the furthest below
/// their share), ties by name.
pub fn order(usages: &[(&str, f64)], policy: &Policy) -> Vec<usize> {
    let mut standing: Vec<(f64, &str, usize)> =
        usages.iter().enumerate().map(|(at, (user, usage))| (rank(user, *usage, policy), *user, at)).collect();
    standing.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(b.1)));
    standing.into_iter().map(|(_, _, at)| at).collect()
}

/// Where `user` with `usage` GPU-seconds stands in [`order`]: usage per unit of weight, the
/// lowest first.
pub fn rank(user: &str, usage: f64, policy: &Policy) -> f64 {
    standing(usage) / policy.weight(user)
}

/// Usage as it ranks: never below 0, and a usage that is not a number last, never first.
fn standing(usage: f64) -> f64 {
    if usage.is_nan() {
        f64::INFINITY
    } else {
        usage.max(0.0)
    }
}

/// What a user holds now: GPUs and running jobs (a CPU-only job holds a job and no GPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Held {
    pub gpus: u32,
    pub running: u32,
}

/// Why a quota holds a user's job back, in the words `app status` uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuotaHeld {
    /// Starting it would take the user past their GPUs.
    Gpus { user: String, held: u32, allowed: u32 },
    /// Starting it would take the user past their running jobs.
    Running { user: String, held: u32, allowed: u32 },
    /// It needs more GPUs than the user may ever hold.
    TooLarge { user: String, needs: u32, allowed: u32 },
}

impl fmt::Display for QuotaHeld {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuotaHeld::Gpus { user, held, allowed } => write!(f, "{user} holds {held} of {allowed} allowed GPUs"),
            QuotaHeld::Running { user, held, allowed } => write!(f, "{user} runs {held} of {allowed} allowed jobs"),
            QuotaHeld::TooLarge { user, needs, allowed } => {
                write!(f, "the job needs {needs} GPUs, more than the {allowed} {user} may hold")
            }
        }
    }
}

/// Whether `user`'s quota lets them, holding `held`, start a job of `gpus` GPUs.
pub fn admits(user: &str, held: Held, gpus: u32, policy: &Policy) -> Result<(), QuotaHeld> {
    let quota = policy.quota(user);
    if let Some(allowed) = quota.max_gpus {
        if gpus > allowed {
            return Err(QuotaHeld::TooLarge { user: user.into(), needs: gpus, allowed });
        }
        if held.gpus.saturating_add(gpus) > allowed {
            return Err(QuotaHeld::Gpus { user: user.into(), held: held.gpus, allowed });
        }
    }
    if let Some(allowed) = quota.max_running {
        if held.running >= allowed {
            return Err(QuotaHeld::Running { user: user.into(), held: held.running, allowed });
        }
    }
    Ok(())
}

/// What a job started counts as, per GPU (or per job without GPUs), until it has run longer: a
/// minute. Each job a batch picks counts it at once for the choices after it, and a running job
/// at least it (`server::db::shares::holdings`). Without it, users of equal standing would see
/// every GPU freed at once go to the first by name.
pub const START_CHARGE_SECS: f64 = 60.0;

/// A waiting user in a claim batch: their usage now (decayed GPU-seconds, running attempts'
/// time so far included), what they hold, and their queued jobs in their own dispatch order,
/// with each job's priority class value (`classes`, by job; empty: all in the default, 0).
#[derive(Debug, Clone)]
pub struct Contender<'a> {
    pub user: &'a str,
    pub usage: f64,
    pub held: Held,
    pub jobs: Vec<&'a Resources>,
    pub classes: Vec<i64>,
}

impl Contender<'_> {
    /// The priority class value of job `job`.
    pub fn class(&self, job: usize) -> i64 {
        self.classes.get(job).copied().unwrap_or(0)
    }
}

/// One job given: to request `request`, user `user`'s job `job` (indices into [`allot`]'s
/// arguments), on `placement`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pick {
    pub request: usize,
    pub user: usize,
    pub job: usize,
    pub placement: Placement,
}

/// Fills each request (in arrival order) job by job: each free place goes to the user whose
/// first job that fits it and that their quota admits is of the highest priority class, and
/// among those to the one furthest below their share ([`order`]), taking that job. Each job
/// started counts as [`START_CHARGE_SECS`] of its GPUs (or slot) for the rest of the batch,
/// and as held for the quotas.
pub fn allot(requests: &[Capacity], contenders: &[Contender<'_>], policy: &Policy) -> Vec<Pick> {
    let mut usage: Vec<f64> = contenders.iter().map(|contender| standing(contender.usage)).collect();
    let mut held: Vec<Held> = contenders.iter().map(|contender| contender.held).collect();
    let mut taken: Vec<Vec<bool>> = contenders.iter().map(|contender| vec![false; contender.jobs.len()]).collect();
    let mut picks = Vec::new();
    for (request, capacity) in requests.iter().enumerate() {
        let mut free = capacity.clone();
        // A user with nothing that fits and is admitted has nothing later in this request
        // either: the room only shrinks and their holdings only grow.
        let mut done = vec![false; contenders.len()];
        while free.job_slots > 0 {
            let usages: Vec<(&str, f64)> =
                contenders.iter().zip(&usage).map(|(contender, usage)| (contender.user, *usage)).collect();
            let mut chosen: Option<(usize, usize, Placement)> = None;
            for user in order(&usages, policy) {
                let name = contenders[user].user;
                if done[user] {
                    continue;
                }
                let first = contenders[user].jobs.iter().enumerate().find_map(|(job, resources)| {
                    if taken[user][job] {
                        return None;
                    }
                    let placement = place(resources, &free)?;
                    admits(name, held[user], placement.gpus.len() as u32, policy).ok()?;
                    Some((user, job, placement))
                });
                match first {
                    // A later user (in share order) wins only with a higher class.
                    Some((_, job, _)) => {
                        let higher = chosen.as_ref().is_none_or(|(best, best_job, _)| {
                            contenders[user].class(job) > contenders[*best].class(*best_job)
                        });
                        if higher {
                            chosen = first;
                        }
                    }
                    None => done[user] = true,
                }
            }
            let Some((user, job, placement)) = chosen else { break };
            let gpus = placement.gpus.len() as u32;
            free.reserve(contenders[user].jobs[job], &placement);
            taken[user][job] = true;
            held[user].gpus += gpus;
            held[user].running += 1;
            usage[user] += f64::from(gpus.max(1)) * START_CHARGE_SECS;
            picks.push(Pick { request, user, job, placement });
        }
    }
    picks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy {
            weights: BTreeMap::from([("b".to_string(), 2.0)]),
            quotas: BTreeMap::from([("a".to_string(), Quota { max_gpus: Some(8), max_running: Some(3) })]),
            ..Policy::default()
        }
    }

    #[test]
    fn the_user_furthest_below_their_share_goes_first() {
        let waiting = [("a", 100.0), ("b", 150.0), ("c", 100.0)];
        // b's 150 GPU-seconds at weight 2 stand as 75: below a and c's 100; a before c by name.
        assert_eq!(order(&waiting, &policy()), [1, 0, 2]);
        assert_eq!(order(&[("solo", 1e9)], &policy()), [0], "a user alone goes first");
    }

    #[test]
    fn a_record_charges_its_gpu_time_or_else_its_slot_time() {
        let gpu = crate::api::GpuUsage { gpu_hours: 0.5, ..Default::default() };
        let held = |gpus: &[&str], usage: Option<crate::api::GpuUsage>, (started_at, finished_at)| AttemptRecord {
            gpus: gpus.iter().map(|name| name.to_string()).collect(),
            gpu_usage: usage,
            started_at,
            finished_at,
            ..AttemptRecord::default()
        };
        assert_eq!(charge(&held(&["H100"], Some(gpu.clone()), (0, 90_000))), Some(Charge::Gpu(1800.0)));
        assert_eq!(charge(&held(&[], None, (1_000, 91_000))), Some(Charge::Slot(90.0)), "a CPU job's slot");
        assert_eq!(charge(&held(&["H100"], None, (0, 90_000))), None, "GPUs held but not measured");
        assert_eq!(charge(&held(&[], None, (91_000, 1_000))), None, "a clock that stepped back");
        assert_eq!(charge(&held(&[], None, (i64::MIN, i64::MAX))).map(|c| c.seconds().is_finite()), Some(true));
        let nan = crate::api::GpuUsage { gpu_hours: f64::NAN, ..gpu };
        assert_eq!(charge(&held(&["H100"], Some(nan), (0, 90_000))), None);
    }

    #[test]
    fn a_class_above_the_default_is_an_admins_to_give() {
        let classes = BTreeMap::from([("urgent".to_string(), 100), ("low".to_string(), -10)]);
        assert_eq!(class_value(&classes, None, false), Ok(0));
        assert_eq!(class_value(&classes, Some("low"), false), Ok(-10));
        assert_eq!(class_value(&classes, Some("urgent"), true), Ok(100));
        let refused = class_value(&classes, Some("urgent"), false).unwrap_err();
        assert_eq!(refused, ClassRefused::NotAdmin { class: "urgent".into(), value: 100 });
        assert!(refused.to_string().contains("only an admin"), "{refused}");
        let unknown = class_value(&classes, Some("high"), true).unwrap_err().to_string();
        assert!(unknown.contains("no priority class `high`: this server's are `low`, `urgent`"), "{unknown}");
        assert!(class_value(&BTreeMap::new(), Some("x"), true).unwrap_err().to_string().contains("has none"));
    }

    #[test]
    fn usage_halves_every_half_life() {
        assert_eq!(decay(100.0, 0.0, 10.0), 100.0);
        assert!((decay(100.0, 10.0, 10.0) - 50.0).abs() < 1e-9);
        assert!((decay(100.0, 30.0, 10.0) - 12.5).abs() < 1e-9);
        assert_eq!(decay(100.0, -5.0, 10.0), 100.0, "a clock that stepped back does not inflate usage");
    }

    #[test]
    fn quotas_hold_back_with_the_words_status_shows() {
        let policy = policy();
        let held = Held { gpus: 8, running: 2 };
        assert_eq!(admits("a", held, 1, &policy).unwrap_err().to_string(), "a holds 8 of 8 allowed GPUs");
        let held = Held { gpus: 2, running: 3 };
        assert_eq!(admits("a", held, 1, &policy).unwrap_err().to_string(), "a runs 3 of 3 allowed jobs");
        assert_eq!(
            admits("a", Held::default(), 9, &policy).unwrap_err().to_string(),
            "the job needs 9 GPUs, more than the 8 a may hold"
        );
        assert_eq!(admits("a", Held { gpus: 6, running: 2 }, 2, &policy), Ok(()));
        assert_eq!(admits("b", Held { gpus: 1_000, running: 1_000 }, 8, &policy), Ok(()), "no quota, no limit");
    }

    /// A worker with `gpus` free 80 GB GPUs and a slot for each.
    fn worker(gpus: u32) -> Capacity {
        let gpu = |index| crate::placement::GpuSlot {
            index,
            memory_total: 80 << 30,
            memory_free: 80 << 30,
            exclusive_held: false,
            shared_jobs: 0,
        };
        Capacity { job_slots: gpus, gpus: (0..gpus).map(gpu).collect(), ..Capacity::default() }
    }

    fn gpus(count: u32) -> Resources {
        Resources { gpus: Some(count), ..Resources::default() }
    }

    /// The users of `picks`, in the order given.
    fn users(picks: &[Pick], contenders: &[Contender<'_>]) -> Vec<String> {
        picks.iter().map(|pick| contenders[pick.user].user.to_string()).collect()
    }

    #[test]
    fn freed_gpus_go_by_standing_and_each_start_counts_for_the_rest_of_the_batch() {
        let one = gpus(1);
        let contender =
            |user, usage| Contender { user, usage, held: Held::default(), jobs: vec![&one; 8], classes: Vec::new() };
        let even = [contender("b", 0.0), contender("a", 0.0)];
        let picks = allot(&[worker(4)], &even, &Policy::default());
        assert_eq!(users(&picks, &even), ["a", "b", "a", "b"], "equal standing: alternate, ties by name");
        let behind = [contender("a", 0.0), contender("b", 150.0)];
        let picks = allot(&[worker(4)], &behind, &Policy::default());
        assert_eq!(users(&picks, &behind), ["a", "a", "a", "b"], "a is 150 GPU-seconds behind b");
        let weighted = [contender("a", 0.0), contender("b", 0.0)];
        let picks = allot(&[worker(3), worker(3)], &weighted, &policy());
        assert_eq!(users(&picks, &weighted), ["a", "b", "b", "a", "b", "b"], "b weighs 2: a third for a");
        let picked: Vec<(usize, usize)> = picks.iter().map(|pick| (pick.request, pick.user)).collect();
        assert_eq!(picked.iter().filter(|(request, _)| *request == 1).count(), 3, "the second worker filled too");
        let alone = [contender("a", 1e9)];
        assert_eq!(allot(&[worker(4)], &alone, &Policy::default()).len(), 4, "a user alone gets everything");
    }

    #[test]
    fn a_higher_class_goes_first_whatever_the_shares_and_a_lower_one_fills_what_it_cannot() {
        fn contender<'a>(user: &'a str, usage: f64, jobs: Vec<&'a Resources>, class: i64) -> Contender<'a> {
            Contender { user, usage, held: Held::default(), classes: vec![class; jobs.len()], jobs }
        }
        let (one, four) = (&gpus(1), &gpus(4));
        // b has used far more, but its jobs are of class 10.
        let contenders = [contender("a", 0.0, vec![one; 4], 0), contender("b", 1e6, vec![one, one], 10)];
        let users: Vec<usize> = allot(&[worker(3)], &contenders, &Policy::default()).iter().map(|p| p.user).collect();
        assert_eq!(users, [1, 1, 0], "b's two first, then a");
        // b's class-10 job needs four GPUs and three are free: a's job of class 0 fits.
        let contenders = [contender("a", 0.0, vec![one; 4], 0), contender("b", 0.0, vec![four], 10)];
        let users: Vec<usize> = allot(&[worker(3)], &contenders, &Policy::default()).iter().map(|p| p.user).collect();
        assert_eq!(users, [0, 0, 0]);
        // Equal classes: the shares decide, as without classes.
        let contenders = [contender("a", 0.0, vec![one; 4], 5), contender("b", 1e6, vec![one; 4], 5)];
        let users: Vec<usize> = allot(&[worker(2)], &contenders, &Policy::default()).iter().map(|p| p.user).collect();
        assert_eq!(users, [0, 0]);
    }

    #[test]
    fn a_job_that_does_not_fit_or_is_over_quota_gives_way_to_the_next() {
        let (one, four) = (gpus(1), gpus(4));
        let contenders = [
            Contender {
                user: "a",
                usage: 0.0,
                held: Held { gpus: 6, running: 1 },
                jobs: vec![&four, &one, &one, &one],
                classes: Vec::new(),
            },
            Contender { user: "b", usage: 500.0, held: Held::default(), jobs: vec![&one; 4], classes: Vec::new() },
        ];
        let picks = allot(&[worker(4)], &contenders, &policy());
        // a may hold 8 GPUs and 3 jobs: its 4-GPU job would make 10, and one 1-GPU job later
        // it runs 3; the rest goes to b, whatever its usage.
        assert_eq!(users(&picks, &contenders), ["a", "a", "b", "b"]);
        assert_eq!((picks[0].job, picks[1].job), (1, 2), "a's own order, past the job over its quota");
        let places: Vec<&[u32]> = picks.iter().map(|pick| pick.placement.gpus.as_slice()).collect();
        let mut all: Vec<u32> = places.concat();
        all.sort_unstable();
        assert_eq!(all, [0, 1, 2, 3], "each GPU given once");
    }

    #[test]
    fn weights_must_be_numbers_above_zero() {
        assert_eq!(check_weight("a", 2.5), Ok(2.5));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(check_weight("a", bad).unwrap_err().starts_with("the share of `a` must be a number above 0"));
        }
    }
}
