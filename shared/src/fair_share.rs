//! Fair share between a lab's users (issue 29, item 2), decided without the database: the order
//! in which waiting users get freed GPUs, and whether a user's quota lets them start a job.
//!
//! As Slurm's fair-share factor: a user's usage is GPU-seconds (a CPU-only job counts its slots
//! as GPUs) decayed with a half-life, and the user whose decayed usage per unit of weight is
//! lowest is the furthest below their share and goes first. Within one user, the queue's own
//! order (priority, then submission) holds; a user alone gets everything. Not yet wired into the
//! claim path: the claim will feed these functions what the database holds.

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

/// Usage recorded `age_secs` ago, as it counts now: it halves every `half_life_secs`.
pub fn decay(usage: f64, age_secs: f64, half_life_secs: f64) -> f64 {
    usage * 0.5f64.powf(age_secs.max(0.0) / half_life_secs)
}

/// The order in which waiting users get freed GPUs, from each one's decayed usage: the lowest
/// usage per unit of weight first (the furthest below their share), ties by name.
pub fn order<'a>(waiting: &'a [(String, f64)], policy: &Policy) -> Vec<&'a str> {
    let mut standing: Vec<(f64, &str)> =
        waiting.iter().map(|(user, usage)| (usage.max(0.0) / policy.weight(user), user.as_str())).collect();
    standing.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(b.1)));
    standing.into_iter().map(|(_, user)| user).collect()
}

/// What a user holds now: GPUs (a CPU-only job's slots count as GPUs) and running jobs.
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
        let waiting = vec![("a".to_string(), 100.0), ("b".to_string(), 150.0), ("c".to_string(), 100.0)];
        // b's 150 GPU-seconds at weight 2 stand as 75: below a and c's 100; a before c by name.
        assert_eq!(order(&waiting, &policy()), ["b", "a", "c"]);
        assert_eq!(order(&[("solo".to_string(), 1e9)], &policy()), ["solo"], "a user alone goes first");
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

    #[test]
    fn weights_must_be_numbers_above_zero() {
        assert_eq!(check_weight("a", 2.5), Ok(2.5));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(check_weight("a", bad).unwrap_err().starts_with("the share of `a` must be a number above 0"));
        }
    }
}
