"""Group commit: the durable writes of many runs in flight share one transaction
(docs/concepts.md#group-commit).

A writer hands its batch over and waits until the transaction carrying it has committed, so the
write path is not weakened: an intent is still durable before its call starts. What changes is
that while one transaction is being made durable (the fsync), the batches of the other runs queue
up, and the next transaction carries all of them — throughput stops being one fsync per step.

Leader/follower, no extra thread: a writer that finds fewer than ``max_parallel`` group
transactions in progress commits the queue itself (a lone run pays nothing extra); writers arriving
meanwhile wait, and when a leader is done it hands the lead to the oldest of them. SQLite has one
writer at a time, so one group transaction at a time; PostgreSQL commits concurrent transactions in
parallel (and flushes their WAL together), so several group transactions may be in flight.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable
from typing import Any

from effectflow.ledger.store import Applied, Batch, LedgerStore

#: The most batches one group transaction carries.
MAX_GROUP = 128


class _Waiter:
    __slots__ = ("batch", "control", "done", "error", "lead")

    def __init__(self, batch: Batch) -> None:
        self.batch = batch
        self.done = threading.Event()
        self.lead = False
        self.error: BaseException | None = None
        self.control: dict[str, Any] | None = None


class GroupCommitter:
    """Commits batches of many runs together; each ``commit`` returns once its own is durable."""

    def __init__(
        self,
        store: LedgerStore,
        *,
        lease_ttl: float,
        clock: Callable[[], float],
        max_parallel: int = 1,
    ) -> None:
        self._store = store
        self._lease_ttl = lease_ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._queue: list[_Waiter] = []
        self._leaders = 0
        #: How many group transactions may be in flight at once.
        self.max_parallel = max(1, max_parallel)
        #: Transactions committed, and batches they carried (for benchmarks and tests).
        self.transactions = 0
        self.batches = 0

    def commit(self, batch: Batch) -> dict[str, Any] | None:
        """Make ``batch`` durable; returns its run's control request.

        Raises:
            errors.LeaseLost, errors.IdempotencyConflict: this batch was refused (nothing of it
                was written); the other batches of its group are unaffected.
        """
        me = _Waiter(batch)
        with self._lock:
            self._queue.append(me)
            lead = self._leaders < self.max_parallel
            if lead:
                self._leaders += 1
        if not lead:
            me.done.wait()
            if not me.lead:
                return self._result(me)
        self._lead()
        return self._result(me)

    def _lead(self) -> None:
        with self._lock:
            group, self._queue = self._queue[:MAX_GROUP], self._queue[MAX_GROUP:]
        try:
            self._write(group)
        finally:
            with self._lock:
                if self._queue:
                    successor = self._queue[0]
                    successor.lead = True
                    successor.done.set()
                else:
                    self._leaders -= 1
            for waiter in group:
                waiter.lead = False
                waiter.done.set()

    def _write(self, group: list[_Waiter]) -> None:
        now = self._clock()
        try:
            if len(group) == 1:
                group[0].control = self._store.apply(
                    group[0].batch, lease_ttl=self._lease_ttl, now=now
                )
            else:
                results = self._store.apply_many(
                    [w.batch for w in group], lease_ttl=self._lease_ttl, now=now
                )
                for waiter, applied in zip(group, results, strict=True):
                    waiter.error, waiter.control = applied.error, applied.control
        except BaseException as exc:  # the whole transaction failed: every batch in it did
            for waiter in group:
                waiter.error = exc
        self.transactions += 1
        self.batches += len(group)

    @staticmethod
    def _result(waiter: _Waiter) -> dict[str, Any] | None:
        if waiter.error is not None:
            raise waiter.error
        return waiter.control


class AsyncGroupCommitter:
    """Group commit for runs driven by asyncio: the commits of every coroutine that reaches one in
    the same turn of the event loop share one transaction.

    No thread is involved. A coroutine that commits queues its batch and awaits; the first one of
    a turn schedules a flush with ``call_soon``, which asyncio runs only after every callback that
    was already ready — so the other runs woken in this turn queue their batches first. The flush
    commits them on the loop's own thread and wakes them all, and they reach their next commits
    together. The flush blocks the loop for one fsync, which the batches share; threads would share
    it too, but each SQLite statement hands the GIL to another thread and back (BENCHMARKS.md,
    "The targets"), which costs more than the fsync it saves.

    Each batch is still durable before its writer goes on: an intent before its call.
    """

    def __init__(self, store: LedgerStore, *, lease_ttl: float, clock: Callable[[], float]) -> None:
        self._store = store
        self._lease_ttl = lease_ttl
        self._clock = clock
        # One queue per event loop: a Runtime may be driven by several loops over its life.
        self._queues: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, list[tuple[Batch, asyncio.Future[dict[str, Any] | None]]]
        ] = weakref.WeakKeyDictionary()
        #: Transactions committed, and batches they carried (for benchmarks and tests).
        self.transactions = 0
        self.batches = 0

    async def commit(self, batch: Batch) -> dict[str, Any] | None:
        """Make ``batch`` durable; returns its run's control request.

        Raises:
            errors.LeaseLost, errors.IdempotencyConflict, errors.RunNotFound: this batch was
                refused (nothing of it was written); the other batches of its group are unaffected.
        """
        loop = asyncio.get_running_loop()
        queue = self._queues.setdefault(loop, [])
        done: asyncio.Future[dict[str, Any] | None] = loop.create_future()
        queue.append((batch, done))
        if len(queue) == 1:
            loop.call_soon(self._flush, loop)
        return await done

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        queue = self._queues.get(loop, [])
        group, rest = queue[:MAX_GROUP], queue[MAX_GROUP:]
        self._queues[loop] = rest
        if rest:
            loop.call_soon(self._flush, loop)
        if not group:
            return
        now = self._clock()
        try:
            if len(group) == 1:
                outcomes = [
                    Applied(
                        control=self._store.apply(group[0][0], lease_ttl=self._lease_ttl, now=now)
                    )
                ]
            else:
                outcomes = self._store.apply_many(
                    [batch for batch, _ in group], lease_ttl=self._lease_ttl, now=now
                )
        except BaseException as exc:  # the whole transaction failed: every batch in it did
            for _, done in group:
                if not done.done():
                    done.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        finally:
            self.transactions += 1
            self.batches += len(group)
        for (_, done), applied in zip(group, outcomes, strict=True):
            if done.done():  # its coroutine was cancelled meanwhile; the batch is committed anyway
                continue
            if applied.error is not None:
                done.set_exception(applied.error)
            else:
                done.set_result(applied.control)
