-- effectflow ledger, version 1 (PostgreSQL). Times are epoch seconds (DOUBLE PRECISION, as SQLite's
-- REAL, so records read back identical); input/output/error/evidence are jsonb. The audit detail is
-- TEXT: exactly the canonical JSON that was hashed, so verification recomputes the same hashes.
--
-- insert_seq columns stand in for SQLite's rowid: the tiebreak of rows with equal times, so lists are
-- in insertion order on both backends.

CREATE TABLE runs (
    run_id           TEXT PRIMARY KEY,
    tenant           TEXT NOT NULL,
    workflow         TEXT NOT NULL,
    workflow_version TEXT NOT NULL,
    input_json       JSONB NOT NULL,
    input_digest     TEXT NOT NULL,
    status           TEXT NOT NULL,
    output_json      JSONB,
    error_json       JSONB,
    next_action      TEXT NOT NULL,
    generation       INTEGER NOT NULL DEFAULT 0,
    created_at       DOUBLE PRECISION NOT NULL,
    updated_at       DOUBLE PRECISION NOT NULL,
    lease_owner      TEXT,
    lease_token      BIGINT NOT NULL DEFAULT 0,
    lease_expires_at DOUBLE PRECISION,
    audit_head       TEXT NOT NULL,
    audit_count      BIGINT NOT NULL DEFAULT 0,
    insert_seq       BIGINT GENERATED ALWAYS AS IDENTITY
);
CREATE INDEX runs_by_tenant_status ON runs (tenant, status, created_at);
CREATE INDEX runs_by_status_lease ON runs (status, lease_expires_at);

CREATE TABLE steps (
    run_id               TEXT NOT NULL REFERENCES runs (run_id),
    step_id              TEXT NOT NULL,
    seq                  INTEGER NOT NULL,
    step_revision        INTEGER NOT NULL,
    tool                 TEXT NOT NULL,
    effect_class         TEXT NOT NULL,
    logical_operation_id TEXT,
    idempotency_key      TEXT,
    request_digest       TEXT NOT NULL,
    status               TEXT NOT NULL,
    completion_state     TEXT,
    external_system      TEXT,
    external_effect_id   TEXT,
    output_json          JSONB,
    error_json           JSONB,
    effect_id            TEXT,
    confirmed_at         DOUBLE PRECISION,
    next_step            TEXT,
    compensation_status  TEXT NOT NULL,
    next_action          TEXT NOT NULL,
    created_at           DOUBLE PRECISION NOT NULL,
    updated_at           DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (run_id, step_id)
);

CREATE TABLE attempts (
    attempt_id      TEXT PRIMARY KEY,
    run_id          TEXT NOT NULL,
    step_id         TEXT NOT NULL,
    number          INTEGER NOT NULL,
    kind            TEXT NOT NULL,
    generation      INTEGER NOT NULL,
    started_at      DOUBLE PRECISION NOT NULL,
    ended_at        DOUBLE PRECISION,
    outcome         TEXT,
    error_json      JSONB,
    response_digest TEXT,
    insert_seq      BIGINT GENERATED ALWAYS AS IDENTITY
);
CREATE INDEX attempts_by_step ON attempts (run_id, step_id, number);

CREATE TABLE effects (
    effect_id            TEXT PRIMARY KEY,
    tenant               TEXT NOT NULL,
    run_id               TEXT NOT NULL,
    step_id              TEXT NOT NULL,
    tool                 TEXT NOT NULL,
    tool_call_id         TEXT NOT NULL,
    logical_operation_id TEXT,
    idempotency_key      TEXT,
    request_digest       TEXT NOT NULL,
    response_digest      TEXT,
    status               TEXT NOT NULL,
    external_system      TEXT,
    external_effect_id   TEXT,
    committed_at         DOUBLE PRECISION,
    approval_id          TEXT,
    compensation_status  TEXT NOT NULL,
    compensates          TEXT,
    evidence_json        JSONB,
    resolved_by          TEXT,
    next_action          TEXT NOT NULL,
    version              INTEGER NOT NULL,
    created_at           DOUBLE PRECISION NOT NULL,
    updated_at           DOUBLE PRECISION NOT NULL,
    insert_seq           BIGINT GENERATED ALWAYS AS IDENTITY
);
CREATE INDEX effects_by_run ON effects (run_id, created_at, insert_seq);
CREATE INDEX effects_by_tenant_status ON effects (tenant, status, created_at);

-- A logical operation is bound to one request digest and one key, for as long as the key is kept.
CREATE TABLE operations (
    tenant               TEXT NOT NULL,
    logical_operation_id TEXT NOT NULL,
    idempotency_key      TEXT NOT NULL UNIQUE,
    request_digest       TEXT NOT NULL,
    tool                 TEXT NOT NULL,
    run_id               TEXT NOT NULL,
    step_id              TEXT NOT NULL,
    created_at           DOUBLE PRECISION NOT NULL,
    key_expires_at       DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (tenant, logical_operation_id)
);
CREATE INDEX operations_by_expiry ON operations (key_expires_at);

-- Decisions by people, pinned by the caller's decision id: a replay is a no-op, a change is refused.
CREATE TABLE decisions (
    decision_id   TEXT PRIMARY KEY,
    tenant        TEXT NOT NULL,
    params_digest TEXT NOT NULL,
    effect_id     TEXT NOT NULL,
    decided_at    DOUBLE PRECISION NOT NULL
);

-- Append-only; each run's events form a hash chain whose head is kept on the run's row. seq is
-- global order; a run's events are written under its row lock, so its own seqs only grow.
CREATE TABLE audit (
    seq         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id      TEXT NOT NULL,
    step_id     TEXT,
    effect_id   TEXT,
    kind        TEXT NOT NULL,
    actor       TEXT NOT NULL,
    detail_json TEXT NOT NULL,
    at          DOUBLE PRECISION NOT NULL,
    prev_hash   TEXT NOT NULL,
    hash        TEXT NOT NULL
);
CREATE INDEX audit_by_run ON audit (run_id, seq);

CREATE FUNCTION effectflow_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the audit log is append-only' USING ERRCODE = 'restrict_violation';
END
$$;
CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
    FOR EACH ROW EXECUTE FUNCTION effectflow_audit_append_only();
CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
    FOR EACH ROW EXECUTE FUNCTION effectflow_audit_append_only();
CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON audit
    FOR EACH STATEMENT EXECUTE FUNCTION effectflow_audit_append_only();
