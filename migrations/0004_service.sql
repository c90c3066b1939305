-- The queue service's second round: the server's identity, worker sessions, notes per attempt,
-- and a history that remembers who lost a requeued attempt. Never edit this file once
-- released: add a new migration instead.

-- Made once, when the database is created (or first migrated here). Workers learn it at
-- registration and send it with every request: a server restarted on a new, empty database is
-- another instance, and refuses reports meant for the old one (whose job ids it reuses).
CREATE TABLE server_instance (
    id TEXT NOT NULL
);
INSERT INTO server_instance (id) VALUES (lower(hex(randomblob(16))));

-- Each registration gets a secret, kept here as its SHA-256; every later request of that
-- worker carries it, so a holder of the shared worker token cannot act as another worker.
-- `key_hash` is the SHA-256 of the key a worker keeps in its work directory: the same worker
-- restarted presents it again, a second live worker under the same name does not.
ALTER TABLE workers ADD COLUMN session_hash TEXT;
ALTER TABLE workers ADD COLUMN key_hash TEXT;

-- Things worth knowing about an attempt that do not change its status, as a JSON array of
-- sentences (the log was cut at the server's cap, the worker's disk filled up).
ALTER TABLE job_attempts ADD COLUMN notes TEXT;

-- A requeued job no longer shows the worker and GPUs that lost it (the queue page would show
-- it as placed there), so the history takes them from the row as it was.
DROP TRIGGER jobs_record_transition;
CREATE TRIGGER jobs_record_transition AFTER UPDATE OF status, attempt ON jobs
WHEN OLD.status IS NOT NEW.status OR OLD.attempt IS NOT NEW.attempt
BEGIN
    INSERT INTO job_events (job_id, at, from_status, to_status, attempt, worker_id, reason, gpu_ids, exit_code)
    VALUES (NEW.id, CAST(unixepoch('subsec') * 1000 AS INTEGER), OLD.status, NEW.status,
            NEW.attempt, coalesce(NEW.worker_id, OLD.worker_id), NEW.reason,
            coalesce(NEW.gpu_ids, OLD.gpu_ids), NEW.exit_code);
END;

-- Jobs by sweep and status, kept current so the page's counts (the whole queue, every sweep)
-- cost a lookup instead of a count over every job (117 ms with a million queued). Transitions
-- are counted by this trigger, in the statement that makes them; jobs are added by the code
-- that inserts them (one row per sweep and status per statement, not a trigger per row, which
-- would slow a 100,000-job submission), and removed with their sweep.
CREATE TABLE sweep_counts (
    sweep_id INTEGER NOT NULL REFERENCES sweeps (id),
    status   TEXT    NOT NULL,
    jobs     INTEGER NOT NULL,
    PRIMARY KEY (sweep_id, status)
) WITHOUT ROWID;
INSERT INTO sweep_counts (sweep_id, status, jobs) SELECT sweep_id, status, count(*) FROM jobs GROUP BY sweep_id, status;

CREATE TRIGGER jobs_count_transition AFTER UPDATE OF status ON jobs
WHEN OLD.status IS NOT NEW.status
BEGIN
    UPDATE sweep_counts SET jobs = jobs - 1 WHERE sweep_id = OLD.sweep_id AND status = OLD.status;
    INSERT INTO sweep_counts (sweep_id, status, jobs) VALUES (NEW.sweep_id, NEW.status, 1)
        ON CONFLICT (sweep_id, status) DO UPDATE SET jobs = jobs + 1;
END;
