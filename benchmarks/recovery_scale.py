"""Recovery at scale: 10,000 interrupted runs, recovered and finished in batches, in flat memory.

How the interrupted runs are made (faithful, and fast enough): a *child process* starts ``--runs``
runs of a three-step workflow (pure ``prepare``, idempotent-write ``charge`` with a key, pure
``finish``); a ``FaultPlan`` with ``FaultAction.RAISE`` at ``FaultPoint.AFTER_INTENT`` of ``charge``
interrupts every run right after the charge's intent commits (the in-process stand-in for a crash;
each run gets a fresh plan). Then the child exits, so every run is left ``running``, its step
``intent_recorded``, leased to an owner (``host:pid``) that is dead: the state a crashed worker
leaves. The fill uses ``?synchronous=off`` on SQLite (it is not what is measured).

Recovery, in this (fresh) process: ``rt.recover(limit=--batch)`` in a loop until it finds nothing;
each run is claimed, its charge retried with the original key (safe: the provider honours keys), and
run to the end (the charge's retry backoff is set to 0: the default, a second or so, would
measure ``time.sleep`` rather than recovery). Recovery runs in a child process of its own, so its
memory is that of a process that only recovers. Reported: the total time and runs/s, RSS
(``VmRSS``) before recovery, after the first 1,000 and after all runs recovered, and the peak
(``VmHWM``). The runtime reads the ledger a
batch at a time, so RSS after 10,000 should equal RSS after 1,000. At the end the ledger is checked:
every run succeeded and every charge was made exactly once per key. Run::

    .venv/bin/python benchmarks/recovery_scale.py              # SQLite, and PostgreSQL if reachable
    .venv/bin/python benchmarks/recovery_scale.py --runs 1000  # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

import effectflow as ef
from effectflow import testing

PG = os.environ.get("EFFECTFLOW_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def prepare(n: int) -> int:
    """The pure first step."""
    return n


@ef.tool(
    "recovery_scale_charge",
    effect="idempotent_write",
    idempotency=ef.Idempotency(supported=True),
    effect_id="id",
    # The retry after a crash waits a backoff first; the default (seconds) would measure sleeping.
    retry=ef.RetryPolicy(initial_backoff=0.0, max_backoff=0.0),
)
def charge(n: int, *, idempotency_key: str) -> dict[str, Any]:
    """A provider that honours keys: a retry with the same key is the same charge."""
    return {"id": f"ch_{n}", "key": idempotency_key}


prepare_tool = ef.tool("recovery_scale_prepare")(prepare)


@ef.workflow("recovery_scale")
def workflow(ctx: ef.Context, n: int) -> None:
    ctx.call("prepare", prepare_tool, n=n)
    ctx.call("charge", charge, n=n)
    ctx.call("finish", prepare_tool, n=n)


def fill(url: str, runs: int) -> None:
    """Start ``runs`` runs, each interrupted after its charge's intent (run in a child process)."""
    rt = ef.Runtime(url)
    fault = testing.Fault(
        testing.FaultPoint.AFTER_INTENT, "charge", action=testing.FaultAction.RAISE
    )
    for n in range(runs):
        rt.faults = testing.FaultPlan([fault])
        try:
            rt.start(workflow, run_id=f"r{n:06d}", n=n)
        except testing.InjectedCrash:
            pass
        else:
            raise AssertionError(f"run {n} was not interrupted")
    rt.store.close()


def rss_kib(field: str = "VmRSS") -> int:
    """This process's resident set (or its peak, ``VmHWM``), in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def recover(url: str, runs: int, batch: int) -> dict[str, Any]:
    """Recover every run in batches; time and memory."""
    rt = ef.Runtime(url)
    before = rss_kib()
    done = 0
    rss_at_1k = None
    start = time.perf_counter()
    while True:
        finished = rt.recover(limit=batch)
        if not finished:
            break
        done += len(finished)
        if rss_at_1k is None and done >= min(1000, runs):
            rss_at_1k = rss_kib()
        del finished
    elapsed = time.perf_counter() - start
    after = rss_kib()
    rt.store.close()
    return {
        "recovered": done,
        "seconds": elapsed,
        "runs_per_s": done / elapsed,
        "rss_before_mib": before / 1024,
        "rss_after_1k_mib": (rss_at_1k or after) / 1024,
        "rss_after_all_mib": after / 1024,
        "peak_rss_mib": max(after, rss_kib("VmHWM")) / 1024,
    }


def check(statuses: list[tuple[Any, ...]], effects: tuple[Any, ...], runs: int) -> str:
    """The ledger after recovery: every run succeeded, one charge per run, each under its own key."""
    counts = dict(statuses)
    if counts.get("succeeded") != runs or sum(counts.values()) != runs:
        raise AssertionError(f"after recovery, runs by status: {counts}")
    if tuple(effects) != (runs, runs):
        raise AssertionError(f"after recovery, (effects, distinct keys) = {effects}, not {runs}")
    return f"all {runs} runs succeeded, {runs} charges under {runs} keys"


def run_sqlite(args: argparse.Namespace) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="effectflow-recovery-", dir=args.dir))
    try:
        path = folder / "ledger.db"
        return run_backend("sqlite (FULL)", f"sqlite:///{path}", args, str(path))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run_backend(
    name: str, url: str, args: argparse.Namespace, sqlite_path: str | None
) -> dict[str, Any]:
    fill_url = f"{url}?synchronous=off" if sqlite_path else url
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, __file__, "--fill", fill_url, "--runs", str(args.runs)], check=True
    )
    fill_s = time.perf_counter() - start
    print(f"# {name}: {args.runs} interrupted runs made in {fill_s:.1f} s", file=sys.stderr)
    # Recovery in a child too, so its RSS is that of a process that did only recovery.
    command = [sys.executable, __file__, "--recover", url, "--runs", str(args.runs)]
    out = subprocess.run(
        [*command, "--batch", str(args.batch)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    result: dict[str, Any] = json.loads(out)
    by_status = "SELECT status, count(*) FROM runs GROUP BY status"
    charges = "SELECT count(*), count(DISTINCT idempotency_key) FROM effects"
    if sqlite_path:
        conn = sqlite3.connect(sqlite_path)
        try:
            rows, effects = conn.execute(by_status).fetchall(), conn.execute(charges).fetchone()
        finally:
            conn.close()
    else:
        import psycopg

        with psycopg.connect(url) as pg:
            rows, effects = pg.execute(by_status).fetchall(), pg.execute(charges).fetchone()
    result.update(backend=name, fill_s=fill_s, check=check(rows, effects, args.runs))
    return result


def run_postgres(args: argparse.Namespace) -> dict[str, Any] | str:
    import psycopg

    try:
        with psycopg.connect(PG, autocommit=True, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return f"PostgreSQL not reachable at {PG}: {' '.join(str(exc).split())}"
    name = f"effectflow_recovery_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        return run_backend(
            "postgres", urlunparse(urlparse(PG)._replace(path=f"/{name}")), args, None
        )
    finally:
        with psycopg.connect(PG, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=100, help="rt.recover(limit=...)")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--dir", default=None, help="where the SQLite file goes")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--fill", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--recover", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fill:
        fill(args.fill, args.runs)
        return
    if args.recover:
        print(json.dumps(recover(args.recover, args.runs, args.batch)))
        return
    results: list[dict[str, Any]] = [run_sqlite(args)]
    notes = []
    if not args.no_postgres:
        pg = run_postgres(args)
        if isinstance(pg, str):
            notes.append(pg)
        else:
            results.append(pg)
    if args.json:
        print(json.dumps({"results": results, "notes": notes}, indent=2))
        return
    print(f"{args.runs} interrupted runs, rt.recover(limit={args.batch}) until none is left\n")
    print(
        "| backend | make (s) | recover all (s) | runs/s | RSS before (MiB) "
        "| RSS after 1k (MiB) | RSS after all (MiB) | peak RSS (MiB) | check |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in results:
        print(
            f"| {r['backend']} | {r['fill_s']:.1f} | {r['seconds']:.1f} | {r['runs_per_s']:.0f} "
            f"| {r['rss_before_mib']:.1f} | {r['rss_after_1k_mib']:.1f} "
            f"| {r['rss_after_all_mib']:.1f} | {r['peak_rss_mib']:.1f} | {r['check']} |"
        )
    for note in notes:
        print(f"\n{note}")


if __name__ == "__main__":
    main()
