-- effectflow ledger, version 6: approval ids and decision ids are unique per tenant.

-- Until version 5 an id one tenant used answered "already given" to another tenant, which so
-- learned that it existed and could block it. Now each tenant has its own id space: another
-- tenant's id is simply unknown. SQLite cannot change a primary key in place: the tables are
-- rebuilt with their rows.
CREATE TABLE approvals_v6 (
    approval_id    TEXT NOT NULL,
    tenant         TEXT NOT NULL,
    run_id         TEXT NOT NULL,
    step_id        TEXT NOT NULL,
    request_digest TEXT NOT NULL,
    approver       TEXT NOT NULL,
    note           TEXT,
    approved_at    REAL NOT NULL,
    PRIMARY KEY (tenant, approval_id)
);
INSERT INTO approvals_v6 (approval_id, tenant, run_id, step_id, request_digest, approver, note,
    approved_at)
    SELECT approval_id, tenant, run_id, step_id, request_digest, approver, note, approved_at
    FROM approvals;
DROP TABLE approvals;
ALTER TABLE approvals_v6 RENAME TO approvals;
CREATE INDEX approvals_by_step ON approvals (run_id, step_id, approved_at);

CREATE TABLE decisions_v6 (
    decision_id   TEXT NOT NULL,
    tenant        TEXT NOT NULL,
    params_digest TEXT NOT NULL,
    effect_id     TEXT NOT NULL,
    decided_at    REAL NOT NULL,
    PRIMARY KEY (tenant, decision_id)
);
INSERT INTO decisions_v6 (decision_id, tenant, params_digest, effect_id, decided_at)
    SELECT decision_id, tenant, params_digest, effect_id, decided_at FROM decisions;
DROP TABLE decisions;
ALTER TABLE decisions_v6 RENAME TO decisions;
