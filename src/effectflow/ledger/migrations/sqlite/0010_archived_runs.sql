-- effectflow ledger, version 10: finished runs can be archived (`effectflow archive`). An
-- archived run's rows, events and seals leave the ledger for a file that verifies on its own;
-- what stays is a record of the run (`archived_runs`, hashed with the audit key when the ledger
-- is keyed) and the link each of its seals was in its shard's chain (`archived_seals`), so
-- `effectflow audit verify` replays every shard's chain across the gap and tells an archived
-- run from one deleted by hand (which has no record, or one that does not verify).
CREATE TABLE archived_runs (
    run_id      TEXT PRIMARY KEY,
    tenant      TEXT NOT NULL,
    archived_at REAL NOT NULL,
    audit_count INTEGER NOT NULL,
    audit_head  TEXT NOT NULL,
    seal_count  INTEGER NOT NULL,
    seal_head   TEXT,
    hash        TEXT NOT NULL
);
CREATE TABLE archived_seals (
    run_id    TEXT NOT NULL,
    n         INTEGER NOT NULL,
    shard     INTEGER,
    shard_seq INTEGER,
    hash      TEXT NOT NULL,
    PRIMARY KEY (run_id, n)
);
CREATE INDEX archived_seals_by_shard ON archived_seals (shard, shard_seq);

-- The audit log and the seals stay append-only, except for the rows of a run that is archived:
-- recorded in `archived_runs` and its run row already gone.
DROP TRIGGER audit_no_delete;
CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
WHEN NOT EXISTS (SELECT 1 FROM archived_runs a WHERE a.run_id = OLD.run_id)
  OR EXISTS (SELECT 1 FROM runs r WHERE r.run_id = OLD.run_id)
BEGIN SELECT RAISE(ABORT, 'the audit log is append-only'); END;
DROP TRIGGER seals_no_delete;
CREATE TRIGGER seals_no_delete BEFORE DELETE ON seals
WHEN NOT EXISTS (SELECT 1 FROM archived_runs a WHERE a.run_id = OLD.run_id)
  OR EXISTS (SELECT 1 FROM runs r WHERE r.run_id = OLD.run_id)
BEGIN SELECT RAISE(ABORT, 'seals are append-only'); END;
