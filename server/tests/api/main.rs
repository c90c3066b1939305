//! Integration tests of the server: each starts the real server on 127.0.0.1:0 with a
//! temporary data directory and drives it through the same typed client the worker uses.

mod analysis;
mod auth;
mod bad_input;
mod claims;
mod code;
mod data_dir;
mod fail_fast;
mod finish;
mod lifecycle;
mod logs;
mod maintenance;
mod metric_missing;
mod metrics;
mod names;
mod owners;
mod page;
mod preemption;
mod reservations;
mod results;
mod scheduler;
mod search;
mod sessions;
mod shares;
mod submit;
mod summary;
mod upkeep;

/// `GET /metrics` of `app`, as the holder of `token` (none: without one), in the classic text
/// format.
pub async fn metrics_text(app: &testkit::TestApp, token: Option<&str>) -> String {
    let mut request = reqwest::Client::new().get(format!("{}/metrics", app.url));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request.send().await.unwrap().text().await.unwrap()
}
