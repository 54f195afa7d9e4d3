"""Writing a run's batches to the ledger under its lease: fencing, group commit, outage retries.

Every write of a run carries the lease's fencing token, so a process that lost the lease writes
nothing; the write renews the lease once a third of its TTL has passed since the last renewal
(``leases.RENEW_AFTER``, the heartbeat's interval: a write in between leaves the lease where it is,
so the run's row is rewritten without its lease index), and learns of an operator's cancel or
compensate request recorded meanwhile (the store answers with the run's control).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from effectflow import errors
from effectflow.ledger.local import LocalTransaction
from effectflow.ledger.store import Batch, LedgerStore
from effectflow.runtime import group_commit as group_commit_mod
from effectflow.runtime import leases, outage
from effectflow.runtime import state as state_mod
from effectflow.runtime.control import Control


class LedgerWriter:
    """Makes the batches of the runs a runtime executes durable."""

    @classmethod
    def open(
        cls,
        store: LedgerStore,
        *,
        clock: Callable[[], float],
        lease_ttl: float,
        ledger_retry: float,
        group_commit: bool | None,
    ) -> LedgerWriter:
        """A writer with the group committers ``group_commit`` asks for (None: the defaults)."""
        # Threads: unless told, the backend's measured default (BENCHMARKS.md, "Workers"): on for
        # SQLite, off for PostgreSQL, which flushes concurrent commits together by itself.
        threads = store.group_commit_default if group_commit is None else group_commit
        # SQLite: the threads take turns, so that a group's statements run while the others are
        # parked and it carries every run in flight (``group_commit``; measured on SQLite only,
        # so a backend says so: ``SQLiteStore.group_commit_turns``).
        committer = (
            group_commit_mod.GroupCommitter(
                store,
                lease_ttl=lease_ttl,
                clock=clock,
                max_parallel=store.max_concurrent_writers,
                turns=bool(getattr(store, "group_commit_turns", False)),
            )
            if threads
            else None
        )
        # Asyncio: on unless ``group_commit=False``, on both backends: with no threads there is
        # no GIL handoff or lock held across a round trip to pay for it (BENCHMARKS.md, "Async
        # group commit").
        async_committer = (
            group_commit_mod.AsyncGroupCommitter(store, lease_ttl=lease_ttl, clock=clock)
            if group_commit is not False
            else None
        )
        return cls(
            store,
            clock=clock,
            lease_ttl=lease_ttl,
            ledger_retry=ledger_retry,
            committer=committer,
            async_committer=async_committer,
        )

    def __init__(
        self,
        store: LedgerStore,
        *,
        clock: Callable[[], float],
        lease_ttl: float,
        ledger_retry: float,
        committer: group_commit_mod.GroupCommitter | None,
        async_committer: group_commit_mod.AsyncGroupCommitter | None,
    ) -> None:
        self._store = store
        self._clock = clock
        self._lease_ttl = lease_ttl
        self._ledger_retry = ledger_retry
        #: Shares transactions between the writes of runs executed concurrently on threads (None:
        #: off).
        self.committer = committer
        #: The same for runs driven by asyncio: coroutines that commit in the same turn of the
        #: event loop share a transaction (None: off).
        self.async_committer = async_committer

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
            return renewed, self._store.apply(batch, lease_ttl=self._lease_ttl, now=renewed)

        renewed, control = outage.write(
            self._store, batch, apply, clock=self._clock, patience=self._ledger_retry
        )
        self._committed(state, batch, renewed, control)
        self._renew_if_short(state, batch)

    def away(self) -> None:
        """The calling thread leaves the step machine for a while (a tool call, a wait): with
        group commit's turns, the next writer goes on now instead of waiting for this one."""
        if self.committer is not None:
            self.committer.away()

    async def commit_async(self, state: state_mod.RunState, batch: Batch) -> None:
        """``commit`` for a run driven by asyncio: with group commit, the batch shares a
        transaction with those of the other runs that commit in the same turn of the loop."""

        async def apply() -> tuple[float, dict[str, Any] | None]:
            renewed = self._fence(state, batch)
            return renewed, await self.apply_async(batch, renewed)

        renewed, control = await outage.write_async(
            self._store, batch, apply, clock=self._clock, patience=self._ledger_retry
        )
        self._committed(state, batch, renewed, control)
        self._renew_if_short(state, batch)

    async def apply_async(self, batch: Batch, now: float) -> dict[str, Any] | None:
        """Through the async group committer when it is on, else alone."""
        if self.async_committer is not None:
            return await self.async_committer.commit(batch)
        return self._store.apply(batch, lease_ttl=self._lease_ttl, now=now)

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

        value, control = self._store.apply_with(
            work, fenced, lease_ttl=self._lease_ttl, now=self._clock()
        )
        if control is not None:
            state.control = Control.of(control)
        return value

    def _fence(self, state: state_mod.RunState, batch: Batch) -> float:
        """Stamp the batch with the run's lease token, and say whether it renews the lease: once
        a third of the TTL has passed since the last renewal, or always when the batch asks for a
        whole lease (``Batch.full_lease``). Returns the time the lease is renewed from (each try
        decides again: a try after an outage may find the lease older)."""
        if state.lease_lost:
            raise errors.LeaseLost(
                f"run {state.run.run_id}: another worker took the lease over; writing nothing",
                run_id=state.run.run_id,
            )
        batch.lease_token = state.run.lease_token
        now = self._clock()
        batch.renews_lease = batch.full_lease or self._due(state, now)
        return now

    def _due(self, state: state_mod.RunState, now: float) -> bool:
        """Whether the run's lease is due for renewal: less than two thirds of the TTL left (a
        third of it passed since the last renewal, ``leases.RENEW_AFTER``)."""
        return state.lease_valid_until - now < self._lease_ttl * (1 - leases.RENEW_AFTER)

    def _committed(
        self,
        state: state_mod.RunState,
        batch: Batch,
        renewed: float,
        control: dict[str, Any] | None,
    ) -> None:
        if batch.renews_lease:  # the fenced write renewed it (forward only, as the ledger)
            state.lease_valid_until = max(state.lease_valid_until, renewed + self._lease_ttl)
        if control is not None:
            state.control = Control.of(control)

    def _renew_if_short(self, state: state_mod.RunState, batch: Batch) -> None:
        """A write that did not renew its lease, decided before it waited (for the ledger's lock,
        through an outage), may have committed with less than two thirds of the lease left: renew
        it now with the heartbeat's statement, as the write would have, so that the call after it
        does not start on less (the heartbeat needs the same lock, so it may not have). Rare: a
        write waits that long only when another holds the ledger. A ledger error here is left to
        the call's own check, which refuses a lease this process cannot prove."""
        if batch.renews_lease or state.lease_lost:
            return
        if "lease_owner" in batch.run_changes or "lease_expires_at" in batch.run_changes:
            return  # the batch let the lease go (the run ended, paused, was released)
        now = self._clock()
        if not self._due(state, now):
            return
        lease = (state.run.run_id, state.run.lease_token)
        try:
            lost = self._store.heartbeat([lease], ttl=self._lease_ttl, now=now)
        except errors.LedgerError:
            return
        if lost:
            state.lease_lost = True
        else:
            state.lease_valid_until = max(state.lease_valid_until, now + self._lease_ttl)
