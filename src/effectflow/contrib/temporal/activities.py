"""The guard inside a Temporal activity: ``rt.guard`` under the activity's durable identity
(docs/concepts.md#the-guarded-call).

Temporal runs an activity at least once: an attempt whose completion never reached the server (the
worker died after the effect, the response was lost, the start-to-close timeout fired) is retried
under the same activity id, and the retry makes the call again. With ``guarded`` the attempt goes
through ``rt.guard`` with scope = ``temporal:<workflow id>:<run id>`` and call id = the activity
id, which every attempt of one scheduled activity shares: a retry reaches the same ledger run,
which answers with the recorded result or settles the call in doubt (by key, by lookup) instead of
making it again.

"Needs a person" ends the attempt with a non-retryable ``ApplicationError`` of type
``NEEDS_PERSON``, whose details are ids and phrases only: retrying cannot settle what only a
person can, and Temporal's retry policy would spend attempts (and could end the activity with a
generic failure) while nobody has decided. The workflow catches it, waits for a signal carrying
the person's decision, and runs ``decision_activity``, which applies the decision to the ledger and
completes the call from the ledger's record of it.

Heartbeats carry the ledger run id and a state name, never arguments or keys: heartbeat details
are stored in the workflow's history and shown to anyone who can read it.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

try:
    from temporalio import activity
    from temporalio.exceptions import ApplicationError
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the installed extras
    raise ModuleNotFoundError(
        "effectflow.contrib.temporal needs the 'temporal' extra: pip install 'effectflow[temporal]'",
        name=exc.name,
    ) from exc

from effectflow import errors
from effectflow.contracts.tool import Tool
from effectflow.contrib._host import decisions as host_decisions
from effectflow.runtime import guard as guard_mod

if TYPE_CHECKING:
    from effectflow.runtime.runtime import Runtime

#: The ``ApplicationError`` type of an attempt that waits for a person (non-retryable).
NEEDS_PERSON = "EffectflowNeedsPerson"
#: The ``ApplicationError`` type prefix of a definite failure (``EffectflowStepRejected``, ...).
FAILURE_PREFIX = "Effectflow"
#: The default name of ``decision_activity``.
DECIDE = "effectflow_decide"
#: Errors of the guard that are facts about the call: retrying the activity cannot change them.
_DEFINITE = (
    errors.StepFailed,
    errors.ArgumentError,
    errors.ContractError,
    errors.IdempotencyConflict,
)

Scope = Callable[[activity.Info], str]


def scope_of(info: activity.Info) -> str:
    """The guarded call's scope: the workflow id and its run id.

    The run id is part of it because activity ids are per run (Temporal numbers them ``1``,
    ``2``, ... in each run): a reset, a continue-as-new or a retry of the whole workflow is a new
    run, whose calls are calls of their own.

    Raises:
        errors.ArgumentError: the activity was not scheduled by a workflow (a standalone
            activity has no workflow identity to scope it by).
    """
    if info.workflow_id is None or info.workflow_run_id is None:
        raise errors.ArgumentError(
            f"activity {info.activity_type} was not scheduled by a workflow: a guarded call is "
            "scoped by the workflow id and run id"
        )
    return f"temporal:{info.workflow_id}:{info.workflow_run_id}"


def heartbeat_details(run_id: str, state: str) -> dict[str, str]:
    """What a guarded activity heartbeats: the ledger run to look at and where the call is."""
    return {"effectflow_run": run_id, "state": state}


def guarded(
    rt: Runtime,
    tool: Tool[..., Any] | None = None,
    *,
    name: str | None = None,
    scope: Scope = scope_of,
) -> Any:
    """The activity for ``tool``, ready for ``Worker(activities=[...])``.

    ``guarded(rt, send_email)`` or, as a decorator over an ``ef.tool``, ``@guarded(rt)``. The
    activity's name is the tool's (``name=`` to choose another) and its parameters are the tool's
    without the ones the runtime injects (the key, ``deadline``, ``precondition``, ``tx``): the
    workflow calls it with the arguments only, as JSON values. Its result is the call's recorded
    result.
    """

    def make(made: Tool[..., Any]) -> Any:
        return _activity(rt, made, name or made.name, scope)

    return make if tool is None else make(tool)


def _activity(rt: Runtime, tool: Tool[..., Any], name: str, scope: Scope) -> Any:
    if not isinstance(tool, Tool):
        raise errors.ArgumentError(f"guarded() takes an ef.tool, not {tool!r}")
    _register(rt, tool)

    async def run(*args: Any, **kwargs: Any) -> Any:
        info = activity.info()
        try:
            where = scope(info)
            arguments = tool.bind_arguments(args, kwargs)
        except errors.ArgumentError as exc:
            raise _failure(exc) from None
        call_id = info.activity_id
        activity.heartbeat(
            heartbeat_details(guard_mod.run_id_of(rt.tenant, where, call_id), "call")
        )
        try:
            done = await rt.guard_async(tool, arguments, scope=where, call_id=call_id)
        except errors.NeedsPerson as exc:
            activity.heartbeat(heartbeat_details(exc.run_id or "", "needs_person"))
            raise _needs_person(exc, tool, where, call_id) from None
        except _DEFINITE as exc:
            raise _failure(exc) from None
        activity.heartbeat(heartbeat_details(done.run_id, "done"))
        return done.value

    functools.update_wrapper(run, tool.fn, assigned=("__module__", "__doc__"))
    run.__name__ = run.__qualname__ = name
    parameters = [
        p.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD)
        for p in tool.signature.parameters.values()
        if p.name not in _injected(tool) and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    # Real types, not the tool module's strings: Temporal reads them with get_type_hints, which
    # would resolve strings in this module's globals.
    hints = _hints(tool.fn)
    run.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [p.replace(annotation=hints.get(p.name, p.annotation)) for p in parameters]
    )
    run.__annotations__ = {p.name: hints[p.name] for p in parameters if p.name in hints}
    return activity.defn(name=name)(run)


def decision_activity(rt: Runtime, *, name: str = DECIDE) -> Any:
    """The activity a workflow runs with a person's decision about a guarded call that raised
    ``NEEDS_PERSON``: ``(asked, decision) -> the call's result``.

    ``asked`` is the error's first detail; ``decision`` is ``{"approved": True, "approver":
    "<who>"}`` (or ``False`` with a ``reason``), ``{"committed": True, "evidence": {...}, "by":
    "<who>"}``, or ``{}`` when it was decided elsewhere (``rt.approve``, the console). The call is
    then completed from the ledger's record of it (its tool, arguments, scope and call id), so the
    result is the call's own — also when the waiting activity was a regenerated one.

    A tool with a redaction rule (``redact=``) has its arguments in the ledger without the fields
    it drops or masks, so the record cannot complete the call: the workflow passes the guarded
    activity's own arguments as a third, ``args`` (``args=[asked, decision, [order, card]]``).
    Without them, such a call is refused with what to pass, and nothing is sent.
    """

    async def decide(
        asked: dict[str, Any], decision: dict[str, Any], args: list[Any] | None = None
    ) -> Any:
        try:
            apply_decision(rt, asked, decision)
            recorded = rt.run(str(asked["run_id"])).input
            tool = rt.registry.tool(str(recorded["tool"]))
            if args is not None:
                arguments = tool.bind_arguments(tuple(args), {})
            elif tool.contract.redact is not None:
                raise errors.ArgumentError(
                    f"{tool.ref} redacts its arguments in the ledger, so the call cannot be "
                    "completed from its record: pass the guarded activity's own arguments as "
                    "the decision activity's third argument (args=[asked, decision, [...]]); "
                    "the decision was recorded, nothing was sent"
                )
            else:
                arguments = dict(recorded["arguments"])
            done = await rt.guard_async(
                tool, arguments, scope=str(recorded["scope"]), call_id=str(recorded["call_id"])
            )
        except errors.NeedsPerson as exc:
            raise _needs_person(
                exc, rt.registry.tool(str(asked["tool"])), asked["scope"], asked["call_id"]
            ) from None
        except (*_DEFINITE, errors.RunNotFound) as exc:
            raise _failure(exc) from None
        return done.value

    decide.__name__ = decide.__qualname__ = name
    return activity.defn(name=name)(decide)


def asked_of(error: BaseException) -> dict[str, Any] | None:
    """What a person must decide, from the error a workflow caught (an ``ActivityError`` whose
    cause is the ``NEEDS_PERSON`` ``ApplicationError``, or that error itself); else None."""
    cause: BaseException | None = error
    while cause is not None:
        if isinstance(cause, ApplicationError) and cause.type == NEEDS_PERSON:
            details = cause.details
            return dict(details[0]) if details and isinstance(details[0], Mapping) else None
        cause = cause.__cause__
    return None


def apply_decision(rt: Runtime, asked: Mapping[str, Any], decision: Any) -> None:
    """Apply a person's decision about what ``asked`` describes to the ledger.

    ``None`` and ``{}`` apply nothing (decided elsewhere: the call is just asked again). A
    decision someone else applied first (``StaleState``) is not an error.

    Raises:
        errors.ArgumentError: not a mapping, no name of who decided, or the wrong kind of answer.
    """
    if not decision:
        return
    host_decisions.record(
        rt, host_decisions.Question.stored(asked), decision, host_decisions.ENGINE_WORDING
    )


def _needs_person(
    exc: errors.NeedsPerson, tool: Tool[..., Any], scope: str, call_id: str
) -> ApplicationError:
    """The attempt's end when a person must decide: ids and phrases, never arguments (the
    details are stored in the workflow's history)."""
    asked = host_decisions.stored_question(exc, tool.ref, scope, call_id)
    return ApplicationError(exc.message, asked, type=NEEDS_PERSON, non_retryable=True)


def _failure(exc: errors.EffectflowError) -> ApplicationError:
    """A definite failure: retrying the activity would only be answered the same way."""
    return ApplicationError(
        exc.message, exc.to_dict(), type=FAILURE_PREFIX + type(exc).__name__, non_retryable=True
    )


def _register(rt: Runtime, tool: Tool[..., Any]) -> None:
    """Known to the runtime from the start, so ``decision_activity`` and a recovering worker
    find the call's tool by its name."""
    try:
        rt.registry.tool(tool.ref)
    except errors.ContractError:
        rt.registry.add_tool(tool)


def _injected(tool: Tool[..., Any]) -> set[str]:
    return {tool.contract.idempotency.key_param, "deadline", "precondition", "tx"}


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:  # an annotation that does not resolve: Temporal gets no type for it
        return {}
