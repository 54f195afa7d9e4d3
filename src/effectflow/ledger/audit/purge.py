"""Purge records: what ``purge_expired_keys`` leaves for each operation binding it drops, so that
``verify`` can tell a binding purged after its key expired from one deleted by hand.

Each record is hashed (keyed, with the operator's key), so a record forged with the public hash,
or one that says a key was purged before it expired, excuses nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from effectflow import digests
from effectflow.ledger.audit import hashes, material


def tombstones(
    purged: Iterable[tuple[str, str, str, float]], now: float, key: bytes | None
) -> list[tuple[Any, ...]]:
    """The ``purged_keys`` rows recording bindings ``(tenant, logical_operation_id, run_id,
    key_expires_at)`` purged at ``now``, each hashed (keyed) so none can be forged."""
    return [(*p, now, purge_hash(*p, now, key=key)) for p in purged]


def purge_hash(
    tenant: str,
    logical_operation_id: str,
    run_id: str,
    key_expires_at: float,
    purged_at: float,
    *,
    key: bytes | None,
) -> str:
    """The hash of one purge record."""
    body = digests.canonical_json(
        ["purged", tenant, logical_operation_id, run_id, float(key_expires_at), float(purged_at)]
    )
    return hashes._hash(key, body)


def purged_operations(
    store: Any, key: bytes | None
) -> tuple[set[tuple[str, str]], list[material.Problem]]:
    """The ``(run_id, operations:<id>)`` names a purge record excuses, and the records that do not
    verify (edited or forged, written without the key, or purged before their key expired)."""
    excused: set[tuple[str, str]] = set()
    problems: list[material.Problem] = []
    for r in store.audit_rows(store.SQL["purge_records"], ()):
        fields = (r["tenant"], r["logical_operation_id"], r["run_id"], r["key_expires_at"])
        stored = str(r["hash"])
        keyed = stored.startswith(hashes.KEYED)
        if keyed and key is None:
            ok = True  # verifiable with the key only (said once, by the caller)
        elif key is not None and not keyed:
            ok = False
        else:
            ok = stored == purge_hash(*fields, r["purged_at"], key=key)
        if not ok or float(r["key_expires_at"]) > float(r["purged_at"]):
            problems.append(
                material.Problem(
                    str(r["run_id"]),
                    None,
                    f"the purge record of operations:{r['logical_operation_id']} does not verify "
                    "(forged, edited, or purged before its key expired)",
                )
            )
        else:
            excused.add((str(r["run_id"]), f"operations:{r['logical_operation_id']}"))
    return excused, problems
