"""What the end-to-end tests share: the world their tools talk to, a clock they move, a step's record.

A test module declares its tools once, at import (``@ef.tool`` registers them by name), but each
test needs a fresh outside world — providers on their own files, counters, gates. The module makes
one :class:`Current` and its tools call it (``world().mail.send(...)``); its fixture enters a new
world for each test::

    world = worlds.Current[World]()

    @pytest.fixture
    def w(tmp_path: Path) -> Iterator[World]:
        with world.entered(World(tmp_path)) as made:
            yield made

What each module's world holds stays in that module: it is what its tests are about.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar

import effectflow as ef

#: A fixed start for clocks that only move when told (2023-11-14T22:13:20Z).
T0 = 1_700_000_000.0


class Closable(Protocol):
    """A world: it closes what it opened (the providers' connections)."""

    def close(self) -> None:
        """Close the world's providers."""


W = TypeVar("W", bound=Closable)


class Current(Generic[W]):
    """The world of the test that is running, for tools declared at import."""

    def __init__(self) -> None:
        self._worlds: list[W] = []

    def __call__(self) -> W:
        """The current test's world."""
        return self._worlds[-1]

    @contextlib.contextmanager
    def entered(self, made: W) -> Iterator[W]:
        """Make ``made`` the current world for the block; close it after."""
        self._worlds.append(made)
        try:
            yield made
        finally:
            self._worlds.remove(made)
            made.close()


class FakeClock:
    """A clock that moves only when the test says so (``ef.Runtime(url, clock=...)``, providers)."""

    def __init__(self, now: float = T0) -> None:
        #: Epoch seconds it answers.
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move the clock forward."""
        self.now += seconds


def step(rt: ef.Runtime, run_id: str, step_id: str) -> ef.StepRecord:
    """The record of one step of a run."""
    return next(s for s in rt.steps(run_id) if s.step_id == step_id)
