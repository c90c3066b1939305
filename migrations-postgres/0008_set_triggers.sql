-- Transitions recorded and counted once per statement, for PostgreSQL (migrations/0008 is the
-- SQLite side, which keeps its row triggers). Never edit this file once released: add a new
-- migration instead.
--
-- The row triggers of 0001 and 0004 ran four statements inside PL/pgSQL for every job that
-- changed status: a finish of 64 jobs with their workers' next claims ran over 500. Statement
-- triggers read the statement's old and new rows (transition tables) and record every
-- transition with one INSERT and count them with one more per statement: what the events and
-- counts hold is the same (server/tests/postgres compares them with SQLite's).

DROP TRIGGER jobs_record_transition ON jobs;
DROP TRIGGER jobs_count_transition ON jobs;
DROP FUNCTION jobs_record_transition();
DROP FUNCTION jobs_count_transition();

-- Under their old names (the schemas' trigger names match SQLite's). Transition tables cannot
-- go with a column list (UPDATE OF status): both run after every UPDATE of jobs, and the join
-- keeps the rows whose status (or attempt) changed. PostgreSQL fills the statement's old and
-- new rows once for the two.
CREATE FUNCTION jobs_record_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO job_events (job_id, at, from_status, to_status, attempt, worker_id, reason, gpu_ids, exit_code)
    SELECT n.id, app_now_ms(), o.status, n.status, n.attempt,
           coalesce(n.worker_id, o.worker_id), n.reason, coalesce(n.gpu_ids, o.gpu_ids), n.exit_code
    FROM new_jobs n JOIN old_jobs o ON o.id = n.id
    WHERE o.status IS DISTINCT FROM n.status OR o.attempt IS DISTINCT FROM n.attempt
    ORDER BY n.id;
    RETURN NULL;
END $$;
CREATE TRIGGER jobs_record_transition AFTER UPDATE ON jobs
REFERENCING OLD TABLE AS old_jobs NEW TABLE AS new_jobs
FOR EACH STATEMENT EXECUTE FUNCTION jobs_record_transition();

-- Counted without a lock: each statement appends what it moved to sweep_count_moves, and the
-- counts are sweep_counts plus the moves not folded into it yet (db::sweeps::COUNTS reads
-- both; the reaper's leader folds the moves in every pass, db::sweeps::fold_count_moves). An
-- upsert of sweep_counts held the sweep's count rows until the transaction's end, so every
-- transaction that moved a job of a sweep waited for the one before: replicas' writers took
-- turns, and a claim waited for a finish's COMMIT (0004 locked them all, in one order, to
-- turn the deadlocks this caused into waits).
CREATE TABLE sweep_count_moves (
    sweep_id BIGINT NOT NULL,
    status   TEXT   NOT NULL,
    jobs     BIGINT NOT NULL
);
CREATE INDEX sweep_count_moves_by_sweep ON sweep_count_moves (sweep_id);

CREATE FUNCTION jobs_count_transition() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO sweep_count_moves (sweep_id, status, jobs)
    SELECT sweep_id, status, sum(delta) FROM (
        SELECT o.sweep_id, o.status, -1 AS delta FROM new_jobs n JOIN old_jobs o ON o.id = n.id
        WHERE o.status IS DISTINCT FROM n.status
        UNION ALL
        SELECT n.sweep_id, n.status, 1 FROM new_jobs n JOIN old_jobs o ON o.id = n.id
        WHERE o.status IS DISTINCT FROM n.status
    ) AS moved
    GROUP BY sweep_id, status;
    RETURN NULL;
END $$;
CREATE TRIGGER jobs_count_transition AFTER UPDATE ON jobs
REFERENCING OLD TABLE AS old_jobs NEW TABLE AS new_jobs
FOR EACH STATEMENT EXECUTE FUNCTION jobs_count_transition();
