"""The benchmark BENCHMARKS.md quotes still runs (so its numbers can be reproduced)."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.parametrize("workload", ["write", "write_async"])
def test_peer_comparison_runs_effectflow_bench_workloads(tmp_path: Path, workload: str) -> None:
    """`compare/peer_effectflow.py write` (the code `effectflow bench` runs), and its asyncio twin,
    print their JSON line, and every write reached the simulated provider once."""
    script = SCRIPT.parent / "compare" / "peer_effectflow.py"
    done = subprocess.run(
        [sys.executable, str(script), workload, "--dir", str(tmp_path), "--runs", "2"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert (out["steps"], out["journal_mode"]) == (20, "wal")
    keys = [line.split("\t")[0] for line in (tmp_path / "provider.txt").read_text().splitlines()]
    # 5 warm-up and 2 timed workflows through effectflow, plus the direct baseline's own lines.
    framework = [k for k in keys if not k.startswith("direct-")]
    assert len(framework) == len(set(framework)) == 7 * 10


def test_write_profile_reports_statements_pages_and_threads() -> None:
    """`write_profile.py` (the profile behind BENCHMARKS.md, "The targets") runs on every ledger
    option it compares and counts 2.2 commits per external-write step on each."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT.parent / "write_profile.py"), "--workflows", "4"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for section in ("## FULL", "## durability=intents", "## fsync off"):
        assert section in out
    assert out.count("2.20 commits per step") == 3
    assert out.count("8 thread(s)") == 6
    # Only the intents ledger switches the synchronous mode between transactions.
    assert out.count("PRAGMA synchronous=NORMAL") == 1


def test_async_group_commit_benchmark_groups_on_sqlite() -> None:
    """`async_group_commit.py` (BENCHMARKS.md, "Workers") runs, and with group commit on, the 8
    async runs' commits share transactions on SQLite (on PostgreSQL too when a server answers)."""
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT.parent / "async_group_commit.py"),
            "--workflows",
            "16",
            "--repeat",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rows = [line.split(" | ") for line in done.stdout.splitlines() if line.startswith("| sqlite")]
    by = {(r[1], r[2]): r for r in rows}
    assert float(by[("on (default)", "write")][6].rstrip(" |")) > 1.0
    assert float(by[("off", "write")][6].rstrip(" |")) == 1.0


def test_peer_comparison_table_has_the_floor_and_the_write_steps_share_of_it() -> None:
    """`compare/run.py`'s Markdown has the floor table: the median raw commit, the two-commit
    write step it allows, and each effectflow write workload's fraction of it."""
    run = runpy.run_path(str(SCRIPT.parent / "compare" / "run.py"))
    results = {"effectflow/write": {"steps_per_s": 500.0}}
    lines = run["floor_lines"](results, [300.0, 250.0, 200.0])
    assert "| raw SQLite WAL commit, synchronous=FULL (tiny INSERT, 1 per transaction) | 250 |" in (
        "\n".join(lines)
    )
    assert "| a write step's two commits (intent, outcome) | — | 2,000 | — |" in lines
    assert "| effectflow/write | — | 500 | 0.25 |" in lines
    assert run["floor_lines"](results, []) == []
    assert run["floor_json"]([300.0, 250.0, 200.0])["write_steps_per_s"] == 2000.0


def test_write_pages_names_the_b_trees_a_commit_writes_and_splits_the_fsyncs_off() -> None:
    """`write_pages.py` (BENCHMARKS.md, "Issue 18") reads the WAL back: the seals, the audit log
    and the run row are among the pages each commit writes; and it times the step with and
    without its fsyncs beside the raw commit."""
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT.parent / "write_pages.py"),
            "--workflows",
            "2",
            "--pages-runs",
            "1",
            "--repeats",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "22 commits of 1 workflows" in out  # its start, 10 intents, 10 outcomes, its end
    for tree in ("seals", "audit", "runs", "audit_shards"):
        assert f"  {tree}\n" in out
    assert "FULL" in out
    assert "synchronous=off" in out
    assert "raw commit (FULL)" in out


def test_recovery_at_scale_interrupts_every_run_and_recovers_each_charge_once(
    tmp_path: Path,
) -> None:
    """`recovery_scale.py` (BENCHMARKS.md, "Recovery at scale") makes its interrupted runs and
    recovers them: its own check (every run succeeded, one charge a key) passes. It once broke
    silently for sessions: its fill's fault plan no longer reached the runs."""
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT.parent / "recovery_scale.py"),
            "--runs",
            "30",
            "--batch",
            "10",
            "--no-postgres",
            "--dir",
            str(tmp_path),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "all 30 runs succeeded, 30 charges under 30 keys" in done.stdout


def test_lean_write_times_every_design_beside_effectflow() -> None:
    """`lean_write.py` (BENCHMARKS.md, "Issue 18" → "Session 10") runs each throwaway design and
    effectflow's, and the leaner the design the fewer WAL frames its commits write."""
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT.parent / "lean_write.py"),
            "--repeats",
            "1",
            "--workflows",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rows = {
        line.split("|")[1].strip(): line.split("|")
        for line in done.stdout.splitlines()
        if line.startswith("| ") and not line.startswith(("| design", "| ---"))
    }
    assert list(rows) == ["floor", "journal", "journal+effects", "lean", "effectflow"]
    frames = [float(rows[d][4]) for d in rows]
    assert frames == sorted(frames)


def test_frame_cost_prints_each_frame_count_and_the_slopes(tmp_path: Path) -> None:
    """`frame_cost.py` (BENCHMARKS.md, "What one more WAL frame costs a durable commit") runs
    every case it compares, with the bare-file writes, and prints a slope for each kind of key."""
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT.parent / "frame_cost.py"),
            "--repeats",
            "1",
            "--commits",
            "20",
            "--file",
            "--dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    for keys in ("in order", "random"):
        assert [r.split("|")[2].strip() for r in rows if r.startswith(f"| {keys} |")] == [
            "1",
            "5",
            "10",
            "20",
            "slope, 5 … 20",
        ]
    assert sum(r.startswith("| 2 pwrite a frame |") for r in rows) == 4
    assert sum(r.startswith("| one pwrite |") for r in rows) == 4
    assert list(tmp_path.iterdir()) == []  # its files are removed
