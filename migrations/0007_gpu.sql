-- GPU accounting and capabilities (issue 14 items 8 and 9). Never edit this file once
-- released: add a new migration instead.

-- A job that runs the built-in trainer (`app train`) is handed only to a worker whose binary
-- has it (its capacity says so); copied from the sweep like the other resources, so the claim
-- filters on the jobs table alone. What each attempt used of its GPUs needs no column: it is
-- part of the attempt's record (`results.record`, JSON of shared::api::AttemptRecord).
ALTER TABLE jobs ADD COLUMN needs_trainer INTEGER NOT NULL DEFAULT 0;
