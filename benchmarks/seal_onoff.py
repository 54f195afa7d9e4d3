"""What seals cost a write step, in one process: the same commit with sealing switched off and on.

A steadier measure than comparing two commits on a shared machine: process CPU time (and wall
time) of ``--runs`` workflows of 10 external-write steps (or pure ones) on SQLite, with the
library's sealing as it is (``on``), or with ``audit.seal_batch`` and the store's shard step
replaced by no-ops (``off``: no seal rows, no shard heads; the ledger then no longer verifies).
Run both, interleaved, several times::

    for r in 1 2 3; do for s in off on; do
      .venv/bin/python benchmarks/seal_onoff.py --seals $s; done; done

Prints one JSON line: µs of CPU and of wall time per step.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import effectflow as ef

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository: its benchmarks
from benchmarks import core_overhead as co


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seals", choices=("on", "off"), default="on")
    parser.add_argument("--runs", type=int, default=150)
    parser.add_argument("--workload", choices=("write", "pure"), default="write")
    parser.add_argument("--synchronous", choices=("FULL", "NORMAL"), default="NORMAL")
    args = parser.parse_args()
    if args.seals == "off":
        from effectflow.ledger import audit
        from effectflow.ledger import sqlite as sqlite_store

        audit.seal_batch = lambda *a, **k: None  # type: ignore[assignment]
        sqlite_store.SQLiteStore._seal_txn = lambda self, conn, seals: None  # type: ignore[method-assign]
    folder = tempfile.mkdtemp(prefix="effectflow-seal-onoff-")
    url = f"sqlite:///{folder}/ledger.db" + (
        "?synchronous=normal" if args.synchronous == "NORMAL" else ""
    )
    workflow = co.write_workflow if args.workload == "write" else co.pure_workflow
    with ef.Runtime(url) as rt:
        for i in range(20):  # warm-up
            rt.start(workflow, run_id=f"warm-{i}", steps=10)
        cpu, wall = time.process_time(), time.perf_counter()
        for i in range(args.runs):
            rt.start(workflow, run_id=f"run-{i}", steps=10)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    steps = args.runs * 10
    print(json.dumps({"seals": args.seals, "workload": args.workload,
                      "cpu_us_per_step": round(cpu / steps * 1e6),
                      "wall_us_per_step": round(wall / steps * 1e6)}))  # fmt: skip


if __name__ == "__main__":
    main()
