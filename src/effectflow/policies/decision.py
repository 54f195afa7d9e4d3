"""The decision table (docs/decision-table.md): data, plus one pure function.

The write path, recovery, reconciliation and cancel all ask ``decide(situation, facts)`` what to do;
none of them decides on its own. Each answer names the table row it came from, which the audit log
records, so an operator can see *why* the runtime retried, looked up, or stopped and asked.
"""

from __future__ import annotations

import dataclasses
import enum

from effectflow.contracts.tool import CommitSemantics, EffectClass
from effectflow.contracts.workflow import WhenNotCommitted, WhenUnknown
from effectflow.ledger.records import NextAction, StepStatus


class Situation(enum.StrEnum):
    """What the ledger (or the attempt that just ended) says about a step."""

    #: The step is already confirmed.
    CONFIRMED = "confirmed"
    #: Nothing was persisted for it yet (or the crash came before the intent committed).
    NOT_STARTED = "not_started"
    #: The intent is persisted but there is no outcome (crash, timeout, unknown answer).
    IN_DOUBT = "in_doubt"
    #: The provider rejected the request.
    REJECTED = "rejected"
    #: Provably nothing happened (a transient error before sending, or a lookup found nothing).
    NOT_COMMITTED = "not_committed"
    #: A precondition or revision check failed.
    CONFLICT = "conflict"
    #: Accepted, but the contract requires a later completion state.
    BELOW_REQUIRED_STATE = "below_required_state"
    #: The business goal was abandoned (``AbandonGoal``, or an operator's compensate).
    GOAL_ABANDONED = "goal_abandoned"
    #: The run failed for a technical reason.
    TECHNICAL_FAILURE = "technical_failure"
    #: A ``local_transaction`` write whose transaction did not commit.
    TRANSACTION_NOT_COMMITTED = "transaction_not_committed"


class Action(enum.StrEnum):
    """What the runtime does."""

    #: Skip the call; return the recorded output.
    USE_RECORDED = "use_recorded"
    #: Call the tool (nothing was sent before).
    EXECUTE = "execute"
    #: Call again with the original idempotency key.
    RETRY_WITH_ORIGINAL_KEY = "retry_with_original_key"
    #: Ask the lookup tool by key / external id.
    LOOKUP = "lookup"
    #: Stop: the step needs a person, the run pauses.
    ASK_A_PERSON = "ask_a_person"
    #: The step failed definitively (rejected, or budget spent).
    FAIL = "fail"
    #: Re-run the observation step (or pause); never overwrite.
    REOBSERVE = "reobserve"
    #: Poll the lookup until the required state or the deadline.
    AWAIT_COMPLETION = "await_completion"
    #: Run the compensation as a new effect.
    COMPENSATE = "compensate"
    #: Keep the confirmed effect as a fact; a business follow-up may run.
    KEEP_EFFECT = "keep_effect"
    #: Do nothing to completed effects: they are facts.
    NO_COMPENSATION = "no_compensation"
    #: Roll the local transaction back.
    ROLLBACK = "rollback"


@dataclasses.dataclass(frozen=True)
class Facts:
    """What the contracts and the ledger say, as far as the table needs to know."""

    #: The tool's effect class.
    effect: EffectClass
    #: The provider honours our key, and the key is still within its retention.
    idempotent: bool = False
    #: A lookup tool can confirm the effect.
    has_lookup: bool = False
    #: The tool's commit semantics.
    commit: CommitSemantics = CommitSemantics.REMOTE_ATOMIC
    #: Calls made in this generation (the first included).
    attempts_used: int = 0
    #: The budget of calls.
    max_attempts: int = 3
    #: Lookups made in this generation.
    lookups_used: int = 0
    #: The budget of lookups.
    max_lookups: int = 3
    #: The step's policy for an unknown outcome.
    when_unknown: WhenUnknown = WhenUnknown.RECONCILE_THEN_PAUSE
    #: The step's policy for a provably uncommitted attempt.
    when_not_committed: WhenNotCommitted = WhenNotCommitted.RETRY_WITH_ORIGINAL_KEY
    #: A compensation tool exists.
    has_compensation: bool = False
    #: The step's compensation trigger matches the situation.
    trigger_matches: bool = False
    #: The completion deadline has passed.
    deadline_passed: bool = False
    #: The last lookup found nothing, but the call may still land (no enforced deadline passed and
    #: no declared ``settles_within``): "not found" was no proof
    #: (docs/decision-table.md#when-not-found-is-proof).
    may_still_land: bool = False


@dataclasses.dataclass(frozen=True)
class Decision:
    """The table's answer."""

    #: What to do.
    action: Action
    #: The status to record on the step.
    status: StepStatus
    #: What the step record says happens next.
    next_action: NextAction
    #: The id of the table row that applied (audit, docs).
    row: str
    #: Why, in words an operator reads.
    reason: str


def _d(
    action: Action, status: StepStatus, next_action: NextAction, row: str, reason: str
) -> Decision:
    return Decision(action, status, next_action, row, reason)


def decide(situation: Situation, facts: Facts) -> Decision:
    """The action for ``situation`` under ``facts`` (docs/decision-table.md, one row per branch)."""
    if situation is Situation.CONFIRMED:
        return _d(
            Action.USE_RECORDED,
            StepStatus.CONFIRMED,
            NextAction.USE_RESULT,
            "confirmed",
            "already confirmed: skip and return the recorded output",
        )
    if situation is Situation.NOT_STARTED:
        return _d(
            Action.EXECUTE,
            StepStatus.PENDING,
            NextAction.EXECUTE,
            "not_started",
            "nothing was sent: run it",
        )
    if situation is Situation.IN_DOUBT:
        return _in_doubt(facts)
    if situation is Situation.REJECTED:
        return _d(
            Action.FAIL,
            StepStatus.REJECTED,
            NextAction.NONE,
            "rejected",
            "the provider rejected the request: no retry, no automatic compensation",
        )
    if situation is Situation.NOT_COMMITTED:
        return _not_committed(facts)
    if situation is Situation.CONFLICT:
        return _d(
            Action.REOBSERVE,
            StepStatus.CONFLICT,
            NextAction.EXECUTE,
            "conflict",
            "precondition failed: re-observe with a new step revision (or pause); never overwrite",
        )
    if situation is Situation.BELOW_REQUIRED_STATE:
        if facts.deadline_passed:
            return _d(
                Action.ASK_A_PERSON,
                StepStatus.NEEDS_ATTENTION,
                NextAction.ASK_A_PERSON,
                "completion_deadline",
                "the required completion state was not reached before the deadline",
            )
        return _d(
            Action.AWAIT_COMPLETION,
            StepStatus.AWAITING_COMPLETION,
            NextAction.WAIT,
            "awaiting_completion",
            "accepted: poll the lookup until the required state or the deadline",
        )
    if situation is Situation.GOAL_ABANDONED:
        if facts.has_compensation and facts.trigger_matches:
            return _d(
                Action.COMPENSATE,
                StepStatus.COMPENSATION_PENDING,
                NextAction.EXECUTE,
                "abandoned_compensable",
                "goal abandoned: compensate as a new effect with its own key",
            )
        return _d(
            Action.KEEP_EFFECT,
            StepStatus.CONFIRMED,
            NextAction.NONE,
            "abandoned_irreversible",
            "goal abandoned but the effect has no compensation (or the trigger does not match): "
            "it stays confirmed; a business follow-up may run",
        )
    if situation is Situation.TECHNICAL_FAILURE:
        return _d(
            Action.NO_COMPENSATION,
            StepStatus.CONFIRMED,
            NextAction.NONE,
            "technical_failure",
            "technical failure of the run: completed effects are facts, nothing is compensated",
        )
    if situation is Situation.TRANSACTION_NOT_COMMITTED:
        return _d(
            Action.ROLLBACK,
            StepStatus.NOT_COMMITTED,
            NextAction.EXECUTE,
            "local_rollback",
            "the local transaction did not commit: real rollback",
        )
    raise AssertionError(f"unhandled situation {situation!r}")  # pragma: no cover


def _in_doubt(facts: Facts) -> Decision:
    if not facts.effect.writes:
        return _d(
            Action.EXECUTE,
            StepStatus.INTENT_RECORDED,
            NextAction.EXECUTE,
            "in_doubt_pure_read",
            "a pure or read step may simply run again",
        )
    if facts.commit is CommitSemantics.LOCAL_TRANSACTION:
        return _d(
            Action.ROLLBACK,
            StepStatus.NOT_COMMITTED,
            NextAction.EXECUTE,
            "local_rollback",
            "a local transaction has no unknown window: it committed with its checkpoint or not at all",
        )
    if facts.when_unknown is WhenUnknown.PAUSE:
        return _ask("in_doubt_policy_pause", "the step's policy is to pause on an unknown outcome")
    if facts.idempotent and facts.attempts_used < facts.max_attempts:
        return _d(
            Action.RETRY_WITH_ORIGINAL_KEY,
            StepStatus.UNKNOWN,
            NextAction.EXECUTE,
            "in_doubt_idempotent",
            "the provider honours the key: retry with the original key; a replay is the effect",
        )
    if facts.has_lookup and facts.lookups_used < facts.max_lookups:
        return _d(
            Action.LOOKUP,
            StepStatus.UNKNOWN,
            NextAction.RECONCILE,
            "in_doubt_lookup",
            "may have committed: look it up by key / external id before anything else; "
            '"not found" is proof only once the call can no longer land (its enforced deadline '
            "or settles_within passed): until then, wait for that bound and look again",
        )
    if facts.has_lookup and facts.may_still_land:
        return _ask(
            "in_doubt_may_still_land",
            "the lookups found nothing, but the call may still land (no enforced deadline, no "
            "settles_within): never a second call on that; a person decides",
        )
    if facts.has_lookup or facts.idempotent:
        return _ask(
            "in_doubt_budget_spent",
            "still unknown after the retry and lookup budget: a person must decide",
        )
    return _ask(
        "in_doubt_no_lookup",
        "may have committed, no idempotency and no lookup: never blind-retry, ask a person",
    )


def _not_committed(facts: Facts) -> Decision:
    if facts.when_not_committed is WhenNotCommitted.PAUSE:
        return _ask("not_committed_policy_pause", "not committed; the step's policy is to pause")
    if facts.when_not_committed is WhenNotCommitted.FAIL:
        return _d(
            Action.FAIL,
            StepStatus.FAILED,
            NextAction.NONE,
            "not_committed_policy_fail",
            "not committed; the step's policy is to fail",
        )
    if facts.attempts_used < facts.max_attempts:
        return _d(
            Action.RETRY_WITH_ORIGINAL_KEY,
            StepStatus.NOT_COMMITTED,
            NextAction.EXECUTE,
            "not_committed_retry",
            "nothing was committed: retry with backoff and the original key",
        )
    return _d(
        Action.FAIL,
        StepStatus.FAILED,
        NextAction.NONE,
        "budget_spent",
        "not committed and the retry budget is spent: the run fails, listing its effects",
    )


def _ask(row: str, reason: str) -> Decision:
    return _d(Action.ASK_A_PERSON, StepStatus.NEEDS_ATTENTION, NextAction.ASK_A_PERSON, row, reason)


#: One representative input per row of the table, in the order docs/decision-table.md prints them:
#: the docs and the tests are generated from it, so the printed table is the function's actual
#: behaviour.
EXAMPLES: tuple[tuple[str, Situation, Facts], ...] = (
    ("step already confirmed", Situation.CONFIRMED, Facts(EffectClass.EXTERNAL_WRITE)),
    (
        "failed before the intent was persisted",
        Situation.NOT_STARTED,
        Facts(EffectClass.EXTERNAL_WRITE),
    ),
    ("intent persisted, no outcome; pure or read", Situation.IN_DOUBT, Facts(EffectClass.READ)),
    (
        "intent persisted, no outcome; idempotency supported (key within retention)",
        Situation.IN_DOUBT,
        Facts(EffectClass.EXTERNAL_WRITE, idempotent=True, attempts_used=1),
    ),
    (
        "intent persisted, no outcome; not idempotent, has lookup",
        Situation.IN_DOUBT,
        Facts(EffectClass.EXTERNAL_WRITE, has_lookup=True, attempts_used=1),
    ),
    (
        "still unknown after the retry and lookup budgets",
        Situation.IN_DOUBT,
        Facts(EffectClass.EXTERNAL_WRITE, has_lookup=True, lookups_used=3, attempts_used=1),
    ),
    (
        "lookups found nothing, but the call may still land (no deadline, no bound)",
        Situation.IN_DOUBT,
        Facts(
            EffectClass.EXTERNAL_WRITE,
            has_lookup=True,
            lookups_used=3,
            attempts_used=1,
            may_still_land=True,
        ),
    ),
    (
        "intent persisted, no outcome; not idempotent, no lookup",
        Situation.IN_DOUBT,
        Facts(EffectClass.EXTERNAL_WRITE, attempts_used=1),
    ),
    (
        "intent persisted, no outcome; step policy when_unknown=pause",
        Situation.IN_DOUBT,
        Facts(EffectClass.EXTERNAL_WRITE, idempotent=True, when_unknown=WhenUnknown.PAUSE),
    ),
    ("provider rejected (validation, 4xx)", Situation.REJECTED, Facts(EffectClass.EXTERNAL_WRITE)),
    (
        "transient error before anything was sent (or lookup: not committed)",
        Situation.NOT_COMMITTED,
        Facts(EffectClass.EXTERNAL_WRITE, attempts_used=1),
    ),
    (
        "not committed; step policy when_not_committed=pause",
        Situation.NOT_COMMITTED,
        Facts(EffectClass.EXTERNAL_WRITE, when_not_committed=WhenNotCommitted.PAUSE),
    ),
    (
        "not committed; step policy when_not_committed=fail",
        Situation.NOT_COMMITTED,
        Facts(EffectClass.EXTERNAL_WRITE, when_not_committed=WhenNotCommitted.FAIL),
    ),
    (
        "retry budget spent, not committed",
        Situation.NOT_COMMITTED,
        Facts(EffectClass.EXTERNAL_WRITE, attempts_used=3, max_attempts=3),
    ),
    ("precondition / revision conflict", Situation.CONFLICT, Facts(EffectClass.EXTERNAL_WRITE)),
    (
        "accepted but the required state is later (async_accepted)",
        Situation.BELOW_REQUIRED_STATE,
        Facts(EffectClass.EXTERNAL_WRITE, commit=CommitSemantics.ASYNC_ACCEPTED),
    ),
    (
        "required completion state not reached by the deadline",
        Situation.BELOW_REQUIRED_STATE,
        Facts(EffectClass.EXTERNAL_WRITE, deadline_passed=True),
    ),
    (
        "business goal abandoned; confirmed, compensation tool, trigger matches",
        Situation.GOAL_ABANDONED,
        Facts(EffectClass.FINANCIAL_WRITE, has_compensation=True, trigger_matches=True),
    ),
    (
        "business goal abandoned; confirmed, irreversible, no compensation",
        Situation.GOAL_ABANDONED,
        Facts(EffectClass.EXTERNAL_WRITE),
    ),
    (
        "technical failure of the run",
        Situation.TECHNICAL_FAILURE,
        Facts(EffectClass.EXTERNAL_WRITE),
    ),
    (
        "local transaction not committed",
        Situation.TRANSACTION_NOT_COMMITTED,
        Facts(EffectClass.EXTERNAL_WRITE, commit=CommitSemantics.LOCAL_TRANSACTION),
    ),
)


def render_markdown() -> str:
    """The decision table as Markdown, computed by calling ``decide`` on every example."""
    lines = [
        "| situation | action | step status | next action | row |",
        "| --- | --- | --- | --- | --- |",
    ]
    for label, situation, facts in EXAMPLES:
        d = decide(situation, facts)
        lines.append(
            f"| {label} | `{d.action}` — {d.reason} | `{d.status}` | `{d.next_action}` | `{d.row}` |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover - `python -m effectflow.policies.decision`
    print(render_markdown(), end="")
