"""The simulated world the host-adapter tests (Pydantic AI, LangGraph, the Agents SDK, DBOS,
Temporal) share: a provider that records each committed write as one JSON line in a file, and the
tools over it (a lookup by key, a send, a send whose answer is lost, an unsearchable send, a
refund the provider deduplicates).

Tools live in one process-wide registry by name, and the five modules run in one process: each
declares its own set under its own prefix (``declare("pai", provider)`` gives ``pai_send``, ...),
so their names never clash and each test module keeps the names its assertions spell.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import effectflow as ef


class Provider:
    """The provider's own record: a file (set per test by the module's fixture), one JSON line per
    committed write. It is what the tests assert against, not the ledger."""

    def __init__(self) -> None:
        self.file = Path("unset")

    def records(self) -> list[dict[str, Any]]:
        """What the provider committed, in order."""
        if not self.file.exists():
            return []
        return [json.loads(line) for line in self.file.read_text().splitlines()]

    def commit(self, kind: str, key: str, **fields: Any) -> dict[str, Any]:
        """Record one write under the call's key; its id counts the writes so far."""
        record = {"id": f"{kind}_{len(self.records()) + 1}", "key": key, **fields}
        with self.file.open("a") as fh:
            fh.write(json.dumps(record) + "\n")
        return record


@dataclass(frozen=True)
class Tools:
    """One module's tools over its provider."""

    find: ef.Tool[..., Any]
    send: ef.Tool[..., Any]
    send_lost: ef.Tool[..., Any]
    send_untagged: ef.Tool[..., Any]
    refund: ef.Tool[..., Any]


def declare(
    prefix: str, provider: Provider, *, refund_kind: str = "rf", mark_replays: bool = True
) -> Tools:
    """The tools under ``prefix`` (``<prefix>_find``, ``_send``, ``_lost``, ``_untagged``,
    ``_refund``). ``refund_kind`` and ``mark_replays`` keep what the durable-host modules' provider
    records: their refund ids read ``refund_<n>`` and a replayed refund returns the record as it
    is, while the agent modules' say ``rf_<n>`` and mark a replay ``"replayed": True``."""

    @ef.tool(f"{prefix}_find", effect="read")
    def find(*, idempotency_key: str) -> ef.Lookup:
        """The lookup: the provider's record searched by the call's key."""
        for record in provider.records():
            if record["key"] == idempotency_key:
                return ef.Lookup.confirmed(external_effect_id=record["id"], result=record)
        return ef.Lookup.not_committed()

    @ef.tool(
        f"{prefix}_send", effect="external_write", confirm=find, effect_id="id", settles_within=0
    )
    def send(to: str, text: str, *, idempotency_key: str) -> dict[str, Any]:
        """Send a message."""
        return provider.commit("msg", idempotency_key, to=to, text=text)

    @ef.tool(
        f"{prefix}_lost", effect="external_write", confirm=find, effect_id="id", settles_within=0
    )
    def send_lost(to: str, text: str, *, idempotency_key: str) -> dict[str, Any]:
        """Send a message; the provider commits it and the answer is lost on the way back."""
        provider.commit("msg", idempotency_key, to=to, text=text)
        raise ef.OutcomeUnknown("connection reset after the request was sent")

    @ef.tool(f"{prefix}_untagged", effect="external_write", effect_id="id")
    def send_untagged(to: str, text: str, *, idempotency_key: str) -> dict[str, Any]:
        """Not searchable: after a lost answer only a person can tell."""
        provider.commit("raw", idempotency_key, to=to, text=text)
        raise ef.OutcomeUnknown("the answer was lost")

    @ef.tool(
        f"{prefix}_refund",
        effect="financial_write",
        idempotency=ef.Idempotency(supported=True),
        effect_id="id",
    )
    def refund(order: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
        """Refund an order. The provider deduplicates by key."""
        for record in provider.records():
            if record["key"] == idempotency_key:
                return {**record, "replayed": True} if mark_replays else record
        return provider.commit(refund_kind, idempotency_key, order=order, amount=amount)

    return Tools(find, send, send_lost, send_untagged, refund)
