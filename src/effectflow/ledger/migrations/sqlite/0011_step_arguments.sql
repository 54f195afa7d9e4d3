-- effectflow ledger, version 11: each step records what was sent, `arguments_json` — the
-- canonical arguments with the tool's redaction rule applied, or a marker over the size cap
-- (docs/arguments.md). Display only: the request digest, the key and the payload-conflict check
-- are computed from the arguments before redaction, as before.
--
-- Steps written before this version have no arguments (NULL). Their seals digested the row
-- without the column, and a NULL `arguments_json` is digested the same way (`audit.rows`), so
-- `effectflow audit verify` holds across the upgrade; a value set on such a row is an edit.
ALTER TABLE steps ADD COLUMN arguments_json TEXT;
