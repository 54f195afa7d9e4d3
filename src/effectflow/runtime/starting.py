"""Recording runs: a new run (one per run id: the same id and input again is the same run), and
a paused or failed run reopened in a new generation."""

from __future__ import annotations

import dataclasses
from typing import Any

from effectflow import digests, errors
from effectflow.contracts.workflow import Workflow
from effectflow.ledger import records
from effectflow.ledger.records import NextAction, RunStatus
from effectflow.ledger.store import Batch
from effectflow.runtime import guard, machine_io
from effectflow.runtime.port import Port


def create(
    port: Port,
    workflow: Workflow[..., Any],
    run_id: str | None,
    input: dict[str, Any],
    *,
    leased: bool,
) -> tuple[records.RunRecord, bool]:
    """The run (created now, or the existing one with this id) and whether it was created.

    A run started in this process is created already leased to it, so no worker can take it
    between its creation and its first step (and no second commit is needed to claim it).
    """
    run, batch = _new_run(port, workflow, run_id, input, leased=leased)
    if batch is None:
        return run, False
    # A run this process goes on to execute needs no flush of its own (``Batch.rides``); one
    # created for workers is answered at once, so it is flushed like any commit.
    batch.rides = leased
    try:
        port.store.apply(batch, lease_ttl=port.lease_ttl, now=run.created_at)
    except Exception as exc:
        return _raced(port, run, exc), False
    return run, True


async def create_async(
    port: Port, workflow: Workflow[..., Any], run_id: str | None, input: dict[str, Any]
) -> tuple[records.RunRecord, bool]:
    """``create`` for ``start_async``: the run's first commit is grouped with other runs'."""
    run, batch = _new_run(port, workflow, run_id, input, leased=True)
    if batch is None:
        return run, False
    batch.rides = True  # executed here at once, as ``create``'s leased runs: see there
    try:
        await port.writer.apply_async(batch, run.created_at)
    except Exception as exc:
        return _raced(port, run, exc), False
    return run, True


def reopen(port: Port, run: records.RunRecord, *, by: str) -> records.RunRecord:
    """A paused or failed run becomes running again, in a new generation."""
    now = port.clock()
    batch = Batch(run.run_id, lease_token=run.lease_token)
    batch.run_changes.update(
        status=RunStatus.RUNNING,
        generation=run.generation + 1,
        next_action=NextAction.EXECUTE,
        error=None,
    )
    kind = "run_redriven" if run.status is RunStatus.FAILED else "run_resumed"
    batch.event(
        kind, now, actor=by, previous_status=run.status.value, generation=run.generation + 1
    )
    port.store.apply(batch, lease_ttl=port.lease_ttl, now=now)
    return dataclasses.replace(
        run, status=RunStatus.RUNNING, generation=run.generation + 1, error=None
    )


def _new_run(
    port: Port,
    workflow: Workflow[..., Any],
    run_id: str | None,
    input: dict[str, Any],
    *,
    leased: bool,
) -> tuple[records.RunRecord, Batch | None]:
    """The existing run with this id and no batch, or a new run and the batch that creates it.

    Raises:
        errors.ArgumentError: the id is empty, blank or not recordable text (a NUL, a lone
            surrogate): refused, never replaced by a fresh id, so a caller retrying with its
            own id never starts a second run by mistake.
        errors.IdempotencyConflict: the id belongs to another workflow, tenant or input.
    """
    if not isinstance(workflow, Workflow):
        raise errors.ContractError(
            f"{workflow!r} is not a workflow; decorate it with @ef.workflow(name)"
        )
    normalized = digests.to_jsonable(input, path="input")
    workflow.check_input(input)
    input_digest = digests.digest(normalized)
    run_id = machine_io.new_id("run") if run_id is None else digests.check_id(run_id, path="run_id")
    existing = port.store.get_run(run_id)
    if existing is not None:
        if existing.tenant != port.tenant or existing.workflow != workflow.name:
            raise errors.IdempotencyConflict(
                f"run id {run_id!r} is already used by another workflow or tenant",
                run_id=run_id,
            )
        if existing.input_digest != input_digest:
            raise errors.IdempotencyConflict(
                f"run {run_id} was started with another input; a new request needs a new run id",
                run_id=run_id,
            )
        return existing, None
    now = port.clock()
    run = records.RunRecord(
        run_id=run_id,
        tenant=port.tenant,
        workflow=workflow.name,
        workflow_version=workflow.version,
        workflow_code=workflow.code_digest,
        input=normalized,
        input_digest=input_digest,
        status=RunStatus.RUNNING,
        output=None,
        error=None,
        next_action=NextAction.EXECUTE,
        generation=0,
        created_at=now,
        updated_at=now,
        lease_owner=port.owner if leased else None,
        lease_token=1 if leased else 0,
        lease_expires_at=now + port.lease_ttl if leased else None,
    )
    if workflow.name == guard.WORKFLOW_NAME:
        # A guarded call: the host's ids become searchable columns (``runs(scope=...)``).
        run = dataclasses.replace(
            run, scope=normalized.get("scope"), call_id=normalized.get("call_id")
        )
    batch = Batch(run_id, lease_token=None, new_run=run)
    batch.event("run_started", now, workflow=workflow.name, input_digest=input_digest)
    return run, batch


def _raced(port: Port, run: records.RunRecord, refused: Exception) -> records.RunRecord:
    """After a refused insert: the run another caller created meanwhile with the same id and
    input; otherwise the insert's error is raised again."""
    raced = port.store.get_run(run.run_id)
    if raced is not None and raced.input_digest == run.input_digest:
        return raced
    raise refused
