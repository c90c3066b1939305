-- Each job's owner, its sweep's, kept on the job so that a claim can read one user's queue
-- in dispatch order (issue 29, item 2; decision 0077). Never edit this file once released:
-- add a new migration instead.
--
-- Set by the insert (`db::sweep_jobs`) from the sweep's owner, which never changes.
ALTER TABLE jobs ADD COLUMN owner TEXT NOT NULL DEFAULT 'default';
UPDATE jobs SET owner = (SELECT s.owner FROM sweeps s WHERE s.id = jobs.sweep_id)
WHERE sweep_id IN (SELECT id FROM sweeps WHERE owner <> 'default');

-- One user's claimable jobs in dispatch order, and the users with any (read a user at a time).
-- The predicate is `db::claims::CLAIMABLE`, as the index `jobs_queue`'s.
CREATE INDEX jobs_queue_by_owner ON jobs (owner, priority DESC, id) WHERE status = 'queued' AND held = 0;
