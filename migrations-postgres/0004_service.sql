-- The queue service's second round, for PostgreSQL: migrations/0004_service.sql (SQLite).
-- Never edit this file once released: add a new migration instead.

CREATE TABLE server_instance (
    id TEXT NOT NULL
);
-- 32 lowercase hex digits, as SQLite's lower(hex(randomblob(16))).
INSERT INTO server_instance (id) VALUES (replace(gen_random_uuid()::TEXT, '-', ''));

ALTER TABLE workers ADD COLUMN session_hash TEXT;
ALTER TABLE workers ADD COLUMN key_hash TEXT;

ALTER TABLE job_attempts ADD COLUMN notes TEXT;

CREATE OR REPLACE FUNCTION jobs_record_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_events (job_id, at, from_status, to_status, attempt, worker_id, reason, gpu_ids, exit_code)
    VALUES (NEW.id, app_now_ms(), OLD.status, NEW.status, NEW.attempt,
            coalesce(NEW.worker_id, OLD.worker_id), NEW.reason,
            coalesce(NEW.gpu_ids, OLD.gpu_ids), NEW.exit_code);
    RETURN NULL;
END $$;

CREATE TABLE sweep_counts (
    sweep_id BIGINT NOT NULL REFERENCES sweeps (id),
    status   TEXT   NOT NULL,
    jobs     BIGINT NOT NULL,
    PRIMARY KEY (sweep_id, status)
);
INSERT INTO sweep_counts (sweep_id, status, jobs) SELECT sweep_id, status, count(*) FROM jobs GROUP BY sweep_id, status;

-- Unlike SQLite's single writer, PostgreSQL runs transactions side by side, and a finish with
-- its claim (running -> succeeded, then queued -> running) against a plain claim (queued ->
-- running) would take the same two count rows in opposite orders and deadlock. So a transition
-- first locks all of its sweep's count rows, in one order: a second transaction changing the
-- same sweep waits for the first one's end instead. (A transaction touching several sweeps
-- must take them in sweep order; the write path sees to that, and retries a deadlock.)
CREATE FUNCTION jobs_count_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM sweep_counts WHERE sweep_id = NEW.sweep_id ORDER BY status FOR UPDATE;
    UPDATE sweep_counts SET jobs = jobs - 1 WHERE sweep_id = OLD.sweep_id AND status = OLD.status;
    INSERT INTO sweep_counts (sweep_id, status, jobs) VALUES (NEW.sweep_id, NEW.status, 1)
        ON CONFLICT (sweep_id, status) DO UPDATE SET jobs = sweep_counts.jobs + 1;
    RETURN NULL;
END $$;
CREATE TRIGGER jobs_count_transition AFTER UPDATE OF status ON jobs
FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
EXECUTE FUNCTION jobs_count_transition();
