"""The workloads on LangGraph (StateGraph + SqliteSaver), run by ``.venvs/langgraph``.

Each step is a node of a linear graph of ``STEPS`` nodes; the checkpointer writes a checkpoint after
every super-step. ``--durability`` picks LangGraph's mode (``sync``: the checkpoint is written before
the next step starts; ``async``, the default: while the next step runs; ``exit``: only at the end).
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path
from typing import Any, TypedDict

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

DURABILITY = os.environ.get("LANGGRAPH_DURABILITY", "sync")
PROVIDER: _common.Provider | None = None


class State(TypedDict):
    run: str
    n: int


def pure_node(state: State) -> dict[str, Any]:
    _common.const()
    return {"n": state["n"] + 1}


def write_node(state: State) -> dict[str, Any]:
    """A node that writes: re-run from the start if the process died before its checkpoint."""
    assert PROVIDER is not None
    PROVIDER.append(f"{state['run']}-w{state['n']}", "x")
    return {"n": state["n"] + 1}


def build(node: Any, saver: SqliteSaver) -> Any:
    graph = StateGraph(State)
    names = [f"s{i}" for i in range(_common.STEPS)]
    for name in names:
        graph.add_node(name, node)
    graph.add_edge(START, names[0])
    for a, b in itertools.pairwise(names):
        graph.add_edge(a, b)
    graph.add_edge(names[-1], END)
    return graph.compile(checkpointer=saver)


class Harness:
    def __init__(self, folder: Path, provider: _common.Provider) -> None:
        global PROVIDER
        PROVIDER = provider
        self.db = folder / "langgraph.sqlite"
        self._cm = SqliteSaver.from_conn_string(str(self.db))
        saver = self._cm.__enter__()
        self.graphs = {"pure": build(pure_node, saver), "write": build(write_node, saver)}

    def run(self, workload: str, runs: int, prefix: str) -> None:
        graph = self.graphs["write" if workload == "write" else "pure"]

        def one(r: int) -> None:
            config = {"configurable": {"thread_id": f"{prefix}-{r}"}}
            out = graph.invoke({"run": f"{prefix}-{r}", "n": 0}, config, durability=DURABILITY)
            assert out["n"] == _common.STEPS, out

        _common.fan_out(workload, runs, one)

    def close(self) -> None:
        self._cm.__exit__(None, None, None)


if __name__ == "__main__":
    _common.main(Harness)
