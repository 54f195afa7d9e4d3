"""The storage interface every ledger backend implements, and the unit of durable writing.

The write path never issues row-by-row writes: it builds a ``Batch`` (the rows one decision changes,
plus its audit events) and the store applies it in one transaction, fenced by the run's lease token.
Batches are data, so pure-step results can ride along with the next intent (one commit instead of
two), and a backend can group-commit the batches of many runs in one transaction.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar
from urllib.parse import urlparse

from effectflow import errors
from effectflow.ledger import expect, records
from effectflow.ledger.local import LocalTransaction

# Records of the store's own tables, defined with the others; named here too, where callers of a
# store have always found them.
from effectflow.ledger.records import DecisionRecord as DecisionRecord
from effectflow.ledger.records import OperationBinding as OperationBinding

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class AuditDraft:
    """An audit event before the store chains it (``seq`` and hashes are assigned on commit)."""

    #: What was decided.
    kind: str
    #: Details: digests, codes, evidence; never raw arguments.
    detail: dict[str, Any]
    #: When.
    at: float
    #: The step, if any.
    step_id: str | None = None
    #: The effect, if any.
    effect_id: str | None = None
    #: Who decided.
    actor: str = "runtime"


@dataclasses.dataclass
class Batch:
    """Rows that change together, for one run, in one transaction.

    Later rows for the same key replace earlier ones, so a batch that absorbed deferred writes still
    writes each row once.
    """

    #: The run every row belongs to.
    run_id: str
    #: The lease token the writer holds; the store refuses the batch if it is stale. None = unfenced
    #: (only for creating a run, or for a person's action on a run no worker holds).
    lease_token: int | None
    #: A run to insert (first batch of a run).
    new_run: records.RunRecord | None = None
    #: Columns of the run row to change (``status``, ``output``, ``error``, ...).
    run_changes: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Step rows to upsert, by step id.
    steps: dict[str, records.StepRecord] = dataclasses.field(default_factory=dict)
    #: Effect rows to upsert, by effect id.
    effects: dict[str, records.EffectRecord] = dataclasses.field(default_factory=dict)
    #: Attempt rows to upsert, by attempt id.
    attempts: dict[str, records.AttemptRecord] = dataclasses.field(default_factory=dict)
    #: Logical operations to bind (refused with IdempotencyConflict if bound to another digest).
    operations: list[OperationBinding] = dataclasses.field(default_factory=list)
    #: Decisions by people to pin.
    decisions: list[DecisionRecord] = dataclasses.field(default_factory=list)
    #: Approvals given by people.
    approvals: list[records.ApprovalRecord] = dataclasses.field(default_factory=list)
    #: Audit events, in order.
    audit: list[AuditDraft] = dataclasses.field(default_factory=list)
    #: What the batch's decision was made on (``expect_run``, ``expect_step``, ...): the store
    #: checks each inside the transaction, before writing, and refuses the whole batch with
    #: ``StaleState`` when one no longer holds (``expect``;
    #: docs/concepts.md#peoples-decisions-are-compare-and-swap).
    expectations: list[expect.Expectation] = dataclasses.field(default_factory=list)
    #: A call's outcome: on a ledger opened with ``durability=intents`` it commits without an
    #: fsync of its own, surviving a process crash at once and power loss with the ledger's next
    #: fsynced commit (see ``DURABILITY``). Intents, run ends and people's actions are never
    #: deferrable (a run's start in ``rt.start`` or ``start_async`` ``rides``, whatever the
    #: durability).
    deferrable: bool = False
    #: Commits without a flush of its own, whatever the durability: a run's first commit in the
    #: process that then executes it (``rt.start``, ``start_async``; a group of such starts
    #: rides too, a start grouped with other batches is flushed with them). Nothing of the run is
    #: sent or answered before its next commit that is flushed (an intent, a pause, the run's
    #: end), and that flush carries this one to the disk with it (the ledger's log is one
    #: sequence). A power cut before it loses a run that nobody was told of and that had called
    #: nothing.
    rides: bool = False
    #: Whether a fenced batch extends its run's lease to ``now + lease_ttl`` (what every store
    #: does unless told otherwise). ``LedgerWriter`` leaves a lease alone while two thirds of its
    #: TTL are left, which the heartbeat's renewal every third of it keeps true: then the run's
    #: row is written without its lease moving, so its lease index is not rewritten (SQLite: one
    #: WAL page fewer a commit) and PostgreSQL updates the row in place (a HOT update, no index
    #: entries) — BENCHMARKS.md, "Session 11".
    renews_lease: bool = True
    #: The writer renews this batch's lease whatever is left of it: the intent of a call whose
    #: tool takes a deadline, which the lease bounds (``calling.send``), so the call gets the
    #: whole TTL as before.
    full_lease: bool = False

    def step(self, step: records.StepRecord) -> None:
        """Upsert a step row."""
        self.steps[step.step_id] = step

    def effect(self, effect: records.EffectRecord) -> None:
        """Upsert an effect row."""
        self.effects[effect.effect_id] = effect

    def attempt(self, attempt: records.AttemptRecord) -> None:
        """Upsert an attempt row."""
        self.attempts[attempt.attempt_id] = attempt

    def expect_run(self, **fields: Any) -> None:
        """Refuse the batch unless the run's fields still have these values (a tuple lists the
        values allowed), e.g. ``expect_run(status=(paused, failed), lease_token=3)``."""
        self.expectations.append(expect.build(expect.Subject.RUN, None, fields))

    def expect_step(self, step_id: str, **fields: Any) -> None:
        """Refuse the batch unless the step exists with these values (``error_code`` is its
        ``error["code"]``)."""
        self.expectations.append(expect.build(expect.Subject.STEP, step_id, fields))

    def expect_effect(self, effect_id: str, **fields: Any) -> None:
        """Refuse the batch unless the effect exists with these values (``version=``, ...)."""
        self.expectations.append(expect.build(expect.Subject.EFFECT, effect_id, fields))

    def expect_unapproved(self, step_id: str, request_digest: str) -> None:
        """Refuse the batch if the step's request has an approval already."""
        self.expectations.append(
            expect.build(expect.Subject.UNAPPROVED, step_id, {"request_digest": request_digest})
        )

    def event(
        self,
        kind: str,
        at: float,
        *,
        step_id: str | None = None,
        effect_id: str | None = None,
        actor: str = "runtime",
        **detail: Any,
    ) -> None:
        """Append an audit event."""
        self.audit.append(AuditDraft(kind, detail, at, step_id, effect_id, actor))

    def absorb(self, later: Batch) -> None:
        """Fold ``later`` into this batch (its rows win), keeping audit order."""
        if later.new_run is not None:
            self.new_run = later.new_run
        self.run_changes.update(later.run_changes)
        self.steps.update(later.steps)
        self.effects.update(later.effects)
        self.attempts.update(later.attempts)
        self.operations.extend(later.operations)
        self.decisions.extend(later.decisions)
        self.approvals.extend(later.approvals)
        self.audit.extend(later.audit)
        self.expectations.extend(later.expectations)
        if later.lease_token is not None:
            self.lease_token = later.lease_token

    @property
    def empty(self) -> bool:
        """Whether the batch writes nothing."""
        return not (
            self.new_run
            or self.run_changes
            or self.steps
            or self.effects
            or self.attempts
            or self.operations
            or self.decisions
            or self.approvals
            or self.audit
        )


@dataclasses.dataclass(frozen=True)
class Applied:
    """What became of one batch of a group commit."""

    #: Why the batch was refused (nothing of it was written), or None.
    error: Exception | None = None
    #: The run's control request (cancel / compensate), when it has one.
    control: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class Claimed:
    """A run a worker claimed (``claim_runnable``), and whose lease it took over."""

    #: The run, leased to the claimer (with its new token).
    run: records.RunRecord
    #: The owner whose lease had expired or who was proved dead: a takeover. None when nobody
    #: held the run (a new one, or one released by its owner).
    previous_owner: str | None


@dataclasses.dataclass(frozen=True)
class AuditProblem:
    """A place where the audit log does not verify."""

    #: The run whose chain breaks.
    run_id: str
    #: The event's sequence number (None when the problem is the chain's head or length).
    seq: int | None
    #: What is wrong.
    message: str


class LedgerStore(Protocol):
    """What the runtime needs from a ledger backend. One conformance suite tests every backend."""

    #: The URL the store was opened with.
    url: str
    #: The ``durability`` option: ``full`` or ``intents`` (``DURABILITY``).
    durability: str
    #: Whether a Runtime on this store groups commits unless told otherwise (measured per backend).
    group_commit_default: bool
    #: Group transactions one process may have in flight at once.
    max_concurrent_writers: int

    def migrate(self) -> list[int]:
        """Apply the migrations the database has not seen; returns the versions applied."""
        ...

    def schema_version(self) -> int:
        """The newest migration applied."""
        ...

    def apply(self, batch: Batch, *, lease_ttl: float, now: float) -> dict[str, Any] | None:
        """Commit ``batch`` in one transaction; renews the lease it is fenced by.

        Returns the run's ``control`` request (cancel / compensate) when an operator made one, so
        the writer learns of it with the write it had to make anyway, at no extra query.

        Raises:
            errors.LeaseLost: the batch's lease token is not the run's current one; nothing written.
            errors.IdempotencyConflict: an operation is bound to another digest, or a decision or
                approval id is taken already; nothing written.
            errors.StaleState: one of the batch's expectations no longer holds; nothing written.
        """
        ...

    def apply_many(
        self, batches: Sequence[Batch], *, lease_ttl: float, now: float
    ) -> list[Applied]:
        """Commit several runs' batches in one transaction (group commit), each in a savepoint.

        Returns, per batch, what ``apply`` would have: its run's control request, or the error
        (``LeaseLost``, ``IdempotencyConflict``, ``StaleState``) that refused it while the others
        still commit.
        """
        ...

    def claim_runnable(
        self,
        *,
        owner: str,
        ttl: float,
        now: float,
        limit: int,
        dead_owners: Sequence[str] = (),
    ) -> list[Claimed]:
        """Lease up to ``limit`` runs a worker should execute: ``running`` or ``cancelling`` runs
        with no lease, an expired one, or one held by an owner in ``dead_owners`` (the caller
        proved them dead: a pid gone on its own host), oldest first, each with the owner it was
        taken from (the lease takeovers telemetry counts). Each claimed run's token is bumped (so
        a former owner's writes are refused). Concurrent workers never claim the same run
        (PostgreSQL: ``FOR UPDATE SKIP LOCKED``; SQLite: ``BEGIN IMMEDIATE``)."""
        ...

    def lease_owners(self, *, now: float) -> list[str]:
        """The distinct owners of unexpired leases on ``running`` or ``cancelling`` runs (a worker
        checks which of them are dead processes on its host)."""
        ...

    def heartbeat(self, leases: Sequence[tuple[str, int]], *, ttl: float, now: float) -> list[str]:
        """Extend the leases ``(run_id, token)`` a worker holds; returns the run ids whose token is
        no longer current (the worker lost them and must stop writing for them)."""
        ...

    def wait_for_work(self, timeout: float) -> bool:
        """Block until a run may have become runnable, or ``timeout`` seconds; whether to look
        for work now.

        PostgreSQL wakes on ``LISTEN``/``NOTIFY`` (a run created for workers, a lease released)
        and answers False after a quiet ``timeout``; SQLite has no notifications, sleeps a short
        poll interval and answers True (only a look can tell).
        """
        ...

    def apply_with(
        self,
        work: Callable[[LocalTransaction], T],
        finish: Callable[[T], Batch],
        *,
        lease_ttl: float,
        now: float,
    ) -> tuple[T, dict[str, Any] | None]:
        """Run ``work`` inside a ledger transaction, then write ``finish(result)`` in the same one.

        Everything commits together; any exception (from ``work``, ``finish``, or a refused batch)
        rolls everything back. Returns the work's result and the run's control request.

        Raises:
            errors.CommitInDoubt: the COMMIT itself got no answer (the connection broke while
                committing): everything may or may not have landed. ``checkpoint_committed``
                settles it.
        """
        ...

    def checkpoint_committed(self, run_id: str, attempt_id: str) -> bool:
        """Whether the local transaction whose checkpoint records attempt ``attempt_id`` as
        committed did commit: its attempt row, read on a connection of its own.

        The checkpoint commits with the tool's writes, so the row settles a COMMIT whose answer was
        lost. It is read only once no transaction that may still commit it is open (PostgreSQL:
        after taking the run's row lock, which the checkpoint's fence holds until its transaction
        ends), so "absent" means it never will commit.

        Raises:
            errors.CommitInDoubt: a transaction on the run stayed open past the lock timeout.
        """
        ...

    def claim(
        self, run_id: str, *, owner: str, expected_token: int, ttl: float, now: float
    ) -> records.RunRecord | None:
        """Take the run's lease if its token is still ``expected_token``; returns the run with the
        new token, or None when someone else changed it first."""
        ...

    def release(self, run_id: str, *, token: int) -> None:
        """Give the lease up (no-op if the token is stale)."""
        ...

    def get_run(self, run_id: str, *, tenant: str | None = None) -> records.RunRecord | None:
        """The run, or None (also None when it belongs to another tenant)."""
        ...

    def list_runs(
        self,
        *,
        tenant: str | None,
        statuses: Sequence[str] | None = None,
        limit: int = 100,
        before: float | None = None,
        scope: str | None = None,
        call_id: str | None = None,
    ) -> list[records.RunRecord]:
        """Newest first; ``scope`` / ``call_id`` select guarded calls by the host's ids."""
        ...

    def runs_to_recover(self, *, now: float, limit: int = 100) -> list[records.RunRecord]:
        """Runs marked ``running`` whose lease expired or was never taken."""
        ...

    def leased_running_runs(self, *, limit: int = 1000) -> list[records.RunRecord]:
        """Running runs that still hold a lease (the runtime checks whether the holder lives)."""
        ...

    def steps(self, run_id: str) -> list[records.StepRecord]:
        """The run's steps in the order it reached them."""
        ...

    def attempts(self, run_id: str, step_id: str | None = None) -> list[records.AttemptRecord]:
        """Attempts in order."""
        ...

    def effects(
        self,
        *,
        tenant: str | None,
        run_id: str | None = None,
        statuses: Sequence[str] | None = None,
        limit: int = 1000,
    ) -> list[records.EffectRecord]:
        """Effects, oldest first."""
        ...

    def effects_in_doubt(
        self, *, tenant: str | None, now: float, limit: int = 1000
    ) -> list[records.EffectRecord]:
        """Effects in doubt (``intent_recorded``, ``unknown``, ``needs_attention``) whose run is
        not running under an unexpired lease, oldest first: the ones no owner may be settling."""
        ...

    def get_effect(
        self, effect_id: str, *, tenant: str | None = None
    ) -> records.EffectRecord | None:
        """One effect, or None."""
        ...

    def get_operation(self, tenant: str, logical_operation_id: str) -> OperationBinding | None:
        """The binding of a logical operation, or None."""
        ...

    def get_decision(self, tenant: str, decision_id: str) -> DecisionRecord | None:
        """A pinned decision of this tenant, or None (ids are unique per tenant)."""
        ...

    def get_approval(self, tenant: str, approval_id: str) -> records.ApprovalRecord | None:
        """An approval of this tenant by its id, or None (ids are unique per tenant)."""
        ...

    def approvals(self, run_id: str, step_id: str | None = None) -> list[records.ApprovalRecord]:
        """A run's approvals (of one step), oldest first."""
        ...

    def audit(self, run_id: str) -> list[records.AuditEvent]:
        """The run's audit events in order."""
        ...

    def verify_audit(self, run_id: str | None = None) -> list[AuditProblem]:
        """Recompute the hash chains; empty when the log is intact."""
        ...

    def purge_expired_keys(self, *, now: float) -> int:
        """Drop operation bindings whose key retention passed and whose step is settled."""
        ...

    def bound_waits(self, seconds: float) -> None:
        """Wait at most ``seconds`` for the ledger before failing with a transient error (a
        pooled connection, another writer's lock): the runtime's ``ledger_retry`` is then the
        caller's bound, not the driver's own timeout."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


#: The ``durability`` URL option of both backends: which commits wait for the disk.
DURABILITY = {
    # Every commit is flushed to disk before it returns: everything recorded survives power loss
    # (a run's start in ``rt.start`` or ``start_async`` rides the run's next flushed commit:
    # ``Batch.rides``).
    "full": "every commit survives power loss",
    # Intents (and run ends, people's actions) are flushed before they return, so
    # nothing is ever sent without a record that survives power loss. A call's outcome is written
    # without its own flush: it survives a process crash at once, and power loss as soon as the
    # ledger's next flushed commit lands (the run's next intent or its end). After a power loss in
    # between, the step is in doubt and is settled the way a crash between call and record is:
    # by the tool's lookup, or by a person.
    "intents": "intents survive power loss; outcomes survive a process crash, and power loss "
    "from the next flushed commit",
}


def parse_durability(url: str, value: str | None) -> str:
    """The ``durability`` option's value, checked.

    Raises:
        errors.ContractError: an unknown value (names the URL and the values allowed).
    """
    mode = (value or "full").strip().lower()
    if mode not in DURABILITY:
        raise errors.ContractError(
            f"{url!r}: durability={value!r}; use one of {sorted(DURABILITY)} (full, the default: "
            "every commit survives power loss; intents: call outcomes survive power loss from "
            "the next flushed commit)"
        )
    return mode


#: The ledger URLs that are understood, as an error shows them.
LEDGER_URL_FORMS = (
    "sqlite:///relative/path.db, sqlite:////absolute/path.db or postgresql://user@host:5432/db"
)


def open_store(url: str) -> LedgerStore:
    """Open the backend a URL names, importing its driver only then.

    ``sqlite:///relative.db``, ``sqlite:////absolute.db``, or a plain file path use SQLite;
    ``postgresql://user@host:5432/db`` (or ``postgres://``) uses PostgreSQL. A driver's dialect
    in the scheme (``postgres+psycopg://``) is SQLAlchemy's spelling, not a ledger URL.

    Raises:
        errors.ContractError: for a URL no backend understands (or a malformed SQLite one), or a
            backend whose driver is not installed.
    """
    scheme = urlparse(url).scheme if "://" in url else ""
    if scheme in ("", "sqlite", "file"):
        from effectflow.ledger import sqlite

        return sqlite.SQLiteStore(url)
    if scheme in ("postgres", "postgresql"):
        try:
            from effectflow.ledger import postgres
        except ImportError as exc:
            raise errors.ContractError(
                f"a {scheme}:// ledger needs psycopg 3 and psycopg-pool ({exc}); install them "
                "with: pip install 'psycopg[binary]>=3.2,<4' 'psycopg-pool>=3.2,<4'"
            ) from exc
        return postgres.PostgresStore(url)
    raise errors.ContractError(
        f"{url!r}: unknown ledger URL scheme {scheme!r}; write {LEDGER_URL_FORMS}"
    )
