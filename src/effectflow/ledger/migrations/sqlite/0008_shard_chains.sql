-- effectflow ledger, version 8: every seal is also chained into one of 64 shard chains, whose
-- heads cover every run of the ledger.

-- A run's own chains cannot show that the run was deleted whole, or its newest writes cut together
-- with their seals: what is left is consistent. Each seal is therefore also a link in the chain of
-- its run's shard (`audit.shard_of(run_id)`), and `audit_shards` keeps each chain's length and
-- head, extended by every transaction that seals (keyed with HMAC when the operator gives a key).
-- A seal removed anywhere leaves a gap or a head that no longer matches, and without the key
-- nobody can compute a mended head. Shards, not one head: concurrent writers of different runs
-- rarely touch one row. Seals written before version 8 have no place in a shard (NULL).
-- The seals table is rebuilt WITHOUT ROWID: one b-tree keyed by (run_id, n), where a rowid table
-- kept a second one for its primary key, so each commit writes one page less. (No index on a
-- shard's order either, for the same reason: `verify` reads the chains in one sorted scan.)
CREATE TABLE seals_v8 (
    run_id      TEXT NOT NULL,
    n           INTEGER NOT NULL,
    rows_json   TEXT NOT NULL,
    audit_head  TEXT NOT NULL,
    audit_count INTEGER NOT NULL,
    at          REAL NOT NULL,
    prev_hash   TEXT NOT NULL,
    hash        TEXT NOT NULL,
    shard       INTEGER,
    shard_seq   INTEGER,
    PRIMARY KEY (run_id, n)
) WITHOUT ROWID;
INSERT INTO seals_v8 (run_id, n, rows_json, audit_head, audit_count, at, prev_hash, hash)
    SELECT run_id, n, rows_json, audit_head, audit_count, at, prev_hash, hash FROM seals;
DROP TABLE seals;
ALTER TABLE seals_v8 RENAME TO seals;
CREATE TRIGGER seals_no_update BEFORE UPDATE ON seals
BEGIN SELECT RAISE(ABORT, 'seals are append-only'); END;
CREATE TRIGGER seals_no_delete BEFORE DELETE ON seals
BEGIN SELECT RAISE(ABORT, 'seals are append-only'); END;

CREATE TABLE audit_shards (
    shard INTEGER PRIMARY KEY,
    n     INTEGER NOT NULL,
    head  TEXT NOT NULL
);
WITH RECURSIVE s (x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM s WHERE x < 63)
INSERT INTO audit_shards (shard, n, head) SELECT x, 0, 'effectflow-shard-genesis/' || x FROM s;

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
    key_expires_at       REAL NOT NULL,
    purged_at            REAL NOT NULL,
    hash                 TEXT NOT NULL
);
CREATE INDEX purged_keys_by_run ON purged_keys (run_id);
