"""`effectflow bench`: the peer-comparison workloads on a temporary ledger, as a user runs them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from effectflow import bench
from effectflow.cli import main as cli_main
from effectflow.contracts import registry

EFFECTFLOW = shutil.which("effectflow", path=str(Path(sys.executable).parent)) or "effectflow"


def test_bench_json_reports_the_three_workloads_under_each_mode() -> None:
    """bench --json --mode all: the peer workloads and the asyncio ones under full, intents and
    normal, each with its steps, a positive rate, its ledger options and what the mode survives."""
    done = subprocess.run(
        [EFFECTFLOW, "bench", "--workflows", "2", "--mode", "all", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    workloads = (*bench.WORKLOADS, *bench.ASYNC_WORKLOADS)
    assert [(r["workload"], r["mode"]) for r in rows] == [
        (workload, mode) for mode in ("full", "intents", "normal") for workload in workloads
    ]
    for row in rows:
        assert (row["workflows"], row["steps"]) == (2, 2 * bench.STEPS)
        assert row["steps_per_s"] > 0
        assert row["runtime_s"] > 0
        assert isinstance(row["overhead_us_per_step"], float)
    assert {r["mode"]: (r["ledger_options"], r["durability"]) for r in rows} == {
        "full": ("synchronous=full", "every commit survives power loss"),
        "intents": (
            "durability=intents",
            "intents survive power loss; outcomes a process crash, power loss from the next flush",
        ),
        "normal": ("synchronous=normal", "every commit survives a process crash, not power loss"),
    }


def test_bench_table_defaults_to_full_and_points_at_the_comparison() -> None:
    """Without --mode the table has the three workloads under the default ledger only, and names
    the repository script for the side-by-side and BENCHMARKS.md for the published figures."""
    result = CliRunner().invoke(cli_main.app, ["bench", "--workflows", "1"])
    assert result.exit_code == 0, result.output
    for workload in (*bench.WORKLOADS, *bench.ASYNC_WORKLOADS):
        assert workload in result.stdout
    assert "every commit survives power loss" in result.stdout
    assert "intents" not in result.stdout
    assert "synchronous=normal" not in result.stdout
    assert "benchmarks/compare/run.py" in result.stdout
    assert "BENCHMARKS.md" in result.stdout


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--workflows", "0"], "--workflows"),
        (["--workflows", "many"], "--workflows"),
        (["--mode", "fast"], "--mode"),
        (["--synchronous", "full"], "--synchronous"),
    ],
)
def test_bench_rejects_bad_input_as_a_usage_error(args: list[str], option: str) -> None:
    """A workflow count below 1 or an unknown durability mode exits 2, naming the option."""
    result = CliRunner().invoke(cli_main.app, ["bench", *args])
    assert result.exit_code == 2, result.output
    assert option in result.stderr


def test_bench_workloads_stay_out_of_the_default_registry(tmp_path: Path) -> None:
    """The bench's tools and workflows live in the runtime's private registry, where the write
    tool's lookup resolves, never in the process-wide one an application uses."""
    provider = bench.Provider(tmp_path / "provider.txt")
    workloads = bench.Workloads(f"sqlite:///{tmp_path / 'bench.db'}", provider)
    try:
        workloads.run("write", 1, "t")
        lookup = workloads.rt.registry.tool("effectflow_bench_find_line")
        assert lookup.fn(idempotency_key="nope").status == "not_committed"
    finally:
        workloads.close()
        provider.close()
    assert len((tmp_path / "provider.txt").read_text().splitlines()) == bench.STEPS
    assert not [t for t in registry.DEFAULT.tools() if t.name.startswith("effectflow_bench")]
