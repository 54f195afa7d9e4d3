"""What one execution of a run holds in memory: its records, its lease, its deferred writes.

Data only: the services that execute the run (the ledger, the registry, the clock) come through
``port.Port``, never through this object.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from effectflow.contracts.workflow import Workflow
from effectflow.ledger import records
from effectflow.ledger.store import Batch
from effectflow.runtime.control import Control


class RunState:
    """What one execution of a run knows: the ledger's records, the lease, deferred writes."""

    def __init__(
        self,
        run: records.RunRecord,
        workflow: Workflow[..., Any],
        steps: list[records.StepRecord],
        *,
        attempts_of: Callable[[str, str], list[records.AttemptRecord]],
        claimed_at: float,
    ) -> None:
        self.run = run
        self.workflow = workflow
        self.steps: dict[str, records.StepRecord] = {s.step_id: s for s in steps}
        #: Reads a step's attempts from the ledger (``store.attempts``), once per step.
        self._attempts_of = attempts_of
        self.seen: set[str] = set()
        self.seq = max((s.seq for s in steps), default=0)
        self.last_step: str | None = None
        self.rng = random.Random()
        #: Writes that need no commit of their own (pure/read results): they ride with the next one.
        self.pending = Batch(run.run_id, run.lease_token)
        self._attempts: dict[str, list[records.AttemptRecord]] = {}
        #: An operator's cancel/compensate request, learnt from the ledger with each write.
        self.control: Control | None = Control.of(run.control)
        #: Set by the heartbeat when another worker took the lease over: write nothing more.
        self.lease_lost = False
        #: Until when this process can prove it holds the lease (its last renewal + the TTL).
        self.lease_valid_until: float = run.lease_expires_at or 0.0
        #: When this process took the run (calls of earlier holders had deadlines before it).
        self.claimed_at = claimed_at
        #: The deadline given to each call made here, by attempt id.
        self.call_deadlines: dict[str, float] = {}
        #: The step a redrive of this failed run retries (the one it failed at): every other
        #: step that failed earlier had its failure handled by the workflow, and replays it.
        self.redrive_step: str | None = None
        #: When each call made here was handed to its tool, by attempt id (bounds count from it).
        self.sent_at: dict[str, float] = {}
        #: Calls made here that outlived their timeout and still run, by attempt id (the
        #: driver's handle): until each ends it may still land, and its late answer is a fact.
        self.in_flight: dict[str, Any] = {}

    def batch(self) -> Batch:
        """A batch carrying every deferred write, fenced by this run's lease."""
        batch, self.pending = self.pending, Batch(self.run.run_id, self.run.lease_token)
        return batch

    def stop_requested(self) -> bool:
        """Whether a cancel or compensate request is pending (learnt with the last write)."""
        return self.control is not None

    def restart(self) -> None:
        """Forget what the last pass of the workflow reached, to run it again from the top."""
        self.seen.clear()
        self.last_step = None

    def attempts(self, step_id: str) -> list[records.AttemptRecord]:
        """The step's attempts (loaded once from the ledger, then kept current here)."""
        if step_id not in self._attempts:
            self._attempts[step_id] = self._attempts_of(self.run.run_id, step_id)
        return self._attempts[step_id]

    def first_attempt(self, attempt: records.AttemptRecord) -> None:
        """A new step's first attempt: nothing to load from the ledger (saves a query per step)."""
        self._attempts[attempt.step_id] = [attempt]

    def note_attempt(self, attempt: records.AttemptRecord) -> None:
        """Keep the in-memory list current after an attempt row is written."""
        known = self.attempts(attempt.step_id)
        for i, existing in enumerate(known):
            if existing.attempt_id == attempt.attempt_id:
                known[i] = attempt
                return
        known.append(attempt)

    def link_previous(self, step_id: str, batch: Batch) -> None:
        """Record ``next_step`` on the step the run passed before this one."""
        prev = self.last_step
        self.last_step = step_id
        if prev is None or prev == step_id:
            return
        before = self.steps.get(prev)
        if before is not None and before.next_step != step_id:
            linked = records.evolve(before, next_step=step_id)
            self.steps[prev] = linked
            batch.step(linked)
