"""An agent loop inside a workflow: every model turn a recorded step, every tool call a keyed one.

Each model call is a ``pure`` step (``model_turn_{n}``), so after a crash recovery replays the
recorded answer and never asks the model again for a turn it already answered: a model is not
deterministic, and a second answer could ask for other calls than the ones already made. Each tool
call is a guarded call (the mechanism of ``Runtime.guard``, the LangGraph middleware and the MCP
gateway) made inside the workflow: scope ``agent:<run label>``, call id ``<model message id>:<tool
-call id>``. Because every turn is durable, no call is ever regenerated after a lost turn: the whole
conversation is known, so every call is a request of its own (``guard.request_operation``) — a model
that repeats a call, or reuses a tool-call id in a later message, gets a new operation, not the first
one's recorded result (docs/concepts.md#agents-and-models; and, for the hosts that do lose turns,
docs/concepts.md#regenerated-calls).

Messages are kept in one neutral form, the Chat Completions one (assistant messages also carry their
``id``); ``AnthropicModel`` translates to and from the Messages API. Models are duck-typed: an object
with ``complete(messages, tools) -> dict``; no SDK is imported.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from effectflow import errors
from effectflow.contracts.tool import Tool, tool
from effectflow.contrib.agents import schemas
from effectflow.runtime import guard
from effectflow.runtime.context import Context


class Model(Protocol):
    """What the loop needs of a model: one assistant message for a conversation."""

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """The next assistant message, normalized (``role``, ``id``, ``content``, ``tool_calls``).

        ``messages`` and ``tools`` are in the Chat Completions form.
        """
        ...


@dataclasses.dataclass(frozen=True)
class AgentResult:
    """How an agent run ended."""

    #: The model's final text (None when the turns ran out first).
    output: str | None
    #: The whole conversation, tool results included.
    messages: list[dict[str, Any]]
    #: How many model turns it took.
    turns: int
    #: Whether the model ended with an answer (False: ``max_turns`` was reached).
    finished: bool


_model: contextvars.ContextVar[Model] = contextvars.ContextVar("effectflow_agent_model")


@tool("agent_model_turn", effect="pure", durable=True)
def model_turn(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
    """One model call; its answer is committed before the loop goes on (``durable``), so recovery
    replays it instead of asking again."""
    return normalize(_model.get().complete(messages, tools))


def normalize(message: Mapping[str, Any]) -> dict[str, Any]:
    """An assistant message in the neutral form: JSON-string arguments, no empty fields."""
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("id") is not None:
        out["id"] = str(message["id"])
    calls = []
    for call in message.get("tool_calls") or ():
        function = call.get("function", {})
        arguments = function.get("arguments", "")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, sort_keys=True)
        calls.append(
            {
                "id": str(call.get("id", "")),
                "type": "function",
                "function": {"name": str(function.get("name", "")), "arguments": arguments},
            }
        )
    if calls:
        out["tool_calls"] = calls
    return out


def run_agent(
    ctx: Context,
    model: Model,
    tools: Sequence[Tool[..., Any]],
    messages: Sequence[Mapping[str, Any]],
    *,
    max_turns: int = 10,
    run_label: str | None = None,
) -> AgentResult:
    """Let ``model`` use ``tools`` until it answers without calling any (or ``max_turns``).

    Args:
        ctx: the workflow's context.
        model: an object with ``complete(messages, tools)``.
        tools: the tools the model may call (plus ``check_effect``, always offered).
        messages: the conversation so far, in the Chat Completions form.
        max_turns: the most model turns.
        run_label: names this agent run inside the workflow: it prefixes the step ids and enters
            the operation ids (defaults to the run id, unprefixed steps); give one per agent
            when a workflow runs several.

    Raises:
        errors.ContractError: a tool is named ``check_effect``, or two tools share a name.
    """
    by_name = {t.name: t for t in tools}
    if len(by_name) != len(tools) or schemas.CHECK_EFFECT in by_name:
        raise errors.ContractError(
            f"run_agent needs distinct tool names other than {schemas.CHECK_EFFECT!r}: "
            f"{[t.name for t in tools]}",
            run_id=ctx.run_id,
        )
    prefix = f"{run_label}:" if run_label else ""
    label = run_label or ctx.run_id
    offered = schemas.openai_tools(tools)
    transcript = [dict(m) for m in messages]
    #: What each tool-call id's latest call came to, for ``check_effect``.
    outcomes: dict[str, dict[str, Any]] = {}
    token = _model.set(model)
    try:
        for n in range(1, max_turns + 1):
            reply: dict[str, Any] = ctx.call(
                f"{prefix}model_turn_{n}", model_turn, messages=transcript, tools=offered
            )
            transcript.append(reply)
            calls = schemas.parse_openai_tool_calls(reply, tools)
            if not calls:
                return AgentResult(reply.get("content"), transcript, n, finished=True)
            message_id = str(reply.get("id") or f"turn_{n}")
            for i, call in enumerate(calls, 1):
                if isinstance(call, schemas.ToolCallError):
                    content = call.as_content()
                elif call.name == schemas.CHECK_EFFECT:
                    content = _check_effect(outcomes, str(call.arguments["tool_call_id"]))
                else:
                    outcome = _run_tool(
                        ctx,
                        f"{prefix}turn_{n}_call_{i}_{call.name}",
                        by_name[call.name],
                        call,
                        operation_id=guard.request_operation(
                            f"agent:{label}", f"{message_id}:{call.id}"
                        ),
                    )
                    outcomes[call.id] = outcome
                    content = json.dumps(outcome, sort_keys=True, default=str)
                transcript.append({"role": "tool", "tool_call_id": call.id, "content": content})
        return AgentResult(None, transcript, max_turns, finished=False)
    finally:
        _model.reset(token)


def _run_tool(
    ctx: Context, step_id: str, target: Tool[..., Any], call: schemas.ToolCall, operation_id: str
) -> dict[str, Any]:
    """One tool call through its contract, its outcome phrased for the model."""
    base = {"tool": call.name, "step_id": step_id, "operation_id": operation_id}
    try:
        result = ctx.call(step_id, target, operation_id=operation_id, **call.arguments)
    except errors.StepRejected as exc:
        return {**base, "status": "rejected", "happened": False, "error": exc.message}
    except errors.RetryBudgetExhausted as exc:
        return {**base, "status": "not_committed", "happened": False, "error": exc.message}
    except (errors.IdempotencyConflict, errors.ArgumentError) as exc:
        return {**base, "status": "refused", "happened": False, "error": exc.message}
    except errors.StepFailed as exc:
        if not target.contract.effect.writes:
            return {**base, "status": "failed", "happened": False, "error": exc.message}
        return {**base, "status": "unknown", "happened": None, "message": schemas.UNKNOWN_OUTCOME}
    return {**base, "status": "done", "happened": True, "result": result}


def _check_effect(outcomes: Mapping[str, Mapping[str, Any]], tool_call_id: str) -> str:
    """``check_effect``'s answer, from the recorded outcome of this run's call with that id.

    The outcomes are the ledger's: each came from a ``ctx.call`` that returned (or replayed) what
    the ledger recorded, so the answer is the same when a recovered run replays the conversation.
    """
    found = outcomes.get(tool_call_id)
    if found is None:
        answer: dict[str, Any] = {
            "tool_call_id": tool_call_id,
            "happened": False,
            "status": "no_such_call",
            "message": "no tool call with this id ran in this conversation",
        }
    else:
        answer = {"tool_call_id": tool_call_id, **found}
    return json.dumps(answer, sort_keys=True, default=str)


# -- models -----------------------------------------------------------------------------------------


class ScriptedModel:
    """A model that answers with pre-scripted assistant messages, for tests and demos.

    The answer to a conversation is the script's turn numbered by the assistant messages it already
    holds, so a replayed conversation meets the same turn. Every ask is counted; with ``count_file``
    the count is appended to a file, so a test counts the asks of several processes (one
    ``O_APPEND`` write per ask survives a SIGKILL right after).
    """

    def __init__(
        self,
        turns: Sequence[Mapping[str, Any]],
        *,
        count_file: str | os.PathLike[str] | None = None,
    ) -> None:
        self.turns = [normalize(t) for t in turns]
        self.count_file = Path(count_file) if count_file is not None else None
        self._asked = 0

    @property
    def asked(self) -> int:
        """How many times the model was asked (by every process, with a ``count_file``)."""
        if self.count_file is None:
            return self._asked
        return len(self.count_file.read_text().splitlines()) if self.count_file.exists() else 0

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """The scripted turn for this conversation (a final text when the script ran out)."""
        index = sum(1 for m in messages if m.get("role") == "assistant")
        self._asked += 1
        if self.count_file is not None:
            fd = os.open(self.count_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, f"turn {index + 1}\n".encode())
            finally:
                os.close(fd)
        if index >= len(self.turns):
            return {
                "role": "assistant",
                "id": f"scripted_{index + 1}",
                "content": "(no more turns)",
            }
        return {"id": f"scripted_{index + 1}", **self.turns[index]}


def _get(obj: Any, name: str, default: Any = None) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


class OpenAIChatModel:
    """A Chat Completions client (``openai.OpenAI()`` or anything shaped like it) as a ``Model``."""

    def __init__(self, client: Any, *, model: str, **options: Any) -> None:
        self.client = client
        self.model = model
        #: More keyword arguments for ``chat.completions.create`` (``temperature``, ...).
        self.options = options

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """Ask the model; the reply's assistant message, normalized."""
        # The API does not take our ``id`` on assistant messages.
        sent = [{k: v for k, v in m.items() if k != "id"} for m in messages]
        response = self.client.chat.completions.create(
            model=self.model, messages=sent, tools=tools, **self.options
        )
        message = _get(_get(response, "choices")[0], "message")
        calls = [
            {
                "id": _get(c, "id"),
                "function": {
                    "name": _get(_get(c, "function"), "name"),
                    "arguments": _get(_get(c, "function"), "arguments"),
                },
            }
            for c in _get(message, "tool_calls") or ()
        ]
        return normalize(
            {"id": _get(response, "id"), "content": _get(message, "content"), "tool_calls": calls}
        )


class AnthropicModel:
    """A Messages API client (``anthropic.Anthropic()`` or anything shaped like it) as a ``Model``."""

    def __init__(self, client: Any, *, model: str, max_tokens: int = 1024, **options: Any) -> None:
        self.client = client
        self.model = model
        self.max_tokens = max_tokens
        #: More keyword arguments for ``messages.create``.
        self.options = options

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """Ask the model; its reply as a neutral assistant message."""
        system, converted = to_anthropic_messages(messages)
        kwargs: dict[str, Any] = {"system": system} if system else {}
        response = self.client.messages.create(
            model=self.model,
            max_tokens=self.max_tokens,
            messages=converted,
            tools=[
                {
                    "name": t["function"]["name"],
                    "description": t["function"]["description"],
                    "input_schema": t["function"]["parameters"],
                }
                for t in tools
            ],
            **kwargs,
            **self.options,
        )
        blocks = _get(response, "content") or ()
        text = "".join(_get(b, "text", "") for b in blocks if _get(b, "type") == "text")
        calls = [
            {
                "id": _get(b, "id"),
                "function": {"name": _get(b, "name"), "arguments": _get(b, "input")},
            }
            for b in blocks
            if _get(b, "type") == "tool_use"
        ]
        return normalize({"id": _get(response, "id"), "content": text or None, "tool_calls": calls})


def to_anthropic_messages(
    messages: Sequence[Mapping[str, Any]],
) -> tuple[str, list[dict[str, Any]]]:
    """Neutral messages as the Messages API takes them: the system text, then the turns."""
    system: list[str] = []
    out: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        if role == "system":
            system.append(str(m.get("content") or ""))
        elif role == "tool":
            block = {
                "type": "tool_result",
                "tool_use_id": m.get("tool_call_id"),
                "content": str(m.get("content") or ""),
            }
            # Consecutive tool results answer one assistant turn: one user message holds them.
            if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], list):
                out[-1]["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
        elif role == "assistant":
            content: list[dict[str, Any]] = []
            if m.get("content"):
                content.append({"type": "text", "text": m["content"]})
            for call in m.get("tool_calls") or ():
                arguments = call["function"].get("arguments") or "{}"
                if isinstance(arguments, str):
                    try:
                        arguments = json.loads(arguments)
                    except json.JSONDecodeError:
                        arguments = {}  # the model's malformed call was answered with an error
                content.append(
                    {
                        "type": "tool_use",
                        "id": call["id"],
                        "name": call["function"]["name"],
                        "input": arguments,
                    }
                )
            out.append({"role": "assistant", "content": content})
        else:
            out.append({"role": "user", "content": m.get("content")})
    return "\n\n".join(system), out
