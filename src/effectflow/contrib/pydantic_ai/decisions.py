"""A person's decision about a guarded call, through Pydantic AI's deferred tools.

A call that needs a person raises ``ApprovalRequired`` with a payload (``payload``) naming the
effect, what waits and how to answer; the run ends with ``DeferredToolRequests``. The answer goes
back as ``ToolApproved`` with the decision as the call's metadata (``answer`` builds it): Pydantic
AI then calls the tool function again, which records the decision in the ledger (``rt.approve``,
``rt.reject`` or ``rt.resolve``, through ``apply``) and asks the guard once more. The shapes of a
decision are those of the LangGraph adapter's ``Command(resume=...)``:

- ``{"approved": True, "approver": "<who>"}`` / ``{"approved": False, "approver": "<who>",
  "reason": "..."}`` for an approval;
- ``{"committed": True | False, "evidence": {...}, "by": "<who>"}`` for an effect in doubt;
- ``{}`` (or no metadata): decided elsewhere (the console, the CLI); the guard is asked again.

A plain ``ToolDenied`` never reaches the tool: Pydantic AI answers the model itself, and the
capability records it as the decline (``Effectflow.before_model_request``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pydantic_ai import DeferredToolRequests, DeferredToolResults, ToolApproved

from effectflow import errors
from effectflow.contrib._host import decisions as host_decisions

if TYPE_CHECKING:
    from effectflow.runtime.runtime import Runtime

#: Marks a deferred call's metadata as effectflow's (an agent may defer calls of its own).
PAYLOAD_MARK = host_decisions.PAYLOAD_MARK
#: How a deferred call's metadata that cannot be recorded is refused (in the next deferral).
WORDING = host_decisions.Wording(
    not_a_mapping=(
        "answer effectflow's deferred call with a mapping as its metadata, e.g. {hint}; "
        "got {decision!r}"
    ),
    wrong_shape=(
        "answer effectflow's {kind} call with {hint}, or {{}} once it was decided elsewhere; "
        "got {decision!r}"
    ),
    unnamed=host_decisions.UNNAMED,
)
#: What the person sees in ``DeferredToolRequests.metadata[tool_call_id]``: what waits, and how
#: to answer it.
payload = host_decisions.payload


def answer(
    requests: DeferredToolRequests, decisions: Mapping[str, Mapping[str, Any]]
) -> DeferredToolResults:
    """The ``DeferredToolResults`` that resume a run with the person's decisions.

    Each effectflow call in ``decisions`` (keyed by tool-call id) is approved back into its tool
    with the decision as its metadata, where the tool records it in the ledger: an approval, a
    decline (``approved: False``: the tool is not called, the model is told a person said no) or
    a resolution alike. The ledger, not Pydantic AI's ``ToolDenied``, decides what happened.

    Raises:
        errors.ArgumentError: a tool-call id that is not one of effectflow's pending calls.
    """
    ours = {
        call_id
        for call_id, meta in requests.metadata.items()
        if isinstance(meta, Mapping) and meta.get(PAYLOAD_MARK)
    }
    pending = {c.tool_call_id for c in requests.approvals}
    unknown = sorted(set(decisions) - (ours & pending))
    if unknown:
        raise errors.ArgumentError(
            f"no effectflow call waits for a decision under tool-call id(s) {unknown}; pending: "
            f"{sorted(ours & pending)}"
        )
    return requests.build_results(
        approvals={call_id: ToolApproved() for call_id in decisions},
        metadata={call_id: dict(decision) for call_id, decision in decisions.items()},
    )


def apply(rt: Runtime, asked: errors.NeedsPerson, decision: Any, scope: str, call_id: str) -> None:
    """Record the person's decision (the approved call's metadata) in the ledger.

    ``None`` or ``{}`` means it was decided elsewhere: nothing to record, the guard is asked again.
    A decision someone else applied first (``StaleState``: also this very decision, applied by an
    earlier run of the tool that died before it answered) is not an error.

    Raises:
        errors.ArgumentError: the decision has the wrong shape or says nobody made it; nothing
            was recorded.
    """
    if not decision:
        return
    host_decisions.record(
        rt, host_decisions.Question.asked(asked, scope, call_id), decision, WORDING
    )
