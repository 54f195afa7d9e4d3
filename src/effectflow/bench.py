"""The effectflow half of the peer comparison, for ``effectflow bench`` and ``benchmarks/compare``.

Three workloads, the ones ``benchmarks/compare/run.py`` also runs on DBOS Transact and LangGraph:

- ``sequential``: workflows of ``STEPS`` trivial pure steps, one after another;
- ``concurrent``: the same, ``THREADS`` workflows at a time on as many threads sharing one Runtime;
- ``write``: workflows of ``STEPS`` external-write steps, each appending a line to a file (the
  simulated provider) through a tool with a lookup (``confirm=``), so intent and outcome are both
  committed; sequential.

And two of effectflow's own: ``concurrent_async`` and ``write_async``, the pure and the write
workflows as ``async def``, ``THREADS`` at a time on one asyncio loop (``Runtime.start_async``),
where the runs' commits are grouped without threads.

``effectflow bench`` and ``benchmarks/compare/peer_effectflow.py`` both drive ``Workloads``, so the
command runs literally the code the comparison measures; only the comparison repeats it and runs
the peers beside it (BENCHMARKS.md, "Against the peers"). The tools and workflows live in a private
registry, not the process-wide one, so they never mix with an application's.

``benchmarks/compare/_common.py`` keeps a stdlib-only copy of ``Provider``, ``fan_out`` and the
direct baseline: the peers run in virtual environments without effectflow.

Beside them, the floor (``Floor``): a raw SQLite WAL commit at ``synchronous=FULL`` timed in the
same run, and what two of them per step (an intent and an outcome) allow a write step at most.

The hosts' crash scorecard (``effectflow bench --hosts``) is ``effectflow.scorecard``: throughput
says what effectflow costs; the scorecard says what it buys.
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from effectflow.contracts import registry as registry_mod
from effectflow.contracts import tool as tool_mod
from effectflow.contracts import workflow as workflow_mod
from effectflow.contracts.lookup import Lookup
from effectflow.ledger.records import RunRecord, RunStatus
from effectflow.runtime import context
from effectflow.runtime.runtime import Runtime

#: Steps per workflow.
STEPS = 10
#: Workflows at a time (and threads) in the ``concurrent`` workload.
THREADS = 8
#: The workloads the peers run too, in the order they run and are reported.
WORKLOADS = ("sequential", "concurrent", "write")
#: effectflow only: the ``concurrent`` and ``write`` workloads as ``async def`` workflows, ``THREADS``
#: at a time on one asyncio loop (``start_async``), where group commit needs no threads.
ASYNC_WORKLOADS = ("concurrent_async", "write_async")
#: The ledger modes measured, the default first: the URL options of each, and what a committed step
#: survives under it (the ledger is SQLite in WAL mode).
MODES = {
    "full": ("synchronous=full", "every commit survives power loss"),
    "intents": (
        "durability=intents",
        "intents survive power loss; outcomes a process crash, power loss from the next flush",
    ),
    "normal": ("synchronous=normal", "every commit survives a process crash, not power loss"),
}


def const() -> int:
    """The trivial pure step."""
    return 1


class Sink(Protocol):
    """What the write workload needs from its provider (``Provider`` or ``_common.Provider``)."""

    def append(self, key: str, payload: str) -> None:
        """Write one line under ``key``."""

    def find(self, key: str) -> bool:
        """Whether a line under ``key`` exists."""


class Provider:
    """The simulated provider: a file with one line per write (``key<TAB>payload``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh = path.open("a", encoding="utf-8")

    def append(self, key: str, payload: str) -> None:
        """Write one line under ``key`` and flush it to the OS."""
        self._fh.write(f"{key}\t{payload}\n")
        self._fh.flush()

    def find(self, key: str) -> bool:
        """Whether a line under ``key`` exists (what the lookup asks)."""
        with self.path.open(encoding="utf-8") as fh:
            return any(line.split("\t", 1)[0] == key for line in fh)

    def close(self) -> None:
        """Close the file."""
        self._fh.close()


def fan_out(workload: str, runs: int, one: Callable[[int], object]) -> None:
    """Run ``one(r)`` for every run: on ``THREADS`` threads for "concurrent", else in order."""
    if workload == "concurrent":
        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(one, range(runs)))
    else:
        for r in range(runs):
            one(r)


def direct(workload: str, runs: int, provider: Sink) -> None:
    """The same calls as a workload, made without any framework (the baseline of the overhead)."""

    def one(r: int) -> None:
        for i in range(STEPS):
            if workload.startswith("write"):
                provider.append(f"direct-{r}-{i}", "x")
            else:
                const()

    fan_out(workload, runs, one)


class Workloads:
    """The workloads' tools and workflows on one Runtime, writing to ``provider``."""

    def __init__(self, url: str, provider: Sink) -> None:
        # Built per instance so each closes over its own provider instead of a module global.
        def find_line(*, idempotency_key: str) -> Lookup:
            if provider.find(idempotency_key):
                return Lookup.confirmed(external_effect_id=idempotency_key)
            return Lookup.not_committed()

        def append_line(payload: str, *, idempotency_key: str = "") -> dict[str, Any]:
            provider.append(idempotency_key, payload)
            return {"key": idempotency_key}

        pure_tool = tool_mod.tool("effectflow_bench_const", register=False)(const)
        find_tool = tool_mod.tool("effectflow_bench_find_line", effect="read", register=False)(
            find_line
        )
        write_tool = tool_mod.tool(
            "effectflow_bench_append_line",
            effect="external_write",
            confirm=find_tool,
            # A local file append lands inside the call or never.
            settles_within=0,
            register=False,
        )(append_line)

        @workflow_mod.workflow("effectflow_bench_pure", register=False)
        def pure(ctx: context.Context) -> None:
            for i in range(STEPS):
                ctx.call(f"s{i}", pure_tool)

        @workflow_mod.workflow("effectflow_bench_write", register=False)
        def write(ctx: context.Context) -> None:
            for i in range(STEPS):
                ctx.call(f"w{i}", write_tool, payload="x")

        @workflow_mod.workflow("effectflow_bench_pure_async", register=False)
        async def pure_async(ctx: context.AsyncContext) -> None:
            for i in range(STEPS):
                await ctx.call(f"s{i}", pure_tool)

        @workflow_mod.workflow("effectflow_bench_write_async", register=False)
        async def write_async(ctx: context.AsyncContext) -> None:
            for i in range(STEPS):
                await ctx.call(f"w{i}", write_tool, payload="x")

        registry = registry_mod.Registry()
        for made in (pure_tool, find_tool, write_tool):
            registry.add_tool(made)
        for flow in (pure, write, pure_async, write_async):
            registry.add_workflow(flow)
        self._flows: dict[str, workflow_mod.Workflow[..., Any]] = {
            "sequential": pure,
            "concurrent": pure,
            "write": write,
            "concurrent_async": pure_async,
            "write_async": write_async,
        }
        #: The runtime every workload runs on (one, shared by the threads of "concurrent").
        self.rt = Runtime(url, registry=registry)

    def run(
        self, workload: str, runs: int, prefix: str, on_run: Callable[[], None] | None = None
    ) -> None:
        """Drive ``runs`` workflows of ``workload``, run ids ``{prefix}-{r}``; ``on_run`` after each.

        Raises:
            RuntimeError: a workflow did not succeed (the measurement would be meaningless).
        """
        flow = self._flows[workload]

        def check(run: RunRecord) -> None:
            if run.status is not RunStatus.SUCCEEDED:
                raise RuntimeError(f"benchmark run {run.run_id} ended {run.status}: {run.error}")
            if on_run is not None:
                on_run()

        if workload in ASYNC_WORKLOADS:

            async def all_runs() -> None:
                gate = asyncio.Semaphore(THREADS)

                async def one(r: int) -> None:
                    async with gate:
                        check(await self.rt.start_async(flow, run_id=f"{prefix}-{r}"))

                await asyncio.gather(*(one(r) for r in range(runs)))

            asyncio.run(all_runs())
            return
        fan_out(workload, runs, lambda r: check(self.rt.start(flow, run_id=f"{prefix}-{r}")))

    def close(self) -> None:
        """Close the runtime."""
        self.rt.close()


@dataclasses.dataclass(frozen=True)
class Result:
    """One workload's measurement under one durability mode."""

    #: ``sequential``, ``concurrent`` or ``write``.
    workload: str
    #: The ledger mode: ``full``, ``intents`` or ``normal`` (``MODES``).
    mode: str
    #: Workflows timed (after the warm-up).
    workflows: int
    #: Steps timed.
    steps: int
    #: Wall time of the steps run through the runtime, in seconds.
    runtime_s: float
    #: Wall time of the same functions called directly, in seconds.
    direct_s: float
    #: The raw SQLite WAL commit at ``synchronous=FULL`` measured in the same run, in µs (write
    #: workloads only: the floor their two durable commits per step set; None for pure steps).
    floor_commit_us: float | None = None

    @property
    def ledger_options(self) -> str:
        """The ledger URL's query string under this mode."""
        return MODES[self.mode][0]

    @property
    def durability(self) -> str:
        """What a committed step survives under this mode."""
        return MODES[self.mode][1]

    @property
    def overhead_us_per_step(self) -> float:
        """What the runtime adds to each step, in microseconds."""
        return (self.runtime_s - self.direct_s) / self.steps * 1e6

    @property
    def steps_per_s(self) -> float:
        """Steps per second through the runtime."""
        return self.steps / self.runtime_s if self.runtime_s > 0 else 0.0

    @property
    def floor_steps_per_s(self) -> float | None:
        """The two-commit floor of a write step, in steps/s (None without a floor)."""
        if self.floor_commit_us is None:
            return None
        return Floor(self.floor_commit_us).write_steps_per_s

    @property
    def of_floor(self) -> float | None:
        """This workload's steps/s as a fraction of the two-commit floor (None without one)."""
        floor = self.floor_steps_per_s
        return None if floor is None else self.steps_per_s / floor

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view, derived figures included."""
        return {
            **dataclasses.asdict(self),
            "ledger_options": self.ledger_options,
            "durability": self.durability,
            "overhead_us_per_step": self.overhead_us_per_step,
            "steps_per_s": self.steps_per_s,
            "floor_steps_per_s": self.floor_steps_per_s,
            "of_floor": self.of_floor,
        }


#: Durable commits of a write step: its intent before the call, its outcome after.
COMMITS_PER_WRITE_STEP = 2


@dataclasses.dataclass(frozen=True)
class Floor:
    """What the disk allows: a write step can be no faster than its two durable commits.

    Measured rather than quoted because it is the machine's (its disk, its filesystem, its load
    at that moment): a ratio to it says how much of the time is effectflow's own."""

    #: One raw commit (a tiny INSERT, ``BEGIN IMMEDIATE`` ... ``COMMIT``, WAL, FULL), in µs.
    commit_us: float

    @property
    def write_steps_per_s(self) -> float:
        """Write steps per second if a step cost only its two commits."""
        return 1e6 / (COMMITS_PER_WRITE_STEP * self.commit_us)

    def to_dict(self) -> dict[str, float]:
        """A JSON-ready view."""
        return {"commit_us": self.commit_us, "write_steps_per_s": self.write_steps_per_s}


def raw_commit_us(folder: Path, commits: int = 1000) -> float:
    """µs per raw SQLite commit at ``synchronous=FULL`` in WAL mode, on a fresh file in ``folder``:
    each a tiny INSERT in its own ``BEGIN IMMEDIATE`` ... ``COMMIT``, as the ledger commits."""
    if commits < 1:
        raise ValueError("commits must be at least 1")
    path = folder / "floor.db"
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")

        def loop(n: int) -> None:
            for _ in range(n):
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("INSERT INTO t (v) VALUES ('x')")
                conn.execute("COMMIT")

        loop(max(10, commits // 10))  # warm-up: the file's first pages, the WAL's creation
        return _timed(lambda: loop(commits)) / commits * 1e6
    finally:
        conn.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)


def warmup_runs(workflows: int) -> int:
    """Untimed workflows run first on the same ledger (as ``_common.main`` does)."""
    return max(5, workflows // 10)


def _timed(fn: Callable[[], object]) -> float:
    gc.collect()
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def measure(
    workload: str,
    mode: str,
    folder: Path,
    *,
    workflows: int = 100,
    on_run: Callable[[], None] | None = None,
    floor: Floor | None = None,
) -> Result:
    """Time ``workflows`` workflows of ``workload`` on a fresh ledger in ``folder``, after a warm-up,
    and the same calls made directly; ``on_run`` is called after every workflow, warm-up included
    (for a progress bar; from several threads in "concurrent"). A write workload's result carries
    ``floor``."""
    if workload not in WORKLOADS + ASYNC_WORKLOADS or mode not in MODES:
        raise ValueError(f"unknown workload {workload!r} or ledger mode {mode!r}")
    if workflows < 1:
        raise ValueError("workflows must be at least 1")
    name = f"{workload}-{mode}"
    warm = warmup_runs(workflows)
    provider = Provider(folder / f"{name}-provider.txt")
    try:
        direct(workload, warm, provider)
        direct_s = _timed(lambda: direct(workload, workflows, provider))
        bench = Workloads(f"sqlite:///{folder / name}.db?{MODES[mode][0]}", provider)
        try:
            bench.run(workload, warm, "warm", on_run)
            runtime_s = _timed(lambda: bench.run(workload, workflows, "timed", on_run))
        finally:
            bench.close()
    finally:
        provider.close()
    floor_us = floor.commit_us if floor is not None and workload.startswith("write") else None
    return Result(workload, mode, workflows, workflows * STEPS, runtime_s, direct_s, floor_us)


def run_all(
    *,
    modes: Iterable[str] = ("full",),
    workflows: int = 100,
    on_start: Callable[[str, str], None] | None = None,
    on_run: Callable[[], None] | None = None,
) -> list[Result]:
    """Every workload under each of ``modes``, each on its own ledger in a temporary folder that
    is removed afterwards, the write workloads with the floor measured first in the same folder.
    ``on_start(workload, mode)`` is called before each."""
    folder = Path(tempfile.mkdtemp(prefix="effectflow-bench-"))
    results = []
    try:
        floor = Floor(raw_commit_us(folder))
        for mode in modes:
            for workload in WORKLOADS + ASYNC_WORKLOADS:
                if on_start is not None:
                    on_start(workload, mode)
                results.append(
                    measure(workload, mode, folder, workflows=workflows, on_run=on_run, floor=floor)
                )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return results
