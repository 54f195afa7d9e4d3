"""The ledger-wide chains: each seal is also a link in its run's shard's chain, and an index row
names the shards in use.

A run's own chains cannot show that the run was deleted whole, or its newest writes cut together
with their seals. The ``audit_shards`` rows (one per shard, and ``INDEX``) can: a removed seal
leaves a gap in its shard's chain, or a head the chain no longer reaches, and an emptied shard is
told from one never used by the index's head. A transaction locks its shards in sorted order
(``shards_of``), so two writers never deadlock. This module writes the chains;
``replay.replay_shards`` recomputes them.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from typing import Any

from effectflow import errors
from effectflow.ledger.audit import hashes

#: How many shards the ledger-wide chains are spread over: each transaction extends the chains of
#: the shards its runs fall in, so concurrent writers rarely wait on one another's shard.
SHARDS = 64

#: The ``audit_shards`` row that names the shards in use. A shard emptied of every seal would look
#: like one never used; this row's head covers the set of used shards, so emptying one means
#: writing a new head over the smaller set, which takes the key. It changes only when a shard is
#: used for the first time: at most ``SHARDS`` times in a ledger's life.
INDEX = SHARDS


def shard_of(run_id: str) -> int:
    """The shard a run's seals are chained in (stable across processes and machines)."""
    return zlib.crc32(run_id.encode("utf-8")) % SHARDS


def shard_genesis(shard: int) -> str:
    """The head of a shard's chain before its first seal (also what the migration writes)."""
    return f"effectflow-shard-genesis/{shard}"


def shard_link(prev: str, *, shard: int, seq: int, seal_hash: str, key: bytes | None) -> str:
    """A shard chain's head after the seal at ``seq``: the previous head and that seal's hash."""
    return hashes._hash(key, f"{prev}\n{shard}\n{seq}\n{seal_hash}")


def shards_of(pending: Iterable[list[Any]]) -> list[int]:
    """The shards a transaction's seals fall in, in the order their rows are locked (sorted: two
    transactions lock shards in one order, so they never deadlock)."""
    return sorted({shard_of(values[0]) for values in pending})


def shard_heads_read(
    shards: list[int], rows: Iterable[tuple[int, int, str]]
) -> dict[int, tuple[int, str]]:
    """The ``(n, head)`` of each of ``shards`` from its ``audit_shards`` rows.

    Raises:
        errors.LedgerFileError: a shard's row is gone: the ledger was edited outside effectflow.
            Nothing is written (a chain restarted here would hide what was removed).
    """
    heads = {int(shard): (int(n), str(head)) for shard, n, head in rows}
    for shard in shards:
        if shard not in heads:
            raise errors.LedgerFileError(
                f"the ledger's audit shard {shard} has no head row: it was edited outside "
                "effectflow, so nothing more is written to it; run `effectflow audit verify`"
            )
    return heads


def chain_shards(
    pending: list[list[Any]], heads: Mapping[int, tuple[int, str]], key: bytes | None
) -> tuple[list[list[Any]], list[tuple[int, str, int]]]:
    """Give each pending seal its place in its shard's chain, in the order the transaction wrote
    them: returns the ``seals`` rows (the values with ``shard`` and ``shard_seq``) and each
    shard's new ``(n, head, shard)``. ``heads`` is each shard's ``(n, head)`` read under lock."""
    moved: dict[int, tuple[int, str]] = {}
    rows = []
    for values in pending:
        shard = shard_of(values[0])
        n, head = moved.get(shard) or heads[shard]
        n += 1
        head = shard_link(head, shard=shard, seq=n, seal_hash=values[7], key=key)
        rows.append([*values, shard, n])
        moved[shard] = (n, head)
    return rows, [(n, head, shard) for shard, (n, head) in sorted(moved.items())]


def index_genesis() -> str:
    """The index row's head before any shard is used (also what the migration writes)."""
    return "effectflow-shard-index/"


def index_head(used: Iterable[int], key: bytes | None) -> str:
    """The index row's head over the set of used shards."""
    return hashes._hash(key, "effectflow-shard-index\n" + ",".join(str(s) for s in sorted(used)))


def first_uses(heads: Mapping[int, tuple[int, str]], shards: Iterable[int]) -> bool:
    """Whether this transaction is the first to seal in one of ``shards`` (the index must move)."""
    return any(heads[s][0] == 0 for s in shards)


def index_row(used: Iterable[int], key: bytes | None) -> tuple[int, str, int]:
    """The index row's new ``(n, head, shard)``, for ``used`` (read under the index row's lock,
    plus the transaction's own shards)."""
    found = set(used)
    return len(found), index_head(found, key), INDEX
