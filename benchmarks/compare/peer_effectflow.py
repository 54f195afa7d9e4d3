"""The workloads on effectflow (SQLite ledger), run by the project's own virtual environment.

The tools, workflows and thread fan-out are ``effectflow.bench.Workloads``, the code ``effectflow
bench`` runs; this file only fits them to ``_common.main``. The ledger is WAL with
``synchronous=FULL``; ``EFFECTFLOW_DURABILITY`` picks the ``durability`` option (default ``full``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common

from effectflow import bench

# _common.py keeps its own stdlib-only copy of the workload shape for the peers' venvs.
assert (_common.STEPS, _common.THREADS, _common.WORKLOADS, _common.ASYNC_WORKLOADS) == (
    bench.STEPS,
    bench.THREADS,
    bench.WORKLOADS,
    bench.ASYNC_WORKLOADS,
), "benchmarks/compare/_common.py and effectflow.bench disagree on the workloads"


class Harness:
    def __init__(self, folder: Path, provider: _common.Provider) -> None:
        self.db = folder / "effectflow.db"
        # EFFECTFLOW_DURABILITY=intents (run.py's "effectflow-intents"): outcomes without an fsync.
        durability = os.environ.get("EFFECTFLOW_DURABILITY", "full")
        self._workloads = bench.Workloads(f"sqlite:///{self.db}?durability={durability}", provider)

    def run(self, workload: str, runs: int, prefix: str) -> None:
        self._workloads.run(workload, runs, prefix)

    def close(self) -> None:
        self._workloads.close()


if __name__ == "__main__":
    _common.main(Harness)
