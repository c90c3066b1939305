//! What the replicas of one database must agree on, checked when one starts: the lease (the
//! reaper of one would take back the jobs of workers heartbeating at the pace of another), and
//! the scheduler's settings (issue 29: the fair share, the quotas and the passes decide at
//! claim time on whichever replica answers, so two tables would make two schedulers).
//!
//! Each replica names its sessions with what it runs by (`application_name`: the lease, and a
//! short digest of each group of scheduler settings); a starting replica reads the running
//! ones' names from `pg_stat_activity` and refuses to start beside any that differ. A name
//! without digests (a build from before them) is checked for its lease alone.

use sha2::{Digest, Sha256};

/// What every session of a replica names itself, followed by the replica's lease in ms.
pub(super) const REPLICA_NAME: &str = "app replica, lease_ms=";
const SCHEDULER: &str = ", sched=";
/// Hex digits of each group's digest (PostgreSQL keeps 63 bytes of a name).
const DIGITS: usize = 6;

/// A replica's lease and its scheduler settings, by group: (what the group is, in the words
/// of the configuration, and the digest of its values).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Agreement {
    pub lease_ms: u64,
    scheduler: Vec<(&'static str, String)>,
}

impl Agreement {
    /// The lease alone: nothing of the scheduler is said or checked.
    pub fn lease(lease_ms: u64) -> Agreement {
        Agreement { lease_ms, scheduler: Vec::new() }
    }

    /// The lease and each group of scheduler settings: `(what it is, its values written out
    /// the same way by every build)`.
    pub fn with_scheduler(lease_ms: u64, groups: &[(&'static str, String)]) -> Agreement {
        let digest = |values: &str| {
            let hash = Sha256::digest(values.as_bytes());
            hash.iter().map(|byte| format!("{byte:02x}")).collect::<String>()[..DIGITS].to_string()
        };
        Agreement { lease_ms, scheduler: groups.iter().map(|(what, values)| (*what, digest(values))).collect() }
    }

    /// The `application_name` of this replica's sessions.
    pub fn application_name(&self) -> String {
        let mut name = format!("{REPLICA_NAME}{}", self.lease_ms);
        if !self.scheduler.is_empty() {
            let digests: Vec<&str> = self.scheduler.iter().map(|(_, digest)| digest.as_str()).collect();
            name.push_str(SCHEDULER);
            name.push_str(&digests.join("."));
        }
        name
    }

    /// Refuses to start beside running replicas named `others` that do not agree, saying what
    /// differs and how to start.
    pub fn check(&self, others: &[String]) -> anyhow::Result<()> {
        for other in others {
            let Some(said) = other.strip_prefix(REPLICA_NAME) else { continue };
            let (lease, scheduler) = match said.split_once(SCHEDULER) {
                Some((lease, scheduler)) => (lease, Some(scheduler)),
                None => (said, None),
            };
            if let Ok(lease) = lease.parse::<u64>() {
                if lease != self.lease_ms {
                    anyhow::bail!(
                        "another replica of this database runs with lease_secs = {}, this one with lease_secs = {}: \
                         replicas must agree on the lease (set lease_secs = {0} here, or stop every replica and \
                         start them all with the new value)",
                        lease as f64 / 1000.0,
                        self.lease_ms as f64 / 1000.0
                    );
                }
            }
            let (Some(scheduler), false) = (scheduler, self.scheduler.is_empty()) else { continue };
            let theirs: Vec<&str> = scheduler.split('.').collect();
            if theirs.len() != self.scheduler.len() {
                continue; // another build's groups: nothing to compare
            }
            let differ: Vec<&str> = self
                .scheduler
                .iter()
                .zip(&theirs)
                .filter(|((_, mine), theirs)| mine != *theirs)
                .map(|((what, _), _)| *what)
                .collect();
            if !differ.is_empty() {
                anyhow::bail!(
                    "another replica of this database runs with other scheduler settings in its [server] table \
                     ({}): every replica decides claims and preemptions, so they must share one [server] table \
                     (give this one the same, or stop every replica and start them all with the new one)",
                    differ.join("; ")
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups(min_runtime: &str) -> Vec<(&'static str, String)> {
        vec![
            ("the shares: [server.shares], share_half_life_secs", "ana=2".into()),
            ("the quotas: [server.quotas], [server.default_quota]", String::new()),
            ("preemption: min_runtime_secs, ...", min_runtime.into()),
        ]
    }

    #[test]
    fn replicas_agree_on_the_lease_and_on_each_group_of_scheduler_settings() {
        let mine = Agreement::with_scheduler(30_000, &groups("600"));
        let name = mine.application_name();
        assert!(name.len() <= 63, "PostgreSQL keeps 63 bytes: {name}");
        assert!(mine.check(std::slice::from_ref(&name)).is_ok(), "the same settings");
        let other = Agreement::with_scheduler(30_000, &groups("60")).application_name();
        let refused = mine.check(&[other]).unwrap_err().to_string();
        assert!(refused.contains("(preemption: min_runtime_secs, ...)"), "{refused}");
        assert!(!refused.contains("the shares"), "{refused}");
        let longer = Agreement::with_scheduler(20_000, &groups("600")).application_name();
        assert!(mine
            .check(&[longer])
            .unwrap_err()
            .to_string()
            .contains("lease_secs = 20, this one with lease_secs = 30"));
        // An older build's name says its lease alone; a lease-only replica checks no settings.
        assert!(mine.check(&[format!("{REPLICA_NAME}30000")]).is_ok());
        assert!(Agreement::lease(30_000)
            .check(&[Agreement::with_scheduler(30_000, &groups("60")).application_name()])
            .is_ok());
        assert!(mine.check(&["psql".into(), format!("{REPLICA_NAME}x")]).is_ok(), "other sessions are not replicas");
    }
}
