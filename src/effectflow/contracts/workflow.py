"""Workflows and step contracts.

A workflow is ordinary code that calls ``ctx.call(step_id, tool, ...)``. It is re-executed from the top
on resume: steps the ledger already confirmed return their recorded output without calling anything, so
the code must reach its steps in the same order for the same input (no branching on the wall clock or
on randomness outside a recorded step).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, ParamSpec, TypeVar

from effectflow import errors

P = ParamSpec("P")
R = TypeVar("R")


class WhenNotCommitted(enum.StrEnum):
    """What to do when an attempt provably did not commit."""

    #: Retry with the original key, within the retry budget.
    RETRY_WITH_ORIGINAL_KEY = "retry_with_original_key"
    #: Pause the run for a person.
    PAUSE = "pause"
    #: Fail the step (and the run, unless the workflow handles it).
    FAIL = "fail"


class WhenUnknown(enum.StrEnum):
    """What to do when an outcome is unknown (crash or timeout between intent and outcome)."""

    #: Confirm through the lookup tool (or retry an idempotent call with its key), then pause.
    RECONCILE_THEN_PAUSE = "reconcile_then_pause"
    #: Pause the run for a person at once.
    PAUSE = "pause"


#: Business conditions that may trigger a compensation (never a technical failure).
TRIGGERS = ("goal_abandoned", "cancelled", "never")


class WhenConfirmed(enum.StrEnum):
    """What to do with a step that is already confirmed."""

    #: Skip the call and return the recorded output.
    SKIP_AND_CONTINUE = "skip_and_continue"


@dataclasses.dataclass(frozen=True)
class StepContract:
    """Per-step recovery contract (the seed's ``workflow_step``)."""

    #: The stable id of the step within its workflow.
    step_id: str
    #: The tool this step must call (``name@version``); checked at call time when given.
    tool: str | None = None
    #: Template of the logical operation id, formatted with the run's input (``op_case_{case_id}``).
    logical_operation_id: str | None = None
    #: Completion state the step requires (overrides the tool's ``completion.required``).
    required_state: str | None = None
    #: Result field that proves completion.
    evidence: str | None = None
    #: Policy for a confirmed step.
    when_confirmed: WhenConfirmed = WhenConfirmed.SKIP_AND_CONTINUE
    #: Policy for a provably uncommitted attempt.
    when_not_committed: WhenNotCommitted = WhenNotCommitted.RETRY_WITH_ORIGINAL_KEY
    #: Policy for an unknown outcome.
    when_unknown: WhenUnknown = WhenUnknown.RECONCILE_THEN_PAUSE
    #: Business condition(s) that trigger compensation: ``goal_abandoned`` (the workflow raises
    #: ``ef.AbandonGoal`` or an operator calls ``rt.compensate``), ``cancelled`` (``rt.cancel``),
    #: or ``never``. None means ``goal_abandoned``. A technical failure is never a trigger.
    compensation_trigger: str | tuple[str, ...] | None = None
    #: Whether compensation runs without a person when triggered.
    compensation_automatic: bool | None = None
    #: Free-text strategy (``send_correction_if_business_required``) shown to operators.
    compensation_strategy: str | None = None
    #: The read step whose observation this write's precondition came from: on a conflict it is
    #: re-run (new step revision) instead of overwriting. None = pause for a person on conflict.
    observe: str | None = None
    #: How many times a conflict may send the run back to ``observe`` before it pauses.
    max_reobserve: int = 3

    def __post_init__(self) -> None:
        for trigger in self.triggers:
            if trigger not in TRIGGERS:
                raise errors.ContractError(
                    f"step {self.step_id}: compensation trigger {trigger!r} is not one of "
                    f"{list(TRIGGERS)}; a technical failure is never a trigger"
                )

    @property
    def triggers(self) -> frozenset[str]:
        """The business conditions that trigger this step's compensation."""
        raw = self.compensation_trigger
        if raw is None:
            return frozenset({"goal_abandoned"})
        items = (raw,) if isinstance(raw, str) else tuple(raw)
        return frozenset(i for i in items if i != "never")

    def operation_id_for(self, run_input: Mapping[str, Any]) -> str | None:
        """The logical operation id with the run's input substituted.

        Raises:
            errors.ContractError: when the template names an input the run does not have.
        """
        if self.logical_operation_id is None:
            return None
        try:
            return self.logical_operation_id.format(**run_input)
        except (KeyError, IndexError) as exc:
            raise errors.ContractError(
                f"step {self.step_id}: logical_operation_id template "
                f"{self.logical_operation_id!r} names {exc} which the run's input lacks"
            ) from None


class Workflow(Generic[P, R]):
    """A registered workflow function and its step contracts."""

    def __init__(
        self,
        fn: Callable[..., R],
        name: str,
        version: str,
        steps: Iterable[StepContract] = (),
    ) -> None:
        self.fn = fn
        self.name = name
        self.version = version
        self.is_async = inspect.iscoroutinefunction(fn)
        self.steps: dict[str, StepContract] = {}
        for step in steps:
            if step.step_id in self.steps:
                raise errors.ContractError(
                    f"workflow {name}: step {step.step_id!r} has two contracts; keep one"
                )
            self.steps[step.step_id] = step
        #: The function's signature (inputs are checked against it before a run is recorded).
        self.signature = inspect.signature(fn)
        params = list(self.signature.parameters)
        if not params:
            raise errors.ContractError(
                f"workflow {name}: {fn.__qualname__} must take the context as its first parameter"
            )
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", name)
        self.__qualname__ = getattr(fn, "__qualname__", name)

    @functools.cached_property
    def code_digest(self) -> str:
        """``sha256:`` of the workflow function's source (its bytecode where the source is not
        available): recorded per run, so a resume can tell the code changed under it."""
        try:
            text = inspect.getsource(self.fn).encode("utf-8")
        except (OSError, TypeError):
            code = getattr(self.fn, "__code__", None)
            text = code.co_code if code is not None else repr(self.fn).encode("utf-8")
        return "sha256:" + hashlib.sha256(text).hexdigest()

    def check_input(self, input: Mapping[str, Any]) -> None:
        """Refuse an input the workflow function cannot be called with, before any run exists.

        Raises:
            errors.ArgumentError: a required input is missing, or an input is not a parameter.
        """
        signature = self.signature
        try:
            signature.bind(None, **input)
        except TypeError as exc:
            params = list(signature.parameters.values())[1:]
            expected = ", ".join(
                p.name + ("" if p.default is p.empty else "=...")
                for p in params
                if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            )
            raise errors.ArgumentError(
                f"workflow {self.name}: {exc}; it takes ({expected}). No run was recorded."
            ) from None

    def with_steps(self, steps: Iterable[StepContract]) -> Workflow[P, R]:
        """A copy with more step contracts (e.g. loaded from YAML)."""
        return Workflow(self.fn, self.name, self.version, [*self.steps.values(), *steps])

    def __repr__(self) -> str:
        return f"<Workflow {self.name}@{self.version}>"


def workflow(
    name: str,
    *,
    version: str | int = 1,
    steps: Iterable[StepContract] = (),
    register: bool = True,
) -> Callable[[Callable[..., R]], Workflow[..., R]]:
    """Declare a workflow. Its function takes ``ctx`` first, then keyword input."""
    if not name:
        raise errors.ContractError("a workflow needs a non-empty name")

    def decorate(fn: Callable[..., R]) -> Workflow[..., R]:
        made: Workflow[..., R] = Workflow(fn, name, str(version), steps)
        if register:
            from effectflow.contracts import registry

            registry.DEFAULT.add_workflow(made)
        return made

    return decorate
