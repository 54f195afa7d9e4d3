"""Preconditions: what a write expects the target to be, so it never overwrites a newer state.

Idempotency stops the *same* action from happening twice; it does nothing against two *different*
writers racing on one resource. A write that carries the revision (or ETag) it was based on lets
the provider refuse it when someone else changed the target first; the runtime then re-observes.
"""

from __future__ import annotations

import dataclasses

from effectflow import errors


@dataclasses.dataclass(frozen=True)
class Expect:
    """``ctx.call(..., precondition=ef.Expect(revision=42))``: the state a write was based on."""

    #: The revision (version number) the caller observed.
    revision: int | str | None = None
    #: The ETag the caller observed (sent as ``If-Match``).
    etag: str | None = None

    def __post_init__(self) -> None:
        if self.revision is None and self.etag is None:
            raise errors.ArgumentError(
                "ef.Expect needs revision= or etag=: the state the write was based on"
            )
        if isinstance(self.revision, bool):
            raise errors.ArgumentError("ef.Expect(revision=...) takes a number or string")

    @property
    def if_match(self) -> str:
        """The value of an ``If-Match`` header for this precondition."""
        if self.etag is not None:
            return self.etag
        return f'"{self.revision}"'
