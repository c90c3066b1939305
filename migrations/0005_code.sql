-- Code shipped with a sweep, the environment its jobs run in, and job checkpoints. Never edit
-- this file once released: add a new migration instead.

-- The code snapshot a sweep's jobs run in: stored as `code/<digest>.tar.zst` under the data
-- directory, named by the SHA-256 of its tar stream (NULL: no code shipped, an empty directory),
-- with the directory inside it the jobs start in and the git commit and state it was packed
-- from. `workspace` is the JSON of shared::api::Workspace without the snapshot (workdir, env,
-- setup): set on the sweep, carried by every claimed job, never queried by its parts.
ALTER TABLE sweeps ADD COLUMN code_digest TEXT;
ALTER TABLE sweeps ADD COLUMN code_dir TEXT;
ALTER TABLE sweeps ADD COLUMN code_commit TEXT;
ALTER TABLE sweeps ADD COLUMN code_dirty INTEGER;
ALTER TABLE sweeps ADD COLUMN workspace TEXT;

-- The newest checkpoint of each job, stored as `checkpoints/<job>/<sha256>.tar.zst`: uploaded by
-- its running attempt, restored into the next one. One row per job: a newer upload replaces it.
-- No foreign key: a removed sweep's jobs take their rows with them by the trigger below, so
-- removing jobs needs no knowledge of this table.
CREATE TABLE checkpoints (
    job_id      INTEGER PRIMARY KEY,
    attempt     INTEGER NOT NULL,
    size        INTEGER NOT NULL,
    sha256      TEXT    NOT NULL,
    uploaded_at INTEGER NOT NULL
);

CREATE TRIGGER jobs_drop_checkpoint AFTER DELETE ON jobs
BEGIN
    DELETE FROM checkpoints WHERE job_id = OLD.id;
END;
