"""The workers benchmark keeps running (tiny workload): BENCHMARKS.md's table comes from it."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import workers  # noqa: E402


def test_sqlite_configuration_runs_every_step_and_shares_transactions() -> None:
    row = workers.sqlite_inprocess(16, 2, group_commit=True)
    assert row["steps"] == 32
    assert row["steps_per_s"] > 0
    assert row["batches_per_txn"] > 1.0, "group commit shared no transaction"


def test_postgres_configuration_runs_or_says_why_not() -> None:
    row = workers.postgres_workers(1, 8, 2, group_commit=False)
    if row is None:  # no server: the script printed the reason and skipped the configuration
        return
    assert row["steps"] == 16
    assert row["p50_ms"] is not None
