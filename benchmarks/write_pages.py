"""Where a write step's commits go on SQLite: WAL pages by b-tree, and the step with and without
its fsyncs beside the raw commit (BENCHMARKS.md, "Issue 18: the write step").

- **pages**: the WAL's frames of ``--pages-runs`` write workflows (auto-checkpoints off), each
  frame's page named by the b-tree that owns it (the ``dbstat`` table), per commit;
- **split**: ``effectflow.bench.Workloads``' write workload on the default URL (FULL) and with
  ``?synchronous=off``, interleaved ``--repeats`` times (steps/s and process CPU a step, medians),
  and the raw commit of ``effectflow.bench.raw_commit_us`` measured in the same run.

Usage::

    .venv/bin/python benchmarks/write_pages.py               # ~40 s
    .venv/bin/python benchmarks/write_pages.py --repeats 1   # quicker
"""

from __future__ import annotations

import argparse
import collections
import shutil
import sqlite3
import statistics
import struct
import tempfile
import time
from pathlib import Path

from effectflow import bench
from effectflow.ledger import sqlite as sqlite_backend


def _workloads(folder: Path, query: str) -> tuple[bench.Workloads, bench.Provider]:
    provider = bench.Provider(folder / "provider.txt")
    return bench.Workloads(f"sqlite:///{folder / 'ledger.db'}{query}", provider), provider


def _frames(wal: bytes) -> list[list[int]]:
    """The pages of each commit in a WAL file (a commit frame records the database's size)."""
    page_size = struct.unpack(">I", wal[8:12])[0]
    commits: list[list[int]] = []
    current: list[int] = []
    offset = 32
    while offset + 24 <= len(wal):
        page, size_after = struct.unpack(">II", wal[offset : offset + 8])
        current.append(page)
        if size_after:
            commits.append(current)
            current = []
        offset += 24 + page_size
    return commits


def pages(runs: int) -> None:
    folder = Path(tempfile.mkdtemp(prefix="effectflow-write-pages-"))
    try:
        w, provider = _workloads(folder, "")
        store = w.rt.store
        assert isinstance(store, sqlite_backend.SQLiteStore)
        w.run("write", 30, "warm")
        conn = store._conn
        conn.execute("PRAGMA wal_autocheckpoint=0")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        w.run("write", runs, "pages")
        commits = _frames((folder / "ledger.db-wal").read_bytes())
        w.close()
        provider.close()
        reader = sqlite3.connect(folder / "ledger.db")
        owner = {p: n for n, p in reader.execute("SELECT name, pageno FROM dbstat")}
        reader.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    by_tree: collections.Counter[str] = collections.Counter()
    for commit in commits:
        for page in set(commit):
            by_tree[owner.get(page, f"page {page} (freed)")] += 1
    per = len(commits)
    frames = sum(len(c) for c in commits) / per
    print(f"  {per} commits of {runs} workflows: {frames:.1f} WAL pages per commit, by b-tree:")
    for name, count in by_tree.most_common():
        print(f"    {count / per:5.2f}  {name}")


def _sample(query: str, runs: int) -> tuple[float, float]:
    folder = Path(tempfile.mkdtemp(prefix="effectflow-write-split-"))
    try:
        w, provider = _workloads(folder, query)
        w.run("write", 20, "warm")
        wall, cpu = time.perf_counter(), time.process_time()
        w.run("write", runs, "timed")
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        w.close()
        provider.close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    steps = runs * bench.STEPS
    return steps / wall, cpu / steps * 1e6


def split(runs: int, repeats: int) -> None:
    found: dict[str, list[tuple[float, float]]] = {"FULL": [], "synchronous=off": []}
    floor: list[float] = []
    for _ in range(repeats):
        found["FULL"].append(_sample("", runs))
        found["synchronous=off"].append(_sample("?synchronous=off", runs))
        folder = Path(tempfile.mkdtemp(prefix="effectflow-write-floor-"))
        try:
            floor.append(bench.raw_commit_us(folder, 2000))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    for label, samples in found.items():
        rate = statistics.median(s[0] for s in samples)
        cpu = statistics.median(s[1] for s in samples)
        print(f"  {label:16} {rate:7,.0f} steps/s, {1e6 / rate:6,.0f} µs a step, CPU {cpu:5.0f} µs")
    commit = statistics.median(floor)
    print(f"  raw commit (FULL): {commit:.0f} µs; two a step: {1e6 / (2 * commit):,.0f} steps/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workflows", type=int, default=200, help="workflows per split sample")
    parser.add_argument("--pages-runs", type=int, default=5, help="workflows whose WAL is read")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved split samples")
    args = parser.parse_args()
    if min(args.workflows, args.pages_runs, args.repeats) < 1:
        parser.error("--workflows, --pages-runs and --repeats must be at least 1")
    print(f"# SQLite {sqlite3.sqlite_version}, {bench.STEPS} write steps a workflow")
    print("## pages")
    pages(args.pages_runs)
    print("## split")
    split(args.workflows, args.repeats)


if __name__ == "__main__":
    main()
