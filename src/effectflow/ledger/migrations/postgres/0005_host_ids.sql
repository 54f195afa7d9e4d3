-- effectflow ledger, version 5 (PostgreSQL): the host's ids of a guarded call, searchable.

-- A guarded call (rt.guard: a LangGraph tool call, an MCP client's call, an agent SDK's) is one run
-- recorded under the host's durable identity: its scope (a thread and checkpoint namespace, a
-- workflow id, a session) and its call id (the model's tool-call id, the host's step id). Both are
-- kept as columns so an operator finds the run from what the host shows (runs --scope, the API's
-- ?scope=, the console's filter). NULL for every other run and for runs recorded before version 5.
ALTER TABLE runs ADD COLUMN scope TEXT;
ALTER TABLE runs ADD COLUMN call_id TEXT;
CREATE INDEX runs_by_scope ON runs (tenant, scope, created_at);
