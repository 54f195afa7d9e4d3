"""How a call's result or exception, or a lookup's answer, maps to an outcome, a step status and a
next action."""

from __future__ import annotations

import dataclasses
from typing import Any

from effectflow import digests, errors
from effectflow.contracts.lookup import Lookup
from effectflow.ledger import records
from effectflow.ledger.records import NextAction, Outcome, StepStatus
from effectflow.policies.decision import Situation
from effectflow.runtime.machine_io import Result

#: The error code of a lookup whose "not found" was no proof: the call may still land.
NOT_FOUND_MAY_STILL_LAND = "not_found_may_still_land"

#: Exceptions that prove nothing was sent.
_NOTHING_SENT = (errors.NotCommitted, ConnectionRefusedError)


def classify(result: Result) -> tuple[Outcome, Situation]:
    """Only a tool can prove nothing happened; anything else after sending is unknown
    (docs/concepts.md#what-a-tool-tells-the-runtime)."""
    exc = result.error
    if exc is None:
        return Outcome.COMMITTED, Situation.CONFIRMED
    if isinstance(exc, _NOTHING_SENT):
        return Outcome.NOT_COMMITTED, Situation.NOT_COMMITTED
    if isinstance(exc, errors.Rejected | errors.IdempotencyConflict):
        return Outcome.REJECTED, Situation.REJECTED
    if isinstance(exc, errors.Conflict) or getattr(exc, "status", None) == 412:
        # A precondition failure (ef.Conflict, or a provider's 412 Precondition Failed) proves the
        # write was refused before it applied.
        return Outcome.CONFLICT, Situation.CONFLICT
    return Outcome.UNKNOWN, Situation.IN_DOUBT


def status_of(situation: Situation) -> StepStatus:
    return {
        Situation.CONFIRMED: StepStatus.CONFIRMED,
        Situation.NOT_COMMITTED: StepStatus.NOT_COMMITTED,
        Situation.REJECTED: StepStatus.REJECTED,
        Situation.CONFLICT: StepStatus.CONFLICT,
    }.get(situation, StepStatus.UNKNOWN)


def next_action_of(situation: Situation) -> NextAction:
    return {
        Situation.NOT_COMMITTED: NextAction.EXECUTE,
        Situation.REJECTED: NextAction.NONE,
        Situation.CONFLICT: NextAction.EXECUTE,
    }.get(situation, NextAction.RECONCILE)


def lookup_answer(result: Result) -> Lookup:
    if result.error is not None:
        return Lookup.unknown(reason=f"the lookup failed: {error_of(result.error)['message']}")
    value = result.value
    if isinstance(value, Lookup):
        return value
    return Lookup.unknown(
        reason=f"the lookup returned {type(value).__name__}, not an ef.Lookup; fix the lookup tool"
    )


def error_of(exc: BaseException) -> dict[str, Any]:
    data: dict[str, Any] = {
        "type": type(exc).__name__,
        "message": digests.recordable_text(str(exc) or type(exc).__name__),
    }
    code = getattr(exc, "code", None)
    if isinstance(code, str):
        data["code"] = code
    evidence = getattr(exc, "evidence", None)
    if isinstance(evidence, dict) and evidence:
        try:
            data["evidence"] = digests.to_jsonable(evidence)
        except errors.ArgumentError:
            data["evidence"] = {"repr": repr(evidence)}
    return data


def lost_in_flight(attempt: records.AttemptRecord, now: float) -> records.AttemptRecord:
    """An attempt a dead process left open: its outcome is unknown, never assumed."""
    return dataclasses.replace(
        attempt,
        ended_at=now,
        outcome=Outcome.UNKNOWN,
        error={"code": "process_lost", "message": "the process died during the call"},
    )
