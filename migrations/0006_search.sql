-- Adaptive search and early stopping (issue 13): the state of each sweep's controller, and the
-- runs it stopped early. Times are Unix milliseconds. Never edit this file once released: add a
-- new migration instead.

-- One row per sweep whose runs are proposed one at a time (bayes; random without a cap) or
-- may be stopped early. The source (in `sweeps`) says how to propose; this row says where the
-- controller stands, so a restarted server goes on where it was: `proposed` is both the number
-- of runs made and the index of the next, written in the same transaction as the jobs it
-- counts, so a restart can never make an index twice.
CREATE TABLE sweep_search (
    sweep_id   INTEGER PRIMARY KEY REFERENCES sweeps (id) ON DELETE CASCADE,
    method     TEXT    NOT NULL CHECK (method IN ('bayes', 'random', 'fixed')),  -- fixed: jobs built at submission
    seed       INTEGER NOT NULL,
    run_cap    INTEGER,                       -- NULL: until the sweep is cancelled
    proposed   INTEGER NOT NULL DEFAULT 0,
    open       INTEGER NOT NULL,              -- 1 while the controller still makes runs
    early_stop INTEGER NOT NULL,              -- 1 when runs are checked against rungs or a median
    fallback   INTEGER NOT NULL DEFAULT 0,    -- 1 while bayes proposes at random for want of the metric
    notes      TEXT    NOT NULL DEFAULT '[]'  -- JSON array of sentences: fallbacks, cap reached, cancel
);
-- Every claim batch asks for the open ones: a partial index keeps that a lookup of a few rows.
CREATE INDEX sweep_search_open ON sweep_search (sweep_id) WHERE open = 1;

-- A run stopped early: the attempt, the rung (step) it was judged at, the cutoff it missed and
-- the sentence saying so. The job itself goes the ordinary cancel path (flagged, killed by its
-- worker at the next heartbeat, `cancelled`); this row is what makes it "stopped early".
CREATE TABLE early_stops (
    job_id     INTEGER NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    attempt    INTEGER NOT NULL,
    rung       INTEGER NOT NULL,
    cutoff     REAL,                          -- NULL when the run's own metric was not a number
    reason     TEXT    NOT NULL,
    stopped_at INTEGER NOT NULL,
    PRIMARY KEY (job_id, attempt)
);

-- However a stopped run ends (its worker's kill report, a lease that ran out, a hand-back),
-- `shared::job` calls the end `cancelled`; the job and its history take the stop's sentence
-- as their reason instead, in the same statement, so no path can forget it. The history row
-- exists by the time this fires, whatever order the triggers on `jobs` run in.
CREATE TRIGGER early_stop_reason AFTER INSERT ON job_events
WHEN NEW.to_status = 'cancelled'
     AND EXISTS (SELECT 1 FROM early_stops WHERE job_id = NEW.job_id AND attempt = NEW.attempt)
BEGIN
    UPDATE job_events SET reason =
        (SELECT reason FROM early_stops WHERE job_id = NEW.job_id AND attempt = NEW.attempt)
        WHERE id = NEW.id;
    UPDATE jobs SET reason =
        (SELECT reason FROM early_stops WHERE job_id = NEW.job_id AND attempt = NEW.attempt)
        WHERE id = NEW.job_id AND attempt = NEW.attempt;
END;
