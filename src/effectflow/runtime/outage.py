"""A ledger that is briefly away (a PostgreSQL restart, a cut connection, a locked or full SQLite
file) must not turn an effect into a pretended failure (DESIGN §9, "no effect out of sight").

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
from typing import TYPE_CHECKING, TypeVar

from effectflow import errors
from effectflow.ledger.store import Batch

if TYPE_CHECKING:
    from effectflow.runtime.runtime import Runtime

log = logging.getLogger(__name__)

T = TypeVar("T")

#: First pause before retrying a write the ledger refused for a transient reason (seconds).
FIRST_PAUSE = 0.05
#: Longest pause between two retries (seconds).
LONGEST_PAUSE = 2.0


def is_outage(rt: Runtime, exc: BaseException) -> bool:
    """Whether ``exc`` says the ledger was unreachable or unwritable (not that it refused data)."""
    return isinstance(exc, rt.store.transient_errors)


def unavailable(run_id: str, exc: BaseException, waited: float = 0.0) -> errors.LedgerUnavailable:
    """The error a caller gets when the ledger stayed away while running ``run_id``."""
    return errors.LedgerUnavailable(
        f"run {run_id}: the ledger could not be reached"
        + (f" for {waited:.1f} s" if waited else "")
        + f" ({type(exc).__name__}: {' '.join(str(exc).split())}); nothing was recorded as failed "
        "and the run is left for recovery (`effectflow recover`, or any worker once its lease "
        "lapses)",
        run_id=run_id,
    )


def _retryable(rt: Runtime, batch: Batch, exc: Exception, started: float) -> None:
    """Return when ``exc`` is an outage the write may ride out; raise otherwise."""
    if not is_outage(rt, exc):
        raise exc
    waited = rt.clock() - started
    if not batch.deferrable or waited >= rt.ledger_retry:
        raise unavailable(batch.run_id, exc, waited) from exc
    log.warning("run %s: ledger write failed (%s); retrying", batch.run_id, exc)


def write(rt: Runtime, batch: Batch, apply: Callable[[], T]) -> T:
    """``apply()`` the batch; an outcome batch (``deferrable``) is retried through an outage."""
    started, pause = rt.clock(), FIRST_PAUSE
    while True:
        try:
            return apply()
        except Exception as exc:
            _retryable(rt, batch, exc, started)
        time.sleep(pause)
        pause = min(pause * 2, LONGEST_PAUSE)


async def write_async(rt: Runtime, batch: Batch, apply: Callable[[], Awaitable[T]]) -> T:
    """``write`` for the asyncio driver: the pauses do not block the event loop."""
    started, pause = rt.clock(), FIRST_PAUSE
    while True:
        try:
            return await apply()
        except Exception as exc:
            _retryable(rt, batch, exc, started)
        await asyncio.sleep(pause)
        pause = min(pause * 2, LONGEST_PAUSE)
