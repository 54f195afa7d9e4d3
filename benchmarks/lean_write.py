"""How fast could a write step be on SQLite at ``synchronous=FULL`` with a leaner schema? A
throwaway ledger in plain ``sqlite3``, beside effectflow's, in one interleaved run (issue 18).

Issue 18 asks a sequential write step for ≥ 1,800 steps/s (or ≥ 4.5× DBOS, ≥ 2× LangGraph sync),
within ~1.5× of the floor two raw FULL commits a step set. Before redesigning the schema for it,
this measures what the redesign could reach at best: the same workflow (10 steps, each an intent
commit, the provider's append, an outcome commit; a run's start and end commits) written by

- ``floor``: two raw commits a step (a tiny INSERT each, ``bench.raw_commit_us``'s transaction)
  and the provider's append — no ledger at all;
- ``journal``: one row per intent and per outcome in an append-only ``journal`` table (its key
  ``(run_id, seq)``, the canonical JSON of the step's facts, the run's hash chain: ``sha256(prev +
  row)``), and the run's row fenced and moved on (``UPDATE … WHERE lease_token = ?``) — the least
  that keeps "intent durable before the call, outcome durable before the workflow goes on",
  fencing and a tamper-evident chain;
- ``journal+effects``: that, plus an ``effects`` row kept current (inserted at the intent,
  updated at the outcome, indexed by tenant and status as the operator's views read it);
- ``lean``: that, plus what effectflow keeps across runs: the logical operation's binding to its
  key (a unique row, so another run's same operation is found and not sent twice) and one of 64
  shard chains' heads moved on (so a whole run deleted shows);
- ``effectflow``: ``bench.Workloads``' write workflow on the default URL.

Every sample is a fresh ledger in a fresh directory, after a warm-up of 20 workflows; the designs
take turns (rotated each repeat). Reported: steps/s, process CPU a step (user + system, which on
this machine's virtual disk includes a large share of each fsync), WAL frames a commit, and each
against ``floor`` and ``effectflow``. Run::

    .venv/bin/python benchmarks/lean_write.py                 # 5 repeats x 100 workflows (~2 min)
    .venv/bin/python benchmarks/lean_write.py --repeats 3 --workflows 50
    .venv/bin/python benchmarks/lean_write.py --instructions   # callgrind, load-independent (~2 min)
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import resource
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import _callgrind

from effectflow import bench
from effectflow.ledger import sqlite as sqlite_backend

STEPS = bench.STEPS

_SCHEMA = """
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, status TEXT NOT NULL,
    lease_token INTEGER NOT NULL, head TEXT NOT NULL, n INTEGER NOT NULL, at REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX runs_by_status ON runs (tenant, status);
CREATE TABLE journal (
    run_id TEXT NOT NULL, seq INTEGER NOT NULL, kind TEXT NOT NULL, body TEXT NOT NULL,
    hash TEXT NOT NULL, PRIMARY KEY (run_id, seq)
) WITHOUT ROWID;
CREATE TABLE effects (
    effect_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, run_id TEXT NOT NULL, step_id TEXT NOT NULL,
    idempotency_key TEXT NOT NULL, status TEXT NOT NULL, result TEXT, at REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX effects_by_tenant_status ON effects (tenant, status);
CREATE TABLE operations (
    tenant TEXT NOT NULL, logical_operation_id TEXT NOT NULL, idempotency_key TEXT NOT NULL,
    run_id TEXT NOT NULL, step_id TEXT NOT NULL, PRIMARY KEY (tenant, logical_operation_id)
) WITHOUT ROWID;
CREATE TABLE shards (shard INTEGER PRIMARY KEY, n INTEGER NOT NULL, head TEXT NOT NULL);
WITH RECURSIVE s (x) AS (SELECT 0 UNION ALL SELECT x + 1 FROM s WHERE x < 63)
INSERT INTO shards (shard, n, head) SELECT x, 0, 'genesis' FROM s;
"""

_canonical = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode


class Lean:
    """The throwaway ledger: a run's chain head and lease token, its journal, maybe effects."""

    def __init__(self, path: Path, provider: bench.Provider, *, effects: bool, full: bool) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.executescript(_SCHEMA)
        self.provider = provider
        self.effects = effects
        self.full = full

    def _append(self, run_id: str, state: dict[str, object], kind: str, body: dict[str, object]):
        """One fenced transaction: the journal row chained on the run's head, the run moved on."""
        n = int(state["n"]) + 1  # type: ignore[call-overload]
        text = _canonical(body)
        digest = hashlib.sha256(f"{state['head']}|{run_id}|{n}|{kind}|{text}".encode()).hexdigest()
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(
                "INSERT INTO journal (run_id, seq, kind, body, hash) VALUES (?, ?, ?, ?, ?)",
                (run_id, n, kind, text, digest),
            )
            if self.full:
                if kind == "intent":
                    conn.execute(
                        "INSERT INTO operations (tenant, logical_operation_id, idempotency_key, "
                        "run_id, step_id) VALUES ('default', ?, ?, ?, ?)",
                        (body["effect_id"], body["key"], run_id, body["step"]),
                    )
                shard = int(digest[:2], 16) % 64
                conn.execute(
                    "UPDATE shards SET n = n + 1, head = ? WHERE shard = ?", (digest, shard)
                )
            if self.effects and kind in ("intent", "outcome"):
                if kind == "intent":
                    conn.execute(
                        "INSERT INTO effects (effect_id, tenant, run_id, step_id, "
                        "idempotency_key, status, at) VALUES (?, 'default', ?, ?, ?, "
                        "'intent_recorded', ?)",
                        (body["effect_id"], run_id, body["step"], body["key"], body["at"]),
                    )
                else:
                    conn.execute(
                        "UPDATE effects SET status = 'confirmed', result = ?, at = ? "
                        "WHERE effect_id = ?",
                        (_canonical(body["result"]), body["at"], body["effect_id"]),
                    )
            moved = conn.execute(
                "UPDATE runs SET head = ?, n = ?, at = ?, status = ? "
                "WHERE run_id = ? AND lease_token = ?",
                (digest, n, body["at"], state["status"], run_id, state["token"]),
            ).rowcount
            if moved != 1:
                raise RuntimeError(f"run {run_id}: the lease moved")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        state.update(head=digest, n=n)

    def run(self, run_id: str) -> None:
        """A workflow of ``STEPS`` write steps: start, an intent and an outcome a step, the end."""
        now = time.time()
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "INSERT INTO runs (run_id, tenant, status, lease_token, head, n, at) "
            "VALUES (?, 'default', 'running', 1, 'genesis', 0, ?)",
            (run_id, now),
        )
        conn.execute("COMMIT")
        state: dict[str, object] = {"head": "genesis", "n": 0, "token": 1, "status": "running"}
        for i in range(STEPS):
            step = f"s{i}"
            payload = {"n": i, "line": f"{run_id}/{step}"}
            request = hashlib.sha256(_canonical(payload).encode()).hexdigest()
            key = hashlib.sha256(f"default|append|{run_id}/{step}|{request}".encode()).hexdigest()
            effect_id = f"{run_id}:{step}"
            self._append(
                run_id,
                state,
                "intent",
                {
                    "step": step,
                    "effect_id": effect_id,
                    "key": key,
                    "request": request,
                    "at": time.time(),
                },
            )
            self.provider.append(key, payload["line"])  # type: ignore[arg-type]
            self._append(
                run_id,
                state,
                "outcome",
                {
                    "step": step,
                    "effect_id": effect_id,
                    "result": {"ok": True, "key": key},
                    "at": time.time(),
                },
            )
        state["status"] = "succeeded"
        self._append(run_id, state, "end", {"status": "succeeded", "at": time.time()})

    def close(self) -> None:
        self.conn.close()


class Floor:
    """Two raw commits a step and the provider's append: no ledger."""

    def __init__(self, path: Path, provider: bench.Provider) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        self.provider = provider

    def _commit(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.execute("INSERT INTO t (v) VALUES ('x')")
        self.conn.execute("COMMIT")

    def run(self, run_id: str) -> None:
        for i in range(STEPS):
            self._commit()
            self.provider.append(f"{run_id}/{i}", "x")
            self._commit()

    def close(self) -> None:
        self.conn.close()


def _open(
    design: str, folder: Path, *, synchronous_off: bool = False
) -> tuple[Callable[[str], object], sqlite3.Connection, Callable[[], None], int]:
    """A design's ledger in ``folder``: how to run one workflow, its connection, how to close it,
    and its commits a workflow."""
    provider = bench.Provider(folder / "provider.txt")
    path = folder / "ledger.db"
    if design == "effectflow":
        w = bench.Workloads(
            f"sqlite:///{path}" + ("?synchronous=off" if synchronous_off else ""), provider
        )
        flow = w._flows["write"]
        store = w.rt.store
        assert isinstance(store, sqlite_backend.SQLiteStore)

        def close_effectflow() -> None:
            w.close()
            provider.close()

        return (
            lambda run_id: w.rt.start(flow, run_id=run_id),
            store._conn,
            close_effectflow,
            2 * STEPS + 2,
        )
    ledger: Lean | Floor = (
        Floor(path, provider)
        if design == "floor"
        else Lean(path, provider, effects=design != "journal", full=design == "lean")
    )

    if synchronous_off:
        ledger.conn.execute("PRAGMA synchronous=OFF")

    def close_lean() -> None:
        ledger.close()
        provider.close()

    return ledger.run, ledger.conn, close_lean, 2 * STEPS + (0 if design == "floor" else 2)


@contextlib.contextmanager
def _warmed(
    design: str, what: str, *, synchronous_off: bool = False
) -> Iterator[tuple[Callable[[str], object], sqlite3.Connection, Path, int]]:
    """A fresh ledger of ``design`` after 20 workflows: how to run one, its connection, its
    folder and its commits a workflow (``synchronous_off``: no fsync, the step all CPU)."""
    folder = Path(tempfile.mkdtemp(prefix=f"effectflow-lean-{what}-{design}-"))
    try:
        run, conn, close, commits = _open(design, folder, synchronous_off=synchronous_off)
        try:
            for r in range(20):
                run(f"warm-{r}")
            yield run, conn, folder, commits
        finally:
            close()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _frames(design: str, workflows: int = 5) -> float:
    """WAL frames a commit: ``workflows`` workflows with auto-checkpoints off, the WAL's length."""
    with _warmed(design, "frames") as (run, conn, folder, commits):
        conn.execute("PRAGMA wal_autocheckpoint=0")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        for r in range(workflows):
            run(f"counted-{r}")
        size = (folder / "ledger.db-wal").stat().st_size
        page = conn.execute("PRAGMA page_size").fetchone()[0]
    return float((size - 32) / (24 + page) / (workflows * commits))


def _sample(design: str, workflows: int) -> dict[str, float]:
    with _warmed(design, "timed") as (run, _, _, _):
        before = resource.getrusage(resource.RUSAGE_SELF)
        started = time.perf_counter()
        for r in range(workflows):
            run(f"timed-{r}")
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_SELF)
    steps = workflows * STEPS
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"steps_s": steps / wall, "cpu_us": cpu / steps * 1e6, "load1": os.getloadavg()[0]}


def _counted_child(design: str, workflows: int) -> None:
    """In a process under callgrind: ``workflows`` workflows without fsyncs, inside
    ``sys.call_tracing`` (the only function callgrind collects in)."""
    with _warmed(design, "counted", synchronous_off=True) as (run, _, _, _):

        def loop() -> None:
            for r in range(workflows):
                run(f"counted-{r}")

        sys.call_tracing(loop, ())


def _instructions(design: str, workflows: int) -> float:
    """Instructions a step of ``design`` at ``synchronous=off`` (callgrind)."""
    command = [sys.executable, __file__, "--counted-child", design, "--workflows", str(workflows)]
    return _callgrind.instructions(command) / (workflows * STEPS)


DESIGNS = ("floor", "journal", "journal+effects", "lean", "effectflow")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workflows", type=int, default=100, help="timed workflows a sample")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="instructions a step of each design without fsyncs (valgrind callgrind), not times",
    )
    parser.add_argument("--counted-child", choices=DESIGNS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.repeats < 1 or args.workflows < 1:
        parser.error("--repeats and --workflows must be at least 1")
    if args.counted_child:
        _counted_child(args.counted_child, args.workflows)
        return
    if args.instructions:
        print("| design | instructions a step (synchronous=off) | WAL frames a commit |")
        print("| --- | ---: | ---: |")
        for design in DESIGNS:
            counted = _instructions(design, min(args.workflows, 30))
            print(f"| {design} | {counted:,.0f} | {_frames(design):.1f} |", flush=True)
        return
    found: dict[str, list[dict[str, float]]] = {d: [] for d in DESIGNS}
    for rep in range(args.repeats):
        order = DESIGNS[rep % len(DESIGNS) :] + DESIGNS[: rep % len(DESIGNS)]
        for design in order:
            sample = _sample(design, args.workflows)
            found[design].append(sample)
            print(f"[{rep + 1}/{args.repeats}] {design}: {sample}", flush=True)

    def paired(design: str, against: str) -> float:
        return statistics.median(
            a["steps_s"] / b["steps_s"] for a, b in zip(found[design], found[against], strict=True)
        )

    loads = [s["load1"] for samples in found.values() for s in samples]
    print(
        f"\n# {args.workflows} workflows x {STEPS} write steps, SQLite {sqlite3.sqlite_version} "
        f"WAL synchronous=FULL, medians of {args.repeats} (load1 {min(loads):.2f}–{max(loads):.2f})"
    )
    print("| design | steps/s | CPU µs a step | WAL frames a commit | of floor | × effectflow |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for design, samples in found.items():
        rate = statistics.median(s["steps_s"] for s in samples)
        cpu = statistics.median(s["cpu_us"] for s in samples)
        frames = _frames(design)
        print(
            f"| {design} | {rate:,.0f} | {cpu:,.0f} | {frames:.1f} | "
            f"{paired(design, 'floor'):.2f} | {paired(design, 'effectflow'):.2f} |"
        )


if __name__ == "__main__":
    main()
