"""A worker process the LangGraph crash test runs, and kills, for real.

Usage: ``python lg_crash_child.py crash|resume DIR --durability sync|async [--effectflow]
[--slow-checkpoints SECONDS] [--recover] [--settle]``.

``crash`` starts a ``create_agent`` graph on a fresh thread (``SqliteSaver`` in DIR); its tool
appends one line to ``DIR/world.txt`` (the outside world) and SIGKILLs its own process right after
the append, inside the tool. ``resume`` is a fresh process that continues the same thread from its
checkpoint (``agent.invoke(None, config)``) and prints one JSON line: the tool calls the saved
checkpoint held, every tool-call id the model issued (``DIR/asked.txt``, both processes), the tool
messages, effectflow's interrupts, the line count.

With ``--effectflow`` the tool is an ``ef.tool`` (``external_write``, a lookup that reads the file
for its key, ``settles_within=0``) behind ``EffectflowMiddleware`` on ``DIR/ledger.db``; without, it
is a plain LangChain tool: LangGraph alone.

``--slow-checkpoints S`` makes the crashing process's checkpoint store take S seconds to save the
model's turn (a remote store under load): with ``durability="async"`` that turn is then surely
unsaved when the tool kills the process, so the resumed graph asks the model again and gets a fresh
tool-call id (without it, that loss is a race). ``--recover`` lets the resuming process run
``rt.recover()`` before the graph, as a worker does when it starts; ``--settle`` runs it only after
the graph stopped at effectflow's interrupt, then resumes the graph with ``Command(resume={})``
("decided elsewhere").
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import sys
import time
import uuid
from contextlib import closing
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import StructuredTool
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command, Durability

import effectflow as ef
from effectflow.contrib import langgraph as ef_langgraph


class World:
    """This process's outside world (``main`` points it at DIR)."""

    #: The file the tool appends to: one JSON line per write, with the call's key.
    file = Path("world.txt")
    #: Every tool-call id the model issued, one a line (appended by both processes).
    asked = Path("asked.txt")
    #: Whether the tool kills the process right after its append.
    crash = False


THREAD: RunnableConfig = {"configurable": {"thread_id": "crash-thread"}}
LINE = {"text": "hello"}


def _lines() -> list[str]:
    return World.file.read_text(encoding="utf-8").splitlines() if World.file.exists() else []


def _append(text: str, key: str) -> dict[str, Any]:
    """The outside world changes, then (in ``crash``) the process dies before anyone records it."""
    record = {"id": f"line_{len(_lines()) + 1}", "key": key, "text": text}
    with World.file.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")
    if World.crash:
        os.kill(os.getpid(), signal.SIGKILL)
    return record


@ef.tool("lgc_find_line", effect="read")
def find_line(*, idempotency_key: str) -> ef.Lookup:
    """The lookup: the file is the provider's own record, searched by the call's key."""
    for line in _lines():
        record = json.loads(line)
        if record["key"] == idempotency_key:
            return ef.Lookup.confirmed(external_effect_id=record["id"], result=record)
    return ef.Lookup.not_committed()


@ef.tool(
    "lgc_append_line",
    effect="external_write",
    confirm=find_line,
    effect_id="id",
    settles_within=0,
)
def append_line(text: str, *, idempotency_key: str) -> dict[str, Any]:
    """Append one line to the file."""
    return _append(text, idempotency_key)


def plain_append(text: str) -> dict[str, Any]:
    """Append one line to the file."""
    return _append(text, "none")


class FreshIdModel(BaseChatModel):
    """Like a real chat model: asked without a tool result it calls the tool with a fresh
    tool-call id (a uuid, so never the same across processes); given a result it answers."""

    tool: str

    @property
    def _llm_type(self) -> str:
        return "scripted-fresh-ids"

    def bind_tools(self, tools: Any, **kwargs: Any) -> FreshIdModel:
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        if isinstance(messages[-1], ToolMessage):
            reply = AIMessage(content=f"tool said: {messages[-1].content}")
        else:
            call_id = f"call_{uuid.uuid4().hex[:16]}"
            with World.asked.open("a", encoding="utf-8") as fh:
                fh.write(call_id + "\n")
            call = {"name": self.tool, "args": LINE, "id": call_id, "type": "tool_call"}
            reply = AIMessage(content="", tool_calls=[call])
        return ChatResult(generations=[ChatGeneration(message=reply)])


def _content(message: ToolMessage) -> Any:
    """A tool message's content: the middleware's JSON, or the plain tool's result."""
    try:
        return json.loads(str(message.content))
    except ValueError:
        return message.content


def _has_tool_call(value: Any) -> bool:
    """Whether a value about to be saved holds the model's tool call (an AIMessage with one)."""
    if isinstance(value, AIMessage):
        return bool(value.tool_calls)
    if isinstance(value, list | tuple):
        return any(_has_tool_call(v) for v in value)
    if isinstance(value, dict):
        return any(_has_tool_call(v) for v in value.values())
    return False


class SlowSaver(SqliteSaver):
    """``SqliteSaver`` that takes ``delay`` seconds to save the model's turn (the checkpoint or
    task writes holding its tool call): the background saves of ``durability="async"`` then
    fall behind the tool, as with a slow or remote store; the user's input is saved at once."""

    def __init__(self, conn: sqlite3.Connection, delay: float) -> None:
        super().__init__(conn)
        self.delay = delay

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        if _has_tool_call(checkpoint.get("channel_values")):
            time.sleep(self.delay)
        return super().put(config, checkpoint, metadata, new_versions)

    def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        if _has_tool_call([value for _, value in writes]):
            time.sleep(self.delay)
        super().put_writes(config, writes, task_id, task_path)


def main(argv: list[str]) -> int:
    """Crash or resume; returns the exit code (``crash`` never returns: SIGKILL)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["crash", "resume"])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--durability", choices=["sync", "async"], required=True)
    parser.add_argument("--effectflow", action="store_true")
    parser.add_argument("--slow-checkpoints", type=float, default=0.0)
    parser.add_argument("--recover", action="store_true")
    parser.add_argument("--settle", action="store_true")
    args = parser.parse_args(argv)
    World.file = args.directory / "world.txt"
    World.asked = args.directory / "asked.txt"
    World.crash = args.mode == "crash"
    durability: Durability = args.durability
    # As ``SqliteSaver.from_conn_string`` opens it; the slow saves only in the crashing process.
    conn = sqlite3.connect(args.directory / "checkpoints.sqlite", check_same_thread=False)
    saver = SlowSaver(conn, args.slow_checkpoints if World.crash else 0.0)
    with closing(conn), ef.Runtime(f"sqlite:///{args.directory / 'ledger.db'}") as rt:
        if args.effectflow:
            model = FreshIdModel(tool=append_line.name)
            middleware = [ef_langgraph.EffectflowMiddleware(rt, tools=[append_line])]
            agent = create_agent(model, middleware=middleware, checkpointer=saver)
        else:
            model = FreshIdModel(tool="plain_append")
            tool = StructuredTool.from_function(plain_append)
            agent = create_agent(model, [tool], checkpointer=saver)
        if args.mode == "crash":
            start: Any = {"messages": [{"role": "user", "content": "append a line"}]}
            agent.invoke(start, THREAD, durability=durability)
            return 1  # not reached: the tool kills the process
        saved = agent.get_state(THREAD).values.get("messages", [])
        recovered = [r.status.value for r in rt.recover()] if args.recover else []
        state = agent.invoke(None, THREAD, durability=durability) or {}
        interrupts = [i.value for i in state.get("__interrupt__", [])]
        if interrupts and args.settle:
            recovered = [r.status.value for r in rt.recover()]
            state = agent.invoke(Command(resume={}), THREAD, durability=durability)
        tool_messages = [m for m in state.get("messages", []) if isinstance(m, ToolMessage)]
        out = {
            # The tool calls the saved checkpoint shows: none when the model's turn was lost.
            "saved_calls": [c["id"] for m in saved for c in getattr(m, "tool_calls", None) or ()],
            "asked": World.asked.read_text(encoding="utf-8").split(),
            "recovered": recovered,
            "tool_calls": [m.tool_call_id for m in tool_messages],
            "tool_messages": [_content(m) for m in tool_messages],
            "interrupts": interrupts,
            "still_interrupted": bool(state.get("__interrupt__")),
            "answer": state["messages"][-1].content if state.get("messages") else None,
            "lines": len(_lines()),
        }
        print(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
