-- effectflow ledger, version 10: finished runs can be archived (`effectflow archive`). An
-- archived run's rows, events and seals leave the ledger for a file that verifies on its own;
-- what stays is a record of the run (`archived_runs`, hashed with the audit key when the ledger
-- is keyed) and the link each of its seals was in its shard's chain (`archived_seals`), so
-- `effectflow audit verify` replays every shard's chain across the gap and tells an archived
-- run from one deleted by hand (which has no record, or one that does not verify).
CREATE TABLE archived_runs (
    run_id      TEXT PRIMARY KEY,
    tenant      TEXT NOT NULL,
    archived_at DOUBLE PRECISION NOT NULL,
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
-- recorded in `archived_runs` and its run row already gone. The refusal's message is the
-- trigger's argument, as the append-only functions word it.
CREATE FUNCTION effectflow_delete_archived_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM archived_runs a WHERE a.run_id = OLD.run_id)
       AND NOT EXISTS (SELECT 1 FROM runs r WHERE r.run_id = OLD.run_id) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION '%', TG_ARGV[0] USING ERRCODE = 'restrict_violation';
END
$$;
DROP TRIGGER audit_no_delete ON audit;
CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
    FOR EACH ROW EXECUTE FUNCTION effectflow_delete_archived_only('the audit log is append-only');
DROP TRIGGER seals_no_delete ON seals;
CREATE TRIGGER seals_no_delete BEFORE DELETE ON seals
    FOR EACH ROW EXECUTE FUNCTION effectflow_delete_archived_only('seals are append-only');
