//! What this server process counted since it started, for `/metrics`: jobs claimed, attempts
//! reported, sweeps and jobs submitted, leases that ran out, jobs lost with their worker,
//! preemptions ordered, and the time each request took, by route.
//!
//! The queue service calls one method here after a write unit committed (never inside one,
//! so a rolled-back unit counts nothing). Counters live in the process: they restart at zero
//! with it, which Prometheus' `rate()` and `increase()` expect, and each replica counts its
//! own. The values of the queue itself (depth, workers, GPUs) are read at scrape time instead
//! (`routes/prometheus.rs`). The metric handles are shared pointers: [`Meters::register`]
//! puts clones of them in the registry a scrape encodes.

use super::LeaseExpiry;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use shared::job::JobStatus;

/// Upper bounds of the request-duration buckets, in seconds: from a cached read (~1 ms) to a
/// long poll held its full 25 s.
const REQUEST_BUCKETS: [f64; 14] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StatusLabel {
    status: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PathLabel {
    path: &'static str,
}

/// How the writer applied a finish (`queue::finish`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishPath {
    /// Decided on a reader's view and applied as a step of the writer's step lane, with the
    /// other finishes waiting (`db::sqlite::steps`, `db::postgres::steps`). Its label stays
    /// `fast`, which dashboards know.
    Fast,
    /// On the general path, after the step declined (the job changed since the view, a
    /// claimed job's sweep was not cached yet).
    Fallback,
    /// On the general path only (logs, metrics, files, GPUs, an adaptive sweep).
    General,
}

impl FinishPath {
    fn label(self) -> &'static str {
        match self {
            FinishPath::Fast => "fast",
            FinishPath::Fallback => "fallback",
            FinishPath::General => "general",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabel {
    cause: String,
}

/// A request as the latency histogram labels it: the route template (`/api/jobs/{id}`), never
/// the raw path, so ids do not make a series each.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub method: String,
    pub route: String,
    pub status: u16,
}

type RequestHistograms = Family<RequestLabels, Histogram, fn() -> Histogram>;

fn request_histogram() -> Histogram {
    Histogram::new(REQUEST_BUCKETS)
}

/// The counters and histograms of one server process.
pub struct Meters {
    claimed: Counter,
    reports: Family<StatusLabel, Counter>,
    finishes: Family<PathLabel, Counter>,
    sweeps_submitted: Counter,
    jobs_submitted: Counter,
    lease_expiries: Counter,
    crashes: Family<CauseLabel, Counter>,
    preemptions: Family<ByLabel, Counter>,
    requests: RequestHistograms,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ByLabel {
    by: &'static str,
}

impl Default for Meters {
    fn default() -> Self {
        Meters {
            claimed: Counter::default(),
            reports: Family::default(),
            finishes: Family::default(),
            sweeps_submitted: Counter::default(),
            jobs_submitted: Counter::default(),
            lease_expiries: Counter::default(),
            crashes: Family::default(),
            preemptions: {
                let family = Family::<ByLabel, Counter>::default();
                for by in ["scheduler", "hand"] {
                    let _ = family.get_or_create(&ByLabel { by });
                }
                family
            },
            requests: Family::new_with_constructor(request_histogram as fn() -> Histogram),
        }
    }
}

impl Meters {
    /// `jobs` were handed to workers by claims.
    pub fn claimed(&self, jobs: usize) {
        self.claimed.inc_by(jobs as u64);
    }

    /// An attempt's end was applied; `status` is its job's status after it (`queued`: to be
    /// retried).
    pub fn reported(&self, status: JobStatus) {
        self.reports.get_or_create(&StatusLabel { status: status.to_string() }).inc();
    }

    /// A finish: the attempt's report, the jobs its piggy-backed claim got, the writer's path.
    pub fn finished(&self, status: JobStatus, claimed: usize, path: FinishPath) {
        self.reported(status);
        self.claimed(claimed);
        self.finishes.get_or_create(&PathLabel { path: path.label() }).inc();
    }

    /// Finishes applied on `path` so far.
    pub fn finishes_on(&self, path: FinishPath) -> u64 {
        self.finishes.get_or_create(&PathLabel { path: path.label() }).get()
    }

    /// A sweep of `jobs` jobs was stored.
    pub fn submitted(&self, jobs: u64) {
        self.sweeps_submitted.inc();
        self.jobs_submitted.inc_by(jobs);
    }

    /// The reaper's pass found these leases run out; each is a crash of its job.
    pub fn leases_expired(&self, expiry: &LeaseExpiry) {
        let lost = (expiry.requeued + expiry.failed) as u64;
        self.lease_expiries.inc_by(lost);
        self.crashes.get_or_create(&CauseLabel { cause: "lease_expired".into() }).inc_by(lost);
    }

    /// A worker registered again without `jobs` attempts the server thought it ran: they died
    /// with its box, each a crash of its job.
    pub fn lost_on_restart(&self, jobs: usize) {
        self.crashes.get_or_create(&CauseLabel { cause: "worker_restarted".into() }).inc_by(jobs as u64);
    }

    /// A request was answered after `seconds`.
    pub fn request(&self, labels: &RequestLabels, seconds: f64) {
        self.requests.get_or_create(labels).observe(seconds);
    }

    /// `jobs` running jobs were ordered to stop, by the scheduler's pass (`by_scheduler`) or by
    /// hand.
    pub fn preempted(&self, jobs: usize, by_scheduler: bool) {
        let by = if by_scheduler { "scheduler" } else { "hand" };
        self.preemptions.get_or_create(&ByLabel { by }).inc_by(jobs as u64);
    }

    /// Adds every meter to `registry` (clones sharing the same values).
    pub fn register(&self, registry: &mut Registry) {
        registry.register("app_jobs_claimed", "Jobs handed to workers by claims", self.claimed.clone());
        registry.register(
            "app_attempt_reports",
            "Attempts whose end was applied, by the job's status after it (queued: retried)",
            self.reports.clone(),
        );
        registry.register(
            "app_finishes",
            "Finishes applied, by the writer's path: fast (one step on its own connection), fallback (the fast \
             lane declined), general",
            self.finishes.clone(),
        );
        registry.register("app_sweeps_submitted", "Sweeps submitted", self.sweeps_submitted.clone());
        registry.register(
            "app_jobs_submitted",
            "Jobs submitted, counted with their sweeps",
            self.jobs_submitted.clone(),
        );
        registry.register(
            "app_lease_expiries",
            "Running attempts whose worker stopped heartbeating past the lease",
            self.lease_expiries.clone(),
        );
        registry.register(
            "app_job_crashes",
            "Attempts lost with their worker (lease_expired, worker_restarted); each counts a crash of its job",
            self.crashes.clone(),
        );
        registry.register(
            "app_preemptions",
            "Running jobs ordered to stop and requeue, by the scheduler for a user below their share or by hand",
            self.preemptions.clone(),
        );
        registry.register(
            "app_http_request_duration_seconds",
            "Time from a request's arrival to its answer's headers, by route template (long polls included)",
            self.requests.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(meters: &Meters) -> String {
        let mut registry = Registry::default();
        meters.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text
    }

    #[test]
    fn hooks_count_what_they_are_told() {
        let meters = Meters::default();
        meters.submitted(6);
        meters.claimed(2);
        meters.finished(JobStatus::Succeeded, 1, FinishPath::Fast);
        meters.finished(JobStatus::Succeeded, 0, FinishPath::Fallback);
        meters.reported(JobStatus::Queued);
        meters.leases_expired(&LeaseExpiry { requeued: 2, failed: 1 });
        meters.lost_on_restart(1);
        meters.preempted(2, true);
        let labels = RequestLabels { method: "GET".into(), route: "/api/jobs/{id}".into(), status: 200 };
        meters.request(&labels, 0.003);
        let text = encoded(&meters);
        for line in [
            "app_preemptions_total{by=\"scheduler\"} 2",
            "app_sweeps_submitted_total 1",
            "app_jobs_submitted_total 6",
            "app_jobs_claimed_total 3",
            "app_attempt_reports_total{status=\"succeeded\"} 2",
            "app_finishes_total{path=\"fast\"} 1",
            "app_finishes_total{path=\"fallback\"} 1",
            "app_attempt_reports_total{status=\"queued\"} 1",
            "app_lease_expiries_total 3",
            "app_job_crashes_total{cause=\"lease_expired\"} 3",
            "app_job_crashes_total{cause=\"worker_restarted\"} 1",
            "app_http_request_duration_seconds_count{method=\"GET\",route=\"/api/jobs/{id}\",status=\"200\"} 1",
            "app_http_request_duration_seconds_bucket{le=\"0.005\",method=\"GET\",route=\"/api/jobs/{id}\",status=\"200\"} 1",
            "app_http_request_duration_seconds_bucket{le=\"0.0025\",method=\"GET\",route=\"/api/jobs/{id}\",status=\"200\"} 0",
        ] {
            assert!(text.lines().any(|got| got == line), "missing `{line}` in:\n{text}");
        }
    }
}
