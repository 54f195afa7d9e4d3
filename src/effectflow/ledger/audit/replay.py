"""Recompute the shards' chains from the seals in them and compare them with the heads the
ledger records (``shards`` writes them).

A seal removed anywhere (a run deleted whole, a tail cut) breaks its shard's chain; a shard
emptied of every seal no longer matches the index row. With a key, nobody without it can mend
either.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from collections.abc import Iterable, Mapping
from typing import Any

from effectflow.ledger.audit import hashes, material, shards

#: The ledger version from which runs may be archived (migration 10: ``archived_runs``).
ARCHIVES_SINCE = 10


@dataclasses.dataclass(frozen=True)
class ShardChain:
    """One shard's chain as ``replay_shards`` recomputed it."""

    shard: int
    #: How many seals are in it, in order from the first (up to a gap).
    length: int
    #: The recomputed head after the seals at the positions asked for (None where it could not
    #: be recomputed: a keyed seal and no key).
    at: dict[int, str | None]


def _shard_key(row: Mapping[str, Any]) -> int:
    return int(row["shard"])


def _chain_order(row: Mapping[str, Any]) -> tuple[int, int]:
    return int(row["shard"]), int(row["shard_seq"])


def _replay_shard(
    shard: int,
    seals: Iterable[Mapping[str, Any]],
    recorded: tuple[int, str],
    key: bytes | None,
    want: int | None,
) -> tuple[ShardChain, str]:
    """Replay one shard's seals (in ``shard_seq`` order); returns its chain and what is wrong
    with it ("" if nothing)."""
    n, head = recorded
    prev: str | None = shards.shard_genesis(shard)
    at: dict[int, str | None] = {}
    seen = chained = 0
    gap = ""
    for seal in seals:
        if gap:
            seen += 1  # counted, no longer chained
            continue
        seq = seen + 1
        if seal["shard_seq"] != seq:
            gap = (
                f"the shard's chain skips from {seq - 1} to {seal['shard_seq']} at seal "
                f"{seal['n']} of run {seal['run_id']} (seals were removed)"
            )
            seen += 1
            continue
        keyed = str(seal["hash"]).startswith(hashes.KEYED)
        if prev is not None and keyed and key is None:
            prev = None  # verifiable with the key only (said once, by the caller)
        if prev is not None:
            prev = shards.shard_link(
                prev, shard=shard, seq=seq, seal_hash=seal["hash"], key=key if keyed else None
            )
        seen = chained = seq
        if seq == want:
            at[seq] = prev
    if gap:
        message = gap
    elif seen != n:
        message = (
            f"the shard's chain has {seen} seals, its head records {n} (seals were removed or "
            "added)"
        )
    elif seen and prev is not None and prev != head:
        message = "the shard's chain does not end where its head says (seals or head rewritten)"
    elif not seen and head != shards.shard_genesis(shard):
        message = "the shard has no seals and its head is not a new shard's (edited)"
    else:
        message = ""
    return ShardChain(shard, chained, at), message


def replay_shards(
    store: Any, key: bytes | None, want: Mapping[int, int] | None = None, only: int | None = None
) -> tuple[list[material.Problem], list[ShardChain]]:
    """Recompute every shard's chain from the seals in it (one sorted scan, in bounded memory)
    and compare it with the head the ledger records: a seal removed anywhere (a run deleted
    whole, a tail cut) breaks its shard's chain, and with a key nobody without it can mend the
    chain. ``want``: per shard, a position whose recomputed head to keep (an exported head's);
    ``only``: replay that shard alone (``verify --run``: the run's own shard)."""
    problems: list[material.Problem] = []
    chains: list[ShardChain] = []
    recorded = {
        int(r["shard"]): (int(r["n"]), str(r["head"]))
        for r in store.audit_rows(store.SQL["shard_rows"], ())
    }
    stream = (
        store.audit_stream(store.SQL["chained_seals"], ())
        if only is None
        else store.audit_stream(store.SQL["chained_seals_of_shard"], (only,))
    )
    if store.audit_rows(store.SQL["migration_applied_at"], (ARCHIVES_SINCE,)):
        # An archived run's seals are gone; the links they were in their shards' chains are kept
        # (``archived_seals``), so the chains are replayed across the gap. Read whole (one
        # server-side cursor at a time: the seals' stream holds it).
        kept = (
            store.audit_rows(store.SQL["archived_chained_seals"], ())
            if only is None
            else store.audit_rows(store.SQL["archived_chained_seals_of_shard"], (only,))
        )
        stream = heapq.merge(stream, kept, key=_chain_order)
    groups = itertools.groupby(stream, _shard_key)
    pending = next(groups, None)
    for shard in range(shards.SHARDS) if only is None else [only]:
        seals: Iterable[Mapping[str, Any]] = ()
        while pending is not None and pending[0] < shard:
            # seals of a shard that does not exist: counted as unchained
            problems.append(
                material.Problem(f"(shard {pending[0]})", None, "seals in no known shard")
            )
            pending = next(groups, None)
        if pending is not None and pending[0] == shard:
            seals = pending[1]
        where = f"(shard {shard})"
        if shard not in recorded:
            problems.append(material.Problem(where, None, "the shard's head row is gone (deleted)"))
            recorded[shard] = (0, shards.shard_genesis(shard))
        chain, message = _replay_shard(
            shard, seals, recorded[shard], key, None if want is None else want.get(shard)
        )
        if message:
            problems.append(material.Problem(where, None, message))
        chains.append(chain)
        if pending is not None and pending[0] == shard:
            pending = next(groups, None)
    while pending is not None:
        problems.append(material.Problem(f"(shard {pending[0]})", None, "seals in no known shard"))
        pending = next(groups, None)
    problems.extend(_check_index(recorded, key))
    return problems, chains


def _check_index(
    recorded: Mapping[int, tuple[int, str]], key: bytes | None
) -> list[material.Problem]:
    """What is wrong with the index row (``shards.INDEX``) against the shards that have seals."""
    where = f"(shard {shards.INDEX})"
    used = {s for s, (n, _) in recorded.items() if s != shards.INDEX and n > 0}
    index = recorded.get(shards.INDEX)
    if index is None:
        return [material.Problem(where, None, "the shards' index row is gone (deleted)")]
    n, head = index
    keyed = head.startswith(hashes.KEYED)
    expected = (
        shards.index_genesis() if not used else shards.index_head(used, key if keyed else None)
    )
    if used and key is not None and not keyed:
        return [material.Problem(where, None, "the index was written without the audit key")]
    if n != len(used) or (not (keyed and key is None) and head != expected):
        return [
            material.Problem(
                where,
                None,
                f"the index names {n} shards in use, {len(used)} have seals, or its head does "
                "not cover them (a shard was emptied, or its head row edited)",
            )
        ]
    return []
