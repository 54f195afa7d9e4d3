"""Per-step cost against ledger size: does a step cost the same with 1k, 10k and 100k runs behind it?

For each backend (SQLite; PostgreSQL when reachable) and each size, a fresh ledger is pre-filled with
that many *completed* runs, then the time per step of new runs is measured on it:

* ``external_write``: a workflow of 10 external-write steps (intent + outcome commits per step);
* ``pure``: a workflow of 10 pure steps (their records ride with the run's durable writes).

Pre-fill, quickly and faithfully: a template of 20 real runs (10 of each workflow) is made with
``rt.start`` through the runtime, so every table holds exactly the rows the runtime writes; then
every table's template rows are copied ``size / 20 - 1`` times in one ``INSERT ... SELECT`` per table,
each copy's ids (``run_id``, ``effect_id``, ``attempt_id``, ``tool_call_id``, ``logical_operation_id``,
``idempotency_key``) suffixed so that they stay unique. The copies' audit hashes do not verify (the
hash covers the run id); nothing on the measured path reads them. ``ANALYZE`` follows, as a live
database's auto-analyze would.

Measurement: ``--runs`` runs (default 30, so 300 steps) per sample, after a warm-up, ``--repeats``
samples (default 5) interleaved across sizes and workloads; the median µs/step (wall time of
``rt.start`` / steps, the step's function included, which is nanoseconds) and its ratio to the 1k
figure are reported. SQLite runs with ``synchronous=NORMAL`` by default (``--synchronous full`` for
the default durability): the question is how the ledger's *reads and index maintenance* scale, and
fsync jitter on a virtual disk would drown a 20% signal. Run::

    .venv/bin/python benchmarks/flat_cost.py             # Markdown table (BENCHMARKS.md)
    .venv/bin/python benchmarks/flat_cost.py --quick     # 1k and 10k, 2 samples
    .venv/bin/python benchmarks/flat_cost.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

import effectflow as ef

PG = os.environ.get("EFFECTFLOW_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")

#: Columns holding ids that must stay unique in the copies.
ID_COLUMNS = (
    "run_id",
    "effect_id",
    "attempt_id",
    "tool_call_id",
    "logical_operation_id",
    "idempotency_key",
)
#: Ledger tables the runtime writes while running these workflows.
TABLES = ("runs", "steps", "attempts", "effects", "operations", "audit")
#: The suffix expression of the k-th copy's ids.
SQLITE_SUFFIX = "'-c' || k.i"
PG_SUFFIX = "('-c' || k.i)"
TEMPLATE_RUNS = 20
STEPS = 10


def const() -> int:
    """The pure step."""
    return 1


def write(n: int) -> dict[str, int]:
    """The external-write step: "writes" and returns the external id."""
    return {"id": n}


pure_tool = ef.tool("flat_pure_const", register=False)(const)
write_tool = ef.tool("flat_external_write", effect="external_write", register=False)(write)


@ef.workflow("flat_pure", register=False)
def pure_workflow(ctx: ef.Context, steps: int) -> None:
    for i in range(steps):
        ctx.call(f"s{i}", pure_tool)


@ef.workflow("flat_external_write", register=False)
def write_workflow(ctx: ef.Context, steps: int) -> None:
    for i in range(steps):
        ctx.call(f"s{i}", write_tool, n=i)


WORKLOADS: dict[str, ef.Workflow[..., Any]] = {
    "external_write": write_workflow,
    "pure": pure_workflow,
}

# -- filling ----------------------------------------------------------------------------------------


def _columns_sqlite(conn: sqlite3.Connection, table: str) -> list[str]:
    cols = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
    # audit.seq is the chain's order, numbered by the database (AUTOINCREMENT)
    return [c for c in cols if not (table == "audit" and c == "seq")]


def _copy_select(columns: list[str], suffix: str) -> str:
    return ", ".join(f"{c} || {suffix}" if c in ID_COLUMNS else c for c in columns)


def _template(url: str) -> None:
    rt = ef.Runtime(url)
    try:
        for i in range(TEMPLATE_RUNS // 2):
            rt.start(write_workflow, run_id=f"tpl-w{i}", steps=STEPS)
            rt.start(pure_workflow, run_id=f"tpl-p{i}", steps=STEPS)
    finally:
        rt.store.close()


def fill_sqlite(path: Path, size: int) -> None:
    """A ledger of ``size`` completed runs (see the module docstring)."""
    _template(f"sqlite:///{path}?synchronous=off")
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute("BEGIN")
        copies = size // TEMPLATE_RUNS - 1
        for table in TABLES:
            cols = _columns_sqlite(conn, table)
            conn.execute(
                f"WITH RECURSIVE k(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM k WHERE i < ?) "
                f"INSERT INTO {table} ({', '.join(cols)}) "
                f"SELECT {_copy_select(cols, SQLITE_SUFFIX)} FROM {table} CROSS JOIN k "
                "ORDER BY k.i",
                (copies,),
            )
        conn.execute("COMMIT")
        conn.execute("ANALYZE")
        (count,) = conn.execute("SELECT count(*) FROM runs").fetchone()
        assert count == size, (count, size)
    finally:
        conn.close()


def fill_postgres(url: str, size: int) -> None:
    """The same on PostgreSQL (identity columns are left to the database)."""
    import psycopg

    _template(url)
    with psycopg.connect(url, autocommit=True) as conn:
        copies = size // TEMPLATE_RUNS - 1
        with conn.transaction():
            for table in TABLES:
                cols = [
                    r[0]
                    for r in conn.execute(
                        "SELECT column_name FROM information_schema.columns "
                        "WHERE table_name = %s AND table_schema = current_schema() "
                        "AND is_identity = 'NO' ORDER BY ordinal_position",
                        (table,),
                    )
                ]
                conn.execute(
                    f"INSERT INTO {table} ({', '.join(cols)}) "
                    f"SELECT {_copy_select(cols, PG_SUFFIX)} FROM {table} "
                    "CROSS JOIN generate_series(1, %s) AS k (i) ORDER BY k.i",
                    (copies,),
                )
        conn.execute("VACUUM ANALYZE")
        row = conn.execute("SELECT count(*) FROM runs").fetchone()
        assert row is not None, size
        assert row[0] == size, (row, size)


# -- measuring --------------------------------------------------------------------------------------


def sample(rt: ef.Runtime, workload: str, runs: int) -> float:
    """µs per step of ``runs`` fresh runs of ``workload``."""
    workflow = WORKLOADS[workload]
    ids = [f"m-{workload}-{uuid.uuid4().hex[:12]}" for _ in range(runs)]
    start = time.perf_counter()
    for run_id in ids:
        rt.start(workflow, run_id=run_id, steps=STEPS)
    return (time.perf_counter() - start) / (runs * STEPS) * 1e6


@contextmanager
def postgres_schemas(sizes: list[int]) -> Iterator[dict[int, str] | str]:
    """One fresh schema per size in a database made for this run (or the reason there is none)."""
    import psycopg

    try:
        with psycopg.connect(PG, autocommit=True, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        yield f"PostgreSQL not reachable at {PG}: {' '.join(str(exc).split())}"
        return
    name = f"effectflow_flat_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    base = urlparse(PG)._replace(path=f"/{name}")
    urls = {}
    try:
        with psycopg.connect(urlunparse(base), autocommit=True) as conn:
            for size in sizes:
                conn.execute(f"CREATE SCHEMA s{size}")
                urls[size] = urlunparse(base._replace(query=f"options=-csearch_path%3Ds{size}"))
        yield urls
    finally:
        with psycopg.connect(PG, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def measure(
    backend: str,
    urls: dict[int, str],
    fill: Callable[[int], None],
    args: argparse.Namespace,
) -> list[dict[str, Any]]:
    fill_s = {}
    for size in args.sizes:
        start = time.perf_counter()
        fill(size)
        fill_s[size] = time.perf_counter() - start
        print(f"# {backend}: filled {size} runs in {fill_s[size]:.1f} s", file=sys.stderr)
    runtimes = {size: ef.Runtime(urls[size]) for size in args.sizes}
    samples: dict[tuple[int, str], list[float]] = {}
    try:
        for rt in runtimes.values():  # warm-up: caches, prepared statements, the page cache
            for workload in WORKLOADS:
                sample(rt, workload, max(3, args.runs // 5))
        for _ in range(args.repeats):
            for size, rt in runtimes.items():
                for workload in WORKLOADS:
                    samples.setdefault((size, workload), []).append(sample(rt, workload, args.runs))
    finally:
        for rt in runtimes.values():
            rt.store.close()
    rows = []
    for workload in WORKLOADS:
        base = statistics.median(samples[(args.sizes[0], workload)])
        for size in args.sizes:
            values = samples[(size, workload)]
            median = statistics.median(values)
            rows.append(
                {
                    "backend": backend,
                    "workload": workload,
                    "size": size,
                    "us_per_step": median,
                    "min": min(values),
                    "max": max(values),
                    "ratio": median / base,
                    "min_ratio": min(values) / min(samples[(args.sizes[0], workload)]),
                    "fill_s": fill_s[size],
                    "samples": values,
                }
            )
    return rows


def measure_sqlite(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The SQLite rows, on ledger files in a temporary directory removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="effectflow-flat-", dir=args.dir))
    try:
        paths = {size: folder / f"l{size}.db" for size in args.sizes}
        urls = {s: f"sqlite:///{p}?synchronous={args.synchronous}" for s, p in paths.items()}
        return measure(
            f"sqlite ({args.synchronous.upper()})",
            urls,
            lambda size: fill_sqlite(paths[size], size),
            args,
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--runs", type=int, default=30, help="runs per sample (10 steps each)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--synchronous", default="normal", choices=["off", "normal", "full"])
    parser.add_argument(
        "--backends", nargs="+", default=["sqlite", "postgres"], choices=["sqlite", "postgres"]
    )
    parser.add_argument("--dir", default=None, help="where the SQLite files go")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="1k and 10k, 2 samples of 10 runs")
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.runs, args.repeats = [1_000, 10_000], 10, 2
    rows: list[dict[str, Any]] = []
    notes = []
    if "sqlite" in args.backends:
        rows += measure_sqlite(args)
    if "postgres" in args.backends:
        with postgres_schemas(args.sizes) as pg:
            if isinstance(pg, str):
                notes.append(pg)
            else:
                rows += measure("postgres", pg, lambda size: fill_postgres(pg[size], size), args)
    if args.json:
        print(json.dumps({"rows": rows, "notes": notes}, indent=2))
        return
    print(
        f"{args.repeats} samples of {args.runs} runs x {STEPS} steps; Python "
        f"{platform.python_version()}, SQLite {sqlite3.sqlite_version}, {os.cpu_count()} CPUs\n"
    )
    print(
        "| backend | step | completed runs in ledger | µs/step median (min – max) "
        "| median vs 1k | min vs 1k |"
    )
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['backend']} | {r['workload']} | {r['size']:,} | "
            f"{r['us_per_step']:.0f} ({r['min']:.0f} – {r['max']:.0f}) | {r['ratio']:.2f} "
            f"| {r['min_ratio']:.2f} |"
        )
    for note in notes:
        print(f"\n{note}")


if __name__ == "__main__":
    main()
