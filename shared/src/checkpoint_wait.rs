//! When a preempted job is stopped (issue 29; decision 0088): a job that saves a checkpoint
//! every few minutes and nothing on SIGTERM loses everything since its last save, half an
//! interval on average. Its worker has seen when it saved (`worker::saves`); when its next save
//! is due soon, the worker waits for it and sends SIGTERM right after, so the stop loses
//! seconds instead of minutes. The wait is bounded: at most half the preemption's grace, and
//! SIGKILL still comes a grace after the order, so a preemption takes no longer than before.

/// A save this close to the previous one (in ms), or closer than a tenth of the interval, is
/// "just taken": the job is stopped at once.
pub const MIN_SLACK_MS: i64 = 1_000;

/// How long to wait for a preempted job's next checkpoint: given the times of its saves in
/// this attempt (Unix ms, oldest first), the time until which to wait for the next one, when
/// it is due within `wait_ms` of `now` (its interval is the last two saves' distance); the
/// wait allows a tenth of the interval, at least [`MIN_SLACK_MS`], for a late save, and never
/// goes past `now + wait_ms`. `None`: stop it now, because fewer than two saves tell no
/// interval, a save was just taken, or the next is due too late or is overdue.
pub fn wait_until(saves: &[i64], now: i64, wait_ms: i64) -> Option<i64> {
    let [.., previous, last] = saves else { return None };
    let every = last.checked_sub(*previous).filter(|every| *every > 0)?;
    let slack = (every / 10).max(MIN_SLACK_MS);
    if now.saturating_sub(*last) < slack {
        return None;
    }
    let due = last.saturating_add(every);
    let deadline = due.saturating_add(slack).min(now.saturating_add(wait_ms));
    (deadline > now && due.saturating_sub(now) <= wait_ms).then_some(deadline)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: i64 = 60_000;

    #[test]
    fn a_save_due_within_the_wait_is_waited_for_with_a_little_slack() {
        // Saves every 5 minutes; the next is due at 15 min.
        let saves = [5 * MIN, 10 * MIN];
        assert_eq!(wait_until(&saves, 14 * MIN + 30_000, MIN), Some(15 * MIN + 30_000));
        // Due in a minute: waited for, but not past the wait.
        assert_eq!(wait_until(&saves, 14 * MIN, MIN), Some(15 * MIN));
        // Due in 2 minutes: too far for a 1-minute wait.
        assert_eq!(wait_until(&saves, 13 * MIN, MIN), None);
        assert_eq!(wait_until(&saves, 14 * MIN - 1, MIN), None);
        // Within its slack: a late save is still waited for, to the deadline.
        assert_eq!(wait_until(&saves, 15 * MIN + 10_000, MIN), Some(15 * MIN + 30_000));
        // Overdue past the slack: stopped now.
        assert_eq!(wait_until(&saves, 15 * MIN + 30_000, MIN), None);
    }

    #[test]
    fn no_interval_or_a_save_just_taken_stops_at_once() {
        assert_eq!(wait_until(&[], MIN, MIN), None);
        assert_eq!(wait_until(&[5 * MIN], 9 * MIN + 50_000, MIN), None, "one save tells no interval");
        assert_eq!(wait_until(&[5 * MIN, 5 * MIN], 5 * MIN + 100, MIN), None, "no interval either");
        assert_eq!(wait_until(&[5 * MIN, 10 * MIN], 10 * MIN + 20_000, 10 * MIN), None, "just saved");
        assert_eq!(wait_until(&[MIN, 2 * MIN, 10 * MIN], 10 * MIN + 100, 10 * MIN), None, "the last two count");
    }

    #[test]
    fn short_intervals_get_a_second_of_slack_and_extremes_do_not_overflow() {
        // Every 200 ms (an epoch a fifth of a second): wait to the next save plus a second.
        assert_eq!(wait_until(&[1_000, 1_200], 2_250, 5_000), Some(2_400));
        assert_eq!(wait_until(&[i64::MIN, i64::MAX], 0, i64::MAX), None);
        assert_eq!(wait_until(&[i64::MAX - 10, i64::MAX], 0, i64::MAX), None);
    }
}
