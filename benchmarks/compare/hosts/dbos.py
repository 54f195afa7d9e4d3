"""The DBOS host of the crash harness: a ``@DBOS.workflow`` on DBOS's SQLite system database, its
one write a plain ``@DBOS.step`` (``--bare``) or a guarded call (docs/integrations/crash_harness.md,
docs/integrations/dbos.md).

Usage::

    python benchmarks/compare/hosts/dbos.py start   DIR [--bare] [--model-ids] [--no-lookup]
    python benchmarks/compare/hosts/dbos.py recover DIR [--bare] [--model-ids] [--no-lookup]

``start`` launches DBOS (``sqlite:///DIR/dbos.sqlite``) and runs the workflow ``harness-turn``,
whose write appends one JSON line ``{"key": ..., "text": ...}`` to ``DIR/world.jsonl`` (the outside
world). ``--bare`` is DBOS alone: a ``@DBOS.step`` that calls ``crash.kill_if("after_effect")``
right after its append. Without it the same append is an ``ef.tool`` (``external_write``, a lookup
that reads the file for the call's key, ``settles_within=0``) called through
``effectflow.contrib.dbos.guarded`` on ``sqlite:///DIR/ledger.db`` with
``faults=crash.faults_from_env()``.

``recover`` is DBOS's own recovery in a fresh process: ``DBOS.launch()`` recovers the pending
workflows of this executor, and the script waits for ``harness-turn`` to finish (or to wait for a
person: its ``effectflow.asked`` event). It prints ``{"status", "needs_person", "lines"}``.

``--model-ids`` takes the call id from a scripted model asked in the workflow's own code, outside
any step, as an agent framework that knows nothing of DBOS would: every run of the workflow — the
first, and DBOS's replay after a crash — gets a fresh tool-call id (a uuid), so the replayed call
is a *regenerated* one. ``--no-lookup`` makes the guarded write one nothing can check after a
crash (no lookup, no idempotency): DBOS's replay then ends at a person, the workflow waiting in
``DBOS.recv`` with its question published, and ``recover`` says ``needs_person``.
"""

# This script's folder holds ``dbos.py`` (this file) and the other hosts' scripts, named like the
# packages they drive; Python puts the folder first on ``sys.path``, so it is dropped before any of
# those packages (``dbos`` itself) is imported, and the imports below come after that.
# ruff: noqa: E402

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != _HERE]

import argparse
import json
import time
import uuid
from pathlib import Path
from typing import Any

from dbos import DBOS, SetWorkflowID

import effectflow as ef
from effectflow.contrib import dbos as ef_dbos
from effectflow.testing import crash

WORKFLOW_ID = "harness-turn"
TOOL = "harness_dbos_append_line"
#: How long ``recover`` waits for DBOS's recovery to finish the workflow (seconds).
RECOVER_WAIT_S = 45.0


class World:
    """This host's settings (``main`` sets them); the outside world is ``WORLD``."""

    #: The guarded call (None with ``--bare``).
    append: ef_dbos.GuardedStep | None = None
    #: Whether the call id comes from the scripted model.
    model_ids = False


WORLD = crash.FileWorld(TOOL, "harness_dbos_find_line")
append_line = WORLD.append_line
_lines, _append = WORLD.lines, WORLD.append


@ef.tool("harness_dbos_append_unchecked", effect="external_write", effect_id="key")
def append_unchecked(text: str, *, idempotency_key: str) -> dict[str, Any]:
    """Append one line to the file; after a crash, nothing can tell whether it did."""
    return _append(text, idempotency_key)


@DBOS.step()
def plain_append_line(text: str) -> dict[str, Any]:
    """DBOS alone: append one line, and die right there when told to (a step has no key to give;
    DBOS runs a step whose output it did not checkpoint again)."""
    record = _append(text, f"plain-{uuid.uuid4().hex}")
    crash.kill_if("after_effect")
    return record


def scripted_model() -> str:
    """A model asked for its tool call outside any step: a fresh tool-call id each time."""
    return f"call_{uuid.uuid4().hex[:16]}"


@DBOS.workflow(name="harness_turn_bare")
def turn_bare() -> dict[str, Any]:
    """One turn of DBOS alone."""
    return plain_append_line("hello")


@DBOS.workflow(name="harness_turn")
def turn() -> Any:
    """One turn through the guarded call."""
    assert World.append is not None
    call_id = scripted_model() if World.model_ids else None
    return World.append.call({"text": "hello"}, call_id=call_id).value


def _wait(workflow_id: str) -> dict[str, Any]:
    """Wait for DBOS's recovery to end the workflow, or for it to wait for a person."""
    deadline = time.monotonic() + RECOVER_WAIT_S
    while True:
        status = DBOS.get_workflow_status(workflow_id)
        state = "missing" if status is None else str(status.status)
        if state in ("SUCCESS", "ERROR", "CANCELLED"):
            return {"status": state, "needs_person": False}
        if state != "missing" and ef_dbos.asked(workflow_id) is not None:
            return {"status": state, "needs_person": True}
        if time.monotonic() > deadline:
            return {"status": state, "needs_person": False}
        time.sleep(0.05)


def main(argv: list[str]) -> int:
    """Run one turn (``start``) or DBOS's recovery (``recover``)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["start", "recover"])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--bare", action="store_true")
    parser.add_argument("--model-ids", action="store_true")
    parser.add_argument("--no-lookup", action="store_true")
    args = parser.parse_args(argv)
    WORLD.file = args.directory / crash.WORLD_FILE
    World.model_ids = args.model_ids
    faults = crash.faults_from_env() if args.mode == "start" and not args.bare else None
    with ef.Runtime(f"sqlite:///{args.directory / 'ledger.db'}", faults=faults) as rt:
        World.append = ef_dbos.guarded(rt, append_unchecked if args.no_lookup else append_line)
        db = args.directory / "dbos.sqlite"
        config: Any = {"name": "effectflow-harness", "system_database_url": f"sqlite:///{db}"}
        DBOS(config={**config, "log_level": "WARNING"})
        DBOS.launch()  # on relaunch: recovers this executor's pending workflows
        try:
            if args.mode == "start":
                with SetWorkflowID(WORKFLOW_ID):
                    turn_bare() if args.bare else turn()
                out = _wait(WORKFLOW_ID)
            else:
                out = _wait(WORKFLOW_ID)
                if out["status"] == "missing":  # killed before DBOS recorded the workflow
                    with SetWorkflowID(WORKFLOW_ID):
                        turn_bare() if args.bare else turn()
                    out = _wait(WORKFLOW_ID)
        finally:
            DBOS.destroy()
    print(json.dumps({**out, "lines": len(_lines())}), flush=True)
    if out["needs_person"]:
        # The workflow's thread waits in DBOS.recv for the person's decision (for days): a real
        # host keeps serving it; this one has reported and leaves without joining that thread.
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
