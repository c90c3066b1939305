//! What the streamed upload routes (result files, checkpoints, code snapshots) share: the
//! body's declared length, and reading the rest of a refused body before answering.

use crate::state::AppState;
use axum::body::BodyDataStream;
use axum::http::{header, HeaderMap};
use futures_util::StreamExt;

/// The body's Content-Length, when the client sent one.
pub fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH).and_then(|value| value.to_str().ok()?.parse().ok())
}

/// A refused upload is answered only after the rest of its body is read and dropped (up to the
/// upload limit, or until the server shuts down): a server that answers mid-upload and closes
/// the connection makes the client see a broken connection instead of the 409, 413 or 507, and
/// retry the same refused upload for ever.
pub async fn drain_refused(state: &AppState, stream: &mut BodyDataStream) {
    let limit = state.config.max_upload_bytes;
    let mut shutting_down = state.shutting_down.clone();
    let drain = async {
        let mut drained = 0u64;
        while let Some(Ok(chunk)) = stream.next().await {
            drained += chunk.len() as u64;
            if drained > limit {
                return;
            }
        }
    };
    tokio::select! {
        _ = drain => {}
        _ = shutting_down.wait_for(|stop| *stop) => {}
    }
}
