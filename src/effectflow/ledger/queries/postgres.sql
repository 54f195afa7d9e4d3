-- The PostgreSQL ledger's statements (see ledger/queries.py for the format).
-- Placeholders are %s (psycopg). Run statuses a worker executes: 'running', 'cancelling'. Step statuses whose
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
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, 0)
ON CONFLICT (run_id) DO NOTHING
RETURNING audit_head, audit_count, seal_head, seal_count, control_json, status, output_json,
          error_json, next_action, generation, workflow_version, workflow_code;

-- name: fence_run
-- A fenced batch: its lease token must still be current. The UPDATE locks the run's row until the
-- COMMIT and extends the lease, never back (a NULL leaves it as it is: ``Batch.renews_lease``); no
-- row means the lease was lost.
UPDATE runs SET lease_expires_at = GREATEST(lease_expires_at, %s)
WHERE run_id = %s AND lease_token = %s
RETURNING audit_head, audit_count, seal_head, seal_count, control_json, status, output_json,
          error_json, next_action, generation, workflow_version, workflow_code;

-- name: lock_run
-- An unfenced batch (a person's decision, a cancel) locks its run's row and reads its head: every
-- other writer of the run waits, so the audit head it extends cannot move under it.
SELECT audit_head, audit_count, seal_head, seal_count, control_json, status, output_json,
       error_json, next_action, generation, workflow_version, workflow_code
FROM runs WHERE run_id = %s FOR UPDATE;

-- name: update_run
-- The run columns a batch changes ({assignments}: "column = %s" each).
UPDATE runs SET {assignments} WHERE run_id = %s;

-- name: expect_run
-- What a decision was made on, read under the run's lock (ledger/expect.py).
SELECT * FROM runs WHERE run_id = %s;

-- name: expect_step
SELECT * FROM steps WHERE run_id = %s AND step_id = %s;

-- name: expect_effect
SELECT * FROM effects WHERE run_id = %s AND effect_id = %s;

-- name: expect_unapproved
SELECT approval_id FROM approvals WHERE run_id = %s AND step_id = %s AND request_digest = %s LIMIT 1;

-- name: insert_decision
-- A decision id taken already (by a concurrent decision too) inserts nothing and returns no row:
-- IdempotencyConflict, never the driver's unique violation.
INSERT INTO decisions (decision_id, tenant, params_digest, effect_id, decided_at)
VALUES (%s, %s, %s, %s, %s)
ON CONFLICT DO NOTHING RETURNING decision_id;

-- name: insert_approval
INSERT INTO approvals (approval_id, tenant, run_id, step_id, request_digest, approver, note,
                       approved_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT DO NOTHING RETURNING approval_id;

-- name: bind_operation
-- A logical operation bound to its request and step, once. ON CONFLICT without a target also
-- covers the key's own uniqueness. RETURNING, not rowcount: in the pipeline only a fetched
-- result is known.
INSERT INTO operations (tenant, logical_operation_id, idempotency_key, request_digest, tool, run_id,
                        step_id, created_at, key_expires_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
ON CONFLICT DO NOTHING RETURNING tenant;

-- name: operation_bound
-- Who holds an operation another batch tried to bind.
SELECT request_digest, run_id, step_id FROM operations
WHERE tenant = %s AND logical_operation_id = %s;

-- name: upsert_step
INSERT INTO steps (run_id, step_id, seq, step_revision, tool, effect_class, logical_operation_id,
                   idempotency_key, request_digest, status, completion_state, external_system,
                   external_effect_id, output_json, error_json, effect_id, confirmed_at, next_step,
                   compensation_status, next_action, created_at, updated_at, required_state,
                   compensates, approval_id, arguments_json)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
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
-- run_id, step_id and number never change after the insert: left out of the SET list, as on
-- SQLite (where it spares index writes).
INSERT INTO attempts (attempt_id, run_id, step_id, number, kind, generation, started_at, ended_at,
                      outcome, error_json, response_digest)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
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
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
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
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s);

-- ---------------------------------------------------------------------------------------------
-- Seals and shard chains (ledger/audit.py), last in a sealing transaction
-- ---------------------------------------------------------------------------------------------

-- name: insert_seal
INSERT INTO seals (run_id, n, rows_json, audit_head, audit_count, at, prev_hash, hash, shard,
                   shard_seq)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s);

-- name: read_shards
-- The heads of the shards a transaction seals into (an array), locked in shard order (the rows
-- are locked as the sort yields them), last in the transaction: a transaction holding a shard
-- waits for nothing but its COMMIT, so shards never deadlock with run rows or each other.
SELECT shard, n, head FROM audit_shards WHERE shard = ANY(%s) ORDER BY shard FOR UPDATE;

-- name: lock_index (postgres only)
-- The index row (audit.INDEX) last, after a transaction's shards: it serializes first uses of a
-- shard, and each then reads the others' committed ones.
SELECT n FROM audit_shards WHERE shard = %s FOR UPDATE;

-- name: update_shard
UPDATE audit_shards SET n = %s, head = %s WHERE shard = %s;

-- name: used_shards
-- The shards that hold seals, for the index row (audit.INDEX is the parameter).
SELECT shard FROM audit_shards WHERE n > 0 AND shard <> %s;

-- ---------------------------------------------------------------------------------------------
-- Leases and claims
-- ---------------------------------------------------------------------------------------------

-- name: claim_runnable
-- Lease the oldest runnable runs: running or cancelling, with no live lease or one held by a
-- dead owner ({or_dead}: "OR lease_owner = ANY(%(dead)s::text[])" when there are dead owners).
-- Rows another claimer is taking are skipped, never waited for. Each comes back with the owner
-- whose lease was taken over (previous_owner; NULL for a run nobody held). Named parameters: the
-- code is both dialects'.
WITH picked AS (
    SELECT run_id, lease_owner AS previous_owner FROM runs
    WHERE status IN ('running', 'cancelling')
      AND (lease_expires_at IS NULL OR lease_expires_at < %(now)s{or_dead})
    ORDER BY created_at, insert_seq LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED)
UPDATE runs SET lease_owner = %(owner)s, lease_token = runs.lease_token + 1,
    lease_expires_at = %(expires)s
FROM picked WHERE runs.run_id = picked.run_id
RETURNING runs.*, picked.previous_owner;

-- name: claim
-- Take one run's lease by compare-and-swap on its token.
UPDATE runs SET lease_owner = %s, lease_token = lease_token + 1, lease_expires_at = %s
WHERE run_id = %s AND lease_token = %s
RETURNING *;

-- name: heartbeat
-- Extend every held lease in one statement (run ids and tokens as two arrays); a lease missing
-- from the answer was lost. Rows are locked in run-id order, as group commits lock them, so a
-- worker's heartbeat and its own commits never deadlock. A lease only moves forward (a beat that
-- read its clock before a write renewed the lease must not move it back under a deadline given
-- meanwhile), and a run that let its lease go (ended, or released: no owner) is not held: a late
-- beat must not give it an expiry back.
WITH held AS (
    SELECT runs.run_id FROM runs
    JOIN unnest(%s::text[], %s::bigint[]) AS lease (run_id, token)
      ON runs.run_id = lease.run_id AND runs.lease_token = lease.token
    WHERE runs.lease_owner IS NOT NULL
    ORDER BY runs.run_id COLLATE "C"
    FOR UPDATE OF runs)
UPDATE runs SET lease_expires_at = GREATEST(runs.lease_expires_at, %s) FROM held
WHERE runs.run_id = held.run_id
RETURNING runs.run_id, runs.lease_token;

-- name: release
-- Give the lease up; a run still to execute is announced to waiting workers.
WITH released AS (
    UPDATE runs SET lease_owner = NULL, lease_expires_at = NULL
    WHERE run_id = %(run_id)s AND lease_token = %(token)s
    RETURNING run_id, status)
SELECT pg_notify(%(channel)s, run_id) FROM released WHERE status IN ('running', 'cancelling');

-- name: notify_runnable (postgres only)
-- A run created for workers, or handed back to them, wakes the ones waiting (LISTEN on the
-- channel, the first parameter).
SELECT pg_notify(%s, run_id) FROM runs
WHERE run_id = %s AND status IN ('running', 'cancelling') AND lease_owner IS NULL;

-- name: apply_batch (postgres only)
-- A whole batch in one statement, its own transaction: the function each pooled connection
-- creates (queries/postgres_apply.sql; its arguments are PostgresStore._one_trip_params'). NULL:
-- written and committed; else what it found instead of the head the batch was composed on, or
-- why it refused (nothing written). Each pooled connection prepares it once, under its own name
-- (postgres.APPLY_STATEMENT), with libpq's $n placeholders: a batch sends the name and its
-- arguments' text, and neither psycopg nor the server reads the statement again.
SELECT pg_temp.effectflow_apply($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15,
                                $16, $17);

-- name: async_commit (postgres only)
-- A deferrable batch under durability=intents: PostgreSQL's WAL is one sequence, so the next
-- synchronous commit's flush makes this one durable too.
SET LOCAL synchronous_commit TO off;

-- name: purge_expired_keys
-- Bindings past retention whose step is settled: a step whose outcome is not known, or that may
-- still be retried or completed under its key, keeps its binding.
DELETE FROM operations
WHERE key_expires_at < %s
  AND NOT EXISTS (
      SELECT 1 FROM steps s
      WHERE s.run_id = operations.run_id AND s.step_id = operations.step_id
        AND s.status IN ('intent_recorded', 'unknown', 'needs_attention', 'not_committed',
                         'awaiting_completion'))
RETURNING tenant, logical_operation_id, run_id, key_expires_at;

-- name: insert_purge_record
-- The hashed record a purge leaves, which verify accepts as why a sealed binding is gone.
INSERT INTO purged_keys (tenant, logical_operation_id, run_id, key_expires_at, purged_at, hash)
VALUES (%s, %s, %s, %s, %s, %s);

-- name: checkpoint_outcome
-- A local transaction's checkpoint: its attempt's outcome, once the transaction is over.
SELECT outcome FROM attempts WHERE run_id = %s AND attempt_id = %s;

-- name: settle_lock_timeout (postgres only)
-- How long settling a lost COMMIT waits for the run's row lock (milliseconds, as text).
SELECT set_config('lock_timeout', %s, true);

-- name: settle_lock_run (postgres only)
-- The checkpoint's fence updated the run's row: its lock is held until that transaction ends, so
-- once it is ours no COMMIT of it can still arrive.
SELECT 1 FROM runs WHERE run_id = %s FOR UPDATE;

-- ---------------------------------------------------------------------------------------------
-- Reads (ledger/sql_core.py SQLReads). Rows created at the same moment are ordered by their
-- insertion (insert_seq).
-- ---------------------------------------------------------------------------------------------

-- name: get_run
SELECT * FROM runs WHERE run_id = %s;

-- name: list_runs
-- Newest first ({where}: the listing's filters).
SELECT * FROM runs WHERE {where} ORDER BY created_at DESC, insert_seq DESC LIMIT %s;

-- name: runs_to_recover
-- Running runs with no live lease.
SELECT * FROM runs
WHERE status IN ('running', 'cancelling') AND (lease_expires_at IS NULL OR lease_expires_at < %s)
ORDER BY created_at, insert_seq LIMIT %s;

-- name: leased_running_runs
-- Running runs that still hold a lease (the runtime checks whether the holder lives).
SELECT * FROM runs
WHERE status IN ('running', 'cancelling') AND lease_expires_at IS NOT NULL
ORDER BY created_at, insert_seq LIMIT %s;

-- name: lease_owners
SELECT DISTINCT lease_owner FROM runs
WHERE status IN ('running', 'cancelling') AND lease_expires_at >= %s;

-- name: steps_of_run
SELECT * FROM steps WHERE run_id = %s ORDER BY seq;

-- name: attempts_of_run
SELECT * FROM attempts WHERE run_id = %s ORDER BY started_at, number, insert_seq;

-- name: attempts_of_step
SELECT * FROM attempts WHERE run_id = %s AND step_id = %s ORDER BY number, insert_seq;

-- name: list_effects
-- Oldest first ({where}: the listing's filters).
SELECT * FROM effects WHERE {where} ORDER BY created_at, insert_seq LIMIT %s;

-- name: effects_in_doubt
-- Effects whose outcome is not known and that no unexpired lease covers ({where}: the tenant's
-- term, "e.tenant = %s AND", or nothing).
SELECT e.* FROM effects e JOIN runs r ON r.run_id = e.run_id
WHERE {where}e.status IN ('intent_recorded', 'unknown', 'needs_attention')
  AND NOT (r.status IN ('running', 'cancelling') AND r.lease_expires_at IS NOT NULL
           AND r.lease_expires_at >= %s)
ORDER BY e.created_at, e.insert_seq LIMIT %s;

-- name: get_effect
SELECT * FROM effects WHERE effect_id = %s;

-- name: get_operation
SELECT * FROM operations WHERE tenant = %s AND logical_operation_id = %s;

-- name: get_decision
SELECT * FROM decisions WHERE tenant = %s AND decision_id = %s;

-- name: get_approval
SELECT * FROM approvals WHERE tenant = %s AND approval_id = %s;

-- name: approvals_of_run
SELECT * FROM approvals WHERE run_id = %s ORDER BY approved_at, insert_seq;

-- name: approvals_of_step
SELECT * FROM approvals WHERE run_id = %s AND step_id = %s ORDER BY approved_at, insert_seq;

-- name: audit_of_run
SELECT * FROM audit WHERE run_id = %s ORDER BY seq;

-- ---------------------------------------------------------------------------------------------
-- Migrations
-- ---------------------------------------------------------------------------------------------

-- name: migration_lock (postgres only)
-- Migrations run under an advisory lock, so processes starting at once apply each one once.
SELECT pg_advisory_xact_lock(%s);

-- name: create_migrations_table
CREATE TABLE IF NOT EXISTS schema_migrations
    (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL);

-- name: applied_migrations
SELECT version FROM schema_migrations;

-- name: record_migration
INSERT INTO schema_migrations (version, name, applied_at)
VALUES (%s, %s, extract(epoch FROM clock_timestamp()));

-- name: schema_version
SELECT max(version) FROM schema_migrations;

-- name: legacy_approval_waits
-- Migration 9: the steps that wait for an approval in the form before version 9 (error_json is
-- the canonical print: sorted keys, no spaces).
SELECT * FROM steps WHERE status = 'pending' AND error_json LIKE '%%"code":"approval_required"%%';

-- name: keyed_seal
-- Whether the ledger's seals are keyed (audit.KEYED + '%' is the parameter).
SELECT 1 FROM seals WHERE hash LIKE %s LIMIT 1;

-- ---------------------------------------------------------------------------------------------
-- Verification's reads (ledger/audit/): read-only, inside the store's audit_snapshot
-- ---------------------------------------------------------------------------------------------

-- name: migration_applied_at
-- When a migration ran: a run older than version 7 (or 8) is excused its missing seals (shards).
SELECT applied_at FROM schema_migrations WHERE version = %s;

-- name: run_heads
-- Every run's two chain heads, in run id order (audit.materials, the run-by-run reference).
SELECT run_id, audit_head, audit_count, seal_head, seal_count FROM runs ORDER BY run_id;

-- name: run_head
-- One run's chain heads (audit.materials for one run).
SELECT run_id, audit_head, audit_count, seal_head, seal_count FROM runs WHERE run_id = %s;

-- name: operations_of_run
-- A run's operation bindings, for their seals (no order: they fill a dict by binding).
SELECT * FROM operations WHERE run_id = %s;

-- name: decisions_of_effect
-- The decisions about one effect, for their seals (decisions carry no run id).
SELECT * FROM decisions WHERE effect_id = %s;

-- name: seals_of_run
-- A run's seals in their chain's order.
SELECT * FROM seals WHERE run_id = %s ORDER BY n;

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
SELECT shard, shard_seq, run_id, n, hash FROM seals WHERE shard IS NOT NULL AND shard = %s
ORDER BY shard, shard_seq;

-- name: exported_shard_heads
-- Every shard's head for an exported head; the index row (audit.INDEX, the parameter) left out.
SELECT shard, n, head FROM audit_shards WHERE shard < %s ORDER BY shard;

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
SELECT * FROM runs ORDER BY run_id LIMIT %s;

-- name: chunk_next_runs
-- The next chunk's, after the last run id of the previous one.
SELECT * FROM runs WHERE run_id > %s ORDER BY run_id LIMIT %s;

-- name: chunk_steps
SELECT * FROM steps WHERE run_id BETWEEN %s AND %s ORDER BY run_id, seq;

-- name: chunk_effects
-- Ordered as list_effects orders one run's.
SELECT * FROM effects WHERE run_id BETWEEN %s AND %s ORDER BY run_id, created_at, insert_seq;

-- name: chunk_attempts
-- Ordered as attempts_of_run.
SELECT * FROM attempts WHERE run_id BETWEEN %s AND %s
ORDER BY run_id, started_at, number, insert_seq;

-- name: chunk_approvals
-- Ordered as approvals_of_run.
SELECT * FROM approvals WHERE run_id BETWEEN %s AND %s ORDER BY run_id, approved_at, insert_seq;

-- name: chunk_operations
-- No order: operations_of_run has none either (no index).
SELECT * FROM operations WHERE run_id BETWEEN %s AND %s;

-- name: chunk_decisions
-- A decision belongs to its effect's run: read through the chunk's effects, in their order.
SELECT e.run_id AS effect_run_id, d.* FROM decisions d JOIN effects e ON e.effect_id = d.effect_id
WHERE e.run_id BETWEEN %s AND %s ORDER BY e.run_id, e.created_at, e.insert_seq;

-- name: chunk_seals
-- In each run's chain order.
SELECT * FROM seals WHERE run_id BETWEEN %s AND %s ORDER BY run_id, n;

-- name: chunk_audit
-- In each run's chain order.
SELECT * FROM audit WHERE run_id BETWEEN %s AND %s ORDER BY run_id, seq;

-- ---------------------------------------------------------------------------------------------
-- The published schema (ledger/schema.py): the catalog of the store's own schema
-- ---------------------------------------------------------------------------------------------

-- name: catalog_schema_tables (postgres only)
-- The ledger's tables (views left out), in the store's schema.
SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()
AND table_type = 'BASE TABLE' ORDER BY table_name;

-- name: catalog_schema_columns (postgres only)
-- A table's columns in their order.
SELECT column_name, data_type, is_nullable, column_default, is_identity
FROM information_schema.columns WHERE table_schema = current_schema()
AND table_name = %s ORDER BY ordinal_position;

-- name: catalog_indexes (postgres only)
SELECT indexname, tablename, indexdef FROM pg_indexes WHERE schemaname = current_schema()
ORDER BY indexname;

-- name: catalog_triggers (postgres only)
-- A trigger on several events has a row per event: one line each, in a stable order.
SELECT DISTINCT trigger_name, event_object_table, action_timing, event_manipulation
FROM information_schema.triggers WHERE trigger_schema = current_schema()
ORDER BY trigger_name, event_manipulation;

-- name: archivable_runs
-- Finished runs last written before the cut-off (`effectflow archive --before`): a terminal
-- status, no effect in doubt and no step waiting for a person, for a completion or for its
-- outcome (such a run is settled by someone later, so its rows must stay).
SELECT run_id, tenant, audit_head, audit_count, seal_head, seal_count FROM runs r
WHERE r.status IN ('succeeded', 'failed', 'cancelled', 'cancelled_with_effects', 'compensated')
  AND r.updated_at < %s
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
SELECT * FROM purged_keys WHERE run_id = %s;

-- name: insert_archived_run
-- The hashed (keyed) record that says why a run and its seals are gone (`effectflow archive`).
INSERT INTO archived_runs (run_id, tenant, archived_at, audit_count, audit_head, seal_count,
                           seal_head, hash)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s);

-- name: keep_archived_seal_links
-- Each archived seal's link in its shard's chain, so verify replays the chain across the gap.
INSERT INTO archived_seals (run_id, n, shard, shard_seq, hash)
SELECT run_id, n, shard, shard_seq, hash FROM seals WHERE run_id = %s;

-- name: delete_archived_decisions
-- A person's decisions about an archived run's effects go with the run.
DELETE FROM decisions WHERE effect_id IN (SELECT effect_id FROM effects WHERE run_id = %s);

-- name: delete_archived_rows
-- One table's rows of an archived run ({table}: one of the run's tables, in an order the foreign
-- keys allow; audit and seals last, which their triggers allow only once the run row is gone).
DELETE FROM {table} WHERE run_id = %s;

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
SELECT shard, shard_seq, run_id, n, hash FROM archived_seals WHERE shard IS NOT NULL AND shard = %s
ORDER BY shard, shard_seq;

-- name: has_migrations_table (postgres only)
-- Whether this database holds an effectflow ledger yet (effectflow migrate --check reads it
-- without opening the store, which would migrate).
SELECT to_regclass('schema_migrations') IS NOT NULL;
