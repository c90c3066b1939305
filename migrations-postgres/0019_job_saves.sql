-- The latest checkpoint save of each running job, as its worker saw it in the job's
-- `$APP_CHECKPOINT_DIR` and told in a heartbeat (decision 0089). Never edit this file once
-- released: add a new migration instead.
--
-- The preemption pass prefers the jobs that would lose least: those whose next save is due
-- within the time their worker waits for it, then those that saved last. Only the running
-- attempt's row counts (`attempt`); a job removed takes its row with it.
CREATE TABLE job_saves (
    job_id   BIGINT PRIMARY KEY,
    attempt  BIGINT NOT NULL,
    saved_at BIGINT NOT NULL,
    every_ms BIGINT
);

CREATE FUNCTION jobs_drop_saves() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM job_saves WHERE job_id = OLD.id;
    RETURN NULL;
END $$;
CREATE TRIGGER jobs_drop_saves AFTER DELETE ON jobs
FOR EACH ROW EXECUTE FUNCTION jobs_drop_saves();
