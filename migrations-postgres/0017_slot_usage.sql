-- The time jobs without GPUs held their job slots, by user and hour (issue 29, item 2: "CPU-only
-- jobs count their slots"). Never edit this file once released: add a new migration instead.
--
-- The fair share counts a slot-second as a GPU-second (`shared::fair_share::charge`); what the
-- workers page, `GET /api/usage` and `/metrics` show as GPU time stays `gpu_seconds` alone.
-- Added with a record's GPU time on the general path (`db::results::insert`); the finish+claim
-- steps' records are summed in memory and added every few seconds (`queue::shares`).
ALTER TABLE user_gpu_usage ADD COLUMN slot_seconds DOUBLE PRECISION NOT NULL DEFAULT 0;

-- What was stored before, counted once: records of attempts without GPUs.
INSERT INTO user_gpu_usage (owner, hour_at, gpu_seconds, slot_seconds)
SELECT j.owner, r.stored_at - r.stored_at % 3600000, 0.0,
       coalesce(sum(greatest(coalesce((r.record::jsonb ->> 'finished_at')::BIGINT - (r.record::jsonb ->> 'started_at')::BIGINT, 0), 0)), 0)::DOUBLE PRECISION / 1000.0
FROM results r JOIN jobs j ON j.id = r.job_id
WHERE strpos(r.record, '"gpu_usage"') = 0 AND jsonb_array_length(r.record::jsonb -> 'gpus') = 0
GROUP BY j.owner, r.stored_at - r.stored_at % 3600000
ON CONFLICT (hour_at, owner) DO UPDATE SET slot_seconds = user_gpu_usage.slot_seconds + excluded.slot_seconds;
