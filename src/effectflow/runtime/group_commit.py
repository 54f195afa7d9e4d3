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

Turns (``turns=True``, SQLite's default): the threads take turns the way asyncio's coroutines do.
One process runs Python on one core at a time (the GIL), and left alone the threads a commit woke
run their Python while the next group is written: that group carries only the batches that came
in meanwhile (about 4 of 8 runs in flight), every statement of it may hand the GIL to one of them,
and all of them wake at once to contend for it. With turns, a transaction's writers are woken one
at a time, each by the one before it when that one reaches its next commit (or a tool call or a
wait: ``away``), and the next transaction starts once every writer woken is back in the queue:
its statements run while the others are parked, and it carries every run in flight (about 6 of
8), so fewer fsyncs are paid. A writer that does not come back within ``stall`` seconds (its
workflow's own code went elsewhere) holds nobody up longer than that: the others are woken and
the queue is written without it; one whose batch was refused or failed, or that leaves the step
machine with an exception, holds no turn at all. Each batch is still durable before its writer
goes on: a writer is woken only once the transaction carrying its batch has committed.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from effectflow import errors
from effectflow.ledger.records import RunStatus
from effectflow.ledger.store import Applied, Batch, LedgerStore

#: The most batches one group transaction carries.
MAX_GROUP = 128

#: How long the turns wait for a writer to come back before going on without it (seconds): more
#: than the Python of eight runs' steps between two commits on a busy machine (2 ms made the
#: waiting writers wake for nothing twice as often: BENCHMARKS.md, "Issue 18: threads").
STALL = 0.01


def _ends_run(batch: Batch) -> bool:
    """Whether the thread that committed ``batch`` leaves the step machine with it: the batch
    ends its run, or pauses it."""
    status = batch.run_changes.get("status")
    return status is not None and status not in (RunStatus.RUNNING, RunStatus.CANCELLING)


def _leaves(waiter: _Waiter) -> bool:
    """Whether the writer goes elsewhere once its batch's transaction is over, so that no turn
    waits for its next commit: its batch ends or pauses its run, or was refused or failed (its
    thread leaves with the error, or pauses before writing again: ``outage``)."""
    return waiter.error is not None or _ends_run(waiter.batch)


def _interrupted(batch: Batch, exc: BaseException) -> errors.LedgerUnavailable:
    """What a writer gets whose batch was in a transaction another thread's interrupt ended:
    the ledger's error for a transaction that did not commit (an outcome is written again, an
    intent's run is left for recovery: ``outage``), not that thread's interrupt."""
    return errors.LedgerUnavailable(
        f"run {batch.run_id}: the transaction carrying this write was interrupted "
        f"({type(exc).__name__} in the thread that led it) and did not commit",
        run_id=batch.run_id,
    )


class _Gate:
    """A one-shot event on one bare lock: ``set`` wakes the waiter with one release, where
    ``threading.Event`` takes its condition's lock on both sides, and the woken thread then
    contends for it with the one that woke it (more context switches per handoff)."""

    __slots__ = ("_lock", "_open")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self._open = False

    def set(self) -> None:
        if not self._open:
            self._open = True
            self._lock.release()

    def is_set(self) -> bool:
        return self._open

    def wait(self, timeout: float | None = None) -> bool:
        """Whether the gate is open, waiting at most ``timeout`` seconds (None: until it is)."""
        if self._open:
            return True
        return self._lock.acquire(True, -1 if timeout is None else timeout) or self._open


class _Waiter:
    __slots__ = ("batch", "committed", "control", "done", "error", "lead", "thread")

    def __init__(self, batch: Batch) -> None:
        self.batch = batch
        self.thread = threading.get_ident()
        self.done = _Gate()
        self.lead = False
        self.committed = False
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
        turns: bool = False,
        stall: float = STALL,
    ) -> None:
        self._store = store
        self._lease_ttl = lease_ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._queue: list[_Waiter] = []
        self._leaders = 0
        #: How many group transactions may be in flight at once.
        self.max_parallel = max(1, max_parallel)
        #: Whether the writers of a transaction take turns (see the module); one leader only.
        self.turns = turns and self.max_parallel == 1
        #: How long a turn waits for a writer to come back before going on without it (seconds).
        self.stall = stall
        # The turns: the committed writers still to wake, in order; the threads woken since the
        # last transaction and not back yet; when a writer last came back (or went away); and
        # where a leader waits for them.
        self._ring: collections.deque[_Waiter] = collections.deque()
        self._out: set[int] = set()
        self._moved = time.monotonic()
        self._back = threading.Condition(self._lock)
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
            if self.turns:
                self._came_back(me.thread)
            lead = self._leaders < self.max_parallel
            if lead:
                self._leaders += 1
        try:
            if not lead:
                self._wait(me)
            if lead or me.lead:
                self._lead(me)
        except BaseException:  # interrupted (a signal's handler raised): nobody waits for it
            self._abandon(me)
            raise
        return self._result(me)

    def _abandon(self, me: _Waiter) -> None:
        """The writer of ``me`` stopped waiting: an exception reached it (a signal's handler
        raised on the main thread) while it waited or gathered a group. A batch still queued is
        not written, since its caller was told nothing was; a lead handed to it passes on, or
        nobody would write the queue again (every writer after it would wait for good); a turn
        it holds or would get passes on. A batch in a transaction being written commits."""
        with self._lock:
            if me in self._queue:
                self._queue.remove(me)
                if me.lead:
                    me.lead = False
                    self._hand_on()
            elif me in self._ring:
                self._ring.remove(me)
            if self.turns:  # (without turns a leader opens the gates without the lock: not here)
                me.done.set()  # the turns pass it by (``_pass_turn``) if it is still to come
                self._came_back(me.thread)

    def away(self) -> None:
        """This thread is going where it may stay a while (a tool call): the next writer of its
        transaction is woken now, and the next transaction does not wait for this one."""
        thread = threading.get_ident()
        if self.turns and thread in self._out:  # else it holds no turn: nothing to pass on
            with self._lock:
                self._came_back(thread)

    def _came_back(self, thread: int) -> None:
        """``thread`` reached its next commit, or went away: the turn passes (under the lock)."""
        self._moved = time.monotonic()
        if thread not in self._out:
            return
        self._out.discard(thread)
        self._pass_turn()

    def _pass_turn(self) -> None:
        """Wake the next committed writer; one that leaves (``_leaves``: its batch ended its run,
        or failed) comes back to no commit, so the one after it is woken too (under the lock)."""
        while self._ring:
            nxt = self._ring.popleft()
            if nxt.done.is_set():  # woken by a stall meanwhile
                continue
            nxt.done.set()
            if not _leaves(nxt):
                self._out.add(nxt.thread)
                return
        if not self._out:
            self._back.notify()  # a leader waiting for the turns to end

    def _wait(self, me: _Waiter) -> None:
        """Wait for the batch's transaction and for this writer's turn; a turn that does not come
        (the writer before this one went elsewhere) is taken after ``stall`` seconds."""
        if not self.turns:
            me.done.wait()
            return
        while not me.done.wait(self.stall):
            with self._lock:
                if me.done.is_set():
                    return
                if me.committed and time.monotonic() - self._moved >= self.stall:
                    self._ring.remove(me)
                    me.done.set()
                    self._moved = time.monotonic()
                    if _leaves(me):
                        self._pass_turn()
                    else:
                        self._out.add(me.thread)
                    return

    def _gather(self) -> None:
        """Wait (under the lock) until every writer woken since the last transaction is back in
        the queue, or none has come back for ``stall`` seconds; then wake whoever still waits."""
        while (self._out or self._ring) and len(self._queue) < MAX_GROUP:
            left = self._moved + self.stall - time.monotonic()
            if left <= 0:
                break
            self._back.wait(left)
        while self._ring:  # a stall: the rest run now, as without turns
            waiter = self._ring.popleft()
            waiter.done.set()
        self._out.clear()

    def _lead(self, me: _Waiter) -> None:
        with self._lock:
            if self.turns:
                try:
                    self._gather()
                except BaseException:  # interrupted while waiting: this batch is not written
                    self._queue.remove(me)
                    self._hand_on()
                    raise
            group, self._queue = self._queue[:MAX_GROUP], self._queue[MAX_GROUP:]
        try:
            self._write(group)
        finally:
            with self._lock:
                self._hand_on()
                if self.turns:
                    # This thread goes on first; the others are woken one by one (``_came_back``).
                    for waiter in group:
                        waiter.lead = False
                        waiter.committed = True
                        if waiter is not me:
                            self._ring.append(waiter)
                    self._moved = time.monotonic()
                    if _leaves(me):
                        self._pass_turn()
                    else:
                        self._out.add(me.thread)
            if not self.turns:
                for waiter in group:
                    waiter.lead = False
                    waiter.done.set()

    def _hand_on(self) -> None:
        """The lead passes to the oldest writer waiting, if any (under the lock)."""
        if self._queue:
            successor = self._queue[0]
            successor.lead = True
            successor.done.set()
        else:
            self._leaders -= 1

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
        except Exception as exc:  # the whole transaction failed: every batch in it did
            for waiter in group:
                waiter.error = exc
        except BaseException as exc:
            # An interrupt of the leader's own thread (a signal's handler raised on the main
            # thread), and the transaction rolled back: the interrupt is this thread's; the
            # others' batches failed as in any transaction that did not commit.
            for waiter in group:
                waiter.error = (
                    exc
                    if waiter.thread == threading.get_ident()
                    else _interrupted(waiter.batch, exc)
                )
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
