-- Transitions recorded and counted once per statement: a PostgreSQL change
-- (migrations-postgres/0008_set_triggers.sql). SQLite runs its row triggers inside the
-- statement that changes the rows, one writer at a time, and keeps them and its count rows as
-- they are; the table of count moves is made here too, always empty, so that both schemas have
-- the same tables. Never edit this file once released: add a new migration instead.
CREATE TABLE sweep_count_moves (
    sweep_id INTEGER NOT NULL,
    status   TEXT    NOT NULL,
    jobs     INTEGER NOT NULL
);
CREATE INDEX sweep_count_moves_by_sweep ON sweep_count_moves (sweep_id);
