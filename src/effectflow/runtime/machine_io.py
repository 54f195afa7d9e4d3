"""What the step machine asks its driver to do, and what the driver answers.

The machine never performs I/O itself; it yields these requests, so the same write path runs under
a blocking driver and an asyncio one, and a driver may batch the commits of many runs.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Generator
from typing import Any

from effectflow.contracts.tool import Tool
from effectflow.ledger.store import Batch
from effectflow.runtime.control import Control


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
class AwaitCall:
    """Wait up to ``seconds`` for a call that timed out but is still running (``Result.pending``);
    answer with its ``Result`` once it ended, or None while it still runs."""

    handle: Any
    seconds: float


@dataclasses.dataclass
class Sleep:
    """Wait before the next attempt."""

    seconds: float


@dataclasses.dataclass
class InTransaction:
    """Call a ``local_transaction`` tool inside the ledger transaction that commits ``finish``'s
    batch: its writes and the step checkpoint commit together or not at all."""

    tool: Tool[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    #: Builds the checkpoint batch from the tool's return value (inside the transaction).
    finish: Callable[[Any], Batch]


Request = Commit | Invoke | AwaitCall | Sleep | InTransaction


@dataclasses.dataclass(frozen=True)
class Result:
    """What an invocation produced: a value, or the exception it raised."""

    value: Any = None
    error: BaseException | None = None
    #: A call the driver stopped waiting for (its timeout) that still runs: a
    #: ``concurrent.futures.Future`` or an ``asyncio.Future``. Its late answer is a fact to record;
    #: until it ends the call may still land (docs/decision-table.md#when-not-found-is-proof).
    pending: Any = None


Machine = Generator[Request, Any, Any]


class Suspend(BaseException):
    """Unwinds the workflow when its run pauses. A BaseException so ``except Exception`` in workflow
    code cannot swallow it."""

    def __init__(self, step_id: str, reason: str) -> None:
        super().__init__(reason)
        self.step_id = step_id
        self.reason = reason


class Restart(BaseException):
    """Unwinds the workflow so it runs again from the top (after a conflict reset its observation
    step): the workflow then computes its precondition from the new observation."""

    def __init__(self, step_id: str, reason: str) -> None:
        super().__init__(reason)
        self.step_id = step_id
        self.reason = reason


class Stop(BaseException):
    """Unwinds the workflow at a step boundary because an operator asked to cancel or compensate."""

    def __init__(self, control: Control) -> None:
        super().__init__(control.kind.value)
        self.control = control


class Release(BaseException):
    """Unwinds the workflow at a step boundary because the process is shutting down (SIGTERM):
    the run keeps everything recorded and is released for another worker."""


def new_id(prefix: str) -> str:
    """A random, sortable-enough id with a readable prefix."""
    return f"{prefix}_{uuid.uuid4().hex[:20]}"
