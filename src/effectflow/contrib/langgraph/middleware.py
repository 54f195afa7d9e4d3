"""Every tool call of an effectflow-backed tool through ``rt.guard``, inside a LangGraph graph.

``EffectflowMiddleware`` is a LangChain v1 ``AgentMiddleware`` (``create_agent(middleware=[...])``);
its ``wrap_tool_call`` / ``awrap_tool_call`` are also LangGraph ``ToolNode``'s wrappers of the same
names. For each tool call of a tool ``langchain_tool`` made (or one named in ``tools=``):

- scope = the run's ``thread_id`` and its checkpoint namespace without task ids (the graph path
  of the tool node, stable across the graph's steps), call id = the model's tool-call id; so a
  graph replayed from its checkpoint asks the ledger, not the provider;
- the result goes back as the ToolMessage's JSON content (``status``, ``happened``, ``result``),
  and a call the ledger answered for an earlier id says it was already done;
- "needs a person" (an approval, an effect that may have happened) becomes LangGraph's
  ``interrupt()`` with a payload naming the effect and the next action; the value of
  ``Command(resume=...)`` carries the person's decision into ``rt.approve`` / ``rt.reject`` /
  ``rt.resolve``, then the call is asked again through ``rt.guard``. A decision the ledger refuses
  (no name, a wrong shape) is not the end: the node interrupts again, saying why, and the next
  ``Command(resume=...)`` answers that interrupt.

Tool calls of other tools pass through to the handler untouched.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import jsonschema
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command, interrupt

from effectflow import errors
from effectflow.contracts.tool import Tool
from effectflow.contrib.agents import schemas
from effectflow.contrib.langgraph import tools as tools_mod
from effectflow.ledger.records import RunStatus
from effectflow.runtime import guard as guard_mod

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

    from effectflow.runtime.guard import Guarded
    from effectflow.runtime.runtime import Runtime

#: Marks an ``interrupt()`` payload as effectflow's (a host may raise interrupts of its own).
PAYLOAD_MARK = "effectflow"
#: What the model is told about a call the ledger answered for an earlier tool-call id.
ALREADY_DONE = (
    "this was already done earlier in this conversation (the same tool with the same "
    "arguments); it was not done again; this is its result"
)
#: What the model is told about a call a person declined.
DECLINED = "a person declined this call; it was not done; do not repeat it"
#: What the model is told about a call whose run an operator cancelled before it was made.
CANCELLED = "this call was cancelled by an operator; it was not done; do not repeat it"

# LangGraph's checkpoint namespace: ``node:task_id`` parts joined by ``|`` (its NS_SEP / NS_END).
_NS_SEP = "|"
_NS_END = ":"

_Step = Callable[[], Any]
_Handler = Callable[[ToolCallRequest], "ToolMessage | Command[Any]"]
_AsyncHandler = Callable[[ToolCallRequest], "Awaitable[ToolMessage | Command[Any]]"]


def scope_of(config: RunnableConfig) -> str:
    """The guarded call's scope: the thread and the graph path of the node making the call.

    The task ids in LangGraph's ``checkpoint_ns`` change with every step, so they are dropped:
    a call regenerated in a later step (the host lost the model's turn) is in the same scope.

    Raises:
        errors.ArgumentError: the run has no ``thread_id`` (no checkpointer, no durable identity).
    """
    configurable = config.get("configurable") or {}
    thread = configurable.get("thread_id")
    if thread is None or not str(thread).strip():
        raise errors.ArgumentError(
            "effectflow needs the graph's durable identity: invoke it with a checkpointer and "
            "config={'configurable': {'thread_id': ...}}"
        )
    namespace = str(configurable.get("checkpoint_ns") or "")
    path = _NS_SEP.join(part.split(_NS_END, 1)[0] for part in namespace.split(_NS_SEP) if part)
    return f"langgraph:{thread}:{path}" if path else f"langgraph:{thread}"


class EffectflowMiddleware(AgentMiddleware):
    """Routes the tool calls of effectflow-backed tools through ``rt.guard``.

    Args:
        rt: The runtime whose ledger records the calls.
        tools: ``ef.tool``s the agent offers; the middleware registers them with the agent (no
            need to list them in ``create_agent(tools=...)`` too).
        interrupt: When a person must decide, pause the graph with ``interrupt()`` (the
            default); False tells the model it is being checked and carries on instead.
        scope: How the scope comes from the run's config (``scope_of`` by default).
    """

    def __init__(
        self,
        rt: Runtime,
        *,
        tools: Iterable[Tool[..., Any]] = (),
        interrupt: bool = True,
        scope: Callable[[RunnableConfig], str] = scope_of,
    ) -> None:
        super().__init__()
        self.rt = rt
        self.tools = tools_mod.langchain_tools(tools)
        self._by_name = {t.name: t.effectflow for t in self.tools}
        self._interrupt = interrupt
        self._scope = scope

    def wrap_tool_call(
        self, request: ToolCallRequest, handler: _Handler
    ) -> ToolMessage | Command[Any]:
        """The guarded call (the ``create_agent`` hook and ``ToolNode(wrap_tool_call=...)``)."""
        tool = self._tool(request)
        if tool is None:
            return handler(request)
        steps = self._guarded(tool, request)
        try:
            step = next(steps)
            while True:
                try:
                    value = step()
                except Exception as exc:
                    step = steps.throw(exc)
                else:
                    step = steps.send(value)
        except StopIteration as stop:
            message: ToolMessage = stop.value
            return message

    async def awrap_tool_call(
        self, request: ToolCallRequest, handler: _AsyncHandler
    ) -> ToolMessage | Command[Any]:
        """The asyncio twin: the same steps, each ledger call on a worker thread."""
        tool = self._tool(request)
        if tool is None:
            return await handler(request)
        steps = self._guarded(tool, request)
        try:
            step = next(steps)
            while True:
                try:
                    value = await asyncio.to_thread(step)
                except Exception as exc:
                    step = steps.throw(exc)
                else:
                    step = steps.send(value)
        except StopIteration as stop:
            message: ToolMessage = stop.value
            return message

    def _tool(self, request: ToolCallRequest) -> Tool[..., Any] | None:
        return tools_mod.effectflow_tool(request.tool) or self._by_name.get(
            request.tool_call["name"]
        )

    def _guarded(
        self, tool: Tool[..., Any], request: ToolCallRequest
    ) -> Generator[_Step, Any, ToolMessage]:
        """The call as steps (ledger work the driver runs sync or on a thread) and interrupts.

        Each LangGraph resume re-runs this from the top: the guard answers from the ledger, and
        ``interrupt()`` returns the resume values in order, so a decision already applied is not
        applied twice (``rt.guard`` answers before it is reached).
        """
        call = request.tool_call
        call_id = call.get("id")
        if not call_id:
            raise errors.ArgumentError(
                f"the tool call of {tool.ref} has no id; effectflow needs the model's "
                "tool-call id to know a replay from a new call"
            )
        arguments = dict(call.get("args") or {})
        try:
            _validator(tool).validate(arguments)
        except jsonschema.ValidationError as exc:
            return _message(call, {"status": "refused", "happened": False, "error": exc.message})
        scope = self._scope(request.runtime.config)
        guard = functools.partial(
            self.rt.guard,
            tool,
            arguments,
            scope=scope,
            call_id=call_id,
            known_call_ids=_conversation_call_ids(request.state, call_id),
        )
        while True:
            try:
                done: Guarded = yield guard
            except errors.NeedsPerson as asked:
                if not self._interrupt:
                    return _message(call, _waiting(asked))
                payload = _payload(asked, tool, arguments, scope, call_id)
                while True:
                    # LangGraph answers the interrupts of a node in order: a refused decision
                    # stays the answer of its interrupt, so the next one asks again.
                    decision = interrupt(payload)
                    try:
                        yield functools.partial(_decide, self.rt, asked, decision, scope, call_id)
                    except errors.ArgumentError as refused:
                        payload = {**payload, "refused": refused.message}
                        continue
                    break
                continue
            except errors.EffectflowError as exc:
                return _message(call, self._failure(tool, exc))
            return _message(call, _done(done), done)

    def _failure(self, tool: Tool[..., Any], exc: errors.EffectflowError) -> dict[str, Any]:
        """A guarded call that ended without a result, phrased for the model (as the agent loop
        phrases it)."""
        declined = _declined(self.rt, exc) if isinstance(exc, errors.StepRejected) else None
        if declined is not None:
            return {"status": "declined", "happened": False, "error": DECLINED,
                    "reason": declined}  # fmt: skip
        if isinstance(exc, errors.StepRejected):
            return {"status": "rejected", "happened": False, "error": exc.message}
        if isinstance(exc, errors.RetryBudgetExhausted):
            return {"status": "not_committed", "happened": False, "error": exc.message}
        if isinstance(exc, errors.IdempotencyConflict | errors.ArgumentError):
            return {"status": "refused", "happened": False, "error": exc.message}
        run_id = getattr(exc, "run_id", None)
        if run_id is not None and self.rt.run(run_id).status is RunStatus.CANCELLED:
            return {"status": "cancelled", "happened": False, "error": CANCELLED}
        if isinstance(exc, errors.StepFailed) and not tool.contract.effect.writes:
            return {"status": "failed", "happened": False, "error": exc.message}
        if isinstance(exc, errors.StepFailed):
            return {"status": "unknown", "happened": None, "message": guard_mod.MAY_HAVE_HAPPENED}
        raise exc


@functools.lru_cache(maxsize=1024)
def _validator(tool: Tool[..., Any]) -> Any:
    """The arguments' validator, built once per tool: ``jsonschema.validate`` checks the schema
    itself on every call, most of the middleware's own cost (BENCHMARKS.md)."""
    schema = schemas.parameters_schema(tool)
    return jsonschema.validators.validator_for(schema)(schema)


def _declined(rt: Runtime, exc: errors.StepRejected) -> str | None:
    """The person's reason, when the call was declined (``rt.reject``) rather than refused by the
    provider; None otherwise."""
    if exc.run_id is None:
        return None
    step = next((s for s in rt.steps(exc.run_id) if s.step_id == exc.step_id), None)
    error = {} if step is None else (step.error or {})
    return str(error.get("reason")) if error.get("code") == "approval_declined" else None


def _conversation_call_ids(state: Any, current: str) -> frozenset[str]:
    """The tool-call ids of the earlier calls whose *result* the graph's conversation shows
    (docs/concepts.md#regenerated-calls): a repeat of one of them is the model asking again
    knowingly, a new request. A call the model was told may have happened (or waits for approval)
    is not among them, nor one whose turn was lost: a repeat of those is the same call, never made
    twice."""
    messages = state.get("messages", []) if isinstance(state, Mapping) else []
    if not isinstance(messages, list):
        return frozenset()
    answered = {
        str(m.tool_call_id): m.content
        for m in messages
        if isinstance(m, ToolMessage) and m.tool_call_id
    }
    return frozenset(
        str(call.get("id"))
        for message in messages
        for call in getattr(message, "tool_calls", None) or ()
        if isinstance(call, Mapping)
        and call.get("id")
        and call.get("id") != current
        and _shows_result(answered.get(str(call.get("id"))))
    )


def _shows_result(content: Any) -> bool:
    """Whether a ToolMessage's content shows the call's result (effectflow's JSON says whether it
    happened; another tool's message is its result)."""
    if content is None:
        return False
    if isinstance(content, str):
        try:
            body = json.loads(content)
        except ValueError:
            return True
        if isinstance(body, dict) and "happened" in body:
            return body["happened"] is True
    return True


def _done(done: Guarded) -> dict[str, Any]:
    if done.deduplicated:
        return {"status": "already_done", "happened": True, "result": done.value,
                "message": ALREADY_DONE}  # fmt: skip
    return {"status": "done", "happened": True, "result": done.value}


def _waiting(asked: errors.NeedsPerson) -> dict[str, Any]:
    status = "waiting_for_approval" if asked.kind == "approval" else "unknown"
    return {"status": status, "happened": None, "message": asked.for_model,
            "effect_id": asked.effect_id}  # fmt: skip


def _message(
    call: Mapping[str, Any], content: dict[str, Any], done: Guarded | None = None
) -> ToolMessage:
    """The ToolMessage: JSON content for the model, the ledger's ids as its artifact."""
    artifact = None
    if done is not None:
        artifact = {
            "run_id": done.run_id,
            "effect_id": done.effect_id,
            "deduplicated": done.deduplicated,
        }
    return ToolMessage(
        content=json.dumps(content, sort_keys=True, default=str),
        tool_call_id=call["id"],
        name=call.get("name"),
        artifact=artifact,
        status="success" if content["status"] in ("done", "already_done") else "error",
    )


def _payload(
    asked: errors.NeedsPerson,
    tool: Tool[..., Any],
    arguments: dict[str, Any],
    scope: str,
    call_id: str,
) -> dict[str, Any]:
    """What the host's person sees in ``interrupt()``: what waits, and how to answer it."""
    if asked.kind == "approval":
        answer: dict[str, Any] = {"approved": True, "approver": "<who>"}
    else:
        answer = {"committed": True, "evidence": {"result": "<what the provider shows>"},
                  "by": "<who>"}  # fmt: skip
    return {
        PAYLOAD_MARK: True,
        "kind": asked.kind,
        "next_action": asked.next_action,
        "effect_id": asked.effect_id,
        "run_id": asked.run_id,
        "step_id": asked.step_id,
        "for_model": asked.for_model,
        "message": asked.message,
        "tool": tool.ref,
        "arguments": arguments,
        "scope": scope,
        "tool_call_id": call_id,
        "resume_with": answer,
    }


def _decide(
    rt: Runtime, asked: errors.NeedsPerson, decision: Any, scope: str, call_id: str
) -> None:
    """Apply the person's decision from ``Command(resume=...)``.

    ``{}`` means it was decided elsewhere (the console, the CLI): the guard is just asked again
    (``Command(resume=None)`` is no resume at all to LangGraph). A decision someone else applied
    first (``StaleState``) is not an error.
    """
    if decision is None:
        return
    if not isinstance(decision, Mapping):
        raise errors.ArgumentError(
            f"resume effectflow's interrupt with a mapping, e.g. {_payload_hint(asked)}; "
            f"got {decision!r}"
        )
    try:
        if asked.kind == "approval" and "approved" in decision:
            who = _who(decision, "approver", asked)
            if decision["approved"]:
                rt.approve(
                    asked.run_id or "",
                    asked.step_id or "",
                    approver=who,
                    approval_id=str(decision.get("approval_id") or f"{scope}:{call_id}"),
                    note=decision.get("note"),
                )
            else:
                reason = str(decision.get("reason") or "declined")
                rt.reject(asked.run_id or "", asked.step_id or "", by=who, reason=reason)
        elif asked.kind == "in_doubt" and "committed" in decision:
            if asked.effect_id is None:
                raise errors.ArgumentError(f"no effect to resolve for call {asked.run_id}")
            rt.resolve(
                asked.effect_id,
                committed=bool(decision["committed"]),
                evidence=dict(decision.get("evidence") or {}),
                by=_who(decision, "by", asked),
                decision_id=decision.get("decision_id"),
            )
        elif decision:
            raise errors.ArgumentError(
                f"resume effectflow's {asked.kind} interrupt with {_payload_hint(asked)}, "
                f"or {{}} once it was decided elsewhere; got {dict(decision)!r}"
            )
    except errors.StaleState:
        pass  # decided meanwhile (or this decision was applied on an earlier run of the node)


def _who(decision: Mapping[str, Any], key: str, asked: errors.NeedsPerson) -> str:
    who = decision.get(key)
    if not isinstance(who, str) or not who.strip():
        raise errors.ArgumentError(
            f"the decision for {asked.run_id} must say who made it ({key!r}): the audit log "
            "records it"
        )
    return who


def _payload_hint(asked: errors.NeedsPerson) -> str:
    if asked.kind == "approval":
        return "{'approved': True, 'approver': '<who>'}"
    return "{'committed': True, 'evidence': {'result': ...}, 'by': '<who>'}"
