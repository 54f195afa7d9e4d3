-- effectflow ledger, version 7 (PostgreSQL): seals, the state rows each write produced, in a
-- chain per run.

-- Every batch a run writes (an intent, an outcome, a person's decision) appends one seal: the
-- digests of the rows it wrote (the run, its steps, effects, attempts, approvals, decisions and
-- operation bindings) and the run's audit head after it, chained like the audit events (keyed
-- with HMAC when the operator gives a key). `effectflow audit verify` compares today's rows with
-- their last sealed digest, so an edited status or output is caught, and the audit head with the
-- sealed one, so a cut tail of events is caught. Runs recorded before version 7 have no seals.
CREATE TABLE seals (
    run_id      TEXT NOT NULL,
    n           INTEGER NOT NULL,
    rows_json   TEXT NOT NULL,
    audit_head  TEXT NOT NULL,
    audit_count INTEGER NOT NULL,
    at          DOUBLE PRECISION NOT NULL,
    prev_hash   TEXT NOT NULL,
    hash        TEXT NOT NULL,
    PRIMARY KEY (run_id, n)
);
ALTER TABLE runs ADD COLUMN seal_head TEXT;
ALTER TABLE runs ADD COLUMN seal_count INTEGER NOT NULL DEFAULT 0;

CREATE FUNCTION effectflow_seals_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'seals are append-only' USING ERRCODE = 'restrict_violation';
END
$$;
CREATE TRIGGER seals_no_update BEFORE UPDATE ON seals
    FOR EACH ROW EXECUTE FUNCTION effectflow_seals_append_only();
CREATE TRIGGER seals_no_delete BEFORE DELETE ON seals
    FOR EACH ROW EXECUTE FUNCTION effectflow_seals_append_only();
CREATE TRIGGER seals_no_truncate BEFORE TRUNCATE ON seals
    FOR EACH STATEMENT EXECUTE FUNCTION effectflow_seals_append_only();
