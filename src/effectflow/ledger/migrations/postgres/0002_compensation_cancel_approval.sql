-- effectflow ledger, version 2 (PostgreSQL): cancel/compensate requests, completion, approvals.

-- An operator's request to stop the run (cancel) or answer its effects (compensate). A worker holding
-- the run reads it with every fenced write and stops at its next step boundary.
ALTER TABLE runs ADD COLUMN control_json JSONB;

-- The completion state the step required when its intent was recorded; a changed contract cannot
-- move it for a running step.
ALTER TABLE steps ADD COLUMN required_state TEXT;
-- For a compensation step: the effect it answers.
ALTER TABLE steps ADD COLUMN compensates TEXT;
-- The approval the step's call ran under.
ALTER TABLE steps ADD COLUMN approval_id TEXT;

CREATE INDEX effects_by_compensates ON effects (compensates);

-- Approvals given by people, each for one step's exact request.
CREATE TABLE approvals (
    approval_id    TEXT PRIMARY KEY,
    tenant         TEXT NOT NULL,
    run_id         TEXT NOT NULL,
    step_id        TEXT NOT NULL,
    request_digest TEXT NOT NULL,
    approver       TEXT NOT NULL,
    note           TEXT,
    approved_at    DOUBLE PRECISION NOT NULL,
    insert_seq     BIGINT GENERATED ALWAYS AS IDENTITY
);
CREATE INDEX approvals_by_step ON approvals (run_id, step_id, approved_at);

-- What claim_runnable reads: the oldest runs a worker may take, with their lease to check. Partial,
-- so finished runs (the bulk of the table) never enter it.
CREATE INDEX runs_runnable ON runs (created_at, insert_seq)
    WHERE status IN ('running', 'cancelling');
