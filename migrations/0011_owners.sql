-- Who submitted each sweep, and the GPU time each user's jobs held (issue 29, item 1; decision
-- 0074). Never edit this file once released: add a new migration instead.
--
-- A sweep's owner is the name its submitter's token carries; sweeps from before, and those of a
-- token without a name or a server without tokens, are the user `default`'s. It never changes.
ALTER TABLE sweeps ADD COLUMN owner TEXT NOT NULL DEFAULT 'default';

-- GPU time held, by user and by the hour (Unix ms of its start) in which each attempt's record
-- was stored: what `GET /api/usage`, the workers page and `/metrics` sum over the last 24 hours
-- and 7 days, reading a few rows per user rather than the results. The server adds an attempt's
-- GPU time (`gpu_usage.gpu_hours` of its record) in the unit that stores its record
-- (`db::results::insert`), not a trigger: a trigger on `results` doubled the cost of every
-- CPU job's record insert. Kept, not pruned: a user and an hour make a row at most (30 users
-- busy all year: 263,000 small rows), and a share of the cluster over time is to be read from
-- them.
CREATE TABLE user_gpu_usage (
    owner       TEXT    NOT NULL,
    hour_at     INTEGER NOT NULL,
    gpu_seconds REAL    NOT NULL,
    PRIMARY KEY (hour_at, owner)
);

-- What was stored before, counted once, as the user `default`'s.
INSERT INTO user_gpu_usage (owner, hour_at, gpu_seconds)
SELECT s.owner, r.stored_at - r.stored_at % 3600000, sum(json_extract(r.record, '$.gpu_usage.gpu_hours') * 3600.0)
FROM results r JOIN jobs j ON j.id = r.job_id JOIN sweeps s ON s.id = j.sweep_id
WHERE instr(r.record, '"gpu_usage"') > 0 AND json_extract(r.record, '$.gpu_usage.gpu_hours') > 0
GROUP BY s.owner, r.stored_at - r.stored_at % 3600000;
