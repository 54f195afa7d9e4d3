"""Core overhead of effectflow on SQLite, on this machine, in one run.

What it measures (BENCHMARKS.md explains how to read it):

* the floor: raw SQLite commits per second of a tiny INSERT in WAL mode, one transaction per row,
  with ``synchronous=FULL`` and ``synchronous=NORMAL``;
* the runtime's per-step overhead, ``(time with the runtime - time calling the same functions
  directly) / steps``, and steps per second, for
  - a *pure* step (a tool returning a constant), as a workflow of 10 pure steps and as 1 pure step
    per run (pure results ride with the next durable write, so the latter is really a per-run cost);
  - an *external-write* step (``effect="external_write"``, returns ``{"id": n}``): intent and
    outcome, two durable commits per step; as 10 steps per run and as 1 step per run;
  each with ``synchronous=FULL`` (the default) and ``?synchronous=normal``.

Every measurement is repeated (5 times by default) after a warm-up, on a fresh ledger file in a
temporary directory; the median, min and max are reported. Run::

    .venv/bin/python benchmarks/core_overhead.py            # Markdown table
    .venv/bin/python benchmarks/core_overhead.py --json     # machine-readable
    .venv/bin/python benchmarks/core_overhead.py --quick    # smoke run, a few seconds
    .venv/bin/python benchmarks/core_overhead.py --profile external_write_x10 --synchronous normal
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import functools
import gc
import io
import json
import os
import platform
import pstats
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import effectflow as ef

SYNC_MODES = ("FULL", "NORMAL")

# -- the functions under test -----------------------------------------------------------------------


def const() -> int:
    """The pure step: no I/O, a constant result."""
    return 1


def write(n: int) -> dict[str, int]:
    """The external-write step: trivially "writes" and returns the external id."""
    return {"id": n}


pure_tool = ef.tool("bench_pure_const", register=False)(const)
write_tool = ef.tool("bench_external_write", effect="external_write", register=False)(write)


@ef.workflow("bench_pure", register=False)
def pure_workflow(ctx: ef.Context, steps: int) -> None:
    for i in range(steps):
        ctx.call(f"s{i}", pure_tool)


@ef.workflow("bench_external_write", register=False)
def write_workflow(ctx: ef.Context, steps: int) -> None:
    for i in range(steps):
        ctx.call(f"s{i}", write_tool, n=i)


def direct_pure(steps: int) -> None:
    for _ in range(steps):
        const()


def direct_write(steps: int) -> None:
    for i in range(steps):
        write(i)


@dataclasses.dataclass(frozen=True)
class Workload:
    """A workflow, the same calls made directly, and how many steps each run takes."""

    name: str
    kind: str
    label: str
    workflow: ef.Workflow[..., Any]
    direct: Callable[[int], None]
    steps: int


WORKLOADS = (
    Workload("pure_x10", "pure", "pure step, workflow of 10", pure_workflow, direct_pure, 10),
    Workload("pure_x1", "pure", "pure step, 1 per run", pure_workflow, direct_pure, 1),
    Workload("external_write_x10", "external_write", "external-write step, workflow of 10",
             write_workflow, direct_write, 10),
    Workload("external_write_x1", "external_write", "external-write step, 1 per run",
             write_workflow, direct_write, 1),
)  # fmt: skip

# -- measuring --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Spread:
    """Median, min and max of repeated samples."""

    median: float
    min: float
    max: float
    samples: list[float]

    @classmethod
    def of(cls, samples: Sequence[float]) -> Spread:
        return cls(statistics.median(samples), min(samples), max(samples), list(samples))


@dataclasses.dataclass
class RawResult:
    synchronous: str
    commits: int
    commits_per_s: Spread
    us_per_commit: Spread


@dataclasses.dataclass
class StepResult:
    workload: str
    kind: str
    label: str
    synchronous: str
    runs: int
    steps_per_run: int
    commits_per_step: float | None
    overhead_us_per_step: Spread
    steps_per_s: Spread
    direct_us_per_step: float


@contextmanager
def fresh_dir(parent: str | None) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="effectflow-bench-", dir=parent))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def timed(fn: Callable[[], object]) -> float:
    gc.collect()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _insert_loop(conn: sqlite3.Connection, n: int) -> None:
    for _ in range(n):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t (v) VALUES ('x')")
        conn.execute("COMMIT")


def raw_sample(folder: Path, sync: str, commits: int, rep: int) -> float:
    """Commits/s of a tiny INSERT, each its own ``BEGIN IMMEDIATE ... COMMIT`` (as the ledger)."""
    conn = sqlite3.connect(folder / f"raw-{sync}-{rep}.db", isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={sync}")
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        _insert_loop(conn, max(10, commits // 10))  # warm-up
        return commits / timed(functools.partial(_insert_loop, conn, commits))
    finally:
        conn.close()


def raw_result(sync: str, commits: int, rates: Sequence[float]) -> RawResult:
    return RawResult(sync, commits, Spread.of(rates), Spread.of([1e6 / r for r in rates]))


def _count_commits(rt: ef.Runtime, work: Workload, run_prefix: str, runs: int) -> float | None:
    """Durable commits per step, counted on untimed runs (None if the store hides its connection)."""
    conn = getattr(rt.store, "_conn", None)
    if not isinstance(conn, sqlite3.Connection):
        return None
    seen: list[str] = []
    conn.set_trace_callback(lambda sql: seen.append(sql) if sql == "COMMIT" else None)
    try:
        for r in range(runs):
            rt.start(work.workflow, run_id=f"{run_prefix}-{r}", steps=work.steps)
    finally:
        conn.set_trace_callback(None)
    return len(seen) / (runs * work.steps)


def _drive(rt: ef.Runtime, work: Workload, run_prefix: str, runs: int) -> None:
    for r in range(runs):
        run = rt.start(work.workflow, run_id=f"{run_prefix}-{r}", steps=work.steps)
        if run.status is not ef.RunStatus.SUCCEEDED:
            raise RuntimeError(f"benchmark run {run.run_id} ended {run.status}: {run.error}")


def _direct(work: Workload, runs: int) -> None:
    for _ in range(runs):
        work.direct(work.steps)


@dataclasses.dataclass
class StepSample:
    """One repetition of one configuration."""

    with_runtime_s: float
    direct_s: float
    commits_per_step: float | None


def steps_sample(folder: Path, work: Workload, sync: str, runs: int, rep: int) -> StepSample:
    """Time ``runs`` runs of ``work`` on a fresh ledger, and the same calls made directly."""
    warmup = max(5, runs // 10)
    db = folder / f"{work.name}-{sync}-{rep}.db"
    rt = ef.Runtime(f"sqlite:///{db}?synchronous={sync.lower()}")
    try:
        commits_per_step = _count_commits(rt, work, "count", warmup) if rep == 0 else None
        _drive(rt, work, "warmup", warmup)
        _direct(work, warmup)
        direct = timed(functools.partial(_direct, work, runs))
        with_runtime = timed(functools.partial(_drive, rt, work, "timed", runs))
    finally:
        rt.close()
    return StepSample(with_runtime, direct, commits_per_step)


def steps_result(work: Workload, sync: str, runs: int, samples: Sequence[StepSample]) -> StepResult:
    """Per-step overhead of ``work`` against calling its functions directly."""
    total_steps = runs * work.steps
    counted = [x.commits_per_step for x in samples if x.commits_per_step is not None]
    return StepResult(
        workload=work.name,
        kind=work.kind,
        label=work.label,
        synchronous=sync,
        runs=runs,
        steps_per_run=work.steps,
        commits_per_step=counted[0] if counted else None,
        overhead_us_per_step=Spread.of(
            [(x.with_runtime_s - x.direct_s) / total_steps * 1e6 for x in samples]
        ),
        steps_per_s=Spread.of([total_steps / x.with_runtime_s for x in samples]),
        direct_us_per_step=statistics.median(x.direct_s / total_steps * 1e6 for x in samples),
    )


def measure(
    folder: Path, runs: int, commits: int, repeats: int
) -> tuple[list[RawResult], list[StepResult]]:
    """Every configuration once per repetition, so a burst of load elsewhere on the machine spoils
    one sample of each configuration rather than every sample of one."""
    raw: dict[str, list[float]] = {sync: [] for sync in SYNC_MODES}
    configs = [(work, sync) for sync in SYNC_MODES for work in WORKLOADS]
    steps: dict[tuple[str, str], list[StepSample]] = {(w.name, s): [] for w, s in configs}
    for rep in range(repeats):
        for sync in SYNC_MODES:
            raw[sync].append(raw_sample(folder, sync, commits, rep))
        for work, sync in configs:
            steps[work.name, sync].append(steps_sample(folder, work, sync, runs, rep))
    return (
        [raw_result(sync, commits, rates) for sync, rates in raw.items()],
        [steps_result(w, s, runs, steps[w.name, s]) for w, s in configs],
    )


def profile(folder: Path, work: Workload, sync: str, runs: int, top: int = 25) -> str:
    """cProfile of one timed loop, sorted by internal time (for BENCHMARKS.md's reading)."""
    rt = ef.Runtime(f"sqlite:///{folder / 'profile.db'}?synchronous={sync.lower()}")
    try:
        _drive(rt, work, "warmup", max(5, runs // 10))
        profiler = cProfile.Profile()
        profiler.runcall(_drive, rt, work, "profiled", runs)
    finally:
        rt.close()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


@dataclasses.dataclass
class Split:
    """A run's cost split into a fixed part and a part per step, from two step counts."""

    kind: str
    synchronous: str
    per_step_us: float
    per_run_us: float


def split(steps: Sequence[StepResult]) -> list[Split]:
    """Solve ``total(n) = per_run + n * per_step`` from the medians at two step counts."""
    found: list[Split] = []
    for sync in SYNC_MODES:
        for kind in dict.fromkeys(s.kind for s in steps):
            pair = sorted(
                (s for s in steps if s.kind == kind and s.synchronous == sync),
                key=lambda s: s.steps_per_run,
            )
            if len(pair) < 2 or pair[0].steps_per_run == pair[-1].steps_per_run:
                continue
            lo, hi = pair[0], pair[-1]
            total_lo = lo.overhead_us_per_step.median * lo.steps_per_run
            total_hi = hi.overhead_us_per_step.median * hi.steps_per_run
            per_step = (total_hi - total_lo) / (hi.steps_per_run - lo.steps_per_run)
            found.append(Split(kind, sync, per_step, total_lo - per_step * lo.steps_per_run))
    return found


# -- the machine ------------------------------------------------------------------------------------


def _nproc() -> int:
    """CPUs this process may run on (what ``nproc`` prints)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _filesystem(path: str) -> str:
    """The filesystem type under ``path`` (fsync on tmpfs is free, which would void the FULL rows)."""
    best, fstype = "", "unknown"
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return fstype
    real = os.path.realpath(path)
    for line in mounts:
        parts = line.split()
        if len(parts) >= 3 and real.startswith(parts[1]) and len(parts[1]) > len(best):
            best, fstype = parts[1], parts[2]
    return fstype


def _load() -> float | None:
    return round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None


def machine(parent: str | None) -> dict[str, Any]:
    folder = parent or tempfile.gettempdir()
    return {
        "nproc": _nproc(),
        "cpu": _cpu_model(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
        "effectflow": ef.__version__,
        "ledger_dir": folder,
        "ledger_fs": _filesystem(folder),
        "loadavg_1min_start": _load(),
    }


# -- output -----------------------------------------------------------------------------------------


def _n(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def markdown(info: dict[str, Any], raw: list[RawResult], steps: list[StepResult]) -> str:
    floor = {r.synchronous: r.us_per_commit.median for r in raw}
    lines = [
        f"Machine: {info['nproc']} CPU(s), {info['cpu']}; Python {info['python']}, "
        f"SQLite {info['sqlite']}; ledger files on {info['ledger_fs']} ({info['ledger_dir']}); "
        f"1-min load average {info['loadavg_1min_start']} at the start, "
        f"{info['loadavg_1min_end']} at the end.",
        "",
        "| Floor: raw SQLite commit (tiny INSERT, WAL, 1 per txn) | synchronous | commits/s "
        "(median) | min – max | µs / commit |",
        "|---|---|---:|---:|---:|",
    ]
    for r in raw:
        lines.append(
            f"| {r.commits} commits | {r.synchronous} | {_n(r.commits_per_s.median)} | "
            f"{_n(r.commits_per_s.min)} – {_n(r.commits_per_s.max)} | "
            f"{_n(r.us_per_commit.median)} |"
        )
    lines += [
        "",
        "| Step | synchronous | runs × steps | commits / step | overhead µs / step (median) | "
        "min – max | steps/s (median) | commit floor µs / step |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for s in steps:
        cps = "n/a" if s.commits_per_step is None else f"{s.commits_per_step:.1f}"
        floor_us = (
            "n/a" if s.commits_per_step is None else _n(s.commits_per_step * floor[s.synchronous])
        )
        lines.append(
            f"| {s.label} | {s.synchronous} | {s.runs} × {s.steps_per_run} | {cps} | "
            f"{_n(s.overhead_us_per_step.median)} | {_n(s.overhead_us_per_step.min)} – "
            f"{_n(s.overhead_us_per_step.max)} | {_n(s.steps_per_s.median)} | {floor_us} |"
        )
    direct = max(s.direct_us_per_step for s in steps) if steps else 0.0
    lines += [
        "",
        f"Calling the same functions directly costs ≤ {direct:.2f} µs per step. "
        "Commit floor = commits/step × the raw µs/commit at the same synchronous setting.",
    ]
    splits = split(steps)
    if splits:
        lines += [
            "",
            "| Derived from the medians: total = per run + steps × per step | synchronous | "
            "µs per extra step | µs fixed per run |",
            "|---|---|---:|---:|",
        ]
        lines += [
            f"| {x.kind.replace('_', '-')} steps | {x.synchronous} | {_n(x.per_step_us)} | "
            f"{_n(x.per_run_us)} |"
            for x in splits
        ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="print machine-readable results")
    parser.add_argument("--quick", action="store_true", help="a smoke run: few runs, 2 repeats")
    parser.add_argument("--runs", type=int, default=200, help="runs per measurement (200)")
    parser.add_argument("--commits", type=int, default=2000, help="raw commits per measurement")
    parser.add_argument("--repeats", type=int, default=5, help="repetitions; the median is shown")
    parser.add_argument("--dir", default=None, help="where ledger files go (a temp dir inside)")
    parser.add_argument(
        "--profile",
        choices=[w.name for w in WORKLOADS],
        default=None,
        help="instead of the table, print a cProfile of one workload",
    )
    parser.add_argument(
        "--synchronous",
        type=str.upper,
        choices=SYNC_MODES,
        default="FULL",
        help="the SQLite synchronous setting --profile uses (FULL)",
    )
    args = parser.parse_args(argv)
    runs, commits, repeats = args.runs, args.commits, args.repeats
    if args.quick:
        runs, commits, repeats = min(runs, 10), min(commits, 100), min(repeats, 2)
    if runs < 1 or commits < 1 or repeats < 1:
        parser.error("--runs, --commits and --repeats must be positive")

    info = machine(args.dir)
    with fresh_dir(args.dir) as folder:
        if args.profile is not None:
            work = next(w for w in WORKLOADS if w.name == args.profile)
            print(profile(folder, work, args.synchronous, runs))
            return 0
        started = time.perf_counter()
        raw, steps = measure(folder, runs, commits, repeats)
        elapsed = time.perf_counter() - started
    info["loadavg_1min_end"] = _load()
    if args.json:
        result = {
            "machine": info,
            "parameters": {"runs": runs, "commits": commits, "repeats": repeats},
            "elapsed_s": elapsed,
            "raw_commits": [dataclasses.asdict(r) for r in raw],
            "steps": [dataclasses.asdict(s) for s in steps],
            "derived": [dataclasses.asdict(x) for x in split(steps)],
        }
        json.dump(result, sys.stdout, indent=2)
        print()
    else:
        print(markdown(info, raw, steps))
        print(f"\n({repeats} repetitions, {elapsed:.0f} s in all.)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
