//! `GET /metrics` for Prometheus, and the middleware that times every request by route.
//!
//! A scrape builds a registry of its own: the process's meters (`queue::meters`, shared
//! handles) and gauges read now from the database: jobs by sweep and status (the kept
//! counts), workers by state, and each GPU's latest reading, labelled as DCGM exporter users
//! expect to find them (`worker`, `gpu` index, `uuid`, `model`), in base units (ratios,
//! bytes, degrees Celsius, watts), and each user's GPU time over the last day and week
//! (`user`, `window`). The answer is OpenMetrics when the scraper asks for it (as Prometheus
//! does) and the classic text format 0.0.4 otherwise (curl, `promtool check metrics`). Behind
//! the user token unless the server is told `metrics_public`.

use crate::db::{self, now_ms};
use crate::error::ApiResult;
use crate::queue::meters::RequestLabels;
use crate::state::AppState;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use shared::api::{GpuSample, WorkerState};
use std::collections::HashSet;
use std::sync::atomic::AtomicU64;

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const CLASSIC_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The routes: `(behind the token, public)`; `/metrics` is in the second when `public`.
pub fn routers(public: bool) -> (Router<AppState>, Router<AppState>) {
    let metrics = Router::new().route("/metrics", get(metrics));
    if public {
        (Router::new(), metrics)
    } else {
        (metrics, Router::new())
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DepthLabels {
    sweep: String,
    status: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabels {
    worker: String,
    gpu: String,
    uuid: String,
    model: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UsageLabels {
    user: String,
    window: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabel {
    version: String,
}

type Readings = Family<GpuLabels, Gauge<f64, AtomicU64>>;

async fn metrics(State(state): State<AppState>, headers: HeaderMap) -> ApiResult<Response> {
    let (reader, config) = (state.queue.reader(), &state.config);
    let now = now_ms();
    let depth = db::scrape::queue_depth(reader).await?;
    let last_seen = db::scrape::workers_last_seen(reader).await?;
    let gpus = db::scrape::latest_gpus(reader, now - config.lease.as_millis() as i64).await?;
    let mut registry = Registry::default();
    let build = Family::<VersionLabel, Gauge>::default();
    build.get_or_create(&VersionLabel { version: env!("CARGO_PKG_VERSION").into() }).set(1);
    registry.register("app_build_info", "The running app version (always 1)", build);
    state.queue.meters().register(&mut registry);
    let jobs = Family::<DepthLabels, Gauge>::default();
    for row in &depth {
        jobs.get_or_create(&DepthLabels { sweep: row.sweep.clone(), status: row.status.clone() }).set(row.jobs);
    }
    registry.register("app_queue_jobs", "Jobs by sweep and status", jobs);
    let workers = Family::<StateLabel, Gauge>::default();
    let (heartbeat, lease) = (config.heartbeat.as_millis() as u64, config.lease.as_millis() as u64);
    for state in ["healthy", "stale", "lost", "left"] {
        let _ = workers.get_or_create(&StateLabel { state: state.into() });
    }
    for (seen, left) in last_seen {
        let state = match left {
            Some(_) => WorkerState::Left,
            None => WorkerState::of(seen, now, heartbeat, lease),
        };
        workers.get_or_create(&StateLabel { state: state_name(state).into() }).inc();
    }
    registry.register(
        "app_workers",
        "Workers by state (healthy, stale: late heartbeat, lost: past the lease, left: stopped cleanly)",
        workers,
    );
    register_gpus(&mut registry, &gpus);
    register_usage(&mut registry, &state).await?;
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)
        .map_err(|error| anyhow::anyhow!("encoding the metrics: {error}"))?;
    let (content_type, body) =
        if wants_openmetrics(&headers) { (OPENMETRICS, text) } else { (CLASSIC_TEXT, classic_text(&text)) };
    Ok(([(header::CONTENT_TYPE, HeaderValue::from_static(content_type))], body).into_response())
}

fn state_name(state: WorkerState) -> &'static str {
    match state {
        WorkerState::Healthy => "healthy",
        WorkerState::Stale => "stale",
        WorkerState::Lost => "lost",
        WorkerState::Left => "left",
    }
}

/// The GPU gauges, one series per GPU of each worker's latest reading.
fn register_gpus(registry: &mut Registry, gpus: &[(String, GpuSample)]) {
    let (utilization, used, total, temperature, power) =
        (Readings::default(), Readings::default(), Readings::default(), Readings::default(), Readings::default());
    for (worker, sample) in gpus {
        let labels = GpuLabels {
            worker: worker.clone(),
            gpu: sample.index.to_string(),
            uuid: sample.uuid.clone(),
            model: sample.name.clone(),
        };
        used.get_or_create(&labels).set(sample.memory_used as f64);
        total.get_or_create(&labels).set(sample.memory_total as f64);
        if let Some(percent) = sample.utilization {
            utilization.get_or_create(&labels).set(f64::from(percent) / 100.0);
        }
        if let Some(celsius) = sample.temperature {
            temperature.get_or_create(&labels).set(f64::from(celsius));
        }
        if let Some(watts) = sample.power_watts.filter(|watts| watts.is_finite()) {
            power.get_or_create(&labels).set(watts);
        }
    }
    registry.register(
        "app_gpu_utilization_ratio",
        "GPU busy time over the last sample period (0-1, NVML)",
        utilization,
    );
    registry.register("app_gpu_memory_used_bytes", "GPU memory in use", used);
    registry.register("app_gpu_memory_total_bytes", "GPU memory in all", total);
    registry.register("app_gpu_temperature_celsius", "GPU core temperature", temperature);
    registry.register("app_gpu_power_watts", "GPU power draw", power);
}

/// GPU time per user over the last 24 hours and 7 days, in GPU-seconds (Prometheus' base unit;
/// `GET /api/usage` says hours). The `user` label takes the names user tokens carry, no other
/// (labels stay bounded): an owner no token names any more is left out here and listed by
/// `GET /api/usage`.
async fn register_usage(registry: &mut Registry, state: &AppState) -> ApiResult<()> {
    let names = state.config.tokens.user_names();
    let seconds = Family::<UsageLabels, Gauge<f64, AtomicU64>>::default();
    for usage in super::users::usage_now(state).await?.users {
        if !names.contains(&usage.user) {
            continue;
        }
        for (window, value) in [("24h", usage.gpu_hours_24h), ("7d", usage.gpu_hours_7d)] {
            seconds.get_or_create(&UsageLabels { user: usage.user.clone(), window: window.into() }).set(value * 3600.0);
        }
    }
    registry.register(
        "app_user_gpu_seconds",
        "GPU time each user's attempts held (GPUs times seconds, as workers measured it), over the last 24h or 7d",
        seconds,
    );
    Ok(())
}

/// Whether the scraper takes OpenMetrics (Prometheus asks for it first).
fn wants_openmetrics(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .any(|accept| accept.contains("application/openmetrics-text"))
}

/// OpenMetrics text as the classic Prometheus text format 0.0.4. For the metric types used
/// here the two differ in three ways: a counter family is named without `_total` in
/// OpenMetrics and with it in 0.0.4 (its samples carry it in both), and the `# UNIT` and
/// `# EOF` lines exist only in OpenMetrics.
pub fn classic_text(openmetrics: &str) -> String {
    let counters: HashSet<&str> =
        openmetrics.lines().filter_map(|line| line.strip_prefix("# TYPE ")?.strip_suffix(" counter")).collect();
    let mut text = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let descriptor = ["# HELP ", "# TYPE "].into_iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            counters.contains(name).then(|| format!("{prefix}{name}_total {tail}"))
        });
        match descriptor {
            Some(renamed) => text.push_str(renamed.trim_end()),
            None => text.push_str(line),
        }
        text.push('\n');
    }
    text
}

/// Times every request, labelled by its route template (`/api/jobs/{id}`) or `unmatched`.
pub async fn time_request(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().map_or("unmatched", MatchedPath::as_str).to_string();
    // Only the methods the API uses get their own series: any token is a valid method.
    let method = match *request.method() {
        Method::GET | Method::HEAD | Method::POST | Method::PUT | Method::DELETE => request.method().to_string(),
        _ => "other".to_string(),
    };
    let started = std::time::Instant::now();
    let response = next.run(request).await;
    let labels = RequestLabels { method, route, status: response.status().as_u16() };
    state.queue.meters().request(&labels, started.elapsed().as_secs_f64());
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_renamed_and_openmetrics_only_lines_dropped() {
        let openmetrics = "# HELP app_jobs_claimed Jobs handed out.\n# TYPE app_jobs_claimed counter\n\
                           app_jobs_claimed_total 3\n# HELP app_queue_jobs Jobs.\n# TYPE app_queue_jobs gauge\n\
                           # UNIT app_queue_jobs jobs\napp_queue_jobs{status=\"queued\"} 2\n# EOF\n";
        assert_eq!(
            classic_text(openmetrics),
            "# HELP app_jobs_claimed_total Jobs handed out.\n# TYPE app_jobs_claimed_total counter\n\
             app_jobs_claimed_total 3\n# HELP app_queue_jobs Jobs.\n# TYPE app_queue_jobs gauge\n\
             app_queue_jobs{status=\"queued\"} 2\n"
        );
    }

    #[test]
    fn prometheus_gets_openmetrics_and_curl_the_classic_format() {
        let mut headers = HeaderMap::new();
        assert!(!wants_openmetrics(&headers));
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"),
        );
        assert!(wants_openmetrics(&headers));
    }
}
