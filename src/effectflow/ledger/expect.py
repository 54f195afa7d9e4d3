"""What a decision was made on, checked in the transaction that records it
(docs/concepts.md#peoples-decisions-are-compare-and-swap).

A person's decision (a resolution, an approval, a cancel or compensate request) is taken on the
version and state the caller read. The batch recording it carries that as ``Expectation`` s; the
store checks them inside the batch's transaction, after it holds the run's row (SQLite: the writer's
``BEGIN IMMEDIATE``; PostgreSQL: the row lock every batch of a run takes first, so every writer of
the run waits for it) and before it writes anything. One that fails raises ``StaleState`` and the
batch writes nothing: of two concurrent contradicting decisions exactly one takes effect, and the
other changes nothing (no audit event, no attempt, no lease bump).

The queries are shared by both backends (``?`` placeholders; PostgreSQL swaps in ``%s``); each backend
only turns the row it read into a record.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from effectflow import errors
from effectflow.ledger import records


class Subject(enum.StrEnum):
    """What an expectation is about."""

    #: The run's row.
    RUN = "run"
    #: One step's row (keyed by step id).
    STEP = "step"
    #: One effect's row (keyed by effect id).
    EFFECT = "effect"
    #: No approval of one step's request exists yet (keyed by step id; the request digest is the
    #: one allowed value of ``request_digest``).
    UNAPPROVED = "unapproved"


#: The record each subject's row becomes, whose field names an expectation may check.
_RECORDS: dict[Subject, type[Any]] = {
    Subject.RUN: records.RunRecord,
    Subject.STEP: records.StepRecord,
    Subject.EFFECT: records.EffectRecord,
}
#: Checked fields that are not record fields: ``error_code`` is ``error["code"]`` (of a step or run).
_DERIVED = {"error_code"}


@dataclasses.dataclass(frozen=True)
class Expectation:
    """A fact a batch's decision was made on: a row's fields have one of the values allowed."""

    #: What the fact is about.
    subject: Subject
    #: The step or effect id (None for the run itself).
    key: str | None
    #: Field name and the values it may have (any one of them), in the order given.
    allowed: tuple[tuple[str, tuple[Any, ...]], ...]

    def __post_init__(self) -> None:
        cls = _RECORDS.get(self.subject)
        names = {f.name for f in dataclasses.fields(cls)} | _DERIVED if cls else {"request_digest"}
        unknown = sorted(name for name, _ in self.allowed if name not in names)
        if unknown:
            raise errors.ContractError(
                f"an expectation on a {self.subject} names no field {unknown}"
            )

    def params(self, run_id: str) -> tuple[Any, ...]:
        """The parameters of the named query ``expect_<subject>`` (``ledger/queries/``)."""
        if self.subject is Subject.RUN:
            return (run_id,)
        if self.subject is Subject.UNAPPROVED:
            return (run_id, self.key, dict(self.allowed)["request_digest"][0])
        return (run_id, self.key)


def build(subject: Subject, key: str | None, fields: dict[str, Any]) -> Expectation:
    """An expectation from keyword fields: a tuple, list, set or frozenset lists the values
    allowed; anything else (None included) is the one value allowed."""
    allowed = tuple(
        (name, tuple(value) if isinstance(value, tuple | list | set | frozenset) else (value,))
        for name, value in fields.items()
    )
    return Expectation(subject, key, allowed)


def _value(record: Any, name: str) -> Any:
    if name == "error_code":
        return (record.error or {}).get("code")
    return getattr(record, name)


def refusal(expectation: Expectation, run_id: str, found: Any) -> errors.StaleState | None:
    """Why the decision cannot be recorded (``found`` is the row's record, or for ``UNAPPROVED``
    the id of an approval found; None when there is none), or None when it still holds."""
    subject, key = expectation.subject, expectation.key
    ids: dict[str, str | None] = {
        "run_id": run_id,
        "step_id": key if subject in (Subject.STEP, Subject.UNAPPROVED) else None,
        "effect_id": key if subject is Subject.EFFECT else None,
    }
    what = f"run {run_id}" if subject is Subject.RUN else f"{subject} {key} of run {run_id}"
    if subject is Subject.UNAPPROVED:
        if found is None:
            return None
        return errors.StaleState(
            f"step {key} of run {run_id} was already approved ({found}) while this approval was "
            "being decided; nothing was recorded",
            **ids,
        )
    if found is None:
        return errors.StaleState(f"{what} does not exist any more; nothing was recorded", **ids)
    for name, values in expectation.allowed:
        actual = _value(found, name)
        if actual not in values:
            said = " or ".join(repr(_plain(v)) for v in values)
            return errors.StaleState(
                f"{what} moved on: its {name} is {_plain(actual)!r}, the decision was made on "
                f"{said}. Another decision (or the run's worker) changed it first; nothing was "
                "recorded: reload it and decide again",
                **ids,
            )
    return None


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value
