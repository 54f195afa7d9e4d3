"""One guarded ``FunctionTool``: its ``on_invoke_tool`` and ``needs_approval`` over ``rt.guard``.

- scope = the conversation the application names (``scope=``: a session id, a ticket, a user's
  thread), call id = ``ToolContext.tool_call_id``. The SDK has no durable run id of its own: a
  ``RunState`` resumed, or a turn re-run after a crash, is the same conversation, and a model asked
  again issues a new tool-call id for the same action, which the ledger deduplicates within the
  scope (docs/concepts.md#regenerated-calls).
- The result goes back as JSON text (``status``, ``happened``, ``result``); a call the ledger
  answered for an earlier tool-call id says it was already done; an outcome in doubt says it may
  have happened, must not be repeated, and is being checked, while ``rt.attention()`` lists it
  for a person.
- A contract that needs an approval becomes the SDK's ``needs_approval``: the call is recorded
  (its exact request, under the approval policy of that moment) and the run stops with an
  interruption; ``RunState.approve`` / ``reject`` and ``Runner.run(agent, state)`` answer it. On
  resume the approval is checked again before anything is sent: it counts only for the request
  and the policy it was asked for. A payload or a policy changed while the run was paused gets no
  effect and a new approval (openai/openai-agents-python#4896).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

import jsonschema
from agents import RunContextWrapper
from agents.tool_context import ToolContext

from effectflow import digests, errors
from effectflow.contracts.tool import Tool
from effectflow.contrib._host import answers, definitions
from effectflow.ledger import records
from effectflow.ledger.records import RunStatus
from effectflow.runtime import approvals
from effectflow.runtime import guard as guard_mod

if TYPE_CHECKING:
    from effectflow.runtime.guard import Guarded
    from effectflow.runtime.runtime import Runtime

#: Where the conversation's name comes from: a fixed id, or one read from the run's context.
Source = str | Callable[[RunContextWrapper[Any]], str]

#: The prefix of every scope this adapter records (``openai-agents:<conversation>``).
SCOPE_PREFIX = "openai-agents"
#: Who the audit log says approved, when the approval came through ``RunState.approve`` (the SDK
#: does not say who); ``approver=`` names the person.
SDK_APPROVER = "openai-agents:RunState.approve"
#: Who the audit log says declined an approval that no longer holds (the re-check on resume).
RECHECK = "effectflow:approval-recheck"
#: What the model is told about a call the ledger answered for an earlier tool-call id.
ALREADY_DONE = answers.ALREADY_DONE
#: What the model is told about a call a person declined.
DECLINED = answers.DECLINED
#: What the model is told about a call whose approval no longer holds.
APPROVAL_OUTDATED = (
    "this was not done: the approval given was for another request (other arguments, or an "
    "approval policy that has changed since); call the tool again to ask for a new approval"
)
#: What the model is told about a call whose run an operator cancelled before it was made.
CANCELLED = answers.CANCELLED
#: The errors answered ``refused`` (an ``IdempotencyConflict`` is answered before: a request
#: changed under a person's approval voids it).
_REFUSED = (errors.ArgumentError, errors.ContractError)
#: How many times one invocation asks the guard again after settling what it was asked about
#: (an approval recorded, an earlier call declined): each pass settles one call.
_MAX_PASSES = 4


class GuardedCall:
    """The guarded path of one tool: what ``on_invoke_tool`` and ``needs_approval`` do.

    Args:
        rt: The runtime whose ledger records the calls.
        tool: The ``ef.tool`` whose contract governs each call.
        schema: The JSON schema the model's arguments are checked against (the FunctionTool's).
        scope: The conversation: a fixed id, or a function of the run's context.
        policy: The approval policy in force (a version, a digest of the rules), or a function
            of the run's context giving it; an approval counts only under the policy it was asked
            under. None: the contract's version is the policy.
        approver: Who approves through ``RunState.approve`` (recorded in the audit log).
    """

    def __init__(
        self,
        rt: Runtime,
        tool: Tool[..., Any],
        schema: Mapping[str, Any],
        *,
        scope: Source,
        policy: Source | None = None,
        approver: Source = SDK_APPROVER,
    ) -> None:
        self.rt = rt
        self.tool = tool
        self._validator = definitions.schema_validator(json.dumps(dict(schema), sort_keys=True))
        self._scope = scope
        self._policy = policy
        self._approver = approver

    # -- the SDK's hooks --------------------------------------------------------------------------

    async def invoke(self, ctx: ToolContext[Any], arguments: str) -> str:
        """``on_invoke_tool``: the call through ``rt.guard_async``, its answer as JSON text."""
        parsed = self._arguments(arguments)
        if isinstance(parsed, str):
            return answers.as_json({"status": "refused", "happened": False, "error": parsed})
        call = self._call(ctx, ctx.tool_call_id)
        passes = 0
        deadline = time.monotonic() + guard_mod.IN_PROGRESS_WAIT
        while passes < _MAX_PASSES:
            try:
                done = await self._guard(call, parsed, _known_call_ids(ctx, call))
            except errors.NeedsPerson as asked:
                if asked.kind != "approval":
                    if time.monotonic() < deadline and await asyncio.to_thread(
                        self._being_made, asked
                    ):
                        # The same request is being made right now (a parallel call of the same
                        # response, another worker): its answer is this call's too.
                        await asyncio.sleep(0.05)
                        continue
                    return answers.as_json(answers.waiting(asked))
                passes += 1
                answer = await asyncio.to_thread(self._settle_approval, ctx, call, asked)
                if answer is None:
                    continue  # recorded the person's decision: the guard answers now
                return answers.as_json(answer)
            except errors.IdempotencyConflict as exc:
                return answers.as_json(await asyncio.to_thread(self._changed_request, call, exc))
            except errors.EffectflowError as exc:
                return answers.as_json(await asyncio.to_thread(self._failure, exc))
            return answers.as_json(answers.done(done))
        return answers.as_json(
            {
                "status": "waiting_for_approval",
                "happened": None,
                "message": guard_mod.WAITS_FOR_APPROVAL,
            }
        )

    async def needs_approval(
        self, ctx: RunContextWrapper[Any], params: dict[str, Any], tool_call_id: str
    ) -> bool:
        """``needs_approval``: record the request the person is asked about, under the policy of
        this moment, and say whether the SDK must stop for it.

        A call the ledger already answers (approved elsewhere, done, declined, in doubt) needs no
        interruption: ``invoke`` answers it."""
        if isinstance(self._arguments(json.dumps(params)), str):
            return False  # refused by ``invoke`` without a call
        call = self._call(ctx, tool_call_id)
        for _ in range(_MAX_PASSES):
            try:
                await self._guard(call, params, _known_call_ids(ctx, call))
            except errors.NeedsPerson as asked:
                if asked.kind != "approval":
                    return False
                if await asyncio.to_thread(self._declined_in_sdk, ctx, asked):
                    continue  # an earlier call of the same request was declined: ask for this one
                return True
            except errors.EffectflowError:
                return False
            return False
        return True

    # -- the call ---------------------------------------------------------------------------------

    def _call(self, ctx: RunContextWrapper[Any], tool_call_id: str) -> _Call:
        scope = _read(self._scope, ctx, "scope")
        policy = None
        if self._policy is not None and self.tool.contract.needs_approval:
            policy = _read(self._policy, ctx, "policy")  # only approvals are bound to one
        return _Call(
            scope=f"{SCOPE_PREFIX}:{scope}",
            tool_call_id=tool_call_id,
            policy=policy,
            call_id=call_id_of(tool_call_id, policy),
            tool_name=self.tool.name,
        )

    async def _guard(
        self, call: _Call, arguments: dict[str, Any], known: Collection[str]
    ) -> Guarded:
        return await self.rt.guard_async(
            self.tool, arguments, scope=call.scope, call_id=call.call_id, known_call_ids=known
        )

    def _arguments(self, raw: str) -> dict[str, Any] | str:
        """The model's arguments, or what is wrong with them (for the model)."""
        try:
            parsed = json.loads(raw or "{}")
        except ValueError as exc:
            return f"the arguments are not JSON: {exc}"
        if not isinstance(parsed, dict):
            return "the arguments must be a JSON object"
        try:
            self._validator.validate(parsed)
        except jsonschema.ValidationError as exc:
            return exc.message
        return parsed

    # -- approvals --------------------------------------------------------------------------------

    def _settle_approval(
        self, ctx: ToolContext[Any], call: _Call, asked: errors.NeedsPerson
    ) -> dict[str, Any] | None:
        """A call waits for an approval in the ledger while the SDK invokes this tool call:
        record the SDK's decision if it was given for this very request under this policy
        (None: ask the guard again), else say why nothing was done."""
        run = self.rt.run(asked.run_id or "")
        tool_call_id, policy = split_call_id(str(run.input.get("call_id", "")))
        approved = ctx.is_tool_approved(self.tool.name, call.tool_call_id) is True
        if tool_call_id == call.tool_call_id and policy != call.policy:
            # The person approved this tool call under another policy (#4896): that approval
            # is spent on nothing; the model asks again and a person decides under this one.
            self._reject(
                run,
                by=RECHECK,
                reason=f"the approval policy changed from {policy!r} to {call.policy!r} since "
                "the approval was asked; a new approval is needed",
            )
            return {"status": "approval_outdated", "happened": False, "error": APPROVAL_OUTDATED}
        if tool_call_id != call.tool_call_id and self._declined_in_sdk(ctx, asked):
            return None
        if not approved:
            return {"status": "waiting_for_approval", "happened": None,
                    "message": asked.for_model}  # fmt: skip
        # Approved in the SDK for this call: the same request (the guard refused any other) under
        # the same policy. An earlier tool-call id of the same request in this conversation is the
        # same operation (a call regenerated while it waited): the approval is recorded on it.
        # Decided meanwhile (the console, another process): the guard says how.
        with contextlib.suppress(errors.StaleState):
            self.rt.approve(
                run.run_id,
                guard_mod.STEP_ID,
                approver=_read(self._approver, ctx, "approver"),
                approval_id=f"{SCOPE_PREFIX}:{run.run_id}:{_request_digest(run)}",
                note=f"approved through the Agents SDK for tool call {call.tool_call_id}",
            )
        return None

    def _being_made(self, asked: errors.NeedsPerson) -> bool:
        """Whether the call the ledger was unsure of is another call of the same request that a
        live owner is making, or has just made: asked again, the guard answers from it. One left
        in doubt (paused for a person, ended unsettled) is not waited for."""
        if asked.run_id is None:
            return False
        run = self.rt.store.get_run(asked.run_id, tenant=self.rt.tenant)
        if run is None:
            return False
        if run.status is RunStatus.SUCCEEDED:
            return True
        return run.status is RunStatus.RUNNING and self.rt.interruption(run) is None

    def _declined_in_sdk(self, ctx: RunContextWrapper[Any], asked: errors.NeedsPerson) -> bool:
        """Whether the call the ledger asks about is one the SDK's person declined
        (``RunState.reject``, which never reaches the tool): then it is declined in the ledger
        too, so it no longer stands for the request."""
        run = self.rt.run(asked.run_id or "")
        tool_call_id, _ = split_call_id(str(run.input.get("call_id", "")))
        if ctx.is_tool_approved(self.tool.name, tool_call_id) is not False:
            return False
        reason = ctx.get_rejection_message(self.tool.name, tool_call_id) or "declined"
        self._reject(
            run,
            by=_read(self._approver, ctx, "approver"),
            reason=f"declined through the Agents SDK: {reason}",
        )
        return True

    def _reject(self, run: records.RunRecord, *, by: str, reason: str) -> None:
        with contextlib.suppress(errors.StaleState):  # answered meanwhile
            self.rt.reject(run.run_id, guard_mod.STEP_ID, by=by, reason=reason)

    def _changed_request(self, call: _Call, exc: errors.IdempotencyConflict) -> dict[str, Any]:
        """The tool-call id was recorded with another request. Waiting for an approval, the
        request changed under the person's decision (the run's state was edited): that approval
        is void, nothing is sent, and the model is asked to call again."""
        own = self.rt.store.get_run(
            guard_mod.run_id_of(self.rt.tenant, call.scope, call.call_id), tenant=self.rt.tenant
        )
        if own is not None and _awaits_approval(own):
            with contextlib.suppress(errors.StaleState):
                self.rt.reject(
                    own.run_id,
                    guard_mod.STEP_ID,
                    by=RECHECK,
                    reason="the request changed after it was presented for approval",
                )
            return {"status": "approval_outdated", "happened": False, "error": APPROVAL_OUTDATED}
        return {"status": "refused", "happened": False, "error": exc.message}

    # -- failures ---------------------------------------------------------------------------------

    def _failure(self, exc: errors.EffectflowError) -> dict[str, Any]:
        """A guarded call that ended without a result, phrased for the model; one no row names
        may have happened (the SDK's tool answers, it does not raise)."""
        return answers.failure(self.rt, self.tool, exc, refused=_REFUSED, unknown_otherwise=True)


@dataclasses.dataclass(frozen=True)
class _Call:
    """One tool call's identity in the ledger."""

    #: The ledger's scope (``openai-agents:<conversation>``).
    scope: str
    #: The model's tool-call id (``ToolContext.tool_call_id``).
    tool_call_id: str
    #: The approval policy the call is made under (None: none given, or no approval needed).
    policy: str | None
    #: The guarded call's id (``call_id_of``).
    call_id: str
    #: The tool's name, as the SDK knows it.
    tool_name: str


def call_id_of(tool_call_id: str, policy: str | None) -> str:
    """The guarded call's id: the model's tool-call id, with the approval policy it is made
    under when one is given (a JSON pair, so no id can be mistaken for another). The same tool
    call under another policy is then another call, which no earlier approval covers."""
    if not tool_call_id:
        raise errors.ArgumentError(
            "the tool call has no id; effectflow needs the model's tool-call id to know a "
            "replay from a new call"
        )
    return tool_call_id if policy is None else digests.canonical_json([tool_call_id, policy])


def split_call_id(call_id: str) -> tuple[str, str | None]:
    """``call_id_of`` read back: the tool-call id, and the policy (None when none was given)."""
    if call_id.startswith('["'):
        try:
            pair = json.loads(call_id)
        except ValueError:
            return call_id, None
        if isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair):
            return pair[0], pair[1]
    return call_id, None


def _read(source: Source, ctx: RunContextWrapper[Any], what: str) -> str:
    value = source(ctx) if callable(source) else source
    if not isinstance(value, str) or not value.strip():
        raise errors.ArgumentError(
            f"effectflow's {what} for the Agents SDK must be a non-empty string (or a function "
            f"of the run context returning one), not {value!r}"
        )
    return value


def _known_call_ids(ctx: RunContextWrapper[Any], call: _Call) -> frozenset[str]:
    """The tool-call ids of the earlier calls whose *result* the run's input shows (the
    conversation the application or its session passed): a repeat of one of them is the model
    asking again knowingly, a new request. A call whose output said it may have happened, or
    whose output is missing (the turn was lost), is not among them: its repeat is the same call.
    Calls made earlier in the same ``Runner.run`` are not in its input: a repeat of one of those
    is answered as already done, never made twice."""
    outputs: dict[str, Any] = {}
    for item in ctx.turn_input or ():
        if isinstance(item, Mapping) and item.get("type") == "function_call_output":
            outputs[str(item.get("call_id"))] = item.get("output")
    known = {
        tool_call_id
        for tool_call_id, output in outputs.items()
        if tool_call_id != call.tool_call_id and answers.shows_result(output)
    }
    return frozenset(known | {call_id_of(k, call.policy) for k in known})


def _awaits_approval(run: records.RunRecord) -> bool:
    return (
        run.status is RunStatus.PAUSED
        and (run.error or {}).get("code") == approvals.APPROVAL_REQUIRED
    )


def _request_digest(run: records.RunRecord) -> str:
    digest = (run.error or {}).get("request_digest")
    return str(digest) if digest else "request"
