"""LangGraph half of crash_side_by_side.py: ``crash DIR`` dies right after the append (inside a node,
before its checkpoint); ``recover DIR`` resumes the thread from its last checkpoint (run by
``.venvs/langgraph``, durability='sync', the strongest mode)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any, TypedDict

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

PROVIDER: _common.Provider | None = None
CRASH = False
KEY = "crash-line"
CONFIG = {"configurable": {"thread_id": "crash-run"}}


class State(TypedDict):
    done: bool


def prepare(state: State) -> dict[str, Any]:
    return {"done": False}


def append_line(state: State) -> dict[str, Any]:
    assert PROVIDER is not None
    PROVIDER.append(KEY, "the line")
    if CRASH:  # after the outside world changed, before the node's checkpoint
        os.kill(os.getpid(), signal.SIGKILL)
    return {"done": True}


def main() -> None:
    global PROVIDER, CRASH
    mode, folder = sys.argv[1], Path(sys.argv[2])
    PROVIDER = _common.Provider(folder / "provider.txt")
    graph = StateGraph(State)
    graph.add_node("prepare", prepare)
    graph.add_node("append", append_line)
    graph.add_edge(START, "prepare")
    graph.add_edge("prepare", "append")
    graph.add_edge("append", END)
    with SqliteSaver.from_conn_string(str(folder / "langgraph.sqlite")) as saver:
        app = graph.compile(checkpointer=saver)
        if mode == "crash":
            CRASH = True
            app.invoke({"done": False}, CONFIG, durability="sync")
        else:
            out = app.invoke(None, CONFIG, durability="sync")  # resume from the last checkpoint
            print(f"recovered: {out}")


if __name__ == "__main__":
    main()
