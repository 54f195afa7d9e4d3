"""Executing a run: claiming it, running its workflow from the top until it ends, pauses or is
stopped, and recording how it ended.

A run is executed by re-running its workflow function from the top: steps the ledger confirmed
return their recorded output, the first step that is not confirmed continues through the decision
table with its original key. There is no separate "replay log": the ledger's facts are the history.

One implementation serves sync and async workflows: ``_passes`` is a generator that decides, and
asks its driver (``_execute`` or ``_execute_async``) to run a pass of the workflow, to run
blocking work, or to commit; only how the driver waits differs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Generator
from typing import Any

from effectflow import digests, errors, telemetry
from effectflow.contracts.workflow import Workflow
from effectflow.ledger import records
from effectflow.ledger.records import ControlKind, NextAction, RunStatus, StepStatus
from effectflow.ledger.store import Batch
from effectflow.runtime import changed_code, context, driver, leases, machine_io, outage, stopping
from effectflow.runtime import state as state_mod
from effectflow.runtime.control import Control
from effectflow.runtime.port import Port


@dataclasses.dataclass(frozen=True)
class _Pass:
    """Run the workflow once from the top; answered with its output (or its exception thrown)."""


@dataclasses.dataclass(frozen=True)
class _Blocking:
    """Blocking work (ledger reads, tool calls): the asyncio driver runs it on a worker thread."""

    work: Callable[[], Any]


_PASS = _Pass()
_Ask = _Pass | _Blocking | machine_io.Commit


class Executor:
    """Claims runs for this process and executes them."""

    def __init__(self, port: Port, held: leases.Leases) -> None:
        self._port = port
        self._leases = held

    def drive(
        self,
        run: records.RunRecord,
        workflow: Workflow[..., Any],
        *,
        claimed: bool = False,
        redrive: str | None = None,
    ) -> records.RunRecord:
        """Execute ``run`` here until it ends, pauses or is stopped (claiming its lease unless
        this process holds it already); ``redrive`` names the step a failed run failed at."""
        if workflow.is_async:
            return asyncio.run(self.drive_async(run, workflow, claimed=claimed, redrive=redrive))
        state = self._prepare(run, workflow, claimed=claimed)
        state.redrive_step = redrive
        telemetry.run_started(state.run.run_id, state.run.workflow)
        try:
            return telemetry.run_ended(self._execute(state, workflow))
        finally:
            telemetry.run_left(state.run.run_id)
            self._leases.drop(state)

    async def drive_async(
        self,
        run: records.RunRecord,
        workflow: Workflow[..., Any],
        *,
        claimed: bool = False,
        redrive: str | None = None,
    ) -> records.RunRecord:
        """``drive`` on the caller's event loop (async workflows run on it)."""
        state = self._prepare(run, workflow, claimed=claimed)
        state.redrive_step = redrive
        telemetry.run_started(state.run.run_id, state.run.workflow)
        try:
            if not workflow.is_async:
                return telemetry.run_ended(await asyncio.to_thread(self._execute, state, workflow))
            return telemetry.run_ended(await self._execute_async(state, workflow))
        finally:
            telemetry.run_left(state.run.run_id)
            self._leases.drop(state)

    def apply_control(
        self, run: records.RunRecord, workflow: Workflow[..., Any], control: Control
    ) -> records.RunRecord:
        """Apply a control request this process recorded with the run's lease, here and now."""
        state = self._prepare(run, workflow, claimed=True)
        state.control = control
        try:
            return stopping.finish(self._port, state)
        finally:
            self._leases.drop(state)

    # -- the two drivers of one execution ---------------------------------------------------------

    def _execute(
        self, state: state_mod.RunState, workflow: Workflow[..., Any]
    ) -> records.RunRecord:
        passes = self._passes(state)
        answer: Any = None
        error: BaseException | None = None
        while True:
            try:
                ask = passes.send(answer) if error is None else passes.throw(error)
            except StopIteration as stop:
                ended: records.RunRecord = stop.value
                return ended
            answer, error = None, None
            if isinstance(ask, _Pass):
                try:
                    answer = workflow.fn(context.Context(self._port, state), **state.run.input)
                except BaseException as exc:  # handled (or re-raised) by ``_passes``
                    error = exc
            elif isinstance(ask, _Blocking):
                answer = ask.work()
            else:
                self._port.writer.commit(state, ask.batch)

    async def _execute_async(
        self, state: state_mod.RunState, workflow: Workflow[..., Any]
    ) -> records.RunRecord:
        passes = self._passes(state)
        answer: Any = None
        error: BaseException | None = None
        while True:
            try:
                ask = passes.send(answer) if error is None else passes.throw(error)
            except StopIteration as stop:
                ended: records.RunRecord = stop.value
                return ended
            answer, error = None, None
            if isinstance(ask, _Pass):
                try:
                    ctx = context.AsyncContext(self._port, state)
                    answer = await workflow.fn(ctx, **state.run.input)
                except BaseException as exc:  # handled (or re-raised) by ``_passes``
                    error = exc
            elif isinstance(ask, _Blocking):
                answer = await asyncio.to_thread(ask.work)
            else:
                await self._port.writer.commit_async(state, ask.batch)

    def _passes(self, state: state_mod.RunState) -> Generator[_Ask, Any, records.RunRecord]:
        """Run the workflow from the top until it ends, pauses, or is stopped by a control."""
        port = self._port
        while True:
            if state.control is not None:
                ended: records.RunRecord = yield _Blocking(
                    functools.partial(stopping.finish, port, state)
                )
                return ended
            try:
                output = yield _PASS
            except machine_io.Restart:
                state.restart()
                continue
            except machine_io.Stop:
                continue
            except machine_io.Release:
                return self._release(state)
            except machine_io.Suspend:
                return port.run(state.run.run_id)
            except (errors.LeaseLost, errors.CommitInDoubt):
                raise  # nothing more is written; the run is left for recovery
            except errors.LedgerUnavailable as exc:
                if exc.run_id is None:
                    # A read the ledger could not answer: not the workflow's failure. The store
                    # does not know the run; say which one is left for recovery.
                    raise outage.unavailable(state.run.run_id, exc) from exc
                raise
            except errors.AbandonGoal as exc:
                self._abandon(state, exc)
                continue
            except Exception as exc:
                return self._finish_failed(state, exc)
            if state.stop_requested():
                continue  # a cancel arrived with the last step's write: honour it
            if (yield _Blocking(functools.partial(self._changed_under, state))):
                return port.run(state.run.run_id)
            try:
                batch = self._success(state, output)
            except errors.ArgumentError as exc:
                return self._finish_failed(state, exc)
            yield machine_io.Commit(batch)
            return port.run(state.run.run_id)

    # -- claiming -------------------------------------------------------------------------------

    def _prepare(
        self, run: records.RunRecord, workflow: Workflow[..., Any], *, claimed: bool = False
    ) -> state_mod.RunState:
        """The in-memory state of a run this process now holds (claiming it unless it already
        did: a run it just created, or one a worker claimed in bulk)."""
        port = self._port
        held = run if claimed else self._claim(run)
        # A run created by this very call has no steps yet: skip the read.
        fresh = claimed and run.lease_owner == port.owner and run.lease_token == 1
        steps = [] if fresh else port.store.steps(run.run_id)
        state = state_mod.RunState(
            held, workflow, steps, attempts_of=port.store.attempts, claimed_at=port.clock()
        )
        if not fresh:
            self._note_code_change(state, workflow)
        self._leases.hold(state)
        return state

    def _claim(self, run: records.RunRecord) -> records.RunRecord:
        port = self._port
        now = port.clock()
        held = (
            run.lease_owner is not None
            and run.lease_owner != port.owner
            and (run.lease_expires_at or 0) > now
            and leases.owner_alive(run.lease_owner)
        )
        if held:
            host, _, rest = (run.lease_owner or "").partition(":")
            pid = rest.split(":", 1)[0]
            until = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(run.lease_expires_at or 0))
            raise errors.LeaseLost(
                f"run {run.run_id} is already running in process {pid} on {host} (its lease "
                f"holds until {until}, {max(0.0, (run.lease_expires_at or 0) - now):.0f} s from "
                "now, and is renewed while it runs). Nothing was done: wait for it to finish, "
                "or stop that process; once it is gone, `effectflow recover` (or any worker) "
                "continues the run",
                run_id=run.run_id,
            )
        claimed = port.store.claim(
            run.run_id,
            owner=port.owner,
            expected_token=run.lease_token,
            ttl=port.lease_ttl,
            now=now,
        )
        if claimed is None:
            raise errors.LeaseLost(
                f"run {run.run_id} was claimed by another worker first", run_id=run.run_id
            )
        telemetry.claimed(run.run_id, run.lease_owner, port.owner)
        return claimed

    def _note_code_change(self, state: state_mod.RunState, workflow: Workflow[..., Any]) -> None:
        """Record (with the run's next write) that it resumes under another version or another
        code of its workflow than it last ran with: a fact an operator reads in its audit."""
        run = state.run
        changed_version = run.workflow_version != workflow.version
        changed_code = run.workflow_code not in (None, workflow.code_digest)
        if not changed_version and not changed_code and run.workflow_code is not None:
            return
        state.pending.run_changes.update(
            workflow_version=workflow.version, workflow_code=workflow.code_digest
        )
        if changed_version or changed_code:
            state.pending.event(
                "workflow_version_changed",
                self._port.clock(),
                from_version=run.workflow_version,
                to_version=workflow.version,
                from_code=run.workflow_code,
                to_code=workflow.code_digest,
            )

    # -- how a pass ends --------------------------------------------------------------------------

    def _release(self, state: state_mod.RunState) -> records.RunRecord:
        """The process is shutting down between two steps: keep what is recorded, give the lease up
        so another worker continues the run at once."""
        port = self._port
        pending = state.batch()
        if not pending.empty:
            port.writer.commit(state, pending)
        port.store.release(state.run.run_id, token=state.run.lease_token)
        return port.run(state.run.run_id)

    def _abandon(self, state: state_mod.RunState, exc: errors.AbandonGoal) -> None:
        """The workflow gave its goal up: record that, so a crash from here on compensates rather
        than re-running the workflow."""
        if state.control is not None:
            return  # an operator's cancel or compensate came first: it decides how the run ends
        port = self._port
        now = port.clock()
        control = Control(ControlKind.COMPENSATE, str(exc), "workflow", now)
        batch = state.batch()
        # Compare-and-swap like a person's request: an operator's cancel or compensate recorded
        # meanwhile wins, and this one is dropped rather than written over it.
        batch.expect_run(control=None)
        batch.run_changes.update(control=control.to_json())
        batch.event("goal_abandoned", now, reason=str(exc))
        try:
            port.writer.commit(state, batch)
        except errors.StaleState:
            state.control = Control.of(port.run(state.run.run_id).control)
            return
        state.control = control

    def _changed_under(self, state: state_mod.RunState) -> bool:
        """Whether the workflow ended without reaching a recorded step with an effect (its code
        changed since: a step removed or renamed); if so, that step is settled from its record and
        the run paused for a person (``changed_code.settle_unreached``)."""
        unreached = changed_code.unreached(state, None)
        if not unreached:
            return False
        why = (
            "the workflow ended without reaching the recorded step(s) "
            + ", ".join(s.step_id for s in unreached)
            + ": its code changed since they ran (a step removed or renamed)"
        )
        with contextlib.suppress(machine_io.Suspend):  # the run is paused: that is the point
            driver.drive(
                self._port, state, changed_code.settle_unreached(self._port, state, unreached, why)
            )
        return True

    def _success(self, state: state_mod.RunState, output: Any) -> Batch:
        """The batch that ends a run with its output (and every write still deferred).

        Raises:
            errors.ArgumentError: the output cannot be recorded as JSON.
        """
        recorded = digests.to_jsonable(output, path="output")
        now = self._port.clock()
        batch = state.batch()
        batch.run_changes.update(
            status=RunStatus.SUCCEEDED,
            output=recorded,
            error=None,
            next_action=NextAction.NONE,
            lease_owner=None,
            lease_expires_at=None,
        )
        batch.event("run_succeeded", now, output_digest=digests.digest(recorded))
        return batch

    def _finish_failed(self, state: state_mod.RunState, exc: Exception) -> records.RunRecord:
        """A failure ends the run and lists its effects; nothing is compensated (the decision
        table's ``technical_failure`` row, docs/decision-table.md)."""
        port = self._port
        now = port.clock()
        effects = [
            s.effect_id
            for s in state.steps.values()
            if s.effect_id is not None and s.status is StepStatus.CONFIRMED
        ]
        error: dict[str, Any] = {
            "code": getattr(exc, "code", "workflow_error"),
            "type": type(exc).__name__,
            "message": str(exc),
            "confirmed_effects": effects,
            # The effects it may have caused: each stays listed in ``attention()`` for a person.
            "in_doubt_effects": [
                s.effect_id
                for s in state.steps.values()
                if s.effect_id is not None and s.status in records.IN_DOUBT_STATUSES
            ],
        }
        step_id = getattr(exc, "step_id", None)
        if isinstance(step_id, str) and step_id:
            error["step_id"] = step_id
        batch = state.batch()
        batch.run_changes.update(
            status=RunStatus.FAILED,
            error=error,
            next_action=NextAction.NONE,
            lease_owner=None,
            lease_expires_at=None,
        )
        batch.event("run_failed", now, error=error)
        port.writer.commit(state, batch)
        return port.run(state.run.run_id)
