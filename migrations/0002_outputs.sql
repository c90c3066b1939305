-- What running jobs send back: logs, metrics, GPU telemetry and versioned results. Times are
-- Unix milliseconds. Never edit this file once released: add a new migration instead.
--
-- Everything here is append-only or keyed per attempt and kept out of the hot `jobs` table, so
-- a busy log or metrics stream never slows a claim or a report.

-- Per attempt bookkeeping of the worker's uploads, so an append or a batch costs one small row
-- lookup instead of a scan. `log_received` counts bytes of the worker's log file accounted for
-- (the offset acks are in); `log_stored` counts bytes kept, which stops at the log cap plus the
-- truncation marker. `metrics_offset` is the metrics-file offset stored up to; `metrics_points`
-- numbers the next point.
CREATE TABLE job_attempts (
    job_id         INTEGER NOT NULL REFERENCES jobs (id),
    attempt        INTEGER NOT NULL,
    log_received   INTEGER NOT NULL DEFAULT 0,
    log_stored     INTEGER NOT NULL DEFAULT 0,
    log_truncated  INTEGER NOT NULL DEFAULT 0,
    metrics_offset INTEGER NOT NULL DEFAULT 0,
    metrics_points INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, attempt)
);

-- Log bytes, one row per appended chunk. A rowid table (not WITHOUT ROWID): chunks are large
-- blobs, which SQLite keeps in overflow pages best behind a small rowid key.
CREATE TABLE job_logs (
    job_id      INTEGER NOT NULL REFERENCES jobs (id),
    attempt     INTEGER NOT NULL,
    byte_offset INTEGER NOT NULL,            -- where the chunk starts in the stored log
    data        BLOB    NOT NULL
);
CREATE UNIQUE INDEX job_logs_by_attempt ON job_logs (job_id, attempt, byte_offset);

-- Every metric point, in the order written (`seq` per attempt).
CREATE TABLE job_metrics (
    job_id  INTEGER NOT NULL REFERENCES jobs (id),
    attempt INTEGER NOT NULL,
    seq     INTEGER NOT NULL,
    step    INTEGER,
    name    TEXT    NOT NULL,
    value   REAL    NOT NULL
);
CREATE INDEX job_metrics_by_attempt ON job_metrics (job_id, attempt, seq);

-- Last, min and max of each metric of a job's latest attempt that sent metrics, updated with
-- every batch so listing jobs with their metrics never aggregates the points. Rows of an older
-- attempt are deleted when a newer one sends its first batch; readers also match `attempt`
-- against the job's, so a fresh attempt shows no stale values in between.
CREATE TABLE job_metric_summaries (
    job_id      INTEGER NOT NULL REFERENCES jobs (id),
    name        TEXT    NOT NULL,
    attempt     INTEGER NOT NULL,
    last_value  REAL    NOT NULL,
    min_value   REAL    NOT NULL,
    max_value   REAL    NOT NULL,
    last_step   INTEGER,
    point_count INTEGER NOT NULL,
    PRIMARY KEY (job_id, name)
);

-- NVML readings carried by heartbeats; pruned past the retention window by the reaper.
CREATE TABLE gpu_telemetry (
    worker_id    INTEGER NOT NULL REFERENCES workers (id),
    gpu_index    INTEGER NOT NULL,
    at           INTEGER NOT NULL,
    uuid         TEXT    NOT NULL,
    name         TEXT    NOT NULL,
    memory_total INTEGER NOT NULL,
    memory_used  INTEGER NOT NULL,
    utilization  INTEGER,
    temperature  INTEGER,
    power_watts  REAL
);
CREATE INDEX gpu_telemetry_by_worker ON gpu_telemetry (worker_id, at);
CREATE INDEX gpu_telemetry_by_age ON gpu_telemetry (at);

-- Files uploaded into an attempt's staging directory, with the size and SHA-256 computed as
-- they arrived: sealing checks the manifest against these instead of reading gigabytes of
-- checkpoints again. Rows go when the attempt is sealed or its staging is cleaned up.
CREATE TABLE staged_files (
    job_id  INTEGER NOT NULL REFERENCES jobs (id),
    attempt INTEGER NOT NULL,
    path    TEXT    NOT NULL,
    size    INTEGER NOT NULL,
    sha256  TEXT    NOT NULL,
    PRIMARY KEY (job_id, attempt, path)
);

-- Sealed, immutable result versions (`results/<sweep>/<index>/v<attempt>/` under the data
-- dir). One per attempt at most: the unique key is what makes a second seal a conflict.
CREATE TABLE results (
    job_id    INTEGER NOT NULL REFERENCES jobs (id),
    attempt   INTEGER NOT NULL,
    path      TEXT    NOT NULL,              -- relative to the data dir
    manifest  TEXT    NOT NULL,              -- JSON array of shared::api::ManifestEntry
    record    TEXT    NOT NULL,              -- JSON of shared::api::AttemptRecord
    params    TEXT    NOT NULL,              -- JSON object, the job's parameters
    metrics   TEXT    NOT NULL,              -- JSON map name -> MetricSummary when sealed
    stored_at INTEGER NOT NULL,
    PRIMARY KEY (job_id, attempt)
);
