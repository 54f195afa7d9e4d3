"""Named fault points on the write path, and plans that fire them.

Each place where a crash matters calls ``plan.hit(point, step_id)``. With no plan installed that is a
no-op; a test (or a user proving their own contracts) passes a ``FaultPlan`` to the runtime, typically
in a subprocess it will SIGKILL, to crash at exactly one window.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import signal
from collections.abc import Iterable


class FaultPoint(enum.StrEnum):
    """The windows of the write path (docs/concepts.md#the-write-path)."""

    #: Before the intent commits: nothing is durable, nothing was sent.
    BEFORE_INTENT = "before_intent"
    #: The intent is durable; the call has not started.
    AFTER_INTENT = "after_intent"
    #: The call returned (the effect may exist); its outcome is not recorded.
    AFTER_CALL_BEFORE_RECORD = "after_call_before_record"
    #: The outcome is recorded; the next step has not started.
    AFTER_RECORD = "after_record"
    #: A lookup answered; its answer is not recorded.
    AFTER_LOOKUP_BEFORE_RECORD = "after_lookup_before_record"
    #: A pure/read step's result is computed but not yet durable.
    AFTER_PURE_RESULT = "after_pure_result"
    #: A local_transaction tool wrote inside the ledger's transaction, which has not committed.
    IN_LOCAL_TRANSACTION = "in_local_transaction"


class FaultAction(enum.StrEnum):
    """What firing a fault does."""

    #: SIGKILL this process: no cleanup, no flush, exactly like a crash.
    KILL = "kill"
    #: Raise ``InjectedCrash`` (a BaseException): the in-process stand-in for a crash.
    RAISE = "raise"


class InjectedCrash(BaseException):
    """Raised by a ``raise`` fault. A BaseException, so workflow code cannot swallow it."""


@dataclasses.dataclass(frozen=True)
class Fault:
    """Fire ``action`` at ``point`` (for ``step_id``, or any step), on the ``occurrence``-th hit."""

    #: Where.
    point: FaultPoint
    #: The step it applies to; None = any.
    step_id: str | None = None
    #: Which hit fires it (1 = the first).
    occurrence: int = 1
    #: What it does.
    action: FaultAction = FaultAction.KILL


class FaultPlan:
    """A set of faults; counts hits per fault and fires each once."""

    def __init__(self, faults: Iterable[Fault] = ()) -> None:
        self.faults = list(faults)
        self._hits = [0] * len(self.faults)

    @classmethod
    def kill_at(
        cls, point: FaultPoint | str, step_id: str | None = None, occurrence: int = 1
    ) -> FaultPlan:
        """A plan that SIGKILLs the process at one point."""
        return cls([Fault(FaultPoint(point), step_id, occurrence, FaultAction.KILL)])

    def hit(self, point: FaultPoint, step_id: str) -> None:
        """Called by the runtime at each point; fires a matching fault.

        Keeps no record of the points passed: a runtime shares one plan for its whole life (a
        long-running worker passes millions of points), so anything kept per hit is a leak.
        """
        for i, fault in enumerate(self.faults):
            if fault.point is not point or fault.step_id not in (None, step_id):
                continue
            self._hits[i] += 1
            if self._hits[i] != fault.occurrence:
                continue
            if fault.action is FaultAction.KILL:
                os.kill(os.getpid(), signal.SIGKILL)
            raise InjectedCrash(f"injected crash at {point} of step {step_id}")


#: The plan a runtime uses when none is given.
NO_FAULTS = FaultPlan()
