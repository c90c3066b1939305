-- What the web page shows beyond the queue itself: the GPUs of each attempt and the exit code
-- in the history. Never edit this file once released: add a new migration instead.

-- The GPU indices of the latest attempt as a JSON array (`[0,1]`); NULL before the first claim.
ALTER TABLE jobs ADD COLUMN gpu_ids TEXT;

-- The history keeps both per transition, so every attempt's GPUs and exit code stay known.
ALTER TABLE job_events ADD COLUMN gpu_ids TEXT;
ALTER TABLE job_events ADD COLUMN exit_code INTEGER;

DROP TRIGGER jobs_record_transition;
CREATE TRIGGER jobs_record_transition AFTER UPDATE OF status, attempt ON jobs
WHEN OLD.status IS NOT NEW.status OR OLD.attempt IS NOT NEW.attempt
BEGIN
    INSERT INTO job_events (job_id, at, from_status, to_status, attempt, worker_id, reason, gpu_ids, exit_code)
    VALUES (NEW.id, CAST(unixepoch('subsec') * 1000 AS INTEGER), OLD.status, NEW.status,
            NEW.attempt, NEW.worker_id, NEW.reason, NEW.gpu_ids, NEW.exit_code);
END;

-- The queue page filters by status and counts by status over the whole queue, and every
-- sweep shows its counts by status: these indexes answer them without reading job rows.
CREATE INDEX jobs_by_status ON jobs (status, id);
CREATE INDEX jobs_by_sweep_status ON jobs (sweep_id, status);
