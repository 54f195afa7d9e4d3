"""Tamper evidence: the audit log's hash chains, the seals of state rows, and their verification.

Two chains per run, both kept on the run's row (head and length), neither shared with other runs
(so writers of different runs never contend for one "last hash" row):

- **events**: each audit event's hash covers the previous event's hash and its own content;
- **seals**: each batch a run writes appends one seal — the digests of the rows the batch wrote
  (the run as it is after the batch, its steps, effects, attempts, approvals, decisions, operation
  bindings) and the run's audit head after it. ``verify`` compares today's rows with their last
  sealed digest: an edited ``effects.status`` or step output is caught, and so is an event tail
  cut short (the sealed audit head is longer than the chain).

**Keyed or not.** With an operator's key (``EFFECTFLOW_AUDIT_KEY``, or a file named by
``EFFECTFLOW_AUDIT_KEY_FILE``; never stored in the ledger) every hash is an HMAC-SHA256 with it,
marked ``hmac-sha256:``: whoever can write the database but not read the key cannot forge a chain.
Without a key the hashes are plain sha256 and anyone can recompute them, so only accidental damage
(a disk, a bad restore, a hand edit that forgot the hashes) is detectable — ``verify`` says so.

**A head over every run.** A run's own chains cannot show that the run was deleted whole, or its
newest writes cut together with their seals: what is left is consistent. So each seal is also a
link in the chain of its run's *shard* (one of ``SHARDS``, by ``shard_of(run_id)``); the
``audit_shards`` table keeps each chain's length and head, extended last in every transaction that
seals (shards locked in order, so writers never deadlock; 64 of them, so writers of different runs
rarely wait on one row). A removed seal leaves a gap, or a head its chain no longer reaches; an
emptied shard is told from one never used by the index row (``INDEX``), whose head covers the set
of used shards. With a key, nobody without it can compute a mended head.

**What no hash inside one database can show** is a rollback to a state someone watched: whoever
kept the shard rows of an earlier moment can delete everything written since and put them back.
``effectflow audit head`` exports every run's heads and every shard's, signed with the key; an
operator keeps these exports elsewhere, and ``verify --against HEADFILE`` checks that each run is
still there and that its chains and the shards' still reach the exported heads.

The package, one concept a module (each re-exported here: callers write ``audit.<name>``):

- ``hashes``: the key, and the hashes of events and seals;
- ``rows``: the digests of state rows and their names in a seal;
- ``seals``: the seal of one batch (the write side);
- ``shards``: the shards' chains and the index row (the write side);
- ``purge``: the records ``purge_expired_keys`` leaves, and their verification;
- ``material``: what ``verify`` reads of a run and what it reports, read run by run;
- ``replay``: the shards' chains recomputed from their seals;
- ``heads``: exported heads and ``verify --against``;
- ``verify``: a run's chains and rows against its seals, and the whole ledger's verification.

``audit_read`` (beside this package) reads the same materials a chunk of runs at a time.
"""

from __future__ import annotations

from effectflow.ledger.audit.hashes import (
    KEY_ENV,
    KEY_FILE_ENV,
    KEYED,
    _hash,
    event_hash,
    event_hash_of_text,
    genesis,
    key_from_env,
    key_id,
    seal_genesis,
    seal_hash,
)
from effectflow.ledger.audit.heads import (
    check_head,
    export_head,
    head_entry,
    head_shape,
    shard_heads,
)
from effectflow.ledger.audit.material import Material, Problem, _material, materials
from effectflow.ledger.audit.purge import (
    purge_hash,
    purged_operations,
    tombstones,
)
from effectflow.ledger.audit.replay import ShardChain, replay_shards
from effectflow.ledger.audit.rows import (
    JSON_FIELDS,
    RUN_JSON,
    RUN_STATE,
    apply_state,
    record_values,
    row_digest,
    row_key,
    run_state_digest,
    run_state_of,
    values_digest,
)
from effectflow.ledger.audit.seals import INSERT_SEAL, seal_batch
from effectflow.ledger.audit.shards import (
    INDEX,
    SHARDS,
    chain_shards,
    first_uses,
    index_genesis,
    index_head,
    index_row,
    shard_genesis,
    shard_heads_read,
    shard_link,
    shard_of,
    shards_of,
)
from effectflow.ledger.audit.verify import verify, verify_run

__all__ = [
    "INDEX",
    "INSERT_SEAL",
    "JSON_FIELDS",
    "KEYED",
    "KEY_ENV",
    "KEY_FILE_ENV",
    "RUN_JSON",
    "RUN_STATE",
    "SHARDS",
    "Material",
    "Problem",
    "ShardChain",
    "_hash",
    "_material",
    "apply_state",
    "chain_shards",
    "check_head",
    "event_hash",
    "event_hash_of_text",
    "export_head",
    "first_uses",
    "genesis",
    "head_entry",
    "head_shape",
    "index_genesis",
    "index_head",
    "index_row",
    "key_from_env",
    "key_id",
    "materials",
    "purge_hash",
    "purged_operations",
    "record_values",
    "replay_shards",
    "row_digest",
    "row_key",
    "run_state_digest",
    "run_state_of",
    "seal_batch",
    "seal_genesis",
    "seal_hash",
    "shard_genesis",
    "shard_heads",
    "shard_heads_read",
    "shard_link",
    "shard_of",
    "shards_of",
    "tombstones",
    "values_digest",
    "verify",
    "verify_run",
]
