-- What running jobs send back, for PostgreSQL: migrations/0002_outputs.sql (SQLite) column for
-- column. Never edit this file once released: add a new migration instead.

CREATE TABLE job_attempts (
    job_id         BIGINT NOT NULL REFERENCES jobs (id),
    attempt        BIGINT NOT NULL,
    log_received   BIGINT NOT NULL DEFAULT 0,
    log_stored     BIGINT NOT NULL DEFAULT 0,
    log_truncated  BIGINT NOT NULL DEFAULT 0,
    metrics_offset BIGINT NOT NULL DEFAULT 0,
    metrics_points BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, attempt)
);

CREATE TABLE job_logs (
    job_id      BIGINT NOT NULL REFERENCES jobs (id),
    attempt     BIGINT NOT NULL,
    byte_offset BIGINT NOT NULL,
    data        BYTEA  NOT NULL
);
CREATE UNIQUE INDEX job_logs_by_attempt ON job_logs (job_id, attempt, byte_offset);

CREATE TABLE job_metrics (
    job_id  BIGINT           NOT NULL REFERENCES jobs (id),
    attempt BIGINT           NOT NULL,
    seq     BIGINT           NOT NULL,
    step    BIGINT,
    name    TEXT             NOT NULL,
    value   DOUBLE PRECISION NOT NULL
);
CREATE INDEX job_metrics_by_attempt ON job_metrics (job_id, attempt, seq);

CREATE TABLE job_metric_summaries (
    job_id      BIGINT           NOT NULL REFERENCES jobs (id),
    name        TEXT             NOT NULL,
    attempt     BIGINT           NOT NULL,
    last_value  DOUBLE PRECISION NOT NULL,
    min_value   DOUBLE PRECISION NOT NULL,
    max_value   DOUBLE PRECISION NOT NULL,
    last_step   BIGINT,
    point_count BIGINT           NOT NULL,
    PRIMARY KEY (job_id, name)
);

CREATE TABLE gpu_telemetry (
    worker_id    BIGINT NOT NULL REFERENCES workers (id),
    gpu_index    BIGINT NOT NULL,
    at           BIGINT NOT NULL,
    uuid         TEXT   NOT NULL,
    name         TEXT   NOT NULL,
    memory_total BIGINT NOT NULL,
    memory_used  BIGINT NOT NULL,
    utilization  BIGINT,
    temperature  BIGINT,
    power_watts  DOUBLE PRECISION
);
CREATE INDEX gpu_telemetry_by_worker ON gpu_telemetry (worker_id, at);
CREATE INDEX gpu_telemetry_by_age ON gpu_telemetry (at);

CREATE TABLE staged_files (
    job_id  BIGINT NOT NULL REFERENCES jobs (id),
    attempt BIGINT NOT NULL,
    path    TEXT   NOT NULL,
    size    BIGINT NOT NULL,
    sha256  TEXT   NOT NULL,
    PRIMARY KEY (job_id, attempt, path)
);

CREATE TABLE results (
    job_id    BIGINT NOT NULL REFERENCES jobs (id),
    attempt   BIGINT NOT NULL,
    path      TEXT   NOT NULL,
    manifest  TEXT   NOT NULL,
    record    TEXT   NOT NULL,
    params    TEXT   NOT NULL,
    metrics   TEXT   NOT NULL,
    stored_at BIGINT NOT NULL,
    PRIMARY KEY (job_id, attempt)
);
