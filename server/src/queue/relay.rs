//! Changes across replicas (PostgreSQL): what one replica commits wakes the waiters of every
//! other one, as it wakes its own.
//!
//! After a commit, [`Events::emit`] hands the changes to the relay as well; the relay sends
//! them on PostgreSQL's `NOTIFY` channel (`db::postgres::CHANGES`), several commits to one
//! notification when they come quickly, and every replica's listener hands what the others
//! sent to its own [`Events`]: a long-polling claim on one replica wakes for a sweep submitted
//! on another, a log follower for a worker's append, the page for any change. A notification
//! is sent only after the COMMIT it reports, so a woken waiter reads the change.
//!
//! Notifications are not kept while a listener is disconnected: after its connection comes back
//! the listener wakes every kind of waiter once, and they read what they wait for again.

use super::events::{Change, Events};
use shared::api::JobId;
use std::collections::BTreeSet;
use tokio::sync::{mpsc, watch};

/// PostgreSQL's limit on a notification's payload is 8000 bytes; stay well below it.
const MAX_PAYLOAD: usize = 7000;

/// The notifications for `changes` from replica `origin`: `<origin> c j12 l12 p`, each change
/// once, split so that no payload exceeds [`MAX_PAYLOAD`].
pub fn encode(origin: &str, changes: &[Change]) -> Vec<String> {
    let mut words = BTreeSet::new();
    for change in changes {
        words.insert(match change {
            Change::Claimable => "c".to_string(),
            Change::Job(job) => format!("j{job}"),
            Change::Log(job) => format!("l{job}"),
            Change::Page => "p".to_string(),
        });
    }
    let mut payloads = Vec::new();
    let mut payload = String::new();
    for word in words {
        if !payload.is_empty() && payload.len() + 1 + word.len() > MAX_PAYLOAD {
            payloads.push(std::mem::take(&mut payload));
        }
        if payload.is_empty() {
            payload.push_str(origin);
        }
        payload.push(' ');
        payload.push_str(&word);
    }
    if !payload.is_empty() {
        payloads.push(payload);
    }
    payloads
}

/// The changes of a notification another replica sent; `None` for this replica's own (already
/// announced here) and for a payload that is not a relay's.
pub fn decode(own: &str, payload: &str) -> Option<Vec<Change>> {
    let mut words = payload.split(' ');
    let origin = words.next()?;
    if origin == own || origin.is_empty() {
        return None;
    }
    let job = |digits: &str| digits.parse::<i64>().ok().map(JobId::new);
    words
        .map(|word| match word.split_at_checked(1)? {
            ("c", "") => Some(Change::Claimable),
            ("p", "") => Some(Change::Page),
            ("j", digits) => job(digits).map(Change::Job),
            ("l", digits) => job(digits).map(Change::Log),
            _ => None,
        })
        .collect()
}

/// Starts the relay of `events` through `pool`: sends what this replica commits, hands on
/// what the others do; both end when the server shuts down.
pub fn start(pool: sqlx::PgPool, events: &Events, shutting_down: watch::Receiver<bool>) {
    // Per server, not per process: replicas may share one (the tests and benches do).
    let origin = format!("{:016x}", crate::storage::random_u64());
    let (outgoing, receiver) = mpsc::unbounded_channel();
    events.relay_to(outgoing);
    tokio::spawn(send(pool.clone(), origin.clone(), receiver, shutting_down.clone()));
    tokio::spawn(receive(pool, origin, events.clone(), shutting_down));
}

async fn send(
    pool: sqlx::PgPool,
    origin: String,
    mut receiver: mpsc::UnboundedReceiver<Vec<Change>>,
    mut shutting_down: watch::Receiver<bool>,
) {
    loop {
        let first = tokio::select! {
            changes = receiver.recv() => match changes {
                Some(changes) => changes,
                None => return,
            },
            _ = shutting_down.wait_for(|stop| *stop) => return,
        };
        // Whatever else was committed meanwhile goes in the same notification.
        let mut changes = first;
        while let Ok(more) = receiver.try_recv() {
            changes.extend(more);
        }
        for payload in encode(&origin, &changes) {
            if let Err(error) = crate::db::postgres::notify(&pool, &payload).await {
                // The other replicas' waiters time out and look again: late, not lost.
                tracing::warn!(%error, "telling the other replicas of a change");
            }
        }
    }
}

async fn receive(pool: sqlx::PgPool, own: String, events: Events, mut shutting_down: watch::Receiver<bool>) {
    let mut listener = None;
    loop {
        let Some(active) = listener.as_mut() else {
            match crate::db::postgres::listen(&pool).await {
                Ok(connected) => {
                    listener = Some(connected);
                    // Whatever was sent while no listener was connected is gone: everyone
                    // looks again.
                    events.emit_local(&[Change::Claimable, Change::Page]);
                }
                Err(error) => {
                    tracing::warn!(%error, "listening for the other replicas' changes; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                        _ = shutting_down.wait_for(|stop| *stop) => return,
                    }
                }
            }
            continue;
        };
        tokio::select! {
            received = active.try_recv() => match received {
                Ok(Some(notification)) => {
                    if let Some(changes) = decode(&own, notification.payload()) {
                        events.emit_local(&changes);
                    }
                }
                // The connection was lost: reconnect (and wake everyone) above.
                Ok(None) => listener = None,
                Err(error) => {
                    tracing::warn!(%error, "the listener for the other replicas' changes failed; reconnecting");
                    listener = None;
                }
            },
            _ = shutting_down.wait_for(|stop| *stop) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_travel_as_words_once_each_and_a_replica_ignores_its_own() {
        let changes =
            [Change::Job(JobId::new(12)), Change::Claimable, Change::Job(JobId::new(12)), Change::Log(JobId::new(3))];
        let payloads = encode("a1", &changes);
        assert_eq!(payloads, ["a1 c j12 l3"]);
        let mut decoded = decode("b2", &payloads[0]).unwrap();
        decoded.sort_by_key(|change| format!("{change:?}"));
        assert_eq!(decoded, [Change::Claimable, Change::Job(JobId::new(12)), Change::Log(JobId::new(3))]);
        assert_eq!(decode("a1", &payloads[0]), None, "its own");
        assert_eq!(decode("b2", "a1 x7"), None, "not a relay's payload");
        assert_eq!(decode("b2", "a1 j"), None);
        assert!(encode("a1", &[]).is_empty());
    }

    #[test]
    fn many_changes_are_split_below_postgres_payload_limit() {
        let changes: Vec<Change> = (0..5_000).map(|id| Change::Log(JobId::new(id))).collect();
        let payloads = encode("origin", &changes);
        assert!(payloads.len() > 1);
        assert!(payloads.iter().all(|payload| payload.len() <= MAX_PAYLOAD && payload.starts_with("origin ")));
        let back: usize = payloads.iter().map(|payload| decode("other", payload).unwrap().len()).sum();
        assert_eq!(back, 5_000, "every change arrives once");
    }
}
