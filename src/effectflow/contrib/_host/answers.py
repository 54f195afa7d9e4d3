"""What the model is told about a guarded call, the same under every host.

A host returns this body as its tool's answer (a dict, or its JSON text): ``status`` says what
became of the call, ``happened`` whether its effect took place (``None``: nobody knows yet), and
``result``, ``error`` or ``message`` the rest. Every adapter reads its own earlier answers back
with ``shows_result``: a call whose answer showed its result, repeated, is a new request
(docs/concepts.md#regenerated-calls).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from effectflow import errors
from effectflow.ledger.records import RunStatus, StepStatus
from effectflow.runtime import approvals
from effectflow.runtime import guard as guard_mod

if TYPE_CHECKING:
    from effectflow.contracts.tool import Tool
    from effectflow.runtime.guard import Guarded
    from effectflow.runtime.runtime import Runtime

#: What the model is told about a call the ledger answered for an earlier tool-call id.
ALREADY_DONE = (
    "this was already done earlier in this conversation (the same tool with the same "
    "arguments); it was not done again; this is its result"
)
#: What the model is told about a call a person declined.
DECLINED = "a person declined this call; it was not done; do not repeat it"
#: What the model is told about a call whose run an operator cancelled before it was made.
CANCELLED = "this call was cancelled by an operator; it was not done; do not repeat it"
#: The errors answered ``refused`` by default (the call was not made: the request is wrong).
REFUSED: tuple[type[errors.EffectflowError], ...] = (
    errors.IdempotencyConflict,
    errors.ArgumentError,
)


def done(guarded: Guarded) -> dict[str, Any]:
    """A call the ledger answered with its result (``already_done``: for an earlier id)."""
    if guarded.deduplicated:
        return {"status": "already_done", "happened": True, "result": guarded.value,
                "message": ALREADY_DONE}  # fmt: skip
    return {"status": "done", "happened": True, "result": guarded.value}


def waiting(asked: errors.NeedsPerson) -> dict[str, Any]:
    """A call that waits for a person, when the host goes on instead of pausing for one."""
    status = "waiting_for_approval" if asked.kind == "approval" else "unknown"
    return {"status": status, "happened": None, "message": asked.for_model,
            "effect_id": asked.effect_id}  # fmt: skip


def failure(
    rt: Runtime,
    tool: Tool[..., Any],
    exc: errors.EffectflowError,
    *,
    refused: tuple[type[errors.EffectflowError], ...] = REFUSED,
    unknown_otherwise: bool = False,
) -> dict[str, Any]:
    """A guarded call that ended without a result, phrased for the model (as the agent loop
    phrases it).

    Args:
        rt: The runtime (a decline's reason and a cancelled run are read from its ledger).
        tool: The tool called (a read that failed did nothing).
        exc: What the guard raised.
        refused: The errors answered ``refused``: the host's own (one that answers an
            ``IdempotencyConflict`` itself leaves it out).
        unknown_otherwise: An error no row names is answered ``unknown`` (a host whose tool must
            always answer) instead of raised.

    Raises:
        errors.EffectflowError: ``exc``, when no row names it and ``unknown_otherwise`` is False.
    """
    declined = declined_reason(rt, exc) if isinstance(exc, errors.StepRejected) else None
    if declined is not None:
        return {"status": "declined", "happened": False, "error": DECLINED,
                "reason": declined}  # fmt: skip
    if isinstance(exc, errors.StepRejected):
        return {"status": "rejected", "happened": False, "error": exc.message}
    if isinstance(exc, errors.RetryBudgetExhausted):
        return {"status": "not_committed", "happened": False, "error": exc.message}
    if isinstance(exc, refused):
        return {"status": "refused", "happened": False, "error": exc.message}
    run_id = getattr(exc, "run_id", None)
    if run_id is not None and rt.run(run_id).status is RunStatus.CANCELLED:
        return {"status": "cancelled", "happened": False, "error": CANCELLED}
    if isinstance(exc, errors.StepFailed) and not tool.contract.effect.writes:
        return {"status": "failed", "happened": False, "error": exc.message}
    if isinstance(exc, errors.StepFailed) or unknown_otherwise:
        return {"status": "unknown", "happened": None, "message": guard_mod.MAY_HAVE_HAPPENED}
    raise exc


def declined_reason(rt: Runtime, exc: errors.StepRejected) -> str | None:
    """The person's reason, when the call was declined (``rt.reject``) rather than refused by the
    provider; None otherwise."""
    if exc.run_id is None:
        return None
    step = next((s for s in rt.steps(exc.run_id) if s.step_id == exc.step_id), None)
    if step is None or step.status is not StepStatus.REJECTED:
        return None
    error = step.error or {}
    return str(error.get("reason")) if error.get("code") == approvals.APPROVAL_DECLINED else None


def shows_result(content: Any) -> bool:
    """Whether a tool's answer shows the call's result: effectflow's body says whether it
    happened (as JSON text or as the dict itself); another tool's answer is its result. None is
    no answer (the turn was lost)."""
    if content is None:
        return False
    if isinstance(content, str):
        try:
            content = json.loads(content)
        except ValueError:
            return True
    if isinstance(content, Mapping) and "happened" in content:
        return content["happened"] is True
    return True


def as_json(body: Mapping[str, Any]) -> str:
    """The body as the JSON text a host passes to the model (keys sorted: the same bytes for the
    same answer)."""
    return json.dumps(body, sort_keys=True, default=str)
