"""Tools for the guarded-call tests, and a host process that makes one guarded call.

The provider is a file of JSON lines, one per effect it committed (its own record, shared by the
processes of a test). ``python guard_app.py LEDGER PROVIDER TOOL SCOPE CALL_ID [--kill]`` makes one
guarded call as a host would; with ``--kill`` the process SIGKILLs itself right after the
provider committed, before the outcome is recorded.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import effectflow as ef
from effectflow import testing

#: Where the provider keeps its records (set by the test or the script's argument).
PROVIDER = {"file": ""}


def records() -> list[dict[str, Any]]:
    """What the provider committed, in order."""
    path = Path(PROVIDER["file"])
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def _commit(kind: str, key: str, **fields: Any) -> dict[str, Any]:
    record = {"id": f"{kind}_{len(records()) + 1}", "key": key, **fields}
    with Path(PROVIDER["file"]).open("a") as fh:
        fh.write(json.dumps(record) + "\n")
    return record


@ef.tool("gd_find", effect="read")
def find(*, idempotency_key: str) -> ef.Lookup:
    for record in records():
        if record["key"] == idempotency_key:
            return ef.Lookup.confirmed(external_effect_id=record["id"], result=record)
    return ef.Lookup.not_committed()


@ef.tool(
    "gd_send",
    effect="external_write",
    confirm=find,
    effect_id="id",
    settles_within=0,  # a local append lands inside the call or never
)
def send(to: str, text: str, *, idempotency_key: str) -> dict[str, Any]:
    """Not idempotent; each send is tagged with its key, so the lookup can find it."""
    time.sleep(float(os.environ.get("GD_SLOW", "0")))
    return _commit("msg", idempotency_key, to=to, text=text)


@ef.tool("gd_untagged", effect="external_write", effect_id="id")
def untagged(to: str, *, idempotency_key: str) -> dict[str, Any]:
    """Not idempotent and not searchable: after a lost answer only a person can tell."""
    _commit("raw", idempotency_key, to=to)
    raise ef.OutcomeUnknown("the answer was lost")


@ef.tool("gd_search", effect="external_write", effect_id="id", each_call_new=True)
def search_web(query: str, *, idempotency_key: str) -> dict[str, Any]:
    """A tool whose repeats are normal: every call id is a new request."""
    return _commit("q", idempotency_key, query=query)


@ef.tool(
    "gd_refund",
    effect="financial_write",
    idempotency=ef.Idempotency(supported=True),
    effect_id="id",
)
def refund(order: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
    """Moves money: a person approves each call first. The provider deduplicates by key."""
    for record in records():
        if record["key"] == idempotency_key:
            return {**record, "replayed": True}
    return _commit("rf", idempotency_key, order=order, amount=amount)


TOOLS = {t.name: t for t in (send, untagged, search_web, refund)}


if __name__ == "__main__":
    ledger, PROVIDER["file"], tool, scope, call_id = sys.argv[1:6]
    faults = testing.FaultPlan.kill_at("after_call_before_record") if "--kill" in sys.argv else None
    with ef.Runtime(ledger, faults=faults) as rt:
        done = rt.guard(
            TOOLS[tool], {"to": "a@example.com", "text": "hi"}, scope=scope, call_id=call_id
        )
        print(json.dumps(done.value))
