-- Preemption by the scheduler (issue 29, item 3; decision 0079). Never edit this file once
-- released: add a new migration instead.
--
-- A sweep's `preemptible` key: 1 or 0 as its file said, NULL to follow the server's
-- `preemptible` setting (by default: jobs that have stored a checkpoint).
ALTER TABLE sweeps ADD COLUMN preemptible BIGINT;
