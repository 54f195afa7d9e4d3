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
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import jsonschema
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command, interrupt

from effectflow import errors
from effectflow.contracts.tool import Tool
from effectflow.contrib._host import answers, decisions, definitions
from effectflow.contrib.langgraph import tools as tools_mod

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

    from effectflow.runtime.guard import Guarded
    from effectflow.runtime.runtime import Runtime

#: Marks an ``interrupt()`` payload as effectflow's (a host may raise interrupts of its own).
PAYLOAD_MARK = decisions.PAYLOAD_MARK
#: What the model is told about a call the ledger answered for an earlier tool-call id.
ALREADY_DONE = answers.ALREADY_DONE
#: What the model is told about a call a person declined.
DECLINED = answers.DECLINED
#: What the model is told about a call whose run an operator cancelled before it was made.
CANCELLED = answers.CANCELLED
#: How a ``Command(resume=...)`` that cannot be recorded is refused (in the next interrupt).
WORDING = decisions.Wording(
    not_a_mapping="resume effectflow's interrupt with a mapping, e.g. {hint}; got {decision!r}",
    wrong_shape=(
        "resume effectflow's {kind} interrupt with {hint}, or {{}} once it was decided "
        "elsewhere; got {decision!r}"
    ),
    unnamed=decisions.UNNAMED,
)
#: The arguments' validator, built once per tool (``benchmarks/compare/lg_agent_crash.py`` calls
#: it by this name).
_validator = definitions.tool_validator

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
                    return _message(call, answers.waiting(asked))
                payload = decisions.payload(asked, tool, arguments, scope, call_id)
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
                return _message(call, answers.failure(self.rt, tool, exc))
            return _message(call, answers.done(done), done)


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
        and answers.shows_result(answered.get(str(call.get("id"))))
    )


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
        content=answers.as_json(content),
        tool_call_id=call["id"],
        name=call.get("name"),
        artifact=artifact,
        status="success" if content["status"] in ("done", "already_done") else "error",
    )


def _decide(
    rt: Runtime, asked: errors.NeedsPerson, decision: Any, scope: str, call_id: str
) -> None:
    """Apply the person's decision from ``Command(resume=...)``.

    ``{}`` means it was decided elsewhere (the console, the CLI): the guard is just asked again
    (``Command(resume=None)`` is no resume at all to LangGraph). A decision someone else applied
    first (``StaleState``) is not an error.
    """
    decisions.record(rt, decisions.Question.asked(asked, scope, call_id), decision, WORDING)
