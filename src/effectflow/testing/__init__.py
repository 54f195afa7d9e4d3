"""Test helpers that ship with effectflow, so users can prove their own contracts.

- Simulated providers with real-world semantics whose state outlives the process that calls them
  (each keeps its own SQLite file): ``MailProvider``, ``CrmProvider``, ``NotifyProvider``,
  ``PaymentsProvider``, ``DeployTarget``, with durable provider-side faults
  (``provider.inject("send", "lose_response")``).
- Runtime fault plans that crash the calling process at a named window of the write path
  (``FaultPlan.kill_at(FaultPoint.AFTER_CALL_BEFORE_RECORD, "send_case_email")``).
"""

from effectflow.runtime.faults import Fault, FaultAction, FaultPlan, FaultPoint, InjectedCrash
from effectflow.testing.providers import (
    CrmProvider,
    DeployTarget,
    FaultKind,
    IdempotencyKeyReused,
    MailProvider,
    NotifyProvider,
    PaymentsProvider,
    ProviderError,
    ProviderRejected,
    ProviderTimeout,
    ProviderUnavailable,
    RevisionConflict,
)

__all__ = [
    "CrmProvider",
    "DeployTarget",
    "Fault",
    "FaultAction",
    "FaultKind",
    "FaultPlan",
    "FaultPoint",
    "IdempotencyKeyReused",
    "InjectedCrash",
    "MailProvider",
    "NotifyProvider",
    "PaymentsProvider",
    "ProviderError",
    "ProviderRejected",
    "ProviderTimeout",
    "ProviderUnavailable",
    "RevisionConflict",
]
