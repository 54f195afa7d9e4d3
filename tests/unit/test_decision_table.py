"""The decision table (docs/decision-table.md), row by row, and its totality."""

from __future__ import annotations

import itertools

import pytest

from effectflow.contracts.tool import CommitSemantics, EffectClass
from effectflow.contracts.workflow import WhenNotCommitted, WhenUnknown
from effectflow.ledger.records import NextAction, StepStatus
from effectflow.policies.decision import Action, Decision, Facts, Situation, decide

S = Situation
A = Action
ST = StepStatus
NA = NextAction
WRITE = EffectClass.EXTERNAL_WRITE

# (row, situation, facts, action, status, next_action): one per row of docs/decision-table.md.
ROWS = [
    ("confirmed", S.CONFIRMED, Facts(WRITE), A.USE_RECORDED, ST.CONFIRMED, NA.USE_RESULT),
    ("not_started", S.NOT_STARTED, Facts(WRITE), A.EXECUTE, ST.PENDING, NA.EXECUTE),
    (
        "in_doubt_pure_read",
        S.IN_DOUBT,
        Facts(EffectClass.READ, attempts_used=9, max_attempts=1),
        A.EXECUTE,
        ST.INTENT_RECORDED,
        NA.EXECUTE,
    ),
    (
        "in_doubt_idempotent",
        S.IN_DOUBT,
        Facts(EffectClass.IDEMPOTENT_WRITE, idempotent=True, attempts_used=1),
        A.RETRY_WITH_ORIGINAL_KEY,
        ST.UNKNOWN,
        NA.EXECUTE,
    ),
    (
        "in_doubt_lookup",
        S.IN_DOUBT,
        Facts(WRITE, has_lookup=True, attempts_used=1, lookups_used=2),
        A.LOOKUP,
        ST.UNKNOWN,
        NA.RECONCILE,
    ),
    (
        "in_doubt_no_lookup",
        S.IN_DOUBT,
        Facts(WRITE, attempts_used=1),
        A.ASK_A_PERSON,
        ST.NEEDS_ATTENTION,
        NA.ASK_A_PERSON,
    ),
    (
        "in_doubt_budget_spent",
        S.IN_DOUBT,
        Facts(WRITE, has_lookup=True, attempts_used=1, lookups_used=3, max_lookups=3),
        A.ASK_A_PERSON,
        ST.NEEDS_ATTENTION,
        NA.ASK_A_PERSON,
    ),
    (
        "in_doubt_policy_pause",
        S.IN_DOUBT,
        Facts(WRITE, idempotent=True, has_lookup=True, when_unknown=WhenUnknown.PAUSE),
        A.ASK_A_PERSON,
        ST.NEEDS_ATTENTION,
        NA.ASK_A_PERSON,
    ),
    (
        "rejected",
        S.REJECTED,
        Facts(WRITE, idempotent=True, has_compensation=True, trigger_matches=True),
        A.FAIL,
        ST.REJECTED,
        NA.NONE,
    ),
    (
        "not_committed_retry",
        S.NOT_COMMITTED,
        Facts(WRITE, attempts_used=2, max_attempts=3),
        A.RETRY_WITH_ORIGINAL_KEY,
        ST.NOT_COMMITTED,
        NA.EXECUTE,
    ),
    (
        "budget_spent",
        S.NOT_COMMITTED,
        Facts(WRITE, attempts_used=3, max_attempts=3),
        A.FAIL,
        ST.FAILED,
        NA.NONE,
    ),
    (
        "not_committed_policy_pause",
        S.NOT_COMMITTED,
        Facts(WRITE, attempts_used=1, when_not_committed=WhenNotCommitted.PAUSE),
        A.ASK_A_PERSON,
        ST.NEEDS_ATTENTION,
        NA.ASK_A_PERSON,
    ),
    (
        "not_committed_policy_fail",
        S.NOT_COMMITTED,
        Facts(WRITE, attempts_used=1, when_not_committed=WhenNotCommitted.FAIL),
        A.FAIL,
        ST.FAILED,
        NA.NONE,
    ),
    ("conflict", S.CONFLICT, Facts(WRITE), A.REOBSERVE, ST.CONFLICT, NA.EXECUTE),
    (
        "awaiting_completion",
        S.BELOW_REQUIRED_STATE,
        Facts(WRITE, commit=CommitSemantics.ASYNC_ACCEPTED),
        A.AWAIT_COMPLETION,
        ST.AWAITING_COMPLETION,
        NA.WAIT,
    ),
    (
        "completion_deadline",
        S.BELOW_REQUIRED_STATE,
        Facts(WRITE, commit=CommitSemantics.ASYNC_ACCEPTED, deadline_passed=True),
        A.ASK_A_PERSON,
        ST.NEEDS_ATTENTION,
        NA.ASK_A_PERSON,
    ),
    (
        "abandoned_compensable",
        S.GOAL_ABANDONED,
        Facts(EffectClass.FINANCIAL_WRITE, has_compensation=True, trigger_matches=True),
        A.COMPENSATE,
        ST.COMPENSATION_PENDING,
        NA.EXECUTE,
    ),
    (
        "abandoned_irreversible",
        S.GOAL_ABANDONED,
        Facts(WRITE, has_compensation=False, trigger_matches=True),
        A.KEEP_EFFECT,
        ST.CONFIRMED,
        NA.NONE,
    ),
    (
        "technical_failure",
        S.TECHNICAL_FAILURE,
        Facts(WRITE, has_compensation=True, trigger_matches=True),
        A.NO_COMPENSATION,
        ST.CONFIRMED,
        NA.NONE,
    ),
    (
        "local_rollback",
        S.TRANSACTION_NOT_COMMITTED,
        Facts(WRITE, commit=CommitSemantics.LOCAL_TRANSACTION),
        A.ROLLBACK,
        ST.NOT_COMMITTED,
        NA.EXECUTE,
    ),
]


@pytest.mark.parametrize(
    ("row", "situation", "facts", "action", "status", "next_action"),
    ROWS,
    ids=[r[0] for r in ROWS],
)
def test_row(
    row: str,
    situation: Situation,
    facts: Facts,
    action: Action,
    status: StepStatus,
    next_action: NextAction,
) -> None:
    """Each row of docs/decision-table.md yields its action, step status, next action and row id."""
    decided = decide(situation, facts)
    assert (decided.action, decided.status, decided.next_action, decided.row) == (
        action,
        status,
        next_action,
        row,
    )
    assert decided.reason


def test_in_doubt_local_transaction_rolls_back() -> None:
    """A local_transaction write has no unknown window: in doubt means it rolled back."""
    facts = Facts(WRITE, commit=CommitSemantics.LOCAL_TRANSACTION)
    decided = decide(S.IN_DOUBT, facts)
    assert (decided.action, decided.row) == (A.ROLLBACK, "local_rollback")


def test_idempotent_retry_budget_spent_without_lookup_asks_a_person() -> None:
    """An idempotent call whose retries are spent and that has no lookup goes to a person."""
    facts = Facts(EffectClass.IDEMPOTENT_WRITE, idempotent=True, attempts_used=3, max_attempts=3)
    decided = decide(S.IN_DOUBT, facts)
    assert (decided.action, decided.row) == (A.ASK_A_PERSON, "in_doubt_budget_spent")


def test_idempotent_retry_budget_spent_falls_back_to_lookup() -> None:
    """An idempotent call whose retries are spent is looked up when a lookup exists."""
    facts = Facts(WRITE, idempotent=True, has_lookup=True, attempts_used=3, max_attempts=3)
    assert decide(S.IN_DOUBT, facts).action is A.LOOKUP


def _facts_sample() -> list[Facts]:
    return [
        Facts(
            effect=effect,
            idempotent=idempotent,
            has_lookup=has_lookup,
            commit=commit,
            attempts_used=attempts,
            max_attempts=3,
            lookups_used=lookups,
            max_lookups=3,
            when_unknown=when_unknown,
            when_not_committed=when_not_committed,
            has_compensation=has_compensation,
            trigger_matches=trigger,
            deadline_passed=deadline,
        )
        for (
            effect,
            idempotent,
            has_lookup,
            commit,
            attempts,
            lookups,
            when_unknown,
            when_not_committed,
            has_compensation,
            trigger,
            deadline,
        ) in itertools.product(
            EffectClass,
            (False, True),
            (False, True),
            CommitSemantics,
            (0, 3),
            (0, 3),
            WhenUnknown,
            WhenNotCommitted,
            (False, True),
            (False, True),
            (False, True),
        )
    ]


FACTS_SAMPLE = _facts_sample()


def test_decide_is_total_and_every_row_is_tested() -> None:
    """Every situation under every sampled contract gets a Decision from a row tested above."""
    tested_rows = {r[0] for r in ROWS}
    seen_rows: set[str] = set()
    for situation in Situation:
        for facts in FACTS_SAMPLE:
            decided = decide(situation, facts)
            assert isinstance(decided, Decision)
            assert isinstance(decided.action, Action)
            assert isinstance(decided.status, StepStatus)
            assert isinstance(decided.next_action, NextAction)
            assert decided.reason
            seen_rows.add(decided.row)
    assert seen_rows == tested_rows


def test_in_doubt_write_is_never_rerun_without_key_or_lookup() -> None:
    """A write that may have committed is re-run only with a key the provider honours
    (docs/concepts.md#never-twice-never-by-guess)."""
    for facts in FACTS_SAMPLE:
        if not facts.effect.writes or facts.commit is CommitSemantics.LOCAL_TRANSACTION:
            continue
        decided = decide(S.IN_DOUBT, facts)
        if decided.action in (A.EXECUTE, A.RETRY_WITH_ORIGINAL_KEY):
            assert facts.idempotent, facts
            assert facts.when_unknown is not WhenUnknown.PAUSE, facts


def test_failures_never_compensate() -> None:
    """Rejections, spent budgets and technical failures never choose compensation."""
    for situation in (S.REJECTED, S.NOT_COMMITTED, S.TECHNICAL_FAILURE, S.IN_DOUBT):
        for facts in FACTS_SAMPLE:
            assert decide(situation, facts).action is not A.COMPENSATE
