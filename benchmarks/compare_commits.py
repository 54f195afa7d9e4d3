"""Two commits of effectflow on `benchmarks/compare`'s own workloads, interleaved in one run.

Each commit is exported with ``git archive`` into a temporary tree (nothing is checked out here),
and each sample is a fresh process running that tree's ``benchmarks/compare/peer_effectflow.py``
as ``run.py`` runs it (200 workflows x 10 steps, a fresh ledger, SQLite WAL with FULL sync), under
``PYTHONPATH=<tree>/src``. Repetitions alternate the order (ABBA), so drift on a shared machine
hits both alike; the CPU time of the timed loop is recorded too, which noise disturbs less than
wall time. Printed: per commit and workload the median steps/s and CPU µs a step, and the medians
of the paired ratios (second commit / first). Run::

    .venv/bin/python benchmarks/compare_commits.py ad95305 HEAD --repeats 7
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKLOADS = ("sequential", "write")


def _child(tree: Path, argv: list[str]) -> None:
    """In the sample's process: run the tree's peer script, timing the CPU of its timed loops."""
    peer = tree / "benchmarks" / "compare" / "peer_effectflow.py"
    sys.path.insert(0, str(peer.parent))
    import _common  # the tree's own

    import effectflow

    assert Path(effectflow.__file__).resolve().is_relative_to(tree.resolve()), effectflow.__file__
    cpu: list[float] = []
    timed = _common.timed

    def timed_with_cpu(fn: object) -> float:
        started = time.process_time()
        wall: float = timed(fn)
        cpu.append(time.process_time() - started)
        return wall

    _common.timed = timed_with_cpu
    sys.argv = [str(peer), *argv]
    runpy.run_path(str(peer), run_name="__main__")
    print(json.dumps({"with_cpu_s": cpu[1]}), flush=True)


def _sample(tree: Path, workload: str) -> dict[str, float]:
    folder = tempfile.mkdtemp(prefix="effectflow-commits-")
    env = {**os.environ, "PYTHONPATH": f"{tree}/src"}
    env.pop("EFFECTFLOW_DURABILITY", None)
    argv = [workload, "--dir", folder, "--runs", "200"]
    try:
        done = subprocess.run(
            [sys.executable, __file__, "--child", str(tree), *argv],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    lines = done.stdout.strip().splitlines()
    found = {**json.loads(lines[-2]), **json.loads(lines[-1])}
    return {
        "steps_s": found["steps"] / found["with_s"],
        "cpu_us": found["with_cpu_s"] / found["steps"] * 1e6,
        "load1": os.getloadavg()[0],
    }


def _export(commit: str, into: Path) -> Path:
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def main(argv: list[str]) -> int:
    """Export both commits, sample them interleaved, print the table."""
    if argv[:1] == ["--child"]:
        _child(Path(argv[1]), argv[2:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first")
    parser.add_argument("second")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="effectflow-trees-") as folder:
        trees = {
            c: _export(c, Path(folder) / str(i)) for i, c in enumerate((args.first, args.second))
        }
        samples: dict[tuple[str, str], list[dict[str, float]]] = {}
        for rep in range(args.repeats):
            for workload in WORKLOADS:
                order = list(trees) if rep % 2 == 0 else list(reversed(trees))
                for commit in order:
                    found = _sample(trees[commit], workload)
                    samples.setdefault((commit, workload), []).append(found)
                    print(
                        f"[{rep + 1}/{args.repeats}] {workload} {commit}: {found}", file=sys.stderr
                    )
    first, second = args.first, args.second
    print(
        f"| workload | {first} steps/s | {second} steps/s | {first} CPU µs/step "
        f"| {second} CPU µs/step | steps/s ratio (paired) | CPU ratio (paired) | load1 |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for workload in WORKLOADS:
        a, b = samples[(first, workload)], samples[(second, workload)]
        ratio = [y["steps_s"] / x["steps_s"] for x, y in zip(a, b, strict=True)]
        cpu = [y["cpu_us"] / x["cpu_us"] for x, y in zip(a, b, strict=True)]
        loads = [s["load1"] for s in a + b]
        print(
            f"| {workload} | {statistics.median(s['steps_s'] for s in a):.0f} "
            f"| {statistics.median(s['steps_s'] for s in b):.0f} "
            f"| {statistics.median(s['cpu_us'] for s in a):.1f} "
            f"| {statistics.median(s['cpu_us'] for s in b):.1f} "
            f"| {statistics.median(ratio):.3f} | {statistics.median(cpu):.3f} "
            f"| {min(loads):.2f}–{max(loads):.2f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
