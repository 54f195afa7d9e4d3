"""A person's answer to a waiting guarded call, read the same way for every host
(``effectflow.contrib._host.decisions``): each well-formed answer is one decision, and an answer
that does not say what it means — no name, the wrong question, a yes/no that is not a boolean — is
refused before anything is recorded.
"""

from __future__ import annotations

from typing import Any

import pytest

from effectflow import errors
from effectflow.contrib._host import decisions as d

APPROVAL = d.Question("approval", "run-1", "call", None, "scope:call-1", "<hint>")
IN_DOUBT = d.Question("in_doubt", "run-1", "call", "eff-1", "scope:call-1", "<hint>")


@pytest.mark.parametrize(
    ("question", "answer", "decision"),
    [
        (APPROVAL, None, None),
        (APPROVAL, {}, None),
        (IN_DOUBT, {}, None),
        (
            APPROVAL,
            {"approved": True, "approver": "alice"},
            d.Approve(approver="alice", approval_id="scope:call-1", note=None),
        ),
        (
            APPROVAL,
            {"approved": True, "approver": "alice", "approval_id": "A-7", "note": "ok"},
            d.Approve(approver="alice", approval_id="A-7", note="ok"),
        ),
        (
            APPROVAL,
            {"approved": False, "approver": "bob", "reason": "not this customer"},
            d.Reject(by="bob", reason="not this customer"),
        ),
        (APPROVAL, {"approved": False, "approver": "bob"}, d.Reject(by="bob", reason="declined")),
        (
            IN_DOUBT,
            {"committed": True, "evidence": {"id": "rf-1"}, "by": "ops"},
            d.Resolve("eff-1", committed=True, evidence={"id": "rf-1"}, by="ops", decision_id=None),
        ),
        (
            IN_DOUBT,
            {"committed": False, "by": "ops", "decision_id": "D-1"},
            d.Resolve("eff-1", committed=False, evidence={}, by="ops", decision_id="D-1"),
        ),
    ],
)
def test_a_well_formed_answer_is_one_decision(
    question: d.Question, answer: Any, decision: d.Decision
) -> None:
    """Approve, decline, resolve, or nothing to record (decided elsewhere)."""
    assert d.parse(question, answer, d.ENGINE_WORDING) == decision


@pytest.mark.parametrize(
    ("question", "answer", "says"),
    [
        (APPROVAL, "yes", "a decision is a mapping like <hint>"),
        (APPROVAL, {"approved": True}, "must say who made it ('approver')"),
        (APPROVAL, {"approved": True, "approver": "  "}, "must say who made it"),
        (APPROVAL, {"approved": True, "approver": 7}, "must say who made it"),
        (IN_DOUBT, {"committed": True, "evidence": {}}, "must say who made it ('by')"),
        # A yes/no from a form or a careless client is not read as one: bool("false") is True.
        (APPROVAL, {"approved": "false", "approver": "alice"}, "'approved' must be true or false"),
        (APPROVAL, {"approved": 1, "approver": "alice"}, "'approved' must be true or false"),
        (IN_DOUBT, {"committed": "no", "by": "ops"}, "'committed' must be true or false"),
        # The answer of the other question.
        (APPROVAL, {"committed": True, "by": "ops"}, "answer this approval with <hint>"),
        (IN_DOUBT, {"approved": True, "approver": "alice"}, "answer this in_doubt with <hint>"),
    ],
)
def test_an_answer_that_does_not_say_what_it_means_is_refused(
    question: d.Question, answer: Any, says: str
) -> None:
    """Refused with what is wrong, so the host asks again; nothing is decided."""
    with pytest.raises(errors.ArgumentError, match=says.replace("(", r"\(").replace(")", r"\)")):
        d.parse(question, answer, d.ENGINE_WORDING)


def test_an_effect_to_resolve_must_be_known() -> None:
    """A call in doubt whose effect the ledger has not named cannot be resolved by an answer."""
    unknown = d.Question("in_doubt", "run-1", "call", None, "scope:call-1", "<hint>")
    with pytest.raises(errors.ArgumentError, match="no effect to resolve for call run-1"):
        d.parse(unknown, {"committed": True, "by": "ops"}, d.ENGINE_WORDING)


def test_a_durable_engines_stored_question_holds_no_arguments() -> None:
    """What DBOS or Temporal store (their database, their history) names ids and phrases, never
    the call's arguments, and reads back as the same question."""
    asked = errors.NeedsPerson(
        "a refund needs an approval",
        run_id="run-1",
        step_id="call",
        effect_id=None,
        kind="approval",
        for_model="waiting for a person",
    )
    stored = d.stored_question(asked, "refund@1", "dbos:wf-1", "step-3")
    assert "arguments" not in stored
    assert d.Question.stored(stored) == d.Question(
        "approval", "run-1", "call", None, "dbos:wf-1:step-3", repr(d.resume_with("approval"))
    )
