-- The SQLite ledger's statements (see ledger/queries.py for the format).
-- Placeholders are ?. Run statuses a worker executes: 'running', 'cancelling'. Step statuses whose
-- outcome is not known yet: 'intent_recorded', 'unknown', 'needs_attention'.

-- ---------------------------------------------------------------------------------------------
-- The write path: one batch, in the caller's transaction (ledger/sql_core.py)
-- ---------------------------------------------------------------------------------------------

-- name: insert_run
-- A new run and its chains' genesis. A run id taken already inserts nothing and returns no row:
-- the batch is refused on its own (IdempotencyConflict), not the group transaction it shares.
-- The RETURNING list is the run's head (rowmap.HEAD).
INSERT INTO runs (run_id, tenant, workflow, workflow_version, input_json, input_digest, status,
                  output_json, error_json, next_action, generation, created_at, updated_at,
                  lease_owner, lease_token, lease_expires_at, control_json, workflow_code, scope,
                  call_id, audit_head, audit_count)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0)
ON CONFLICT (run_id) DO NOTHING
RETURNING audit_head, audit_count, seal_head, seal_count, control_json, status, output_json,
          error_json, next_action, generation, workflow_version, workflow_code;

-- name: fence_run
-- A fenced batch: its lease token must still be current. The UPDATE takes the run's write lock
-- (the file's, under BEGIN IMMEDIATE) and extends the lease, never back (a NULL leaves it as it
-- is: ``Batch.renews_lease``); no row means the lease was lost.
UPDATE runs SET lease_expires_at = COALESCE(max(lease_expires_at, ?1), lease_expires_at, ?1)
WHERE run_id = ?2 AND lease_token = ?3
RETURNING audit_head, audit_count, seal_head, seal_count, control_json, status, output_json,
          error_json, next_action, generation, workflow_version, workflow_code;

-- name: fence_read (sqlite only)
-- A fenced batch on SQLite: BEGIN IMMEDIATE holds the file's write lock already, so the token is
-- checked by a read, and the lease is extended by the batch's one UPDATE of the run at its end
-- (sql_core._apply_txn): one run-row write a transaction, not two. No row: the lease was lost.
SELECT audit_head, audit_count, seal_head, seal_count, control_json, status, output_json,
       error_json, next_action, generation, workflow_version, workflow_code
FROM runs WHERE run_id = ? AND lease_token = ?;

-- name: lock_run
-- An unfenced batch (a person's decision, a cancel) reads its run's head; BEGIN IMMEDIATE has
-- locked the file already.
SELECT audit_head, audit_count, seal_head, seal_count, control_json, status, output_json,
       error_json, next_action, generation, workflow_version, workflow_code
FROM runs WHERE run_id = ?;

-- name: update_run
-- The run columns a batch changes ({assignments}: "column = ?" each).
UPDATE runs SET {assignments} WHERE run_id = ?;

-- name: expect_run
-- What a decision was made on, read under the run's lock (ledger/expect.py).
SELECT * FROM runs WHERE run_id = ?;

-- name: expect_step
SELECT * FROM steps WHERE run_id = ? AND step_id = ?;

-- name: expect_effect
SELECT * FROM effects WHERE run_id = ? AND effect_id = ?;

-- name: expect_unapproved
SELECT approval_id FROM approvals WHERE run_id = ? AND step_id = ? AND request_digest = ? LIMIT 1;

-- name: insert_decision
-- A decision id taken already (by a concurrent decision too) inserts nothing and returns no row:
-- IdempotencyConflict, never the driver's unique violation.
INSERT INTO decisions (decision_id, tenant, params_digest, effect_id, decided_at)
VALUES (?, ?, ?, ?, ?)
ON CONFLICT DO NOTHING RETURNING decision_id;

-- name: insert_approval
INSERT INTO approvals (approval_id, tenant, run_id, step_id, request_digest, approver, note,
                       approved_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT DO NOTHING RETURNING approval_id;

-- name: bind_operation
-- A logical operation bound to its request and step, once. ON CONFLICT without a target also
-- covers the key's own uniqueness. RETURNING, not rowcount: PostgreSQL's pipeline knows only
-- fetched results, and both dialects read it the same way.
INSERT INTO operations (tenant, logical_operation_id, idempotency_key, request_digest, tool, run_id,
                        step_id, created_at, key_expires_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT DO NOTHING RETURNING tenant;

-- name: operation_bound
-- Who holds an operation another batch tried to bind.
SELECT request_digest, run_id, step_id FROM operations
WHERE tenant = ? AND logical_operation_id = ?;

-- name: upsert_step
INSERT INTO steps (run_id, step_id, seq, step_revision, tool, effect_class, logical_operation_id,
                   idempotency_key, request_digest, status, completion_state, external_system,
                   external_effect_id, output_json, error_json, effect_id, confirmed_at, next_step,
                   compensation_status, next_action, created_at, updated_at, required_state,
                   compensates, approval_id, arguments_json)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (run_id, step_id) DO UPDATE SET
    seq = excluded.seq, step_revision = excluded.step_revision, tool = excluded.tool,
    effect_class = excluded.effect_class, logical_operation_id = excluded.logical_operation_id,
    idempotency_key = excluded.idempotency_key, request_digest = excluded.request_digest,
    status = excluded.status, completion_state = excluded.completion_state,
    external_system = excluded.external_system, external_effect_id = excluded.external_effect_id,
    output_json = excluded.output_json, error_json = excluded.error_json,
    effect_id = excluded.effect_id, confirmed_at = excluded.confirmed_at,
    next_step = excluded.next_step, compensation_status = excluded.compensation_status,
    next_action = excluded.next_action, created_at = excluded.created_at,
    updated_at = excluded.updated_at, required_state = excluded.required_state,
    compensates = excluded.compensates, approval_id = excluded.approval_id,
    arguments_json = excluded.arguments_json;

-- name: upsert_attempt
-- run_id, step_id and number never change after the insert and are indexed: left out of the SET
-- list, since SQLite rewrites the entries of every index whose columns the SET names.
INSERT INTO attempts (attempt_id, run_id, step_id, number, kind, generation, started_at, ended_at,
                      outcome, error_json, response_digest)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (attempt_id) DO UPDATE SET
    kind = excluded.kind, generation = excluded.generation, started_at = excluded.started_at,
    ended_at = excluded.ended_at, outcome = excluded.outcome, error_json = excluded.error_json,
    response_digest = excluded.response_digest;

-- name: upsert_effect
-- run_id, step_id, created_at and compensates are fixed at the insert (indexed; see above).
INSERT INTO effects (effect_id, tenant, run_id, step_id, tool, tool_call_id, logical_operation_id,
                     idempotency_key, request_digest, response_digest, status, external_system,
                     external_effect_id, committed_at, approval_id, compensation_status,
                     compensates, evidence_json, resolved_by, next_action, version, created_at,
                     updated_at, effect_id_field)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (effect_id) DO UPDATE SET
    tenant = excluded.tenant, tool = excluded.tool, tool_call_id = excluded.tool_call_id,
    logical_operation_id = excluded.logical_operation_id,
    idempotency_key = excluded.idempotency_key, request_digest = excluded.request_digest,
    response_digest = excluded.response_digest, status = excluded.status,
    external_system = excluded.external_system, external_effect_id = excluded.external_effect_id,
    committed_at = excluded.committed_at, approval_id = excluded.approval_id,
    compensation_status = excluded.compensation_status, evidence_json = excluded.evidence_json,
    resolved_by = excluded.resolved_by, next_action = excluded.next_action,
    version = excluded.version, updated_at = excluded.updated_at,
    effect_id_field = excluded.effect_id_field;

-- name: insert_audit
INSERT INTO audit (run_id, step_id, effect_id, kind, actor, detail_json, at, prev_hash, hash)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?);

-- ---------------------------------------------------------------------------------------------
-- Seals and shard chains (ledger/audit.py), last in a sealing transaction
-- ---------------------------------------------------------------------------------------------

-- name: insert_seal
INSERT INTO seals (run_id, n, rows_json, audit_head, audit_count, at, prev_hash, hash, shard,
                   shard_seq)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?);

-- name: read_shards
-- The heads of the shards a transaction seals into ({marks}: one ? per shard). The write lock is
-- the file's, so nothing moves them until the COMMIT.
SELECT shard, n, head FROM audit_shards WHERE shard IN ({marks});

-- name: move_shard (sqlite only)
-- A shard's head moved, if it is still where this store left it (by length and head: a rolled
-- back transaction may leave a memory of the right length and the wrong head). No row: another
-- process moved it, and the shard is read again.
UPDATE audit_shards SET n = ?, head = ? WHERE shard = ? AND n = ? AND head = ?;

-- name: update_shard
UPDATE audit_shards SET n = ?, head = ? WHERE shard = ?;

-- name: used_shards
-- The shards that hold seals, for the index row (audit.INDEX is the parameter).
SELECT shard FROM audit_shards WHERE n > 0 AND shard <> ?;

-- ---------------------------------------------------------------------------------------------
-- Leases and claims
-- ---------------------------------------------------------------------------------------------

-- name: claim_runnable
-- Lease the runs claim_runnable_candidates picked, in the same BEGIN IMMEDIATE transaction
-- ({picked}: "run_id IN (:picked_0, ...)"). SQLite's RETURNING sees only the new row, so who held
-- each lease before is read by that query.
UPDATE runs SET lease_owner = :owner, lease_token = lease_token + 1, lease_expires_at = :expires
WHERE {picked}
RETURNING *;

-- name: claim_runnable_candidates (sqlite only)
-- The oldest runnable runs: running or cancelling, with no live lease or one held by a dead owner
-- ({or_dead}: "OR lease_owner IN (:dead_0, ...)" when there are dead owners), with their owner
-- (previous_owner; NULL for a run nobody held). BEGIN IMMEDIATE serializes claimers on one file.
SELECT run_id, lease_owner AS previous_owner FROM runs
WHERE status IN ('running', 'cancelling')
  AND (lease_expires_at IS NULL OR lease_expires_at < :now{or_dead})
ORDER BY created_at LIMIT :limit;

-- name: claim
-- Take one run's lease by compare-and-swap on its token.
UPDATE runs SET lease_owner = ?, lease_token = lease_token + 1, lease_expires_at = ?
WHERE run_id = ? AND lease_token = ?
RETURNING *;

-- name: heartbeat
-- Extend one held lease, never back (a beat that read its clock before a write renewed the lease
-- must not move it back under a deadline given meanwhile); no row: it was lost, or let go (ended
-- or released: no owner, and a late beat must not give it an expiry back).
UPDATE runs SET lease_expires_at = COALESCE(max(lease_expires_at, ?1), ?1)
WHERE run_id = ?2 AND lease_token = ?3 AND lease_owner IS NOT NULL RETURNING run_id;

-- name: release
-- Give the lease up (workers poll: nothing to announce on the channel PostgreSQL notifies).
UPDATE runs SET lease_owner = NULL, lease_expires_at = NULL
WHERE run_id = :run_id AND lease_token = :token;

-- name: purge_expired_keys
-- Bindings past retention whose step is settled: a step whose outcome is not known, or that may
-- still be retried or completed under its key, keeps its binding.
DELETE FROM operations
WHERE key_expires_at < ?
  AND NOT EXISTS (
      SELECT 1 FROM steps s
      WHERE s.run_id = operations.run_id AND s.step_id = operations.step_id
        AND s.status IN ('intent_recorded', 'unknown', 'needs_attention', 'not_committed',
                         'awaiting_completion'))
RETURNING tenant, logical_operation_id, run_id, key_expires_at;

-- name: insert_purge_record
-- The hashed record a purge leaves, which verify accepts as why a sealed binding is gone.
INSERT INTO purged_keys (tenant, logical_operation_id, run_id, key_expires_at, purged_at, hash)
VALUES (?, ?, ?, ?, ?, ?);

-- name: checkpoint_outcome
-- A local transaction's checkpoint: its attempt's outcome, once the transaction is over.
SELECT outcome FROM attempts WHERE run_id = ? AND attempt_id = ?;

-- ---------------------------------------------------------------------------------------------
-- Reads (ledger/sql_core.py SQLReads). SQLite keeps insertion order for equal keys of one index
-- walk, so rows created at the same moment need no tie-breaker column.
-- ---------------------------------------------------------------------------------------------

-- name: get_run
SELECT * FROM runs WHERE run_id = ?;

-- name: list_runs
-- Newest first ({where}: the listing's filters).
SELECT * FROM runs WHERE {where} ORDER BY created_at DESC LIMIT ?;

-- name: runs_to_recover
-- Running runs with no live lease.
SELECT * FROM runs
WHERE status IN ('running', 'cancelling') AND (lease_expires_at IS NULL OR lease_expires_at < ?)
ORDER BY created_at LIMIT ?;

-- name: leased_running_runs
-- Running runs that still hold a lease (the runtime checks whether the holder lives).
SELECT * FROM runs
WHERE status IN ('running', 'cancelling') AND lease_expires_at IS NOT NULL
ORDER BY created_at LIMIT ?;

-- name: lease_owners
SELECT DISTINCT lease_owner FROM runs
WHERE status IN ('running', 'cancelling') AND lease_expires_at >= ?;

-- name: steps_of_run
SELECT * FROM steps WHERE run_id = ? ORDER BY seq;

-- name: attempts_of_run
SELECT * FROM attempts WHERE run_id = ? ORDER BY started_at, number;

-- name: attempts_of_step
SELECT * FROM attempts WHERE run_id = ? AND step_id = ? ORDER BY number;

-- name: list_effects
-- Oldest first ({where}: the listing's filters).
SELECT * FROM effects WHERE {where} ORDER BY created_at LIMIT ?;

-- name: effects_in_doubt
-- Effects whose outcome is not known and that no unexpired lease covers ({where}: the tenant's
-- term, "e.tenant = ? AND", or nothing).
SELECT e.* FROM effects e JOIN runs r ON r.run_id = e.run_id
WHERE {where}e.status IN ('intent_recorded', 'unknown', 'needs_attention')
  AND NOT (r.status IN ('running', 'cancelling') AND r.lease_expires_at IS NOT NULL
           AND r.lease_expires_at >= ?)
ORDER BY e.created_at LIMIT ?;

-- name: get_effect
SELECT * FROM effects WHERE effect_id = ?;

-- name: get_operation
SELECT * FROM operations WHERE tenant = ? AND logical_operation_id = ?;

-- name: get_decision
SELECT * FROM decisions WHERE tenant = ? AND decision_id = ?;

-- name: get_approval
SELECT * FROM approvals WHERE tenant = ? AND approval_id = ?;

-- name: approvals_of_run
SELECT * FROM approvals WHERE run_id = ? ORDER BY approved_at;

-- name: approvals_of_step
SELECT * FROM approvals WHERE run_id = ? AND step_id = ? ORDER BY approved_at;

-- name: audit_of_run
SELECT * FROM audit WHERE run_id = ? ORDER BY seq;

-- ---------------------------------------------------------------------------------------------
-- Migrations
-- ---------------------------------------------------------------------------------------------

-- name: create_migrations_table
CREATE TABLE IF NOT EXISTS schema_migrations
    (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL);

-- name: applied_migrations
SELECT version FROM schema_migrations;

-- name: record_migration
INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, strftime('%s', 'now'));

-- name: schema_version
SELECT max(version) FROM schema_migrations;

-- name: file_tables (sqlite only)
-- The tables of a file about to be opened: one of another application is refused untouched
-- (read through sqlite_master only, so the file is not changed, not even switched to WAL).
SELECT name FROM sqlite_master WHERE type = 'table';

-- name: legacy_approval_waits
-- Migration 9: the steps that wait for an approval in the form before version 9 (error_json is
-- the canonical print: sorted keys, no spaces).
SELECT * FROM steps WHERE status = 'pending' AND error_json LIKE '%"code":"approval_required"%';

-- name: keyed_seal
-- Whether the ledger's seals are keyed (audit.KEYED + '%' is the parameter).
SELECT 1 FROM seals WHERE hash LIKE ? LIMIT 1;

-- ---------------------------------------------------------------------------------------------
-- Verification's reads (ledger/audit/): read-only, inside the store's audit_snapshot
-- ---------------------------------------------------------------------------------------------

-- name: migration_applied_at
-- When a migration ran: a run older than version 7 (or 8) is excused its missing seals (shards).
SELECT applied_at FROM schema_migrations WHERE version = ?;

-- name: run_heads
-- Every run's two chain heads, in run id order (audit.materials, the run-by-run reference).
SELECT run_id, audit_head, audit_count, seal_head, seal_count FROM runs ORDER BY run_id;

-- name: run_head
-- One run's chain heads (audit.materials for one run).
SELECT run_id, audit_head, audit_count, seal_head, seal_count FROM runs WHERE run_id = ?;

-- name: operations_of_run
-- A run's operation bindings, for their seals (no order: they fill a dict by binding).
SELECT * FROM operations WHERE run_id = ?;

-- name: decisions_of_effect
-- The decisions about one effect, for their seals (decisions carry no run id).
SELECT * FROM decisions WHERE effect_id = ?;

-- name: seals_of_run
-- A run's seals in their chain's order.
SELECT * FROM seals WHERE run_id = ? ORDER BY n;

-- name: purge_records
-- Every purge record: what excuses a sealed binding that is gone.
SELECT * FROM purged_keys;

-- name: shard_rows
-- Every shard's recorded length and head, the index row's too: what the replayed chains must
-- reach.
SELECT shard, n, head FROM audit_shards;

-- name: chained_seals
-- Every seal that has a place in a shard's chain, in chain order: one sorted scan (streamed).
SELECT shard, shard_seq, run_id, n, hash FROM seals WHERE shard IS NOT NULL
ORDER BY shard, shard_seq;

-- name: chained_seals_of_shard
-- One shard's chained seals in order (verify --run replays the run's own shard).
SELECT shard, shard_seq, run_id, n, hash FROM seals WHERE shard IS NOT NULL AND shard = ?
ORDER BY shard, shard_seq;

-- name: exported_shard_heads
-- Every shard's head for an exported head; the index row (audit.INDEX, the parameter) left out.
SELECT shard, n, head FROM audit_shards WHERE shard < ? ORDER BY shard;

-- name: orphan_runs
-- The run ids a table ({table}: each table with a run_id) has rows of and runs does not: what is
-- left of a deleted run, or planted for one that never was.
SELECT DISTINCT run_id FROM {table} WHERE run_id NOT IN (SELECT run_id FROM runs) ORDER BY run_id;

-- name: orphan_decisions
-- Decisions about effects the ledger does not hold.
SELECT DISTINCT decision_id, effect_id FROM decisions
WHERE effect_id NOT IN (SELECT effect_id FROM effects) ORDER BY decision_id;

-- ---------------------------------------------------------------------------------------------
-- Verification's batched reads (ledger/audit_read.py): a chunk of runs at a time, each table once
-- a chunk (first and last run id: the run id indexes answer BETWEEN). Each orders a run's rows as
-- the reader of one run above does, after the run id.
-- ---------------------------------------------------------------------------------------------

-- name: chunk_first_runs
-- The first chunk's runs rows, through the primary key in order (LIMIT: the chunk's size).
SELECT * FROM runs ORDER BY run_id LIMIT ?;

-- name: chunk_next_runs
-- The next chunk's, after the last run id of the previous one.
SELECT * FROM runs WHERE run_id > ? ORDER BY run_id LIMIT ?;

-- name: chunk_steps
SELECT * FROM steps WHERE run_id BETWEEN ? AND ? ORDER BY run_id, seq;

-- name: chunk_effects
-- Ordered as list_effects orders one run's.
SELECT * FROM effects WHERE run_id BETWEEN ? AND ? ORDER BY run_id, created_at;

-- name: chunk_attempts
-- Ordered as attempts_of_run.
SELECT * FROM attempts WHERE run_id BETWEEN ? AND ? ORDER BY run_id, started_at, number;

-- name: chunk_approvals
-- Ordered as approvals_of_run.
SELECT * FROM approvals WHERE run_id BETWEEN ? AND ? ORDER BY run_id, approved_at;

-- name: chunk_operations
-- No order: operations_of_run has none either (no index).
SELECT * FROM operations WHERE run_id BETWEEN ? AND ?;

-- name: chunk_decisions
-- A decision belongs to its effect's run: read through the chunk's effects, in their order.
SELECT e.run_id AS effect_run_id, d.* FROM decisions d JOIN effects e ON e.effect_id = d.effect_id
WHERE e.run_id BETWEEN ? AND ? ORDER BY e.run_id, e.created_at;

-- name: chunk_seals
-- In each run's chain order.
SELECT * FROM seals WHERE run_id BETWEEN ? AND ? ORDER BY run_id, n;

-- name: chunk_audit
-- In each run's chain order.
SELECT * FROM audit WHERE run_id BETWEEN ? AND ? ORDER BY run_id, seq;

-- ---------------------------------------------------------------------------------------------
-- The published schema (ledger/schema.py): the catalog, read from a file opened read-only
-- ---------------------------------------------------------------------------------------------

-- name: catalog_tables (sqlite only)
-- The ledger's tables by name, SQLite's own left out.
SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name;

-- name: catalog_table_sql (sqlite only)
-- A table's CREATE statement (whether it is WITHOUT ROWID shows only there).
SELECT sql FROM sqlite_master WHERE name = ?;

-- name: catalog_columns (sqlite only)
-- A table's columns ({table}: a name catalog_tables gave; PRAGMA takes no parameter).
PRAGMA table_info({table});

-- name: catalog_indexes_and_triggers (sqlite only)
-- Indexes and triggers with their statements (an automatic index has none: left out).
SELECT type, name, tbl_name, sql FROM sqlite_master
WHERE type IN ('index', 'trigger') AND sql IS NOT NULL ORDER BY type, name;

-- name: archivable_runs
-- Finished runs last written before the cut-off (`effectflow archive --before`): a terminal
-- status, no effect in doubt and no step waiting for a person, for a completion or for its
-- outcome (such a run is settled by someone later, so its rows must stay).
SELECT run_id, tenant, audit_head, audit_count, seal_head, seal_count FROM runs r
WHERE r.status IN ('succeeded', 'failed', 'cancelled', 'cancelled_with_effects', 'compensated')
  AND r.updated_at < ?
  AND NOT EXISTS (
      SELECT 1 FROM effects e
      WHERE e.run_id = r.run_id
        AND e.status IN ('intent_recorded', 'unknown', 'needs_attention', 'awaiting_completion'))
  AND NOT EXISTS (
      SELECT 1 FROM steps s
      WHERE s.run_id = r.run_id
        AND s.status IN ('intent_recorded', 'unknown', 'needs_attention', 'awaiting_approval',
                         'awaiting_completion'))
ORDER BY r.run_id;

-- name: purge_records_of_run
-- An archived run's purge records travel with it into the archive file.
SELECT * FROM purged_keys WHERE run_id = ?;

-- name: insert_archived_run
-- The hashed (keyed) record that says why a run and its seals are gone (`effectflow archive`).
INSERT INTO archived_runs (run_id, tenant, archived_at, audit_count, audit_head, seal_count,
                           seal_head, hash)
VALUES (?, ?, ?, ?, ?, ?, ?, ?);

-- name: keep_archived_seal_links
-- Each archived seal's link in its shard's chain, so verify replays the chain across the gap.
INSERT INTO archived_seals (run_id, n, shard, shard_seq, hash)
SELECT run_id, n, shard, shard_seq, hash FROM seals WHERE run_id = ?;

-- name: delete_archived_decisions
-- A person's decisions about an archived run's effects go with the run.
DELETE FROM decisions WHERE effect_id IN (SELECT effect_id FROM effects WHERE run_id = ?);

-- name: delete_archived_rows
-- One table's rows of an archived run ({table}: one of the run's tables, in an order the foreign
-- keys allow; audit and seals last, which their triggers allow only once the run row is gone).
DELETE FROM {table} WHERE run_id = ?;

-- name: archived_run_records
-- Every archive record: what excuses a run, and its seals, that are gone.
SELECT run_id, tenant, archived_at, audit_count, audit_head, seal_count, seal_head, hash
FROM archived_runs ORDER BY run_id;

-- name: archived_seal_links
-- Every archived seal, by run in chain order: checked against its run's archive record.
SELECT run_id, n, shard, shard_seq, hash FROM archived_seals ORDER BY run_id, n;

-- name: archived_chained_seals
-- The links archived seals kept in their shards' chains, in chain order (merged with the seals'
-- own stream when verify replays the shards).
SELECT shard, shard_seq, run_id, n, hash FROM archived_seals WHERE shard IS NOT NULL
ORDER BY shard, shard_seq;

-- name: archived_chained_seals_of_shard
-- One shard's archived links in order (verify --run replays the run's own shard).
SELECT shard, shard_seq, run_id, n, hash FROM archived_seals WHERE shard IS NOT NULL AND shard = ?
ORDER BY shard, shard_seq;
