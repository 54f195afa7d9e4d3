"""``ef.Runtime``: start, resume, recover and reconcile runs; read the ledger; settle unknowns.

A run is executed by re-running its workflow function from the top: steps the ledger confirmed
return their recorded output, the first step that is not confirmed continues through the decision
table with its original key. There is no separate "replay log": the ledger's facts are the history.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import socket
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from effectflow import digests, errors
from effectflow.contracts import registry as registry_module
from effectflow.contracts.tool import Tool
from effectflow.contracts.workflow import Workflow
from effectflow.ledger import records
from effectflow.ledger.local import LocalTransaction
from effectflow.ledger.records import NextAction, RunStatus, StepStatus
from effectflow.ledger.store import AuditProblem, Batch, LedgerStore, open_store
from effectflow.runtime import context, ending, engine, outage, people, requests, views
from effectflow.runtime import group_commit as group_commit_mod
from effectflow.runtime import guard as guard_mod
from effectflow.runtime import leases as leases_mod
from effectflow.runtime import state as state_mod
from effectflow.runtime.faults import NO_FAULTS, FaultPlan

#: Where the ledger lives when no URL is given.
DEFAULT_URL = "sqlite:///effectflow.db"
#: How many times a cancel or compensate is decided again when the run's lease or status moved
#: under it (a worker claimed or paused it) before its request could be recorded.
_CONTROL_RACES = 3


def _host() -> str:
    return socket.gethostname()


def _owner_alive(owner: str) -> bool:
    """Whether a lease owner (``host:pid:nonce``) may still be alive.

    On this host a dead pid proves the owner crashed, so its runs are recoverable at once instead of
    after the lease expires. On another host only the lease's expiry can tell.
    """
    host, _, rest = owner.partition(":")
    pid_text = rest.split(":", 1)[0]
    if host != _host() or not pid_text.isdigit():
        return True
    pid = int(pid_text)
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return _pid_is_running(pid)


def _pid_is_running(pid: int) -> bool:
    # A killed child that was not reaped yet is a zombie: it exists but will never write again.
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _awaits_approval(step: records.StepRecord) -> bool:
    return (
        step.status is StepStatus.PENDING and (step.error or {}).get("code") == "approval_required"
    )


class Runtime:
    """The entry point: one ledger, one tenant."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        tenant: str = "default",
        faults: FaultPlan | None = None,
        clock: Callable[[], float] = time.time,
        lease_ttl: float = leases_mod.DEFAULT_LEASE_TTL,
        registry: registry_module.Registry | None = None,
        group_commit: bool | None = None,
        ledger_retry: float = 30.0,
    ) -> None:
        if not tenant or not isinstance(tenant, str):
            raise errors.ContractError("tenant must be a non-empty string")
        digests.check_id(tenant, path="tenant")
        #: The ledger.
        self.store: LedgerStore = open_store(url)
        #: How long a call's outcome write is retried through a ledger outage (seconds) before
        #: the run is left for recovery (``outage``).
        self.ledger_retry = ledger_retry
        self.store.bound_waits(ledger_retry)
        #: The tenant every run and key of this runtime belongs to.
        self.tenant = tenant
        #: Fault points (tests); no-op by default.
        self.faults = faults or NO_FAULTS
        #: The clock (epoch seconds); injectable for tests of retention and deadlines.
        self.clock = clock
        #: How long a lease lasts without a write or a heartbeat renewing it: how long a run whose
        #: process died on another host waits before a worker takes it over. The heartbeat renews
        #: held leases every third of it, so a shorter TTL costs that many more renewal writes
        #: (``leases.DEFAULT_LEASE_TTL`` explains the default of 30 s).
        self.lease_ttl = lease_ttl
        #: Where tools and workflows are found by name.
        self.registry = registry or registry_module.DEFAULT
        #: This process's identity as a lease owner.
        self.owner = f"{_host()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        # Every runtime can run (and recover) guarded calls.
        self.registry.add_workflow(guard_mod.WORKFLOW)
        #: The runs this runtime executes now, and the heartbeat renewing their leases.
        self.leases = leases_mod.Leases(self)
        #: Shares transactions between the writes of runs executed concurrently on threads (None:
        #: off). Unless told, the backend's measured default (BENCHMARKS.md, "Workers"): on for
        #: SQLite, off for PostgreSQL, which flushes concurrent commits together by itself.
        threads = self.store.group_commit_default if group_commit is None else group_commit
        self.committer = (
            group_commit_mod.GroupCommitter(
                self.store,
                lease_ttl=lease_ttl,
                clock=clock,
                max_parallel=self.store.max_concurrent_writers,
            )
            if threads
            else None
        )
        #: The same for runs driven by asyncio (``start_async``): coroutines that commit in the
        #: same turn of the event loop share a transaction (None: off). On unless
        #: ``group_commit=False``, on both backends: with no threads there is no GIL handoff or
        #: lock held across a round trip to pay for it (BENCHMARKS.md, "Async group commit").
        self.async_committer = (
            group_commit_mod.AsyncGroupCommitter(self.store, lease_ttl=lease_ttl, clock=clock)
            if group_commit is not False
            else None
        )
        #: Set when the process is shutting down: runs stop at their next step and are released.
        self.draining = False

    # -- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the heartbeat and close the ledger."""
        self.leases.close()
        self.store.close()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- starting and driving runs --------------------------------------------------------------

    def start(
        self, workflow: Workflow[..., Any], /, *, run_id: str | None = None, **input: Any
    ) -> records.RunRecord:
        """Run ``workflow`` in this process until it succeeds, fails or pauses.

        Starting with the id of an existing run and the same input returns that run (driving it on
        if it was interrupted); with another input it raises ``IdempotencyConflict``.
        """
        run, fresh = self._create(workflow, run_id, input, leased=True)
        if run.status is not RunStatus.RUNNING or (not fresh and self.leases.holds(run.run_id)):
            # Ended, paused, or being executed by this process now (another caller started it
            # a moment ago): taking its lease over would stop that caller's execution.
            return run
        return self._drive(run, workflow, claimed=fresh)

    async def start_async(
        self, workflow: Workflow[..., Any], /, *, run_id: str | None = None, **input: Any
    ) -> records.RunRecord:
        """The asyncio twin of ``start`` (async workflows run on the caller's loop).

        Runs started together on one loop share their commits (group commit), as threads do with
        ``start``, but without threads: see ``group_commit.AsyncGroupCommitter``.
        """
        run, fresh = await self._create_async(workflow, run_id, input)
        if run.status is not RunStatus.RUNNING or (not fresh and self.leases.holds(run.run_id)):
            return run  # as in ``start``
        return await self._drive_async(run, workflow, claimed=fresh)

    def guard(
        self,
        tool: Tool[..., Any] | str,
        arguments: Mapping[str, Any],
        /,
        *,
        scope: str,
        call_id: str,
        known_call_ids: Collection[str] = (),
        new_request: bool = False,
    ) -> guard_mod.Guarded:
        """Run one contracted tool call through the whole write path when the host (an agent
        framework, a durable engine) owns the control flow, and return its recorded result.

        ``scope`` is the host's durable identity (a thread and checkpoint namespace, a workflow
        id, a session) and ``call_id`` the call's (the model's tool-call id, the host's step id).
        The same pair again — a host replay — is the same call: its recorded result, or the
        settling of the call left in doubt by the decision table; never a second effect. A new
        call id with the same tool and arguments in the scope (a call regenerated after the host
        lost the model's turn) is the same logical operation unless the contract says
        ``each_call_new``, or the latest such call that happened is among ``known_call_ids`` (the
        calls whose *result* the host's conversation shows: the model asked again knowingly, a new
        request; a call it was told may have happened does not count), or
        ``new_request`` says the host's call id names a request of its own (an MCP client's
        ``operation_id``). A repeat is never made while an earlier call of the same operation may
        still have happened: that call is settled first (recovered, looked up), or the person is
        asked about it. A replay of a call paused in doubt looks it up again before asking a
        person. Each call is a run of ``effectflow.guarded_call`` whose scope and call id are
        searchable: ``runs(scope=, call_id=)``, ``effectflow runs --scope``, the API's
        ``?scope=``, the console's search.

        Raises:
            errors.NeedsPerson: the call may have happened and a person must say, or it waits
                for an approval; ``rt.resolve`` / ``rt.approve`` answer it, the next replay
                returns the result.
            errors.ArgumentError, errors.ContractError: bad input; nothing was recorded.
            errors.StepFailed: the provider refused (``StepRejected``), or nothing committed and
                the retry budget is spent.
        """
        return guard_mod.call(
            self,
            tool,
            arguments,
            scope=scope,
            call_id=call_id,
            known_call_ids=known_call_ids,
            new_request=new_request,
        )

    async def guard_async(
        self,
        tool: Tool[..., Any] | str,
        arguments: Mapping[str, Any],
        /,
        *,
        scope: str,
        call_id: str,
        known_call_ids: Collection[str] = (),
        new_request: bool = False,
    ) -> guard_mod.Guarded:
        """The asyncio twin of ``guard`` (the call runs on a worker thread, off the loop)."""
        return await guard_mod.call_async(
            self,
            tool,
            arguments,
            scope=scope,
            call_id=call_id,
            known_call_ids=known_call_ids,
            new_request=new_request,
        )

    def submit(
        self, workflow: Workflow[..., Any], /, *, run_id: str | None = None, **input: Any
    ) -> records.RunRecord:
        """Record a run without executing it; a worker (``effectflow worker``) or ``recover`` picks
        it up."""
        return self._create(workflow, run_id, input, leased=False)[0]

    def resume(self, run_id: str, *, by: str = "runtime") -> records.RunRecord:
        """Continue a run: an interrupted one, a paused one, or (redrive) a failed one.

        Confirmed steps keep their recorded results; the first step that is not confirmed continues
        per the decision table, with its original key. Resuming a paused or failed run starts a new
        generation, which gives its retry and lookup budgets a fresh start. A step whose failure
        the workflow handled (it caught the error and went on) replays that failure; only the step
        a failed run failed *at* is called again by its redrive.
        """
        run = self._require_run(run_id)
        ending_open = run.control is not None and (
            not run.status.terminal
            or run.next_action in (NextAction.ASK_A_PERSON, NextAction.RECONCILE)
        )
        if not ending_open and (
            run.status is RunStatus.SUCCEEDED
            or (run.status.terminal and run.status is not RunStatus.FAILED)
        ):
            return run
        workflow = self.registry.workflow(run.workflow)
        redrive = None
        if run.status is RunStatus.FAILED:
            redrive = (run.error or {}).get("step_id")
        if run.status is not RunStatus.RUNNING:
            run = self._reopen(run, by=by)
        return self._drive(run, workflow, redrive=redrive if isinstance(redrive, str) else None)

    def recover(
        self,
        *,
        limit: int = 100,
        on_run: Callable[[records.RunRecord], None] | None = None,
    ) -> list[records.RunRecord]:
        """Drive every run nobody executes: interrupted ones (their lease expired, their owner is
        a dead pid on this host, or this runtime stopped executing them, e.g. after a ledger
        error) and ones never claimed. ``on_run`` hears of each run as it is left (progress)."""
        now = self.clock()
        candidates = {r.run_id: r for r in self.store.runs_to_recover(now=now, limit=limit)}
        for run in self.store.leased_running_runs(limit=limit):
            if self._owner_gone(run) is not None:
                candidates.setdefault(run.run_id, run)
        finished = []
        for run in candidates.values():
            if run.tenant != self.tenant:
                continue
            try:
                workflow = self.registry.workflow(run.workflow)
                left = self._drive(run, workflow)
            except errors.LeaseLost:
                continue
            finished.append(left)
            if on_run is not None:
                on_run(left)
        return finished

    def _owner_gone(self, run: records.RunRecord) -> str | None:
        """How we know the owner of ``run``'s lease executes it no more, or None if it may.

        Another process's owner is gone when its pid is dead on this host; this runtime's own owner
        when it stopped executing the run (it gave up after an error) without giving the lease up.
        Only the lease's expiry can tell for an owner on another host.
        """
        owner = run.lease_owner
        if owner is None or run.status not in views.EXECUTING:
            return None
        if owner == self.owner:
            return "this process stopped executing it" if self.leases.stopped(run.run_id) else None
        if not _owner_alive(owner):
            pid = owner.split(":")[1]
            return f"process {pid} on this host is not running"
        return None

    def interruption(self, run: records.RunRecord) -> str | None:
        """Why ``run`` is interrupted (running, but nobody executes it), or None."""
        return views.interruption(run, now=self.clock(), owner_gone=self._owner_gone(run))

    def run_view(self, run: records.RunRecord) -> views.RunView:
        """``run`` as people see it: with whether it is interrupted (``effectflow runs``, ``show``,
        the API and the console show this)."""
        return views.RunView(run, self.interruption(run))

    def reconcile(self, *, limit: int = 100) -> list[records.RunRecord]:
        """Settle unknown outcomes through lookup tools, and continue the runs they settle.

        Each paused run with an in-doubt step is resumed in a new generation: the step machine looks
        the effect up by key, then by external id; confirmed -> recorded and the run continues; not
        committed -> retried with the original key; still unknown -> backs off, then
        ``needs_attention`` with the run paused again. Runs whose in-doubt steps have no lookup (nor a
        key the provider honours) are left for a person; the result lists every run touched.
        """
        touched = []
        paused = self.store.list_runs(
            tenant=self.tenant,
            statuses=[RunStatus.PAUSED, RunStatus.CANCELLED_PENDING_RECONCILIATION],
            limit=limit,
        )
        for run in paused:
            doubtful = [
                s for s in self.store.steps(run.run_id) if s.status in records.IN_DOUBT_STATUSES
            ]
            if not doubtful:
                if run.status is RunStatus.CANCELLED_PENDING_RECONCILIATION:
                    # Its unknowns were settled meanwhile (a late answer, a lookup elsewhere):
                    # the cancel can conclude.
                    touched.append(self.resume(run.run_id, by="reconciler"))
                continue
            if not any(self._can_settle(s) for s in doubtful):
                continue
            touched.append(self.resume(run.run_id, by="reconciler"))
        touched.extend(self.recover(limit=limit))
        return touched

    def _can_settle(self, step: records.StepRecord) -> bool:
        try:
            contract = self.registry.tool(step.tool).contract
        except errors.ContractError:
            return False
        return contract.confirm is not None or contract.idempotency.supported

    # -- stopping runs ----------------------------------------------------------------------------

    def cancel(
        self, run_id: str, *, reason: str | None = None, by: str = "operator"
    ) -> records.Inventory:
        """Cancel a run (DESIGN §5) and return what it left in the world.

        Steps not started do not start; a call in progress at the provider is stopped where its tool
        declares a cancel operation, else it lands and is classified; confirmed effects are never
        marked undone; unknown effects are looked up once and otherwise queued for reconciliation;
        then compensations run for steps whose trigger includes ``cancelled``. The run ends
        ``cancelled`` (no effects), ``cancelled_with_effects`` or
        ``cancelled_pending_reconciliation`` (moved on by ``rt.reconcile`` once the unknowns
        settle). A run another live worker holds gets the request and stops at its next step
        boundary; the inventory then lists its call in flight and the run is ``cancelling``.
        """
        run = self._require_run(run_id)
        for _ in range(_CONTROL_RACES):
            cancelled = (
                run.control is not None
                and run.control.get("kind") == ending.CANCEL
                and run.status is not RunStatus.CANCELLED_PENDING_RECONCILIATION
            )
            # A cancel already recorded answers this one: a worker is applying it (it holds the
            # run), or it was applied; only a run whose cancelling worker died is taken over.
            if run.status.terminal or (
                cancelled and (self._held_elsewhere(run) or run.status is not RunStatus.RUNNING)
            ):
                return ending.inventory(self, run)
            control = {"kind": ending.CANCEL, "reason": reason, "by": by, "at": self.clock()}
            held = self._held_elsewhere(run)
            workflow = None if held else self.registry.workflow(run.workflow)
            try:
                taken = self._record_control(run, control, RunStatus.CANCELLING, take=not held)
            except errors.StaleState as exc:
                run, answered = self._raced_control(run, exc, control)
                if answered:  # another cancel was recorded first: it is this one's answer
                    return ending.inventory(self, run)
                continue
            if workflow is None:
                flying = frozenset(ending.cancel_calls_in_flight(self, run))
                return ending.inventory(self, self._require_run(run_id), in_flight=flying)
            return ending.inventory(self, self._apply_control(taken, workflow, control))
        raise self._kept_moving(run_id, ending.CANCEL)

    def compensate(self, run_id: str, *, reason: str, by: str = "operator") -> records.RunRecord:
        """The business goal of a run is abandoned: run the compensation policy on its effects.

        Each confirmed effect whose tool names a compensation and whose step's trigger includes
        ``goal_abandoned`` gets a compensation effect (newest first), with an approval where the
        contract or money requires one; irreversible effects stay confirmed. Never call this for a
        technical failure: failed runs keep their effects as facts.

        Raises:
            errors.StaleState: another control (a cancel) was recorded on the run while this one
                was decided; nothing was recorded.
        """
        if not reason:
            raise errors.ArgumentError("compensate needs a reason: the business condition")
        run = self._require_run(run_id)
        for _ in range(_CONTROL_RACES):
            compensating = run.control is not None and run.control.get("kind") == ending.COMPENSATE
            if run.status is RunStatus.COMPENSATED or (compensating and self._held_elsewhere(run)):
                return run  # done, or a worker is applying the compensate already recorded
            control = {"kind": ending.COMPENSATE, "reason": reason, "by": by, "at": self.clock()}
            held = self._held_elsewhere(run)
            workflow = None if held else self.registry.workflow(run.workflow)
            try:
                taken = self._record_control(run, control, None, take=not held)
            except errors.StaleState as exc:
                run, answered = self._raced_control(run, exc, control)
                if answered:  # another compensate was recorded first: it answers this one
                    return run
                continue
            if workflow is None:
                return self._require_run(run_id)
            return self._apply_control(taken, workflow, control)
        raise self._kept_moving(run_id, ending.COMPENSATE)

    def approve(
        self,
        run_id: str,
        step_id: str,
        *,
        approver: str,
        approval_id: str,
        note: str | None = None,
    ) -> records.RunRecord:
        """A person approves a step waiting for approval (a financial write, a compensation); the
        run then continues in this process. The approval id is recorded on the effect.

        Raises:
            errors.StaleState: the step is not waiting for an approval.
            errors.IdempotencyConflict: ``approval_id`` was already used for something else.
        """
        return people.approve(
            self, run_id, step_id, approver=approver, approval_id=approval_id, note=note
        )

    def reject(self, run_id: str, step_id: str, *, by: str, reason: str) -> records.RunRecord:
        """A person declines a step waiting for approval: it is never called, and the run goes
        on in this process with the step ``rejected`` — the workflow's ``ctx.call`` raises
        ``StepRejected`` (code ``approval_declined``), which it may handle like a provider's
        refusal; a guarded call answers with that error. Of an approval and a decline given at the
        same moment, exactly one is recorded; the same decline again is a no-op.

        Raises:
            errors.StaleState: the step is not waiting for an approval (approved, declined, or
                never asked); nothing is recorded.
            errors.ArgumentError: ``by`` or ``reason`` is empty.
        """
        return people.reject(self, run_id, step_id, by=by, reason=reason)

    @staticmethod
    def owner_alive(owner: str) -> bool:
        """Whether a lease owner may still be alive (a dead pid on this host proves it is not)."""
        return _owner_alive(owner)

    def _held_elsewhere(self, run: records.RunRecord) -> bool:
        """Whether a live worker (another process, or another thread here) executes the run."""
        return (
            run.status in (RunStatus.RUNNING, RunStatus.CANCELLING)
            and run.lease_owner is not None
            and (run.lease_expires_at or 0) > self.clock()
            and _owner_alive(run.lease_owner)
        )

    def _record_control(
        self,
        run: records.RunRecord,
        control: dict[str, Any],
        status: RunStatus | None,
        *,
        take: bool,
    ) -> records.RunRecord:
        """Record an operator's control request on ``run`` as it was read (compare-and-swap).

        The batch is refused (``StaleState``) unless the run still has the control, status and
        lease it was read with, so of two concurrent requests (two cancels, a cancel and a
        compensate) exactly one is recorded. With ``take`` the same write takes the run's lease for
        this process, which then applies the control (no worker holds the run); without, it is left
        for the worker holding the run, which reads it with its next write.

        Returns the run as recorded.
        """
        now = self.clock()
        batch = Batch(run.run_id, lease_token=None)
        batch.expect_run(
            control=(run.control,),
            status=run.status,
            lease_token=run.lease_token,
            lease_owner=(run.lease_owner,),
        )
        changes: dict[str, Any] = {"control": control}
        if status is not None:
            changes["status"] = status
        if take:
            changes.update(
                error=None,
                lease_owner=self.owner,
                lease_token=run.lease_token + 1,
                lease_expires_at=now + self.lease_ttl,
            )
        batch.run_changes.update(changes)
        batch.event(
            f"{control['kind']}_requested", now, actor=control["by"], reason=control.get("reason")
        )
        self.store.apply(batch, lease_ttl=self.lease_ttl, now=now)
        return dataclasses.replace(run, **changes, updated_at=now)

    def _raced_control(
        self, seen: records.RunRecord, refused: errors.StaleState, control: dict[str, Any]
    ) -> tuple[records.RunRecord, bool]:
        """After the store refused a control request: the run as it is now, and whether a request
        of the same kind was recorded meanwhile (it answers this one). When only the run's lease or
        status moved, the caller decides again on the fresh run.

        Raises:
            errors.StaleState: a request of another kind was recorded first; this one is refused.
        """
        fresh = self._require_run(seen.run_id)
        if fresh.control == seen.control:
            return fresh, False
        won = fresh.control or {}
        if won.get("kind") == control["kind"]:
            return fresh, True
        raise errors.StaleState(
            f"run {seen.run_id}: a {won.get('kind')} request by {won.get('by')} was recorded while "
            f"this {control['kind']} was being decided; nothing was recorded. Look at the run as "
            "it is now and decide again",
            run_id=seen.run_id,
        ) from refused

    def _kept_moving(self, run_id: str, kind: str) -> errors.StaleState:
        return errors.StaleState(
            f"run {run_id} changed each time the {kind} was about to be recorded; nothing was "
            "recorded: try again",
            run_id=run_id,
        )

    def _apply_control(
        self, run: records.RunRecord, workflow: Workflow[..., Any], control: dict[str, Any]
    ) -> records.RunRecord:
        """Apply a control request this process recorded with the run's lease, here and now."""
        state = self._prepare(run, workflow, claimed=True)
        state.control = control
        try:
            return ending.finish(self, state)
        finally:
            self.leases.drop(state)

    # -- a person's decisions -------------------------------------------------------------------

    def resolve(
        self,
        effect_id: str,
        *,
        committed: bool,
        evidence: dict[str, Any],
        by: str,
        expected_version: int | None = None,
        decision_id: str | None = None,
    ) -> records.EffectRecord:
        """A person settles an unknown effect: it happened (``committed=True``) or it did not.

        The audit log records who decided and on what evidence. ``resume`` then continues the run:
        a confirmed step returns the recorded result, a not-committed one is retried with its
        original key.

        Raises:
            errors.EffectNotFound: no such effect for this tenant.
            errors.StaleState: the effect moved on (another version, or it is no longer unknown).
            errors.IdempotencyConflict: the same ``decision_id`` was used with other parameters.
        """
        return people.resolve(
            self,
            effect_id,
            committed=committed,
            evidence=evidence,
            by=by,
            expected_version=expected_version,
            decision_id=decision_id,
        )

    def _effect_id_field(self, tool_ref: str) -> str | None:
        try:
            return self.registry.tool(tool_ref).contract.effect_id
        except errors.ContractError:
            return None

    # -- reads ----------------------------------------------------------------------------------

    def run(self, run_id: str) -> records.RunRecord:
        """One run of this tenant.

        Raises:
            errors.RunNotFound: no such run for this tenant.
        """
        return self._require_run(run_id)

    def runs(
        self,
        *,
        status: str | Sequence[str] | None = None,
        limit: int = 100,
        scope: str | None = None,
        call_id: str | None = None,
    ) -> list[records.RunRecord]:
        """This tenant's runs, newest first; ``scope`` (and ``call_id``) find the guarded calls
        a host made under its own ids (see ``guard``)."""
        statuses = [status] if isinstance(status, str) else status
        return self.store.list_runs(
            tenant=self.tenant, statuses=statuses, limit=limit, scope=scope, call_id=call_id
        )

    def steps(self, run_id: str) -> list[records.StepRecord]:
        """A run's Step Effect Records in order."""
        self._require_run(run_id)
        return self.store.steps(run_id)

    def attempts(self, run_id: str, step_id: str | None = None) -> list[records.AttemptRecord]:
        """A run's attempts (calls, lookups, resolutions) in order."""
        self._require_run(run_id)
        return self.store.attempts(run_id, step_id)

    def effects(
        self,
        *,
        run_id: str | None = None,
        status: str | Sequence[str] | None = None,
        limit: int = 1000,
    ) -> list[records.EffectRecord]:
        """External Effect Records, optionally of one run or in some statuses."""
        if run_id is not None:
            self._require_run(run_id)
        statuses = [status] if isinstance(status, str) else status
        return self.store.effects(tenant=self.tenant, run_id=run_id, statuses=statuses, limit=limit)

    def audit(self, run_id: str) -> list[records.AuditEvent]:
        """A run's audit events in order."""
        self._require_run(run_id)
        return self.store.audit(run_id)

    def timeline(self, run_id: str) -> views.Timeline:
        """A run's steps with their attempts, effects and compensations, and its audit events."""
        run = self._require_run(run_id)
        return views.timeline(
            run,
            self.store.steps(run_id),
            self.store.attempts(run_id),
            self.store.effects(tenant=self.tenant, run_id=run_id, limit=1_000_000),
            self.store.audit(run_id),
        )

    def attention(self, *, limit: int = 500) -> list[views.AttentionItem]:
        """What waits for a person in this tenant, oldest first: every effect in doubt that no live
        owner is settling, whatever its run's state (ended, paused, cancelled, interrupted),
        approvals, failed compensations.

        An effect in doubt (``intent_recorded``, ``unknown``, ``needs_attention``) is left out only
        while its run is running under a live lease: its owner is settling it now (DESIGN §9).
        """
        now = self.clock()
        doubtful = self.store.effects_in_doubt(tenant=self.tenant, now=now, limit=limit)
        # Unexpired leases whose owner is known gone cover nothing: their effects are listed too.
        for run in self.store.leased_running_runs(limit=max(limit, 1000)):
            covered = run.tenant == self.tenant and (run.lease_expires_at or 0) >= now
            if covered and self._owner_gone(run) is not None:
                doubtful += self.store.effects(
                    tenant=self.tenant,
                    run_id=run.run_id,
                    statuses=[s.value for s in records.IN_DOUBT_STATUSES],
                )
        waiting = self.store.list_runs(
            tenant=self.tenant, statuses=[s.value for s in views.WAITING_RUNS], limit=limit
        )
        failed = [
            e
            for run in waiting
            for e in self.store.effects(tenant=self.tenant, run_id=run.run_id, limit=10_000)
            if e.compensation_status == "compensation_failed"
        ]
        runs_of: dict[str, views.RunView] = {}
        for effect in doubtful:
            if effect.run_id not in runs_of:
                owning = self.store.get_run(effect.run_id, tenant=self.tenant)
                if owning is not None:
                    runs_of[owning.run_id] = self.run_view(owning)
        steps_of = {run.run_id: self.store.steps(run.run_id) for run in waiting}
        return views.attention(waiting, steps_of, doubtful + failed, runs_of_effects=runs_of)[
            :limit
        ]

    def verify_audit(self, run_id: str | None = None) -> list[AuditProblem]:
        """Recompute the audit hash chains; an empty list means intact."""
        return self.store.verify_audit(run_id)

    def purge_expired_keys(self) -> int:
        """Drop idempotency key bindings past their retention whose steps are settled."""
        return self.store.purge_expired_keys(now=self.clock())

    # -- internals ------------------------------------------------------------------------------

    def _require_run(self, run_id: str) -> records.RunRecord:
        run = self.store.get_run(run_id, tenant=self.tenant)
        if run is None:
            raise errors.RunNotFound(f"no run {run_id!r} in tenant {self.tenant!r}", run_id=run_id)
        return run

    def _create(
        self,
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
        run, batch = self._new_run(workflow, run_id, input, leased=leased)
        if batch is None:
            return run, False
        try:
            self.store.apply(batch, lease_ttl=self.lease_ttl, now=run.created_at)
        except Exception as exc:
            return self._raced(run, exc), False
        return run, True

    async def _create_async(
        self, workflow: Workflow[..., Any], run_id: str | None, input: dict[str, Any]
    ) -> tuple[records.RunRecord, bool]:
        """``_create`` for ``start_async``: the run's first commit is grouped with other runs'."""
        run, batch = self._new_run(workflow, run_id, input, leased=True)
        if batch is None:
            return run, False
        try:
            await self._apply_async(batch, run.created_at)
        except Exception as exc:
            return self._raced(run, exc), False
        return run, True

    def _new_run(
        self,
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
        run_id = (
            requests.new_id("run") if run_id is None else digests.check_id(run_id, path="run_id")
        )
        existing = self.store.get_run(run_id)
        if existing is not None:
            if existing.tenant != self.tenant or existing.workflow != workflow.name:
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
        now = self.clock()
        run = records.RunRecord(
            run_id=run_id,
            tenant=self.tenant,
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
            lease_owner=self.owner if leased else None,
            lease_token=1 if leased else 0,
            lease_expires_at=now + self.lease_ttl if leased else None,
        )
        if workflow.name == guard_mod.WORKFLOW_NAME:
            # A guarded call: the host's ids become searchable columns (``runs(scope=...)``).
            run = dataclasses.replace(
                run, scope=normalized.get("scope"), call_id=normalized.get("call_id")
            )
        batch = Batch(run_id, lease_token=None, new_run=run)
        batch.event("run_started", now, workflow=workflow.name, input_digest=input_digest)
        return run, batch

    def _raced(self, run: records.RunRecord, refused: Exception) -> records.RunRecord:
        """After a refused insert: the run another caller created meanwhile with the same id and
        input; otherwise the insert's error is raised again."""
        raced = self.store.get_run(run.run_id)
        if raced is not None and raced.input_digest == run.input_digest:
            return raced
        raise refused

    def _reopen(self, run: records.RunRecord, *, by: str) -> records.RunRecord:
        """A paused or failed run becomes running again, in a new generation."""
        now = self.clock()
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
        self.store.apply(batch, lease_ttl=self.lease_ttl, now=now)
        return dataclasses.replace(
            run, status=RunStatus.RUNNING, generation=run.generation + 1, error=None
        )

    def _claim(self, run: records.RunRecord) -> records.RunRecord:
        now = self.clock()
        held = (
            run.lease_owner is not None
            and run.lease_owner != self.owner
            and (run.lease_expires_at or 0) > now
            and _owner_alive(run.lease_owner)
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
        claimed = self.store.claim(
            run.run_id,
            owner=self.owner,
            expected_token=run.lease_token,
            ttl=self.lease_ttl,
            now=now,
        )
        if claimed is None:
            raise errors.LeaseLost(
                f"run {run.run_id} was claimed by another worker first", run_id=run.run_id
            )
        return claimed

    def commit(self, state: state_mod.RunState, batch: Batch) -> None:
        """Make a batch durable under the run's lease (the drivers call this); with group commit,
        in the same transaction as the batches other runs commit at the same time.

        Raises:
            errors.LedgerUnavailable: the ledger stayed away (an outcome is retried first: see
                ``outage``); nothing is recorded as failed and the run is left for recovery.
        """

        def apply() -> tuple[float, dict[str, Any] | None]:
            renewed = self._fence(state, batch)
            if self.committer is not None:
                return renewed, self.committer.commit(batch)
            return renewed, self.store.apply(batch, lease_ttl=self.lease_ttl, now=renewed)

        renewed, control = outage.write(self, batch, apply)
        self._committed(state, renewed, control)

    async def commit_async(self, state: state_mod.RunState, batch: Batch) -> None:
        """``commit`` for a run driven by asyncio: with group commit, the batch shares a
        transaction with those of the other runs that commit in the same turn of the loop."""

        async def apply() -> tuple[float, dict[str, Any] | None]:
            renewed = self._fence(state, batch)
            return renewed, await self._apply_async(batch, renewed)

        renewed, control = await outage.write_async(self, batch, apply)
        self._committed(state, renewed, control)

    async def _apply_async(self, batch: Batch, now: float) -> dict[str, Any] | None:
        """Through the async group committer when it is on, else alone."""
        if self.async_committer is not None:
            return await self.async_committer.commit(batch)
        return self.store.apply(batch, lease_ttl=self.lease_ttl, now=now)

    def _fence(self, state: state_mod.RunState, batch: Batch) -> float:
        """Stamp the batch with the run's lease token; returns the time the lease is renewed from."""
        if state.lease_lost:
            raise errors.LeaseLost(
                f"run {state.run.run_id}: another worker took the lease over; writing nothing",
                run_id=state.run.run_id,
            )
        batch.lease_token = state.run.lease_token
        return self.clock()

    @staticmethod
    def _committed(
        state: state_mod.RunState, renewed: float, control: dict[str, Any] | None
    ) -> None:
        state.lease_valid_until = renewed + state.runtime.lease_ttl  # the fenced write renewed it
        if control is not None:
            state.control = control

    def commit_with(
        self,
        state: state_mod.RunState,
        work: Callable[[LocalTransaction], Any],
        finish: Callable[[Any], Batch],
    ) -> Any:
        """Run a local_transaction tool's ``work`` and commit ``finish(result)`` with it."""

        def fenced(value: Any) -> Batch:
            batch = finish(value)
            batch.lease_token = state.run.lease_token
            return batch

        value, control = self.store.apply_with(
            work, fenced, lease_ttl=self.lease_ttl, now=self.clock()
        )
        if control is not None:
            state.control = control
        return value

    def _prepare(
        self, run: records.RunRecord, workflow: Workflow[..., Any], *, claimed: bool = False
    ) -> state_mod.RunState:
        """The in-memory state of a run this process now holds (claiming it unless it already
        did: a run it just created, or one a worker claimed in bulk)."""
        held = run if claimed else self._claim(run)
        # A run created by this very call has no steps yet: skip the read.
        fresh = claimed and run.lease_owner == self.owner and run.lease_token == 1
        steps = [] if fresh else self.store.steps(run.run_id)
        state = state_mod.RunState(self, held, workflow, steps, self.faults)
        if not fresh:
            self._note_code_change(state, workflow)
        self.leases.hold(state)
        return state

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
                self.clock(),
                from_version=run.workflow_version,
                to_version=workflow.version,
                from_code=run.workflow_code,
                to_code=workflow.code_digest,
            )

    def drive_claimed(
        self, run: records.RunRecord, workflow: Workflow[..., Any]
    ) -> records.RunRecord:
        """Execute a run this process already leased (a worker's bulk claim)."""
        return self._drive(run, workflow, claimed=True)

    def _drive(
        self,
        run: records.RunRecord,
        workflow: Workflow[..., Any],
        *,
        claimed: bool = False,
        redrive: str | None = None,
    ) -> records.RunRecord:
        if workflow.is_async:
            return asyncio.run(self._drive_async(run, workflow, claimed=claimed, redrive=redrive))
        state = self._prepare(run, workflow, claimed=claimed)
        state.redrive_step = redrive
        try:
            return self._execute(state, workflow)
        finally:
            self.leases.drop(state)

    def _execute(
        self, state: state_mod.RunState, workflow: Workflow[..., Any]
    ) -> records.RunRecord:
        """Run the workflow from the top until it ends, pauses, or is stopped by a control."""
        while True:
            if state.control is not None:
                return ending.finish(self, state)
            try:
                output = workflow.fn(context.Context(state), **state.run.input)
            except requests.Restart:
                state.restart()
                continue
            except requests.Stop:
                continue
            except requests.Release:
                return self._release(state)
            except requests.Suspend:
                return self._require_run(state.run.run_id)
            except (errors.LeaseLost, errors.CommitInDoubt, errors.LedgerUnavailable):
                raise  # nothing more is written; the run is left for recovery
            except errors.AbandonGoal as exc:
                self._abandon(state, exc)
                continue
            except Exception as exc:
                if outage.is_outage(self, exc):
                    # A read the ledger could not answer: not the workflow's failure.
                    raise outage.unavailable(state.run.run_id, exc) from exc
                return self._finish_failed(state, exc)
            if state.stop_requested():
                continue  # a cancel arrived with the last step's write: honour it
            return self._finish_ok(state, output)

    def _release(self, state: state_mod.RunState) -> records.RunRecord:
        """The process is shutting down between two steps: keep what is recorded, give the lease up
        so another worker continues the run at once."""
        pending = state.batch()
        if not pending.empty:
            self.commit(state, pending)
        self.store.release(state.run.run_id, token=state.run.lease_token)
        return self._require_run(state.run.run_id)

    def _abandon(self, state: state_mod.RunState, exc: errors.AbandonGoal) -> None:
        """The workflow gave its goal up: record that, so a crash from here on compensates rather
        than re-running the workflow."""
        if state.control is not None:
            return  # an operator's cancel or compensate came first: it decides how the run ends
        now = self.clock()
        control = {"kind": ending.COMPENSATE, "reason": str(exc), "by": "workflow", "at": now}
        batch = state.batch()
        # Compare-and-swap like a person's request: an operator's cancel or compensate recorded
        # meanwhile wins, and this one is dropped rather than written over it.
        batch.expect_run(control=state.control)
        batch.run_changes.update(control=control)
        batch.event("goal_abandoned", now, reason=str(exc))
        try:
            self.commit(state, batch)
        except errors.StaleState:
            state.control = self._require_run(state.run.run_id).control
            return
        state.control = control

    async def _drive_async(
        self,
        run: records.RunRecord,
        workflow: Workflow[..., Any],
        *,
        claimed: bool = False,
        redrive: str | None = None,
    ) -> records.RunRecord:
        state = self._prepare(run, workflow, claimed=claimed)
        state.redrive_step = redrive
        try:
            return await self._execute_async(state, workflow)
        finally:
            self.leases.drop(state)

    async def _execute_async(
        self, state: state_mod.RunState, workflow: Workflow[..., Any]
    ) -> records.RunRecord:
        run = state.run
        if not workflow.is_async:
            return await asyncio.to_thread(self._execute, state, workflow)
        while True:
            if state.control is not None:
                return await asyncio.to_thread(ending.finish, self, state)
            try:
                output = await workflow.fn(context.AsyncContext(state), **run.input)
            except requests.Restart:
                state.restart()
                continue
            except requests.Stop:
                continue
            except requests.Release:
                return self._release(state)
            except requests.Suspend:
                return self._require_run(run.run_id)
            except (errors.LeaseLost, errors.CommitInDoubt, errors.LedgerUnavailable):
                raise  # nothing more is written; the run is left for recovery
            except errors.AbandonGoal as exc:
                self._abandon(state, exc)
                continue
            except Exception as exc:
                if outage.is_outage(self, exc):
                    # A read the ledger could not answer: not the workflow's failure.
                    raise outage.unavailable(state.run.run_id, exc) from exc
                return self._finish_failed(state, exc)
            if state.stop_requested():
                continue
            return await self._finish_ok_async(state, output)

    def _finish_ok(self, state: state_mod.RunState, output: Any) -> records.RunRecord:
        if self._changed_under(state):
            return self._require_run(state.run.run_id)
        try:
            batch = self._success(state, output)
        except errors.ArgumentError as exc:
            return self._finish_failed(state, exc)
        self.commit(state, batch)
        return self._require_run(state.run.run_id)

    async def _finish_ok_async(self, state: state_mod.RunState, output: Any) -> records.RunRecord:
        if await asyncio.to_thread(self._changed_under, state):
            return self._require_run(state.run.run_id)
        try:
            batch = self._success(state, output)
        except errors.ArgumentError as exc:
            return self._finish_failed(state, exc)
        await self.commit_async(state, batch)
        return self._require_run(state.run.run_id)

    def _changed_under(self, state: state_mod.RunState) -> bool:
        """Whether the workflow ended without reaching a recorded step with an effect (its code
        changed since: a step removed or renamed); if so, that step is settled from its record and
        the run paused for a person (``engine.settle_unreached``)."""
        unreached = engine.unreached(state, None)
        if not unreached:
            return False
        why = (
            "the workflow ended without reaching the recorded step(s) "
            + ", ".join(s.step_id for s in unreached)
            + ": its code changed since they ran (a step removed or renamed)"
        )
        with contextlib.suppress(requests.Suspend):  # the run is paused: that is the point
            context.drive(state, engine.settle_unreached(state, unreached, why))
        return True

    def _success(self, state: state_mod.RunState, output: Any) -> Batch:
        """The batch that ends a run with its output (and every write still deferred).

        Raises:
            errors.ArgumentError: the output cannot be recorded as JSON.
        """
        recorded = digests.to_jsonable(output, path="output")
        now = self.clock()
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
        """A failure ends the run and lists its effects; nothing is compensated (DESIGN §4)."""
        now = self.clock()
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
        self.commit(state, batch)
        return self._require_run(state.run.run_id)
