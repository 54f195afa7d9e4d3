"""Tools for the redaction probe (``test_redaction_probe.py``), and a host process that makes one
redacted guarded call.

The provider is a file of JSON lines, one per effect it committed, the token it was sent included:
its own record of what was sent, shared by the processes of a test. ``rp_pay`` drops its token
from what the ledger records; the provider deduplicates by idempotency key, so a retry with the
original key is the same payment.

``python redaction_probe_app.py LEDGER PROVIDER SCOPE CALL_ID TOKEN [--kill POINT] [--tool T]``
makes one guarded call of ``rp_pay`` (``--tool refund``: ``rp_refund``, which needs an approval)
as a host would and prints one JSON line: ``{"value": ...}`` or ``{"error": ...}``; with
``--kill`` the process SIGKILLs itself at that fault point (``after_intent``,
``after_call_before_record``); with ``--workflow`` the call is the step of an ``rp_checkout``
run instead (run id CALL_ID, the token in its vault). ``effectflow recover --app`` this file
registers the tools in a process that never had the token (a workflow's, given ``RP_VAULT``).
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

#: Where the provider keeps its records (the ``RP_PROVIDER`` variable, or the script's argument).
PROVIDER = {"file": os.environ.get("RP_PROVIDER", "")}
#: Seconds the provider takes before it commits (widens the window of two hosts at once).
SLOW = {"seconds": float(os.environ.get("RP_SLOW", "0"))}

FAST = ef.RetryPolicy(max_attempts=2, max_lookups=1, initial_backoff=0.001, max_backoff=0.01)


def records() -> list[dict[str, Any]]:
    """What the provider committed, in order."""
    path = Path(PROVIDER["file"])
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


@ef.tool(
    "rp_pay",
    effect="external_write",
    idempotency=ef.Idempotency(supported=True),
    effect_id="id",
    retry=FAST,
    redact=ef.Redact(drop=["token"]),
)
def pay(amount: int, token: str, *, idempotency_key: str) -> dict[str, Any]:
    """Charges with ``token``; a second call with the same key answers the first charge (the
    provider's idempotency), so a repeated effect shows as a second line only if the key differs.
    """
    return _charge(amount, token, idempotency_key)


@ef.tool(
    "rp_refund",
    effect="financial_write",
    idempotency=ef.Idempotency(supported=True),
    effect_id="id",
    retry=FAST,
    redact=ef.Redact(drop=["token"]),
)
def refund(amount: int, token: str, *, idempotency_key: str) -> dict[str, Any]:
    """Moves money: a person approves each call first; otherwise ``pay``."""
    return _charge(amount, token, idempotency_key)


TOOLS = {"pay": pay, "refund": refund}


@ef.workflow("rp_checkout")
def checkout(ctx: ef.Context, amount: int) -> Any:
    """A workflow that charges with a token from its vault (``RP_VAULT``: every process of the
    application has it), never from its input, which is not redacted."""
    return ctx.call("pay", pay, amount=amount, token=os.environ["RP_VAULT"])


def _charge(amount: int, token: str, idempotency_key: str) -> dict[str, Any]:
    if SLOW["seconds"]:
        time.sleep(SLOW["seconds"])
    with Path(PROVIDER["file"]).open("a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        lines = [json.loads(line) for line in fh.read().splitlines() if line]
        for line in lines:
            if line["key"] == idempotency_key:
                return {"id": line["id"], "amount": line["amount"]}
        record = {"id": f"pay_{len(lines) + 1}", "key": idempotency_key}
        record.update(amount=amount, token=token)
        fh.write(json.dumps(record) + "\n")
        fh.flush()
    return {"id": record["id"], "amount": amount}


def main(argv: list[str]) -> None:
    ledger, PROVIDER["file"], scope, call_id, token = argv[:5]
    faults = None
    if "--kill" in argv:
        faults = testing.FaultPlan.kill_at(argv[argv.index("--kill") + 1])
    tool = TOOLS[argv[argv.index("--tool") + 1] if "--tool" in argv else "pay"]
    with ef.Runtime(ledger, faults=faults) as rt:
        if "--workflow" in argv:  # the call as a workflow's step, run id CALL_ID, token vaulted
            os.environ["RP_VAULT"] = token
            print(json.dumps({"status": rt.start(checkout, run_id=call_id, amount=7).status}))
            return
        try:
            done = rt.guard(tool, {"amount": 7, "token": token}, scope=scope, call_id=call_id)
        except ef.NeedsPerson as asked:
            print(json.dumps({"error": "NeedsPerson", "run_id": asked.run_id, "kind": asked.kind}))
            return
        except ef.EffectflowError as exc:
            print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
            return
        print(json.dumps({"value": done.value, "deduplicated": done.deduplicated}))


if __name__ == "__main__":
    main(sys.argv[1:])
