"""What tamper evidence costs: the ledger's write path before and after seals, in one session.

Commit ``910f32a`` (issue 14) made every ledger batch also digest the rows it writes, append one row
to ``seals`` and update the run's ``seal_head`` / ``seal_count``; with ``EFFECTFLOW_AUDIT_KEY`` every
event and seal hash is an HMAC-SHA256. This script measures three variants on the same machine,
interleaved, so a burst of load elsewhere spoils one sample of each rather than all of one:

* ``before``: ``--before`` (default ``9e51b35``: the write path of ``910f32a``'s parent, no seals);
* ``after``: ``--after`` (default ``910f32a``), ``EFFECTFLOW_AUDIT_KEY`` unset;
* ``after_keyed``: the same export with ``EFFECTFLOW_AUDIT_KEY`` set to a 32-character key.

Each commit is exported clean (``git archive <commit> | tar -x -C <work>/<name>``) and run with
``PYTHONPATH=<work>/<name>/src``; a one-liner checks that the export's ``effectflow`` is the one
imported and, for ``after_keyed``, that its seals are HMACs. Then:

1. **SQLite**, ``--rounds`` times: every variant runs its export's own
   ``benchmarks/core_overhead.py --json --repeats R --runs N`` (all eight step configurations,
   FULL and NORMAL), the order rotated each round. Samples are pooled per variant (median, min –
   max) and the ratio to ``before`` is taken per round, from that round's medians.
2. **PostgreSQL** (``--pg``, default ``postgresql://postgres@127.0.0.1:5432/postgres``; skipped
   with the reason when unreachable, or with ``--pg ''``), ``--rounds`` times: each variant, in its
   own process, makes a fresh database and times ``--pg-runs`` runs of 10 external-write steps and
   of 10 pure steps (after a warm-up); µs/step = wall time of ``rt.start`` / steps.
3. **Where the added time goes** (every variant, SQLite NORMAL, in process, ``--rounds`` times):
   SQL time by statement (the store's connection wrapped: all, ``COMMIT``, the run ``UPDATE``s,
   the seal ``INSERT``) and the time inside ``audit.seal_batch`` (of it ``row_digest``, the
   per-row digests, and ``run_state_digest``, the run's changing fields, from ``c0bf69e``),
   ``audit._hash`` (every event and seal hash: sha256 or HMAC), ``sqlite._run`` and
   ``sqlite._run_state`` (from ``c0bf69e``), per step, by wrapping them.

Run::

    .venv/bin/python benchmarks/seal_cost.py                 # Markdown tables (BENCHMARKS.md)
    .venv/bin/python benchmarks/seal_cost.py --quick         # smoke run, ~15 s
    .venv/bin/python benchmarks/seal_cost.py --json > seal.json   # all samples
    .venv/bin/python benchmarks/seal_cost.py --summarize seal.json  # the tables again
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import importlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse, urlunparse

ROOT = Path(__file__).resolve().parents[1]
KEY = "sealbench-0123456789abcdef012345"  # 32 characters
assert len(KEY) == 32
VARIANTS = ("before", "after", "after_keyed")
PG_DEFAULT = os.environ.get("EFFECTFLOW_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")

# -- exports and environments -----------------------------------------------------------------------


def export(commit: str, dest: Path) -> str:
    """A clean tree of ``commit`` at ``dest`` (re-made unless it holds that commit); its full hash."""
    full = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--verify", f"{commit}^{{commit}}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    marker = dest / ".sealbench-commit"
    if marker.exists() and marker.read_text().strip() == full:
        return full
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(ROOT), "archive", full], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise RuntimeError(f"git archive {full} failed")
    marker.write_text(full + "\n")
    return full


def environment(src: Path, keyed: bool) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EFFECTFLOW_AUDIT_KEY")}
    env["PYTHONPATH"] = str(src)
    if keyed:
        env["EFFECTFLOW_AUDIT_KEY"] = KEY
    return env


CHECK = """
import sqlite3, sys, tempfile
import effectflow as ef
w = ef.tool("seal_check_w", effect="external_write", register=False)(lambda n: {"id": n})
@ef.workflow("seal_check", register=False)
def wf(ctx):
    ctx.call("s0", w, n=0)
d = tempfile.mkdtemp()
with ef.Runtime(f"sqlite:///{d}/l.db") as rt:
    rt.start(wf, run_id="r")
c = sqlite3.connect(f"{d}/l.db")
tables = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
seal = c.execute("SELECT hash FROM seals LIMIT 1").fetchone()[0] if "seals" in tables else None
print(ef.__file__)
print(seal)
"""


def check(name: str, src: Path, env: dict[str, str]) -> dict[str, Any]:
    """Which ``effectflow`` the variant imports, and what its first seal hash looks like."""
    out = subprocess.run(
        [sys.executable, "-c", CHECK], env=env, check=True, capture_output=True, text=True
    ).stdout.split("\n")
    imported, seal = out[0], out[1]
    if not imported.startswith(str(src)):
        raise RuntimeError(f"{name} imports {imported}, not the export under {src}")
    keyed = seal.startswith("hmac-sha256:")
    if (name == "before") != (seal == "None") or (name == "after_keyed") != keyed:
        raise RuntimeError(f"{name}: unexpected seal {seal!r}")
    return {"imported": imported, "seal": "none" if seal == "None" else seal.split(":")[0]}


# -- SQLite: core_overhead.py of each export --------------------------------------------------------


def core_overhead(exp: Path, env: dict[str, str], runs: int, repeats: int) -> dict[str, Any]:
    cmd = [sys.executable, str(exp / "benchmarks" / "core_overhead.py"), "--json"]
    cmd += ["--repeats", str(repeats), "--runs", str(runs)]
    done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, cwd=exp)
    return json.loads(done.stdout)


# -- PostgreSQL: a focused timing in a worker process -----------------------------------------------


def pg_worker(url: str, runs: int) -> dict[str, Any]:
    """In the variant's process: a fresh database, warm-up, then 10-step runs of each workload."""
    import psycopg

    import effectflow as ef

    write = ef.tool("seal_pg_w", effect="external_write", register=False)(lambda n: {"id": n})
    pure = ef.tool("seal_pg_p", register=False)(lambda: 1)

    @ef.workflow("seal_pg_write", register=False)
    def writes(ctx: ef.Context) -> None:
        for i in range(10):
            ctx.call(f"s{i}", write, n=i)

    @ef.workflow("seal_pg_pure", register=False)
    def pures(ctx: ef.Context) -> None:
        for i in range(10):
            ctx.call(f"s{i}", pure)

    name = f"effectflow_seal_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    result: dict[str, Any] = {"effectflow": ef.__file__}
    try:
        with ef.Runtime(urlunparse(urlparse(url)._replace(path=f"/{name}"))) as rt:

            def drive(wf: Any, prefix: str, n: int) -> None:
                for r in range(n):
                    run = rt.start(wf, run_id=f"{prefix}-{r}")
                    if run.status is not ef.RunStatus.SUCCEEDED:
                        raise RuntimeError(f"{run.run_id} ended {run.status}: {run.error}")

            for label, wf in (("external_write", writes), ("pure", pures)):
                drive(wf, f"warm-{label}", max(3, runs // 5))
            for label, wf in (("external_write", writes), ("pure", pures)):
                gc.collect()
                start = time.perf_counter()
                drive(wf, f"timed-{label}", runs)
                result[label] = (time.perf_counter() - start) / (runs * 10) * 1e6
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    return result


def pg_reachable(url: str) -> str | None:
    """None, or why PostgreSQL cannot be used."""
    if not url:
        return "--pg ''"
    try:
        import psycopg

        with psycopg.connect(url, autocommit=True, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:  # psycopg missing or the server unreachable
        return f"PostgreSQL not reachable at {url}: {' '.join(str(exc).split())}"
    return None


def pg_sample(env: dict[str, str], url: str, runs: int) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--pg-worker", "--pg", url]
    cmd += ["--pg-runs", str(runs)]
    done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout)


# -- where the added time goes: wrapped functions, in a worker process ------------------------------


class TimedConnection:
    """Stands in for the store's ``sqlite3.Connection``: times ``execute`` / ``executemany`` by
    statement (``COMMIT``, the seal ``INSERT``, the run ``UPDATE``s, all of them)."""

    def __init__(self, conn: Any, spent: dict[str, float]) -> None:
        self._inner = conn
        self._spent = spent

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _timed(self, method: str, sql: str, *args: Any) -> Any:
        start = time.perf_counter()
        try:
            return getattr(self._inner, method)(sql, *args)
        finally:
            took = time.perf_counter() - start
            head = " ".join(sql.split()[:3])
            group = (
                "commit"
                if head == "COMMIT"
                else "seal_insert"
                if head.startswith("INSERT INTO seals")
                else "run_update"
                if head.startswith("UPDATE runs")
                else None
            )
            self._spent["sql"] = self._spent.get("sql", 0.0) + took
            if group is not None:
                self._spent[group] = self._spent.get(group, 0.0) + took

    def execute(self, sql: str, *args: Any) -> Any:
        return self._timed("execute", sql, *args)

    def executemany(self, sql: str, *args: Any) -> Any:
        return self._timed("executemany", sql, *args)


def split_worker(runs: int) -> dict[str, Any]:
    """µs per step in SQL (by statement) and inside ``seal_batch``, ``row_digest``,
    ``run_state_digest``, ``_hash``, ``sqlite._run`` and ``sqlite._run_state`` (SQLite NORMAL,
    10-step runs), by wrapping them; what a variant lacks is 0."""
    import effectflow as ef
    from effectflow.ledger import audit
    from effectflow.ledger import sqlite as sqlite_store

    spent: dict[str, float] = {}
    calls: dict[str, int] = {}

    def wrap(module: Any, name: str, key: str | None = None) -> None:
        inner: Callable[..., Any] | None = getattr(module, name, None)
        if inner is None:
            return
        key = key or name

        @functools.wraps(inner)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                spent[key] = spent.get(key, 0.0) + time.perf_counter() - start
                calls[key] = calls.get(key, 0) + 1

        setattr(module, name, timed)

    write = ef.tool("seal_split_w", effect="external_write", register=False)(lambda n: {"id": n})
    pure = ef.tool("seal_split_p", register=False)(lambda: 1)

    @ef.workflow("seal_split_write", register=False)
    def writes(ctx: ef.Context) -> None:
        for i in range(10):
            ctx.call(f"s{i}", write, n=i)

    @ef.workflow("seal_split_pure", register=False)
    def pures(ctx: ef.Context) -> None:
        for i in range(10):
            ctx.call(f"s{i}", pure)

    # Wrapped where they are called from: the ``audit`` module of older commits calls its own
    # globals; since ``audit`` became a package its modules call ``hashes._hash`` and
    # ``rows.*_digest`` (and the stores call ``audit.seal_batch``), so the package's re-exports
    # are wrapped and, when they exist, the modules' own. Each wrapper times the function it
    # replaced, so a call is counted once whichever name it goes through.
    modules = [audit]
    for sub in ("hashes", "rows", "seals"):
        # Absent from a commit whose ``audit.py`` is one module: its globals are the ones called.
        with contextlib.suppress(ImportError):
            modules.append(importlib.import_module(f"effectflow.ledger.audit.{sub}"))
    # A row's digest: ``row_digest`` before ledger version 8, ``values_digest`` since (counted
    # as one column).
    for module in modules:
        for name in ("seal_batch", "row_digest", "run_state_digest", "_hash"):
            wrap(module, name)
        wrap(module, "values_digest", "row_digest")
    wrap(sqlite_store, "_run")
    wrap(sqlite_store, "_run_state")
    try:  # since ledger version 8 both stores map rows in one module
        from effectflow.ledger import rowmap  # type: ignore[attr-defined,unused-ignore]
    except ImportError:
        pass
    else:
        wrap(rowmap, "run", "_run")
        wrap(rowmap, "run_state", "_run_state")
    result: dict[str, Any] = {}
    folder = Path(tempfile.mkdtemp(prefix="effectflow-sealsplit-"))
    try:
        for label, wf in (("external_write", writes), ("pure", pures)):
            with ef.Runtime(f"sqlite:///{folder / label}.db?synchronous=normal") as rt:
                store: Any = rt.store
                store._conn = TimedConnection(store._conn, spent)
                for r in range(max(5, runs // 10)):
                    rt.start(wf, run_id=f"warm-{r}")
                spent.clear()
                calls.clear()
                gc.collect()
                start = time.perf_counter()
                for r in range(runs):
                    rt.start(wf, run_id=f"timed-{r}")
                total = time.perf_counter() - start
            steps = runs * 10
            result[label] = {
                "us_per_step": total / steps * 1e6,
                **{f"{k}_us_per_step": v / steps * 1e6 for k, v in spent.items()},
                **{f"{k}_calls_per_step": n / steps for k, n in calls.items()},
            }
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return result


def split_sample(env: dict[str, str], runs: int) -> dict[str, Any]:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--split-worker",
        "--split-runs",
        str(runs),
    ]
    done = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True)
    return json.loads(done.stdout)


# -- the whole session ------------------------------------------------------------------------------


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def session(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.work)
    commits = {"before": export(args.before, work / "before")}
    commits["after"] = commits["after_keyed"] = export(args.after, work / "after")
    exports = {v: work / ("before" if v == "before" else "after") for v in VARIANTS}
    envs = {v: environment(exports[v] / "src", v == "after_keyed") for v in VARIANTS}
    checks = {v: check(v, exports[v] / "src", envs[v]) for v in VARIANTS}
    out: dict[str, Any] = {
        "commits": commits,
        "checks": checks,
        "parameters": vars(args),
        "load_start": _load(),
        "sqlite": [],
        "postgres": [],
    }
    started = time.perf_counter()
    for rnd in range(args.rounds):
        order = VARIANTS[rnd % 3 :] + VARIANTS[: rnd % 3]
        for v in order:
            load = _load()
            res = core_overhead(exports[v], envs[v], args.runs, args.repeats)
            out["sqlite"].append({"round": rnd, "variant": v, "load": load, "result": res})
            print(f"# sqlite round {rnd} {v}: load {load}", file=sys.stderr)
    why_not = pg_reachable(args.pg)
    out["postgres_skipped"] = why_not
    if why_not is None:
        for rnd in range(args.rounds):
            order = VARIANTS[rnd % 3 :] + VARIANTS[: rnd % 3]
            for v in order:
                res = pg_sample(envs[v], args.pg, args.pg_runs)
                out["postgres"].append({"round": rnd, "variant": v, "load": _load(), **res})
                print(f"# postgres round {rnd} {v}", file=sys.stderr)
    out["split"] = []
    for rnd in range(args.rounds):
        order = VARIANTS[rnd % 3 :] + VARIANTS[: rnd % 3]
        for v in order:
            res = split_sample(envs[v], args.split_runs)
            out["split"].append({"round": rnd, "variant": v, **res})
    out["load_end"] = _load()
    out["elapsed_s"] = time.perf_counter() - started
    return out


# -- summary ----------------------------------------------------------------------------------------


def _n(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def _spread(values: Sequence[float]) -> str:
    return f"{_n(statistics.median(values))} ({_n(min(values))} – {_n(max(values))})"


def sqlite_rows(out: dict[str, Any]) -> list[dict[str, Any]]:
    """Per (workload, synchronous, variant): pooled samples and per-round ratios to ``before``."""
    pooled: dict[tuple[str, str, str], dict[str, list[float]]] = {}
    per_round: dict[tuple[str, str, str, int], float] = {}
    labels: dict[str, str] = {}
    for entry in out["sqlite"]:
        for s in entry["result"]["steps"]:
            key = (s["workload"], s["synchronous"], entry["variant"])
            labels[s["workload"]] = s["label"]
            slot = pooled.setdefault(key, {"steps_per_s": [], "us_per_step": []})
            slot["steps_per_s"] += s["steps_per_s"]["samples"]
            slot["us_per_step"] += s["overhead_us_per_step"]["samples"]
            per_round[(*key, entry["round"])] = s["steps_per_s"]["median"]
    rows = []
    for (work, sync, variant), slot in pooled.items():
        rounds = sorted({r for (w, s, v, r) in per_round if (w, s, v) == (work, sync, variant)})
        ratios = [
            per_round[(work, sync, variant, r)] / per_round[(work, sync, "before", r)]
            for r in rounds
            if (work, sync, "before", r) in per_round
        ]
        rows.append(
            {
                "workload": work,
                "label": labels[work],
                "synchronous": sync,
                "variant": variant,
                **slot,
                "ratio_per_round": ratios,
            }
        )
    order = {v: i for i, v in enumerate(VARIANTS)}
    rows.sort(key=lambda r: (r["synchronous"], r["workload"], order[r["variant"]]))
    return rows


def markdown(out: dict[str, Any]) -> str:
    loads = [e["load"] for e in out["sqlite"]]
    lines = [
        f"before = `{out['commits']['before'][:7]}`, after = `{out['commits']['after'][:7]}`; "
        f"{out['parameters']['rounds']} rounds × {out['parameters']['repeats']} repeats × "
        f"{out['parameters']['runs']} runs per configuration; 1-min load {out['load_start']} at "
        f"the start, {out['load_end']} at the end, {min(loads)} – {max(loads)} at the SQLite "
        f"invocations; {out['elapsed_s']:.0f} s in all.",
        "",
        "| Step (SQLite) | synchronous | variant | steps/s median (min – max) | "
        "µs/step median (min – max) | steps/s vs before, per round: median (min – max) |",
        "|---|---|---|---:|---:|---:|",
    ]
    for r in sqlite_rows(out):
        ratio = "1" if r["variant"] == "before" else _ratio(r["ratio_per_round"])
        lines.append(
            f"| {r['label']} | {r['synchronous']} | {r['variant']} | {_spread(r['steps_per_s'])} "
            f"| {_spread(r['us_per_step'])} | {ratio} |"
        )
    if out["postgres"]:
        lines += [
            "",
            "| Step (PostgreSQL, 10 per run) | variant | µs/step median (min – max) | "
            "steps/s (median) | steps/s vs before, per round: median (min – max) |",
            "|---|---|---:|---:|---:|",
        ]
        for label in ("external_write", "pure"):
            base = {e["round"]: e[label] for e in out["postgres"] if e["variant"] == "before"}
            for v in VARIANTS:
                mine = {e["round"]: e[label] for e in out["postgres"] if e["variant"] == v}
                us = list(mine.values())
                ratios = [base[r] / mine[r] for r in mine if r in base]
                ratio = "1" if v == "before" else _ratio(ratios)
                lines.append(
                    f"| {label.replace('_', '-')} | {v} | {_spread(us)} | "
                    f"{_n(1e6 / statistics.median(us))} | {ratio} |"
                )
    else:
        lines += ["", f"PostgreSQL skipped: {out['postgres_skipped']}"]
    lines += [
        "",
        "Inside, µs/step (SQLite NORMAL, 10-step runs, in process; medians of the rounds):",
        "",
        "| step | variant | total | SQL | of it COMMIT | run UPDATEs | seal INSERT | seal_batch "
        "| of it row_digest (calls/step) | of it run_state_digest (calls/step) "
        "| _hash (calls/step) | sqlite._run | sqlite._run_state |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label in ("external_write", "pure"):
        for v in VARIANTS:
            xs = [e[label] for e in out["split"] if e["variant"] == v]
            if not xs:
                continue

            def med(key: str, xs: list[dict[str, float]] = xs) -> float:
                return statistics.median(x.get(key, 0.0) for x in xs)

            cells = [_n(med("us_per_step"))]
            cells += [
                f"{med(f'{k}_us_per_step'):.1f}"
                for k in ("sql", "commit", "run_update", "seal_insert", "seal_batch")
            ]
            cells += [
                f"{med(f'{k}_us_per_step'):.1f} ({med(f'{k}_calls_per_step'):.1f})"
                for k in ("row_digest", "run_state_digest", "_hash")
            ]
            cells += [f"{med(f'{k}_us_per_step'):.1f}" for k in ("_run", "_run_state")]
            lines.append(f"| {label.replace('_', '-')} | {v} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ratio(values: Sequence[float]) -> str:
    if not values:
        return "n/a"
    return f"{statistics.median(values):.3f} ({min(values):.3f} – {max(values):.3f})"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--before", default="9e51b35", help="the commit without seals (9e51b35)")
    parser.add_argument("--after", default="910f32a", help="the commit with seals (910f32a)")
    parser.add_argument("--work", default="/tmp/sealbench", help="where the exports go")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (3)")
    parser.add_argument("--repeats", type=int, default=3, help="core_overhead.py --repeats (3)")
    parser.add_argument("--runs", type=int, default=200, help="core_overhead.py --runs (200)")
    parser.add_argument("--pg", default=PG_DEFAULT, help="PostgreSQL admin URL ('' to skip)")
    parser.add_argument("--pg-runs", type=int, default=60, help="10-step runs per PG sample (60)")
    parser.add_argument("--split-runs", type=int, default=200, help="10-step runs per split (200)")
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--json", action="store_true", help="print machine-readable results")
    parser.add_argument("--summarize", metavar="JSON", help="print the tables of a saved --json")
    parser.add_argument("--pg-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--split-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.pg_worker:
        json.dump(pg_worker(args.pg, args.pg_runs), sys.stdout)
        return 0
    if args.split_worker:
        json.dump(split_worker(args.split_runs), sys.stdout)
        return 0
    if args.summarize:
        print(markdown(json.loads(Path(args.summarize).read_text())))
        return 0
    if args.quick:
        args.rounds, args.repeats, args.runs = 1, 1, 10
        args.pg_runs, args.split_runs = 5, 10
    out = session(args)
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        print()
    else:
        print(markdown(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
