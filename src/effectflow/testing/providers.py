"""Simulated external providers: the outside world that effectflow's tests call.

Each provider keeps its state in its own SQLite file, apart from the runtime's ledger, so that
after a worker process is killed at any instant the provider's file still tells what really
happened. Fault rules (:meth:`~effectflow.testing._base.SqliteProvider.inject`) are stored in
that file too, so a test can arrange a lost response for a call that a worker subprocess makes.

- :class:`MailProvider`: asynchronous sends, keys with retention, status lookup.
- :class:`CrmProvider`: idempotent upsert by external id.
- :class:`NotifyProvider`: not idempotent, but searchable by a client tag.
- :class:`PaymentsProvider`: refunds with expiring keys and a deadline to cancel them.
- :class:`DeployTarget`: revisions, compare-and-swap (:class:`RevisionConflict`), other writers.
"""

from __future__ import annotations

from effectflow.testing._base import (
    DeadlineExceeded,
    FaultKind,
    IdempotencyKeyReused,
    ProviderError,
    ProviderRejected,
    ProviderTimeout,
    ProviderUnavailable,
    deadline,
)
from effectflow.testing.crm import CrmProvider
from effectflow.testing.deploy import DeployTarget, RevisionConflict
from effectflow.testing.mail import MailProvider
from effectflow.testing.notify import NotifyProvider
from effectflow.testing.payments import PaymentsProvider

__all__ = [
    "CrmProvider",
    "DeadlineExceeded",
    "DeployTarget",
    "FaultKind",
    "IdempotencyKeyReused",
    "MailProvider",
    "NotifyProvider",
    "PaymentsProvider",
    "ProviderError",
    "ProviderRejected",
    "ProviderTimeout",
    "ProviderUnavailable",
    "RevisionConflict",
    "deadline",
]
