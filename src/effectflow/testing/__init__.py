"""Test helpers that ship with effectflow, so users can prove their own contracts.

- Simulated providers with real-world semantics whose state outlives the process that calls them
  (each keeps its own SQLite file): ``MailProvider``, ``CrmProvider``, ``NotifyProvider``,
  ``PaymentsProvider``, ``DeployTarget``, with durable provider-side faults
  (``provider.inject("send", "lose_response")``).
- The same providers as a local HTTP service in their own process
  (``effectflow testing serve-providers``, :class:`ProviderService`), with HTTP clients of the
  same API and exceptions: ``HttpMail``, ``HttpCrm``, ``HttpNotify``, ``HttpPayments``,
  ``HttpDeploy``. They need the ``testing`` extra and are imported on first use, so the rest of
  this package works without it.
- Runtime fault plans that crash the calling process at a named window of the write path
  (``FaultPlan.kill_at(FaultPoint.AFTER_CALL_BEFORE_RECORD, "send_case_email")``).
"""

from typing import TYPE_CHECKING, Any

from effectflow.runtime.faults import Fault, FaultAction, FaultPlan, FaultPoint, InjectedCrash
from effectflow.testing.providers import (
    CrmProvider,
    DeadlineExceeded,
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
    deadline,
)

if TYPE_CHECKING:
    from effectflow.testing.http_clients import (
        HttpCrm,
        HttpDeploy,
        HttpMail,
        HttpNotify,
        HttpPayments,
        ProviderService,
    )

#: Names served by ``http_clients``, which needs httpx (the ``testing`` extra).
_HTTP_NAMES = frozenset(
    {"HttpCrm", "HttpDeploy", "HttpMail", "HttpNotify", "HttpPayments", "ProviderService"}
)

__all__ = [
    "CrmProvider",
    "DeadlineExceeded",
    "DeployTarget",
    "Fault",
    "FaultAction",
    "FaultKind",
    "FaultPlan",
    "FaultPoint",
    "HttpCrm",
    "HttpDeploy",
    "HttpMail",
    "HttpNotify",
    "HttpPayments",
    "IdempotencyKeyReused",
    "InjectedCrash",
    "MailProvider",
    "NotifyProvider",
    "PaymentsProvider",
    "ProviderError",
    "ProviderRejected",
    "ProviderService",
    "ProviderTimeout",
    "ProviderUnavailable",
    "RevisionConflict",
    "deadline",
]


def __getattr__(name: str) -> Any:
    """Import the HTTP clients on first use, so that only they need the ``testing`` extra."""
    if name in _HTTP_NAMES:
        from effectflow.testing import http_clients

        return getattr(http_clients, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
