-- A worker that stopped cleanly says so (POST /api/workers/{id}/leave): it is 'left', shown
-- apart from workers that went silent ('lost'), until it registers again
-- (migrations/0009_worker_left.sql). Never edit this file once released.
ALTER TABLE workers ADD COLUMN left_at BIGINT;
