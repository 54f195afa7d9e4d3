"""Throughput and step latency of workers, with and without group commit, in one run.

Workloads: ``--runs`` runs (default 400) of ``--steps`` external-write steps each (default 5), every
step an intent and an outcome commit (``benchmarks/bench_app.py``; no provider, so the runtime and
the ledger are what is measured). Configurations:

* SQLite (FULL): one process, a ``Worker`` executing 8 runs at a time;
* PostgreSQL: 1, 2 and 4 ``effectflow worker`` processes (8 runs at a time each) on a fresh
  database (skipped, with the reason, when no server is reachable);

each with group commit on and off, and with each ``--durability`` asked for (``full``, the default
ledger option, and/or ``intents``: outcomes commit without their own flush). Reported: steps/s
(all steps / the time from the first step's intent to the last run's end, read from the ledger, so
process start-up is not counted) and p50/p99 step latency (from a step's intent to the next step's
intent, or to the run's end: one intent commit + the call + the outcome commit, read from the audit
log). Run::

    .venv/bin/python benchmarks/workers.py            # Markdown table (BENCHMARKS.md)
    .venv/bin/python benchmarks/workers.py --quick    # smoke run
    .venv/bin/python benchmarks/workers.py --json
    .venv/bin/python benchmarks/workers.py --repeat 5
    .venv/bin/python benchmarks/workers.py --durability both
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import effectflow as ef
from effectflow.runtime.worker import Worker

ROOT = Path(__file__).resolve().parents[1]
PG = os.environ.get("EFFECTFLOW_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def _submit(url: str, runs: int, steps: int) -> None:
    sys.path.insert(0, str(ROOT))
    from benchmarks import bench_app

    with ef.Runtime(url) as rt:
        for i in range(runs):
            rt.submit(bench_app.writes, run_id=f"b{i}", steps=steps)


def _timeline(url: str) -> tuple[list[float], float]:
    """Step latencies, and the span from the first intent to the last run's end (seconds).

    The span is read from the ledger, so process start-up and imports are not counted.
    """
    out: list[float] = []
    first, last = float("inf"), 0.0
    with ef.Runtime(url) as rt:
        for run in rt.runs(limit=100_000):
            events = rt.audit(run.run_id)
            intents = [e.at for e in events if e.kind == "intent"]
            ends = [e.at for e in events if e.kind == "run_succeeded"]
            marks = intents + ends[:1]
            out.extend(b - a for a, b in itertools.pairwise(marks))
            if intents:
                first = min(first, intents[0])
            if ends:
                last = max(last, ends[0])
    return out, last - first


def _with_durability(url: str, durability: str) -> str:
    """The ledger URL with its ``durability`` option (the default, ``full``, is left implicit)."""
    if durability == "full":
        return url
    return f"{url}{'&' if '?' in url else '?'}durability={durability}"


def _check(url: str, runs: int) -> None:
    with ef.Runtime(url) as rt:
        done = rt.runs(status="succeeded", limit=100_000)
        if len(done) != runs:
            raise SystemExit(f"{url}: only {len(done)} of {runs} runs succeeded")


def sqlite_inprocess(
    runs: int, steps: int, group_commit: bool, durability: str = "full"
) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from benchmarks import bench_app  # noqa: F401 - registers the workload

    with tempfile.TemporaryDirectory() as tmp:
        url = _with_durability(f"sqlite:///{tmp}/ledger.db", durability)
        _submit(url, runs, steps)
        with ef.Runtime(url, group_commit=group_commit) as rt:
            Worker(rt, concurrency=8).run(until_idle=True)
            shared = (rt.committer.batches / rt.committer.transactions) if rt.committer else 1.0
        _check(url, runs)
        lat, wall = _timeline(url)
    label = "SQLite (FULL), 1 process" if durability == "full" else "SQLite (intents), 1 process"
    return _row(label, 1, group_commit, runs * steps, wall, lat, shared)


def _pg_database() -> tuple[str, str] | None:
    """A fresh schema (not a database: CREATE/DROP DATABASE force checkpoints whose disk writes
    would disturb the next measurement) and the URL whose search_path selects it."""
    try:
        import psycopg
    except ImportError:
        return None
    name = f"ef_bench_{uuid.uuid4().hex[:10]}"
    try:
        with psycopg.connect(PG, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f'CREATE SCHEMA "{name}"')
    except psycopg.Error as exc:
        print(f"PostgreSQL not reachable at {PG}: {exc}", file=sys.stderr)
        return None
    joiner = "&" if "?" in PG else "?"
    return name, f"{PG}{joiner}options=-csearch_path%3D{name}"


def _drop(name: str) -> None:
    import psycopg

    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def postgres_workers(
    workers: int, runs: int, steps: int, group_commit: bool, durability: str = "full"
) -> dict[str, Any] | None:
    made = _pg_database()
    if made is None:
        return None
    name, url = made
    url = _with_durability(url, durability)
    try:
        _submit(url, runs, steps)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        command = [
            sys.executable,
            "-m",
            "effectflow.cli.main",
            "worker",
            "--app",
            "benchmarks.bench_app",
            "--db",
            url,
            "--concurrency",
            "8",
            "--until-idle",
        ]
        command += ["--group-commit", "on" if group_commit else "off"]
        procs = [
            subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
            for _ in range(workers)
        ]
        for proc in procs:
            _, err = proc.communicate(timeout=600)
            if proc.returncode != 0:
                raise SystemExit(f"worker failed: {err.decode()[-2000:]}")
        _check(url, runs)
        lat, wall = _timeline(url)
    finally:
        _drop(name)
    return _row(
        f"PostgreSQL{'' if durability == 'full' else ' (intents)'}, {workers} worker process(es)",
        workers,
        group_commit,
        runs * steps,
        wall,
        lat,
        None,
    )


def _row(
    label: str,
    workers: int,
    group: bool,
    steps: int,
    wall: float,
    lat: list[float],
    shared: float | None,
) -> dict[str, Any]:
    lat_ms = sorted(x * 1000 for x in lat)
    return {
        "setup": label,
        "workers": workers,
        "group_commit": group,
        "steps": steps,
        "wall_s": round(wall, 3),
        "steps_per_s": round(steps / wall),
        "p50_ms": round(statistics.median(lat_ms), 2) if lat_ms else None,
        "p99_ms": round(lat_ms[min(len(lat_ms) - 1, int(len(lat_ms) * 0.99))], 2)
        if lat_ms
        else None,
        "batches_per_txn": None if shared is None else round(shared, 2),
    }


def _median(found: list[dict[str, Any]]) -> dict[str, Any]:
    """The median sample by steps/s, with the range of steps/s over all samples."""
    ordered = sorted(found, key=lambda r: r["steps_per_s"])
    middle = dict(ordered[len(ordered) // 2])
    middle["steps_per_s_range"] = (ordered[0]["steps_per_s"], ordered[-1]["steps_per_s"])
    middle["samples"] = len(found)
    return middle


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="40 runs, 1 and 2 PG workers")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions; medians are shown")
    parser.add_argument(
        "--durability",
        choices=("full", "intents", "both"),
        default="full",
        help="the ledger's durability option (both: every configuration with each)",
    )
    args = parser.parse_args(argv)
    runs = 40 if args.quick else args.runs
    counts = (1, 2) if args.quick else (1, 2, 4)
    modes = ("full", "intents") if args.durability == "both" else (args.durability,)
    configs: list[tuple[str, int, bool, str]] = [
        ("sqlite", 1, g, d) for d in modes for g in (True, False)
    ]
    configs += [("postgres", w, g, d) for d in modes for g in (True, False) for w in counts]
    samples: dict[tuple[str, int, bool, str], list[dict[str, Any]]] = {c: [] for c in configs}
    for _ in range(args.repeat):  # interleaved, so a noisy minute hurts every configuration alike
        for kind, w, group, durability in configs:
            row = (
                sqlite_inprocess(runs, args.steps, group, durability)
                if kind == "sqlite"
                else postgres_workers(w, runs, args.steps, group, durability)
            )
            if row is not None:
                samples[(kind, w, group, durability)].append(row)
    rows = [_median(found) for found in samples.values() if found]
    if args.json:
        print(
            json.dumps(
                {"machine": platform.platform(), "cpus": os.cpu_count(), "rows": rows}, indent=2
            )
        )
        return 0
    print(
        f"{runs} runs x {args.steps} external-write steps; {platform.platform()}, {os.cpu_count()} CPUs\n"
    )
    print(
        "| setup | group commit | steps/s (median) | min – max | p50 step ms | p99 step ms "
        "| batches per txn |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        low, high = r["steps_per_s_range"]
        print(
            f"| {r['setup']} | {'on' if r['group_commit'] else 'off'} | {r['steps_per_s']:,} | "
            f"{low:,} – {high:,} | {r['p50_ms']} | {r['p99_ms']} | {r['batches_per_txn'] or '-'} |"
        )
    print(f"\n({args.repeat} repetitions, interleaved; medians by steps/s.)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
