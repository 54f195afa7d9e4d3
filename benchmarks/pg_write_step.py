"""A sequential write step on PostgreSQL: effectflow's (this tree, or commits) and DBOS's, interleaved.

Issue 18's PostgreSQL part measures the write step on the server the tests use
(``EFFECTFLOW_BENCH_PG``, default ``postgresql://postgres@127.0.0.1:5432/postgres``, its maintenance
database: each sample creates a database of its own and drops it after). Each sample is a fresh
process running one system's write workflow (10 steps that append a line to a file, the peer
comparison's workload, ``effectflow.bench.Workloads`` / ``benchmarks/compare/peer_dbos.py``'s
shape) for ``--runs`` workflows after a warm-up, and reports steps/s and the process's CPU time a
step (user + system, ``time.process_time``: the client's CPU), and the server's CPU a step (the
CPU time ``/proc/<pid>/stat`` gives for the server backends of the sample's database, when the
server runs on this machine; none otherwise). Then, for
effectflow, a short counted pass (its own warm database) reports a step's statements, pipeline
syncs (the round trips that wait for the server: psycopg's ``Pipeline._enqueue_sync`` plus the
statements run outside a pipeline, a one-trip batch sent through libpq one of each) and psycopg
``wait`` calls.

Samples alternate (ABBA), so drift on a shared machine hits every system alike; printed are the
medians, and each system's paired ratio against the first. Run::

    .venv/bin/python benchmarks/pg_write_step.py --repeats 5                  # this tree and DBOS
    .venv/bin/python benchmarks/pg_write_step.py --commits 62875d3 HEAD --repeats 7 --no-dbos
    .venv/bin/python benchmarks/pg_write_step.py --profile                    # cProfile, this tree
    .venv/bin/python benchmarks/pg_write_step.py --floor    # and a raw commit each repetition
    .venv/bin/python benchmarks/pg_write_step.py --commits A B --no-dbos --workload sequential
    .venv/bin/python benchmarks/pg_write_step.py --warm 300  # every shard sealed before timing

DBOS runs in the project's own venv (``dbos`` is a dev dependency there) or in
``benchmarks/compare/.venvs/dbos`` when that exists, on ``postgresql+psycopg://`` to the same server.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import json
import os
import pstats
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

REPO = Path(__file__).resolve().parents[1]
SERVER = os.environ.get("EFFECTFLOW_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
STEPS = 10


def _url_of(database: str) -> str:
    return urlunparse(urlparse(SERVER)._replace(path=f"/{database}"))


@contextlib.contextmanager
def fresh_database(prefix: str) -> Iterator[str]:
    """A new database on the server, dropped after (its sessions ended)."""
    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(SERVER, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _url_of(name)
    finally:
        with psycopg.connect(SERVER, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _timed(fn: Callable[[], object]) -> tuple[float, float]:
    """Wall and CPU seconds of ``fn()``."""
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


class Counts:
    """psycopg's calls, counted by patching its Python layer (for the counted pass only)."""

    def __init__(self) -> None:
        self.statements = 0
        self.syncs = 0
        self.waits = 0

    @contextlib.contextmanager
    def patched(self) -> Iterator[None]:
        import psycopg
        from psycopg import _pipeline_base

        base = _pipeline_base.BasePipeline
        saved = (
            base._enqueue_sync,
            psycopg.Connection.wait,
            psycopg.Cursor.execute,
            psycopg.Cursor.executemany,
        )
        counts = self

        def enqueue_sync(pipeline: Any) -> None:
            counts.syncs += 1
            saved[0](pipeline)

        def wait(conn: Any, *args: Any, **kwargs: Any) -> Any:
            counts.waits += 1
            return saved[1](conn, *args, **kwargs)

        def execute(cur: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
            counts.statements += 1
            if cur._conn._pipeline is None:
                counts.syncs += 1  # a statement outside a pipeline waits for its own answer
            return saved[2](cur, query, params, **kwargs)

        def executemany(cur: Any, query: Any, params_seq: Any, **kwargs: Any) -> Any:
            rows = list(params_seq)
            counts.statements += len(rows)
            return saved[3](cur, query, rows, **kwargs)

        # A one-trip batch sent through libpq, not a cursor (trees that have it).
        from effectflow.ledger import postgres

        call_apply = getattr(postgres, "call_apply", None)

        def counted_apply(conn: Any, params: Any) -> Any:
            counts.statements += 1
            counts.syncs += 1
            assert call_apply is not None
            return call_apply(conn, params)

        if call_apply is not None:
            postgres.call_apply = counted_apply
        base._enqueue_sync = enqueue_sync  # type: ignore[method-assign]
        psycopg.Connection.wait = wait  # type: ignore[method-assign]
        psycopg.Cursor.execute = execute  # type: ignore[method-assign,assignment]
        psycopg.Cursor.executemany = executemany  # type: ignore[method-assign]
        try:
            yield
        finally:
            if call_apply is not None:
                postgres.call_apply = call_apply
            (
                base._enqueue_sync,  # type: ignore[method-assign]
                psycopg.Connection.wait,  # type: ignore[method-assign]
                psycopg.Cursor.execute,  # type: ignore[method-assign]
                psycopg.Cursor.executemany,  # type: ignore[method-assign]
            ) = saved


def _backends_cpu(url: str) -> dict[int, int]:
    """CPU clock ticks (user + system) of each server backend of ``url``'s database but the one
    that asks, from ``/proc`` (empty when the server is not on this machine)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        pids = [
            row[0]
            for row in conn.execute(
                "SELECT pid FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        ]
    ticks: dict[int, int] = {}
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        ticks[pid] = int(fields[11]) + int(fields[12])  # utime, stime
    return ticks


def _server_us(before: dict[int, int], after: dict[int, int], steps: int) -> float | None:
    """The backends' CPU between two ``_backends_cpu`` readings, in µs a step."""
    if not after:
        return None
    ticks = sum(t - before.get(pid, 0) for pid, t in after.items())
    return ticks / os.sysconf("SC_CLK_TCK") / steps * 1e6


def _warmup(runs: int, warm: int | None) -> int:
    """Workflows run before the timed ones: ``warm``, or a tenth of ``runs`` (at least 5)."""
    return max(5, runs // 10) if warm is None else warm


def _effectflow(
    url: str,
    folder: Path,
    runs: int,
    profile: bool,
    workload: str = "write",
    warm: int | None = None,
) -> dict[str, Any]:
    from effectflow import bench

    out: dict[str, Any] = {}
    provider = bench.Provider(folder / "provider.txt")
    workloads = bench.Workloads(url, provider)
    try:
        workloads.run(workload, _warmup(runs, warm), "warm")
        if profile:
            prof = cProfile.Profile(time.process_time)  # CPU, not wall time
            prof.enable()
        server = _backends_cpu(url)
        trips = dict(getattr(workloads.rt.store, "trips", {}))
        wall, cpu = _timed(lambda: workloads.run(workload, runs, "timed"))
        server_us = _server_us(server, _backends_cpu(url), runs * STEPS)
        after = getattr(workloads.rt.store, "trips", {})
        if profile:
            prof.disable()
            stats = pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative")
            stats.print_stats(45)
            stats.sort_stats("tottime").print_stats(30)
        out.update(steps_s=runs * STEPS / wall, cpu_us=cpu / (runs * STEPS) * 1e6)
        if server_us is not None:
            out["server_us"] = server_us
        # How the store's batches went (PostgreSQL's one-trip counts), a step.
        out.update({k: (v - trips.get(k, 0)) / (runs * STEPS) for k, v in after.items()})
        counts = Counts()
        counted = 20
        with counts.patched():
            workloads.run(workload, counted, "counted")
        steps = counted * STEPS
        out.update(
            statements=counts.statements / steps,
            syncs=counts.syncs / steps,
            waits=counts.waits / steps,
        )
    finally:
        workloads.close()
        provider.close()
    return out


def _dbos(url: str, folder: Path, runs: int, warm: int | None = None) -> dict[str, Any]:
    sys.path.insert(0, str(REPO / "benchmarks" / "compare"))
    import _common
    from dbos import DBOS, SetWorkflowID

    provider = _common.Provider(folder / "provider.txt")

    @DBOS.step()
    def append_line(key: str, payload: str) -> str:
        provider.append(key, payload)
        return key

    @DBOS.workflow()
    def write(run: str) -> None:
        for i in range(STEPS):
            append_line(f"{run}-w{i}", "x")

    system = url.replace("postgresql://", "postgresql+psycopg://", 1)
    DBOS(config={"name": "effectflow-pg-compare", "system_database_url": system})
    DBOS.launch()

    def drive(count: int, prefix: str) -> None:
        for r in range(count):
            with SetWorkflowID(f"{prefix}-{r}"):
                write(f"{prefix}-{r}")

    try:
        drive(_warmup(runs, warm), "warm")
        server = _backends_cpu(url)
        wall, cpu = _timed(lambda: drive(runs, "timed"))
        server_us = _server_us(server, _backends_cpu(url), runs * STEPS)
    finally:
        DBOS.destroy()
    found = {"steps_s": runs * STEPS / wall, "cpu_us": cpu / (runs * STEPS) * 1e6}
    if server_us is not None:
        found["server_us"] = server_us
    return found


def _floor(url: str, commits: int = 500) -> dict[str, Any]:
    """A raw commit on the server: a one-row INSERT in autocommit, ``commits`` times (after 50),
    as the write step's floor: a step commits twice (its intent, its outcome)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE floor (n integer)")
        for _ in range(50):
            conn.execute("INSERT INTO floor VALUES (1)")
        server = _backends_cpu(url)
        wall, cpu = _timed(
            lambda: [conn.execute("INSERT INTO floor VALUES (1)") for _ in range(commits)]
        )
        server_us = _server_us(server, _backends_cpu(url), commits // 2)
    found = {"steps_s": commits / wall / 2, "cpu_us": cpu / commits * 2 * 1e6}
    if server_us is not None:
        found["server_us"] = server_us
    return found


def child(
    system: str, runs: int, profile: bool, workload: str = "write", warm: int | None = None
) -> None:
    """One sample in this process: a fresh database, one system, one JSON line on stdout."""
    with (
        tempfile.TemporaryDirectory(prefix="pg-write-") as folder,
        fresh_database(f"pgbench_{system}") as url,
    ):
        if system == "dbos":
            found = _dbos(url, Path(folder), runs, warm)
        elif system == "floor":
            found = _floor(url)
        else:
            found = _effectflow(url, Path(folder), runs, profile, workload, warm)
    found["maxrss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps(found), flush=True)


def _dbos_python() -> str:
    venv = REPO / "benchmarks" / "compare" / ".venvs" / "dbos" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def _sample(
    name: str, tree: Path | None, runs: int, workload: str, warm: int | None = None
) -> dict[str, Any]:
    env = dict(os.environ)
    if name == "dbos":
        python, system = _dbos_python(), "dbos"
    elif name == "floor":
        python, system = sys.executable, "floor"
    else:
        python, system = sys.executable, "effectflow"
        env["PYTHONPATH"] = str((tree or REPO) / "src")
    command = [python, __file__, "--child", system, "--runs", str(runs), "--workload", workload]
    if warm is not None:
        command += ["--warm", str(warm)]
    done = subprocess.run(
        command,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if done.returncode:
        raise RuntimeError(f"{name}: {done.stderr[-3000:]}")
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    found["load1"] = os.getloadavg()[0]
    return found


def _export(commit: str, into: Path) -> Path:
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=("effectflow", "dbos", "floor"), help=argparse.SUPPRESS)
    parser.add_argument(
        "--workload",
        choices=("write", "sequential"),
        default="write",
        help="effectflow's workload (DBOS always runs write)",
    )
    parser.add_argument(
        "--floor", action="store_true", help="a raw commit a sample (steps/s: two a step)"
    )
    parser.add_argument("--runs", type=int, default=200, help="workflows a sample times")
    parser.add_argument(
        "--warm",
        type=int,
        default=None,
        help="workflows run before the timed ones (default: a tenth of --runs, at least 5); "
        "~300 seals every audit shard of the fresh ledger first, so no timed batch is a "
        "shard's first seal (applied statement by statement)",
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--commits", nargs="+", default=[], help="effectflow commits to compare")
    parser.add_argument("--no-dbos", action="store_true", help="leave DBOS out")
    parser.add_argument("--profile", action="store_true", help="cProfile this tree, in process")
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.runs, profile=False, workload=args.workload, warm=args.warm)
        return 0
    if args.profile:
        with (
            tempfile.TemporaryDirectory(prefix="pg-write-") as folder,
            fresh_database("pgbench_profile") as url,
        ):
            found = _effectflow(url, Path(folder), args.runs, True, args.workload, args.warm)
            print(json.dumps(found))
        return 0
    with tempfile.TemporaryDirectory(prefix="effectflow-trees-") as folder:
        systems: dict[str, Path | None] = {}
        for i, commit in enumerate(args.commits):
            systems[commit] = _export(commit, Path(folder) / str(i))
        if not args.commits:
            systems["effectflow"] = None
        if not args.no_dbos:
            systems["dbos"] = None
        if args.floor:
            systems["floor"] = None
        samples: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
        for rep in range(args.repeats):
            order = list(systems) if rep % 2 == 0 else list(reversed(systems))
            for name in order:
                found = _sample(name, systems[name], args.runs, args.workload, args.warm)
                samples[name].append(found)
                print(f"[{rep + 1}/{args.repeats}] {name}: {found}", file=sys.stderr)
    first = next(iter(systems))
    print(
        f"| system | steps/s | CPU µs/step | server CPU µs/step | statements/step | syncs/step "
        f"| waits/step "
        f"| max RSS KiB | steps/s / {first} (paired) | CPU / {first} (paired) | load1 |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, found in samples.items():
        ratio = [s["steps_s"] / f["steps_s"] for s, f in zip(found, samples[first], strict=True)]
        cpu = [s["cpu_us"] / f["cpu_us"] for s, f in zip(found, samples[first], strict=True)]
        loads = [s["load1"] for s in found]

        def med(key: str, found: list[dict[str, Any]] = found) -> str:
            values = [s[key] for s in found if key in s]
            return f"{statistics.median(values):.1f}" if values else "—"

        print(
            f"| {name} | {med('steps_s')} | {med('cpu_us')} | {med('server_us')} "
            f"| {med('statements')} "
            f"| {med('syncs')} | {med('waits')} | {med('maxrss_kb')} "
            f"| {statistics.median(ratio):.3f} "
            f"| {statistics.median(cpu):.3f} | {min(loads):.2f}–{max(loads):.2f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
