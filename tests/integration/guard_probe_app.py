"""Tools for the guarded-call probe (``test_guard_probe.py``), and a host process that makes one
guarded call.

The provider is a file of JSON lines, one per effect it committed: its own record, shared by the
threads and processes of a test, appended under a file lock so concurrent writers never tear a
line. ``MODE`` (or the ``GP_MODE`` environment variable in a child) says what the untagged tool
does after committing: ``ok`` answers, ``lost`` loses the answer (the outcome is unknown and no
lookup can tell: only a person can).

``python guard_probe_app.py LEDGER PROVIDER TOOL SCOPE CALL_ID [--kill] [--known ID,ID]`` makes one
guarded call as a host would and prints one JSON line: ``{"value": ...}`` or ``{"error": ...}``;
with ``--kill`` the process SIGKILLs itself right after the provider committed, before the outcome
is recorded.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import effectflow as ef
from effectflow import testing

#: Where the provider keeps its records (set by the test, or the script's argument).
PROVIDER = {"file": ""}
#: What the untagged tool does after committing: ``ok`` or ``lost``.
MODE = {"untagged": os.environ.get("GP_MODE", "ok")}
#: Seconds the provider takes before it commits (widens races).
SLOW = {"seconds": float(os.environ.get("GP_SLOW", "0"))}

FAST = ef.RetryPolicy(max_attempts=2, max_lookups=1, initial_backoff=0.001, max_backoff=0.01)


def records() -> list[dict[str, Any]]:
    """What the provider committed, in order."""
    path = Path(PROVIDER["file"])
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def commit(kind: str, key: str, **fields: Any) -> dict[str, Any]:
    """Append one effect to the provider's record (under a file lock) and return it."""
    if SLOW["seconds"]:
        time.sleep(SLOW["seconds"])
    with Path(PROVIDER["file"]).open("a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        count = sum(1 for line in fh.read().splitlines() if line)
        record = {"id": f"{kind}_{count + 1}", "key": key, **fields}
        fh.write(json.dumps(record) + "\n")
        fh.flush()
    return record


@ef.tool("gp_find", effect="read")
def find(*, idempotency_key: str) -> ef.Lookup:
    for record in records():
        if record["key"] == idempotency_key:
            return ef.Lookup.confirmed(external_effect_id=record["id"], result=record)
    return ef.Lookup.not_committed()


@ef.tool(
    "gp_send",
    effect="external_write",
    confirm=find,
    effect_id="id",
    settles_within=0,  # a local append lands inside the call or never
    retry=FAST,
)
def send(to: str, text: Any, *, idempotency_key: str) -> dict[str, Any]:
    """Not idempotent; each send is tagged with its key, so the lookup can find it."""
    return commit("msg", idempotency_key, to=to, text=text)


@ef.tool("gp_untagged", effect="external_write", effect_id="id", retry=FAST)
def untagged(to: str, *, idempotency_key: str) -> dict[str, Any]:
    """Not idempotent and not searchable: after a lost answer only a person can tell."""
    record = commit("raw", idempotency_key, to=to)
    if MODE["untagged"] == "lost":
        raise ef.OutcomeUnknown("the answer was lost")
    return record


@ef.tool("gp_each", effect="external_write", effect_id="id", each_call_new=True, retry=FAST)
def each(query: str, *, idempotency_key: str) -> dict[str, Any]:
    """A tool whose repeats are normal: every call id is a new request. Untagged too: a lost
    answer goes to a person."""
    record = commit("q", idempotency_key, query=query)
    if MODE["untagged"] == "lost":
        raise ef.OutcomeUnknown("the answer was lost")
    return record


@ef.tool(
    "gp_refund",
    effect="financial_write",
    idempotency=ef.Idempotency(supported=True),
    effect_id="id",
    retry=FAST,
)
def refund(order: str, amount: int, *, idempotency_key: str) -> dict[str, Any]:
    """Moves money: a person approves each call first. The provider deduplicates by key."""
    for record in records():
        if record["key"] == idempotency_key:
            return {**record, "replayed": True}
    return commit("rf", idempotency_key, order=order, amount=amount)


@ef.tool(
    "gp_boom",
    effect="external_write",
    confirm=find,
    settles_within=0,
    retry=ef.RetryPolicy(max_attempts=2, max_lookups=3, initial_backoff=0.001, max_backoff=0.01),
)
def boom(when: str, *, idempotency_key: str) -> dict[str, Any]:
    """Raises a plain ``ValueError``: before anything is committed, or after."""
    if when == "after":
        commit("boom", idempotency_key, when=when)
    raise ValueError(f"the tool broke ({when})")


@ef.tool("gp_typed", effect="external_write", effect_id="id", retry=FAST)
def typed(value: Any, *, idempotency_key: str) -> dict[str, Any]:
    """Records the type of the value it was given (so a test sees what the tool received)."""
    return commit("ty", idempotency_key, type=type(value).__name__)


@ef.tool("gp_pure_boom", effect="pure")
def pure_boom(x: int) -> int:
    raise ZeroDivisionError(f"pure tool broke on {x}")


@ef.tool("gp_unrefund", effect="external_write", idempotency=ef.Idempotency(supported=True))
def unrefund(charge_id: str, *, idempotency_key: str) -> dict[str, Any]:
    """The compensation of a charge (it needs a person's approval: not automatic)."""
    return commit("undo", idempotency_key, charge_id=charge_id)


@ef.tool(
    "gp_charge",
    effect="external_write",
    idempotency=ef.Idempotency(supported=True),
    effect_id="id",
    reversible=True,
    compensation=ef.Compensation(unrefund, automatic=False, param="charge_id"),
)
def charge(amount: int, *, idempotency_key: str) -> dict[str, Any]:
    for record in records():
        if record["key"] == idempotency_key:
            return {**record, "replayed": True}
    return commit("ch", idempotency_key, amount=amount)


TOOLS = {t.name: t for t in (send, untagged, each, refund, boom, charge)}
ARGS: dict[str, dict[str, Any]] = {
    "gp_send": {"to": "a@example.com", "text": "hi"},
    "gp_untagged": {"to": "b"},
    "gp_each": {"query": "x"},
}


def main(argv: list[str]) -> None:
    ledger, PROVIDER["file"], tool, scope, call_id = argv[:5]
    known: list[str] = []
    if "--known" in argv:
        known = argv[argv.index("--known") + 1].split(",")
    faults = testing.FaultPlan.kill_at("after_call_before_record") if "--kill" in argv else None
    with ef.Runtime(ledger, faults=faults) as rt:
        try:
            done = rt.guard(
                TOOLS[tool], ARGS[tool], scope=scope, call_id=call_id, known_call_ids=known
            )
        except ef.NeedsPerson as asked:
            print(json.dumps({"error": "NeedsPerson", "run_id": asked.run_id, "kind": asked.kind}))
            return
        except ef.EffectflowError as exc:
            print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
            return
        print(json.dumps({"value": done.value, "deduplicated": done.deduplicated}))


if __name__ == "__main__":
    main(sys.argv[1:])
