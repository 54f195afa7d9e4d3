"""A person's "no" given through the SDK, recorded in the ledger too.

``RunState.reject`` never reaches the tool: the SDK sends its rejection to the model and calls
nothing, so the ledger would go on listing the request as waiting for an approval
(``rt.attention()``), where someone could still approve it. ``reject`` declines it in both
places at once. (A later call of the same request in the conversation declines it in the ledger
as well, from the SDK's record; ``reject`` does not wait for one.)
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from agents import RunState, ToolApprovalItem

from effectflow import errors
from effectflow.contrib.openai_agents import calls
from effectflow.runtime import approvals
from effectflow.runtime import guard as guard_mod

if TYPE_CHECKING:
    from effectflow.runtime.runtime import Runtime


def reject(
    rt: Runtime,
    state: RunState[Any],
    item: ToolApprovalItem,
    *,
    scope: str,
    by: str,
    reason: str,
) -> None:
    """Decline ``item`` in the SDK (``state.reject``, with ``reason`` as what the model is told)
    and its request in the ledger (``rt.reject``): it is never made.

    Args:
        rt: The runtime of the guarded tools.
        state: The interrupted run's state.
        item: One of its interruptions.
        scope: The conversation the tools were given (``effectflow_tools(scope=...)``).
        by: Who declines (the audit log records it).
        reason: Why; the model is told it.
    """
    state.reject(item, rejection_message=reason)
    call_id = item.call_id
    if not call_id:
        return
    ledger_scope = f"{calls.SCOPE_PREFIX}:{scope}"
    for run in rt.runs(scope=ledger_scope, status="paused", limit=10_000):
        waits = (run.error or {}).get("code") == approvals.APPROVAL_REQUIRED
        if waits and calls.split_call_id(str(run.input.get("call_id", "")))[0] == call_id:
            with contextlib.suppress(errors.StaleState):  # answered meanwhile
                rt.reject(run.run_id, guard_mod.STEP_ID, by=by, reason=reason)
