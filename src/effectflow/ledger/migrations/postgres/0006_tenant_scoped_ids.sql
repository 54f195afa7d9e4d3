-- effectflow ledger, version 6 (PostgreSQL): approval ids and decision ids are unique per tenant.

-- Until version 5 an id one tenant used answered "already given" to another tenant, which so
-- learned that it existed and could block it. Now each tenant has its own id space: another
-- tenant's id is simply unknown.
ALTER TABLE approvals DROP CONSTRAINT approvals_pkey;
ALTER TABLE approvals ADD PRIMARY KEY (tenant, approval_id);
ALTER TABLE decisions DROP CONSTRAINT decisions_pkey;
ALTER TABLE decisions ADD PRIMARY KEY (tenant, decision_id);
