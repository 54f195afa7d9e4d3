"""The ledger's facts: runs, steps (Step Effect Records), attempts, effects (External Effect Records)
and audit events. Rows become these frozen records at the storage edge and nowhere else."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, TypeVar

R = TypeVar("R")


def evolve(record: R, /, **changes: Any) -> R:
    """A copy of a frozen record with ``changes``: ``dataclasses.replace`` without re-running
    ``__init__``.

    The write path copies a step or effect record several times per call; ``replace`` costs ~6 µs
    a copy there, this ~1 µs. The records have no ``__post_init__`` to skip. Field names are
    still checked, as ``replace`` checks them.

    Raises:
        TypeError: a name in ``changes`` is not a field of the record.
    """
    fields = record.__dict__
    for name in changes:
        if name not in fields:
            raise TypeError(f"{type(record).__name__} has no field {name!r}")
    copy = object.__new__(type(record))
    object.__setattr__(copy, "__dict__", {**fields, **changes})
    return copy


class RunStatus(enum.StrEnum):
    """Where a run stands."""

    #: A process is executing it (or was, until it crashed: then it is recoverable).
    RUNNING = "running"
    #: Waiting for approval, reconciliation or a person.
    PAUSED = "paused"
    #: Finished; its output is recorded.
    SUCCEEDED = "succeeded"
    #: Ended by a failure; the effects it left are listed, never undone automatically.
    FAILED = "failed"
    #: Cancel requested; in-flight work is being classified.
    CANCELLING = "cancelling"
    #: Cancelled, and no effect happened.
    CANCELLED = "cancelled"
    #: Cancelled; confirmed effects remain in the world.
    CANCELLED_WITH_EFFECTS = "cancelled_with_effects"
    #: Cancelled; some effects are still unknown and being confirmed.
    CANCELLED_PENDING_RECONCILIATION = "cancelled_pending_reconciliation"
    #: The goal was abandoned and every compensable effect was compensated.
    COMPENSATED = "compensated"

    @property
    def terminal(self) -> bool:
        """Whether nothing more happens to the run without a person redriving it."""
        return self in TERMINAL_RUN_STATUSES


TERMINAL_RUN_STATUSES = frozenset(
    {
        RunStatus.SUCCEEDED,
        RunStatus.FAILED,
        RunStatus.CANCELLED,
        RunStatus.CANCELLED_WITH_EFFECTS,
        RunStatus.COMPENSATED,
    }
)


class StepStatus(enum.StrEnum):
    """Where a step stands: never just success/failed."""

    #: Known to the workflow, not started.
    PENDING = "pending"
    #: Waits for a person's approval (``rt.approve`` / ``rt.reject``) before its call: nothing
    #: was sent. Its run is paused. (Ledger version 9; before it, ``pending`` with the error code
    #: ``approval_required``, which migration 9 rewrites as a sealed write of its own.)
    AWAITING_APPROVAL = "awaiting_approval"
    #: The intent is durable; the call may be in flight.
    INTENT_RECORDED = "intent_recorded"
    #: The effect happened and is recorded with its evidence.
    CONFIRMED = "confirmed"
    #: Provably did not happen: safe to retry with the same key.
    NOT_COMMITTED = "not_committed"
    #: May have happened: to be confirmed before anything else.
    UNKNOWN = "unknown"
    #: The provider said no: a definite failure.
    REJECTED = "rejected"
    #: A precondition failed: re-observe, never overwrite.
    CONFLICT = "conflict"
    #: Nothing automatic can settle it: a person decides.
    NEEDS_ATTENTION = "needs_attention"
    #: Accepted; waiting for the required completion state.
    AWAITING_COMPLETION = "awaiting_completion"
    #: Every attempt was not committed and the budget is spent.
    FAILED = "failed"
    #: Compensation decided, not started.
    COMPENSATION_PENDING = "compensation_pending"
    #: Compensation in progress.
    COMPENSATING = "compensating"
    #: Answered by a compensation effect (the original effect still happened).
    COMPENSATED = "compensated"
    #: The compensation failed or missed its deadline.
    COMPENSATION_FAILED = "compensation_failed"
    #: Not needed on this path.
    SKIPPED = "skipped"
    #: Never started because the run was cancelled.
    CANCELLED = "cancelled"


#: Statuses in which a step's external effect may exist but is not confirmed.
IN_DOUBT_STATUSES = frozenset(
    {StepStatus.INTENT_RECORDED, StepStatus.UNKNOWN, StepStatus.NEEDS_ATTENTION}
)


class NextAction(enum.StrEnum):
    """What should happen next to a step or effect, so callers never infer it."""

    #: Nothing to do now (done, or waiting on time).
    WAIT = "wait"
    #: Confirm through a lookup.
    RECONCILE = "reconcile"
    #: Run (or retry) the call.
    EXECUTE = "execute"
    #: Use the recorded result.
    USE_RESULT = "use_result"
    #: A person must decide.
    ASK_A_PERSON = "ask_a_person"
    #: Nothing, ever: the step is final.
    NONE = "none"


class AttemptKind(enum.StrEnum):
    """What an attempt did."""

    #: Called the tool.
    CALL = "call"
    #: Asked the lookup tool about an earlier call.
    LOOKUP = "lookup"
    #: A person settled the outcome.
    RESOLUTION = "resolution"


class Outcome(enum.StrEnum):
    """How an attempt ended."""

    #: The effect happened.
    COMMITTED = "committed"
    #: Nothing happened.
    NOT_COMMITTED = "not_committed"
    #: Unknown whether it happened.
    UNKNOWN = "unknown"
    #: The provider refused.
    REJECTED = "rejected"
    #: A precondition failed.
    CONFLICT = "conflict"


class CompensationStatus(enum.StrEnum):
    """Where the compensation of an effect stands (``compensation_status`` of its step and its
    effect record; the stored text is the member's value)."""

    #: A pure or read step: nothing in the world to answer.
    NOT_APPLICABLE = "not_applicable"
    #: A write whose tool names no compensation.
    NOT_REQUIRED = "not_required"
    #: A write whose tool names a compensation, run if its goal is abandoned.
    AVAILABLE = "available"
    #: Its compensation's intent is recorded: the compensating call may be in flight.
    COMPENSATING = "compensating"
    #: Answered by a confirmed compensation (the original effect still happened).
    COMPENSATED = "compensated"
    #: Its compensation failed or cannot be made: a person decides.
    COMPENSATION_FAILED = "compensation_failed"
    #: Kept on purpose: nothing could answer it, or a person declined its compensation.
    KEPT = "kept"


class ControlKind(enum.StrEnum):
    """What an operator (or the workflow, abandoning its goal) asked of a run (``runs.control``'s
    ``kind``)."""

    #: Stop the run: steps not started do not start, then compensate what cancelling triggers.
    CANCEL = "cancel"
    #: The business goal is abandoned: compensate the run's effects by policy.
    COMPENSATE = "compensate"


@dataclasses.dataclass(frozen=True)
class RunRecord:
    """One execution of a workflow."""

    #: The run's id (given by the caller, or generated).
    run_id: str
    #: The tenant the run belongs to; part of every key.
    tenant: str
    #: The workflow's registered name.
    workflow: str
    #: The workflow's version the run was last executed with (a change at resume is audited as
    #: ``workflow_changed``).
    workflow_version: str
    #: The run's input, as recorded.
    input: dict[str, Any]
    #: Digest of the input: a second start with the same run id must match it.
    input_digest: str
    #: Where the run stands.
    status: RunStatus
    #: The workflow's return value, when it succeeded.
    output: Any
    #: Why the run failed or paused (code and message).
    error: dict[str, Any] | None
    #: What should happen next.
    next_action: NextAction
    #: How many times the run was redriven or resumed by a person.
    generation: int
    #: When the run was created (epoch seconds).
    created_at: float
    #: When the run last changed (epoch seconds).
    updated_at: float
    #: The worker that holds the lease, if any.
    lease_owner: str | None = None
    #: The fencing token of the current lease; every write must carry it.
    lease_token: int = 0
    #: When the current lease expires (epoch seconds).
    lease_expires_at: float | None = None
    #: An operator's pending request to stop the run: ``{"kind": "cancel" | "compensate",
    #: "reason", "by", "at"}``. The worker holding the run honours it at its next step boundary.
    control: dict[str, Any] | None = None
    #: A digest of the workflow function's source the run was last executed with: code that
    #: changed without a new declared version is still seen (and audited) at resume. None for
    #: runs recorded before ledger version 4.
    workflow_code: str | None = None
    #: A guarded call's scope: the host's durable identity (a thread and checkpoint namespace, a
    #: workflow id, a session), so the run is found from what the host shows. None for other runs.
    scope: str | None = None
    #: A guarded call's call id in its scope (the model's tool-call id, the host's step id).
    call_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (CLI ``--json``, the HTTP API)."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """The Step Effect Record: the step-level fact recovery reads."""

    #: The run.
    run_id: str
    #: The step's stable id within the workflow.
    step_id: str
    #: Order in which the run first reached the step.
    seq: int
    #: Bumped when the workflow re-observes (a conflicting precondition).
    step_revision: int
    #: ``name@version`` of the tool.
    tool: str
    #: The tool's effect class.
    effect_class: str
    #: The business action the step stands for.
    logical_operation_id: str | None
    #: The idempotency key (a hash; never raw parameters).
    idempotency_key: str | None
    #: sha256 of the canonical arguments.
    request_digest: str
    #: Where the step stands.
    status: StepStatus
    #: The provider's completion state (accepted, sent, delivered).
    completion_state: str | None
    #: The outside system.
    external_system: str | None
    #: The provider's id of the effect.
    external_effect_id: str | None
    #: The recorded result (returned on replay).
    output: Any
    #: The last error (code, message) if any.
    error: dict[str, Any] | None
    #: The effect record of this step, for writes.
    effect_id: str | None
    #: When the effect was confirmed.
    confirmed_at: float | None
    #: The step that followed this one in the run.
    next_step: str | None
    #: A ``CompensationStatus`` value (``not_required``, ``compensated``, ...).
    compensation_status: str
    #: What should happen next.
    next_action: NextAction
    #: Created (epoch seconds).
    created_at: float
    #: Last changed (epoch seconds).
    updated_at: float
    #: The completion state required when the intent was recorded (fixed for the step's life).
    required_state: str | None = None
    #: For a compensation step: the effect it answers.
    compensates: str | None = None
    #: The approval the call ran under, when one was needed.
    approval_id: str | None = None
    #: What was sent: the canonical arguments with the tool's redaction rule applied, or a marker
    #: over the cap (``contracts.redaction``; display only, never read back to call). None for a
    #: step recorded before ledger version 11.
    arguments: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class AttemptRecord:
    """One try of a logical operation (a call, a lookup, or a person's resolution)."""

    #: Unique id (``att_...``).
    attempt_id: str
    #: The run.
    run_id: str
    #: The step.
    step_id: str
    #: 1-based number among the step's attempts.
    number: int
    #: Call, lookup or resolution.
    kind: AttemptKind
    #: The run's generation when the attempt was made (budgets count per generation).
    generation: int
    #: When it started.
    started_at: float
    #: When it ended; None while in flight (or if the process died).
    ended_at: float | None
    #: How it ended; None while in flight.
    outcome: Outcome | None
    #: Error code and message, if any.
    error: dict[str, Any] | None
    #: sha256 of the response.
    response_digest: str | None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class EffectRecord:
    """The External Effect Record: what happened (or may have) in an outside system."""

    #: Unique id (``eff_...``).
    effect_id: str
    #: The tenant.
    tenant: str
    #: The run.
    run_id: str
    #: The step.
    step_id: str
    #: ``name@version`` of the tool that produced it.
    tool: str
    #: The tool call (the step's first attempt) that produced it.
    tool_call_id: str
    #: The business action.
    logical_operation_id: str | None
    #: The idempotency key.
    idempotency_key: str | None
    #: sha256 of the canonical request.
    request_digest: str
    #: sha256 of the canonical response, once known.
    response_digest: str | None
    #: Where the effect stands (a StepStatus value).
    status: StepStatus
    #: The outside system.
    external_system: str | None
    #: The provider's id of the effect.
    external_effect_id: str | None
    #: When it was confirmed committed.
    committed_at: float | None
    #: The approval that allowed it, if one was needed.
    approval_id: str | None
    #: A ``CompensationStatus`` value (``not_required``, ``compensated``, ...).
    compensation_status: str
    #: The effect this one compensates, for compensations.
    compensates: str | None
    #: What proves the status (lookup answer, a person's evidence).
    evidence: dict[str, Any] | None
    #: Who settled it, when a person did.
    resolved_by: str | None
    #: What should happen next.
    next_action: NextAction
    #: Optimistic version: actions name it so a stale decision is refused.
    version: int
    #: Created (epoch seconds).
    created_at: float
    #: Last changed (epoch seconds).
    updated_at: float
    #: The field of the tool's result that carries the provider's id (the contract's
    #: ``effect_id``), recorded with the intent: a person's resolution builds the step's result
    #: from it without the application's registry. None when the contract names none.
    effect_id_field: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class AuditEvent:
    """One entry of the append-only, hash-chained audit log."""

    #: Global order.
    seq: int
    #: The run whose chain the event extends.
    run_id: str
    #: The step, if any.
    step_id: str | None
    #: The effect, if any.
    effect_id: str | None
    #: What was decided (``intent``, ``outcome``, ``lookup``, ``retry``, ``resolution``, ...).
    kind: str
    #: Who decided: ``runtime`` or a person's name.
    actor: str
    #: Details (digests, codes, evidence): never raw arguments.
    detail: dict[str, Any]
    #: When (epoch seconds).
    at: float
    #: Hash of the run's previous event.
    prev_hash: str
    #: sha256 over ``prev_hash`` and this event's content.
    hash: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ApprovalRecord:
    """A person's approval of one step's exact request (a financial write, a compensation)."""

    #: The approver's id for the approval (a ticket, a change request); unique.
    approval_id: str
    #: The tenant.
    tenant: str
    #: The run.
    run_id: str
    #: The step approved.
    step_id: str
    #: The request approved: an approval never carries over to another payload.
    request_digest: str
    #: Who approved.
    approver: str
    #: Free text the approver gave.
    note: str | None
    #: When (epoch seconds).
    approved_at: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Inventory:
    """What a cancel (or an abandoned goal) left in the world, by effect id (docs/concepts.md#cancel)."""

    #: The run.
    run_id: str
    #: The run's status after the cancel was applied.
    status: RunStatus
    #: Effects that happened and stay happened (compensated ones included: they still happened).
    confirmed: list[str]
    #: Calls still running in another worker when the cancel was asked.
    in_flight: list[str]
    #: Effects that may have happened: queued for reconciliation.
    unknown: list[str]
    #: Compensation effects that answered a confirmed effect.
    compensated: list[str]
    #: Compensations waiting for an approval or a person.
    compensation_pending: list[str]
    #: Steps that never started because of the cancel.
    cancelled_steps: list[str]
    #: Effects whose in-progress call was stopped by the tool's cancel operation.
    stopped: list[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class OperationBinding:
    """A logical operation bound to one request digest and key (the ``operations`` table)."""

    #: The tenant.
    tenant: str
    #: The business action's id.
    logical_operation_id: str
    #: Its idempotency key.
    idempotency_key: str
    #: The only request digest this operation may ever carry.
    request_digest: str
    #: The tool (``name@version``).
    tool: str
    #: The run whose step owns the operation.
    run_id: str
    #: That step.
    step_id: str
    #: When it was bound.
    created_at: float
    #: When the provider forgets the key (retention); purge may drop the binding after it.
    key_expires_at: float


@dataclasses.dataclass(frozen=True)
class DecisionRecord:
    """A person's decision, pinned by the caller's ``decision_id``."""

    #: The caller's id for the decision.
    decision_id: str
    #: The tenant.
    tenant: str
    #: Digest of the decision's parameters: a replay must match it.
    params_digest: str
    #: The effect decided on.
    effect_id: str
    #: When.
    decided_at: float
