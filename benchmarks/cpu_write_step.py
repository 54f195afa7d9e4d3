"""The CPU of one sequential write step on SQLite, counted in instructions (issue 18).

Wall time on a shared 2-core machine is noise; instructions are not. So this runs
``effectflow.bench.Workloads``' ``write`` workflow (10 external-write steps each) on a fresh ledger at
``?synchronous=off`` (no fsync: a step is all CPU), after a warm-up, and reports per write step:

- ``--callgrind``: instructions (``valgrind --tool=callgrind``, ``PYTHONHASHSEED=0``) of the
  measured loop alone: the child runs it inside ``sys.call_tracing`` (a C function nothing else
  calls, which does nothing when no tracer is set), and callgrind collects only inside that
  function (``--collect-atstart=no --toggle-collect=sys_call_tracing``), so imports, compiling
  and the warm-up are not counted; the callgrind files are kept for ``callgrind_annotate``;
- ``--counts``: JSON encodes (calls of the C encoder ``json`` makes, counted by wrapping
  ``json.encoder.c_make_encoder`` before effectflow is imported, plus ``JSONEncoder.encode``'s
  string fast path), sha256 calls (``hashlib.sha256`` wrapped the same way) and SQL statements
  (the store's connection's trace callback: each row of an ``executemany`` counts);
- by default: ``time.process_time()`` per step of the measured loop (a second opinion).

``--commits A B`` runs any of these for two commits (each exported with ``git archive``, nothing
checked out), interleaved ABBA, ``--repeats`` times, and prints both and their ratio (medians)::

    .venv/bin/python benchmarks/cpu_write_step.py --callgrind            # this tree, ~1 min
    .venv/bin/python benchmarks/cpu_write_step.py --counts
    .venv/bin/python benchmarks/cpu_write_step.py --commits 4d67244 HEAD --callgrind --repeats 1
    .venv/bin/python benchmarks/cpu_write_step.py --commits 4d67244 HEAD --repeats 7
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
STEPS_PER_WORKFLOW = 10


def _child(workflows: int, warmup: int, counts: bool) -> None:
    """In the measured process: warm up, run ``workflows`` write workflows, print one JSON line."""
    import hashlib
    import json.encoder
    import time

    tally = {"json": 0, "sha256": 0, "sql": 0}
    if counts:
        made = json.encoder.c_make_encoder
        real_sha256 = hashlib.sha256
        plain_str = json.encoder.JSONEncoder.encode

        class Counted:
            def __init__(self, *args: Any) -> None:
                self._encoder = made(*args)  # type: ignore[misc]

            def __call__(self, value: Any, level: int) -> Any:
                tally["json"] += 1
                return self._encoder(value, level)

        def encode(self: json.JSONEncoder, value: Any) -> str:
            if isinstance(value, str):
                tally["json"] += 1
            return plain_str(self, value)

        def sha256(*args: Any, **kwargs: Any) -> Any:
            tally["sha256"] += 1
            return real_sha256(*args, **kwargs)

        json.encoder.c_make_encoder = Counted  # type: ignore[misc, assignment]
        json.encoder.JSONEncoder.encode = encode  # type: ignore[method-assign]
        hashlib.sha256 = sha256  # type: ignore[assignment]

    from effectflow import bench
    from effectflow.ledger import sqlite as sqlite_backend

    folder = Path(tempfile.mkdtemp(prefix="effectflow-cpu-step-"))
    provider = bench.Provider(folder / "provider.txt")
    try:
        w = bench.Workloads(f"sqlite:///{folder / 'ledger.db'}?synchronous=off", provider)
        try:
            w.run("write", warmup, "warm")
            store = w.rt.store
            assert isinstance(store, sqlite_backend.SQLiteStore)
            if counts:
                tally.update(json=0, sha256=0)

                def traced(sql: str) -> None:
                    tally["sql"] += 1

                store._conn.set_trace_callback(traced)
            started = time.process_time()
            # sys.call_tracing: the region callgrind counts (see the module)
            sys.call_tracing(w.run, ("write", workflows, "timed"))
            cpu = time.process_time() - started
        finally:
            w.close()
    finally:
        provider.close()
        shutil.rmtree(folder, ignore_errors=True)
    steps = workflows * STEPS_PER_WORKFLOW
    found: dict[str, float] = {"steps": steps}
    if steps:
        found["cpu_us_per_step"] = cpu / steps * 1e6
        if counts:
            found.update({f"{k}_per_step": v / steps for k, v in tally.items()})
    print(json.dumps(found), flush=True)


def _run(src: Path, argv: list[str], valgrind: Path | None = None) -> dict[str, float]:
    """One child process on ``src``'s effectflow; under callgrind (its output file ``valgrind``)
    its instruction count joins the result."""
    env = {**os.environ, "PYTHONPATH": str(src), "PYTHONHASHSEED": "0"}
    env.pop("EFFECTFLOW_DURABILITY", None)
    env.pop("EFFECTFLOW_AUDIT_KEY", None)
    env.pop("EFFECTFLOW_AUDIT_KEY_FILE", None)
    command = [sys.executable, str(Path(__file__).resolve()), "--child", *argv]
    if valgrind is not None:
        command = [
            "valgrind",
            "--tool=callgrind",
            "--collect-atstart=no",
            "--toggle-collect=sys_call_tracing",
            f"--callgrind-out-file={valgrind}",
            *command,
        ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    found: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    if valgrind is not None:
        found["ir"] = _instructions(valgrind)
    return found


def _instructions(path: Path) -> int:
    """The total instruction count a callgrind output file records."""
    text = path.read_text(encoding="utf-8", errors="replace")
    match = re.search(r"^(?:summary|totals):\s+(\d+)", text, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"{path}: no 'summary:' line; is this a callgrind output file?")
    return int(match.group(1))


def measure(src: Path, args: argparse.Namespace, label: str, rep: int) -> dict[str, float]:
    """One sample of this tree: instructions a step (``--callgrind``), counts, or CPU a step."""
    base = ["--workflows", str(args.workflows), "--warmup", str(args.warmup)]
    if args.callgrind:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        found = _run(src, base, out / f"callgrind.{label}.{rep}")
        return {"ir_per_step": found["ir"] / found["steps"], "ir": found["ir"]}
    if args.counts:
        return _run(src, [*base, "--counts"])
    return _run(src, base)


def _export(commit: str, into: Path) -> Path:
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into / "src"


def main(argv: list[str]) -> int:
    """Parse, sample (one tree, or two commits interleaved), print."""
    if argv[:1] == ["--child"]:
        parser = argparse.ArgumentParser()
        parser.add_argument("--workflows", type=int)
        parser.add_argument("--warmup", type=int)
        parser.add_argument("--counts", action="store_true")
        found = parser.parse_args(argv[1:])
        _child(found.workflows, found.warmup, found.counts)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workflows", type=int, default=20, help="measured write workflows")
    parser.add_argument("--warmup", type=int, default=5, help="write workflows run first")
    parser.add_argument("--callgrind", action="store_true", help="count instructions")
    parser.add_argument("--counts", action="store_true", help="JSON, sha256 and SQL per step")
    parser.add_argument("--commits", nargs=2, metavar=("A", "B"), help="compare two commits")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", default="/tmp/effectflow-callgrind", help="callgrind files")
    parser.add_argument("--src", type=Path, default=REPO / "src", help="the tree's src/ measured")
    args = parser.parse_args(argv)
    if args.workflows < 1 or args.warmup < 1 or args.repeats < 1:
        parser.error("--workflows, --warmup and --repeats must be at least 1")
    with tempfile.TemporaryDirectory(prefix="effectflow-cpu-trees-") as folder:
        if args.commits:
            trees = {c: _export(c, Path(folder) / str(i)) for i, c in enumerate(args.commits)}
        else:
            trees = {"tree": args.src}
        samples: dict[str, list[dict[str, float]]] = {label: [] for label in trees}
        for rep in range(args.repeats):
            order = list(trees) if rep % 2 == 0 else list(reversed(trees))
            for label in order:
                found = measure(trees[label], args, label, rep)
                found["load1"] = os.getloadavg()[0]
                samples[label].append(found)
                print(f"[{rep + 1}/{args.repeats}] {label}: {found}", file=sys.stderr)
    for label, found in samples.items():
        medians = {k: statistics.median(s[k] for s in found) for k in found[0] if k != "load1"}
        loads = [s["load1"] for s in found]
        shown = ", ".join(f"{k} {v:,.2f}" for k, v in medians.items())
        print(
            f"{label}: {shown} (medians of {len(found)}; load1 {min(loads):.2f}-{max(loads):.2f})"
        )
    if args.commits:
        a, b = (samples[c] for c in args.commits)
        for key in a[0]:
            if key == "load1" or key == "steps":
                continue
            ratio = statistics.median(y[key] / x[key] for x, y in zip(a, b, strict=True) if x[key])
            print(f"{key}: {args.commits[1]} / {args.commits[0]} = {ratio:.3f} (paired, median)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
