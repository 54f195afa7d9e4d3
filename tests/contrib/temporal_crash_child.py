"""One attempt of a Temporal activity in a process of its own, which the Temporal crash test kills.

Usage: ``python temporal_crash_child.py attempt DIR N [--bare] [--activity-id ID]``.

Runs attempt ``N`` of activity ``ID`` (default ``1``) of workflow ``wf-crash`` / run ``run-1``
under ``temporalio.testing.ActivityEnvironment``, as Temporal's worker would start it. The activity
appends one JSON line ``{"key": ..., "text": ...}`` to ``DIR/world.jsonl`` (the outside world).
``--bare`` is the activity alone: a plain ``@activity.defn`` that calls
``crash.kill_if("after_effect")`` right after its append. Without it the append is an ``ef.tool``
(``external_write``, a lookup that reads the file for the call's key, ``settles_within=0``) behind
``effectflow.contrib.temporal.guarded`` on ``sqlite:///DIR/ledger.db`` with
``faults=crash.faults_from_env()``.

Attempt 2 in a fresh process is what Temporal does after the worker running attempt 1 died: the
activity's start-to-close (or heartbeat) timeout fires and the server schedules the next attempt
of the same activity id on any worker. No server runs here; this process plays that worker. It
prints ``{"status", "needs_person", "lines"}``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import uuid
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

import effectflow as ef
from effectflow.contrib import temporal as ef_temporal
from effectflow.testing import crash


class World:
    """This process's outside world (``main`` points it at DIR)."""

    file = Path(crash.WORLD_FILE)


def _lines() -> list[dict[str, Any]]:
    if not World.file.exists():
        return []
    return [json.loads(line) for line in World.file.read_text(encoding="utf-8").splitlines()]


def _append(text: str, key: str) -> dict[str, Any]:
    record = {"key": key, "text": text}
    with World.file.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")
    return record


@ef.tool("tcc_find_line", effect="read")
def find_line(*, idempotency_key: str) -> ef.Lookup:
    """The lookup: the file is the provider's own record, searched for the call's key."""
    for record in _lines():
        if record["key"] == idempotency_key:
            return ef.Lookup.confirmed(external_effect_id=idempotency_key, result=record)
    return ef.Lookup.not_committed()


@ef.tool(
    "tcc_append_line", effect="external_write", confirm=find_line, effect_id="key", settles_within=0
)
def append_line(text: str, *, idempotency_key: str) -> dict[str, Any]:
    """Append one line to the file."""
    return _append(text, idempotency_key)


@activity.defn(name="tcc_append_line")
async def plain_append_line(text: str) -> dict[str, Any]:
    """The activity alone: append one line, and die right there when told to."""
    record = _append(text, f"plain-{uuid.uuid4().hex}")
    crash.kill_if("after_effect")
    return record


def main(argv: list[str]) -> int:
    """Run one attempt; returns the exit code (a killed attempt never returns)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["attempt"])
    parser.add_argument("directory", type=Path)
    parser.add_argument("attempt", type=int)
    parser.add_argument("--bare", action="store_true")
    parser.add_argument("--activity-id", default="1")
    args = parser.parse_args(argv)
    World.file = args.directory / crash.WORLD_FILE
    faults = None if args.bare else crash.faults_from_env()
    with ef.Runtime(f"sqlite:///{args.directory / 'ledger.db'}", faults=faults) as rt:
        act = plain_append_line if args.bare else ef_temporal.guarded(rt, append_line)
        env = ActivityEnvironment()
        env.info = dataclasses.replace(
            ActivityEnvironment.default_info(),
            activity_id=args.activity_id,
            activity_type="tcc_append_line",
            attempt=args.attempt,
            workflow_id="wf-crash",
            workflow_run_id="run-1",
            workflow_type="crash",
        )

        async def run() -> Any:
            return await env.run(act, "hello")

        try:
            asyncio.run(run())
            out = {"status": "completed", "needs_person": False}
        except ApplicationError as exc:
            out = {
                "status": exc.type or "failed",
                "needs_person": exc.type == ef_temporal.NEEDS_PERSON,
            }
    print(json.dumps({**out, "lines": len(_lines())}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
