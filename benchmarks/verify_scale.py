"""What ``effectflow audit verify`` costs at scale: reading run by run vs a chunk of runs at a time.

``audit.materials`` reads each run through the store's own readers (about nine statements a run);
``audit_read.materials_batched`` reads each table once per chunk of runs. Both give the same
``audit.Material`` per run (checked here once per backend, and by
tests/conformance/test_audit_read.py). For each backend this script fills a fresh ledger with
``--runs`` runs of ``--steps`` external-write steps through the public API (the fill is not what
is measured: SQLite fills with ``?synchronous=off``, PostgreSQL in a database of its own with
``synchronous_commit = off``, dropped after), then times, ``--repeats`` times in alternation:

* ``read``: building every run's material, by run (``audit.materials``) and batched
  (``materials_batched``, ``--chunk`` runs at a time);
* ``verify``: the same, each material then checked by ``audit.verify_run`` (unkeyed) — what
  ``verify`` does per run; its hashing is the same work either way.

Reported: the median seconds, runs/s, and how many times faster batched is (by-run time / batched
time). Run::

    .venv/bin/python benchmarks/verify_scale.py                     # 2000 runs × 5 steps
    .venv/bin/python benchmarks/verify_scale.py --runs 200 --repeats 1   # smoke run
    .venv/bin/python benchmarks/verify_scale.py --pg ''             # SQLite only
    .venv/bin/python benchmarks/verify_scale.py --json
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

import effectflow as ef
from effectflow.ledger import audit, audit_read
from effectflow.ledger.store import LedgerStore, open_store

PG_DEFAULT = os.environ.get("EFFECTFLOW_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def write(n: int) -> dict[str, int]:
    """The external-write step: trivially "writes" and returns the external id."""
    return {"id": n}


write_tool = ef.tool("verify_scale_write", effect="external_write", register=False)(write)


@ef.workflow("verify_scale_writes", register=False)
def writes(ctx: ef.Context, steps: int) -> None:
    for i in range(steps):
        ctx.call(f"s{i}", write_tool, n=i)


# -- ledgers ----------------------------------------------------------------------------------------


def fill(url: str, runs: int, steps: int) -> float:
    """``runs`` runs of ``steps`` external-write steps; the seconds it took."""
    start = time.perf_counter()
    with ef.Runtime(url) as rt:
        for r in range(runs):
            rt.start(writes, run_id=f"run-{r:07d}", steps=steps)
    return time.perf_counter() - start


@contextlib.contextmanager
def sqlite_ledger(folder: str | None) -> Iterator[tuple[str, str]]:
    """A file for the ledger: the URL the fill uses, and the one verification opens."""
    path = Path(tempfile.mkdtemp(prefix="effectflow-verify-", dir=folder))
    try:
        db = path / "ledger.db"
        yield f"sqlite:///{db}?synchronous=off", f"sqlite:///{db}"
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def pg_ledger(server: str) -> Iterator[tuple[str, str]]:
    """A database of its own on ``server`` (its commits not waiting for the disk), dropped after."""
    import psycopg

    name = f"effectflow_verify_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(server, autocommit=True, connect_timeout=3) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
        conn.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    url = urlunparse(urlparse(server)._replace(path=f"/{name}"))
    try:
        yield url, url
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def pg_unreachable(server: str) -> str | None:
    """Why PostgreSQL cannot be used, or None."""
    import psycopg

    try:
        with psycopg.connect(server, autocommit=True, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return f"PostgreSQL not reachable at {server}: {' '.join(str(exc).split())}"
    return None


# -- measuring --------------------------------------------------------------------------------------


def by_run(store: LedgerStore, check: bool, chunk: int) -> int:
    """Every run's material through ``audit.materials`` (and ``verify_run`` with ``check``)."""
    problems = 0
    for material in audit.materials(store).values():
        if check:
            problems += len(audit.verify_run(material, None, sealed_since=None, shards_since=None))
    return problems


def batched(store: LedgerStore, check: bool, chunk: int) -> int:
    """Every run's material through ``materials_batched`` (and ``verify_run`` with ``check``)."""
    problems = 0
    for _, material in audit_read.materials_batched(store, chunk=chunk):
        if check:
            problems += len(audit.verify_run(material, None, sealed_since=None, shards_since=None))
    return problems


READERS: dict[str, Callable[[LedgerStore, bool, int], int]] = {
    "by_run": by_run,
    "batched": batched,
}


def timed(fn: Callable[[], int]) -> float:
    gc.collect()
    start = time.perf_counter()
    problems = fn()
    seconds = time.perf_counter() - start
    if problems:
        raise SystemExit(f"the ledger does not verify: {problems} problems")
    return seconds


def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Times of both readers on one filled ledger, alternated, ``--repeats`` times."""
    store = open_store(url)
    try:
        found = dict(audit_read.materials_batched(store, chunk=args.chunk))
        if found != audit.materials(store) or len(found) != args.runs:
            raise SystemExit(f"{url}: the batched materials differ from audit.materials")
        samples: dict[str, list[float]] = {}
        for rep in range(args.repeats):
            for mode, check in (("read", False), ("verify", True)):
                names = list(READERS) if rep % 2 == 0 else list(reversed(READERS))
                for name in names:
                    seconds = timed(lambda n=name, c=check: READERS[n](store, c, args.chunk))
                    samples.setdefault(f"{mode}/{name}", []).append(seconds)
    finally:
        store.close()
    result: dict[str, Any] = {"samples": samples}
    for mode in ("read", "verify"):
        for name in READERS:
            median = statistics.median(samples[f"{mode}/{name}"])
            result[f"{mode}/{name}"] = {"seconds": median, "runs_per_s": args.runs / median}
        result[f"{mode}/speedup"] = (
            result[f"{mode}/by_run"]["seconds"] / result[f"{mode}/batched"]["seconds"]
        )
    return result


def run_backend(name: str, ledger: Any, args: argparse.Namespace) -> dict[str, Any]:
    with ledger as (fill_url, url):
        print(f"{name}: filling {args.runs} runs × {args.steps} steps ...", file=sys.stderr)
        fill_s = fill(fill_url, args.runs, args.steps)
        print(f"{name}: filled in {fill_s:.1f} s; measuring ...", file=sys.stderr)
        return {"backend": name, "fill_s": fill_s, **measure(url, args)}


def table(results: Sequence[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [
        f"{args.runs} runs × {args.steps} external-write steps, chunk {args.chunk}, "
        f"median of {args.repeats}",
        "",
        "| backend | what | by run (s) | by run (runs/s) | batched (s) | batched (runs/s) | faster |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        for mode, label in (("read", "read materials"), ("verify", "read + verify_run")):
            one, many = r[f"{mode}/by_run"], r[f"{mode}/batched"]
            lines.append(
                f"| {r['backend']} | {label} | {one['seconds']:.3f} | {one['runs_per_s']:,.0f} "
                f"| {many['seconds']:.3f} | {many['runs_per_s']:,.0f} "
                f"| {r[f'{mode}/speedup']:.1f}× |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=5, help="external-write steps per run")
    parser.add_argument("--chunk", type=int, default=500, help="runs per batched read")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pg", default=PG_DEFAULT, help="PostgreSQL server URL ('' to skip)")
    parser.add_argument("--dir", default=None, help="where the SQLite file goes")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results = [run_backend("sqlite", sqlite_ledger(args.dir), args)]
    notes = []
    if args.pg:
        why = pg_unreachable(args.pg)
        if why is None:
            results.append(run_backend("postgres", pg_ledger(args.pg), args))
        else:
            notes.append(why)
    if args.json:
        doc = {
            "python": platform.python_version(),
            "machine": platform.machine(),
            "args": vars(args),
            "results": results,
            "notes": notes,
        }
        print(json.dumps(doc, indent=2))
        return 0
    print(table(results, args))
    for note in notes:
        print(f"\n{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
