-- Who submitted each sweep, and the GPU time each user's jobs held (issue 29, item 1; decision
-- 0074). Never edit this file once released: add a new migration instead
-- (migrations/0011_owners.sql).
--
-- A sweep's owner is the name its submitter's token carries; sweeps from before, and those of a
-- token without a name or a server without tokens, are the user `default`'s. It never changes.
ALTER TABLE sweeps ADD COLUMN owner TEXT NOT NULL DEFAULT 'default';

-- GPU time held, by user and by the hour (Unix ms of its start) in which each attempt's record
-- was stored (migrations/0011_owners.sql).
CREATE TABLE user_gpu_usage (
    owner       TEXT             NOT NULL,
    hour_at     BIGINT           NOT NULL,
    gpu_seconds DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (hour_at, owner)
);

-- What was stored before, counted once, as the user `default`'s.
INSERT INTO user_gpu_usage (owner, hour_at, gpu_seconds)
SELECT s.owner, r.stored_at - r.stored_at % 3600000,
       sum((r.record::jsonb -> 'gpu_usage' ->> 'gpu_hours')::DOUBLE PRECISION * 3600.0)
FROM results r JOIN jobs j ON j.id = r.job_id JOIN sweeps s ON s.id = j.sweep_id
WHERE strpos(r.record, '"gpu_usage"') > 0
  AND (r.record::jsonb -> 'gpu_usage' ->> 'gpu_hours')::DOUBLE PRECISION > 0
GROUP BY s.owner, r.stored_at - r.stored_at % 3600000;
