-- The queue. Times are Unix milliseconds. Never edit this file once released: add a new
-- migration instead (sqlx checks the checksum of every applied migration).

-- One row per submitted sweep file. The source is kept verbatim so a sweep can be shown,
-- audited and resubmitted exactly.
CREATE TABLE sweeps (
    id          INTEGER PRIMARY KEY,
    name        TEXT    NOT NULL UNIQUE,
    form        TEXT    NOT NULL,
    source      TEXT    NOT NULL,
    metric_name TEXT,
    metric_goal TEXT,
    job_count   INTEGER NOT NULL,
    created_at  INTEGER NOT NULL
);

-- Workers upsert themselves by name; a worker that comes back after a reboot keeps its id.
CREATE TABLE workers (
    id            INTEGER PRIMARY KEY,
    name          TEXT    NOT NULL UNIQUE,
    capacity      TEXT    NOT NULL,          -- JSON of shared::placement::Capacity
    registered_at INTEGER NOT NULL,
    last_seen_at  INTEGER NOT NULL
);

-- One row per run of a sweep. Resources are copied from the sweep onto each job so the claim
-- query filters on the jobs table alone. `attempt` counts claims and fences every report.
CREATE TABLE jobs (
    id               INTEGER PRIMARY KEY,
    sweep_id         INTEGER NOT NULL REFERENCES sweeps (id),
    idx              INTEGER NOT NULL,
    params           TEXT    NOT NULL,       -- JSON object
    command          TEXT    NOT NULL,
    config           TEXT,                   -- resolved YAML config, for forms that have one
    gpus             INTEGER,                -- NULL: 1 on a GPU box, 0 elsewhere
    gpu_memory       INTEGER,
    exclusive        INTEGER,
    timeout_secs     INTEGER,
    status           TEXT    NOT NULL DEFAULT 'queued'
                     CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')),
    priority         INTEGER NOT NULL DEFAULT 0,
    attempt          INTEGER NOT NULL DEFAULT 0,
    crash_count      INTEGER NOT NULL DEFAULT 0,
    retries_left     INTEGER NOT NULL DEFAULT 0,
    worker_id        INTEGER REFERENCES workers (id),  -- the worker of the latest attempt
    lease_expires_at INTEGER,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    exit_code        INTEGER,
    reason           TEXT,                   -- why the job is in its status: failure, requeue, cancel
    created_at       INTEGER NOT NULL,
    started_at       INTEGER,
    finished_at      INTEGER,
    UNIQUE (sweep_id, idx)
);

-- The claim walks queued jobs by priority then age; a partial index keeps that walk short and
-- keeps finished jobs (the bulk of a long-lived queue) out of it.
CREATE INDEX jobs_queue ON jobs (priority DESC, id) WHERE status = 'queued';
-- Heartbeats and the reaper look only at running jobs.
CREATE INDEX jobs_running_by_worker ON jobs (worker_id) WHERE status = 'running';
CREATE INDEX jobs_running_by_lease ON jobs (lease_expires_at) WHERE status = 'running';
CREATE INDEX jobs_by_worker ON jobs (worker_id);

-- Append-only history of every transition, kept out of the hot jobs table.
CREATE TABLE job_events (
    id          INTEGER PRIMARY KEY,
    job_id      INTEGER NOT NULL REFERENCES jobs (id),
    at          INTEGER NOT NULL,
    from_status TEXT,
    to_status   TEXT    NOT NULL,
    attempt     INTEGER NOT NULL,
    worker_id   INTEGER,
    reason      TEXT
);
CREATE INDEX job_events_by_job ON job_events (job_id, id);

-- Every change of status or attempt is recorded by the database itself, in the same statement
-- as the change: no code path can forget it, and a transition costs no extra round trip.
CREATE TRIGGER jobs_record_transition AFTER UPDATE OF status, attempt ON jobs
WHEN OLD.status IS NOT NEW.status OR OLD.attempt IS NOT NEW.attempt
BEGIN
    INSERT INTO job_events (job_id, at, from_status, to_status, attempt, worker_id, reason)
    VALUES (NEW.id, CAST(unixepoch('subsec') * 1000 AS INTEGER), OLD.status, NEW.status,
            NEW.attempt, NEW.worker_id, NEW.reason);
END;
