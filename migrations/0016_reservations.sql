-- Reservations for jobs of several GPUs (issue 29, item 4; decision 0080). Never edit this
-- file once released: add a new migration instead.
--
-- A queued job that has waited `backfill_after_secs` holds one worker: the claims give that
-- worker's GPUs to it once enough are free, and meanwhile only to jobs whose timeout ends
-- before `starts_at` (NULL: unknown, nothing is lent). Written by the scheduler's pass (the
-- reaper's leader); a row whose job is no longer queued holds nothing and is removed by the
-- next pass.
CREATE TABLE reservations (
    job_id    INTEGER PRIMARY KEY REFERENCES jobs (id) ON DELETE CASCADE,
    worker_id INTEGER NOT NULL UNIQUE,
    gpus      INTEGER NOT NULL,
    starts_at INTEGER,
    made_at   INTEGER NOT NULL
);
