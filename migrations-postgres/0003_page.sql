-- What the web page shows beyond the queue itself, for PostgreSQL: migrations/0003_page.sql
-- (SQLite). Never edit this file once released: add a new migration instead.

ALTER TABLE jobs ADD COLUMN gpu_ids TEXT;
ALTER TABLE job_events ADD COLUMN gpu_ids TEXT;
ALTER TABLE job_events ADD COLUMN exit_code BIGINT;

CREATE OR REPLACE FUNCTION jobs_record_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_events (job_id, at, from_status, to_status, attempt, worker_id, reason, gpu_ids, exit_code)
    VALUES (NEW.id, app_now_ms(), OLD.status, NEW.status, NEW.attempt, NEW.worker_id, NEW.reason,
            NEW.gpu_ids, NEW.exit_code);
    RETURN NULL;
END $$;

CREATE INDEX jobs_by_status ON jobs (status, id);
CREATE INDEX jobs_by_sweep_status ON jobs (sweep_id, status);
