"""The benchmark BENCHMARKS.md quotes still runs (so its numbers can be reproduced)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "core_overhead.py"


def test_core_overhead_benchmark_runs_and_counts_commits(tmp_path: Path) -> None:
    """`core_overhead.py --quick --json` finishes and reports two commits per external-write step."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout)
    by_workload = {(s["workload"], s["synchronous"]): s for s in results["steps"]}
    # Intent + outcome are two durable commits; the run's own two (created already leased, and
    # finished) are spread over its 10 steps.
    assert by_workload[("external_write_x10", "FULL")]["commits_per_step"] == 2.2
    assert by_workload[("pure_x10", "FULL")]["commits_per_step"] == 0.2
