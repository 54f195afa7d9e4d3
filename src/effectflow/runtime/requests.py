"""What the step machine asks its driver to do, and what the driver answers.

The machine never performs I/O itself; it yields these requests, so the same write path runs under
a blocking driver and an asyncio one, and a driver may batch the commits of many runs.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Generator
from typing import Any

from effectflow.contracts.tool import Tool
from effectflow.ledger.store import Batch


@dataclasses.dataclass
class Commit:
    """Make ``batch`` durable (one transaction) before going on."""

    batch: Batch


@dataclasses.dataclass
class Invoke:
    """Call ``tool`` with these arguments; answer with a ``Result``."""

    tool: Tool[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    timeout: float | None


@dataclasses.dataclass
class Sleep:
    """Wait before the next attempt."""

    seconds: float


Request = Commit | Invoke | Sleep


@dataclasses.dataclass(frozen=True)
class Result:
    """What an invocation produced: a value, or the exception it raised."""

    value: Any = None
    error: BaseException | None = None


Machine = Generator[Request, Any, Any]


class Suspend(BaseException):
    """Unwinds the workflow when its run pauses. A BaseException so ``except Exception`` in workflow
    code cannot swallow it."""

    def __init__(self, step_id: str, reason: str) -> None:
        super().__init__(reason)
        self.step_id = step_id
        self.reason = reason


def new_id(prefix: str) -> str:
    """A random, sortable-enough id with a readable prefix."""
    return f"{prefix}_{uuid.uuid4().hex[:20]}"
