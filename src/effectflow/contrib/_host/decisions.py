"""A person's decision about a guarded call that waits, read from a host's answer and recorded.

Every adapter asks the same two questions (may this call be made? did this effect happen?) and
takes the answer in the same shapes, whatever carries it (LangGraph's ``Command(resume=...)``, a
Pydantic AI deferred call's metadata, a DBOS message, a Temporal activity's argument):

- ``{"approved": True, "approver": "<who>"}`` / ``{"approved": False, "approver": "<who>",
  "reason": "..."}`` for an approval (``approval_id``, ``note`` optional);
- ``{"committed": True | False, "evidence": {...}, "by": "<who>"}`` for an effect in doubt
  (``decision_id`` optional);
- ``{}``: decided elsewhere (the console, the CLI); nothing is recorded, the guard is asked again.

``parse`` reads an answer into a ``Decision`` (``Approve``, ``Reject``, ``Resolve``, or None),
refusing one that does not name who made it, in the host's words (``Wording``); ``apply`` records
it with ``rt.approve`` / ``rt.reject`` / ``rt.resolve``. ``payload`` and ``stored_question`` are
what the person is shown: an agent host's interrupt (with the arguments), or a durable engine's
stored question (ids and phrases only: it lands in the engine's database or history).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from effectflow import errors
from effectflow.contracts import redaction
from effectflow.contracts.tool import Tool

if TYPE_CHECKING:
    from effectflow.runtime.runtime import Runtime

#: Marks a host's pause payload as effectflow's (a host may pause for reasons of its own).
PAYLOAD_MARK = "effectflow"


@dataclasses.dataclass(frozen=True)
class Wording:
    """How a host words an answer it cannot record: ``str.format`` templates, since each host
    names its own way of answering (resume an interrupt, answer a deferred call, ...)."""

    #: An answer that is not a mapping; fields ``hint``, ``decision``.
    not_a_mapping: str
    #: A mapping that answers neither question asked; fields ``kind``, ``hint``, ``decision``.
    wrong_shape: str
    #: A decision that does not say who made it; fields ``run_id``, ``key``.
    unnamed: str


#: The wording of a durable engine's decision (DBOS, Temporal): the stored question's template
#: is the hint.
ENGINE_WORDING = Wording(
    not_a_mapping="a decision is a mapping like {hint}",
    wrong_shape=(
        "answer this {kind} with {hint}, or {{}} once it was decided elsewhere; got {decision!r}"
    ),
    unnamed="a decision must say who made it ({key!r}): it is audited",
)
#: How an agent host says a decision lacks its maker (the LangGraph and Pydantic AI adapters).
UNNAMED = "the decision for {run_id} must say who made it ({key!r}): the audit log records it"


@dataclasses.dataclass(frozen=True)
class Question:
    """What waits for a person, as the ledger names it."""

    #: ``approval`` or ``in_doubt``.
    kind: str
    #: The guarded call's ledger run.
    run_id: str
    #: Its step (the one that waits).
    step_id: str
    #: The effect in doubt (None: none recorded yet).
    effect_id: str | None
    #: The approval's id when the decision names none: the call's ``scope:call_id``, the same on
    #: every replay, so an approval applied twice is recorded once.
    approval_id: str
    #: A well-formed answer, as the host shows it in its refusals.
    hint: str

    @classmethod
    def asked(cls, asked: errors.NeedsPerson, scope: str, call_id: str) -> Question:
        """The question of a ``NeedsPerson`` the guard just raised (an agent host's)."""
        return cls(
            kind=asked.kind,
            run_id=asked.run_id or "",
            step_id=asked.step_id or "",
            effect_id=asked.effect_id,
            approval_id=f"{scope}:{call_id}",
            hint=hint(asked.kind),
        )

    @classmethod
    def stored(cls, asked: Mapping[str, Any]) -> Question:
        """The question of a ``stored_question`` (a durable engine's, read back)."""
        return cls(
            kind=str(asked["kind"]),
            run_id=str(asked["run_id"]),
            step_id=str(asked["step_id"]),
            effect_id=None if asked["effect_id"] is None else str(asked["effect_id"]),
            approval_id=f"{asked['scope']}:{asked['call_id']}",
            hint=repr(asked["resume_with"]),
        )


@dataclasses.dataclass(frozen=True)
class Approve:
    """The call may be made."""

    #: Who approved (the audit log records it).
    approver: str
    #: The approval's id (the question's, unless the decision names one).
    approval_id: str
    #: The person's note, as given.
    note: Any


@dataclasses.dataclass(frozen=True)
class Reject:
    """The call is declined: it is never made, and the model is told so."""

    #: Who declined.
    by: str
    #: Why (the model is told it).
    reason: str


@dataclasses.dataclass(frozen=True)
class Resolve:
    """Whether the effect in doubt happened, and what shows it."""

    #: The effect settled.
    effect_id: str
    #: Whether it took place at the provider.
    committed: bool
    #: What the provider shows.
    evidence: dict[str, Any]
    #: Who decided.
    by: str
    #: The decision's id, as given (None: the ledger makes one).
    decision_id: Any


#: A decision to record; None: decided elsewhere, nothing to record.
Decision = Approve | Reject | Resolve | None


def parse(question: Question, answer: Any, wording: Wording) -> Decision:
    """The decision ``answer`` gives to ``question``.

    ``None`` and ``{}`` give none (decided elsewhere: the guard is asked again).

    Raises:
        errors.ArgumentError: not a mapping, no name of who decided, or the wrong kind of answer;
            worded by ``wording``.
    """
    if answer is None:
        return None
    if not isinstance(answer, Mapping):
        raise errors.ArgumentError(
            wording.not_a_mapping.format(hint=question.hint, decision=answer)
        )
    if question.kind == "approval" and "approved" in answer:
        who = _who(question, answer, "approver", wording)
        if _flag(answer, "approved"):
            approval_id = str(answer.get("approval_id") or question.approval_id)
            return Approve(approver=who, approval_id=approval_id, note=answer.get("note"))
        return Reject(by=who, reason=str(answer.get("reason") or "declined"))
    if question.kind == "in_doubt" and "committed" in answer:
        if question.effect_id is None:
            raise errors.ArgumentError(f"no effect to resolve for call {question.run_id}")
        return Resolve(
            effect_id=question.effect_id,
            committed=_flag(answer, "committed"),
            evidence=dict(answer.get("evidence") or {}),
            by=_who(question, answer, "by", wording),
            decision_id=answer.get("decision_id"),
        )
    if answer:
        raise errors.ArgumentError(
            wording.wrong_shape.format(
                kind=question.kind, hint=question.hint, decision=dict(answer)
            )
        )
    return None


def apply(rt: Runtime, question: Question, decision: Decision) -> None:
    """Record ``decision`` in the ledger. One someone else applied first (``StaleState``: also
    this very decision, applied by an earlier run of the host's code that died before it
    answered) is not an error."""
    try:
        if isinstance(decision, Approve):
            rt.approve(
                question.run_id,
                question.step_id,
                approver=decision.approver,
                approval_id=decision.approval_id,
                note=decision.note,
            )
        elif isinstance(decision, Reject):
            rt.reject(question.run_id, question.step_id, by=decision.by, reason=decision.reason)
        elif isinstance(decision, Resolve):
            rt.resolve(
                decision.effect_id,
                committed=decision.committed,
                evidence=decision.evidence,
                by=decision.by,
                decision_id=decision.decision_id,
            )
    except errors.StaleState:
        pass  # decided meanwhile, or this very decision was applied before a crash


def record(rt: Runtime, question: Question, answer: Any, wording: Wording) -> None:
    """``parse`` then ``apply``: the person's answer recorded, or refused with nothing recorded.

    Raises:
        errors.ArgumentError: as ``parse``.
    """
    apply(rt, question, parse(question, answer, wording))


def resume_with(kind: str) -> dict[str, Any]:
    """The template of an answer to a question of ``kind``, shown to the person."""
    if kind == "approval":
        return {"approved": True, "approver": "<who>"}
    return {"committed": True, "evidence": {"result": "<what the provider shows>"}, "by": "<who>"}


def hint(kind: str) -> str:
    """A well-formed answer to a question of ``kind``, as an agent host's refusal shows it."""
    if kind == "approval":
        return "{'approved': True, 'approver': '<who>'}"
    return "{'committed': True, 'evidence': {'result': ...}, 'by': '<who>'}"


def payload(
    asked: errors.NeedsPerson,
    tool: Tool[..., Any],
    arguments: dict[str, Any],
    scope: str,
    call_id: str,
) -> dict[str, Any]:
    """What an agent host's person sees when the run pauses (an interrupt, a deferred call's
    metadata): what waits, the call's arguments as effectflow shows them everywhere (the tool's
    redaction rule applied: the host stores this in its checkpoints), and how to answer it."""
    return {
        PAYLOAD_MARK: True,
        "kind": asked.kind,
        "next_action": asked.next_action,
        "effect_id": asked.effect_id,
        "run_id": asked.run_id,
        "step_id": asked.step_id,
        "for_model": asked.for_model,
        "message": asked.message,
        "tool": tool.ref,
        "arguments": redaction.apply(arguments, tool.contract.redact),
        "scope": scope,
        "tool_call_id": call_id,
        "resume_with": resume_with(asked.kind),
    }


def stored_question(
    asked: errors.NeedsPerson, tool_ref: str, scope: str, call_id: str
) -> dict[str, Any]:
    """What a durable engine's person must decide, as ids and phrases only, never arguments (it
    is stored in the engine's database or workflow history); ``Question.stored`` reads it back."""
    return {
        "kind": asked.kind,
        "next_action": asked.next_action,
        "run_id": asked.run_id,
        "step_id": asked.step_id,
        "effect_id": asked.effect_id,
        "message": asked.message,
        "for_model": asked.for_model,
        "tool": tool_ref,
        "scope": scope,
        "call_id": call_id,
        "resume_with": resume_with(asked.kind),
    }


def _who(question: Question, answer: Mapping[str, Any], key: str, wording: Wording) -> str:
    who = answer.get(key)
    if not isinstance(who, str) or not who.strip():
        raise errors.ArgumentError(wording.unnamed.format(run_id=question.run_id, key=key))
    return who


def _flag(answer: Mapping[str, Any], key: str) -> bool:
    """A yes/no of the answer, only as a JSON boolean: a form's ``"false"`` or ``0`` is not read
    as a decision (``bool("false")`` would approve a refund, or say an effect happened)."""
    value = answer[key]
    if not isinstance(value, bool):
        raise errors.ArgumentError(
            f"{key!r} must be true or false, got {value!r}; nothing was recorded"
        )
    return value
