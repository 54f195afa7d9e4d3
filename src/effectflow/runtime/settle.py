"""Settling a step whose outcome or completion is not yet a fact: lookups, completion polling,
approvals, re-observation after a conflict, and handing the step to a person.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Generator
from typing import Any

from effectflow import digests, errors
from effectflow.contracts.lookup import Lookup, LookupStatus
from effectflow.ledger import records
from effectflow.ledger.records import NextAction, Outcome, StepStatus
from effectflow.policies import decision, retry
from effectflow.policies.decision import Situation
from effectflow.runtime import late, outcomes, requests
from effectflow.runtime.faults import FaultPoint
from effectflow.runtime.machine import MachineBase

#: Seconds a provider may take to commit a call it accepted just before the call's deadline.
DEADLINE_GRACE = 0.5

#: The deadline window of a call whose tool takes a deadline but declares no timeout (seconds).
DEFAULT_CALL_WINDOW = 60.0

#: The error code of a lookup whose "not found" was no proof: the call may still land.
NOT_FOUND_MAY_STILL_LAND = "not_found_may_still_land"

#: How long one settling round waits for the late answer of a call that outlived its timeout and
#: still runs here, when no bound says when it can no longer land (seconds).
LATE_ANSWER_WAIT = 30.0


class SettleMixin(MachineBase):
    """The paths that end a step without (another) call of its tool."""

    #: The read step a conflicting write re-runs (from ``ctx.call(observe=...)``).
    observe: str | None

    def _lookup(
        self, step: records.StepRecord, verdict: decision.Decision
    ) -> Generator[requests.Request, Any, Situation]:
        """Settle an in-doubt step without calling its tool: the late answer of a call still
        running here, else the contract's lookup tool (DESIGN §3.1: its "not found" is proof only
        once the call can no longer land)."""
        until = self._may_land_until(step)
        late = yield from self._late_answer(step, until)
        if late is not None:
            return late
        situation, premature = yield from self._look(step, verdict, until)
        if premature and until != math.inf:
            # Not found, but the call may still land until its bound: look again once it cannot.
            yield requests.Sleep(until - self.port.clock())
            late = yield from self._late_answer(step, until)
            if late is not None:
                return late
            situation, _ = yield from self._look(step, verdict, until)
        return situation

    def _late_answer(
        self, step: records.StepRecord, until: float
    ) -> Generator[requests.Request, Any, Situation | None]:
        """A call of this step that outlived its timeout and still runs here is waited for (up to
        its bound, or ``LATE_ANSWER_WAIT``): its answer is the best evidence there is, and while it
        runs no lookup can prove it did nothing. None when there is no such call, or it still runs.
        """
        st = self.state
        running = [a for a in self._calls_in_doubt() if a.attempt_id in st.in_flight]
        if not running or step.status is StepStatus.AWAITING_COMPLETION:
            return None
        attempt = running[-1]
        wait = LATE_ANSWER_WAIT if until == math.inf else until - self.port.clock()
        result: requests.Result | None = yield requests.AwaitCall(
            st.in_flight[attempt.attempt_id], max(0.0, wait)
        )
        if result is None:
            return None
        del st.in_flight[attempt.attempt_id]
        return (yield from self._record_outcome(step, attempt, result, late=True))

    def _look(
        self, step: records.StepRecord, verdict: decision.Decision, until: float
    ) -> Generator[requests.Request, Any, tuple[Situation, bool]]:
        """One lookup, recorded: (situation, whether "not found" was demoted to unknown because the
        call may still land until ``until``)."""
        st = self.state
        assert self.contract.confirm is not None
        lookup_tool = self.port.registry.tool(self.contract.confirm)
        now = self.port.clock()
        attempt = self._new_attempt(records.AttemptKind.LOOKUP, now)
        kwargs: dict[str, Any] = {}
        params = lookup_tool.signature.parameters
        if "idempotency_key" in params:
            kwargs["idempotency_key"] = self.key
        if "external_effect_id" in params:
            kwargs["external_effect_id"] = step.external_effect_id
        result: requests.Result = yield requests.Invoke(
            lookup_tool, (), kwargs, lookup_tool.contract.timeout
        )
        self.port.faults.hit(FaultPoint.AFTER_LOOKUP_BEFORE_RECORD, self.step_id)
        now = self.port.clock()
        answer = outcomes.lookup_answer(result)
        premature = answer.status is LookupStatus.NOT_COMMITTED and until > now
        if premature and step.status is not StepStatus.AWAITING_COMPLETION:
            answer = Lookup.unknown(
                reason=(
                    "not found, but the call may still land: "
                    + (
                        "its tool takes no deadline and declares no settles_within"
                        if until == math.inf
                        else f"not before {until:.3f} (its deadline or settles_within)"
                    )
                ),
                evidence=answer.evidence,
            )
        effect = self._effect(step)
        batch = st.batch()
        if answer.status is LookupStatus.CONFIRMED:
            outcome, situation = Outcome.COMMITTED, Situation.CONFIRMED
        elif answer.status is LookupStatus.NOT_COMMITTED:
            outcome, situation = Outcome.NOT_COMMITTED, Situation.NOT_COMMITTED
        else:
            outcome, situation = Outcome.UNKNOWN, Situation.IN_DOUBT
        evidence = digests.to_jsonable(answer.evidence, path=f"{self.step_id}.lookup.evidence")
        code = NOT_FOUND_MAY_STILL_LAND if premature else "unknown"
        ended = dataclasses.replace(
            attempt,
            ended_at=now,
            outcome=outcome,
            error=None if answer.reason is None else {"code": code, "message": answer.reason},
        )
        batch.attempt(ended)
        if step.status is StepStatus.AWAITING_COMPLETION and situation is not Situation.CONFIRMED:
            # The effect was accepted; a poll that cannot see it does not make it unknown again.
            situation = Situation.BELOW_REQUIRED_STATE
            status = StepStatus.AWAITING_COMPLETION
        else:
            status = outcomes.status_of(situation)
        step = dataclasses.replace(step, status=status, updated_at=now)
        effect = dataclasses.replace(
            effect, status=status, version=effect.version + 1, updated_at=now, evidence=evidence
        )
        if answer.status is LookupStatus.CONFIRMED:
            output = step.output if step.output is not None else answer.result
            if output is None:
                output = {
                    **evidence,
                    **(
                        {self.contract.effect_id: answer.external_effect_id}
                        if self.contract.effect_id
                        else {}
                    ),
                }
            output = self._recordable(output)
            if answer.external_effect_id is not None:
                effect = dataclasses.replace(effect, external_effect_id=answer.external_effect_id)
            step, effect = self._confirm(step, effect, output, now, state=answer.state)
            if step.status is StepStatus.AWAITING_COMPLETION:
                situation = Situation.BELOW_REQUIRED_STATE
            else:
                self._answer_original(batch, now)
        elif status is StepStatus.AWAITING_COMPLETION:
            step = dataclasses.replace(step, next_action=NextAction.WAIT)
            effect = dataclasses.replace(effect, next_action=NextAction.WAIT)
        else:
            next_action = outcomes.next_action_of(situation)
            step = dataclasses.replace(step, next_action=next_action)
            effect = dataclasses.replace(effect, next_action=next_action)
        batch.step(step)
        batch.effect(effect)
        self.effect = effect
        batch.event(
            "lookup",
            now,
            step_id=self.step_id,
            effect_id=effect.effect_id,
            lookup_tool=lookup_tool.ref,
            answer=answer.status.value,
            state=answer.state,
            reason=answer.reason,
            row=verdict.row,
            external_effect_id=answer.external_effect_id,
            evidence=evidence,
        )
        yield requests.Commit(batch)
        st.steps[self.step_id] = step
        st.note_attempt(ended)
        return situation, premature

    def _ask_a_person(
        self, step: records.StepRecord, verdict: decision.Decision
    ) -> Generator[requests.Request, Any, None]:
        st = self.state
        for attempt in self._calls_in_doubt():
            handle = st.in_flight.pop(attempt.attempt_id, None)
            if handle is not None:  # still running: its answer is recorded when it comes
                late.record_when_done(self, attempt, handle)
        now = self.port.clock()
        step, effect = self._mark(step, StepStatus.NEEDS_ATTENTION, NextAction.ASK_A_PERSON, now)
        batch = st.batch()
        batch.step(step)
        batch.effect(effect)
        self.effect = effect
        batch.run_changes.update(
            status=records.RunStatus.PAUSED,
            next_action=NextAction.ASK_A_PERSON,
            error={
                "code": "needs_attention",
                "message": verdict.reason,
                "step_id": self.step_id,
                "effect_id": effect.effect_id,
                "row": verdict.row,
            },
            lease_owner=None,
            lease_expires_at=None,
        )
        batch.event(
            "needs_attention",
            now,
            step_id=self.step_id,
            effect_id=effect.effect_id,
            row=verdict.row,
            reason=verdict.reason,
        )
        batch.event("run_paused", now, step_id=self.step_id, reason=verdict.reason)
        yield requests.Commit(batch)
        st.steps[self.step_id] = step
        raise requests.Suspend(self.step_id, verdict.reason)

    def _fail(self, step: records.StepRecord, verdict: decision.Decision) -> errors.EffectflowError:
        """Record a definite failure (it rides with the run's failure commit) and build the error."""
        st = self.state
        now = self.port.clock()
        step, effect = self._mark(step, verdict.status, NextAction.NONE, now)
        st.steps[self.step_id] = step
        st.pending.step(step)
        st.pending.effect(effect)
        self.effect = effect
        st.pending.event(
            "step_" + verdict.status.value,
            now,
            step_id=self.step_id,
            effect_id=effect.effect_id,
            row=verdict.row,
            reason=verdict.reason,
        )
        message = f"step {self.step_id}: {verdict.reason}"
        if step.error:
            message += f" (last error: {step.error.get('message')})"
        if verdict.status is StepStatus.REJECTED:
            if (step.error or {}).get("type") == "IdempotencyConflict":
                return errors.IdempotencyConflict(
                    message, run_id=self.run_id, step_id=self.step_id, idempotency_key=self.key
                )
            return errors.StepRejected(message, run_id=self.run_id, step_id=self.step_id)
        return errors.RetryBudgetExhausted(message, run_id=self.run_id, step_id=self.step_id)

    def _calls_in_doubt(self) -> list[records.AttemptRecord]:
        """The step's calls that may have committed, with no proof of "not committed" since."""
        doubtful: list[records.AttemptRecord] = []
        for attempt in self.state.attempts(self.step_id):
            if attempt.kind is records.AttemptKind.CALL:
                if attempt.outcome in (None, Outcome.UNKNOWN):
                    doubtful.append(attempt)
            elif attempt.outcome is Outcome.NOT_COMMITTED:
                doubtful = []  # a lookup or a person proved the calls before it did nothing
        return doubtful

    def _may_land_until(self, step: records.StepRecord) -> float:
        """The moment after which no unresolved call of the step can reach the provider any more
        (DESIGN §3.1); ``math.inf`` when that cannot be known, and the past when none is open.

        A call can no longer land once its enforced deadline passed (the tool takes ``deadline``,
        which the provider refuses calls after), or once the contract's ``settles_within`` passed
        since it was sent — unless it still runs here (it may not even have been sent yet). The
        runtime's own ``timeout`` bounds nothing: it is when the runtime stops waiting, not when
        the provider stops committing.
        """
        if step.status is StepStatus.AWAITING_COMPLETION:
            return -math.inf
        st = self.state
        settles = self.contract.settles_within_seconds
        window = self.contract.timeout or DEFAULT_CALL_WINDOW
        until = -math.inf
        for call in self._calls_in_doubt():
            # A call made here: when it was handed to the tool. One an earlier holder of the run
            # made: no later than this process's claim (that holder was dead, or past its lease,
            # and the engine never starts a call on a lease it cannot prove).
            sent = st.sent_at.get(call.attempt_id, max(call.started_at, st.claimed_at))
            handle = st.in_flight.get(call.attempt_id)
            running_here = handle is not None and not handle.done()
            bounds = []
            if self.tool.takes_deadline:
                due = st.call_deadlines.get(call.attempt_id, sent + window)
                bounds.append(due + DEADLINE_GRACE)
            if settles is not None and not running_here:
                bounds.append(sent + settles)
            until = max(until, min(bounds) if bounds else math.inf)
        return until

    # -- completion -------------------------------------------------------------------------------

    def _completion_wait(self, step: records.StepRecord) -> float:
        """How long to wait before the next completion poll: backoff, but never past the deadline."""
        completion = self.contract.completion
        assert completion is not None
        polls = self._count(records.AttemptKind.LOOKUP)
        wait = retry.backoff(self.contract.retry, max(polls, 1), self.state.rng)
        accepted = self._effect(step).committed_at or step.updated_at
        remaining = accepted + completion.deadline_seconds - self.port.clock()
        return max(0.0, min(wait, remaining))

    # -- compensation bookkeeping -----------------------------------------------------------------

    def _answer_original(self, batch: Any, now: float) -> None:
        """A compensation just confirmed: mark the effect it answers (which stays confirmed)."""
        original = self.compensates
        if original is None:
            return
        self._mark_original(batch, original, "compensated", now)

    def _mark_original(
        self, batch: Any, original: records.EffectRecord, status: str, now: float
    ) -> None:
        st = self.state
        effect = self.port.store.get_effect(original.effect_id) or original
        effect = dataclasses.replace(
            effect, compensation_status=status, version=effect.version + 1, updated_at=now
        )
        batch.effect(effect)
        self.compensates = effect
        owner = st.steps.get(effect.step_id)
        if owner is not None:
            owner = dataclasses.replace(owner, compensation_status=status, updated_at=now)
            st.steps[owner.step_id] = owner
            batch.step(owner)

    # -- approvals --------------------------------------------------------------------------------

    def _approval(self) -> records.ApprovalRecord | None:
        """The approval given for this step's exact request, if any."""
        for approval in reversed(self.port.store.approvals(self.run_id, self.step_id)):
            if approval.request_digest == self.request_digest:
                return approval
        return None

    def _await_approval(
        self, existing: records.StepRecord | None
    ) -> Generator[requests.Request, Any, None]:
        """Record the step as waiting for a person's approval, pause the run, and unwind."""
        st = self.state
        now = self.port.clock()
        reason = (
            f"{self.tool.ref} is a {self.contract.effect.value}"
            + (" compensation" if self.compensates is not None else "")
            + ": it needs an approval (rt.approve) before the call"
        )
        step = self._step_record(existing, StepStatus.PENDING, now)
        step = dataclasses.replace(
            step,
            next_action=NextAction.ASK_A_PERSON,
            error={"code": "approval_required", "message": reason},
        )
        batch = st.batch()
        st.link_previous(self.step_id, batch)
        batch.step(step)
        batch.run_changes.update(
            status=records.RunStatus.PAUSED,
            next_action=NextAction.ASK_A_PERSON,
            error={
                "code": "approval_required",
                "message": reason,
                "step_id": self.step_id,
                "request_digest": self.request_digest,
            },
            lease_owner=None,
            lease_expires_at=None,
        )
        batch.event(
            "approval_requested",
            now,
            step_id=self.step_id,
            tool=self.tool.ref,
            request_digest=self.request_digest,
            compensates=None if self.compensates is None else self.compensates.effect_id,
        )
        batch.event("run_paused", now, step_id=self.step_id, reason=reason)
        yield requests.Commit(batch)
        st.steps[self.step_id] = step
        raise requests.Suspend(self.step_id, reason)

    # -- conflicts --------------------------------------------------------------------------------

    def _reobserve(
        self, step: records.StepRecord, verdict: decision.Decision
    ) -> Generator[requests.Request, Any, None]:
        """A precondition failed: re-run the observation step (new revision), never overwrite."""
        st = self.state
        sc = self.step_contract
        observe = self.observe or (sc.observe if sc is not None else None)
        limit = sc.max_reobserve if sc is not None else 3
        observed = st.steps.get(observe) if observe else None
        if observed is None or observed.step_revision > limit:
            why = (
                "no observation step is named (ctx.call(..., observe=...))"
                if observed is None
                else f"it was re-observed {limit} times and still conflicts"
            )
            yield from self._ask_a_person(
                step,
                dataclasses.replace(verdict, reason=f"{verdict.reason}; {why}: a person decides"),
            )
            return
        now = self.port.clock()
        fresh = dataclasses.replace(
            observed,
            step_revision=observed.step_revision + 1,
            status=StepStatus.PENDING,
            output=None,
            confirmed_at=None,
            next_action=NextAction.EXECUTE,
            updated_at=now,
        )
        batch = st.batch()
        batch.step(fresh)
        batch.event(
            "reobserve",
            now,
            step_id=self.step_id,
            effect_id=step.effect_id,
            observe=observe,
            observe_revision=fresh.step_revision,
            row=verdict.row,
            reason=verdict.reason,
        )
        yield requests.Commit(batch)
        st.steps[observed.step_id] = fresh
        raise requests.Restart(self.step_id, f"re-observe {observe} after a conflict")
