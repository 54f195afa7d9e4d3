"""``ef.Runtime``: start, resume, recover and reconcile runs; read the ledger; settle unknowns.

A facade: each method checks its arguments and hands the work to the module that owns it — the
executor (``executor``) runs workflows, ``starting`` records runs, ``stop_requests`` cancels and
compensates, ``approvals`` and ``resolution`` record a person's decisions, ``guard`` makes guarded
calls. Those modules
get the runtime's ``port.Port`` (its ledger, registry, clock, faults and writer), never the runtime.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from effectflow import digests, errors, telemetry
from effectflow.contracts import registry as registry_module
from effectflow.contracts.tool import Tool
from effectflow.contracts.workflow import Workflow
from effectflow.ledger import records
from effectflow.ledger.records import NextAction, RunStatus
from effectflow.ledger.store import AuditProblem, LedgerStore, open_store
from effectflow.runtime import approvals, reconciler, resolution, starting, stop_requests, views
from effectflow.runtime import attention as attention_mod
from effectflow.runtime import guard as guard_mod
from effectflow.runtime import leases as leases_mod
from effectflow.runtime.executor import Executor
from effectflow.runtime.faults import NO_FAULTS, FaultPlan
from effectflow.runtime.port import Port
from effectflow.runtime.writer import LedgerWriter

#: Where the ledger lives when no URL is given.
DEFAULT_URL = "sqlite:///effectflow.db"


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
        self.owner = f"{leases_mod.host()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        # Every runtime can run (and recover) guarded calls.
        self.registry.add_workflow(guard_mod.WORKFLOW)
        #: The runs this runtime executes now, and the heartbeat renewing their leases.
        self.leases = leases_mod.Leases(self.store, clock=clock, ttl=lease_ttl, owner=self.owner)
        writer = LedgerWriter.open(
            self.store,
            clock=clock,
            lease_ttl=lease_ttl,
            ledger_retry=ledger_retry,
            group_commit=group_commit,
        )
        #: Shares transactions between the writes of runs executed concurrently on threads (None:
        #: off); by default on for SQLite, off for PostgreSQL (``LedgerWriter.open``).
        self.committer = writer.committer
        #: The same for runs driven by asyncio (``start_async``), on unless ``group_commit=False``.
        self.async_committer = writer.async_committer
        self._port = Port(
            store=self.store,
            registry=self.registry,
            clock=clock,
            faults=faults or NO_FAULTS,
            lease_ttl=lease_ttl,
            writer=writer,
            tenant=tenant,
            owner=self.owner,
            draining=threading.Event(),
        )
        self._executor = Executor(self._port, self.leases)
        telemetry.watch(self)  # effects in doubt, waiting for a person: read when collected

    @property
    def faults(self) -> FaultPlan:
        """Fault points (tests); a no-op plan by default."""
        return self._port.faults

    @faults.setter
    def faults(self, plan: FaultPlan | None) -> None:
        # The plan lives in the port the executor and every run's context read, so assigning it
        # here must reach them: runs started or recovered afterwards use the new plan, runs in
        # flight keep the port they started with.
        self._port = dataclasses.replace(self._port, faults=plan or NO_FAULTS)
        self._executor = Executor(self._port, self.leases)

    @property
    def draining(self) -> bool:
        """Set when the process is shutting down: runs stop at their next step and are released."""
        return self._port.draining.is_set()

    @draining.setter
    def draining(self, value: bool) -> None:
        if value:
            self._port.draining.set()
        else:
            self._port.draining.clear()

    # -- lifecycle ------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the heartbeat and close the ledger."""
        telemetry.unwatch(self)
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
        run, fresh = starting.create(self._port, workflow, run_id, input, leased=True)
        if run.status is not RunStatus.RUNNING or (not fresh and self.leases.holds(run.run_id)):
            # Ended, paused, or being executed by this process now (another caller started it
            # a moment ago): taking its lease over would stop that caller's execution.
            return run
        return self._executor.drive(run, workflow, claimed=fresh)

    async def start_async(
        self, workflow: Workflow[..., Any], /, *, run_id: str | None = None, **input: Any
    ) -> records.RunRecord:
        """The asyncio twin of ``start`` (async workflows run on the caller's loop).

        Runs started together on one loop share their commits (group commit), as threads do with
        ``start``, but without threads: see ``group_commit.AsyncGroupCommitter``.
        """
        run, fresh = await starting.create_async(self._port, workflow, run_id, input)
        if run.status is not RunStatus.RUNNING or (not fresh and self.leases.holds(run.run_id)):
            return run  # as in ``start``
        return await self._executor.drive_async(run, workflow, claimed=fresh)

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
        return starting.create(self._port, workflow, run_id, input, leased=False)[0]

    def resume(self, run_id: str, *, by: str = "runtime") -> records.RunRecord:
        """Continue a run: an interrupted one, a paused one, or (redrive) a failed one.

        Confirmed steps keep their recorded results; the first step that is not confirmed continues
        per the decision table, with its original key. Resuming a paused or failed run starts a new
        generation, which gives its retry and lookup budgets a fresh start. A step whose failure
        the workflow handled (it caught the error and went on) replays that failure; only the step
        a failed run failed *at* is called again by its redrive.
        """
        run = self._port.run(run_id)
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
            run = starting.reopen(self._port, run, by=by)
        return self._executor.drive(
            run, workflow, redrive=redrive if isinstance(redrive, str) else None
        )

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
            if self.leases.owner_gone(run) is not None:
                candidates.setdefault(run.run_id, run)
        finished = []
        for run in candidates.values():
            if run.tenant != self.tenant:
                continue
            try:
                workflow = self.registry.workflow(run.workflow)
                left = self._executor.drive(run, workflow)
            except errors.LeaseLost:
                continue
            finished.append(left)
            if on_run is not None:
                on_run(left)
        return finished

    def interruption(self, run: records.RunRecord) -> str | None:
        """Why ``run`` is interrupted (running, but nobody executes it), or None."""
        return views.interruption(run, now=self.clock(), owner_gone=self.leases.owner_gone(run))

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
        touched = [
            self.resume(run_id, by="reconciler")
            for run_id in reconciler.runs_to_resume(self._port, limit=limit)
        ]
        touched.extend(self.recover(limit=limit))
        return touched

    # -- stopping runs ----------------------------------------------------------------------------

    def cancel(
        self, run_id: str, *, reason: str | None = None, by: str = "operator"
    ) -> records.Inventory:
        """Cancel a run (docs/concepts.md#cancel) and return what it left in the world.

        Steps not started do not start; a call in progress at the provider is stopped where its tool
        declares a cancel operation, else it lands and is classified; confirmed effects are never
        marked undone; unknown effects are looked up once and otherwise queued for reconciliation;
        then compensations run for steps whose trigger includes ``cancelled``. The run ends
        ``cancelled`` (no effects), ``cancelled_with_effects`` or
        ``cancelled_pending_reconciliation`` (moved on by ``rt.reconcile`` once the unknowns
        settle). A run another live worker holds gets the request and stops at its next step
        boundary; the inventory then lists its call in flight and the run is ``cancelling``.
        """
        return stop_requests.cancel(self._port, self._executor, run_id, reason=reason, by=by)

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
        return stop_requests.compensate(self._port, self._executor, run_id, reason=reason, by=by)

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
        replayed = approvals.approve(
            self._port, run_id, step_id, approver=approver, approval_id=approval_id, note=note
        )
        return replayed or self.resume(run_id, by=approver)

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
        replayed = approvals.reject(self._port, run_id, step_id, by=by, reason=reason)
        return replayed or self.resume(run_id, by=by)

    @staticmethod
    def owner_alive(owner: str) -> bool:
        """Whether a lease owner may still be alive (a dead pid on this host proves it is not)."""
        return leases_mod.owner_alive(owner)

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
        effect, waited = resolution.resolve(
            self._port,
            effect_id,
            committed=committed,
            evidence=evidence,
            by=by,
            expected_version=expected_version,
            decision_id=decision_id,
        )
        if waited:  # a cancelled run waited only for this answer: give it its end state now
            self.resume(effect.run_id, by=by)
        return effect

    # -- reads ----------------------------------------------------------------------------------

    def run(self, run_id: str) -> records.RunRecord:
        """One run of this tenant.

        Raises:
            errors.RunNotFound: no such run for this tenant.
        """
        return self._port.run(run_id)

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
        self._port.run(run_id)
        return self.store.steps(run_id)

    def attempts(self, run_id: str, step_id: str | None = None) -> list[records.AttemptRecord]:
        """A run's attempts (calls, lookups, resolutions) in order."""
        self._port.run(run_id)
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
            self._port.run(run_id)
        statuses = [status] if isinstance(status, str) else status
        return self.store.effects(tenant=self.tenant, run_id=run_id, statuses=statuses, limit=limit)

    def audit(self, run_id: str) -> list[records.AuditEvent]:
        """A run's audit events in order."""
        self._port.run(run_id)
        return self.store.audit(run_id)

    def timeline(self, run_id: str) -> views.Timeline:
        """A run's steps with their attempts, effects and compensations, and its audit events."""
        run = self._port.run(run_id)
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
        while its run is running under a live lease: its owner is settling it now
        (docs/concepts.md#no-effect-out-of-sight).
        """
        return attention_mod.attention(self._port, self.leases, limit=limit)

    def verify_audit(self, run_id: str | None = None) -> list[AuditProblem]:
        """Recompute the audit hash chains; an empty list means intact."""
        return self.store.verify_audit(run_id)

    def purge_expired_keys(self) -> int:
        """Drop idempotency key bindings past their retention whose steps are settled."""
        return self.store.purge_expired_keys(now=self.clock())

    # -- internals ------------------------------------------------------------------------------

    def drive_claimed(
        self, run: records.RunRecord, workflow: Workflow[..., Any]
    ) -> records.RunRecord:
        """Execute a run this process already leased (a worker's bulk claim)."""
        return self._executor.drive(run, workflow, claimed=True)
