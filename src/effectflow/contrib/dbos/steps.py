"""A guarded call as a DBOS step: ``rt.guard`` under the workflow's durable identity
(docs/concepts.md#the-guarded-call).

DBOS checkpoints a step's output once it returns; a step whose output was not checkpointed (the
process died inside it) runs again when DBOS recovers the workflow — at least once. That is
exactly the window where a write happens twice. Inside the step, the call goes through
``rt.guard`` with scope = ``dbos:<workflow id>`` and call id = ``step-<function id>`` (DBOS's step
counter, the same on every replay of a deterministic workflow): the step DBOS runs again reaches
the same ledger run, which answers with the recorded result or settles the call in doubt (by key,
by lookup) instead of making it again.

What the step returns is a plain dict (DBOS pickles it into its checkpoint): the result, a failure,
or what a person must decide. A person's decision is waited for in the workflow, not in the step,
with DBOS's own messages: the question is published as the workflow event ``ASKED_EVENT``, the
workflow blocks durably in ``DBOS.recv`` on the call's topic, and ``decide`` (``DBOS.send``)
delivers the answer, which a second step applies to the ledger (``rt.approve`` / ``rt.reject`` /
``rt.resolve``) before asking the guard again under the same call id.

The call ids whose result the workflow code got back are passed as ``known_call_ids``: workflow
code that makes the same call again after seeing its result asks knowingly (a new request), while
a call made again after one that never came back (it failed, or a crash lost it) is settled
against the first.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Callable, Coroutine, Generator, Mapping
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, cast, overload

try:
    from dbos import DBOS, StepOptions
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the installed extras
    raise ModuleNotFoundError(
        "effectflow.contrib.dbos needs the 'dbos' extra: pip install 'effectflow[dbos]'",
        name=exc.name,
    ) from exc

from effectflow import errors
from effectflow.contracts.tool import Tool
from effectflow.contrib._host import decisions as host_decisions
from effectflow.runtime import guard as guard_mod

if TYPE_CHECKING:
    from effectflow.runtime.runtime import Runtime

P = ParamSpec("P")
R = TypeVar("R")

#: The workflow event that holds what a waiting guarded call asks a person (None once answered).
ASKED_EVENT = "effectflow.asked"
#: The topic prefix of the messages that carry a person's decision (one topic per call id).
DECISION_TOPIC = "effectflow.decision"
#: How long a workflow waits for a person's decision by default (seconds; DBOS's timer is durable).
DEFAULT_WAIT_S = 7 * 24 * 3600.0
#: Errors of the guard that are facts about the call (checkpointed as its outcome); any other
#: error (the ledger unreachable, another live process mid-call) is retried by the step.
_FAILURES: dict[str, type[errors.EffectflowError]] = {
    c.__name__: c
    for c in (
        errors.StepFailed,
        errors.StepRejected,
        errors.RetryBudgetExhausted,
        errors.ResultNotRecordable,
        errors.ArgumentError,
        errors.ContractError,
        errors.IdempotencyConflict,
    )
}
_DEFINITE = tuple(_FAILURES.values())
_TRANSIENT = (errors.LedgerUnavailable, errors.LeaseLost, errors.StaleState)


class NoDecision(errors.EffectflowError):
    """Nobody decided within the wait: the call still waits in the ledger (``effectflow
    attention``, the console), and the workflow stops here with this error."""

    code = "no_decision"


@dataclasses.dataclass(frozen=True)
class _Step:
    """Run ``fn(*args)`` as a DBOS step."""

    options: StepOptions
    fn: Callable[..., dict[str, Any]]
    args: tuple[Any, ...]


@dataclasses.dataclass(frozen=True)
class _SetEvent:
    """Publish (or clear, with None) the question as the workflow event ``ASKED_EVENT``."""

    value: dict[str, Any] | None


@dataclasses.dataclass(frozen=True)
class _Recv:
    """Wait for a message on ``topic`` (None after ``timeout`` seconds)."""

    topic: str
    timeout: float


_Op = _Step | _SetEvent | _Recv


def scope_of(workflow_id: str) -> str:
    """The guarded call's scope for a DBOS workflow (its id is its durable identity)."""
    return f"dbos:{workflow_id}"


class _Known:
    """The call ids whose result each workflow's code got back in this process, with the DBOS
    step each result came back from.

    A workflow runs again from the top when DBOS recovers or resumes it; its checkpointed steps
    return their recorded outcomes, and are counted again. So at the step with function id F,
    only results that came back from steps before F are known: a result recorded here at F or
    later belongs to an earlier execution of the workflow, whose calls this one has not seen (its
    call at F may be that very call, regenerated). Bounded: a workflow forgotten here rebuilds
    its entry as it replays.
    """

    def __init__(self, workflows: int = 10_000) -> None:
        self._calls: collections.OrderedDict[str, list[tuple[str, int]]] = collections.OrderedDict()
        self._limit = workflows
        self._lock = threading.Lock()

    def before(self, workflow_id: str, step: int) -> tuple[str, ...]:
        """The call ids whose results came back from steps before ``step``."""
        with self._lock:
            return tuple(c for c, at in self._calls.get(workflow_id, ()) if at < step)

    def add(self, workflow_id: str, call_id: str, step: int) -> None:
        """A result came back from ``step``: anything recorded at or after it is forgotten."""
        with self._lock:
            calls = [(c, at) for c, at in self._calls.get(workflow_id, ()) if at < step]
            self._calls[workflow_id] = [*calls, (call_id, step)]
            self._calls.move_to_end(workflow_id)
            while len(self._calls) > self._limit:
                self._calls.popitem(last=False)


_KNOWN = _Known()


class GuardedStep(Generic[P, R]):
    """An ``ef.tool`` called from a DBOS workflow's code through ``rt.guard``, as DBOS steps.

    Args:
        rt: The runtime whose ledger records the calls.
        tool: The tool, with its side-effect contract (unchanged: the same function and contract
            serve ``rt.guard`` anywhere else).
        wait_seconds: How long the workflow waits for a person's decision before it gives up with
            ``NoDecision`` (the wait is DBOS's durable ``recv`` timer: it survives restarts).
        name: The DBOS step name (``effectflow:<tool name>`` by default).
    """

    # Typed from the tool as ``ctx.call`` is (docs/typing.md): an async tool's calls give what its
    # coroutine returns (the guard awaits it), a sync tool's what it returns.
    @overload
    def __init__(
        self: GuardedStep[P, R],
        rt: Runtime,
        tool: Tool[P, Coroutine[Any, Any, R]],
        *,
        wait_seconds: float = ...,
        name: str | None = ...,
    ) -> None: ...

    @overload
    def __init__(
        self: GuardedStep[P, R],
        rt: Runtime,
        tool: Tool[P, R],
        *,
        wait_seconds: float = ...,
        name: str | None = ...,
    ) -> None: ...

    def __init__(
        self,
        rt: Runtime,
        tool: Tool[P, Any],
        *,
        wait_seconds: float = DEFAULT_WAIT_S,
        name: str | None = None,
    ) -> None:
        if not isinstance(tool, Tool):
            raise errors.ArgumentError(f"guarded() takes an ef.tool, not {tool!r}")
        self.rt = rt
        self.tool = tool
        self.wait_seconds = wait_seconds
        self.step_name = name or f"effectflow:{tool.name}"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Call the tool from the workflow's code; its recorded result."""
        return cast("R", self.call(self.tool.bind_arguments(args, kwargs)).value)

    async def run_async(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Call the tool from an ``async`` workflow's code; its recorded result."""
        return cast("R", (await self.acall(self.tool.bind_arguments(args, kwargs))).value)

    def call(
        self,
        arguments: Mapping[str, Any],
        *,
        call_id: str | None = None,
        new_request: bool = False,
    ) -> guard_mod.Guarded:
        """The guarded call with its ledger ids (``call_id`` names the call instead of the step's
        function id, e.g. a model's tool-call id).

        Raises:
            errors.ArgumentError: not called from a workflow's own code, or bad arguments.
            errors.StepFailed: the provider refused, a person declined, or nothing committed.
            NoDecision: a person was asked and nobody answered within ``wait_seconds``.
        """
        plan = self._plan(arguments, call_id, new_request)
        try:
            op = next(plan)
            while True:
                value: Any = None
                if isinstance(op, _Step):
                    value = DBOS.run_step(op.options, op.fn, *op.args)
                elif isinstance(op, _SetEvent):
                    DBOS.set_event(ASKED_EVENT, op.value)
                else:
                    value = DBOS.recv(op.topic, timeout_seconds=op.timeout)
                op = plan.send(value)
        except StopIteration as stop:
            done: guard_mod.Guarded = stop.value
            return done

    async def acall(
        self,
        arguments: Mapping[str, Any],
        *,
        call_id: str | None = None,
        new_request: bool = False,
    ) -> guard_mod.Guarded:
        """``call`` from an ``async`` workflow: the same steps through DBOS's asyncio API (the
        ledger's work runs on a thread, off the workflow's event loop)."""
        plan = self._plan(arguments, call_id, new_request)
        try:
            op = next(plan)
            while True:
                value: Any = None
                if isinstance(op, _Step):
                    value = await DBOS.run_step_async(op.options, op.fn, *op.args)
                elif isinstance(op, _SetEvent):
                    await DBOS.set_event_async(ASKED_EVENT, op.value)
                else:
                    value = await DBOS.recv_async(op.topic, timeout_seconds=op.timeout)
                op = plan.send(value)
        except StopIteration as stop:
            done: guard_mod.Guarded = stop.value
            return done

    def _plan(
        self, arguments: Mapping[str, Any], call_id: str | None, new_request: bool
    ) -> Generator[_Op, Any, guard_mod.Guarded]:
        """The call as the DBOS operations it takes, in order; ``call`` and ``acall`` drive it."""
        workflow_id = DBOS.workflow_id
        if workflow_id is None or DBOS.step_id is not None:
            raise errors.ArgumentError(
                f"a guarded call of {self.tool.ref} runs from a @DBOS.workflow's own code (not "
                "inside a step, not outside a workflow): the workflow id is its scope"
            )
        named = dict(arguments)
        options: StepOptions = {
            "name": self.step_name,
            "retries_allowed": True,
            "max_attempts": 5,
            "should_retry": _transient,
        }
        outcome: dict[str, Any] = yield _Step(
            options, self._first, (named, workflow_id, call_id, new_request)
        )
        while outcome["status"] == "needs_person":
            yield _SetEvent(outcome["asked"])
            decision = yield _Recv(_topic(outcome["call_id"]), self.wait_seconds)
            decide_options: StepOptions = {**options, "name": f"{self.step_name}:decide"}
            outcome = yield _Step(
                decide_options,
                self._decide,
                (outcome, decision, named, workflow_id, new_request),
            )
            if outcome["status"] != "needs_person":
                yield _SetEvent(None)
            elif decision is None:
                yield _SetEvent(outcome["asked"])
                raise NoDecision(
                    f"nobody decided {self.tool.ref} (call {outcome['call_id']} of workflow "
                    f"{workflow_id}) within {self.wait_seconds} s; it waits in the ledger as run "
                    f"{outcome['asked']['run_id']}",
                    run_id=outcome["asked"]["run_id"],
                    step_id=outcome["asked"]["step_id"],
                    effect_id=outcome["asked"]["effect_id"],
                )
        if outcome["status"] == "failed":
            raise _error(outcome["error_type"], outcome["error"])
        _KNOWN.add(workflow_id, outcome["call_id"], outcome["step"])
        return guard_mod.Guarded(
            outcome["value"], outcome["run_id"], outcome["effect_id"], outcome["deduplicated"]
        )

    def _first(
        self,
        arguments: dict[str, Any],
        workflow_id: str,
        call_id: str | None,
        new_request: bool,
    ) -> dict[str, Any]:
        """The step: the call under the step's function id, DBOS's counter of this workflow."""
        first = _step_id()
        outcome = self._ask(arguments, workflow_id, call_id or f"step-{first}", first, new_request)
        return {**outcome, "first_step": first}

    def _decide(
        self,
        outcome: dict[str, Any],
        decision: Any,
        arguments: dict[str, Any],
        workflow_id: str,
        new_request: bool,
    ) -> dict[str, Any]:
        """The step after a person answered (or the wait ended): apply, then ask again under the
        first step's call id. A decision the ledger refuses asks again, saying why."""
        try:
            apply_decision(self.rt, outcome["asked"], decision)
        except errors.ArgumentError as refused:
            return {**outcome, "asked": {**outcome["asked"], "refused": refused.message}}
        again = self._ask(
            arguments, workflow_id, outcome["call_id"], outcome["first_step"], new_request
        )
        return {**again, "first_step": outcome["first_step"]}

    def _ask(
        self,
        arguments: dict[str, Any],
        workflow_id: str,
        call_id: str,
        first: int,
        new_request: bool,
    ) -> dict[str, Any]:
        """One ask of the guard, inside a step; what it answered as a plain dict."""
        scope = scope_of(workflow_id)
        known = _KNOWN.before(workflow_id, first)
        step = _step_id()
        try:
            done = self.rt.guard(
                self.tool,
                arguments,
                scope=scope,
                call_id=call_id,
                known_call_ids=known,
                new_request=new_request,
            )
        except errors.NeedsPerson as exc:
            return {
                "status": "needs_person",
                "step": step,
                "call_id": call_id,
                "asked": host_decisions.stored_question(exc, self.tool.ref, scope, call_id),
            }
        except _DEFINITE as exc:
            return {
                "status": "failed",
                "step": step,
                "call_id": call_id,
                "error_type": next(
                    c.__name__ for c in type(exc).__mro__ if c.__name__ in _FAILURES
                ),
                "error": exc.to_dict(),
            }
        return {
            "status": "done",
            "step": step,
            "call_id": call_id,
            "value": done.value,
            "run_id": done.run_id,
            "effect_id": done.effect_id,
            "deduplicated": done.deduplicated,
        }


@overload
def guarded(
    rt: Runtime,
    tool: Tool[P, Coroutine[Any, Any, R]],
    *,
    wait_seconds: float = ...,
    name: str | None = ...,
) -> GuardedStep[P, R]: ...


@overload
def guarded(
    rt: Runtime,
    tool: Tool[P, R],
    *,
    wait_seconds: float = ...,
    name: str | None = ...,
) -> GuardedStep[P, R]: ...


def guarded(
    rt: Runtime,
    tool: Tool[P, Any],
    *,
    wait_seconds: float = DEFAULT_WAIT_S,
    name: str | None = None,
) -> GuardedStep[P, Any]:
    """The one line: ``send = guarded(rt, send_email)``, then ``send(...)`` in a workflow: typed
    from the tool, so mypy checks ``send``'s arguments and result as it checks ``ctx.call``'s."""
    return GuardedStep(rt, tool, wait_seconds=wait_seconds, name=name)


def asked(workflow_id: str, *, timeout_seconds: float = 0.0) -> dict[str, Any] | None:
    """What the workflow's guarded call waits for a person to decide, or None (nothing waits).

    Fields: ``kind`` (``approval`` / ``in_doubt``), ``next_action``, ``run_id``, ``step_id``,
    ``effect_id``, ``message``, ``for_model``, ``tool``, ``scope``, ``call_id``, ``resume_with``
    (a template of the answer), and ``refused`` when the last decision was refused.
    """
    value = DBOS.get_event(workflow_id, ASKED_EVENT, timeout_seconds=timeout_seconds)
    return dict(value) if isinstance(value, Mapping) else None


def decide(workflow_id: str, decision: Mapping[str, Any], *, call_id: str | None = None) -> None:
    """Send a person's decision to the workflow's waiting guarded call (``DBOS.send``).

    ``{"approved": True, "approver": "<who>"}`` (or ``False`` with a ``reason``) answers an
    approval; ``{"committed": True, "evidence": {...}, "by": "<who>"}`` a call in doubt; ``{}``
    says it was decided elsewhere (``rt.approve``, the console): the call is just asked again.

    Raises:
        errors.ArgumentError: nothing waits in that workflow (and no ``call_id`` was given).
    """
    if call_id is None:
        waiting = asked(workflow_id)
        if waiting is None:
            raise errors.ArgumentError(f"workflow {workflow_id} waits for no decision")
        call_id = str(waiting["call_id"])
    DBOS.send(workflow_id, dict(decision), topic=_topic(call_id))


def apply_decision(rt: Runtime, asked: Mapping[str, Any], decision: Any) -> None:
    """Apply a person's decision about what ``asked`` describes to the ledger.

    ``None`` (the wait ended) and ``{}`` apply nothing: the guard is asked again, which picks up a
    decision made elsewhere. A decision someone else applied first (``StaleState``) is not an
    error.

    Raises:
        errors.ArgumentError: not a mapping, no name of who decided, or the wrong kind of answer.
    """
    host_decisions.record(
        rt, host_decisions.Question.stored(asked), decision, host_decisions.ENGINE_WORDING
    )


def _step_id() -> int:
    """The function id of the DBOS step running now."""
    step = DBOS.step_id
    if step is None:  # pragma: no cover - only ever called inside a step
        raise errors.ArgumentError("a guarded call's step runs inside a DBOS workflow")
    return int(step)


def _topic(call_id: str) -> str:
    return f"{DECISION_TOPIC}:{call_id}"


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, _TRANSIENT)


def _error(name: str, data: Mapping[str, Any]) -> errors.EffectflowError:
    """The failure the step recorded, raised again in the workflow as the same error class."""
    return _FAILURES.get(name, errors.StepFailed)(
        str(data.get("message", "")),
        run_id=data.get("run_id"),
        step_id=data.get("step_id"),
        effect_id=data.get("effect_id"),
    )
