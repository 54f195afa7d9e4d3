"""The worker of lg_agent_crash.py: a LangChain v1 ``create_agent`` graph on ``SqliteSaver``, killed
inside its tool and resumed by a fresh process.

Usage::

    python lg_agent_child.py crash  DIR --durability sync|async [--effectflow] [--slow-store S]
    python lg_agent_child.py resume DIR --durability sync|async [--effectflow] [--recover]

``crash`` asks the agent to append a line; the scripted model calls the tool with a fresh
tool-call id (a uuid: a real model never repeats one across processes), the tool appends one line to
``DIR/provider.txt`` (``_common.Provider``, the outside world) and SIGKILLs its own process right
after the append, before anything records that it returned. ``resume`` continues the same thread
from its checkpoint (``agent.invoke(None, config)``) and prints one JSON line (see ``resume``).

``--effectflow``: the tool is an ``ef.tool`` (``external_write``, a lookup ``confirm=`` that reads
the file for the call's idempotency key, ``settles_within=0``) behind ``EffectflowMiddleware`` on
the ledger ``DIR/effectflow.db``; without it, the same function is a plain LangChain tool (LangGraph
alone). ``--slow-store S``: the crashing process's checkpointer takes S seconds to save the
model's turn (what a remote or busy store does): with ``durability="async"`` that turn is then
still unsaved when the tool kills the process. ``--recover``: the resuming process runs
``rt.recover()`` before the graph, as a worker does when it starts.

Shared with the overhead half of lg_agent_crash.py: the tools, the model and ``agent``.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import StructuredTool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Durability

import effectflow as ef
from effectflow.contrib import langgraph as ef_langgraph


class World:
    """This process's outside world (``use`` points it at a folder)."""

    provider: _common.Provider | None = None
    #: Every tool-call id the model issued, one a line (both processes append to it).
    asked: Path | None = None
    #: Whether the tool kills the process right after its append.
    crash = False

    @classmethod
    def use(cls, folder: Path, *, crash: bool = False) -> _common.Provider:
        """Point the tools and the model at ``folder``; the provider, for counting."""
        cls.provider = _common.Provider(folder / "provider.txt")
        cls.asked = folder / "asked.txt"
        cls.crash = crash
        return cls.provider


def _append(key: str, text: str) -> dict[str, Any]:
    """The outside world changes; in ``crash`` the process dies before anyone records it."""
    assert World.provider is not None
    World.provider.append(key, text)
    if World.crash:
        os.kill(os.getpid(), signal.SIGKILL)
    return {"key": key, "text": text}


@ef.tool("lgb_find_line", effect="read")
def find_line(*, idempotency_key: str) -> ef.Lookup:
    """The lookup: the file is the provider's own record, searched for the call's key."""
    assert World.provider is not None
    if World.provider.find(idempotency_key):
        return ef.Lookup.confirmed(external_effect_id=idempotency_key)
    return ef.Lookup.not_committed()


@ef.tool("lgb_append_line", effect="external_write", confirm=find_line, settles_within=0)
def append_line(text: str, *, idempotency_key: str) -> dict[str, Any]:
    """Append one line to the file."""
    return _append(idempotency_key, text)


def plain_append_line(text: str) -> dict[str, Any]:
    """Append one line to the file (no key: LangGraph alone has none to give)."""
    return _append(f"plain-{uuid.uuid4().hex}", text)


PLAIN_TOOL = StructuredTool.from_function(plain_append_line, name="lgb_append_line")


class FreshIdModel(BaseChatModel):
    """A scripted chat model that behaves like a real one where it matters here: asked without a
    tool result it calls the tool with a fresh tool-call id every time; given one, it answers."""

    text: str = "the line"

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
            if World.asked is not None:
                with World.asked.open("a", encoding="utf-8") as fh:
                    fh.write(call_id + "\n")
            call = {"name": "lgb_append_line", "args": {"text": self.text}, "id": call_id}
            reply = AIMessage(content="", tool_calls=[{**call, "type": "tool_call"}])
        return ChatResult(generations=[ChatGeneration(message=reply)])


def agent(checkpointer: BaseCheckpointSaver[Any], rt: ef.Runtime | None) -> Any:
    """The agent: with ``rt``, the tool is effectflow's behind the middleware; else the plain one."""
    if rt is None:
        return create_agent(FreshIdModel(), [PLAIN_TOOL], checkpointer=checkpointer)
    middleware = ef_langgraph.EffectflowMiddleware(rt, tools=[append_line])
    return create_agent(FreshIdModel(), middleware=[middleware], checkpointer=checkpointer)


def _has_tool_call(value: Any) -> bool:
    """Whether a value about to be saved holds the model's tool call."""
    if isinstance(value, AIMessage):
        return bool(value.tool_calls)
    if isinstance(value, list | tuple):
        return any(_has_tool_call(v) for v in value)
    if isinstance(value, dict):
        return any(_has_tool_call(v) for v in value.values())
    return False


class SlowStore(SqliteSaver):
    """``SqliteSaver`` that takes ``delay`` seconds to save the model's turn (the checkpoint or the
    task writes holding its tool call); everything else, the user's input too, is saved at once."""

    def __init__(self, conn: sqlite3.Connection, delay: float) -> None:
        super().__init__(conn)
        self.delay = delay

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        if self.delay and _has_tool_call(checkpoint.get("channel_values")):
            time.sleep(self.delay)
        return super().put(config, checkpoint, metadata, new_versions)

    def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        if self.delay and _has_tool_call([value for _, value in writes]):
            time.sleep(self.delay)
        super().put_writes(config, writes, task_id, task_path)


THREAD: RunnableConfig = {"configurable": {"thread_id": "lg-agent-crash"}}


def _status(message: ToolMessage, effectflow: bool) -> str:
    """How the resumed tool call ended, in one word."""
    if not effectflow:
        return "ran again"
    return str(json.loads(str(message.content)).get("status"))


def resume(agent_: Any, rt: ef.Runtime, durability: Durability, *, recover: bool,
           effectflow: bool) -> dict[str, Any]:  # fmt: skip
    """Continue the thread from its checkpoint; what the checkpoint held and how it ended."""
    saved = agent_.get_state(THREAD).values.get("messages", [])
    saved_calls = [c["id"] for m in saved for c in getattr(m, "tool_calls", None) or ()]
    recovered = [r.status.value for r in rt.recover()] if recover else []
    state = agent_.invoke(None, THREAD, durability=durability) or {}
    tools = [m for m in state.get("messages", []) if isinstance(m, ToolMessage)]
    interrupts = [i.value for i in state.get("__interrupt__", [])]
    asked = World.asked.read_text(encoding="utf-8").split() if World.asked else []
    return {
        "turn_saved": bool(saved_calls),
        "model_asked": len(asked),
        "recovered": recovered,
        "ended": (
            [f"held for a person ({i['kind']})" for i in interrupts]
            or [_status(m, effectflow) for m in tools]
        ),
        "same_call_id": bool(tools) and tools[-1].tool_call_id in saved_calls,
    }


def main(argv: list[str]) -> int:
    """Crash or resume; the exit code (``crash`` never returns: SIGKILL)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["crash", "resume"])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--durability", choices=["sync", "async"], required=True)
    parser.add_argument("--effectflow", action="store_true")
    parser.add_argument("--slow-store", type=float, default=0.0)
    parser.add_argument("--recover", action="store_true")
    args = parser.parse_args(argv)
    durability: Durability = args.durability
    World.use(args.folder, crash=args.mode == "crash")
    conn = sqlite3.connect(args.folder / "langgraph.sqlite", check_same_thread=False)
    store = SlowStore(conn, args.slow_store if World.crash else 0.0)
    with closing(conn), ef.Runtime(f"sqlite:///{args.folder / 'effectflow.db'}") as rt:
        agent_ = agent(store, rt if args.effectflow else None)
        if args.mode == "crash":
            start: Any = {"messages": [{"role": "user", "content": "append the line"}]}
            agent_.invoke(start, THREAD, durability=durability)
            return 1  # not reached: the tool kills the process
        out = resume(agent_, rt, durability, recover=args.recover, effectflow=args.effectflow)
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
