"""A real worker process is SIGKILLed at each window of the write path, for each kind of tool; a fresh
process recovers; the providers' own files are the truth the ledger must agree with
(docs/concepts.md#the-write-path, docs/decision-table.md).
"""

from __future__ import annotations

import dataclasses

import pytest

import effectflow as ef
from effectflow.runtime.faults import FaultPoint

from . import app
from .app import Kind
from .conftest import World, assert_clean, assert_killed

#: The journal name of each kind's tool, and the provider holding its effects.
TOOL_OF_KIND = {
    Kind.PURE: ("compose", None),
    Kind.READ: ("read_tasks", None),
    Kind.IDEMPOTENT: ("send_email", "mail"),
    Kind.LOOKUP: ("notify_tagged", "notify"),
    Kind.NO_LOOKUP: ("notify_untagged", "notify"),
}
LOOKUP_OF_KIND = {Kind.IDEMPOTENT: "mail_status", Kind.LOOKUP: "notify_search"}
OPERATION = {"mail": "send", "notify": "post"}

S = ef.StepStatus


@dataclasses.dataclass(frozen=True)
class Window:
    """One crash case and everything the test expects of it."""

    #: The kind of tool under test.
    kind: Kind
    #: Where the first worker dies.
    point: FaultPoint
    #: The under-test step's status in the ledger right after the crash (None: no record).
    after_crash: ef.StepStatus | None
    #: Provider call outcomes in order, over both processes (None for pure/read).
    calls: tuple[str, ...] | None = None
    #: ``lose_response`` faults put on the provider first, so the worker reaches a lookup.
    lost_responses: int = 0
    #: How often the under-test tool ran (both processes).
    tool_runs: int = 1
    #: How often the lookup tool ran (both processes).
    #: Lookups made, or the counts allowed (a recovery's timing decides between them).
    lookups: int | tuple[int, ...] = 0
    #: How often the first pure step ran: twice when its result was not durable yet at the crash.
    prepare_runs: int = 1
    #: Where the run ends.
    run_status: ef.RunStatus = ef.RunStatus.SUCCEEDED
    #: Where the under-test step ends.
    step_status: ef.StepStatus = S.CONFIRMED

    @property
    def paused(self) -> bool:
        """The run stops for a person."""
        return self.run_status is ef.RunStatus.PAUSED


WINDOWS = [
    # Pure and read steps: the result was computed but not durable, so the step simply runs again.
    Window(Kind.PURE, FaultPoint.AFTER_PURE_RESULT, None, tool_runs=2, prepare_runs=2),
    Window(Kind.READ, FaultPoint.AFTER_PURE_RESULT, None, tool_runs=2, prepare_runs=2),
    # Idempotent write (mail with a key): every retry carries the original key; the provider replays.
    Window(Kind.IDEMPOTENT, FaultPoint.BEFORE_INTENT, None, ("ok",), prepare_runs=2),
    Window(Kind.IDEMPOTENT, FaultPoint.AFTER_INTENT, S.INTENT_RECORDED, ("ok",)),
    Window(
        Kind.IDEMPOTENT,
        FaultPoint.AFTER_CALL_BEFORE_RECORD,
        S.INTENT_RECORDED,
        ("ok", "replayed"),
        tool_runs=2,
    ),
    Window(Kind.IDEMPOTENT, FaultPoint.AFTER_RECORD, S.CONFIRMED, ("ok",)),
    Window(
        Kind.IDEMPOTENT,
        FaultPoint.AFTER_LOOKUP_BEFORE_RECORD,
        S.UNKNOWN,
        ("ok", "replayed", "replayed"),
        lost_responses=3,
        tool_runs=3,
        lookups=2,
    ),
    # Not idempotent, but searchable by our key: look it up, then confirm or retry with the key.
    Window(Kind.LOOKUP, FaultPoint.BEFORE_INTENT, None, ("ok",), prepare_runs=2),
    # Nothing was sent, but the recovering process cannot know that: a search that finds nothing
    # within the tool's settles_within is no proof, so it searches again once the bound passed
    # (once only, when the recovery starts after the bound).
    Window(Kind.LOOKUP, FaultPoint.AFTER_INTENT, S.INTENT_RECORDED, ("ok",), lookups=(1, 2)),
    Window(Kind.LOOKUP, FaultPoint.AFTER_CALL_BEFORE_RECORD, S.INTENT_RECORDED, ("ok",), lookups=1),
    Window(Kind.LOOKUP, FaultPoint.AFTER_RECORD, S.CONFIRMED, ("ok",)),
    Window(
        Kind.LOOKUP,
        FaultPoint.AFTER_LOOKUP_BEFORE_RECORD,
        S.UNKNOWN,
        ("ok",),
        lost_responses=1,
        lookups=2,
    ),
    # Neither: once the intent is durable the runtime cannot know, so it asks a person (never resends).
    Window(Kind.NO_LOOKUP, FaultPoint.BEFORE_INTENT, None, ("ok",), prepare_runs=2),
    Window(
        Kind.NO_LOOKUP,
        FaultPoint.AFTER_INTENT,
        S.INTENT_RECORDED,
        (),
        tool_runs=0,
        run_status=ef.RunStatus.PAUSED,
        step_status=S.NEEDS_ATTENTION,
    ),
    Window(
        Kind.NO_LOOKUP,
        FaultPoint.AFTER_CALL_BEFORE_RECORD,
        S.INTENT_RECORDED,
        ("ok",),
        run_status=ef.RunStatus.PAUSED,
        step_status=S.NEEDS_ATTENTION,
    ),
    Window(Kind.NO_LOOKUP, FaultPoint.AFTER_RECORD, S.CONFIRMED, ("ok",)),
]


def _applies(kind: Kind, point: FaultPoint) -> bool:
    """Whether a worker running this kind of step passes through this fault point."""
    if point is FaultPoint.IN_LOCAL_TRANSACTION:  # local transactions: test_local_transaction_crash
        return False
    if kind in (Kind.PURE, Kind.READ):
        return point is FaultPoint.AFTER_PURE_RESULT
    if point is FaultPoint.AFTER_PURE_RESULT:
        return False
    return kind is not Kind.NO_LOOKUP or point is not FaultPoint.AFTER_LOOKUP_BEFORE_RECORD


def test_every_applicable_window_has_a_case() -> None:
    """Each fault point × tool kind the write path can pass through is crashed by exactly one case."""
    wanted = sorted((k, p) for k in Kind for p in FaultPoint if _applies(k, p))
    assert sorted((w.kind, w.point) for w in WINDOWS) == wanted
    assert {w.point for w in WINDOWS} == set(FaultPoint) - {FaultPoint.IN_LOCAL_TRANSACTION}


@pytest.mark.parametrize("case", WINDOWS, ids=lambda w: f"{w.kind}-{w.point}")
def test_crash_in_window_then_recover(world: World, case: Window) -> None:
    """After a SIGKILL in the window, recovery leaves no duplicate, no unrecorded and no resent effect."""
    run_id = f"window-{case.kind}"
    tool, provider = TOOL_OF_KIND[case.kind]
    if case.lost_responses:
        assert provider is not None
        world.inject(
            provider, OPERATION[provider], "lose_response", times=case.lost_responses, after=0
        )
    start = ((app.WINDOW_WORKFLOW, run_id, {"case_id": run_id, "kind": case.kind.value}),)

    assert_killed(world.child(start=start, kill=f"{case.point}:{app.UNDER_TEST}"))
    with world.ledger() as rt:
        assert rt.run(run_id).status is ef.RunStatus.RUNNING
        crashed = {s.step_id: s.status for s in rt.steps(run_id)}
        assert crashed.get(app.UNDER_TEST) is case.after_crash
        assert app.FINISH not in crashed
    sent_before_recovery = len(world.provider_calls(provider)) if provider else 0

    statuses = assert_clean(world.child(recover=True, reconcile=True))
    assert statuses == {run_id: case.run_status.value}

    with world.ledger() as rt:
        run = rt.run(run_id)
        steps = {s.step_id: s for s in rt.steps(run_id)}
        step = steps[app.UNDER_TEST]
        assert run.status is case.run_status
        assert step.status is case.step_status
        assert world.problems(rt, run_id, run_id) == []
        assert rt.verify_audit() == []
        if case.paused:
            assert run.error is not None
            assert run.error["step_id"] == app.UNDER_TEST
            assert step.next_action is ef.NextAction.ASK_A_PERSON
            assert app.FINISH not in steps
        else:
            assert run.output is not None
            assert run.output["result"] == step.output
            assert steps[app.FINISH].status is S.CONFIRMED

    ran = world.journal()
    assert ran[tool] == case.tool_runs
    assert ran["draft"] == case.prepare_runs
    assert ran["summarize"] == (0 if case.paused else 1)
    allowed = case.lookups if isinstance(case.lookups, tuple) else (case.lookups,)
    assert ran[LOOKUP_OF_KIND.get(case.kind, "no lookup")] in allowed
    if provider is None:
        return
    calls = world.provider_calls(provider)
    assert tuple(c["outcome"] for c in calls) == case.calls
    effects = world.provider_effects(run_id)[provider]
    assert len(effects) == sum(1 for c in calls if c["outcome"] == "ok") <= 1
    if case.kind is not Kind.NO_LOOKUP:
        assert {c["key"] for c in calls} <= {step.idempotency_key}, "a retry used another key"
    if case.paused:
        # The call may have been sent before the crash: recovery must not have sent it again.
        assert len(calls) == sent_before_recovery, "a non-idempotent call without lookup was resent"
        assert step.external_effect_id is None
    else:
        assert effects == [step.external_effect_id]
