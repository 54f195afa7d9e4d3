"""A worker process the agent crash test runs, and kills, for real.

Usage: ``python agent_child.py DIR [--kill POINT:STEP] [--recover] [--start RUN_ID REQUEST]``; prints the
status of every run as JSON. When the fault fires the process dies by SIGKILL and prints nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import agent_app

import effectflow as ef
from effectflow.runtime.faults import FaultPlan, FaultPoint


def main(argv: list[str]) -> int:
    """Run the child; returns the exit code."""
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("--kill")
    parser.add_argument("--recover", action="store_true")
    parser.add_argument("--start", nargs=2)
    args = parser.parse_args(argv)
    directory = Path(args.directory)
    agent_app.configure(directory)
    faults = None
    if args.kill:
        point, _, step = args.kill.partition(":")
        faults = FaultPlan.kill_at(FaultPoint(point), step)
    with ef.Runtime(f"sqlite:///{directory / agent_app.LEDGER_FILE}", faults=faults) as rt:
        if args.recover:
            rt.recover()
        if args.start:
            run_id, request = args.start
            rt.start(agent_app.agent_refund, run_id=run_id, request=request)
        print(json.dumps({run.run_id: run.status.value for run in rt.runs()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
