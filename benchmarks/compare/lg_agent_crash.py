"""A LangGraph agent killed inside its tool and resumed: how many times does the outside world see the
write, with LangGraph alone and with EffectflowMiddleware? And what does the middleware cost a call?

**Crash.** ``lg_agent_child.py`` runs ``create_agent`` (a scripted chat model that issues a fresh
tool-call id each time it is asked, as a real one does) on ``SqliteSaver``; its tool appends one
line to a file and the process SIGKILLs itself right after the append; a fresh process resumes the
thread from its checkpoint (``agent.invoke(None, config)``) with the same ledger file. The matrix:
``durability="sync"`` / ``"async"`` (LangGraph's default) / ``"async"`` with a checkpoint store
that takes 0.5 s to save the model's turn (the loss ``"async"`` allows, made certain), × LangGraph
alone (a plain LangChain tool) / + EffectflowMiddleware (the same function as an ``ef.tool``,
``external_write``, a lookup that reads the file for the key, ``settles_within=0``) / + the same
with ``rt.recover()`` run by the resuming process before the graph. Counted: lines in the file.

**Overhead** (in this process, SQLite ledger at its default ``synchronous=FULL``, WAL): N tool
calls made (a) by calling the function directly, (b) as the plain LangChain tool
(``tool.invoke(tool_call)`` → ``ToolMessage``), (c) through ``EffectflowMiddleware.wrap_tool_call``
(the whole guarded call: argument check, the ledger's run, intent, call, outcome, the JSON
``ToolMessage``); and M one-call agent conversations (``agent.invoke`` on a new thread, SqliteSaver)
without and with the middleware, per durability. Also, to split the cost: ``rt.guard`` called
directly, the middleware's argument check alone (its validator, built once per tool), and
``jsonschema.validate`` of the same arguments (the check the middleware made before commit
24cfac5, which also checks the schema against its metaschema on every call). Measured before the
crash trials (their subprocesses and file churn disturb the disk); repetitions interleaved; µs per
call as median and min – max; overhead = the paired difference within each repetition. Run::

    .venv/bin/python benchmarks/compare/lg_agent_crash.py --trials 5
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common
import jsonschema
import lg_agent_child as child
from langchain_core.messages import ToolCall
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.prebuilt.tool_node import ToolCallRequest, ToolRuntime

import effectflow as ef
from effectflow.contrib import langgraph as ef_langgraph
from effectflow.contrib.agents import schemas
from effectflow.contrib.langgraph import middleware as ef_middleware

HERE = Path(__file__).resolve().parent
CHILD = HERE / "lg_agent_child.py"
#: The versions the report names (the main .venv's, from the dev extra).
PACKAGES = ("langgraph", "langchain", "langchain-core", "langgraph-checkpoint-sqlite")
#: How long the slow store takes to save the model's turn (``--slow-store``).
SLOW_STORE_S = 0.5

# (durability, what the checkpoint store does, crash-process flags)
SCENARIOS: list[tuple[str, str, list[str]]] = [
    ("sync", "SqliteSaver", []),
    ("async", "SqliteSaver", []),
    ("async", f"SqliteSaver, {SLOW_STORE_S} s to save the model's turn",
     ["--slow-store", str(SLOW_STORE_S)]),
]  # fmt: skip
# (setup, flags of both processes, flags of the resuming process)
SETUPS: list[tuple[str, list[str], list[str]]] = [
    ("LangGraph alone", [], []),
    ("LangGraph + EffectflowMiddleware", ["--effectflow"], []),
    ("LangGraph + EffectflowMiddleware, rt.recover() first", ["--effectflow"], ["--recover"]),
]


# -- the crash ------------------------------------------------------------------------------------


def trial(folder: Path, durability: str, crash_flags: list[str], flags: list[str],
          resume_flags: list[str]) -> dict[str, Any]:  # fmt: skip
    """Crash, resume, and return what the resume saw plus the line count."""
    base = [sys.executable, str(CHILD)]
    common = ["--durability", durability, *flags]
    crashed = subprocess.run(
        [*base, "crash", str(folder), *common, *crash_flags], capture_output=True, text=True
    )
    if crashed.returncode != -9:
        raise RuntimeError(f"crash exited {crashed.returncode}: {crashed.stderr[-800:]}")
    resumed = subprocess.run(
        [*base, "resume", str(folder), *common, *resume_flags], capture_output=True, text=True
    )
    if resumed.returncode != 0:
        raise RuntimeError(f"resume exited {resumed.returncode}: {resumed.stderr[-800:]}")
    out: dict[str, Any] = json.loads(resumed.stdout.strip().splitlines()[-1])
    out["lines"] = len((folder / "provider.txt").read_text(encoding="utf-8").splitlines())
    return out


def ending(out: dict[str, Any]) -> str:
    """How one trial's resumed call ended, with whether it kept the crashed call's id."""
    ended = ", ".join(out["ended"]) or "no tool call"
    return f"{ended} ({'same' if out['same_call_id'] else 'new'} tool-call id)"


def crash_table(trials: int) -> tuple[list[str], list[dict[str, Any]]]:
    """Every scenario x setup, ``trials`` times; the Markdown rows and all results."""
    lines = [
        f"| durability | checkpoint store | setup | lines after recovery, per trial "
        f"| total (ideal {trials}) | model's turn saved at the kill | the resumed call |",
        "|---|---|---|---|---:|---:|---|",
    ]
    results = []
    for durability, store, crash_flags in SCENARIOS:
        for setup, flags, resume_flags in SETUPS:
            outs = []
            for _ in range(trials):
                folder = Path(tempfile.mkdtemp(prefix="effectflow-lg-agent-"))
                try:
                    outs.append(trial(folder, durability, crash_flags, flags, resume_flags))
                finally:
                    shutil.rmtree(folder, ignore_errors=True)
            counts = [o["lines"] for o in outs]
            endings = collections.Counter(ending(o) for o in outs)
            saved = sum(o["turn_saved"] for o in outs)
            lines.append(
                f"| `{durability}` | {store} | {setup} | {', '.join(map(str, counts))} | "
                f"{sum(counts)} | {saved}/{trials} | "
                + "; ".join(f"{n}× {e}" for e, n in endings.most_common())
                + " |"
            )
            results.append({"durability": durability, "store": store, "setup": setup,
                            "trials": outs})  # fmt: skip
            print(lines[-1], file=sys.stderr, flush=True)
    return lines, results


# -- the overhead ---------------------------------------------------------------------------------


def _tool_call(i: int, tag: str) -> ToolCall:
    # Distinct arguments per call: the same arguments in one scope would be a regenerated call,
    # answered from the ledger without calling (that is deduplication, not the cost of a call).
    return ToolCall(name="lgb_append_line", args={"text": f"line {tag} {i}"},
                    id=f"call_{tag}_{i}", type="tool_call")  # fmt: skip


def _request(call: ToolCall, tool: Any, thread: str) -> ToolCallRequest:
    """What ``create_agent``'s tool node hands ``wrap_tool_call`` for one call."""
    state: dict[str, Any] = {"messages": []}
    config: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": f"tools:{uuid.uuid4()}"}}
    runtime = ToolRuntime(state=state, context=None, config=config, stream_writer=lambda _: None,
                          tool_call_id=call["id"], store=None)  # fmt: skip
    return ToolCallRequest(tool_call=call, tool=tool, state=state, runtime=runtime)


def _unused(request: ToolCallRequest) -> Any:
    raise AssertionError("the middleware runs effectflow's tools itself")


def overhead(folder: Path, calls: int, invokes: int, repeats: int) -> dict[str, list[float]]:
    """µs per call of each configuration, one sample per repetition, configurations interleaved."""
    child.World.use(folder)
    child.World.asked = None  # the model's ids are not logged here
    samples: dict[str, list[float]] = collections.defaultdict(list)
    with (
        ef.Runtime(f"sqlite:///{folder / 'effectflow.db'}") as rt,
        SqliteSaver.from_conn_string(str(folder / "langgraph.sqlite")) as saver,
    ):
        middleware = ef_langgraph.EffectflowMiddleware(rt, tools=[child.append_line])
        lc_tool = ef_langgraph.langchain_tool(child.append_line)
        plain = child.agent(saver, None)
        guarded = child.agent(saver, rt)

        def direct(tag: str) -> None:
            for i in range(calls):
                child.append_line.fn(f"line {tag} {i}", idempotency_key=f"direct-{tag}-{i}")

        def plain_tool(tag: str) -> None:
            for i in range(calls):
                child.PLAIN_TOOL.invoke(_tool_call(i, tag))

        def check_only(tag: str) -> None:
            # What wrap_tool_call does: the validator it built once per tool (lru_cache).
            for i in range(calls):
                ef_middleware._validator(child.append_line).validate(_tool_call(i, tag)["args"])

        def check_per_call(tag: str) -> None:
            # What it did before 24cfac5: jsonschema.validate, the schema itself checked each call.
            schema = schemas.parameters_schema(child.append_line)
            for i in range(calls):
                jsonschema.validate(_tool_call(i, tag)["args"], schema)

        def guard(tag: str) -> None:
            for i in range(calls):
                call = _tool_call(i, tag)
                rt.guard(child.append_line, call["args"], scope=f"langgraph:{tag}:tools",
                         call_id=str(call["id"]))  # fmt: skip

        def wrapped(tag: str) -> None:
            for i in range(calls):
                middleware.wrap_tool_call(_request(_tool_call(i, tag), lc_tool, tag), _unused)

        def conversations(agent: Any, durability: str) -> Callable[[str], None]:
            def run(tag: str) -> None:
                start = {"messages": [{"role": "user", "content": "append the line"}]}
                for i in range(invokes):
                    config = {"configurable": {"thread_id": f"{tag}-{i}"}}
                    agent.invoke(start, config, durability=durability)

            return run

        configs: list[tuple[str, Callable[[str], None], int]] = [
            ("function, direct", direct, calls),
            ("plain LangChain tool.invoke", plain_tool, calls),
            ("the middleware's argument check: its validator, built once per tool", check_only,
             calls),
            ("jsonschema.validate of the arguments (the middleware's check before 24cfac5)",
             check_per_call, calls),
            ("rt.guard, direct", guard, calls),
            ("EffectflowMiddleware.wrap_tool_call", wrapped, calls),
        ]  # fmt: skip
        for durability in ("sync", "async"):
            configs += [
                (f"agent.invoke, {durability}, plain tool", conversations(plain, durability),
                 invokes),
                (f"agent.invoke, {durability}, EffectflowMiddleware",
                 conversations(guarded, durability), invokes),
            ]  # fmt: skip
        for name, fn, _ in configs:  # warm-up: imports, schema compilation, first statements
            fn(f"warm-{name}")
        for rep in range(repeats):
            for name, fn, count in configs:
                elapsed = _common.timed(functools.partial(fn, f"r{rep}-{name}"))
                samples[name].append(elapsed / count * 1e6)
    return dict(samples)


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):,.0f} ({min(values):,.0f} – {max(values):,.0f})"


def overhead_table(samples: dict[str, list[float]], calls: int, invokes: int) -> list[str]:
    """Per-call µs of each configuration, and the middleware's paired differences."""
    lines = [
        "| what | calls per sample | µs per call, median (min – max) |",
        "|---|---:|---:|",
    ]
    for name, values in samples.items():
        count = invokes if name.startswith("agent") else calls
        lines.append(f"| {name} | {count} | {_spread(values)} |")
    pairs = [
        ("EffectflowMiddleware.wrap_tool_call", "function, direct"),
        ("EffectflowMiddleware.wrap_tool_call", "plain LangChain tool.invoke"),
        ("rt.guard, direct", "function, direct"),
        ("EffectflowMiddleware.wrap_tool_call", "rt.guard, direct"),
        ("agent.invoke, sync, EffectflowMiddleware", "agent.invoke, sync, plain tool"),
        ("agent.invoke, async, EffectflowMiddleware", "agent.invoke, async, plain tool"),
    ]
    lines += ["", "| middleware overhead per tool call | µs, median (min – max) of the "
              "paired differences |", "|---|---:|"]  # fmt: skip
    for with_, without in pairs:
        diffs = [a - b for a, b in zip(samples[with_], samples[without], strict=True)]
        lines.append(f"| {with_} − {without} | {_spread(diffs)} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=5, help="crash trials per row")
    parser.add_argument("--calls", type=int, default=200, help="tool calls per overhead sample")
    parser.add_argument("--invokes", type=int, default=100, help="agent runs per overhead sample")
    parser.add_argument("--repeats", type=int, default=9, help="overhead samples per config")
    parser.add_argument("--skip-crash", action="store_true")
    parser.add_argument("--skip-overhead", action="store_true")
    parser.add_argument("--json", type=Path, help="also write every result to this file")
    args = parser.parse_args()
    report: dict[str, Any] = {
        "python": sys.version.split()[0],
        "sqlite": sqlite3.sqlite_version,
        **{p: metadata.version(p) for p in ("effectflow", *PACKAGES)},
    }
    samples = None
    if not args.skip_overhead:
        # First, before the crash trials' subprocesses and file churn disturb the disk's fsyncs.
        folder = Path(tempfile.mkdtemp(prefix="effectflow-lg-overhead-"))
        try:
            samples = overhead(folder, args.calls, args.invokes, args.repeats)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        report["overhead_us"] = samples
    if not args.skip_crash:
        lines, report["crash"] = crash_table(args.trials)
        print("\n".join(lines), flush=True)
    if samples is not None:
        print()
        versions = ", ".join(f"{p} {report[p]}" for p in PACKAGES)
        print(f"Overhead: {args.repeats} repetitions, interleaved; SQLite ledger and SqliteSaver "
              f"at SQLite's synchronous=FULL, WAL; {versions}; SQLite {sqlite3.sqlite_version}.")  # fmt: skip
        print()
        print("\n".join(overhead_table(samples, args.calls, args.invokes)), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str))


if __name__ == "__main__":
    main()
