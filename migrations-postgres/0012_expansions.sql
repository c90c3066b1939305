-- The rows of a large sweep not yet written into `jobs` (migrations/0012_expansions.sql).
-- PostgreSQL writes every job of a sweep in its submission's transaction, so the table stays
-- empty; it is here so that both schemas have the same versions. Never edit this file once
-- released: add a new migration instead.
CREATE TABLE job_expansions (
    sweep_id BIGINT NOT NULL REFERENCES sweeps (id),
    first_id BIGINT NOT NULL,
    priority BIGINT NOT NULL,
    rows     BYTEA  NOT NULL,
    PRIMARY KEY (sweep_id, first_id)
);
