"""Write steps on threads: 8 threads in one process against one thread, on SQLite (issue 18).

Each sample is a fresh process that runs ``effectflow.bench.Workloads``' write workflow (10
external-write steps each: an intent and an outcome commit a step) on a fresh SQLite ledger
(``synchronous=FULL``, the default), once on one thread and once on ``--threads`` threads sharing
one Runtime, each after a warm-up on its own fresh ledger, in alternating order. It records steps/s,
the process's CPU time a step (``time.process_time``: user + system of every thread) and the
batches each group-commit transaction carried. Printed: per tree the median of each, and the median
of the per-sample ratios (N threads / one thread).

Given two or more trees (git commits, exported with ``git archive``; or directories holding a
``src/``), the samples alternate between them (ABBA), so drift on a shared machine hits each alike,
and the paired ratios between the trees are printed too::

    .venv/bin/python benchmarks/threads_write.py                      # the working tree, 5 samples
    .venv/bin/python benchmarks/threads_write.py HEAD~1 HEAD --repeats 5
    .venv/bin/python benchmarks/threads_write.py --workload sequential   # pure steps instead
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _switches() -> int:
    """The process's context switches so far, voluntary and not (every thread's)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_nvcsw + usage.ru_nivcsw


def _measure(workload: str, threads: int, runs: int, query: str) -> dict[str, float]:
    """In the sample's process: ``runs`` workflows on ``threads`` threads, a fresh ledger."""
    from effectflow import bench

    folder = Path(tempfile.mkdtemp(prefix="effectflow-threads-"))
    provider = bench.Provider(folder / "provider.txt")
    w = bench.Workloads(f"sqlite:///{folder / 'ledger.db'}{query}", provider)
    try:
        rt = w.rt
        flow = w._flows[workload]
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda r: rt.start(flow, run_id=f"warm-{r}"), range(max(threads, 20))))
        committer = rt.committer
        if committer is not None:
            committer.transactions = committer.batches = 0
        ids = [f"timed-{r}" for r in range(runs)]
        switches = _switches()
        started, cpu = time.perf_counter(), time.process_time()
        with ThreadPoolExecutor(threads) as pool:
            done = list(pool.map(lambda run_id: rt.start(flow, run_id=run_id), ids))
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        switches = _switches() - switches
        failed = [r.run_id for r in done if r.status.value != "succeeded"]
        if failed:
            raise RuntimeError(f"runs did not succeed: {failed[:5]}")
        steps = runs * bench.STEPS
        grouped = committer.batches / max(1, committer.transactions) if committer else 1.0
        return {
            "steps_s": steps / wall,
            "cpu_us": cpu / steps * 1e6,
            "batches_per_txn": grouped,
            "switches": switches / steps,
        }
    finally:
        w.close()
        provider.close()
        shutil.rmtree(folder, ignore_errors=True)


def _child(workload: str, threads: int, runs: int, one_first: bool, query: str) -> None:
    from effectflow import bench

    counts = (1, threads) if one_first else (threads, 1)
    out: dict[str, Any] = {str(count): _measure(workload, count, runs, query) for count in counts}
    with tempfile.TemporaryDirectory(prefix="effectflow-threads-floor-") as folder:
        out["floor_us"] = bench.raw_commit_us(Path(folder), 300)
    print(json.dumps(out), flush=True)


def _sample(tree: Path | None, args: argparse.Namespace, one_first: bool) -> dict[str, float]:
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = f"{tree}/src"
    env.pop("EFFECTFLOW_DURABILITY", None)
    argv = [args.workload, str(args.threads), str(args.workflows), "1" if one_first else "0"]
    argv.append(args.query)
    done = subprocess.run(
        [sys.executable, __file__, "--child", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    found = json.loads(done.stdout.strip().splitlines()[-1])
    one, many = found["1"], found[str(args.threads)]
    return {
        "one_steps_s": one["steps_s"],
        "many_steps_s": many["steps_s"],
        "ratio": many["steps_s"] / one["steps_s"],
        "one_cpu_us": one["cpu_us"],
        "many_cpu_us": many["cpu_us"],
        "batches_per_txn": many["batches_per_txn"],
        "one_switches": one["switches"],
        "many_switches": many["switches"],
        "floor_us": found["floor_us"],
        "load1": os.getloadavg()[0],
    }


def _tree(name: str, into: Path) -> Path:
    """A directory as it is, or a commit exported into ``into``."""
    if Path(name).is_dir():
        return Path(name).resolve()
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", name], capture_output=True)
    if archive.returncode:
        raise SystemExit(f"{name!r} is neither a directory nor a commit: {archive.stderr!r}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def main(argv: list[str]) -> int:
    """Sample the trees interleaved; print the table."""
    if argv[:1] == ["--child"]:
        _child(argv[1], int(argv[2]), int(argv[3]), argv[4] == "1", argv[5])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs="*", help="commits or directories (default: this tree)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workflows", type=int, default=200, help="workflows per measurement")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--workload", default="write", choices=("write", "sequential"))
    parser.add_argument(
        "--query",
        default="",
        help="the ledger URL's options, e.g. '?synchronous=off' (the CPU without the fsyncs)",
    )
    args = parser.parse_args(argv)
    names = args.trees or [str(REPO)]
    with tempfile.TemporaryDirectory(prefix="effectflow-trees-") as folder:
        trees = {n: _tree(n, Path(folder) / str(i)) for i, n in enumerate(names)}
        samples: dict[str, list[dict[str, float]]] = {n: [] for n in names}
        for rep in range(args.repeats):
            order = names if rep % 2 == 0 else names[::-1]
            for name in order:
                found = _sample(trees[name], args, one_first=rep % 2 == 0)
                samples[name].append(found)
                print(f"[{rep + 1}/{args.repeats}] {name}: {found}", file=sys.stderr, flush=True)
    n = args.threads
    print(f"# {args.workload}: {args.workflows} workflows x 10 steps, 1 and {n} threads, "
          f"SQLite {args.query or '(synchronous=FULL)'}, medians of {args.repeats}; "
          "floor: a raw SQLite commit at FULL in the same sample")  # fmt: skip
    print(
        f"| tree | 1 thread steps/s | {n} threads steps/s | {n} / 1 (paired) "
        f"| 1 thread CPU µs/step | {n} threads CPU µs/step | context switches/step, 1 and {n} "
        "| batches per txn | floor µs | load1 |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for name in names:
        s = samples[name]
        med = {k: statistics.median(x[k] for x in s) for k in s[0]}
        loads = [x["load1"] for x in s]
        print(
            f"| {name} | {med['one_steps_s']:.0f} | {med['many_steps_s']:.0f} | {med['ratio']:.2f} "
            f"| {med['one_cpu_us']:.0f} | {med['many_cpu_us']:.0f} "
            f"| {med['one_switches']:.1f}, {med['many_switches']:.1f} | {med['batches_per_txn']:.1f} "
            f"| {med['floor_us']:.0f} | {min(loads):.2f}–{max(loads):.2f} |"
        )
    first = names[0]
    for name in names[1:]:
        for key, label in (
            ("one_steps_s", "1 thread steps/s"),
            ("many_steps_s", f"{n} threads steps/s"),
            ("one_cpu_us", "1 thread CPU/step"),
            ("many_cpu_us", f"{n} threads CPU/step"),
        ):
            paired = [b[key] / a[key] for a, b in zip(samples[first], samples[name], strict=True)]
            print(f"# {name} / {first}, {label} (paired): {statistics.median(paired):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
