"""The same crash on effectflow, DBOS and LangGraph: how many times does the outside world see the write?

One step appends a line to a file (the outside world) and its process is SIGKILLed right after the
append, before the framework records that the step completed; a fresh process then recovers the
workflow (effectflow: ``Runtime.recover``; DBOS: relaunch, which recovers pending workflows;
LangGraph: ``invoke(None, config)`` on the same thread, durability='sync'). effectflow's tool has a
lookup that reads the file for its key, so recovery confirms the write instead of repeating it.
Each peer runs in its own venv (``run.py`` creates them). Run::

    .venv/bin/python benchmarks/compare/crash_side_by_side.py --trials 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import run

# (name, venv, script, environment): effectflow-intents is effectflow on a ledger opened with
# durability=intents, whose outcomes skip their own fsync; a process crash must not tell the two apart.
PEERS = [
    ("effectflow", None, "crash_effectflow.py", {}),
    ("effectflow-intents", None, "crash_effectflow.py", {"EFFECTFLOW_DURABILITY": "intents"}),
    ("dbos", "dbos", "crash_dbos.py", {}),
    ("langgraph", "langgraph", "crash_langgraph.py", {}),
]


def trial(python: Path, script: Path, folder: Path, env: dict[str, str]) -> int:
    """Crash, recover, and return how many lines the step left in the file."""
    env = {**os.environ, **env}
    crashed = subprocess.run(
        [str(python), str(script), "crash", str(folder)], capture_output=True, env=env
    )
    if crashed.returncode != -9:
        raise RuntimeError(
            f"{script.name} crash exited {crashed.returncode}: {crashed.stderr[-500:]!r}"
        )
    recovered = subprocess.run(
        [str(python), str(script), "recover", str(folder)], capture_output=True, text=True, env=env
    )
    if recovered.returncode != 0:
        raise RuntimeError(
            f"{script.name} recover exited {recovered.returncode}: {recovered.stderr[-500:]}"
        )
    lines = (folder / "provider.txt").read_text(encoding="utf-8").splitlines()
    return len(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    print(
        f"| Framework | trials | times the line was written, per trial | total (ideal {args.trials}) |"
    )
    print("|---|---:|---|---:|")
    for name, venv, script, env in PEERS:
        python = run.venv_python(venv)
        if python is None:
            print(f"| {name} | — | not installed here (see stderr) | — |")
            continue
        counts: list[int] = []
        try:
            for _ in range(args.trials):
                folder = Path(tempfile.mkdtemp(prefix=f"effectflow-crash-{name}-"))
                try:
                    counts.append(trial(python, run.HERE / script, folder, env))
                finally:
                    shutil.rmtree(folder, ignore_errors=True)
        except RuntimeError as exc:
            print(f"| {name} | — | failed: {exc} | — |")
            continue
        print(f"| {name} | {args.trials} | {', '.join(map(str, counts))} | {sum(counts)} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
