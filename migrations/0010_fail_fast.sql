-- Sweeps whose runs keep failing pause themselves (issue 28, item 5). A sweep keeps its limits
-- (`max_initial_failures`, `max_consecutive_failures`; 0 = never), and while `paused_at` is set
-- nothing of it is claimed or proposed; `paused_reason` says why. Failures are counted since
-- the later of its last success and `resumed_at`. A paused sweep's queued jobs are `held`: out
-- of the claims' index, so a large paused sweep costs the claims of the others nothing. Never edit this file once released: add a
-- new migration instead.
ALTER TABLE sweeps ADD COLUMN max_initial_failures INTEGER NOT NULL DEFAULT 3;
ALTER TABLE sweeps ADD COLUMN max_consecutive_failures INTEGER NOT NULL DEFAULT 10;
ALTER TABLE sweeps ADD COLUMN paused_at INTEGER;
ALTER TABLE sweeps ADD COLUMN paused_reason TEXT;
ALTER TABLE sweeps ADD COLUMN resumed_at INTEGER;
ALTER TABLE jobs ADD COLUMN held INTEGER NOT NULL DEFAULT 0;
-- The claims' index holds the jobs a claim may take: queued and not held
-- (`db::claims::CLAIMABLE`).
DROP INDEX jobs_queue;
CREATE INDEX jobs_queue ON jobs (priority DESC, id) WHERE status = 'queued' AND held = 0;
-- The sweep's last success and its failures since are index ranges: the finish time joins the
-- key of the index jobs already keep by sweep and status (no more index writes per finish).
DROP INDEX jobs_by_sweep_status;
CREATE INDEX jobs_by_sweep_status ON jobs (sweep_id, status, finished_at);

-- A job that becomes queued again (a retry, a lost or abandoned attempt) is held if and only
-- if its sweep is paused. Requeues are rare; claims and finishes do not fire it.
CREATE TRIGGER jobs_hold_when_paused AFTER UPDATE OF status ON jobs
WHEN NEW.status = 'queued' AND OLD.status IS NOT 'queued'
BEGIN
    UPDATE jobs SET held = EXISTS (SELECT 1 FROM sweeps WHERE id = NEW.sweep_id AND paused_at IS NOT NULL)
    WHERE id = NEW.id;
END;
