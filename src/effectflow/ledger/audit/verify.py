"""Verification: recompute every run's two chains, compare its rows with their last seals, replay
the shards' chains, and report what is left of runs that are gone.

Without the key a keyed hash cannot be checked (``verify`` says so once, the caller does); with the
key a plain hash is a finding (written without it). A ledger upgraded from before version 7 has
runs without seals, and one from before version 8 seals outside the shards: each is excused only
as far as the migrations' times say it is older.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from effectflow.ledger.audit import hashes, material, purge, replay, rows, shards

#: The tables whose rows name their run (``_orphans`` reads each for runs that are gone).
_RUN_TABLES = ("audit", "seals", "steps", "effects", "attempts", "approvals", "operations")


def _check_hash(
    problems: list[material.Problem],
    rid: str,
    key: bytes | None,
    hash_: str,
    expected: tuple[str, str | None],
    where: int | None,
    what: str,
) -> None:
    """Compare a stored hash with what it should be, ``expected`` plain and keyed."""
    expected_plain, expected_keyed = expected
    if hash_.startswith(hashes.KEYED):
        if key is None:
            return  # keyed: verifiable with the key only (said once, by the caller)
        if hash_ != expected_keyed:
            problems.append(material.Problem(rid, where, f"{what} does not match its keyed hash"))
    elif key is not None:
        problems.append(material.Problem(rid, where, f"{what} was written without the audit key"))
    elif hash_ != expected_plain:
        problems.append(material.Problem(rid, where, f"{what} does not match its hash (edited)"))


def _check_events(
    m: material.Material, key: bytes | None, problems: list[material.Problem]
) -> None:
    """The run's event chain, event by event, and against the head its run records."""
    rid = m.run.run_id
    prev = hashes.genesis(rid)
    for event in m.events:
        if event.prev_hash != prev:
            problems.append(
                material.Problem(rid, event.seq, "prev_hash does not match the previous event")
            )
        fields = {
            "run_id": event.run_id,
            "step_id": event.step_id,
            "effect_id": event.effect_id,
            "kind": event.kind,
            "actor": event.actor,
            "detail": event.detail,
            "at": event.at,
        }
        expected = (
            hashes.event_hash(event.prev_hash, **fields),
            None if key is None else hashes.event_hash(event.prev_hash, **fields, key=key),
        )
        _check_hash(problems, rid, key, event.hash, expected, event.seq, "event content")
        prev = event.hash
    if len(m.events) != m.audit_count or prev != m.audit_head:
        problems.append(
            material.Problem(
                rid,
                None,
                f"event chain has {len(m.events)} events ending in {prev[:20]}, the run records "
                f"{m.audit_count} ending in {m.audit_head[:20]} (events were removed or added)",
            )
        )


def _check_seals(
    m: material.Material,
    key: bytes | None,
    shards_since: float | None,
    problems: list[material.Problem],
) -> dict[str, tuple[str, bool]]:
    """The run's seal chain, seal by seal and against its recorded head; returns each row's last
    sealed digest, and whether it is one of version 8 (digested by columns; a seal of version 8
    has its place in a shard's chain)."""
    rid = m.run.run_id
    prev = hashes.seal_genesis(rid)
    last: dict[str, tuple[str, bool]] = {}
    for i, seal in enumerate(m.seals, 1):
        where = -seal["n"]  # seals are named by negative numbers beside event seqs
        if seal["n"] != i or seal["prev_hash"] != prev:
            problems.append(material.Problem(rid, where, f"seal {seal['n']} is out of its chain"))
        if seal["shard_seq"] is None and shards_since is not None and seal["at"] > shards_since + 1:
            problems.append(
                material.Problem(rid, where, f"seal {seal['n']} is outside its shard's chain")
            )
        elif seal["shard_seq"] is not None and seal["shard"] != shards.shard_of(rid):
            problems.append(
                material.Problem(rid, where, f"seal {seal['n']} is in another run's shard")
            )
        fields = {
            "run_id": rid,
            "n": seal["n"],
            "rows_json": seal["rows_json"],
            "audit_head": seal["audit_head"],
            "audit_count": seal["audit_count"],
            "at": seal["at"],
        }
        expected = (
            hashes.seal_hash(seal["prev_hash"], **fields),
            None if key is None else hashes.seal_hash(seal["prev_hash"], **fields, key=key),
        )
        _check_hash(problems, rid, key, seal["hash"], expected, where, f"seal {seal['n']}")
        prev = seal["hash"]
        by_columns = seal["shard_seq"] is not None
        last.update((name, (digest, by_columns)) for name, digest in seal["rows"].items())
    if len(m.seals) != m.seal_count or prev != m.seal_head:
        problems.append(
            material.Problem(
                rid,
                None,
                f"seal chain has {len(m.seals)} seals, the run records {m.seal_count} "
                "(seals were removed or added)",
            )
        )
    return last


def _check_rows(
    m: material.Material, last: dict[str, tuple[str, bool]], problems: list[material.Problem]
) -> None:
    """The run's rows as the tables hold them today against their last seals."""
    rid = m.run.run_id
    final = m.seals[-1]
    if (final["audit_count"], final["audit_head"]) != (m.audit_count, m.audit_head):
        problems.append(
            material.Problem(
                rid,
                None,
                f"the last seal records {final['audit_count']} events ending in "
                f"{final['audit_head'][:20]}, the run {m.audit_count} ending in "
                f"{m.audit_head[:20]} (events were cut or added)",
            )
        )
    for name, record in m.rows.items():
        table = name.split(":", 1)[0]
        sealed = last.get(name)
        if sealed is None:
            problems.append(
                material.Problem(rid, None, f"{name} was written outside the ledger's writes")
            )
        elif rows.digest_of(table, record, sealed[1]) != sealed[0]:
            problems.append(
                material.Problem(rid, None, f"{name} differs from what was written (edited)")
            )
    for name in sorted(set(last) - set(m.rows) - m.purgeable):
        problems.append(material.Problem(rid, None, f"{name} was written and is gone (deleted)"))


def verify_run(
    m: material.Material,
    key: bytes | None,
    *,
    sealed_since: float | None,
    shards_since: float | None,
) -> list[material.Problem]:
    """Recompute a run's two chains and compare its rows with their last seals. ``sealed_since``:
    when a ledger written before version 7 began writing seals (None: sealed from its first run);
    ``shards_since``: when it began chaining them in shards (version 8)."""
    problems: list[material.Problem] = []
    _check_events(m, key, problems)
    if not m.seals:
        # Excused only as a run of a ledger that was written before seals (version 7): the ledger
        # was upgraded (``sealed_since`` is not None), the run says it is older (a second of
        # slack: SQLite records when a migration ran in whole seconds), and it has the events
        # every run has had since version 1. A run without seals in a ledger sealed from its
        # first run, or without any event, is not one.
        legacy = (
            sealed_since is not None and m.run.created_at <= sealed_since + 1 and m.events != []
        )
        if not legacy:
            problems.append(
                material.Problem(m.run.run_id, None, "the run has no seals (they were removed)")
            )
        return problems
    last = _check_seals(m, key, shards_since, problems)
    _check_rows(m, last, problems)
    return problems


def _applied_at(store: Any, version: int) -> float | None:
    found = store.audit_rows(store.SQL["migration_applied_at"], (version,))
    return float(found[0]["applied_at"]) if found else None


def verify(store: Any, run_id: str | None, key: bytes | None) -> list[material.Problem]:
    """Verify the ledger (or one run): both chains of every run, its rows against its seals, the
    shards' chains over every run's seals, and what is left of runs that are gone; all read in one
    snapshot (``store.audit_snapshot``), so a live ledger's concurrent writes are no findings."""
    with store.audit_snapshot():
        return _verify(store, run_id, key)


def _verify(store: Any, run_id: str | None, key: bytes | None) -> list[material.Problem]:
    from effectflow.ledger import audit_read  # it reads Materials: imports this package

    sealed_since = _applied_at(store, 7)
    first = _applied_at(store, 1)
    if sealed_since is not None and first is not None and first >= sealed_since - 1:
        sealed_since = None  # created at version 7 or later: every run has seals
    shards_since = _applied_at(store, 8)
    problems: list[material.Problem] = []
    # A sealed binding that is gone is excused only by a purge record (version 8); before, any.
    purged, unverified = (
        purge.purged_operations(store, key) if shards_since is not None else (None, [])
    )
    problems.extend(unverified)
    archived: set[str] = set()
    if _applied_at(store, replay.ARCHIVES_SINCE) is not None:
        from effectflow.ledger import archive  # it reads Materials: imports this package

        # A run that is gone is excused only by an archive record that verifies; its seals'
        # links stay in their shards' chains (replayed below).
        archived, unexcused = archive.check_records(store, key)
        problems.extend(
            unexcused if run_id is None else [p for p in unexcused if p.run_id == run_id]
        )
    found = 0
    for _, found_material in audit_read.materials_batched(store, run_id):
        found += 1
        m = found_material
        if purged is not None:
            rid = m.run.run_id
            m = dataclasses.replace(m, purgeable={n for n in m.purgeable if (rid, n) in purged})
        problems.extend(verify_run(m, key, sealed_since=sealed_since, shards_since=shards_since))
    if run_id is not None:
        if not found and run_id not in archived:
            problems.append(
                material.Problem(
                    run_id,
                    None,
                    "the run is not in the ledger (deleted, or never written: check the id)",
                )
            )
        if shards_since is not None:  # the run's own shard: a cut of its newest writes shows
            problems.extend(replay.replay_shards(store, key, only=shards.shard_of(run_id))[0])
    if run_id is None:
        problems.extend(replay.replay_shards(store, key)[0])
        problems.extend(_orphans(store))
    return problems


def _orphans(store: Any) -> list[material.Problem]:
    """Every row belongs to a run: one left of a run that is gone, or planted for a run that never
    was (a binding for a future operation id), is reported; so is a decision about an effect that
    is not in the ledger."""
    problems: list[material.Problem] = []
    for table in _RUN_TABLES:
        problems.extend(
            material.Problem(str(r["run_id"]), None, f"{table} rows of a run that does not exist")
            for r in store.audit_rows(store.SQL["orphan_runs"].format(table=table), ())
        )
    for r in store.audit_rows(store.SQL["orphan_decisions"], ()):
        problems.append(
            material.Problem(
                "-",
                None,
                f"decision {r['decision_id']} is about effect "
                f"{r['effect_id']}, which does not exist",
            )
        )
    return problems
