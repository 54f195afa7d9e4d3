"""Every tool call of an ``ef.tool`` through ``rt.guard``, inside a Pydantic AI agent.

``Effectflow`` is a capability that contributes one function toolset (id ``effectflow``) made
from the ``ef.tool``s: each tool's name, description and JSON schema come from its contract and
signature (without the parameters the runtime injects, such as the idempotency key), and its
function is the guarded call:

- scope = ``pydantic_ai:`` + the run's ``conversation_id`` (the same across the runs of one
  conversation, and under a durable engine derived from its workflow id, so a recovered run has
  it again; ``scope_of``), call id = the model's ``tool_call_id``; so a replayed run asks the
  ledger, not the provider;
- ``known_call_ids`` = the earlier calls whose *result* the conversation shows
  (``conversation_call_ids``): a repeat of one is the model asking again knowingly, a new request;
  a call whose turn was lost is regenerated and deduplicated (docs/concepts.md#regenerated-calls);
- the result goes back as a dict (``status``, ``happened``, ``result``), and a call the ledger
  answered for an earlier id says it was already done; an outcome nobody knows yet is phrased for
  the model (it may have happened, do not repeat it);
- "needs a person" (an approval, an effect that may have happened) raises Pydantic AI's
  ``ApprovalRequired`` with a payload (``decisions.payload``): the run ends with
  ``DeferredToolRequests``, and the next run resumed with the person's decision
  (``decisions.answer``) records it in the ledger and asks the guard again.

The guarded call lives in the tool function, not in a ``wrap_tool_execute`` hook or a wrapper
around the toolset, because a durable engine runs a *function tool* in its durable unit (a Temporal
activity, a Prefect task) but runs capability hooks and outer toolsets in its workflow code, where
I/O is not allowed or is re-run on replay without the host's ids. docs/integrations/pydantic_ai.md
has the whole argument.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import jsonschema
from pydantic_ai import FunctionToolset, RunContext
from pydantic_ai import Tool as PydanticTool
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.exceptions import ApprovalRequired, ModelRetry
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, ToolReturnPart

from effectflow import errors
from effectflow.contracts.tool import Tool
from effectflow.contrib._host import answers, definitions
from effectflow.contrib.agents import schemas
from effectflow.contrib.pydantic_ai import decisions
from effectflow.ledger.records import RunStatus
from effectflow.runtime import guard as guard_mod

if TYPE_CHECKING:
    from pydantic_ai.models import ModelRequestContext

    from effectflow.runtime.guard import Guarded
    from effectflow.runtime.runtime import Runtime

#: The id of the toolset the capability contributes (durable engines name their units by it).
TOOLSET_ID = "effectflow"
#: What the model is told about a call the ledger answered for an earlier tool-call id.
ALREADY_DONE = answers.ALREADY_DONE
#: What the model is told about a call a person declined.
DECLINED = answers.DECLINED
#: What the model is told about a call whose run an operator cancelled before it was made.
CANCELLED = answers.CANCELLED
#: Who the ledger records as having declined a call answered with a plain ``ToolDenied``.
TOOL_DENIED_BY = "pydantic_ai.ToolDenied"


def scope_of(ctx: RunContext[Any]) -> str:
    """The guarded call's scope: the run's conversation.

    A run resumed with deferred tool results is a new run (a new ``run_id``) of the same
    conversation, and a durable engine derives the conversation id from its workflow id, so a
    recovered run has the same one; the run id is the fallback when there is none.

    Raises:
        errors.ArgumentError: the run has neither (a bare ``RunContext``, not an agent run).
    """
    identity = ctx.conversation_id or ctx.run_id
    if not identity:
        raise errors.ArgumentError(
            "effectflow needs the agent run's durable identity (its conversation_id or run_id); "
            "call the tool through Agent.run"
        )
    return f"pydantic_ai:{identity}"


def conversation_call_ids(messages: Sequence[ModelMessage], current: str) -> frozenset[str]:
    """The tool-call ids of the earlier calls whose *result* the conversation shows: a repeat of
    one of them is the model asking again knowingly, a new request. A call the model was told may
    have happened (or waits for a person), and one whose turn was lost, are not among them: a
    repeat of those is the same call, never made twice."""
    returned = {
        part.tool_call_id: part
        for message in messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    }
    return frozenset(
        call.tool_call_id
        for message in messages
        if isinstance(message, ModelResponse)
        for call in message.tool_calls
        if call.tool_call_id != current and _shows_result(returned.get(call.tool_call_id))
    )


def _shows_result(part: ToolReturnPart | None) -> bool:
    """Whether a tool's return shows the call's result (effectflow's dict says whether it
    happened; another tool's successful return, also of nothing, is its result)."""
    if part is None or part.outcome != "success":
        return False
    return part.content is None or answers.shows_result(part.content)


class Effectflow(AbstractCapability[Any]):
    """Routes every call of the given ``ef.tool``s through ``rt.guard``.

    Args:
        rt: The runtime whose ledger records the calls.
        tools: The ``ef.tool``s the agent offers; the capability contributes them as a toolset
            (no need to list them in ``Agent(tools=...)`` too).
        defer: When a person must decide, defer the call with ``ApprovalRequired`` (the
            default; give the agent ``output_type=[..., DeferredToolRequests]``); False tells
            the model it is being checked, or waits for approval, and the run goes on.
        scope: How the scope comes from the run's context (``scope_of`` by default).
    """

    def __init__(
        self,
        rt: Runtime,
        *,
        tools: Iterable[Tool[..., Any]],
        defer: bool = True,
        scope: Callable[[RunContext[Any]], str] = scope_of,
    ) -> None:
        self.rt = rt
        self.tools = tuple(definitions.checked(tool, "Effectflow") for tool in tools)
        self.defer = defer
        self.scope = scope
        self._by_name = {tool.name: tool for tool in self.tools}
        self._toolset = FunctionToolset[Any](
            [self._pydantic_tool(tool) for tool in self.tools], id=TOOLSET_ID
        )

    @classmethod
    def get_serialization_name(cls) -> str | None:
        """Not in agent specs: it holds a runtime."""
        return None

    def get_toolset(self) -> FunctionToolset[Any]:
        """The ``ef.tool``s as Pydantic AI function tools whose functions make the guarded call."""
        return self._toolset

    async def before_model_request(
        self, ctx: RunContext[Any], request_context: ModelRequestContext
    ) -> ModelRequestContext:
        """Record a plain ``ToolDenied`` of an effectflow approval as the person's decline.

        Pydantic AI answers a denied call itself, without calling the tool: without this, the
        ledger would keep the call waiting for an approval nobody will give. ``decisions.answer``
        (``approved: False``) is the way to say who declined; this records ``TOOL_DENIED_BY``.
        """
        denied = [
            part
            for message in ctx.messages
            if isinstance(message, ModelRequest)
            for part in message.parts
            if isinstance(part, ToolReturnPart)
            and part.outcome == "denied"
            and part.tool_name in self._by_name
        ]
        for part in denied:
            scope = self.scope(ctx)
            run_id = guard_mod.run_id_of(self.rt.tenant, scope, part.tool_call_id)
            await asyncio.to_thread(self._record_denial, run_id, str(part.content))
        return request_context

    def _record_denial(self, run_id: str, reason: str) -> None:
        run = self.rt.store.get_run(run_id, tenant=self.rt.tenant)
        if run is None or run.status is not RunStatus.PAUSED:
            return  # never asked, or decided already
        # StaleState: the call does not wait for an approval (it waits on an effect in doubt,
        # which stays listed for a person, or it was decided meanwhile); nothing is recorded.
        with contextlib.suppress(errors.StaleState):
            self.rt.reject(run_id, guard_mod.STEP_ID, by=TOOL_DENIED_BY, reason=reason or "denied")

    def _pydantic_tool(self, tool: Tool[..., Any]) -> PydanticTool[Any]:
        async def guarded(ctx: RunContext[Any], **arguments: Any) -> dict[str, Any]:
            return await self._call(tool, ctx, arguments)

        return PydanticTool[Any].from_schema(
            guarded,
            name=tool.name,
            description=definitions.description(tool),
            json_schema=schemas.parameters_schema(tool),
            takes_ctx=True,
        )

    async def _call(
        self, tool: Tool[..., Any], ctx: RunContext[Any], arguments: dict[str, Any]
    ) -> dict[str, Any]:
        """One tool call: the guard, and the person's decision when the call was deferred.

        Pydantic AI calls the tool again when the run is resumed with the call approved; the
        decision in its metadata is recorded first, then the guard answers from the ledger, so a
        decision already applied (by an earlier run that died) is not applied twice.
        """
        call_id = ctx.tool_call_id
        if not call_id:
            raise errors.ArgumentError(
                f"the tool call of {tool.ref} has no id; effectflow needs the model's tool-call "
                "id to know a replay from a new call"
            )
        try:
            definitions.tool_validator(tool).validate(arguments)
        except jsonschema.ValidationError as exc:
            raise ModelRetry(f"the arguments do not fit the schema: {exc.message}") from None
        scope = self.scope(ctx)
        guard = functools.partial(
            self.rt.guard_async,
            tool,
            arguments,
            scope=scope,
            call_id=call_id,
            known_call_ids=_known_call_ids(ctx, call_id),
        )
        decision = ctx.tool_call_metadata if ctx.tool_call_approved else None
        refused: str | None = None
        if ctx.tool_call_approved and not decision:
            # Approved in Pydantic AI without a decision the ledger can record: only one recorded
            # elsewhere (the console, the CLI) lets the call go on.
            refused = (
                "approved without a decision effectflow can record (who decided, and what): "
                "resume with effectflow.contrib.pydantic_ai.answer(requests, {tool_call_id: "
                "<a decision shaped like this call's resume_with>}), or record it in the ledger "
                "first (rt.approve, rt.resolve, the console)"
            )
        while True:
            try:
                done: Guarded = await guard()
            except errors.NeedsPerson as asked:
                pending, decision = decision, None
                if pending:  # ({} or none: decided elsewhere, yet the ledger still waits)
                    try:
                        await asyncio.to_thread(
                            decisions.apply, self.rt, asked, pending, scope, call_id
                        )
                    except errors.ArgumentError as exc:
                        refused = exc.message
                    else:
                        refused = None
                        continue
                if not self.defer:
                    return answers.waiting(asked)
                shown = decisions.payload(asked, tool, arguments, scope, call_id)
                raise ApprovalRequired(
                    metadata=shown if refused is None else {**shown, "refused": refused}
                ) from None
            except errors.EffectflowError as exc:
                return answers.failure(self.rt, tool, exc)
            return answers.done(done)


def _known_call_ids(ctx: RunContext[Any], current: str) -> frozenset[str]:
    """The conversation's answered calls, or none where the durable unit does not carry the
    messages (inside a Temporal activity reading them raises): then every repeat counts as the
    same call, which never makes one twice."""
    try:
        messages = ctx.messages
    except Exception:  # a durable unit's run context guards the fields it did not carry
        return frozenset()
    return conversation_call_ids(messages, current)
