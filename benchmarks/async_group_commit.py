"""Async group commit on both backends: 8 asyncio runs at a time against one run at a time.

Runs ``effectflow.bench.Workloads`` (the peer comparison's workflows) on a fresh SQLite ledger and a
fresh PostgreSQL database (skipped, saying why, when no server answers), with the Runtime's
``group_commit`` left to its default (on for asyncio) and forced off. For each: steps/s of the
pure and the write workflows one run at a time (``sequential``, ``write``; ``Runtime.start``) and
8 at a time on one event loop (``concurrent_async``, ``write_async``; ``Runtime.start_async``), the
ratio, and how many batches each transaction carried.

Usage::

    .venv/bin/python benchmarks/async_group_commit.py              # ~1 min, medians of 3
    .venv/bin/python benchmarks/async_group_commit.py --workflows 20 --repeat 1   # smoke
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from effectflow import bench

PG = os.environ.get("EFFECTFLOW_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
PAIRS = (("sequential", "concurrent_async"), ("write", "write_async"))


@contextmanager
def ledger(backend: str) -> Iterator[str | None]:
    """A fresh ledger URL, or None when the backend cannot be reached."""
    if backend == "sqlite":
        folder = Path(tempfile.mkdtemp(prefix="effectflow-agc-"))
        try:
            yield f"sqlite:///{folder / 'ledger.db'}"
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return
    name = f"ef_agc_{uuid.uuid4().hex[:10]}"
    try:
        with psycopg.connect(PG, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error as exc:
        print(f"# PostgreSQL not reachable at {PG}: {' '.join(str(exc).split())}")
        yield None
        return
    try:
        yield PG.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(PG, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def measure(url: str, group_commit: bool | None, workflows: int) -> dict[str, float]:
    """Steps/s of each workload on one fresh ledger, and batches per async transaction."""
    folder = Path(tempfile.mkdtemp(prefix="effectflow-agc-provider-"))
    provider = bench.Provider(folder / "provider.txt")
    workloads = bench.Workloads(url, provider)
    if group_commit is False:  # the same Runtime, its committers off
        workloads.rt.committer = None
        workloads.rt.async_committer = None
    out: dict[str, float] = {}
    try:
        for pair in PAIRS:
            for workload in pair:
                workloads.run(workload, max(5, workflows // 10), f"warm-{workload}")
                committer = workloads.rt.async_committer
                if committer is not None:
                    committer.transactions = committer.batches = 0
                started = time.perf_counter()
                workloads.run(workload, workflows, f"timed-{workload}")
                out[workload] = workflows * bench.STEPS / (time.perf_counter() - started)
                if workload.endswith("_async"):
                    out[f"{workload}/batches"] = (
                        committer.batches / max(1, committer.transactions) if committer else 1.0
                    )
    finally:
        workloads.close()
        provider.close()
        shutil.rmtree(folder, ignore_errors=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workflows", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if args.workflows < 1 or args.repeat < 1:
        parser.error("--workflows and --repeat must be at least 1")
    samples: dict[tuple[str, str], list[dict[str, float]]] = {}
    for _ in range(args.repeat):  # interleaved, so a noisy minute hurts every configuration alike
        for backend in ("sqlite", "postgresql"):
            for label, group in (("on (default)", None), ("off", False)):
                with ledger(backend) as url:
                    if url is not None:
                        samples.setdefault((backend, label), []).append(
                            measure(url, group, args.workflows)
                        )
    print(
        f"{args.workflows} workflows x {bench.STEPS} steps, {bench.THREADS} async runs at a time; "
        f"medians of {args.repeat}\n"
    )
    print("| backend | group commit | workflow | one at a time steps/s | 8 asyncio steps/s | ratio "
          "| batches per txn |")  # fmt: skip
    print("|---|---|---|---:|---:|---:|---:|")
    for (backend, label), found in samples.items():
        for one, many in PAIRS:

            def median(key: str, found: list[dict[str, float]] = found) -> float:
                return statistics.median(s[key] for s in found)

            kind = "pure" if one == "sequential" else "write"
            print(
                f"| {backend} | {label} | {kind} | {median(one):,.0f} | {median(many):,.0f} | "
                f"{median(many) / median(one):.2f} | {median(f'{many}/batches'):.1f} |"
            )


if __name__ == "__main__":
    main()
