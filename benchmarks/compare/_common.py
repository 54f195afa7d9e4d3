"""Shared by every peer's workload file: stdlib only, since each runs in its own virtual environment.

A workload file calls ``main(open_harness)``. This module times the workload on the framework (after
a warm-up) and the same functions called directly, and prints one JSON line: seconds with the
framework, seconds direct, steps, and the process's peak RSS (``ru_maxrss``, KiB on Linux).
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import sqlite3
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

STEPS = 10  # steps per workflow
THREADS = 8  # concurrent workflows in workload "concurrent"
WORKLOADS = ("sequential", "concurrent", "write")
# effectflow only (its asyncio workflows; run.py asks no peer for them).
ASYNC_WORKLOADS = ("concurrent_async", "write_async")


def const() -> int:
    """The trivial pure step."""
    return 1


class Provider:
    """The simulated provider: a file with one line per write (``key<TAB>payload``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh = path.open("a", encoding="utf-8")

    def append(self, key: str, payload: str) -> None:
        self._fh.write(f"{key}\t{payload}\n")
        self._fh.flush()

    def find(self, key: str) -> bool:
        with self.path.open(encoding="utf-8") as fh:
            return any(line.split("\t", 1)[0] == key for line in fh)

    def count(self, key: str) -> int:
        with self.path.open(encoding="utf-8") as fh:
            return sum(1 for line in fh if line.split("\t", 1)[0] == key)


def direct(workload: str, runs: int, provider: Provider) -> None:
    """The same calls as a workload, made without any framework."""

    def one(r: int) -> None:
        for i in range(STEPS):
            if workload.startswith("write"):
                provider.append(f"direct-{r}-{i}", "x")
            else:
                const()

    if workload == "concurrent":
        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(one, range(runs)))
    else:
        for r in range(runs):
            one(r)


def fan_out(workload: str, runs: int, one: Callable[[int], object]) -> None:
    """Run ``one(r)`` for every run: on ``THREADS`` threads for "concurrent", else in order."""
    if workload == "concurrent":
        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(one, range(runs)))
    else:
        for r in range(runs):
            one(r)


def timed(fn: Callable[[], object]) -> float:
    gc.collect()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def journal_mode(db: Path) -> str:
    """The journal mode the framework left in its database file (WAL persists; others read back)."""
    conn = sqlite3.connect(db)
    try:
        return str(conn.execute("PRAGMA journal_mode").fetchone()[0])
    finally:
        conn.close()


class Harness(Protocol):
    """What a peer's workload file provides: its framework, opened on a fresh folder."""

    #: The framework's database file (for its journal mode).
    db: Path

    def run(self, workload: str, runs: int, prefix: str) -> None:
        """Drive ``runs`` workflows of ``workload``; workflow ids start with ``prefix``."""

    def close(self) -> None:
        """Shut the framework down."""


def main(open_harness: Callable[[Path, Provider], Harness]) -> None:
    """Time one workload on a peer (after a warm-up on the same database) and print one JSON line."""
    parser = argparse.ArgumentParser()
    parser.add_argument("workload", choices=WORKLOADS + ASYNC_WORKLOADS)
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    provider = Provider(args.dir / "provider.txt")
    warm = max(5, args.runs // 10)
    direct(args.workload, warm, provider)
    direct_s = timed(lambda: direct(args.workload, args.runs, provider))
    harness = open_harness(args.dir, provider)
    try:
        harness.run(args.workload, warm, "warm")
        with_s = timed(lambda: harness.run(args.workload, args.runs, "timed"))
    finally:
        harness.close()
    out = {
        "with_s": with_s,
        "direct_s": direct_s,
        "steps": args.runs * STEPS,
        "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "journal_mode": journal_mode(harness.db) if harness.db.exists() else None,
        "python": sys.version.split()[0],
    }
    print(json.dumps(out), flush=True)
