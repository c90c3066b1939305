-- Adaptive search and early stopping, for PostgreSQL: migrations/0006_search.sql (SQLite).
-- Never edit this file once released: add a new migration instead.

CREATE TABLE sweep_search (
    sweep_id   BIGINT PRIMARY KEY REFERENCES sweeps (id) ON DELETE CASCADE,
    method     TEXT   NOT NULL CHECK (method IN ('bayes', 'random', 'fixed')),
    seed       BIGINT NOT NULL,
    run_cap    BIGINT,
    proposed   BIGINT NOT NULL DEFAULT 0,
    open       BIGINT NOT NULL,
    early_stop BIGINT NOT NULL,
    fallback   BIGINT NOT NULL DEFAULT 0,
    notes      TEXT   NOT NULL DEFAULT '[]'
);
CREATE INDEX sweep_search_open ON sweep_search (sweep_id) WHERE open = 1;

CREATE TABLE early_stops (
    job_id     BIGINT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    attempt    BIGINT NOT NULL,
    rung       BIGINT NOT NULL,
    cutoff     DOUBLE PRECISION,
    reason     TEXT   NOT NULL,
    stopped_at BIGINT NOT NULL,
    PRIMARY KEY (job_id, attempt)
);

-- A trigger's WHEN cannot hold a subquery here: the stop is looked up in its body.
CREATE FUNCTION early_stop_reason() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    stop_reason TEXT;
BEGIN
    SELECT reason INTO stop_reason FROM early_stops WHERE job_id = NEW.job_id AND attempt = NEW.attempt;
    IF FOUND THEN
        UPDATE job_events SET reason = stop_reason WHERE id = NEW.id;
        UPDATE jobs SET reason = stop_reason WHERE id = NEW.job_id AND attempt = NEW.attempt;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER early_stop_reason AFTER INSERT ON job_events
FOR EACH ROW WHEN (NEW.to_status = 'cancelled')
EXECUTE FUNCTION early_stop_reason();
