//! `GET /api/events`: server-sent events telling the web page that something changed, so it
//! refetches what it shows instead of polling. Each event is `change` with `{"seq": N}`: one
//! right after connecting, then one whenever the queue changed, at most one per
//! [`MIN_INTERVAL`] (changes in between are folded into the next event).

use crate::state::AppState;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::routing::get;
use axum::Router;
use futures_util::Stream;
use std::convert::Infallible;
use std::time::Duration;
use tokio::sync::watch;

/// A busy queue changes hundreds of times a second; a page needs a few refreshes at most.
const MIN_INTERVAL: Duration = Duration::from_millis(250);
const KEEP_ALIVE: Duration = Duration::from_secs(15);

pub fn router() -> Router<AppState> {
    Router::new().route("/api/events", get(events))
}

async fn events(State(state): State<AppState>) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let follower =
        Follower { changes: state.queue.events().page_changes(), stop: state.shutting_down.clone(), first: true };
    let stream = futures_util::stream::unfold(follower, |mut follower| async move {
        let seq = follower.next().await?;
        Some((Ok(Event::default().event("change").data(format!("{{\"seq\":{seq}}}"))), follower))
    });
    Sse::new(stream).keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
}

struct Follower {
    changes: watch::Receiver<u64>,
    stop: watch::Receiver<bool>,
    first: bool,
}

impl Follower {
    /// The sequence number to announce next; `None` ends the stream (the server is shutting
    /// down, and graceful shutdown waits for every open response to end).
    async fn next(&mut self) -> Option<u64> {
        if !std::mem::take(&mut self.first) {
            tokio::select! {
                _ = tokio::time::sleep(MIN_INTERVAL) => {}
                _ = self.stop.wait_for(|stop| *stop) => return None,
            }
            tokio::select! {
                changed = self.changes.changed() => changed.ok()?,
                _ = self.stop.wait_for(|stop| *stop) => return None,
            }
        }
        if *self.stop.borrow() {
            return None;
        }
        Some(*self.changes.borrow_and_update())
    }
}
