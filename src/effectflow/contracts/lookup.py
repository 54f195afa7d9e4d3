"""What a lookup (confirmation) tool answers about an effect whose outcome is unknown."""

from __future__ import annotations

import dataclasses
import enum
from typing import Any


class LookupStatus(enum.StrEnum):
    """The three answers a lookup can give."""

    #: The provider has the effect: record it and continue.
    CONFIRMED = "confirmed"
    #: The provider has no trace of it: retrying with the original key is safe.
    NOT_COMMITTED = "not_committed"
    #: The provider cannot tell (yet): back off and look again, then ask a person.
    UNKNOWN = "unknown"


@dataclasses.dataclass(frozen=True)
class Lookup:
    """A lookup tool's answer. Build it with ``confirmed``, ``not_committed`` or ``unknown``."""

    #: Which of the three answers this is.
    status: LookupStatus
    #: The provider's id of the effect, when confirmed.
    external_effect_id: str | None = None
    #: The provider's completion state (accepted, sent, delivered), when confirmed.
    state: str | None = None
    #: What the provider showed, recorded as evidence on the effect.
    evidence: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: The effect's result as the original call would have returned it, when the provider has it.
    result: Any = None
    #: Why the answer is unknown.
    reason: str | None = None

    @classmethod
    def confirmed(
        cls,
        *,
        external_effect_id: str | None = None,
        state: str | None = None,
        evidence: dict[str, Any] | None = None,
        result: Any = None,
    ) -> Lookup:
        """The effect happened."""
        return cls(
            LookupStatus.CONFIRMED,
            external_effect_id=external_effect_id,
            state=state,
            evidence=evidence or {},
            result=result,
        )

    @classmethod
    def not_committed(cls, *, evidence: dict[str, Any] | None = None) -> Lookup:
        """The effect did not happen."""
        return cls(LookupStatus.NOT_COMMITTED, evidence=evidence or {})

    @classmethod
    def unknown(cls, *, reason: str, evidence: dict[str, Any] | None = None) -> Lookup:
        """The provider cannot tell."""
        return cls(LookupStatus.UNKNOWN, reason=reason, evidence=evidence or {})
