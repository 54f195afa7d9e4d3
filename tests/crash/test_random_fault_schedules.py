"""Random fault schedules: provider faults plus at most one SIGKILL per worker process, over several
runs of the customer case; whatever happens, the ledger and the providers agree
(docs/concepts.md#the-write-path, docs/decision-table.md, docs/concepts.md#the-promises).
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

import effectflow as ef
from effectflow.runtime.faults import FaultPoint

from . import app
from .conftest import World

OPERATIONS = {"mail": "send", "crm": "upsert_task", "notify": "post"}
PROVIDER_STEPS = {"mail": app.SEND_EMAIL, "crm": app.CRM_TASK, "notify": app.NOTIFY}
PROVIDER_FAULTS = ("lose_response", "fail_before_commit", "timeout_before_commit")

#: Run statuses a run may end in once no process is driving it.
SETTLED = {ef.RunStatus.SUCCEEDED, ef.RunStatus.FAILED, ef.RunStatus.PAUSED}


@dataclasses.dataclass(frozen=True)
class ProviderFault:
    """A fault rule persisted in a provider's file before the first worker starts."""

    provider: str
    fault: str
    after: int
    times: int


@dataclasses.dataclass(frozen=True)
class Kill:
    """SIGKILL a worker at the ``occurrence``-th time it reaches ``point`` in ``step``."""

    point: FaultPoint
    step: str
    occurrence: int

    @property
    def spec(self) -> str:
        """The ``--kill`` argument of child.py."""
        return f"{self.point}:{self.step}:{self.occurrence}"


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How many runs, which provider faults, and the kill of each of the first workers."""

    runs: int
    faults: tuple[ProviderFault, ...]
    kills: tuple[Kill, ...]


provider_faults = st.builds(
    ProviderFault,
    provider=st.sampled_from(sorted(OPERATIONS)),
    fault=st.sampled_from(PROVIDER_FAULTS),
    after=st.integers(0, 3),
    times=st.integers(1, 3),
)
#: The windows each step passes through (a pure step has one; a write has the write path's).
WINDOWS_OF_STEP = {
    app.DRAFT: (FaultPoint.AFTER_PURE_RESULT,),
    **{
        step: tuple(p for p in FaultPoint if p is not FaultPoint.AFTER_PURE_RESULT)
        for step in (app.SEND_EMAIL, app.CRM_TASK, app.NOTIFY)
    },
}
kills = st.sampled_from(app.CASE_STEPS).flatmap(
    lambda step: st.builds(
        Kill,
        point=st.sampled_from(WINDOWS_OF_STEP[step]),
        step=st.just(step),
        occurrence=st.integers(1, 3),
    )
)
schedules = st.builds(
    Schedule,
    runs=st.integers(2, 3),
    faults=st.lists(provider_faults, max_size=4).map(tuple),
    kills=st.lists(kills, max_size=3).map(tuple),
)

#: Workers after the scheduled ones, before the test gives up on the runs settling.
EXTRA_WORKERS = 3


def _drive(world: World, schedule: Schedule) -> list[str]:
    """Run workers in sequence until every run has settled; returns the run ids."""
    run_ids = [f"case-{n}" for n in range(schedule.runs)]
    start = tuple((app.CASE_WORKFLOW, run_id, {"case_id": run_id}) for run_id in run_ids)
    for fault in schedule.faults:
        world.inject(
            fault.provider,
            OPERATIONS[fault.provider],
            fault.fault,
            times=fault.times,
            after=fault.after,
        )
    plan: list[Kill | None] = [*schedule.kills, *[None] * EXTRA_WORKERS]
    killed = 0
    for number, kill in enumerate(plan):
        restart = number > 0
        proc = world.child(
            kill=kill.spec if kill else None, recover=restart, reconcile=restart, start=start
        )
        assert proc.returncode in (0, -9), f"worker {number} crashed on its own:\n{proc.stderr}"
        assert kill is not None or proc.returncode == 0, "a worker without a fault was killed"
        killed += proc.returncode == -9
        with world.ledger() as rt:
            statuses = {r.run_id: r.status for r in rt.runs()}
        # Settled, and the last worker had no fault and reconciled what it could.
        settled = set(statuses) == set(run_ids) and set(statuses.values()) <= SETTLED
        if restart and kill is None and settled:
            event(f"workers killed: {killed}")
            event(f"runs ended: {sorted({s.value for s in statuses.values()})}")
            return run_ids
    pytest.fail(f"runs did not settle after {len(plan)} workers: {statuses}")


def _check(world: World, run_ids: list[str]) -> None:
    """Assert the promises of docs/concepts.md#the-promises across every run of one schedule."""
    keys: dict[str, set[str | None]] = {"mail": set(), "crm": set(), "notify": set()}
    with world.ledger() as rt:
        assert rt.verify_audit() == []
        for run_id in run_ids:
            run = rt.run(run_id)
            steps = {s.step_id: s for s in rt.steps(run_id)}
            for provider, step_id in PROVIDER_STEPS.items():
                if step_id in steps:
                    keys[provider].add(steps[step_id].idempotency_key)
            if any(e.kind == "run_resumed" for e in rt.audit(run_id)):
                event("a paused run was reconciled")
            held = world.provider_effects(run_id)
            assert world.problems(rt, run_id, run_id) == []
            confirmed = sorted(
                s.effect_id
                for s in steps.values()
                if s.effect_id is not None and s.status is ef.StepStatus.CONFIRMED
            )
            if run.status is ef.RunStatus.SUCCEEDED:
                assert [s.status for s in steps.values()] == [ef.StepStatus.CONFIRMED] * 4
                assert {k: len(v) for k, v in held.items()} == {"mail": 1, "crm": 1, "notify": 1}
                assert run.output is not None
                assert run.output["message"] == held["mail"][0]
                assert run.output["task"] == held["crm"][0]
            elif run.status is ef.RunStatus.FAILED:
                assert run.error is not None
                assert sorted(run.error["confirmed_effects"]) == confirmed
            else:
                assert run.status is ef.RunStatus.PAUSED
                attention = [
                    s.step_id for s in steps.values() if s.status is ef.StepStatus.NEEDS_ATTENTION
                ]
                assert run.error is not None
                assert attention == [run.error["step_id"]]
    for provider, recorded in keys.items():
        used = {call["key"] for call in world.provider_calls(provider)}
        assert used <= recorded, f"{provider} was called with a key no intent recorded"


@pytest.mark.slow
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(schedule=schedules)
# A lost response, then 503s: the first call committed, so the step must not end "not committed".
@example(
    Schedule(
        runs=2,
        faults=(
            ProviderFault("mail", "lose_response", after=0, times=1),
            ProviderFault("mail", "fail_before_commit", after=1, times=2),
            ProviderFault("crm", "lose_response", after=0, times=1),
            ProviderFault("crm", "fail_before_commit", after=1, times=2),
        ),
        kills=(),
    )
)
# The CRM step spends its budget on timeouts and pauses; a later worker's reconcile finishes it.
@example(
    Schedule(
        runs=2,
        faults=(ProviderFault("crm", "timeout_before_commit", after=0, times=3),),
        kills=(),
    )
)
# Every window of the notify step, in one worker after another.
@example(
    Schedule(
        runs=2,
        faults=(ProviderFault("notify", "lose_response", after=0, times=2),),
        kills=(
            Kill(FaultPoint.AFTER_CALL_BEFORE_RECORD, app.NOTIFY, 1),
            Kill(FaultPoint.AFTER_LOOKUP_BEFORE_RECORD, app.NOTIFY, 1),
            Kill(FaultPoint.AFTER_INTENT, app.NOTIFY, 1),
        ),
    )
)
def test_random_fault_schedules_keep_ledger_and_providers_agreeing(schedule: Schedule) -> None:
    """Under any schedule, no effect is duplicated, none is missing from the ledger, every run settles."""
    with tempfile.TemporaryDirectory() as directory:
        world = World(Path(directory))
        run_ids = _drive(world, schedule)
        _check(world, run_ids)
