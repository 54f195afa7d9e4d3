"""Side-effect contracts and the ``@ef.tool`` decorator.

A contract states, before any call, what the runtime must know to recover after a crash: what kind of
effect the call has, where it commits, whether the provider honours a key, how to confirm an effect
whose response was lost, and what (if anything) can answer it later. The runtime never infers these
from behaviour.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, Literal, ParamSpec, TypeVar

from effectflow import errors
from effectflow.contracts import durations, redaction

P = ParamSpec("P")
R = TypeVar("R")

#: ``settles_within`` for a provider that gives no bound on how late it may commit a call.
UNBOUNDED = "unbounded"


class EffectClass(enum.StrEnum):
    """What a call does to the outside world."""

    #: No outside change; the result is recorded so replay never re-asks a model.
    PURE = "pure"
    #: Observes the world; safe to repeat.
    READ = "read"
    #: Changes the world, but repeats are deduplicated (naturally or by key) at the provider.
    IDEMPOTENT_WRITE = "idempotent_write"
    #: Changes the world; a repeat may do it again.
    EXTERNAL_WRITE = "external_write"
    #: An external write that moves money: approval and stricter defaults.
    FINANCIAL_WRITE = "financial_write"

    @property
    def writes(self) -> bool:
        """Whether the call may change the world (and so goes through the write path)."""
        return self not in (EffectClass.PURE, EffectClass.READ)


class CommitSemantics(enum.StrEnum):
    """Where and how the provider commits."""

    #: The provider commits all or nothing.
    REMOTE_ATOMIC = "remote_atomic"
    #: The write goes to the ledger's own database, in the step checkpoint's transaction.
    LOCAL_TRANSACTION = "local_transaction"
    #: Accepted now, completed later (accepted -> sent -> delivered).
    ASYNC_ACCEPTED = "async_accepted"
    #: May apply partially: always reconcile.
    BEST_EFFORT = "best_effort"


@dataclasses.dataclass(frozen=True)
class Idempotency:
    """Whether and how the provider deduplicates repeated requests."""

    #: The provider honours a key (or deduplicates naturally): a retry with the same key is safe.
    supported: bool = False
    #: What one key stands for; ``operation`` = one logical business operation.
    key_scope: Literal["operation"] = "operation"
    #: How long the provider remembers a key (ISO 8601 or seconds); past it a retry may duplicate.
    retention: str | float = "PT24H"
    #: What the provider does with the same key and another payload; only ``reject`` is safe.
    same_key_different_payload: Literal["reject"] = "reject"
    #: The keyword argument through which the tool receives the key.
    key_param: str = "idempotency_key"
    #: Where the key is tagged on the provider side, for lookups (``Idempotency-Key`` header, ...).
    tagged_as: str | None = None

    @property
    def retention_seconds(self) -> float:
        """``retention`` in seconds."""
        return durations.parse_duration(self.retention, field="idempotency.retention")


@dataclasses.dataclass(frozen=True)
class Completion:
    """The states a provider reports for an accepted effect, and the one the step requires."""

    #: The provider's states, in order (e.g. accepted, sent, delivered).
    states: Sequence[str] = ("accepted",)
    #: The state at which the step counts as complete; fixed before the run.
    required: str = "accepted"
    #: The result field that proves it (defaults to the contract's ``effect_id``).
    evidence: str | None = None
    #: How long to wait for ``required`` before a person is asked (ISO 8601 or seconds).
    deadline: str | float = "PT1H"

    @property
    def deadline_seconds(self) -> float:
        """``deadline`` in seconds."""
        return durations.parse_duration(self.deadline, field="completion.deadline")

    def __post_init__(self) -> None:
        object.__setattr__(self, "states", tuple(self.states))
        if self.required not in self.states:
            raise errors.ContractError(
                f"completion.required {self.required!r} is not one of the states "
                f"{list(self.states)}; name one of them"
            )


@dataclasses.dataclass(frozen=True)
class Compensation:
    """The business action that answers a confirmed effect when the goal is abandoned."""

    #: The compensating tool (a ``Tool`` or its ``name@version``).
    tool: Tool[..., Any] | str
    #: How long after the original effect compensation is still possible (ISO 8601 or seconds).
    deadline: str | float | None = None
    #: Whether it runs without a person; financial compensations need approval regardless.
    automatic: bool = False
    #: The compensating tool's parameter that receives the original's external effect id (bound
    #: from the ledger, never typed by a model); defaults to its first parameter.
    param: str | None = None

    @property
    def deadline_seconds(self) -> float | None:
        """``deadline`` in seconds, or None when there is none."""
        if self.deadline is None:
            return None
        return durations.parse_duration(self.deadline, field="compensation.deadline")

    @property
    def tool_ref(self) -> str:
        """The compensating tool's ``name@version`` (or name)."""
        return self.tool if isinstance(self.tool, str) else self.tool.ref


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    """The budget for technical retries of one logical operation (all with the original key)."""

    #: Calls of the tool, the first included.
    max_attempts: int = 3
    #: Lookups of an unknown outcome before a person is asked.
    max_lookups: int = 3
    #: First backoff, in seconds.
    initial_backoff: float = 0.05
    #: Ceiling of one backoff, in seconds.
    max_backoff: float = 5.0
    #: Growth per attempt.
    multiplier: float = 2.0
    #: Fraction of each backoff drawn at random, so many retrying runs do not stampede together.
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise errors.ContractError("retry.max_attempts must be at least 1")
        if self.max_lookups < 0:
            raise errors.ContractError("retry.max_lookups cannot be negative")
        if self.initial_backoff < 0 or self.max_backoff < 0 or self.multiplier < 1:
            raise errors.ContractError("retry backoffs must be >= 0 and multiplier >= 1")
        if not 0 <= self.jitter <= 1:
            raise errors.ContractError("retry.jitter is a fraction between 0 and 1")


@dataclasses.dataclass(frozen=True)
class ToolContract:
    """Everything the runtime must know about a tool before calling it."""

    #: The tool's name (``send_email``).
    name: str
    #: Its version; the ledger records ``name@version``.
    version: str
    #: What the call does to the world.
    effect: EffectClass
    #: Where it commits.
    commit: CommitSemantics = CommitSemantics.REMOTE_ATOMIC
    #: Whether the effect can be undone by a compensation; None = not declared (treated as no).
    reversible: bool | None = None
    #: Whether the provider honours a key.
    idempotency: Idempotency = Idempotency()
    #: The read tool that confirms an effect by key or external id (``name@version`` or name).
    confirm: str | None = None
    #: The result field holding the provider's id of the effect (``provider_message_id``).
    effect_id: str | None = None
    #: Completion states; None means the call's return completes it.
    completion: Completion | None = None
    #: How to answer the effect later, if at all.
    compensation: Compensation | None = None
    #: Seconds before a call counts as timed out (its outcome is then unknown); None = no limit.
    #: The runtime stops *waiting* then; the provider may still commit later (see
    #: ``settles_within``).
    timeout: float | None = None
    #: Retry budget.
    retry: RetryPolicy = RetryPolicy()
    #: The outside system's name, recorded on effects (``mail-provider``).
    external_system: str | None = None
    #: The argument that names the target resource; it enters the key.
    target: str | None = None
    #: Record the request digest on the effect.
    record_request_digest: bool = True
    #: Record the response digest on the effect.
    record_response_digest: bool = True
    #: Whether a person must approve each call first; None = the default (financial writes do).
    approval: bool | None = None
    #: A tool that stops a call still in progress at the provider (called on cancel with the key).
    cancel: str | None = None
    #: For pure/read tools: commit the recorded result before returning it, instead of letting it
    #: ride with the next write. For results that are costly or not reproducible (a model's
    #: answer): a crash after it is returned never asks again.
    durable: bool = False
    #: How long after a call starts the provider may still commit it (ISO 8601 or seconds): the
    #: provider's documented bound, e.g. an API that drops requests older than 30 s. Past it, a
    #: lookup that finds nothing proves "not committed"
    #: (docs/decision-table.md#when-not-found-is-proof). ``"unbounded"`` declares that no bound is
    #: known: a lookup can then confirm an effect but never disprove one, and a person decides.
    #: None = not declared.
    settles_within: str | float | None = None
    #: For guarded calls (``rt.guard``): every host call id is a new request, even with the same
    #: arguments in the same scope. Off by default: a call regenerated with a new id after the
    #: host lost the model's turn is the same logical operation, not done twice.
    each_call_new: bool = False
    #: What a step records of the arguments without their values (docs/arguments.md): fields
    #: dropped or masked. The digests and the key are computed before it: display only.
    redact: redaction.Redact | None = None

    @property
    def settles_within_seconds(self) -> float | None:
        """``settles_within`` in seconds; None when undeclared or ``"unbounded"``."""
        if self.settles_within is None or self.settles_within == UNBOUNDED:
            return None
        return durations.parse_duration(self.settles_within, field="settles_within")

    @property
    def needs_approval(self) -> bool:
        """Whether each call waits for ``rt.approve`` (financial writes by default)."""
        if self.approval is None:
            return self.effect is EffectClass.FINANCIAL_WRITE
        return self.approval

    @property
    def ref(self) -> str:
        """``name@version``, as the ledger and the YAML form name the tool."""
        return f"{self.name}@{self.version}"

    def validate(self) -> None:
        """Refuse contradictions, so they surface at import time rather than during a crash."""
        if not self.name or "@" in self.name:
            raise errors.ContractError(f"tool name {self.name!r} must be non-empty without '@'")
        if not self.effect.writes:
            for field in ("compensation", "completion"):
                if getattr(self, field) is not None:
                    raise errors.ContractError(
                        f"tool {self.ref}: a {self.effect} tool has no effect to {field}; "
                        f"remove {field} or declare a write effect class"
                    )
        if self.idempotency.supported:
            self.idempotency.retention_seconds  # noqa: B018 - parses, raising ContractError if bad
        if self.compensation is not None and self.compensation.deadline is not None:
            durations.parse_duration(self.compensation.deadline, field="compensation.deadline")
        if self.timeout is not None and not (0 < self.timeout < math.inf):
            raise errors.ContractError(f"tool {self.ref}: timeout must be positive seconds")
        if self.settles_within is not None and self.settles_within != UNBOUNDED:
            try:
                self.settles_within_seconds  # noqa: B018 - parses, raising ContractError if bad
            except errors.ContractError:
                raise errors.ContractError(
                    f"tool {self.ref}: settles_within {self.settles_within!r} is neither a "
                    f"duration (seconds, or ISO 8601 such as 'PT30S') nor {UNBOUNDED!r}"
                ) from None
        if self.completion is not None:
            durations.parse_duration(self.completion.deadline, field="completion.deadline")
            if self.confirm is None and self.completion.required != self.completion.states[0]:
                raise errors.ContractError(
                    f"tool {self.ref}: completion.required is {self.completion.required!r}, later "
                    "than the first state, but there is no confirm= lookup tool to poll for it"
                )


class Tool(Generic[P, R]):
    """A callable with a side-effect contract. Calling it directly bypasses the runtime.

    ``Tool[P, R]``: ``P`` is the function's parameters, those the runtime passes included (no
    annotation can drop a keyword-only one, docs/typing.md), ``R`` what it returns; ``ctx.call``
    is typed from both. A tool known only by name is a ``Tool[..., Any]``.
    """

    def __init__(self, fn: Callable[P, R], contract: ToolContract) -> None:
        contract.validate()
        self.fn = fn
        self.contract = contract
        self.is_async = inspect.iscoroutinefunction(fn)
        self.signature = inspect.signature(fn)
        params = self.signature.parameters
        accepts_var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
        key_param = contract.idempotency.key_param
        #: Whether the function takes the idempotency key (it gets one whenever it does).
        self.takes_key = key_param in params or accepts_var_kw
        if contract.commit is CommitSemantics.LOCAL_TRANSACTION:
            if self.is_async:
                raise errors.ContractError(
                    f"tool {contract.ref}: a local_transaction tool runs inside the ledger's "
                    "transaction and must be a plain (sync) function"
                )
            if "tx" not in params:
                raise errors.ContractError(
                    f"tool {contract.ref}: a local_transaction tool receives the ledger's "
                    f"transaction; give {fn.__qualname__} a `*, tx: ef.LocalTransaction` parameter"
                )
        if contract.idempotency.supported and not self.takes_key:
            raise errors.ContractError(
                f"tool {contract.ref} declares idempotency but {fn.__qualname__} has no "
                f"{key_param!r} parameter to receive the key; add `*, {key_param}: str`"
            )
        #: Whether the function takes a precondition keyword (``expected``).
        self.takes_precondition = "precondition" in params or accepts_var_kw
        #: Whether the function takes ``deadline`` (epoch seconds after which the provider must
        #: refuse the call): the runtime passes one bounded by its lease and the tool's timeout.
        self.takes_deadline = "deadline" in params
        self._check_not_found_can_be_proof()
        if contract.redact is not None:
            redaction.check_parameters(contract.redact, self.signature, contract.ref)
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", contract.name)
        self.__qualname__ = getattr(fn, "__qualname__", contract.name)
        self.__module__ = getattr(fn, "__module__", __name__)

    def _check_not_found_can_be_proof(self) -> None:
        """A write that may not be repeated, confirmed by a lookup, must say when "not found" is
        proof (docs/decision-table.md#when-not-found-is-proof); otherwise every lost response would
        either be re-sent while the first call may still land (a duplicate) or go to a person.
        Refused here, at declaration, rather than discovered after a duplicate: the error names both
        fixes, and ``"unbounded"`` is the explicit opt-in for providers that give no bound.
        """
        c = self.contract
        repeatable = c.idempotency.supported or c.effect is EffectClass.IDEMPOTENT_WRITE
        if (
            not c.effect.writes
            or repeatable
            or c.confirm is None
            or c.commit is CommitSemantics.LOCAL_TRANSACTION
            or self.takes_deadline
            or c.settles_within is not None
        ):
            return
        raise errors.ContractError(
            f"tool {c.ref} ({c.effect.value}, no idempotency) is confirmed by the lookup "
            f"{c.confirm}, so it must say when a lookup that finds nothing proves the call did "
            "not commit. Either give the function a `deadline` parameter (the runtime passes one; "
            "the provider must refuse the call after it), or declare settles_within=<seconds or "
            "ISO 8601> (how long after a call starts the provider may still commit it). If the "
            f"provider gives no bound, declare settles_within={UNBOUNDED!r}: the lookup then "
            "confirms effects but never disproves one, and a person decides."
        )

    @property
    def name(self) -> str:
        """The tool's name."""
        return self.contract.name

    @property
    def ref(self) -> str:
        """``name@version``."""
        return self.contract.ref

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<Tool {self.ref} effect={self.contract.effect}>"

    def bind_arguments(self, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
        """Name every argument, so the digest does not depend on positional vs keyword calls.

        Raises:
            errors.ArgumentError: when the arguments do not fit the signature.
        """
        try:
            bound = self.signature.bind_partial(*args, **kwargs)
        except TypeError as exc:
            raise errors.ArgumentError(f"tool {self.ref}: {exc}") from exc
        injected = {self.contract.idempotency.key_param, "deadline", "precondition", "tx"}
        missing = [
            p.name
            for p in self.signature.parameters.values()
            if p.default is p.empty
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
            and p.name not in bound.arguments
            and p.name not in injected
        ]
        if missing:
            # Refused here, before any intent: a call that cannot even start must not be
            # recorded, looked up and retried as if it might have been sent.
            raise errors.ArgumentError(
                f"tool {self.ref}: missing a required argument: {missing[0]!r}"
                + (f" (and {missing[1:]})" if len(missing) > 1 else "")
            )
        named = dict(bound.arguments)
        for param in self.signature.parameters.values():
            if param.kind is param.VAR_KEYWORD and param.name in named:
                named.update(named.pop(param.name))
        return named


def _ref_of(tool: Tool[..., Any] | str | None) -> str | None:
    if tool is None or isinstance(tool, str):
        return tool
    return tool.ref


def _redact_of(
    name: str, given: redaction.Redact | Mapping[str, Any] | None
) -> redaction.Redact | None:
    try:
        return redaction.Redact.of(given)
    except errors.ContractError as exc:
        raise errors.ContractError(f"tool {name}: {exc.message}") from None


def tool(
    name: str,
    *,
    version: str | int = 1,
    effect: EffectClass | str = EffectClass.PURE,
    commit: CommitSemantics | str = CommitSemantics.REMOTE_ATOMIC,
    reversible: bool | None = None,
    idempotency: Idempotency | None = None,
    confirm: Tool[..., Any] | str | None = None,
    effect_id: str | None = None,
    completion: Completion | None = None,
    compensation: Compensation | None = None,
    timeout: float | None = None,
    retry: RetryPolicy | None = None,
    external_system: str | None = None,
    target: str | None = None,
    approval: bool | None = None,
    cancel: Tool[..., Any] | str | None = None,
    durable: bool = False,
    settles_within: str | float | None = None,
    each_call_new: bool = False,
    redact: redaction.Redact | Mapping[str, Any] | None = None,
    register: bool = True,
) -> Callable[[Callable[P, R]], Tool[P, R]]:
    """Declare a tool and its side-effect contract (docs/concepts.md#what-a-tool-tells-the-runtime).

    ``redact`` (an ``ef.Redact`` or ``{"drop": [...], "mask": [...]}``) says which argument
    fields each step records without their values (docs/arguments.md#redaction); its paths must
    name parameters of the decorated function.

    Raises:
        errors.ContractError: at decoration time, for an unknown effect class or a contradiction.
    """
    try:
        effect_class = EffectClass(effect)
    except ValueError:
        raise errors.ContractError(
            f"tool {name}: effect {effect!r} is not one of {[e.value for e in EffectClass]}"
        ) from None
    try:
        commit_semantics = CommitSemantics(commit)
    except ValueError:
        raise errors.ContractError(
            f"tool {name}: commit {commit!r} is not one of {[c.value for c in CommitSemantics]}"
        ) from None
    contract = ToolContract(
        name=name,
        version=str(version),
        effect=effect_class,
        commit=commit_semantics,
        reversible=reversible,
        idempotency=idempotency or Idempotency(),
        confirm=_ref_of(confirm),
        effect_id=effect_id,
        completion=completion,
        compensation=compensation,
        timeout=timeout,
        retry=retry or RetryPolicy(),
        external_system=external_system,
        target=target,
        approval=approval,
        cancel=_ref_of(cancel),
        durable=durable,
        settles_within=settles_within,
        each_call_new=each_call_new,
        redact=_redact_of(name, redact),
    )

    def decorate(fn: Callable[P, R]) -> Tool[P, R]:
        made = Tool(fn, contract)
        if register:
            from effectflow.contracts import registry

            registry.DEFAULT.add_tool(made)
            for helper in (confirm, cancel, compensation.tool if compensation else None):
                if isinstance(helper, Tool):
                    registry.DEFAULT.add_tool(helper)
        return made

    return decorate
