"""PostgreSQL worker processes of two commits (or this tree), interleaved in one run.

``benchmarks/workers.py``'s PostgreSQL workload (``--runs`` runs of ``--steps`` external-write
steps, ``benchmarks/bench_app.py``, on a fresh schema; 1 and 4 ``effectflow worker`` processes,
8 runs at a time each, group commit off, the PostgreSQL default), with each commit's tree exported
by ``git archive`` and its workers run under ``PYTHONPATH=<tree>/src:<tree>``. Samples alternate
(ABBA); printed: the median steps/s (all steps over the span from the first intent to the last
run's end, read from the ledger) and p50 step latency per commit and worker count, each commit's
4-worker / 1-worker ratio, and the paired ratio of the second commit to the first. Run::

    .venv/bin/python benchmarks/pg_workers.py 62875d3 HEAD --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import workers as bench  # noqa: E402 - after the path


def sample(tree: Path, processes: int, runs: int, steps: int) -> dict[str, Any]:
    """One measurement: a fresh schema, ``processes`` workers of ``tree``."""
    made = bench._pg_database()
    if made is None:
        raise SystemExit("PostgreSQL is not reachable")
    name, url = made
    try:
        bench._submit(url, runs, steps)
        env = {**os.environ, "PYTHONPATH": f"{tree / 'src'}:{tree}"}
        command = [
            sys.executable, "-m", "effectflow.cli.main", "worker", "--app",
            "benchmarks.bench_app", "--db", url, "--concurrency", "8", "--until-idle",
            "--group-commit", "off",
        ]  # fmt: skip
        procs = [
            subprocess.Popen(
                command, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
            for _ in range(processes)
        ]
        for proc in procs:
            _, err = proc.communicate(timeout=900)
            if proc.returncode != 0:
                raise SystemExit(f"worker failed: {err.decode()[-2000:]}")
        bench._check(url, runs)
        lat, wall = bench._timeline(url)
    finally:
        bench._drop(name)
    lat_ms = sorted(x * 1000 for x in lat)
    return {
        "steps_s": runs * steps / wall,
        "p50_ms": statistics.median(lat_ms),
        "load1": os.getloadavg()[0],
    }


def _export(commit: str, into: Path) -> Path:
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("commits", nargs="*", help="commits to compare (none: this tree)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="effectflow-trees-") as folder:
        trees = {c: _export(c, Path(folder) / str(i)) for i, c in enumerate(args.commits)}
        if not trees:
            trees = {"this tree": ROOT}
        samples: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for rep in range(args.repeats):
            order = list(trees) if rep % 2 == 0 else list(reversed(trees))
            for processes in args.workers:
                for commit in order:
                    found = sample(trees[commit], processes, args.runs, args.steps)
                    samples.setdefault((commit, processes), []).append(found)
                    print(
                        f"[{rep + 1}/{args.repeats}] {commit} x{processes}: {found}",
                        file=sys.stderr,
                    )
    names = list(trees)
    print(
        "| commit | workers | steps/s | p50 step ms | vs 1 worker | vs first commit (paired) | load1 |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for commit in names:
        for processes in args.workers:
            found = samples[(commit, processes)]
            one = samples[(commit, args.workers[0])]
            first = samples[(names[0], processes)]
            scale = [s["steps_s"] / o["steps_s"] for s, o in zip(found, one, strict=True)]
            paired = [s["steps_s"] / f["steps_s"] for s, f in zip(found, first, strict=True)]
            loads = [s["load1"] for s in found]
            print(
                f"| {commit} | {processes} | {statistics.median(s['steps_s'] for s in found):.0f} "
                f"| {statistics.median(s['p50_ms'] for s in found):.2f} "
                f"| {statistics.median(scale):.2f} | {statistics.median(paired):.3f} "
                f"| {min(loads):.2f}–{max(loads):.2f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
