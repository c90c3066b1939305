//! What each open connection is doing, and which one goes when the server must make room.
//!
//! A connection is *busy* while a request it delivered is being answered (a long poll, an
//! event stream, a download), *idle* while it has no request in flight (nothing sent yet, half
//! a request head, an HTTP/2 preface, a keep-alive pause) and *unfinished* while its request
//! waits for a body that is not arriving. Idle and unfinished connections are what a client
//! can hold without using them: they are closed after a timeout, and evicted, oldest activity
//! first, when the server is at its cap. One address's cap counts only the connections that
//! never completed a request (silent, half a head, a first body that stalls): a keep-alive
//! connection of a worker between two requests is one it uses, whoever shares its address.
//! Busy connections are never evicted.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// What a connection is doing, for the eviction choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    Busy,
    /// Idle or unfinished, with its last activity (milliseconds since the registry began).
    Holding {
        since_ms: u64,
    },
}

/// The connection to evict among `candidates`: the one holding without use the longest, and
/// since `before_ms` at least (a connection just opened, or just done with a request, is on its
/// way to its next request: a burst of a thousand workers connecting at once must not evict
/// each other before they have sent a byte).
pub fn oldest_holding(candidates: impl IntoIterator<Item = (u64, Standing)>, before_ms: u64) -> Option<u64> {
    candidates
        .into_iter()
        .filter_map(|(id, standing)| match standing {
            Standing::Holding { since_ms } if since_ms <= before_ms => Some((since_ms, id)),
            _ => None,
        })
        .min()
        .map(|(_, id)| id)
}

/// How long a connection holds without use before it may be evicted: long enough for a
/// connection's request head to follow its opening, short enough that a flood of silent
/// connections delays others by no more than this.
pub const EVICTION_GRACE: std::time::Duration = std::time::Duration::from_millis(250);

/// One open connection.
pub struct Tracker {
    pub id: u64,
    pub address: Option<IpAddr>,
    epoch: Instant,
    in_flight: AtomicUsize,
    open_bodies: AtomicUsize,
    /// The last activity: the end of the last request, or the last piece of a body.
    since_ms: AtomicU64,
    /// An authenticated request on it was answered: the connection is used, not only held.
    served: AtomicBool,
    evicted: AtomicBool,
    /// The registry's count of evictions not yet closed, which this one may be part of.
    evicting: Arc<AtomicUsize>,
    /// Answers on their way out, each with since when (ms, 0: none) it waits for hyper to take
    /// its next piece: a client that stops reading leaves hyper unable to.
    answers: Mutex<Vec<Weak<AtomicU64>>>,
    changed: Notify,
}

impl Tracker {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    pub fn standing(&self) -> Standing {
        let in_flight = self.in_flight.load(Ordering::Acquire);
        let waiting_for_body = self.open_bodies.load(Ordering::Acquire) > 0;
        if in_flight > 0 && !waiting_for_body {
            Standing::Busy
        } else {
            Standing::Holding { since_ms: self.since_ms.load(Ordering::Acquire) }
        }
    }

    /// A request head arrived; the guard ends the request when the answer is done or dropped.
    pub fn begin_request(self: &Arc<Self>) -> RequestGuard {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.changed.notify_waiters();
        RequestGuard { tracker: self.clone(), authenticated: false }
    }

    /// An answer on its way out: what it keeps up to date of its progress (see `answers`).
    pub fn answering(&self) -> Arc<AtomicU64> {
        let waiting = Arc::new(AtomicU64::new(0));
        if let Ok(mut answers) = self.answers.lock() {
            answers.retain(|answer| answer.strong_count() > 0);
            answers.push(Arc::downgrade(&waiting));
        }
        waiting
    }

    /// The time (ms) since when the answer stuck longest has waited for hyper, if one does.
    fn stuck_since(&self) -> Option<u64> {
        let answers = self.answers.lock().ok()?;
        answers
            .iter()
            .filter_map(Weak::upgrade)
            .map(|since| since.load(Ordering::Acquire))
            .filter(|since| *since > 0)
            .min()
    }

    pub fn now(&self) -> u64 {
        self.now_ms()
    }

    /// A request body that has not fully arrived; the guard says when it has (or is dropped).
    pub fn body_opened(self: &Arc<Self>) -> BodyGuard {
        self.open_bodies.fetch_add(1, Ordering::AcqRel);
        self.touch();
        BodyGuard(self.clone())
    }

    /// Some of a body arrived.
    pub fn touch(&self) {
        self.since_ms.store(self.now_ms(), Ordering::Release);
    }

    /// Asks the connection's task to close it now.
    pub fn evict(&self) {
        if !self.evicted.swap(true, Ordering::AcqRel) {
            self.evicting.fetch_add(1, Ordering::AcqRel);
        }
        self.changed.notify_waiters();
    }

    /// Takes an eviction back: a request started on the connection as it was chosen.
    fn spare(&self) {
        if self.evicted.swap(false, Ordering::AcqRel) {
            self.evicting.fetch_sub(1, Ordering::AcqRel);
        }
    }

    /// Completes when the connection must be closed: evicted while it holds without use, with
    /// no request in flight for `idle_limit` (which covers a connection that never sent a whole
    /// request head, whatever it sent, and a keep-alive connection that stays silent), or with
    /// an answer hyper has not taken its next piece of for `stall_limit` (a client that does
    /// not read: an HTTP/2 window it never opens, pipelined requests it never reads).
    pub async fn expired(&self, idle_limit: Duration, stall_limit: Duration) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.evicted.load(Ordering::Acquire) {
                if matches!(self.standing(), Standing::Holding { .. }) {
                    return;
                }
                self.spare();
            }
            if self.in_flight.load(Ordering::Acquire) > 0 {
                // Checked now and then: an answer stuck on the client is no event of ours.
                let check = stall_limit / 4;
                if let Some(since) = self.stuck_since() {
                    if self.now_ms().saturating_sub(since) >= stall_limit.as_millis() as u64 {
                        return;
                    }
                }
                tokio::select! {
                    () = changed => {}
                    () = tokio::time::sleep(check) => {}
                }
                continue;
            }
            let deadline = self.epoch + Duration::from_millis(self.since_ms.load(Ordering::Acquire)) + idle_limit;
            if Instant::now() >= deadline {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => {}
                () = changed => {}
            }
        }
    }
}

/// A request in flight on a connection.
pub struct RequestGuard {
    tracker: Arc<Tracker>,
    authenticated: bool,
}

impl RequestGuard {
    /// The request was answered as one of a known client (a token it holds, or a server
    /// without tokens): its connection is one that client uses.
    pub fn authenticated(&mut self) {
        self.authenticated = true;
    }

    pub fn tracker(&self) -> &Arc<Tracker> {
        &self.tracker
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let tracker = &self.tracker;
        // The idle time starts when the last request in flight ends.
        tracker.touch();
        if self.authenticated {
            tracker.served.store(true, Ordering::Release);
        }
        tracker.in_flight.fetch_sub(1, Ordering::AcqRel);
        tracker.changed.notify_waiters();
    }
}

/// A request body still arriving.
pub struct BodyGuard(Arc<Tracker>);

impl BodyGuard {
    pub fn progress(&self) {
        self.0.touch();
    }
}

impl Drop for BodyGuard {
    fn drop(&mut self) {
        self.0.open_bodies.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Every open connection, by id, with counts per client address.
pub struct Registry {
    epoch: Instant,
    next_id: AtomicU64,
    open: Mutex<HashMap<u64, Arc<Tracker>>>,
    per_address: Mutex<HashMap<IpAddr, usize>>,
    /// Connections evicted and not closed yet: they no longer count against the cap.
    evicting: Arc<AtomicUsize>,
    /// Told each time a connection closes.
    pub closed: Notify,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            epoch: Instant::now(),
            next_id: AtomicU64::new(0),
            open: Mutex::default(),
            per_address: Mutex::default(),
            evicting: Arc::default(),
            closed: Notify::new(),
        }
    }
}

impl Registry {
    /// A new connection from `address`.
    pub fn open(&self, address: Option<IpAddr>) -> Arc<Tracker> {
        let epoch = self.epoch;
        let tracker = Arc::new(Tracker {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            address,
            epoch,
            in_flight: AtomicUsize::new(0),
            open_bodies: AtomicUsize::new(0),
            since_ms: AtomicU64::new(epoch.elapsed().as_millis() as u64),
            served: AtomicBool::new(false),
            evicted: AtomicBool::new(false),
            evicting: self.evicting.clone(),
            answers: Mutex::default(),
            changed: Notify::new(),
        });
        if let Some(address) = address {
            *lock(&self.per_address).entry(address).or_insert(0) += 1;
        }
        lock(&self.open).insert(tracker.id, tracker.clone());
        tracker
    }

    pub fn close(&self, tracker: &Tracker) {
        if lock(&self.open).remove(&tracker.id).is_none() {
            return;
        }
        tracker.spare();
        if let Some(address) = tracker.address {
            let mut counts = lock(&self.per_address);
            if let Some(count) = counts.get_mut(&address) {
                *count -= 1;
                if *count == 0 {
                    counts.remove(&address);
                }
            }
        }
        self.closed.notify_waiters();
    }

    /// Open connections, less those evicted and about to close.
    pub fn len(&self) -> usize {
        lock(&self.open).len().saturating_sub(self.evicting.load(Ordering::Acquire))
    }

    /// Open connections from `address` (an upper bound of those that never completed a
    /// request, which `evict_oldest` then looks for).
    pub fn count(&self, address: IpAddr) -> usize {
        lock(&self.per_address).get(&address).copied().unwrap_or(0)
    }

    /// Evicts the connection (of `address`, when given: among those that never completed a
    /// request) that has held without use the longest, for [`EVICTION_GRACE`] at least; false
    /// when there is none.
    pub fn evict_oldest(&self, address: Option<IpAddr>) -> bool {
        let before_ms = (self.epoch.elapsed().saturating_sub(EVICTION_GRACE)).as_millis() as u64;
        let open = lock(&self.open);
        let candidates = open
            .values()
            .filter(|tracker| {
                address.is_none() || (tracker.address == address && !tracker.served.load(Ordering::Acquire))
            })
            .filter(|tracker| !tracker.evicted.load(Ordering::Acquire))
            .map(|tracker| (tracker.id, tracker.standing()));
        match oldest_holding(candidates, before_ms).and_then(|id| open.get(&id)) {
            Some(victim) => {
                victim.evict();
                true
            }
            None => false,
        }
    }
}

/// A poisoned lock only means another connection's task panicked; the table is still right.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_holding_without_use_longest_goes_and_busy_ones_never() {
        let holding = |since_ms| Standing::Holding { since_ms };
        assert_eq!(oldest_holding([(1, holding(50)), (2, holding(10)), (3, Standing::Busy)], 100), Some(2));
        assert_eq!(oldest_holding([(1, Standing::Busy), (2, Standing::Busy)], 100), None);
        assert_eq!(oldest_holding([], 100), None);
        // Holding since after the grace's bound: not yet.
        assert_eq!(oldest_holding([(1, holding(150)), (2, holding(90))], 100), Some(2));
        assert_eq!(oldest_holding([(1, holding(150))], 100), None);
    }

    #[tokio::test]
    async fn a_connection_expires_after_its_idle_time_unless_a_request_is_in_flight() {
        let registry = Registry::default();
        let tracker = registry.open(None);
        let limit = Duration::from_millis(200);
        // Nothing sent: it expires after the limit.
        let started = Instant::now();
        tracker.expired(limit, Duration::from_secs(3600)).await;
        assert!(started.elapsed() >= limit);
        // A request in flight (a long poll) holds it open past the limit; the idle time starts
        // again when the answer is done.
        let request = tracker.begin_request();
        assert_eq!(tracker.standing(), Standing::Busy);
        let waited = tokio::time::timeout(limit * 3, tracker.expired(limit, Duration::from_secs(3600))).await;
        assert!(waited.is_err(), "expired with a request in flight");
        drop(request);
        let ended = Instant::now();
        tracker.expired(limit, Duration::from_secs(3600)).await;
        assert!(ended.elapsed() >= limit);
        // A request waiting for its body holds without use, and is evicted once it has for the
        // grace.
        let _request = tracker.begin_request();
        let _body = tracker.body_opened();
        assert!(matches!(tracker.standing(), Standing::Holding { .. }));
        assert!(!registry.evict_oldest(None), "evicted before its grace");
        tokio::time::sleep(EVICTION_GRACE + Duration::from_millis(50)).await;
        assert!(registry.evict_oldest(None));
        tokio::time::timeout(
            Duration::from_secs(5),
            tracker.expired(Duration::from_secs(3600), Duration::from_secs(3600)),
        )
        .await
        .expect("evicted at once");
        registry.close(&tracker);
        assert_eq!(registry.len(), 0);
    }
}
