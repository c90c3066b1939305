-- A worker that stopped cleanly says so (POST /api/workers/{id}/leave): it is 'left', shown
-- apart from workers that went silent ('lost'), until it registers again. Never edit this file
-- once released: add a new migration instead.
ALTER TABLE workers ADD COLUMN left_at INTEGER;
