-- effectflow ledger, version 4 (PostgreSQL): a digest of the workflow code each run last executed.

-- Recorded when a run starts and when it is resumed, so that code changed between a crash and its
-- recovery (a step renamed, an argument changed) is audited as workflow_changed even when the
-- declared version was not bumped. NULL for runs recorded before version 4.
ALTER TABLE runs ADD COLUMN workflow_code TEXT;
