-- GPU accounting and capabilities, for PostgreSQL: migrations/0007_gpu.sql (SQLite). Never edit
-- this file once released: add a new migration instead.

ALTER TABLE jobs ADD COLUMN needs_trainer BIGINT NOT NULL DEFAULT 0;
