"""A ledger that is briefly away (a PostgreSQL restart, a cut connection, a locked or full SQLite
file) must not turn an effect into a pretended failure (docs/concepts.md#no-effect-out-of-sight).

Between a call and its outcome's record the effect may exist while the ledger says only
``intent_recorded``: that outcome write is retried, each time on a fresh connection (the pool drops a
broken one), with backoff for ``Runtime.ledger_retry`` seconds. Any other write, and the outcome
write once its time is spent, raises ``LedgerUnavailable`` instead of recording a failure: the run
keeps its lease until it lapses, then any worker or ``rt.recover()`` settles its steps by the
decision table from what the ledger holds.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from effectflow import errors
from effectflow.ledger.store import Batch, LedgerStore

log = logging.getLogger(__name__)

T = TypeVar("T")

#: First pause before retrying a write the ledger refused for a transient reason (seconds).
FIRST_PAUSE = 0.05
#: Longest pause between two retries (seconds).
LONGEST_PAUSE = 2.0


def is_outage(store: LedgerStore, exc: BaseException) -> bool:
    """Whether ``exc`` says the ledger was unreachable or unwritable (not that it refused data):
    every store raises ``LedgerUnavailable`` for that, whatever its driver raised."""
    return isinstance(exc, errors.LedgerUnavailable)


def unavailable(run_id: str, exc: BaseException, waited: float = 0.0) -> errors.LedgerUnavailable:
    """The error a caller gets when the ledger stayed away while running ``run_id``."""
    cause = exc.__cause__ if isinstance(exc, errors.LedgerUnavailable) and exc.__cause__ else exc
    return errors.LedgerUnavailable(
        f"run {run_id}: the ledger could not be reached"
        + (f" for {waited:.1f} s" if waited else "")
        + f" ({type(cause).__name__}: {' '.join(str(cause).split())}); nothing was recorded as failed "
        "and the run is left for recovery (`effectflow recover`, or any worker once its lease "
        "lapses)",
        run_id=run_id,
    )


class _RideOut:
    """The retry policy of one write, shared by the blocking and the asyncio driver."""

    def __init__(
        self, store: LedgerStore, batch: Batch, clock: Callable[[], float], patience: float
    ) -> None:
        self._store = store
        self._batch = batch
        self._clock = clock
        self._patience = patience
        self._started = clock()
        self._pause = FIRST_PAUSE

    def pause_after(self, exc: Exception) -> float:
        """How long to pause before writing again after ``exc``: only an outcome batch
        (``deferrable``) rides an outage out, for ``patience`` seconds; anything else raises."""
        if not is_outage(self._store, exc):
            raise exc
        waited = self._clock() - self._started
        if not self._batch.deferrable or waited >= self._patience:
            raise unavailable(self._batch.run_id, exc, waited) from exc
        log.warning("run %s: ledger write failed (%s); retrying", self._batch.run_id, exc)
        pause, self._pause = self._pause, min(self._pause * 2, LONGEST_PAUSE)
        return pause


def write(
    store: LedgerStore,
    batch: Batch,
    apply: Callable[[], T],
    *,
    clock: Callable[[], float],
    patience: float,
) -> T:
    """``apply()`` the batch; an outcome batch (``deferrable``) is retried through an outage for
    ``patience`` seconds (the runtime's ``ledger_retry``)."""
    ride = _RideOut(store, batch, clock, patience)
    while True:
        try:
            return apply()
        except Exception as exc:
            pause = ride.pause_after(exc)
        time.sleep(pause)


async def write_async(
    store: LedgerStore,
    batch: Batch,
    apply: Callable[[], Awaitable[T]],
    *,
    clock: Callable[[], float],
    patience: float,
) -> T:
    """``write`` for the asyncio driver: the pauses do not block the event loop."""
    ride = _RideOut(store, batch, clock, patience)
    while True:
        try:
            return await apply()
        except Exception as exc:
            pause = ride.pause_after(exc)
        await asyncio.sleep(pause)
