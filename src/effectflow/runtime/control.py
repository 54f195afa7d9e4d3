"""An operator's (or the workflow's) request to stop a run, as a typed record.

The ledger keeps it as the run's ``control`` JSON (``{"kind", "reason", "by", "at"}``), unchanged;
the runtime reads and writes it only through ``Control``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from effectflow.ledger.records import ControlKind


@dataclasses.dataclass(frozen=True)
class Control:
    """A cancel or compensate request recorded on a run."""

    #: What is asked.
    kind: ControlKind
    #: Why: the business condition (required for a compensate; a cancel may give none).
    reason: str | None
    #: Who asked: ``operator`` or a person's id, or ``workflow`` for an abandoned goal.
    by: str
    #: When it was asked (epoch seconds).
    at: float

    @classmethod
    def of(cls, data: Mapping[str, Any] | None) -> Control | None:
        """The request a run's ``control`` JSON holds (None: there is none)."""
        if data is None:
            return None
        return cls(
            kind=ControlKind(data.get("kind", ControlKind.CANCEL)),
            reason=data.get("reason"),
            by=data.get("by", "operator"),
            at=data.get("at", 0.0),
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON the ledger keeps (the same keys, in the same order, as ever)."""
        return {"kind": self.kind.value, "reason": self.reason, "by": self.by, "at": self.at}
