-- effectflow ledger, version 8 (PostgreSQL): every seal is also chained into one of 64 shard
-- chains, whose heads cover every run of the ledger; JSON columns hold the canonical text.

-- A run's own chains cannot show that the run was deleted whole, or its newest writes cut together
-- with their seals: what is left is consistent. Each seal is therefore also a link in the chain of
-- its run's shard (`audit.shard_of(run_id)`), and `audit_shards` keeps each chain's length and
-- head, extended by every transaction that seals (keyed with HMAC when the operator gives a key).
-- A seal removed anywhere leaves a gap or a head that no longer matches, and without the key
-- nobody can compute a mended head. Shards, not one head: concurrent writers of different runs
-- rarely wait on one row. Seals written before version 8 have no place in a shard (NULL).
-- (No index on a shard's order: each commit would write one more index page; `verify` reads the
-- chains in one sorted scan.)
ALTER TABLE seals ADD COLUMN shard INTEGER;
ALTER TABLE seals ADD COLUMN shard_seq INTEGER;

CREATE TABLE audit_shards (
    shard INTEGER PRIMARY KEY,
    n     INTEGER NOT NULL,
    head  TEXT NOT NULL
);
INSERT INTO audit_shards (shard, n, head)
    SELECT x, 0, 'effectflow-shard-genesis/' || x FROM generate_series(0, 63) AS x;

-- JSON columns become TEXT holding the canonical JSON the write path printed, as on SQLite: jsonb
-- prints some numbers back as other values than were recorded (1e16 as the integer
-- 10000000000000000, -0.0 as 0), so a record read back differed from the one written and sealed.
-- Rows written before keep jsonb's print of their value (the same value when read).
ALTER TABLE runs ALTER COLUMN input_json TYPE TEXT USING input_json::text;
ALTER TABLE runs ALTER COLUMN output_json TYPE TEXT USING output_json::text;
ALTER TABLE runs ALTER COLUMN error_json TYPE TEXT USING error_json::text;
ALTER TABLE runs ALTER COLUMN control_json TYPE TEXT USING control_json::text;
ALTER TABLE steps ALTER COLUMN output_json TYPE TEXT USING output_json::text;
ALTER TABLE steps ALTER COLUMN error_json TYPE TEXT USING error_json::text;
ALTER TABLE attempts ALTER COLUMN error_json TYPE TEXT USING error_json::text;
ALTER TABLE effects ALTER COLUMN evidence_json TYPE TEXT USING evidence_json::text;

-- The index row (shard 64): its head covers the set of shards in use, so a shard emptied of its
-- seals does not pass for one never used. It moves when a shard is used for the first time.
INSERT INTO audit_shards (shard, n, head) VALUES (64, 0, 'effectflow-shard-index/');

-- What `verify` reads a chunk of runs at a time finds its rows through an index: a guarded call's
-- operation bindings by run, a person's decisions by effect (rare writes both).
CREATE INDEX operations_by_run ON operations (run_id);
CREATE INDEX decisions_by_effect ON decisions (effect_id);

-- A binding purged past its retention (`purge_expired_keys`) leaves a record, hashed (keyed)
-- like the chains: `verify` excuses a sealed binding that is gone only when such a record says
-- it was purged after its key expired, so a live binding deleted by hand is caught.
CREATE TABLE purged_keys (
    tenant               TEXT NOT NULL,
    logical_operation_id TEXT NOT NULL,
    run_id               TEXT NOT NULL,
    key_expires_at       DOUBLE PRECISION NOT NULL,
    purged_at            DOUBLE PRECISION NOT NULL,
    hash                 TEXT NOT NULL
);
CREATE INDEX purged_keys_by_run ON purged_keys (run_id);
