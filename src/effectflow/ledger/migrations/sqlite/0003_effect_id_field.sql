-- effectflow ledger, version 3: the field of a tool's result that carries the provider's effect id.

-- Recorded on the effect with its intent (the contract's effect_id, e.g. provider_message_id), so a
-- person's resolution shapes the step's result the same way whether or not the application's tools
-- are registered in the process that records it. NULL for effects recorded before version 3.
ALTER TABLE effects ADD COLUMN effect_id_field TEXT;
