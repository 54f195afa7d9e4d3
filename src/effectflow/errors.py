"""Every error effectflow raises, and the signals tools raise to speak to the runtime.

The tree::

    EffectflowError                 code            raised to callers of the runtime
    ├── ContractError               contract_error  a contract is missing, malformed or contradicts itself
    │   └── ContractFileError       contract_file   a YAML contract file is invalid (file, line, field)
    ├── ArgumentError               bad_argument    arguments are not JSON-serializable, or too large
    ├── IdempotencyConflict         idempotency_conflict   same key / operation / run id, other payload
    ├── RunNotFound                 run_not_found
    ├── EffectNotFound              effect_not_found
    ├── StaleState                  stale_state     an action names a version or state that has moved on
    ├── CommitInDoubt               commit_in_doubt  a local transaction's COMMIT got no answer
    ├── LeaseLost                   lease_lost      this process no longer owns the run: it commits nothing
    ├── NeedsPerson                 needs_person    a guarded call waits for a person (in doubt, approval)
    ├── LedgerUnavailable           ledger_unavailable  the ledger stayed away: left for recovery
    └── StepFailed                  step_failed     what ``ctx.call`` raises inside a workflow
        ├── StepRejected            step_rejected   the provider said no; never retried
        ├── RetryBudgetExhausted    retry_budget_exhausted   not committed, and no attempts left
        └── ResultNotRecordable     result_not_recordable    committed, but the result has no JSON form

    ToolSignal                      raised BY tools, classified by the write path
    ├── NotCommitted                nothing happened at the provider: safe to retry with the same key
    ├── Rejected                    the provider refused: a definite failure, no retry
    ├── OutcomeUnknown              may have happened: confirm before anything else
    └── Conflict                    a precondition (revision, ETag) failed: re-observe, never overwrite

    AbandonGoal                     raised by a WORKFLOW: the business goal is gone

Any other exception from a tool that is not ``pure``/``read`` counts as ``OutcomeUnknown``: only a tool
can prove that nothing happened, by raising ``NotCommitted`` or ``Rejected``.

Each error carries the ids that matter as attributes and a stable ``code`` used by the CLI and the
HTTP API, so callers never parse messages.
"""

from __future__ import annotations

from typing import Any


class EffectflowError(Exception):
    """Base of every error the runtime raises to its callers."""

    code = "effectflow_error"

    def __init__(
        self,
        message: str,
        *,
        run_id: str | None = None,
        step_id: str | None = None,
        effect_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        #: The run the error is about, when there is one.
        self.run_id = run_id
        #: The step the error is about, when there is one.
        self.step_id = step_id
        #: The effect the error is about, when there is one.
        self.effect_id = effect_id
        #: The idempotency key involved (a hash: never raw parameters).
        self.idempotency_key = idempotency_key

    def to_dict(self) -> dict[str, Any]:
        """The error as the CLI's ``--json`` output and the HTTP problem document show it."""
        data: dict[str, Any] = {"code": self.code, "message": self.message}
        for name in ("run_id", "step_id", "effect_id", "idempotency_key"):
            value = getattr(self, name)
            if value is not None:
                data[name] = value
        return data


class ContractError(EffectflowError):
    """A tool or step contract is missing, malformed, or contradicts itself."""

    code = "contract_error"


class ContractFileError(ContractError):
    """A contract file failed validation; ``problems`` lists each with file, line and field."""

    code = "contract_file"

    def __init__(self, message: str, problems: list[ContractProblem]) -> None:
        super().__init__(message)
        #: Every problem found, in file order.
        self.problems = problems


class ContractProblem:
    """One problem in a contract file: where it is and what to do about it."""

    __slots__ = ("field", "file", "line", "message")

    def __init__(self, file: str, line: int, field: str, message: str) -> None:
        #: The file's path as given.
        self.file = file
        #: 1-based line of the offending value (or of its mapping).
        self.line = line
        #: Dotted path of the field, e.g. ``side_effect_contract.idempotency.retention``.
        self.field = field
        #: What is wrong and what to write instead.
        self.message = message

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.field}: {self.message}"

    def __repr__(self) -> str:
        return f"ContractProblem({str(self)!r})"


class ArgumentError(EffectflowError):
    """Arguments or results cannot be recorded (not JSON-serializable, or too large)."""

    code = "bad_argument"


class IdempotencyConflict(EffectflowError):
    """The same key, logical operation, decision or run id was reused with a different payload.

    Nothing is written when this is raised: the first payload stays bound to the identity.
    """

    code = "idempotency_conflict"


class RunNotFound(EffectflowError):
    """No run with this id exists for this tenant."""

    code = "run_not_found"


class EffectNotFound(EffectflowError):
    """No effect with this id exists for this tenant."""

    code = "effect_not_found"


class StaleState(EffectflowError):
    """An action was based on a version or state that has since changed; nothing was changed."""

    code = "stale_state"


class CommitInDoubt(EffectflowError):
    """A ``local_transaction`` step's COMMIT got no answer (the connection broke while committing),
    so its writes and checkpoint may or may not have landed, and reading its checkpoint row to
    settle that failed too. Nothing was recorded for the step: it is neither confirmed nor rolled
    back, and the run keeps its lease until it lapses. Resuming or recovering the run settles the
    step from its checkpoint row (which commits with the tool's writes) before anything else, so
    the tool never runs twice."""

    code = "commit_in_doubt"


class LeaseLost(EffectflowError):
    """This process no longer holds the run's lease (its fencing token is stale): it commits nothing."""

    code = "lease_lost"


class LedgerError(EffectflowError):
    """The ledger's database failed a statement: what its driver raised (``sqlite3``, psycopg) is
    the ``__cause__``. Every ledger error a store raises is one of this family, so callers never
    catch a driver's exceptions: ``LedgerUnavailable`` when the database was away or could not
    write (worth retrying), ``LedgerFileError`` when it is not a ledger this effectflow may open,
    and this class itself for the rest (a statement the database refused: a bug or a schema
    changed by hand)."""

    code = "ledger_error"


class LedgerUnavailable(LedgerError):
    """The ledger could not be reached or written: a server restarted, a cut connection, a pool
    with no connection to give, a locked or full SQLite file. A store raises it at once; the
    runtime retries an outcome's write on fresh connections first. Nothing was recorded as failed:
    the run keeps its lease until it lapses, then any worker or ``rt.recover()`` settles its steps
    by the decision table."""

    code = "ledger_unavailable"


class LedgerFileError(LedgerError):
    """The ledger named is not one this effectflow may open: not an SQLite file, another
    application's database, a schema newer than this effectflow knows, or a read-only file that
    needs an upgrade. Raised before anything is written: the file is left as it was."""

    code = "ledger_file"


class NeedsPerson(EffectflowError):
    """A guarded call cannot answer without a person: its effect may have happened (``kind``
    ``in_doubt``), or it waits for an approval (``approval``). Carries what an adapter needs to
    ask the host's human-in-the-loop mechanism, and what to tell the model meanwhile."""

    code = "needs_person"

    def __init__(
        self,
        message: str,
        *,
        run_id: str,
        step_id: str,
        effect_id: str | None,
        kind: str,
        for_model: str,
    ) -> None:
        super().__init__(message, run_id=run_id, step_id=step_id, effect_id=effect_id)
        #: ``in_doubt`` (settle with ``rt.resolve``) or ``approval`` (``rt.approve``).
        self.kind = kind
        #: What the host tells the model instead of a result.
        self.for_model = for_model
        #: What a person does: ``resolve`` or ``approve``.
        self.next_action = "approve" if kind == "approval" else "resolve"


class StepFailed(EffectflowError):
    """Raised by ``ctx.call`` when a step ended in a definite failure the workflow may handle."""

    code = "step_failed"


class StepRejected(StepFailed):
    """The provider rejected the call (validation, 4xx): a definite failure, never retried."""

    code = "step_rejected"


class RetryBudgetExhausted(StepFailed):
    """Every attempt was ``not_committed`` and the contract's retry budget is spent."""

    code = "retry_budget_exhausted"


class ResultNotRecordable(StepFailed):
    """The tool committed, but its result cannot be recorded (no JSON form, too large, a NUL the
    ledger refuses). The effect is confirmed with what can be: its external id, a digest of the
    raw result and the problem; the workflow gets this error."""

    code = "result_not_recordable"


class ToolSignal(Exception):
    """Base of the exceptions a tool raises to tell the runtime what happened."""

    def __init__(self, message: str = "", *, evidence: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        #: What the tool observed (status code, provider error code): recorded on the attempt.
        self.evidence = evidence or {}


class NotCommitted(ToolSignal):
    """Nothing happened at the provider (e.g. connection refused before sending)."""


class Rejected(ToolSignal):
    """The provider refused the request: a definite failure."""


class OutcomeUnknown(ToolSignal):
    """The request may or may not have taken effect (timeout, reset after sending, 5xx)."""


class Conflict(ToolSignal):
    """A precondition (expected revision, ETag) did not hold: nothing was overwritten."""


class AbandonGoal(Exception):
    """Raised by a workflow when the business goal is gone (the customer withdrew, say).

    This, or an operator's ``compensate``, is what may trigger compensation: a technical failure never
    does.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
