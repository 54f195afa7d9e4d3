"""Where a write step's time goes, and what threads do to it: the figures behind BENCHMARKS.md,
"The targets (issue 7)".

Runs ``effectflow.bench.Workloads`` (the peer comparison's workloads) on fresh SQLite ledgers and
reports, per ledger URL option:

- **statements**: time in each SQL statement (a ``sqlite3.Connection`` subclass times every
  ``execute``/``executemany``), per step;
- **pages**: WAL frames written per commit (``PRAGMA wal_checkpoint`` counts, auto-checkpoints off);
- **threads**: steps/s, process CPU time per step (user + system, ``time.process_time``), CPU/wall
  (how many of the machine's CPUs the process kept busy) and batches per group-commit transaction,
  for 1 and 8 threads on one Runtime.

Usage::

    .venv/bin/python benchmarks/write_profile.py                 # ~30 s
    .venv/bin/python benchmarks/write_profile.py --workflows 50  # quicker
"""

from __future__ import annotations

import argparse
import collections
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from effectflow import bench
from effectflow.ledger import sqlite as sqlite_backend

QUERIES = {"FULL": "", "durability=intents": "?durability=intents", "fsync off": "?synchronous=off"}


class TimedConnection(sqlite3.Connection):
    """Times every statement, keyed by its first 60 characters."""

    timings: collections.defaultdict[str, list[float]]

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:  # type: ignore[override]
        started = time.perf_counter()
        try:
            return super().execute(sql, *args)
        finally:
            self._note(sql, time.perf_counter() - started)

    def executemany(self, sql: str, *args: Any) -> sqlite3.Cursor:  # type: ignore[override]
        started = time.perf_counter()
        try:
            return super().executemany(sql, *args)
        finally:
            self._note("(many) " + sql, time.perf_counter() - started)

    def _note(self, sql: str, seconds: float) -> None:
        entry = self.timings[" ".join(sql.split())[:60]]
        entry[0] += 1
        entry[1] += seconds


@contextmanager
def workloads(query: str, *, timed: bool = False) -> Iterator[bench.Workloads]:
    folder = Path(tempfile.mkdtemp(prefix="effectflow-write-profile-"))
    provider = bench.Provider(folder / "provider.txt")
    original = sqlite3.connect
    if timed:
        TimedConnection.timings = collections.defaultdict(lambda: [0, 0.0])

        def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
            return original(*args, factory=TimedConnection, **kwargs)

        sqlite3.connect = connect  # type: ignore[assignment]
    try:
        made = bench.Workloads(f"sqlite:///{folder / 'ledger.db'}{query}", provider)
    finally:
        sqlite3.connect = original
    try:
        yield made
    finally:
        made.close()
        provider.close()
        shutil.rmtree(folder, ignore_errors=True)


def statements(query: str, runs: int) -> None:
    with workloads(query, timed=True) as w:
        w.run("write", 20, "warm")
        TimedConnection.timings.clear()
        started = time.perf_counter()
        w.run("write", runs, "timed")
        wall = time.perf_counter() - started
        steps = runs * bench.STEPS
        rows = sorted(TimedConnection.timings.items(), key=lambda kv: -kv[1][1])
    print(f"  {steps / wall:,.0f} steps/s; µs per step by statement (count per step):")
    for sql, (count, seconds) in rows[:12]:
        print(f"    {seconds / steps * 1e6:7.1f} µs  ({count / steps:4.2f})  {sql}")
    total = sum(seconds for _, seconds in TimedConnection.timings.values())
    print(f"    {total / steps * 1e6:7.1f} µs in SQL of {wall / steps * 1e6:.1f} µs a step")


def pages(query: str, runs: int) -> None:
    with workloads(query) as w:
        store = w.rt.store
        assert isinstance(store, sqlite_backend.SQLiteStore)
        w.run("write", 5, "warm")
        conn = store._conn
        conn.execute("PRAGMA wal_autocheckpoint=0")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        commits: list[str] = []
        conn.set_trace_callback(lambda sql: commits.append(sql) if sql == "COMMIT" else None)
        w.run("write", runs, "pages")
        conn.set_trace_callback(None)
        frames = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1]
    per_step = len(commits) / runs / bench.STEPS
    print(f"  {frames / len(commits):.1f} WAL pages per commit, {per_step:.2f} commits per step")


def threads(query: str, runs: int) -> None:
    for workload in ("sequential", "write"):
        with workloads(query) as w:
            w.run(workload, 20, "warm")
            rt = w.rt
            flow = w._flows[workload]
            for count in (1, 8):
                committer = rt.committer
                if committer is not None:
                    committer.transactions = committer.batches = 0
                started, cpu = time.perf_counter(), time.process_time()
                ids = [f"t{count}-{r}" for r in range(runs)]
                with ThreadPoolExecutor(count) as pool:
                    list(pool.map(lambda run_id: rt.start(flow, run_id=run_id), ids))  # noqa: B023
                wall, cpu = time.perf_counter() - started, time.process_time() - cpu
                steps = runs * bench.STEPS
                grouped = (
                    f"{committer.batches / max(1, committer.transactions):.1f}"
                    if committer is not None
                    else "-"
                )
                print(
                    f"  {workload:10} {count} thread(s): {steps / wall:7,.0f} steps/s, "
                    f"CPU {cpu / steps * 1e6:5.0f} µs/step, CPU/wall {cpu / wall:.2f}, "
                    f"batches per transaction {grouped}"
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workflows", type=int, default=200, help="workflows per measurement")
    args = parser.parse_args()
    if args.workflows < 1:
        parser.error("--workflows must be at least 1")
    print(f"# {args.workflows} workflows x {bench.STEPS} steps; Python {sys.version.split()[0]}, "
          f"SQLite {sqlite3.sqlite_version}")  # fmt: skip
    for label, query in QUERIES.items():
        print(f"\n## {label} ({query or 'the default URL'})")
        statements(query, args.workflows)
        pages(query, args.workflows // 4 or 1)
        threads(query, args.workflows)


if __name__ == "__main__":
    main()
