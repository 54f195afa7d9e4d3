"""A quick measurement of the runtime's per-step overhead, for ``effectflow bench``.

Each configuration runs workflows of a few hundred steps on a fresh SQLite ledger in a temporary
folder and times them against calling the same functions directly; the difference per step is the
runtime's overhead. Step kinds: a *pure* step (its result rides with the next durable write) and an
*external-write* step (intent and outcome, both durable), each with ``synchronous=FULL`` (the
default, survives power loss) and ``NORMAL``. One sample each: ``benchmarks/core_overhead.py`` in
the repository repeats them and reports medians and ranges (BENCHMARKS.md).
"""

from __future__ import annotations

import dataclasses
import gc
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from effectflow.contracts import tool as tool_mod
from effectflow.contracts import workflow as workflow_mod
from effectflow.ledger.records import RunStatus
from effectflow.runtime import context
from effectflow.runtime.runtime import Runtime

#: Step kinds measured.
KINDS = ("pure", "external_write")
#: SQLite durability modes measured.
SYNC_MODES = ("FULL", "NORMAL")
#: Steps per workflow run: long enough that the per-run cost is spread thin.
STEPS_PER_RUN = 10


def _const() -> int:
    return 1


def _write(n: int) -> dict[str, int]:
    return {"id": n}


_pure_tool = tool_mod.tool("effectflow_bench_pure", register=False)(_const)
_write_tool = tool_mod.tool("effectflow_bench_write", effect="external_write", register=False)(
    _write
)


@workflow_mod.workflow("effectflow_bench_pure", register=False)
def _pure_flow(ctx: context.Context, steps: int) -> None:
    for i in range(steps):
        ctx.call(f"s{i}", _pure_tool)


@workflow_mod.workflow("effectflow_bench_write", register=False)
def _write_flow(ctx: context.Context, steps: int) -> None:
    for i in range(steps):
        ctx.call(f"s{i}", _write_tool, n=i)


_FLOWS: dict[str, workflow_mod.Workflow[..., Any]] = {
    "pure": _pure_flow,
    "external_write": _write_flow,
}


def _direct(kind: str, runs: int) -> None:
    for _ in range(runs):
        for i in range(STEPS_PER_RUN):
            if kind == "pure":
                _const()
            else:
                _write(i)


@dataclasses.dataclass(frozen=True)
class Result:
    """One configuration's measurement."""

    #: ``pure`` or ``external_write``.
    kind: str
    #: ``FULL`` or ``NORMAL``.
    synchronous: str
    #: Steps timed.
    steps: int
    #: Wall time of the steps run through the runtime, in seconds.
    runtime_s: float
    #: Wall time of the same functions called directly, in seconds.
    direct_s: float

    @property
    def overhead_us_per_step(self) -> float:
        """What the runtime adds to each step, in microseconds."""
        return (self.runtime_s - self.direct_s) / self.steps * 1e6

    @property
    def steps_per_s(self) -> float:
        """Steps per second through the runtime."""
        return self.steps / self.runtime_s if self.runtime_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view, derived figures included."""
        return {
            **dataclasses.asdict(self),
            "overhead_us_per_step": self.overhead_us_per_step,
            "steps_per_s": self.steps_per_s,
        }


def measure(
    kind: str,
    synchronous: str,
    folder: Path,
    *,
    steps: int = 300,
    on_run: Callable[[], None] | None = None,
) -> Result:
    """Time ``steps`` steps of ``kind`` (in runs of ``STEPS_PER_RUN``) on a fresh ledger in
    ``folder``; ``on_run`` is called after each timed run (for a progress bar)."""
    runs = max(1, steps // STEPS_PER_RUN)
    flow = _FLOWS[kind]
    db = folder / f"{kind}-{synchronous.lower()}.db"
    rt = Runtime(f"sqlite:///{db}?synchronous={synchronous.lower()}", lease_ttl=60.0)
    try:
        for r in range(2):  # warm-up: caches, prepared statements, the WAL file
            rt.start(flow, run_id=f"warmup-{r}", steps=STEPS_PER_RUN)
        gc.collect()
        started = time.perf_counter()
        for r in range(runs):
            run = rt.start(flow, run_id=f"timed-{r}", steps=STEPS_PER_RUN)
            if run.status is not RunStatus.SUCCEEDED:
                raise RuntimeError(f"benchmark run {run.run_id} ended {run.status}: {run.error}")
            if on_run is not None:
                on_run()
        runtime_s = time.perf_counter() - started
    finally:
        rt.close()
    started = time.perf_counter()
    _direct(kind, runs)
    direct_s = time.perf_counter() - started
    return Result(kind, synchronous, runs * STEPS_PER_RUN, runtime_s, direct_s)


def run_all(
    *,
    steps: int = 300,
    on_start: Callable[[str, str, int], None] | None = None,
    on_run: Callable[[], None] | None = None,
) -> list[Result]:
    """Every kind × durability mode on a temporary ledger that is removed afterwards.

    ``on_start(kind, synchronous, runs)`` is called before each configuration.
    """
    folder = Path(tempfile.mkdtemp(prefix="effectflow-bench-"))
    results = []
    try:
        for synchronous in SYNC_MODES:
            for kind in KINDS:
                if on_start is not None:
                    on_start(kind, synchronous, max(1, steps // STEPS_PER_RUN))
                results.append(measure(kind, synchronous, folder, steps=steps, on_run=on_run))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return results
