"""effectflow: run tool calls with real side effects, and know after any crash which happened.

The public API is re-exported here; everything else lives in subpackages.
"""

from effectflow.contracts.loader import ContractSet, load_contracts, parse_contracts
from effectflow.contracts.lookup import Lookup, LookupStatus
from effectflow.contracts.precondition import Expect
from effectflow.contracts.tool import (
    CommitSemantics,
    Compensation,
    Completion,
    EffectClass,
    Idempotency,
    RetryPolicy,
    Tool,
    ToolContract,
    tool,
)
from effectflow.contracts.workflow import (
    StepContract,
    WhenConfirmed,
    WhenNotCommitted,
    WhenUnknown,
    Workflow,
    workflow,
)
from effectflow.errors import (
    AbandonGoal,
    ArgumentError,
    CommitInDoubt,
    Conflict,
    ContractError,
    ContractFileError,
    EffectflowError,
    EffectNotFound,
    IdempotencyConflict,
    LeaseLost,
    LedgerFileError,
    LedgerUnavailable,
    NeedsPerson,
    NotCommitted,
    OutcomeUnknown,
    Rejected,
    ResultNotRecordable,
    RetryBudgetExhausted,
    RunNotFound,
    StaleState,
    StepFailed,
    StepRejected,
)
from effectflow.ledger.local import LocalTransaction
from effectflow.ledger.records import (
    ApprovalRecord,
    AttemptRecord,
    AuditEvent,
    EffectRecord,
    Inventory,
    NextAction,
    RunRecord,
    RunStatus,
    StepRecord,
    StepStatus,
)
from effectflow.runtime.context import AsyncContext, Context
from effectflow.runtime.guard import Guarded
from effectflow.runtime.runtime import Runtime

Retry = RetryPolicy

__version__ = "0.1.0"

__all__ = [
    "AbandonGoal",
    "ApprovalRecord",
    "ArgumentError",
    "AsyncContext",
    "AttemptRecord",
    "AuditEvent",
    "CommitInDoubt",
    "CommitSemantics",
    "Compensation",
    "Completion",
    "Conflict",
    "Context",
    "ContractError",
    "ContractFileError",
    "ContractSet",
    "EffectClass",
    "EffectNotFound",
    "EffectRecord",
    "EffectflowError",
    "Expect",
    "Guarded",
    "Idempotency",
    "IdempotencyConflict",
    "Inventory",
    "LeaseLost",
    "LedgerFileError",
    "LedgerUnavailable",
    "LocalTransaction",
    "Lookup",
    "LookupStatus",
    "NeedsPerson",
    "NextAction",
    "NotCommitted",
    "OutcomeUnknown",
    "Rejected",
    "ResultNotRecordable",
    "Retry",
    "RetryBudgetExhausted",
    "RetryPolicy",
    "RunNotFound",
    "RunRecord",
    "RunStatus",
    "Runtime",
    "StaleState",
    "StepContract",
    "StepFailed",
    "StepRecord",
    "StepRejected",
    "StepStatus",
    "Tool",
    "ToolContract",
    "WhenConfirmed",
    "WhenNotCommitted",
    "WhenUnknown",
    "Workflow",
    "__version__",
    "load_contracts",
    "parse_contracts",
    "tool",
    "workflow",
]
