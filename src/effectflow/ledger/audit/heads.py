"""Exported heads: what no hash inside one database can show.

Whoever kept the shard rows of an earlier moment can delete everything written since and put them
back, and what is left is consistent. ``effectflow audit head`` exports every run's heads and every
shard's, signed with the key (``export_head``); an operator keeps these exports elsewhere, and
``verify --against HEADFILE`` (``check_head``) checks that each run is still there and that its
chains and the shards' still reach the exported heads.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from typing import Any

from effectflow import digests
from effectflow.ledger.audit import hashes, material, replay
from effectflow.ledger.audit import shards as sharding

#: The format an exported head names itself by.
_FORMAT = "effectflow-audit-head/1"


def head_entry(m: material.Material) -> dict[str, Any]:
    """One run's line in an exported head."""
    return {
        "run_id": m.run.run_id,
        "tenant": m.run.tenant,
        "audit_count": m.audit_count,
        "audit_head": m.audit_head,
        "seal_count": m.seal_count,
        "seal_head": m.seal_head,
    }


def shard_heads(store: Any) -> list[dict[str, Any]]:
    """Every shard's recorded head, for an exported head."""
    rows = store.audit_rows(store.SQL["exported_shard_heads"], (sharding.INDEX,))
    return [{"shard": int(r["shard"]), "n": int(r["n"]), "head": str(r["head"])} for r in rows]


def export_head(
    entries: list[dict[str, Any]], key: bytes | None, shards: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The signed head of a whole ledger: every run's heads and every shard's, with a signature
    over all of them."""
    body: dict[str, Any] = {
        "format": _FORMAT,
        "exported_at": time.time(),
        "runs": sorted(entries, key=lambda e: e["run_id"]),
    }
    if shards is not None:
        body["shards"] = shards
    text = digests.canonical_json(body)
    body["signature"] = hashes._hash(key, text)
    body["key_id"] = None if key is None else hashes.key_id(key)
    return body


def head_shape(head: Any) -> str | None:
    """What is wrong with the shape of a head file (None: nothing), before it is compared: a
    malformed file is one ``verify`` could not read, not a tampered ledger."""
    if not isinstance(head, dict) or head.get("format") != _FORMAT:
        return "not an effectflow audit head (a JSON object with format effectflow-audit-head/1)"
    fields: dict[str, dict[str, tuple[type, ...]]] = {
        "runs": {
            "run_id": (str,),
            "audit_count": (int,),
            "audit_head": (str,),
            "seal_count": (int, type(None)),
            "seal_head": (str, type(None)),
        },
        "shards": {"shard": (int,), "n": (int,), "head": (str,)},
    }
    for part, expected in fields.items():
        entries = head.get(part, [])
        if not isinstance(entries, list):
            return f"{part} is not a list"
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict):
                return f"{part}[{i}] is not an object"
            for name, kinds in expected.items():
                value = entry.get(name)
                if (part, name) == ("runs", "seal_count") and name not in entry:
                    continue
                if not isinstance(value, kinds) or isinstance(value, bool):
                    return f"{part}[{i}].{name} is {value!r}, not a {kinds[0].__name__}"
    return None


def check_head(
    head: Mapping[str, Any],
    found: Mapping[str, material.Material],
    key: bytes | None,
    chains: list[replay.ShardChain] | None = None,
    archived: Collection[str] = frozenset(),
) -> list[material.Problem]:
    """Compare a ledger with a head exported earlier: each run it lists must still be there, its
    chains at least as long and passing through the exported heads; and so must each shard's
    chain (``chains``, as ``replay_shards`` recomputed them), which also covers the runs the
    export does not list by name. A run in ``archived`` (its archive record verifies) is gone
    by right: its seals' links still carry the shards' chains to their exported heads."""
    problems: list[material.Problem] = []
    body = {k: head[k] for k in ("format", "exported_at", "runs", "shards") if k in head}
    signature = str(head.get("signature", ""))
    if signature.startswith(hashes.KEYED) and key is None:
        problems.append(
            material.Problem("-", None, "the head is signed with a key: give it to verify")
        )
    elif hashes._hash(key, digests.canonical_json(body)) != signature:
        problems.append(
            material.Problem("-", None, "the head file's signature does not match (edited)")
        )
    for entry in head.get("runs", []):
        rid = str(entry["run_id"])
        if rid not in found and rid in archived:
            continue
        problems.extend(_check_run(entry, found.get(rid)))
    if chains is not None:
        by_shard = {c.shard: c for c in chains}
        for entry in head.get("shards", []):
            problems.extend(_check_shard(entry, by_shard.get(int(entry["shard"]))))
    return problems


def _check_run(entry: Mapping[str, Any], m: material.Material | None) -> list[material.Problem]:
    """Whether one run of an exported head is still there and its chains reach its heads."""
    rid = str(entry["run_id"])
    if m is None:
        return [material.Problem(rid, None, "the run is in the exported head and gone (deleted)")]
    problems: list[material.Problem] = []
    if len(m.events) < entry["audit_count"] or (
        entry["audit_count"] and m.events[entry["audit_count"] - 1].hash != entry["audit_head"]
    ):
        problems.append(
            material.Problem(
                rid, None, "the events no longer reach the exported head (cut or rewritten)"
            )
        )
    seal_count = int(entry.get("seal_count") or 0)
    if len(m.seals) < seal_count or (
        seal_count and m.seals[seal_count - 1]["hash"] != entry["seal_head"]
    ):
        problems.append(
            material.Problem(
                rid, None, "the seals no longer reach the exported head (cut or rewritten)"
            )
        )
    return problems


def _check_shard(
    entry: Mapping[str, Any], chain: replay.ShardChain | None
) -> list[material.Problem]:
    """Whether one shard's chain, as replayed, still reaches its exported head."""
    shard, n = int(entry["shard"]), int(entry["n"])
    if chain is None or chain.length < n:
        return [
            material.Problem(
                f"(shard {shard})",
                None,
                "the shard's chain is shorter than exported "
                "(seals were removed: runs deleted or cut)",
            )
        ]
    if n and chain.at.get(n) is not None and chain.at[n] != entry["head"]:
        return [
            material.Problem(
                f"(shard {shard})",
                None,
                "the shard's chain no longer passes through the exported head (rewritten)",
            )
        ]
    return []
