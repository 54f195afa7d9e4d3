"""effectflow against its peers, the same workloads: DBOS Transact (SQLite) and LangGraph (SqliteSaver).

Each peer is installed into its own virtual environment under ``benchmarks/compare/.venvs/<peer>``
(created on first use with the pinned versions below; never a dependency of effectflow), and each
measurement is one subprocess running that venv's python on the peer's workload file
(``peer_<name>.py``); effectflow runs under the interpreter that runs this script.

Workloads (``_common.py``): ``sequential`` 200 workflows x 10 trivial pure steps, one after another;
``concurrent`` the same with 8 workflows at a time (threads); ``write`` 200 workflows x 10 steps that
each append a line to a file (the simulated provider; for effectflow an ``external_write`` tool with a
lookup: intent + outcome). Reported: steps/s, overhead per step in µs (against calling the same
functions directly, in the same process), peak RSS of the subprocess (``ru_maxrss``), each the median
of 5 runs (interleaved: every configuration once, then again), and effectflow/peer ratios. Beside
them the floor, measured once per repetition in the same run: a raw SQLite WAL commit at
``synchronous=FULL`` (``effectflow.bench.raw_commit_us``), the write steps/s two such commits per
step allow, and each effectflow write workload as a fraction of it.
Run::

    .venv/bin/python benchmarks/compare/run.py            # Markdown table (BENCHMARKS.md)
    .venv/bin/python benchmarks/compare/run.py --quick    # smoke run
    .venv/bin/python benchmarks/compare/run.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from effectflow import bench

HERE = Path(__file__).resolve().parent
VENVS = HERE / ".venvs"
# The versions measured (pip resolved these on 2026-11-30); change them here to measure others.
PINS = {
    "dbos": ["dbos==3.4.0"],
    "langgraph": ["langgraph==1.2.24", "langgraph-checkpoint-sqlite==3.1.2"],
}
WORKLOADS = ("sequential", "concurrent", "write")
# effectflow's own: the same workflows as ``async def``, 8 at a time on one asyncio loop.
ASYNC_WORKLOADS = ("concurrent_async", "write_async")
WORKLOAD_LABELS = {
    "sequential": "{runs} workflows x 10 pure steps, sequential",
    "concurrent": "{runs} workflows x 10 pure steps, 8 threads",
    "concurrent_async": "{runs} workflows x 10 pure steps, 8 at a time on asyncio (effectflow only)",
    "write": "{runs} workflows x 10 write steps (append a line), sequential",
    "write_async": "{runs} workflows x 10 write steps, 8 at a time on asyncio (effectflow only)",
}


# (name, venv, script, environment, what its durability setting is)
CONFIGS: list[tuple[str, str | None, str, dict[str, str], str]] = [
    ("effectflow", None, "peer_effectflow.py", {},
     "ledger WAL, synchronous=FULL (the default URL): every commit survives power loss"),
    ("effectflow-intents", None, "peer_effectflow.py", {"EFFECTFLOW_DURABILITY": "intents"},
     "ledger WAL, durability=intents: intents (and run starts and ends) at synchronous=FULL, "
     "survive power loss; call outcomes at NORMAL, survive a process crash at once and power "
     "loss from the next FULL commit"),
    ("dbos", "dbos", "peer_dbos.py", {},
     "system DB journal_mode=DELETE, synchronous=FULL (SQLite defaults; DBOS sets neither)"),
    ("langgraph-sync", "langgraph", "peer_langgraph.py", {"LANGGRAPH_DURABILITY": "sync"},
     "durability='sync'; SqliteSaver WAL, synchronous=FULL (SQLite default)"),
    ("langgraph-async", "langgraph", "peer_langgraph.py", {"LANGGRAPH_DURABILITY": "async"},
     "durability='async' (LangGraph's default); WAL, synchronous=FULL"),
]  # fmt: skip

WEAKER = [
    "DBOS: a step's completion is checkpointed after it returns; a process that dies inside a step "
    "re-runs the whole step on recovery (at-least-once for the outside world, no lookup).",
    "LangGraph durability='sync': a node that was running when the process died is re-run from the "
    "start on resume (no record of its intent, no lookup).",
    "LangGraph durability='async' (the default): the checkpoint of step N is written while step N+1 "
    "runs, so a crash can lose completed steps as well; 'exit' (not measured) writes only at the end.",
    "effectflow's write step commits an intent before the call and an outcome after it; after a crash "
    "between the two it confirms through the lookup instead of writing again "
    "(crash_side_by_side.py shows it).",
]


def venv_python(venv: str | None) -> Path | None:
    """The venv's python, creating the venv and installing the pinned peer on first use."""
    if venv is None:
        return Path(sys.executable)
    folder = VENVS / venv
    python = folder / "bin" / "python"
    marker = folder / "pins.txt"
    wanted = "\n".join(PINS[venv])
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return python
    print(f"installing {' '.join(PINS[venv])} into {folder} ...", file=sys.stderr)
    try:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(folder)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", *PINS[venv]],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
    except (subprocess.CalledProcessError, OSError) as exc:
        detail = getattr(exc, "stderr", None) or str(exc)
        print(f"cannot install {venv}: {detail.strip()[-500:]}", file=sys.stderr)
        return None
    marker.write_text(wanted)
    return python


def one_sample(python: Path, script: str, env: dict[str, str], workload: str, runs: int,
               parent: str | None) -> dict[str, Any]:  # fmt: skip
    folder = Path(tempfile.mkdtemp(prefix="effectflow-compare-", dir=parent))
    try:
        proc = subprocess.run(
            [str(python), str(HERE / script), workload, "--dir", str(folder), "--runs", str(runs)],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{script} {workload} exited {proc.returncode}: {proc.stderr[-800:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    steps = samples[0]["steps"]
    return {
        "steps_per_s": statistics.median(steps / s["with_s"] for s in samples),
        "overhead_us": statistics.median(
            (s["with_s"] - s["direct_s"]) / steps * 1e6 for s in samples
        ),
        "rss_mib": statistics.median(s["maxrss_kb"] / 1024 for s in samples),
        "journal_mode": samples[0]["journal_mode"],
        "samples": samples,
    }


def fmt(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:,.1f}" if x >= 10 else f"{x:.2f}"


# The targets of issue 7: (label, numerator, denominator, at least; None: shown, not a target).
TARGETS = [
    ("pure steps, sequential: effectflow / DBOS", "effectflow/sequential", "dbos/sequential", 10.0),
    ("pure steps, sequential: effectflow / LangGraph (sync)", "effectflow/sequential",
     "langgraph-sync/sequential", 4.0),
    ("write steps: effectflow (FULL) / DBOS", "effectflow/write", "dbos/write", 5.0),
    ("write steps: effectflow (FULL) / LangGraph (sync) (issue 18)", "effectflow/write",
     "langgraph-sync/write", 2.0),
    ("write steps: effectflow (durability=intents) / DBOS", "effectflow-intents/write",
     "dbos/write", 5.0),
    ("pure steps: effectflow 8 threads / sequential", "effectflow/concurrent",
     "effectflow/sequential", 3.0),
    ("pure steps: effectflow 8 asyncio workflows / sequential", "effectflow/concurrent_async",
     "effectflow/sequential", 3.0),
    ("write steps: effectflow 8 asyncio workflows / sequential", "effectflow/write_async",
     "effectflow/write", None),
]  # fmt: skip


def targets(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each target's ratio of medians from this run, and whether it is met."""
    out = []
    for label, num, den, at_least in TARGETS:
        if num in results and den in results:
            ratio = results[num]["steps_per_s"] / results[den]["steps_per_s"]
            met = None if at_least is None else ratio >= at_least
            out.append({"target": label, "at_least": at_least, "ratio": ratio,
                        "met": met})  # fmt: skip
    return out


def floor_lines(results: dict[str, dict[str, Any]], floor_us: list[float]) -> list[str]:
    """The floor's table: the raw commit, the two-commit write step, each write workload's share."""
    if not floor_us:
        return []
    floor = bench.Floor(statistics.median(floor_us))
    lines = [
        "", "| Floor (medians of this run) | µs/commit | steps/s | effectflow / floor |",
        "|---|---:|---:|---:|",
        f"| raw SQLite WAL commit, synchronous=FULL (tiny INSERT, 1 per transaction) | "
        f"{fmt(floor.commit_us)} | — | — |",
        f"| a write step's two commits (intent, outcome) | — | {fmt(floor.write_steps_per_s)} | — |",
    ]  # fmt: skip
    for key in ("effectflow/write", "effectflow/write_async", "effectflow-intents/write",
                "effectflow-intents/write_async"):  # fmt: skip
        if key in results:
            rate = results[key]["steps_per_s"]
            lines.append(f"| {key} | — | {fmt(rate)} | {rate / floor.write_steps_per_s:.2f} |")
    return lines


def markdown(
    results: dict[str, dict[str, Any]],
    missing: dict[str, str],
    repeats: int,
    runs: int,
    floor_us: list[float] | None = None,
) -> str:
    lines = [
        "| Workload | Framework | steps/s | steps/s min – max | overhead µs/step | peak RSS MiB | "
        "effectflow/peer steps/s | effectflow/peer overhead | effectflow/peer RSS |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for workload in ("sequential", "concurrent", "concurrent_async", "write", "write_async"):
        ef = results.get(f"effectflow/{workload}")
        for name, *_ in CONFIGS:
            r = results.get(f"{name}/{workload}")
            if r is None:
                continue
            ratios = ["—", "—", "—"]
            if ef is not None and not name.startswith("effectflow"):
                ratios = [
                    f"{ef['steps_per_s'] / r['steps_per_s']:.2f}",
                    f"{ef['overhead_us'] / r['overhead_us']:.2f}",
                    f"{ef['rss_mib'] / r['rss_mib']:.2f}",
                ]
            rates = [s["steps"] / s["with_s"] for s in r["samples"]]
            lines.append(
                f"| {WORKLOAD_LABELS[workload].format(runs=runs)} | {name} | "
                f"{fmt(r['steps_per_s'])} | "
                f"{fmt(min(rates))} – {fmt(max(rates))} | "
                f"{fmt(r['overhead_us'])} | {r['rss_mib']:.1f} | " + " | ".join(ratios) + " |"
            )
    lines += floor_lines(results, floor_us or [])
    checked = targets(results)
    if checked:
        lines += ["", "| Target (steps/s, medians of this run) | at least | measured | |",
                  "|---|---:|---:|---|"]  # fmt: skip
        for t in checked:
            if t["at_least"] is None:
                lines.append(f"| {t['target']} | — | {t['ratio']:.2f} | not a target |")
                continue
            verdict = "met" if t["met"] else f"missed (x{t['at_least'] / t['ratio']:.1f} short)"
            lines.append(f"| {t['target']} | {t['at_least']:g} | {t['ratio']:.2f} | {verdict} |")
    lines += ["", f"Medians of {repeats} runs. Ratio columns: effectflow (FULL) / peer. "
              "Durability settings:"]  # fmt: skip
    measured = {key.split("/")[0] for key in results}
    lines += [f"- {name}: {setting}" for name, _, _, _, setting in CONFIGS if name in measured]
    lines += ["", "Where a peer gives weaker guarantees for the same work:"]
    lines += [f"- {w}" for w in WEAKER]
    for name, why in missing.items():
        lines.append(f"- NOT MEASURED: {name}: {why}")
    return "\n".join(lines)


def floor_json(floor_us: list[float]) -> dict[str, Any]:
    """The floor's samples and the median's figures, for ``--json``."""
    median = bench.Floor(statistics.median(floor_us)).to_dict() if floor_us else {}
    return {**median, "samples_us": floor_us}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="workflows per measurement")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="20 workflows, 1 repeat")
    parser.add_argument("--only", nargs="*", help="framework names to run (default: all)")
    parser.add_argument("--dir", help="where the databases go (default: the system temp dir)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.repeats = 20, 1
    configs = [c for c in CONFIGS if not args.only or c[0] in args.only]
    pythons: dict[str, Path] = {}
    missing: dict[str, str] = {}
    for name, venv, *_ in configs:
        python = venv_python(venv)
        if python is None:
            missing[name] = f"could not install {' '.join(PINS[venv or ''])} (see stderr)"
        else:
            pythons[name] = python
    samples: dict[str, list[dict[str, Any]]] = {}
    floor_us: list[float] = []
    for rep in range(args.repeats):
        print(f"[{rep + 1}/{args.repeats}] floor: raw SQLite commit", file=sys.stderr)
        floor_dir = Path(tempfile.mkdtemp(prefix="effectflow-floor-", dir=args.dir))
        try:
            floor_us.append(bench.raw_commit_us(floor_dir, 2000))
        finally:
            shutil.rmtree(floor_dir, ignore_errors=True)
        for workload in WORKLOADS + ASYNC_WORKLOADS:
            for name, _, script, env, _ in configs:
                if name not in pythons or name in missing:
                    continue
                if workload in ASYNC_WORKLOADS and not name.startswith("effectflow"):
                    continue
                print(f"[{rep + 1}/{args.repeats}] {name} {workload}", file=sys.stderr)
                try:
                    sample = one_sample(pythons[name], script, env, workload, args.runs, args.dir)
                except (RuntimeError, subprocess.TimeoutExpired, ValueError) as exc:
                    missing[name] = f"failed to run: {exc}"
                    continue
                samples.setdefault(f"{name}/{workload}", []).append(sample)
    results = {key: summarize(s) for key, s in samples.items() if key.split("/")[0] not in missing}
    if args.json:
        print(json.dumps({"results": results, "targets": targets(results), "missing": missing,
                          "pins": PINS, "runs": args.runs, "repeats": args.repeats,
                          "floor": floor_json(floor_us)}, indent=2))  # fmt: skip
    else:
        print(markdown(results, missing, args.repeats, args.runs, floor_us))


if __name__ == "__main__":
    main()
