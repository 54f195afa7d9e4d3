"""What ``verify`` reads of a run (``Material``), what it reports (``Problem``), and the
run-by-run reader of materials through the store's own readers.

``materials`` is the reference: ``audit_read.materials_batched``, which ``verify`` reads with, must
build the same ``Material`` field by field in fewer statements (tests/conformance/test_audit_read.py).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from effectflow.ledger.audit import rows as row_names
from effectflow.ledger.records import DecisionRecord, OperationBinding


@dataclasses.dataclass(frozen=True)
class Material:
    """Everything ``verify`` reads of one run (both backends produce it the same way)."""

    run: Any  # records.RunRecord
    audit_head: str
    audit_count: int
    seal_head: str | None
    seal_count: int
    events: list[Any]  # records.AuditEvent
    #: n, rows_json (and rows, parsed), audit_head, audit_count, at, prev_hash, hash, shard,
    #: shard_seq
    seals: list[dict[str, Any]]
    rows: dict[str, Any]  # row key -> record, as the tables hold them today
    #: Operation rows past their key retention, which ``purge_expired_keys`` may have removed.
    purgeable: set[str]


@dataclasses.dataclass(frozen=True)
class Problem:
    """A place where the ledger does not verify."""

    run_id: str
    seq: int | None
    message: str


def _material(store: Any, head: Mapping[str, Any]) -> Material:
    """What ``verify`` reads of one run, through the store's own readers (both backends)."""
    rid = str(head["run_id"])
    run = store.get_run(rid)
    rows: dict[str, Any] = {f"runs:{rid}": run, f"runs_fixed:{rid}": run}
    effects = store.effects(tenant=None, run_id=rid, limit=1_000_000)
    for table, found in (
        ("steps", store.steps(rid)),
        ("effects", effects),
        ("attempts", store.attempts(rid)),
        ("approvals", store.approvals(rid)),
    ):
        rows.update((row_names.row_key(table, r), r) for r in found)
    purgeable: set[str] = set()
    for r in store.audit_rows(store.SQL["operations_of_run"], (rid,)):
        op = OperationBinding(**{f.name: r[f.name] for f in dataclasses.fields(OperationBinding)})
        rows[row_names.row_key("operations", op)] = op
    for e in effects:
        for r in store.audit_rows(store.SQL["decisions_of_effect"], (e.effect_id,)):
            d = DecisionRecord(**{f.name: r[f.name] for f in dataclasses.fields(DecisionRecord)})
            rows[row_names.row_key("decisions", d)] = d
    seals = []
    for r in store.audit_rows(store.SQL["seals_of_run"], (rid,)):
        seal = dict(r)
        seal["rows"] = json.loads(seal["rows_json"])
        seals.append(seal)
    # A binding past its retention may have been purged (``purge_expired_keys``): not a deletion.
    for seal in seals:
        for name in seal["rows"]:
            if name.startswith("operations:"):
                purgeable.add(name)
    purgeable -= set(rows)
    return Material(
        run=run,
        audit_head=str(head["audit_head"]),
        audit_count=int(head["audit_count"]),
        seal_head=head["seal_head"],
        seal_count=int(head["seal_count"] or 0),
        events=store.audit(rid),
        seals=seals,
        rows=rows,
        purgeable=purgeable,
    )


def materials(store: Any, run_id: str | None = None) -> dict[str, Material]:
    """Every run's material (or one run's), by run id, read run by run through the store's own
    readers: the reference ``audit_read.materials_batched`` (what ``verify`` reads with) is
    tested against."""
    heads = (
        store.audit_rows(store.SQL["run_heads"], ())
        if run_id is None
        else store.audit_rows(store.SQL["run_head"], (run_id,))
    )
    return {str(h["run_id"]): _material(store, h) for h in heads}
