"""The seal of one batch: the digests of the rows it wrote, chained to the run's previous seal.

Every batch a run writes appends one seal (the named query ``insert_seal``) in the transaction
that writes the rows, so a row edited later no longer matches its last seal. The seal gets its
place in its shard's chain (``shards.chain_shards``) at the end of that transaction.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from effectflow import digests
from effectflow.ledger import queries, records
from effectflow.ledger.audit import hashes, rows

#: The statement that appends a seal, with ``?`` placeholders (the named query ``insert_seal`` of
#: ``queries/sqlite.sql``; the stores run their own dialect's): for SQL sent by hand to either
#: backend through a ``?`` reader, as the tamper tests write a forged seal.
INSERT_SEAL = queries.statements("sqlite")["insert_seal"]

#: The run record's fields (what a batch's ``run_changes`` may name besides the chains' heads).
_RUN_FIELDS = frozenset(f.name for f in dataclasses.fields(records.RunRecord))


def seal_batch(
    batch: Any,
    run_state: dict[str, Any],
    seal_head: str | None,
    seal_count: int,
    changes: dict[str, Any],
    audit_head: str,
    audit_count: int,
    now: float,
    key: bytes | None,
    written: Mapping[str, list[list[Any]]],
) -> tuple[list[Any], str, int] | None:
    """The seal of one batch: the row values for ``seals`` (without its place in its shard's chain,
    which ``chain_shards`` gives at the end of the transaction), the run's new seal head and count
    (None: the batch wrote nothing to seal).

    ``run_state`` is the run's changing fields as the batch found them (``run_state_of`` / the
    stored columns, JSON ones as canonical text), ``changes`` what the batch sets on the run,
    ``audit_head`` / ``audit_count`` the run's event chain after the batch, and ``written`` the
    column values the batch's INSERTs sent for its steps, effects and attempts (in the batch's
    order), which are digested as they are."""
    wrote = (
        batch.new_run is not None
        or batch.steps
        or batch.effects
        or batch.attempts
        or batch.approvals
        or batch.decisions
        or batch.operations
        or batch.audit
        or any(k in _RUN_FIELDS for k in changes)
    )
    if not wrote:
        return None
    rid = batch.run_id
    sealed = {f"runs:{rid}": rows.run_state_digest(rows.apply_state(run_state, changes))}
    if batch.new_run is not None:
        sealed[f"runs_fixed:{rid}"] = rows.digest_of("runs_fixed", batch.new_run)
    for table, found in (
        ("steps", batch.steps.values()),
        ("effects", batch.effects.values()),
        ("attempts", batch.attempts.values()),
    ):
        if found:
            for record, values in zip(found, written[table], strict=True):
                sealed[rows.row_key(table, record)] = rows.values_digest(table, values)
    for table, found in (
        ("approvals", batch.approvals),
        ("decisions", batch.decisions),
        ("operations", batch.operations),
    ):
        for record in found:
            sealed[rows.row_key(table, record)] = rows.values_digest(
                table, rows.record_values(table, record)
            )
    n = seal_count + 1
    prev = seal_head or hashes.seal_genesis(rid)
    rows_json = digests.canonical_json(sealed)
    digest = hashes.seal_hash(
        prev,
        run_id=rid,
        n=n,
        rows_json=rows_json,
        audit_head=audit_head,
        audit_count=audit_count,
        at=now,
        key=key,
    )
    return [rid, n, rows_json, audit_head, audit_count, now, prev, digest], digest, n
