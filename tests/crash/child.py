"""A worker process the crash tests run, and kill, for real.

Usage::

    python child.py DIR [--app MODULE]... [--kill POINT[:STEP[:OCCURRENCE]]] [--recover]
                        [--reconcile] [--start WORKFLOW RUN_ID INPUT_JSON]...
                        [--approve RUN_ID STEP_ID APPROVAL_ID]...

It imports ``app`` and each ``--app`` module of this directory (their tools and workflows), points
them at the ledger and the provider files in DIR, builds ``ef.Runtime(url, faults=...)`` with at
most one SIGKILL fault, then in this order: ``recover()``, ``reconcile()``, ``start`` of each named
run (which creates it, or continues it when its previous owner died), and ``approve`` of each named
step (which continues its run in this process). It prints the status of every run as JSON on stdout.
When the fault fires the process dies by SIGKILL and prints nothing.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

import app

import effectflow as ef
from effectflow.runtime.faults import FaultPlan, FaultPoint


def _plan(spec: str | None) -> FaultPlan | None:
    if not spec:
        return None
    point, _, rest = spec.partition(":")
    # A step id may hold colons itself (``compensate:create_refund``): the occurrence is a number.
    step, sep, occurrence = rest.rpartition(":")
    if not sep or not occurrence.isdigit():
        step, occurrence = rest, ""
    return FaultPlan.kill_at(FaultPoint(point), step or None, int(occurrence or 1))


def main(argv: list[str]) -> int:
    """Run the child; returns the exit code."""
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("--kill")
    parser.add_argument("--recover", action="store_true")
    parser.add_argument("--reconcile", action="store_true")
    parser.add_argument("--start", nargs=3, action="append", default=[])
    parser.add_argument("--app", action="append", default=[])
    parser.add_argument("--approve", nargs=3, action="append", default=[])
    args = parser.parse_args(argv)
    directory = Path(args.directory)
    app.configure(directory)
    for module in args.app:
        importlib.import_module(module).configure(directory)
    url = f"sqlite:///{directory / app.LEDGER_FILE}"
    with ef.Runtime(url, faults=_plan(args.kill)) as rt:
        if args.recover:
            rt.recover()
        if args.reconcile:
            rt.reconcile()
        for workflow, run_id, input_json in args.start:
            rt.start(rt.registry.workflow(workflow), run_id=run_id, **json.loads(input_json))
        for run_id, step_id, approval_id in args.approve:
            rt.approve(run_id, step_id, approver="crash-test", approval_id=approval_id)
        print(json.dumps({run.run_id: run.status.value for run in rt.runs()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
