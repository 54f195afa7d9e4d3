"""A guarded call's arguments when its tool redacts some (docs/arguments.md#guarded-calls).

The run of a guarded call records its arguments *redacted* in its input, beside the request
digest of the whole call, so a secret never reaches the ledger. The workflow that makes the call
needs the whole arguments, though, and only the host has them: ``rt.guard`` holds them in this
process, by request digest, while it starts, replays or settles the call's runs
(``held``), and the workflow takes them from there (``sent``).

A run continued without its host (a worker recovering it, a person's approval answered in another
process) has only the redacted form, which must never be sent (``without_host``): a call in doubt
is settled by its lookup, a call that is done returns its recorded result, and otherwise the run
pauses, waiting for the host's replay (``wait_for_host``), which continues it with the arguments.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from effectflow.ledger import records
from effectflow.ledger.records import NextAction, StepStatus
from effectflow.policies.decision import Action
from effectflow.runtime import lookup, machine_io
from effectflow.runtime import state as state_mod
from effectflow.runtime.port import Port

#: The error code of a guarded call's run paused until its host replays it.
NEEDS_HOST = "needs_host"

_LOCK = threading.Lock()
#: Request digest -> (the whole canonical arguments, how many callers hold them).
_HELD: dict[str, tuple[dict[str, Any], int]] = {}


@contextlib.contextmanager
def held(request_digest: str, arguments: dict[str, Any]) -> Iterator[None]:
    """The whole ``arguments`` of ``request_digest`` are known in this process meanwhile (they
    are the same for every run of that digest: the runs of one request)."""
    with _LOCK:
        _, count = _HELD.get(request_digest, (arguments, 0))
        _HELD[request_digest] = (arguments, count + 1)
    try:
        yield
    finally:
        with _LOCK:
            kept, count = _HELD[request_digest]
            if count <= 1:
                del _HELD[request_digest]
            else:
                _HELD[request_digest] = (kept, count - 1)


def sent(request_digest: str) -> dict[str, Any] | None:
    """The whole arguments of ``request_digest``, when a host in this process holds them."""
    with _LOCK:
        found = _HELD.get(request_digest)
    return None if found is None else dict(found[0])


def recorded_result(state: state_mod.RunState, step_id: str, request_digest: str) -> Any:
    """The result of the call when the run already confirmed it (its process stopped before the
    run ended), else ``NOT_DONE``."""
    step = state.steps.get(step_id)
    if (
        step is not None
        and step.status is StepStatus.CONFIRMED
        and step.request_digest == request_digest
        and (step.error or {}).get("code") != "result_not_recordable"
    ):
        return step.output
    return NOT_DONE


#: What ``recorded_result`` returns for a call that is not done.
NOT_DONE = object()


def without_host(
    port: Port, state: state_mod.RunState, step_id: str, request_digest: str
) -> machine_io.Machine:
    """The call's run continued without the whole arguments: a call in doubt is settled from its
    recorded request and key (its lookup, which needs no arguments), a confirmed call answers
    with its result; anything else waits for the host's replay (``wait_for_host``). Nothing is
    ever sent with the redacted arguments."""
    step = state.steps.get(step_id)
    if step is not None and step.status in records.IN_DOUBT_STATUSES:
        found = lookup.look_up_recorded(port, state, step)
        if found is not None:
            call, verdict = found
            if verdict.action is Action.LOOKUP:
                yield from lookup.settle(call, step, verdict)
    done = recorded_result(state, step_id, request_digest)
    if done is not NOT_DONE:
        state.seen.add(step_id)  # the run reached its one step, as a replay of it would
        return done
    return (yield from wait_for_host(port, state, step_id))


def wait_for_host(port: Port, state: state_mod.RunState, step_id: str) -> machine_io.Machine:
    """Pause the run until its host replays the call (the host holds the arguments): nothing is
    sent with the redacted ones. Always unwinds with ``machine_io.Suspend``."""
    reason = (
        "this guarded call's tool redacts some of its arguments, which the ledger therefore does "
        "not hold: only its host's replay (rt.guard with the same scope and call id) continues it"
    )
    now = port.clock()
    batch = state.batch()
    step = state.steps.get(step_id)
    if (
        step is not None
        and step.status is StepStatus.AWAITING_APPROVAL
        and any(
            a.request_digest == step.request_digest
            for a in port.store.approvals(state.run.run_id, step_id)
        )
    ):
        # Approved: the step waits for its host now, not for a person (the attention queue
        # lists it no more; the host's replay finds the approval and makes the call).
        step = records.evolve(
            step,
            next_action=NextAction.WAIT,
            error={"code": NEEDS_HOST, "message": reason},
            updated_at=now,
        )
        state.steps[step_id] = step
        batch.step(step)
    batch.run_changes.update(
        status=records.RunStatus.PAUSED,
        next_action=NextAction.WAIT,
        error={"code": NEEDS_HOST, "message": reason, "step_id": step_id},
        lease_owner=None,
        lease_expires_at=None,
    )
    batch.event("run_paused", now, step_id=step_id, reason=reason)
    yield machine_io.Commit(batch)
    raise machine_io.Suspend(step_id, reason)
