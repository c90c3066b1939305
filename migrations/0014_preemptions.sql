-- Preemption that resumes (issue 29, item 3; decision 0078). Never edit this file once
-- released: add a new migration instead.
--
-- The attempt of a running job that was preempted, and why: its worker's heartbeats are told
-- to stop it (SIGTERM, then SIGKILL after `preempt_grace_secs`), and its finish requeues it
-- with that reason, no retry spent. Keyed by attempt, so a later attempt is never stopped by
-- an order given to an earlier one, and nothing has to clear it.
ALTER TABLE jobs ADD COLUMN preempt_attempt INTEGER;
ALTER TABLE jobs ADD COLUMN preempt_reason TEXT;

-- Every preemption ordered, one row per attempt: when and why, for the scheduler's pass to
-- read how often a job was preempted lately, and for counts.
CREATE TABLE preemptions (
    job_id  INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    attempt INTEGER NOT NULL,
    at      INTEGER NOT NULL,
    reason  TEXT    NOT NULL,
    PRIMARY KEY (job_id, attempt)
);
