-- The PostgreSQL ledger's batch in one round trip: a function each pooled connection creates in its
-- own temporary schema (ledger/postgres.py, PostgresStore._apply_one_trip), so it is always the
-- running effectflow's and no migration ties a ledger to it. One call is one statement in a
-- transaction of its own (the pool's connections are in autocommit): it commits when the function
-- returns, and a raise rolls back all it wrote.
--
-- A batch is composed in the client on the run's head it expects (and its shard's head): its
-- audit events chained, its seal hashed, with the operator's key, which never leaves the process.
-- The function locks the run's row and compares: a lease token that is no longer current, or a
-- head or shard head that moved, returns before anything is written (the client applies the batch
-- statement by statement, which raises LeaseLost, or composes again on the head returned). Once it writes, every refusal raises (SQLSTATE EF409,
-- EF412), so the transaction writes nothing and the client applies the batch statement by
-- statement instead, which says what was refused as it always has.
--
-- The @<query>(<argument>) marks are the named queries of postgres.sql, their VALUES read from the
-- batch's JSON rows (json_populate_recordset, so each column keeps its own type): the rows are
-- written by the same statements either way.
CREATE OR REPLACE FUNCTION pg_temp.effectflow_apply(
    p_run_id text,
    p_token bigint,
    p_expect json,
    p_new_run json,
    p_operations json,
    p_steps json,
    p_effects json,
    p_attempts json,
    p_audit json,
    p_changes json,
    p_seal json,
    p_shard integer,
    p_shard_n integer,
    p_shard_head text,
    p_shard_new_head text,
    p_channel text,
    p_async_commit boolean
) RETURNS json LANGUAGE plpgsql AS $fn$
DECLARE
    h record;
    found_head json;
    wrote bigint;
BEGIN
    -- Nothing to compose on yet (the client knows neither the run's head nor its shard's): both
    -- heads as they are, unlocked, and nothing written.
    IF p_expect IS NULL OR (p_seal IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM audit_shards
        WHERE shard = p_shard AND n = p_shard_n AND head = p_shard_head)) THEN
        RETURN json_build_object(
            'moved', (SELECT json_build_object(
                'audit_head', audit_head, 'audit_count', audit_count, 'seal_head', seal_head,
                'seal_count', seal_count, 'control_json', control_json, 'status', status,
                'output_json', output_json, 'error_json', error_json,
                'next_action', next_action, 'generation', generation,
                'workflow_version', workflow_version, 'workflow_code', workflow_code)
                FROM runs WHERE run_id = p_run_id),
            'shard', (SELECT json_build_array(n, head) FROM audit_shards WHERE shard = p_shard));
    END IF;
    IF p_new_run IS NOT NULL THEN
        @insert_run(p_new_run)
        IF NOT FOUND THEN
            RETURN json_build_object('refused', 'run_taken');
        END IF;
    END IF;
    -- The run's row, locked as the fence's UPDATE locks it: every other writer of the run waits.
    SELECT audit_head, audit_count, seal_head, seal_count, control_json, status, output_json,
           error_json, next_action, generation, workflow_version, workflow_code, lease_token
    INTO h FROM runs WHERE run_id = p_run_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN json_build_object('refused', 'run_not_found');
    END IF;
    IF p_token IS NOT NULL AND h.lease_token <> p_token THEN
        IF p_new_run IS NOT NULL THEN
            RAISE EXCEPTION 'effectflow: run % was inserted with another lease token', p_run_id
                USING ERRCODE = 'EF409';
        END IF;
        RETURN json_build_object('refused', 'lease_lost');
    END IF;
    found_head := json_build_object(
        'audit_head', h.audit_head, 'audit_count', h.audit_count, 'seal_head', h.seal_head,
        'seal_count', h.seal_count, 'control_json', h.control_json, 'status', h.status,
        'output_json', h.output_json, 'error_json', h.error_json, 'next_action', h.next_action,
        'generation', h.generation, 'workflow_version', h.workflow_version,
        'workflow_code', h.workflow_code);
    -- The head the batch was composed on, under the row's lock. (The shard's was read above
    -- without its lock: its UPDATE below compares again under it.)
    IF found_head::jsonb <> p_expect::jsonb THEN
        IF p_new_run IS NOT NULL THEN
            RAISE EXCEPTION 'effectflow: new run % is not as composed', p_run_id
                USING ERRCODE = 'EF409';
        END IF;
        RETURN json_build_object(
            'moved', found_head,
            'shard', (SELECT json_build_array(n, head) FROM audit_shards WHERE shard = p_shard));
    END IF;
    -- From here on the batch writes: a refusal raises, so the transaction writes nothing.
    IF p_async_commit THEN
        -- A deferrable batch under durability=intents (postgres.sql's async_commit).
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    IF p_operations IS NOT NULL THEN
        @bind_operation(p_operations)
        GET DIAGNOSTICS wrote = ROW_COUNT;
        IF wrote <> json_array_length(p_operations) THEN
            RAISE EXCEPTION 'effectflow: run %: an operation is bound already', p_run_id
                USING ERRCODE = 'EF409';
        END IF;
    END IF;
    IF p_steps IS NOT NULL THEN
        @upsert_step(p_steps)
    END IF;
    IF p_effects IS NOT NULL THEN
        @upsert_effect(p_effects)
    END IF;
    IF p_attempts IS NOT NULL THEN
        @upsert_attempt(p_attempts)
    END IF;
    IF p_audit IS NOT NULL THEN
        @insert_audit(p_audit)
    END IF;
    -- The run's one UPDATE: the lease's extension (lease_renewed_to: forward only, as a heartbeat
    -- may have moved it further already) and the batch's changes (over the row as it is, so a
    -- column the batch does not set keeps its value).
    IF p_changes IS NOT NULL THEN
        UPDATE runs AS r SET (tenant, workflow, workflow_version, input_json, input_digest, status,
                              output_json, error_json, next_action, generation, created_at,
                              updated_at, lease_owner, lease_token, lease_expires_at, audit_head,
                              audit_count, control_json, workflow_code, scope, call_id, seal_head,
                              seal_count) =
            (SELECT c.tenant, c.workflow, c.workflow_version, c.input_json, c.input_digest,
                    c.status, c.output_json, c.error_json, c.next_action, c.generation,
                    c.created_at, c.updated_at, c.lease_owner, c.lease_token,
                    CASE WHEN p_changes->>'lease_renewed_to' IS NULL THEN c.lease_expires_at
                         ELSE GREATEST(r.lease_expires_at,
                                       (p_changes->>'lease_renewed_to')::double precision)
                    END,
                    c.audit_head, c.audit_count, c.control_json, c.workflow_code, c.scope,
                    c.call_id, c.seal_head, c.seal_count
             FROM json_populate_record(r, p_changes) AS c)
        WHERE r.run_id = p_run_id;
    END IF;
    IF p_channel IS NOT NULL THEN
        PERFORM pg_notify(p_channel, run_id) FROM runs
        WHERE run_id = p_run_id AND status IN ('running', 'cancelling') AND lease_owner IS NULL;
    END IF;
    -- The seal and its shard last: a transaction holding a shard waits for nothing but its COMMIT.
    IF p_seal IS NOT NULL THEN
        @insert_seal(p_seal)
        UPDATE audit_shards SET n = p_shard_n + 1, head = p_shard_new_head
        WHERE shard = p_shard AND n = p_shard_n AND head = p_shard_head;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'effectflow: shard % moved', p_shard USING ERRCODE = 'EF412';
        END IF;
    END IF;
    RETURN NULL;
END
$fn$
