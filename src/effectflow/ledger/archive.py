"""Archiving finished runs: a run's rows, events and seals move to a JSON-lines file that verifies
on its own, and the ledger keeps what ``verify`` needs to tell the run's absence from a deletion.

Why this shape: every seal is also a link in its shard's chain (``audit.shards``), so removing a
run's seals would break the chain of its shard for every other run in it. The ledger therefore
keeps, per archived run, a record (``archived_runs``: the run's tenant and its chains' heads and
lengths, hashed with the audit key when the ledger is keyed, as purge records are) and each of its
seals' links (``archived_seals``: the seal's shard, place and hash; nothing of its rows). ``verify``
replays each shard's chain through the kept links, so a seal removed by hand still breaks it; it
accepts a run that is gone only when a record of it verifies and the kept links are exactly the
run's seal chain, which without the key nobody can forge. The file carries the run's rows, events,
seals and purge records, and its archive record: ``verify_file`` recomputes the run's two chains
and its rows' digests from them, as ``verify`` does in the ledger.

Only finished runs go (``archivable_runs``: a terminal status, no effect in doubt, no step waiting
for a person, a completion or its outcome), and the file is written and flushed to disk before the
rows are removed in one transaction, which first checks that each run's heads are still the ones
exported (a run written since is left in the ledger and out of the file).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from effectflow import digests, errors
from effectflow.ledger import audit, rowmap
from effectflow.ledger.audit import replay

#: The ledger version from which runs may be archived (migration 10: ``archived_runs``).
ARCHIVES_SINCE = replay.ARCHIVES_SINCE

#: What an archive file's first line says it is.
FORMAT = "effectflow-archive/1"

#: A run's tables, in the order its rows are removed (children before the run, which the foreign
#: keys require; audit and seals after it, which their triggers require).
_DELETE_ORDER = (
    "attempts",
    "approvals",
    "operations",
    "effects",
    "steps",
    "runs",
    "audit",
    "seals",
)

#: Per table of a seal's row names: the record's fields and how a row becomes the record.
_TABLES: dict[str, tuple[list[str], Callable[[Any], Any]]] = {
    "runs": (rowmap.RUN_FIELDS, rowmap.run),
    "runs_fixed": (rowmap.RUN_FIELDS, rowmap.run),
    "steps": (rowmap.STEP_FIELDS, rowmap.step),
    "effects": (rowmap.EFFECT_FIELDS, rowmap.effect),
    "attempts": (rowmap.ATTEMPT_FIELDS, rowmap.attempt),
    "approvals": (rowmap.APPROVAL_FIELDS, rowmap.approval),
    "decisions": (rowmap.DECISION_FIELDS, rowmap.decision),
    "operations": (rowmap.OPERATION_FIELDS, rowmap.operation),
}

_RECORD_FIELDS = (
    "run_id",
    "tenant",
    "archived_at",
    "audit_count",
    "audit_head",
    "seal_count",
    "seal_head",
)


def record_hash(record: Mapping[str, Any], key: bytes | None) -> str:
    """The hash of one archive record (keyed with the audit key when the ledger is)."""
    body = digests.canonical_json(
        [
            "archived",
            str(record["run_id"]),
            str(record["tenant"]),
            float(record["archived_at"]),
            int(record["audit_count"]),
            str(record["audit_head"]),
            int(record["seal_count"]),
            record["seal_head"],
        ]
    )
    return audit._hash(key, body)


def _as_row(fields: list[str], record: Any) -> dict[str, Any]:
    return dict(
        zip((rowmap.column(f) for f in fields), rowmap.row_values(record, fields), strict=True)
    )


def _entry(m: audit.Material, record: dict[str, Any], purges: list[dict[str, Any]]) -> Any:
    """One archived run as a line of the file: everything ``verify_file`` recomputes it from."""
    return {
        "kind": "run",
        "record": record,
        "events": [_as_row(rowmap.AUDIT_FIELDS, e) for e in m.events],
        "seals": [{k: v for k, v in s.items() if k != "rows"} for s in m.seals],
        "rows": {name: _as_row(_TABLES[name.split(":", 1)[0]][0], r) for name, r in m.rows.items()},
        "purged": purges,
    }


def _line(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _signature(lines: Iterable[str], key: bytes | None) -> str:
    """What the file's last line signs: every line before it, in order."""
    digests_of = [hashlib.sha256(line.encode("utf-8")).hexdigest() for line in lines]
    return audit._hash(key, digests.canonical_json(["effectflow-archive", digests_of]))


def archive(store: Any, *, before: float, to: Path, now: float) -> list[str]:
    """Export the finished runs last written before ``before`` to ``to`` and remove them from the
    ledger, leaving an archive record and the seals' shard links of each; returns their ids.

    Raises:
        errors.LedgerFileError: the ledger is keyed and this process has no audit key (nothing
            was archived).
    """
    key = store.audit_key
    if key is None and store.audit_rows(store.SQL["keyed_seal"], (audit.KEYED + "%",)):
        # Records written without the key would not verify where the ledger's do.
        raise errors.LedgerFileError(
            "this ledger is keyed: archiving it writes keyed archive records, so set "
            f"{audit.KEY_ENV} to the ledger's audit key. Nothing was archived"
        )
    found: dict[str, tuple[audit.Material, dict[str, Any], list[dict[str, Any]]]] = {}
    for head in store.audit_rows(store.SQL["archivable_runs"], (before,)):
        rid = str(head["run_id"])
        m = audit._material(store, head)
        record: dict[str, Any] = {
            "run_id": rid,
            "tenant": str(head["tenant"]),
            "archived_at": now,
            "audit_count": m.audit_count,
            "audit_head": m.audit_head,
            "seal_count": m.seal_count,
            "seal_head": m.seal_head,
        }
        record["hash"] = record_hash(record, key)
        purges = store.audit_rows(store.SQL["purge_records_of_run"], (rid,))
        found[rid] = (m, record, purges)
    with store._plain_txn() as conn:
        kept = []
        for rid, (_, record, _) in found.items():
            # Locked (PostgreSQL: FOR UPDATE; SQLite: BEGIN IMMEDIATE holds the file): a writer
            # of the run waits, and finds it gone.
            now_head = store._rows(conn, store.SQL["lock_run"], (rid,))
            if now_head and (
                str(now_head[0]["audit_head"]) == record["audit_head"]
                and int(now_head[0]["seal_count"] or 0) == record["seal_count"]
            ):
                kept.append(rid)
        lines = [
            _line(
                {
                    "kind": "archive",
                    "format": FORMAT,
                    "before": before,
                    "exported_at": now,
                    "key_id": None if key is None else audit.key_id(key),
                }
            )
        ]
        lines += [_line(_entry(*found[rid])) for rid in kept]
        lines.append(_line({"kind": "end", "runs": len(kept), "signature": _signature(lines, key)}))
        with to.open("w", encoding="utf-8") as out:
            out.write("\n".join(lines) + "\n")
            out.flush()
            os.fsync(out.fileno())
        for rid in kept:
            record = found[rid][1]
            store._exec(
                conn,
                store.SQL["insert_archived_run"],
                [record[f] for f in _RECORD_FIELDS] + [record["hash"]],
            )
            store._exec(conn, store.SQL["keep_archived_seal_links"], (rid,))
            store._exec(conn, store.SQL["delete_archived_decisions"], (rid,))
            for table in _DELETE_ORDER:
                store._exec(conn, store.SQL["delete_archived_rows"].format(table=table), (rid,))
    return kept


def _problem(run_id: str, message: str) -> audit.Problem:
    return audit.Problem(run_id, None, message)


def _hash_ok(stored: str, expected: str, key: bytes | None) -> bool:
    """A stored hash against ``expected``, its recomputation with ``key`` (a keyed one passes
    unchecked without the key: the caller says once that the keyed hashes went unchecked)."""
    keyed = stored.startswith(audit.KEYED)
    if keyed and key is None:
        return True
    if key is not None and not keyed:
        return False
    return stored == expected


def check_records(store: Any, key: bytes | None) -> tuple[set[str], list[audit.Problem]]:
    """The runs the ledger's archive records excuse, and what is wrong with them: a record that
    does not verify, a run archived and still (or again) in the ledger, kept seal links that are
    not the archived run's seal chain, or links no record owns."""
    problems: list[audit.Problem] = []
    records_by_run = {
        str(r["run_id"]): r for r in store.audit_rows(store.SQL["archived_run_records"], ())
    }
    links: dict[str, list[dict[str, Any]]] = {}
    for link in store.audit_rows(store.SQL["archived_seal_links"], ()):
        links.setdefault(str(link["run_id"]), []).append(link)
    present = {
        str(r["run_id"])
        for rid in records_by_run
        for r in store.audit_rows(store.SQL["run_head"], (rid,))
    }
    excused: set[str] = set()
    for rid, r in records_by_run.items():
        mine = links.pop(rid, [])
        if not _hash_ok(str(r["hash"]), record_hash(r, key), key):
            problems.append(_problem(rid, "the run's archive record does not verify (forged)"))
        elif rid in present:
            # Its id started a run again after it was archived: the ledger no longer knows that
            # run's first life, so a start under that id was not the idempotent one it should be.
            problems.append(
                _problem(rid, "the run is archived and in the ledger again (its id was reused)")
            )
        elif [int(x["n"]) for x in mine] != list(range(1, int(r["seal_count"]) + 1)) or (
            mine and mine[-1]["hash"] != r["seal_head"]
        ):
            problems.append(
                _problem(rid, "the run's kept seal links are not its archived seal chain (edited)")
            )
        else:
            excused.add(rid)
    for rid in sorted(links):
        problems.append(_problem(rid, "kept seal links of a run that has no archive record"))
    return excused, problems


def _record_of(name: str, row: Mapping[str, Any]) -> Any:
    """A row of an archive file as its record; a file written before a column existed (a step's
    arguments, version 11) has none for it, read as NULL."""
    fields, make = _TABLES[name.split(":", 1)[0]]
    return make({**{rowmap.column(f): None for f in fields}, **row})


def _material_of(entry: Mapping[str, Any]) -> audit.Material:
    """The ``Material`` ``verify_run`` reads, rebuilt from one line of an archive file."""
    rows = {name: _record_of(name, row) for name, row in entry["rows"].items()}
    run = next(r for name, r in rows.items() if name.startswith("runs:"))
    seals = [{**s, "rows": json.loads(s["rows_json"])} for s in entry["seals"]]
    record = entry["record"]
    return audit.Material(
        run=run,
        audit_head=str(record["audit_head"]),
        audit_count=int(record["audit_count"]),
        seal_head=record["seal_head"],
        seal_count=int(record["seal_count"]),
        events=[rowmap.event(e) for e in entry["events"]],
        seals=seals,
        rows=rows,
        purgeable=set(),
    )


def _purged_names(entry: Mapping[str, Any], key: bytes | None) -> tuple[set[str], bool]:
    """The operation rows the run's purge records excuse, and whether every record verifies."""
    names: set[str] = set()
    ok = True
    for p in entry["purged"]:
        good = _hash_ok(
            str(p["hash"]),
            audit.purge_hash(
                p["tenant"],
                p["logical_operation_id"],
                p["run_id"],
                p["key_expires_at"],
                p["purged_at"],
                key=key,
            ),
            key,
        ) and float(p["key_expires_at"]) <= float(p["purged_at"])
        if good:
            names.add(f"operations:{p['logical_operation_id']}")
        ok = ok and good
    return names, ok


def verify_file(path: Path, key: bytes | None) -> list[audit.Problem]:
    """Verify an archive file on its own: its signature over every line, each run's archive record
    against the run's chains, and each run's events, seals and rows as ``verify`` checks a run
    in the ledger.

    Raises:
        OSError, ValueError: the file cannot be read, or is not an archive file.
    """
    lines = path.read_text(encoding="utf-8").splitlines()
    parsed = [json.loads(line) for line in lines]
    if len(parsed) < 2 or parsed[0].get("kind") != "archive" or parsed[0].get("format") != FORMAT:
        raise ValueError(f"{path} is not an effectflow archive ({FORMAT})")
    problems: list[audit.Problem] = []
    end = parsed[-1]
    if end.get("kind") != "end" or end.get("runs") != len(parsed) - 2:
        problems.append(_problem("-", "the file is cut short or has lines added"))
    elif not _hash_ok(str(end.get("signature", "")), _signature(lines[:-1], key), key):
        problems.append(_problem("-", "the archive's signature does not match (edited)"))
    for entry in parsed[1:-1]:
        record = entry["record"]
        rid = str(record["run_id"])
        if not _hash_ok(str(record["hash"]), record_hash(record, key), key):
            problems.append(_problem(rid, "the run's archive record does not verify (edited)"))
        m = _material_of(entry)
        names, ok = _purged_names(entry, key)
        if not ok:
            problems.append(_problem(rid, "a purge record of the run does not verify (edited)"))
        sealed = {n for s in m.seals for n in s["rows"] if n.startswith("operations:")}
        m = dataclasses.replace(m, purgeable=(sealed - set(m.rows)) & names)
        if m.run.run_id != rid:
            problems.append(_problem(rid, "the run's rows are another run's (edited)"))
        problems.extend(audit.verify_run(m, key, sealed_since=None, shards_since=None))
    return problems


__all__ = ["FORMAT", "archive", "check_records", "record_hash", "verify_file"]
