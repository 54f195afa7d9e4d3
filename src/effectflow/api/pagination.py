"""Opaque cursors over runs (newest first) and effects (oldest first).

A cursor is the position after the last item of a page: its ``created_at`` and the ids already
given at exactly that instant, base64url-encoded JSON. Ids at the boundary instant make ties safe:
no item is given twice or skipped when several were created in the same clock tick.

The ledger lists runs with ``before=created_at`` (a strict bound) but effects only from the oldest,
with a limit; so an effects page reads from the start up to a horizon past the cursor, which costs
O(position) rows per page. A ``since`` bound on ``LedgerStore.effects`` would make it O(page).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Callable, Sequence
from typing import Any

from effectflow.api import problems
from effectflow.ledger import records
from effectflow.ledger.store import LedgerStore


def encode(kind: str, created_at: float, ids: Sequence[str]) -> str:
    """The cursor after an item created at ``created_at`` (with ``ids`` given at that instant)."""
    raw = json.dumps({"k": kind, "t": created_at, "ids": sorted(ids)}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode(kind: str, cursor: str) -> tuple[float, frozenset[str]]:
    """The position a cursor names.

    Raises:
        problems.Problem: a 400 for a cursor this API did not give out for this listing.
    """
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = json.loads(raw)
        t, ids = data["t"], data["ids"]
        valid = (
            data["k"] == kind
            and isinstance(t, int | float)
            and math.isfinite(t)
            and isinstance(ids, list)
            and all(isinstance(i, str) for i in ids)
        )
    except (ValueError, TypeError, KeyError, binascii.Error):
        valid = False
    if not valid:
        raise problems.invalid(f"cursor {cursor!r} is not one this listing gave out")
    return float(t), frozenset(ids)


def _after(
    page: list[Any], position: tuple[float, frozenset[str]] | None, key: Callable[[Any], str]
) -> tuple[float, list[str]]:
    last = page[-1].created_at
    ids = [key(item) for item in page if item.created_at == last]
    if position is not None and position[0] == last:
        ids.extend(position[1])
    return last, ids


def runs_page(
    store: LedgerStore,
    tenant: str,
    statuses: Sequence[str] | None,
    limit: int,
    cursor: str | None,
    scope: str | None = None,
    call_id: str | None = None,
) -> tuple[list[records.RunRecord], str | None]:
    """One page of a tenant's runs, newest first, and the cursor of the next page (or None);
    ``scope`` / ``call_id`` keep the guarded calls made under those host ids."""
    position = decode("runs", cursor) if cursor else None
    seen: frozenset[str] = frozenset()
    before = None
    if position is not None:
        before = math.nextafter(position[0], math.inf)  # created_at <= t: ties need their ids
        seen = position[1]
    fetched = store.list_runs(
        tenant=tenant,
        statuses=statuses,
        limit=limit + len(seen) + 1,
        before=before,
        scope=scope,
        call_id=call_id,
    )
    fresh = [r for r in fetched if r.run_id not in seen]
    page = fresh[:limit]
    if len(fresh) <= limit or not page:
        return page, None
    last, ids = _after(page, position, lambda r: r.run_id)
    return page, encode("runs", last, ids)


def effects_page(
    store: LedgerStore,
    tenant: str,
    run_id: str | None,
    statuses: Sequence[str] | None,
    limit: int,
    cursor: str | None,
) -> tuple[list[records.EffectRecord], str | None]:
    """One page of a tenant's effects, oldest first, and the cursor of the next page (or None)."""
    position = decode("effects", cursor) if cursor else None
    window = max(4 * (limit + 1), 64)
    while True:
        fetched = store.effects(tenant=tenant, run_id=run_id, statuses=statuses, limit=window)
        complete = len(fetched) < window
        # Rows are ordered by created_at only: every row older than the last one read is here,
        # but rows at the last instant may continue past the window.
        horizon = math.inf if complete else fetched[-1].created_at
        later = [
            e
            for e in fetched
            if e.created_at < horizon
            and (
                position is None
                or e.created_at > position[0]
                or (e.created_at == position[0] and e.effect_id not in position[1])
            )
        ]
        if complete or len(later) > limit:
            break
        window *= 4
    later.sort(key=lambda e: (e.created_at, e.effect_id))
    page = later[:limit]
    if len(later) <= limit or not page:
        return page, None
    last, ids = _after(page, position, lambda e: e.effect_id)
    return page, encode("effects", last, ids)
