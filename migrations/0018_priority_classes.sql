-- Priority classes (issue 29, item 3: "a waiting job ... of a higher priority class"). Never
-- edit this file once released: add a new migration instead.
--
-- A sweep may name a class of the server's `[server.priority_classes]`; its value is kept as
-- it was at submission (a class changed or removed later leaves queued sweeps as they were).
-- Across users, a job of a higher class is claimed first and may preempt lower ones; within
-- one user, the queue's order (priority, then submission) holds.
ALTER TABLE sweeps ADD COLUMN priority_class TEXT;
ALTER TABLE sweeps ADD COLUMN class_value INTEGER NOT NULL DEFAULT 0;
