"""The guarded call: one contracted tool call through the whole write path, when the *host* (a
LangGraph graph, an agent SDK, a durable engine) owns the control flow
(docs/concepts.md#the-guarded-call).

The host gives its durable identity: a ``scope`` (a thread and checkpoint namespace, a workflow id,
a session) and a ``call_id`` (the model's tool-call id, the host's step id). Each (scope, call id)
is one effectflow run of the built-in workflow ``effectflow.guarded_call`` with one step, so
everything a workflow step has, a guarded call has too: the intent before the call, the key, the
decision table after it, recovery by any worker, the audit chain, the operator's views.

- The same scope and call id again (a host replay) is the same run: its recorded result, or the
  settling of a call left in doubt (by key, by lookup, or by a person) — never a second effect.
- A new call id with the same tool and canonical arguments in the same scope (a *regenerated*
  call: the host lost the model's turn and asked again) is by default the same logical operation:
  its run answers with the first call's result, or says it is being checked. A contract with
  ``each_call_new=True`` makes every call id a new request.
- What needs a person (an effect that may have happened, an approval) comes back as
  ``NeedsPerson``, which adapters map to the host's own human-in-the-loop mechanism; the answer
  goes through ``rt.resolve`` / ``rt.approve``, and the next replay picks it up.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
from collections.abc import Collection, Iterator, Mapping
from typing import Any, Protocol

from effectflow import digests, errors
from effectflow.contracts import redaction
from effectflow.contracts import workflow as workflow_mod
from effectflow.contracts.registry import Registry
from effectflow.contracts.tool import Tool
from effectflow.ledger import records
from effectflow.ledger.records import RunStatus, StepStatus
from effectflow.ledger.store import LedgerStore
from effectflow.runtime import driver, guard_args, guard_input
from effectflow.runtime.context import Context

#: The built-in workflow every guarded call runs as.
WORKFLOW_NAME = "effectflow.guarded_call"
#: Its one step.
STEP_ID = "call"
#: What a model is told about a call that may or may not have happened
#: (docs/concepts.md#agents-and-models).
MAY_HAVE_HAPPENED = "this may or may not have happened; do not repeat it; it is being checked"
#: What a model is told about a call waiting for a person's approval.
WAITS_FOR_APPROVAL = "this needs a person's approval before it is done; do not repeat it"
#: How long a replay waits for the same call that another live process is executing (seconds).
IN_PROGRESS_WAIT = 30.0


class Host(Protocol):
    """What a guarded call needs of its runtime (``ef.Runtime`` is one): it starts and resumes
    the call's run like any caller of the public API."""

    @property
    def tenant(self) -> str:
        """The tenant of the call's run."""
        ...

    @property
    def store(self) -> LedgerStore:
        """The ledger (the scope's earlier calls are read from it)."""
        ...

    @property
    def registry(self) -> Registry:
        """Where the call's tool is found by name."""
        ...

    def start(
        self,
        workflow: workflow_mod.Workflow[..., Any],
        /,
        *,
        run_id: str | None = None,
        **input: Any,
    ) -> records.RunRecord:
        """``Runtime.start``."""
        ...

    def resume(self, run_id: str, *, by: str = "runtime") -> records.RunRecord:
        """``Runtime.resume``."""
        ...


@dataclasses.dataclass(frozen=True)
class Guarded:
    """A guarded call that is done: its recorded result."""

    #: The tool's result, as recorded (replays return this very value).
    value: Any
    #: The run that records the call (one per scope and call id).
    run_id: str
    #: The External Effect Record of the call (None for pure and read tools).
    effect_id: str | None
    #: Whether this answer is the same logical operation done earlier under another call id
    #: (a regenerated call), not a call of its own.
    deduplicated: bool


def _run(
    ctx: Context,
    tool: str,
    arguments: dict[str, Any],
    scope: str,
    call_id: str,
    new_request: bool = False,
    operation: str | None = None,
    request_digest: str | None = None,
) -> Any:
    """The built-in workflow: one step, the contracted call, under the logical operation its
    first call decided (``operation``; runs recorded before it existed derive it).

    Since ledger version 11 the input holds the arguments as the tool's redaction rule shows them,
    and the ``request_digest`` of the whole call: when they are not the whole call, the host that
    holds them makes it (``guard_args``), never this run with the redacted ones.

    Two calls of one operation that reach their intents at the same moment (a call and its
    regenerated copy, from two hosts) cannot both bind it: the ledger refuses the second binding
    in its transaction. That one then waits for the first to settle and is answered by it."""
    made = ctx._port.registry.tool(tool)
    if request_digest is not None and not _whole(made, arguments, request_digest):
        whole = guard_args.sent(request_digest)
        if whole is None:
            return driver.drive(
                ctx._port,
                ctx._state,
                guard_args.without_host(ctx._port, ctx._state, STEP_ID, request_digest),
            )
        arguments = whole
    op_id = operation or operation_id(made, arguments, scope, call_id, new_request=new_request)
    deadline = time.monotonic() + IN_PROGRESS_WAIT
    while True:
        try:
            return ctx.call(STEP_ID, made, operation_id=op_id, **arguments)
        except errors.IdempotencyConflict:
            store, tenant = ctx._port.store, ctx._state.run.tenant
            binding = store.get_operation(tenant, op_id)
            if (
                binding is None
                or binding.run_id == ctx.run_id
                or binding.request_digest != _digest(made, arguments)
                or time.monotonic() > deadline
                or STEP_ID in ctx._state.steps
            ):
                raise
            time.sleep(0.05)  # the other call is being made: ask again once it is recorded
            ctx._state.seen.discard(STEP_ID)  # nothing of the step was recorded: the same step


#: The workflow every runtime registers (``Runtime`` adds it to its registry).
WORKFLOW: workflow_mod.Workflow[..., Any] = workflow_mod.Workflow(_run, WORKFLOW_NAME, "1")


def request_digest(tool: Tool[..., Any], arguments: dict[str, Any]) -> str:
    """The digest the write path computes for this call (positional or keyword alike)."""
    payload = digests.to_jsonable(tool.bind_arguments((), arguments), path=f"{tool.name}.args")
    return "sha256:" + digests.sha256_hex(digests.canonical_json(payload))


_digest = request_digest  # ``_run`` has a parameter of that name


def _whole(tool: Tool[..., Any], arguments: dict[str, Any], digest: str) -> bool:
    """Whether recorded arguments are the whole call of ``digest`` (a rule redacted nothing)."""
    try:
        return _digest(tool, arguments) == digest
    except errors.ArgumentError:  # a required argument was dropped
        return False


def operation_id(
    tool: Tool[..., Any],
    arguments: dict[str, Any],
    scope: str,
    call_id: str,
    *,
    new_request: bool = False,
) -> str:
    """The logical operation of a guarded call: the tool and its canonical arguments in the scope
    (so a regenerated call is the same operation), or the call id when every call is new (the
    contract's ``each_call_new``, or a repeat the host says the model asked for knowingly)."""
    if tool.contract.each_call_new or new_request:
        return request_operation(scope, call_id)
    return "guard:" + digests.canonical_json([scope, tool.name, request_digest(tool, arguments)])


def request_operation(scope: str, call_id: str) -> str:
    """The logical operation of a call that is a request of its own: its scope and call id.

    The parts are a JSON array, never joined with a separator a host id may contain: scope
    ``"a:b"`` with call ``"c"`` and scope ``"a"`` with call ``"b:c"`` are two requests, and a
    request (two parts) is never a call's operation (three parts)."""
    return "guard:" + digests.canonical_json([scope, call_id])


def run_id_of(tenant: str, scope: str, call_id: str) -> str:
    """The run that records (scope, call id): a digest, so any host id fits in a URL."""
    return "guard-" + digests.sha256_hex(digests.canonical_json([tenant, scope, call_id]))[:24]


def call(
    rt: Host,
    tool: Tool[..., Any] | str,
    arguments: Mapping[str, Any],
    *,
    scope: str,
    call_id: str,
    known_call_ids: Collection[str] = (),
    new_request: bool = False,
) -> Guarded:
    """``Runtime.guard`` (documented there)."""
    made = guard_input.checked_tool(rt.registry, tool, scope, call_id)
    if isinstance(known_call_ids, str | bytes) or not all(
        isinstance(c, str) for c in known_call_ids
    ):
        raise errors.ArgumentError(
            f"guarded call of {made.ref}: known_call_ids must be a collection of call ids "
            f"(strings), not {known_call_ids!r}; nothing was recorded"
        )
    if not isinstance(arguments, Mapping):
        raise errors.ArgumentError(
            f"guarded call of {made.ref}: arguments must be a mapping of parameter names to "
            f"values, not {type(arguments).__name__}; nothing was recorded"
        )
    named = made.bind_arguments((), dict(arguments))  # wrong arguments: ArgumentError, no run
    guard_input.json_values_only(named, f"{made.name}.args")
    normalized = digests.to_jsonable(named, path=f"{made.name}.args")
    size = len(digests.canonical_json(normalized).encode("utf-8"))
    if size > guard_input.MAX_PAYLOAD_BYTES:
        raise errors.ArgumentError(
            f"guarded call of {made.ref}: the arguments are {size} bytes of JSON, over the "
            f"{guard_input.MAX_PAYLOAD_BYTES}-byte limit; pass a reference (an id, a URL) instead. Nothing "
            "was recorded"
        )
    run_id = run_id_of(rt.tenant, scope, call_id)
    digest = request_digest(made, normalized)
    input: dict[str, Any] = {
        "tool": made.ref,
        "arguments": redaction.apply(normalized, made.contract.redact),  # what is shown
        "request_digest": digest,
        "scope": scope,
        "call_id": call_id,
    }
    recorded = rt.store.get_run(run_id, tenant=rt.tenant)
    if recorded is not None and "request_digest" not in recorded.input:
        # Recorded before ledger version 11: the whole arguments, no digest; replayed as it is.
        input["arguments"] = normalized
        del input["request_digest"]
    elif recorded is not None and recorded.input["request_digest"] == digest:
        # The same request: its arguments as recorded (the tool's rule may have changed since).
        input["arguments"] = recorded.input.get("arguments")
    with guard_args.held(digest, normalized):  # the workflow makes the call with them
        return _start(rt, made, normalized, input, recorded, known_call_ids, new_request)


def _start(
    rt: Host,
    made: Tool[..., Any],
    normalized: dict[str, Any],
    input: dict[str, Any],
    recorded: records.RunRecord | None,
    known_call_ids: Collection[str],
    new_request: bool,
) -> Guarded:
    """The guarded call's run started, replayed or answered, once its input is known."""
    scope, call_id = input["scope"], input["call_id"]
    run_id = run_id_of(rt.tenant, scope, call_id)
    if recorded is not None:
        # A replay: the operation was decided, and recorded, at the first call.
        for name in ("new_request", "operation"):
            if name in recorded.input:
                input[name] = recorded.input[name]
    elif new_request or made.contract.each_call_new:
        # Declared a request of its own (an MCP operation_id, a tool whose repeats are normal):
        # made even when the same call happened — but not while one may still have happened.
        for earlier in _one_per_effect(_same_calls(rt, made, normalized, scope, run_id)):
            _settled_earlier_call(rt, made, scope, earlier, STEP_ID)
        input["new_request"] = True
        input["operation"] = request_operation(scope, call_id)
    else:
        input["operation"] = _decide_operation(
            rt, made, normalized, scope, call_id, run_id, known_call_ids
        )
    deadline = time.monotonic() + IN_PROGRESS_WAIT
    while True:
        try:
            run = rt.start(WORKFLOW, run_id=run_id, **input)
            if run.status is RunStatus.RUNNING and time.monotonic() < deadline:
                time.sleep(0.05)  # another thread here executes it: ask again once it ended
                continue
            return answer(rt, run)
        except (errors.LeaseLost, errors.StaleState):
            # The same call is being executed (or resumed) by another live caller at this
            # moment: wait for its answer.
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


async def call_async(
    rt: Host,
    tool: Tool[..., Any] | str,
    arguments: Mapping[str, Any],
    *,
    scope: str,
    call_id: str,
    known_call_ids: Collection[str] = (),
    new_request: bool = False,
) -> Guarded:
    """``Runtime.guard_async``: the guarded call without blocking the caller's event loop."""
    return await asyncio.to_thread(
        functools.partial(
            call,
            rt,
            tool,
            arguments,
            scope=scope,
            call_id=call_id,
            known_call_ids=known_call_ids,
            new_request=new_request,
        )
    )


#: Step statuses of an effect that happened (the engine answers a regenerated call from it).
_HAPPENED = frozenset(
    {
        StepStatus.CONFIRMED,
        StepStatus.AWAITING_COMPLETION,
        StepStatus.COMPENSATION_PENDING,
        StepStatus.COMPENSATING,
        StepStatus.COMPENSATED,
        StepStatus.COMPENSATION_FAILED,
    }
)


def _decide_operation(
    rt: Host,
    tool: Tool[..., Any],
    arguments: dict[str, Any],
    scope: str,
    call_id: str,
    run_id: str,
    known_call_ids: Collection[str],
) -> str:
    """The logical operation of a call id not recorded yet, when other calls of this scope made
    the same call (the same tool and canonical arguments). Decided at a call id's first call and
    recorded with its run (``input["operation"]``); a replay keeps it.

    Every earlier call of the same request is settled first: one left in doubt by a dead host is
    recovered here (its intent, its key, its lookup), one waiting for a person raises
    ``NeedsPerson`` naming *that* call — so a repeat is never made while an earlier one may still
    have happened, and a person is asked about one call, not two. Then, of the calls that
    happened, the latest decides:

    - none happened (declined, rejected, not committed, failed): this call is a request of its
      own, the first that may happen;
    - the host's conversation shows the latest one's result (``known_call_ids``): the model asked
      again knowingly, a request of its own (docs/concepts.md#the-guarded-call);
    - else this call is that one regenerated (the host lost the turn that showed it): the same
      operation, answered with its result.
    """
    own = request_operation(scope, call_id)
    family = _same_calls(rt, tool, arguments, scope, run_id)
    if not family:
        return operation_id(tool, arguments, scope, call_id)
    happened: list[records.RunRecord] = []
    for earlier in _one_per_effect(family):
        step = _settled_earlier_call(rt, tool, scope, earlier, STEP_ID)
        if step is not None and step.status in _HAPPENED:
            happened.append(earlier)
    if not happened:
        return own
    latest = happened[-1]
    if latest.input.get("call_id") in set(known_call_ids):
        return own
    return str(latest.input.get("operation") or _recorded_operation(rt, tool, latest))


def _same_calls(
    rt: Host, tool: Tool[..., Any], arguments: dict[str, Any], scope: str, run_id: str
) -> list[records.RunRecord]:
    """The scope's other guarded calls of this tool with these canonical arguments, oldest
    first (a scope — a thread, a session — holds few calls; its runs are indexed by scope)."""
    digest = request_digest(tool, arguments)
    found = [
        run
        for run in rt.store.list_runs(tenant=rt.tenant, scope=scope, limit=10_000)
        if run.run_id != run_id
        and run.workflow == WORKFLOW_NAME
        and str(run.input.get("tool", "")).split("@", 1)[0] == tool.name
        and _same_request(run, arguments, digest)
    ]
    return sorted(found, key=lambda r: r.created_at)


def _same_request(run: records.RunRecord, arguments: dict[str, Any], digest: str) -> bool:
    """Whether a guarded call's run recorded this request: by its request digest (its recorded
    arguments may be redacted), or by its arguments when recorded before version 11."""
    if "request_digest" in run.input:
        return bool(run.input["request_digest"] == digest)
    return bool(run.input.get("arguments") == arguments)


def _one_per_effect(family: list[records.RunRecord]) -> list[records.RunRecord]:
    """The family without the regenerated copies of its calls: a call that recorded the operation
    of an earlier one is that call's effect, settled with it. Settling the copy too would name a
    copy another process is answering at this moment (from the first call's effect) as the call
    that may have happened, instead of the first call."""
    seen: set[str] = set()
    distinct = []
    for run in family:
        operation = run.input.get("operation")
        if isinstance(operation, str):
            if operation in seen:
                continue
            seen.add(operation)
        distinct.append(run)
    return distinct


def _recorded_operation(rt: Host, tool: Tool[..., Any], run: records.RunRecord) -> str:
    """The operation a guarded call recorded before ``input["operation"]`` existed."""
    step = next((s for s in rt.store.steps(run.run_id) if s.step_id == STEP_ID), None)
    if step is not None and step.logical_operation_id:
        return step.logical_operation_id
    return operation_id(
        tool,
        dict(run.input.get("arguments") or {}),
        str(run.input.get("scope")),
        str(run.input.get("call_id")),
        new_request=bool(run.input.get("new_request")),
    )


def _settled_earlier_call(
    rt: Host,
    tool: Tool[..., Any],
    scope: str,
    original: records.RunRecord,
    step_id: str,
) -> records.StepRecord | None:
    """The earlier call's step once it is settled (None: it never reached its call).

    Raises:
        errors.NeedsPerson: it waits for a person (an approval, an effect in doubt), or another
            live process is still executing it.
    """
    if original.status is RunStatus.RUNNING and original.workflow == WORKFLOW_NAME:
        # Its host died (or went quiet) mid-call: recover it as any worker would.
        with _still_running(tool, scope, original):
            original = rt.start(WORKFLOW, run_id=original.run_id, **original.input)
    if original.status is RunStatus.PAUSED and original.workflow == WORKFLOW_NAME:
        with _still_running(tool, scope, original):
            answer(rt, original)  # resumes it if a person settled it since; else NeedsPerson
        original = rt.store.get_run(original.run_id, tenant=rt.tenant) or original
    step = next((s for s in rt.store.steps(original.run_id) if s.step_id == step_id), None)
    open_run = original.status in (RunStatus.RUNNING, RunStatus.PAUSED, RunStatus.CANCELLING)
    if (step is not None and step.status in records.IN_DOUBT_STATUSES) or (
        open_run
        and (step is None or step.status in (StepStatus.PENDING, StepStatus.AWAITING_APPROVAL))
    ):
        raise errors.NeedsPerson(
            f"the same call ({tool.ref} with the same arguments in scope {scope!r}) was made as "
            f"call {original.run_id} and may have happened: it is being checked, not done again",
            run_id=original.run_id,
            step_id=step_id,
            effect_id=None if step is None else step.effect_id,
            kind="in_doubt",
            for_model=MAY_HAVE_HAPPENED,
        )
    return step


@contextlib.contextmanager
def _still_running(tool: Tool[..., Any], scope: str, original: records.RunRecord) -> Iterator[None]:
    """An earlier call another live process executes is being checked, not a second call."""
    try:
        yield
    except (errors.LeaseLost, errors.StaleState):
        raise errors.NeedsPerson(
            f"the same call ({tool.ref} with the same arguments in scope {scope!r}) is being made "
            f"as call {original.run_id} by another process; it is not done again",
            run_id=original.run_id,
            step_id=STEP_ID,
            effect_id=None,
            kind="in_doubt",
            for_model=MAY_HAVE_HAPPENED,
        ) from None


def answer(rt: Host, run: records.RunRecord) -> Guarded:
    """What the host gets for the guarded call's run as it stands."""
    if run.status is RunStatus.PAUSED and (
        _settled_since(rt, run) or _in_doubt(run) or _waits_for_host(run)
    ):
        # Settled by a person since: go on. Still in doubt: a replay looks it up once more (the
        # provider may answer now) before a person is asked again.
        run = rt.resume(run.run_id, by="guarded call")
    steps = {s.step_id: s for s in rt.store.steps(run.run_id)}
    step = steps.get(STEP_ID)
    ended = run.status not in (RunStatus.RUNNING, RunStatus.PAUSED, RunStatus.CANCELLING)
    if step is not None and (
        run.status is RunStatus.SUCCEEDED or (ended and step.status in _HAPPENED)
    ):
        # Done — also when the run ended otherwise afterwards (compensated, kept by a person's
        # decline of the compensation): the call happened, and this is what it answered.
        deduplicated = any(e.kind == "deduplicated" for e in rt.store.audit(run.run_id))
        value = run.output if run.status is RunStatus.SUCCEEDED else step.output
        return Guarded(value, run.run_id, step.effect_id, deduplicated)
    error = run.error or {}
    if run.status is RunStatus.PAUSED:
        approval = error.get("code") == "approval_required"
        raise errors.NeedsPerson(
            str(error.get("message", "a person must decide")),
            run_id=run.run_id,
            step_id=STEP_ID,
            effect_id=None if step is None else step.effect_id,
            kind="approval" if approval else "in_doubt",
            for_model=WAITS_FOR_APPROVAL if approval else MAY_HAVE_HAPPENED,
        )
    if run.status is RunStatus.RUNNING:
        raise errors.LeaseLost(
            f"the guarded call {run.run_id} is being executed by {run.lease_owner}; ask again "
            "once it ends",
            run_id=run.run_id,
        )
    code = str(error.get("code", "step_failed"))
    failure = {
        "step_rejected": errors.StepRejected,
        "retry_budget_exhausted": errors.RetryBudgetExhausted,
        "idempotency_conflict": errors.IdempotencyConflict,
        "result_not_recordable": errors.ResultNotRecordable,
        "contract_error": errors.ContractError,
    }.get(code, errors.StepFailed)
    raise failure(
        f"guarded call {run.run_id} {run.status}: {error.get('message', '')}",
        run_id=run.run_id,
        step_id=STEP_ID,
    )


def _waits_for_host(run: records.RunRecord) -> bool:
    """Paused by a process without the call's whole arguments: the host's replay continues it."""
    return (run.error or {}).get("code") == guard_args.NEEDS_HOST


def _in_doubt(run: records.RunRecord) -> bool:
    return (run.error or {}).get("code") == "needs_attention"


def _settled_since(rt: Host, run: records.RunRecord) -> bool:
    """Whether the step a paused guarded call waited on was settled by a person since."""
    step = next((s for s in rt.store.steps(run.run_id) if s.step_id == STEP_ID), None)
    return step is not None and step.status in (StepStatus.CONFIRMED, StepStatus.NOT_COMMITTED)
