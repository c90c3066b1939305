-- The rows of a large sweep not yet written into `jobs` (decision 0076). A submission of more
-- than 20,000 jobs writes its first 4,000 and its last one, and leaves the others here, encoded
-- 2,000 to a row (`db::sweep_jobs`); the server writes them one chunk per background write
-- unit after the submission has returned, and goes on after a restart. Never edit this file once
-- released: add a new migration instead.
CREATE TABLE job_expansions (
    sweep_id INTEGER NOT NULL REFERENCES sweeps (id),
    -- The id of the chunk's first job; the others follow it, one each.
    first_id INTEGER NOT NULL,
    -- The sweep's priority: chunks of a higher one are written first.
    priority INTEGER NOT NULL,
    rows     BLOB    NOT NULL,
    PRIMARY KEY (sweep_id, first_id)
);
