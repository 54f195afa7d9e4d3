"""Fault plans: the runtime's hooks for crash tests must cost nothing when no fault is planned."""

from __future__ import annotations

import sys

from effectflow.runtime.faults import NO_FAULTS, FaultPoint


def test_the_default_fault_plan_keeps_nothing_per_hit() -> None:
    """A worker's runtime passes fault points forever: the shared default plan must not grow."""
    before = {k: sys.getsizeof(v) for k, v in vars(NO_FAULTS).items()}
    for _ in range(10_000):
        NO_FAULTS.hit(FaultPoint.AFTER_RECORD, "step")
    assert {k: sys.getsizeof(v) for k, v in vars(NO_FAULTS).items()} == before
