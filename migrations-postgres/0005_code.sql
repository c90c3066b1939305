-- Code shipped with a sweep and job checkpoints, for PostgreSQL: migrations/0005_code.sql
-- (SQLite). Never edit this file once released: add a new migration instead.

ALTER TABLE sweeps ADD COLUMN code_digest TEXT;
ALTER TABLE sweeps ADD COLUMN code_dir TEXT;
ALTER TABLE sweeps ADD COLUMN code_commit TEXT;
ALTER TABLE sweeps ADD COLUMN code_dirty BIGINT;
ALTER TABLE sweeps ADD COLUMN workspace TEXT;

CREATE TABLE checkpoints (
    job_id      BIGINT PRIMARY KEY,
    attempt     BIGINT NOT NULL,
    size        BIGINT NOT NULL,
    sha256      TEXT   NOT NULL,
    uploaded_at BIGINT NOT NULL
);

CREATE FUNCTION jobs_drop_checkpoint() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM checkpoints WHERE job_id = OLD.id;
    RETURN NULL;
END $$;
CREATE TRIGGER jobs_drop_checkpoint AFTER DELETE ON jobs
FOR EACH ROW EXECUTE FUNCTION jobs_drop_checkpoint();
