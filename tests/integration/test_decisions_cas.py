"""People's decisions are compare-and-swap, on real threads against a real ledger
(docs/concepts.md#peoples-decisions-are-compare-and-swap).

Two (or three) ``Runtime`` instances on one ledger decide on the same effect, step or run at the
same moment (a ``Barrier`` releases them together): of contradicting decisions exactly one is
recorded, the others get ``StaleState`` and change nothing. Each backend keeps one ledger for the
whole module and every trial makes its own run, so many trials stay fast.
"""

from __future__ import annotations

import collections
import functools
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import effectflow as ef
import ledgers

TRIALS = 60
R = ef.RunStatus
S = ef.StepStatus

#: Calls each tool really made, by tool and argument.
CALLS: collections.Counter[tuple[str, str]] = collections.Counter()
#: Orders whose payment is lost after sending (the call raises: the effect is in doubt).
LOSE: set[str] = set()


@ef.tool("cas_pay", effect="external_write", effect_id="receipt_id")
def pay(order: str) -> dict[str, Any]:
    CALLS["pay", order] += 1
    if order in LOSE:
        LOSE.discard(order)
        raise ConnectionResetError("connection reset after the request was sent")
    return {"receipt_id": f"rcpt_{order}", "order": order}


@ef.tool("cas_note", effect="pure")
def note(receipt: str) -> str:
    return f"noted {receipt}"


@ef.tool("cas_refund", effect="financial_write")
def refund(order: str) -> dict[str, Any]:
    CALLS["refund", order] += 1
    return {"refund_id": f"rf_{order}"}


@ef.workflow("cas_order")
def order_flow(ctx: ef.Context, order: str) -> dict[str, Any]:
    paid = ctx.call("pay", pay, order=order)
    noted = ctx.call("note", note, receipt=paid["receipt_id"])
    return {"receipt": paid["receipt_id"], "note": noted}


@ef.workflow("cas_refund_flow")
def refund_flow(ctx: ef.Context, order: str) -> dict[str, Any]:
    paid = ctx.call("pay", pay, order=order)
    refunded = ctx.call("refund", refund, order=order)
    return {"receipt": paid["receipt_id"], "refund": refunded["refund_id"]}


# -- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=ledgers.BACKENDS)
def ledger(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """One ledger per backend for the whole module (``ledgers.fresh``)."""
    with ledgers.fresh(request.param, tmp_path_factory.mktemp("cas"), "ef_cas") as url:
        yield url


@pytest.fixture(scope="module")
def runtimes(ledger: str) -> Iterator[list[ef.Runtime]]:
    """Three runtimes (three "processes") on the one ledger, kept for every trial."""
    made = [ef.Runtime(ledger, tenant="acme") for _ in range(3)]
    yield made
    for runtime in made:
        runtime.close()


def race(*decisions: Callable[[], Any]) -> list[Any]:
    """Run the decisions on threads released together; each one's result or exception."""
    barrier = threading.Barrier(len(decisions))
    results: list[Any] = [None] * len(decisions)

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = decisions[i]()
        except Exception as exc:  # the outcome under test
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(decisions))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return results


def in_doubt(rt: ef.Runtime, run_id: str) -> ef.EffectRecord:
    """A run whose payment is in doubt (paused for a person); its effect."""
    LOSE.add(run_id)
    run = rt.start(order_flow, run_id=run_id, order=run_id)
    assert run.status is R.PAUSED, run.error
    [effect] = rt.effects(run_id=run_id, status="needs_attention")
    return effect


def kinds(rt: ef.Runtime, run_id: str, kind: str) -> int:
    return [e.kind for e in rt.audit(run_id)].count(kind)


def resolutions(rt: ef.Runtime, run_id: str) -> int:
    return [a.kind for a in rt.attempts(run_id, "pay")].count("resolution")


# -- resolve ------------------------------------------------------------------------------------


def test_two_opposite_resolutions_at_once_record_exactly_one(
    runtimes: list[ef.Runtime], ledger: str
) -> None:
    """Two runtimes resolve one unknown effect at once, with the same expected version and
    opposite verdicts: every time exactly one is recorded (one resolution event, one resolution
    attempt, the version moved once) and the other gets StaleState."""
    alice, bob, _ = runtimes
    won = collections.Counter[str]()
    tag = uuid.uuid4().hex[:6]
    for trial in range(TRIALS):
        effect = in_doubt(alice, f"res-{tag}-{trial}")
        v = effect.version
        first, second = race(
            functools.partial(
                alice.resolve,
                effect.effect_id,
                committed=True,
                evidence={"external_effect_id": f"rcpt_{trial}"},
                by="alice",
                expected_version=v,
            ),
            functools.partial(
                bob.resolve,
                effect.effect_id,
                committed=False,
                evidence={"checked": "provider dashboard"},
                by="bob",
                expected_version=v,
            ),
        )
        outcomes = [type(r).__name__ for r in (first, second)]
        assert sorted(outcomes) == ["EffectRecord", "StaleState"], (trial, first, second)
        winner = "alice" if isinstance(first, ef.EffectRecord) else "bob"
        won[winner] += 1
        after = alice.store.get_effect(effect.effect_id)
        assert after is not None
        assert after.version == v + 1
        assert after.resolved_by == winner
        assert after.status is (S.CONFIRMED if winner == "alice" else S.NOT_COMMITTED)
        assert kinds(alice, effect.run_id, "resolution") == 1
        assert resolutions(alice, effect.run_id) == 1
    assert sum(won.values()) == TRIALS
    print(f"\n{ledger.split(':')[0]}: {TRIALS} trials, accepted {dict(won)}, {TRIALS} refused")


def test_one_decision_id_twice_at_once_is_recorded_once(runtimes: list[ef.Runtime]) -> None:
    """The same decision (same id, same parameters) sent twice at once is recorded once; both
    callers get the effect as decided, never an IntegrityError."""
    alice, bob, _ = runtimes
    tag = uuid.uuid4().hex[:6]
    for trial in range(10):
        effect = in_doubt(alice, f"dec-{tag}-{trial}")
        decide = {
            "committed": True,
            "evidence": {"external_effect_id": "rcpt_x"},
            "by": "alice",
            "decision_id": f"dec-{tag}-{trial}",
        }
        first, second = race(
            functools.partial(alice.resolve, effect.effect_id, **decide),
            functools.partial(bob.resolve, effect.effect_id, **decide),
        )
        assert isinstance(first, ef.EffectRecord), first
        assert isinstance(second, ef.EffectRecord), second
        assert first.version == second.version == effect.version + 1
        assert kinds(alice, effect.run_id, "resolution") == 1
        with pytest.raises(ef.IdempotencyConflict):
            bob.resolve(effect.effect_id, **{**decide, "committed": False})


def test_the_loser_of_a_resolution_race_changes_nothing(runtimes: list[ef.Runtime]) -> None:
    """A resolution refused as stale writes no event, no attempt and no lease bump."""
    alice, bob, _ = runtimes
    effect = in_doubt(alice, f"stale-{uuid.uuid4().hex[:6]}")
    alice.resolve(effect.effect_id, committed=True, evidence={}, by="alice")
    before = (
        alice.run(effect.run_id),
        alice.audit(effect.run_id),
        alice.attempts(effect.run_id),
        alice.store.get_effect(effect.effect_id),
    )
    with pytest.raises(ef.StaleState):
        bob.resolve(
            effect.effect_id,
            committed=False,
            evidence={},
            by="bob",
            expected_version=effect.version,
        )
    after = (
        alice.run(effect.run_id),
        alice.audit(effect.run_id),
        alice.attempts(effect.run_id),
        alice.store.get_effect(effect.effect_id),
    )
    assert after == before


@pytest.mark.parametrize("committed", ["no", "false", 0, 1, None])
def test_a_resolution_whose_yes_or_no_is_not_a_boolean_changes_nothing(
    runtimes: list[ef.Runtime], committed: Any
) -> None:
    """``committed="no"`` is refused, not read as ``bool("no")`` (the effect "happened"): the
    effect stays in doubt and nothing is written."""
    alice = runtimes[0]
    effect = in_doubt(alice, f"flag-{uuid.uuid4().hex[:6]}")
    before = (alice.audit(effect.run_id), alice.store.get_effect(effect.effect_id))
    with pytest.raises(ef.ArgumentError, match="committed must be True or False"):
        alice.resolve(effect.effect_id, committed=committed, evidence={}, by="alice")
    assert (alice.audit(effect.run_id), alice.store.get_effect(effect.effect_id)) == before


# -- approve ------------------------------------------------------------------------------------


def waiting_refund(rt: ef.Runtime, run_id: str) -> ef.RunRecord:
    run = rt.start(refund_flow, run_id=run_id, order=run_id)
    assert run.status is R.PAUSED, run.error
    assert run.error is not None
    assert run.error["code"] == "approval_required"
    return run


@pytest.mark.parametrize("same_id", [False, True], ids=["other-ids", "same-id"])
def test_three_approvals_at_once_resume_the_run_once(
    runtimes: list[ef.Runtime], same_id: bool
) -> None:
    """Three runtimes approve one step at once: one approval is recorded and resumes the run, the
    provider is called once, and the others are refused cleanly (StaleState; with the same
    approval id and parameters, a no-op returning the run), never LeaseLost."""
    tag = uuid.uuid4().hex[:6]
    for trial in range(8):
        run_id = f"apr-{tag}-{trial}"
        waiting_refund(runtimes[0], run_id)
        results = race(
            *(
                functools.partial(
                    rt.approve,
                    run_id,
                    "refund",
                    approver="finance",
                    approval_id=f"APR-{run_id}" if same_id else f"APR-{run_id}-{i}",
                )
                for i, rt in enumerate(runtimes)
            )
        )
        errors = [r for r in results if isinstance(r, Exception)]
        runs = [r for r in results if isinstance(r, ef.RunRecord)]
        assert not [e for e in errors if not isinstance(e, ef.StaleState)], results
        if same_id:
            assert len(runs) == 3, results
        else:
            assert (len(runs), len(errors)) == (1, 2), results
        assert [r.status for r in runs].count(R.SUCCEEDED) >= 1, results
        assert runtimes[0].run(run_id).status is R.SUCCEEDED
        assert CALLS["refund", run_id] == 1
        assert len(runtimes[0].store.approvals(run_id)) == 1
        assert kinds(runtimes[0], run_id, "approved") == 1
        assert kinds(runtimes[0], run_id, "run_resumed") == 1
        assert runtimes[0].verify_audit(run_id) == []


# -- cancel and compensate ----------------------------------------------------------------------


def control_events(rt: ef.Runtime, run_id: str) -> list[str]:
    return [
        e.kind for e in rt.audit(run_id) if e.kind in ("cancel_requested", "compensate_requested")
    ]


def test_a_cancel_and_a_compensate_at_once_record_one_control(
    runtimes: list[ef.Runtime],
) -> None:
    """A cancel and a compensate of one paused run at once: the control on the run is decided
    compare-and-swap. One is recorded; the other is refused (StaleState), or, when it read the
    run only after the first had ended it, is decided on the state that one left; the run is never
    left half-way (no lease held, the recorded control the last one requested)."""
    alice, bob, _ = runtimes
    tag = uuid.uuid4().hex[:6]
    refused = 0
    for trial in range(15):
        run_id = f"ctl-{tag}-{trial}"
        waiting_refund(alice, run_id)
        cancelled, compensated = race(
            functools.partial(alice.cancel, run_id, reason="customer left", by="alice"),
            functools.partial(bob.compensate, run_id, reason="goal abandoned", by="bob"),
        )
        results = (cancelled, compensated)
        assert not [
            r for r in results if isinstance(r, Exception) and not isinstance(r, ef.StaleState)
        ], results
        events = control_events(alice, run_id)
        if any(isinstance(r, ef.StaleState) for r in results):
            refused += 1
            assert len(events) == 1, (events, results)
        else:
            # The second saw the run the first had ended: it was answered by it (a cancel of a
            # cancelled run) or decided on it (a compensate after the cancel).
            assert len(events) in (1, 2), (events, results)
        run = alice.run(run_id)
        assert run.lease_owner is None
        assert run.control is not None
        assert run.control["kind"] + "_requested" == events[-1]
        assert run.status in (R.CANCELLED_WITH_EFFECTS, R.PAUSED), run
        assert CALLS["refund", run_id] == 0
        assert alice.verify_audit(run_id) == []
    print(f"\ncancel vs compensate: {refused} of 15 refused one of the two")


@pytest.mark.parametrize("first", ["compensate", "cancel"])
def test_a_request_recorded_while_another_is_applied_is_applied_next(
    runtimes: list[ef.Runtime], monkeypatch: pytest.MonkeyPatch, first: str
) -> None:
    """The losing interleaving of the race above, made to happen every time: while alice's
    runtime applies a compensate (or a cancel), bob asks for the other. Bob sees the run held and
    leaves his request to alice's runtime rather than taking the run from under it (which made
    alice's next write LeaseLost); alice's end state, computed for the request it applied, is
    refused by bob's newer one, which is applied next: the run ends as the last request asks."""
    alice, bob, _ = runtimes
    run_id = f"mid-{first}-{uuid.uuid4().hex[:6]}"
    waiting_refund(alice, run_id)
    from effectflow.runtime import stopping

    applying = stopping.compensation.compensate
    answers: list[Any] = []

    def meanwhile(port: Any, state: Any, trigger: str) -> str | None:
        if not answers:  # once, in the middle of alice's request
            try:
                if first == "compensate":
                    answers.append(bob.cancel(run_id, reason="customer left", by="bob"))
                else:
                    answers.append(bob.compensate(run_id, reason="goal abandoned", by="bob"))
            except Exception as exc:  # the outcome under test
                answers.append(exc)
        return applying(port, state, trigger)

    monkeypatch.setattr(stopping.compensation, "compensate", meanwhile)
    if first == "compensate":
        ended: Any = alice.compensate(run_id, reason="goal abandoned", by="alice")
        last = "cancel"
    else:
        ended = alice.cancel(run_id, reason="customer left", by="alice")
        last = "compensate"
    # (The payment has no compensation: either request leaves it in the world.)
    status = R.CANCELLED_WITH_EFFECTS
    [answer] = answers
    assert not isinstance(answer, Exception), answer
    assert answer.status in (R.RUNNING, R.CANCELLING), answer  # left to alice's runtime
    assert ended.status is status, ended
    assert control_events(alice, run_id) == [f"{first}_requested", f"{last}_requested"]
    run = alice.run(run_id)
    assert (run.status, run.lease_owner) == (status, None), run
    assert run.control is not None
    assert run.control["kind"] == last
    [end] = [e for e in alice.audit(run_id) if e.kind == "run_" + status.value]
    assert end.detail["control"] == last, end  # the end state is the last request's
    assert CALLS["refund", run_id] == 0
    assert alice.verify_audit(run_id) == []


def test_two_cancels_at_once_record_one(runtimes: list[ef.Runtime]) -> None:
    """Two cancels of one run at once record one cancel; both callers get the run's inventory."""
    alice, bob, _ = runtimes
    tag = uuid.uuid4().hex[:6]
    for trial in range(15):
        run_id = f"cc-{tag}-{trial}"
        waiting_refund(alice, run_id)
        results = race(
            functools.partial(alice.cancel, run_id, by="alice"),
            functools.partial(bob.cancel, run_id, by="bob"),
        )
        assert all(isinstance(r, ef.Inventory) for r in results), results
        assert control_events(alice, run_id) == ["cancel_requested"]
        run = alice.run(run_id)
        assert run.status is R.CANCELLED_WITH_EFFECTS
        assert run.lease_owner is None
        assert [r.status for r in results].count(R.CANCELLED_WITH_EFFECTS) >= 1


# -- the result a resolution records, with or without the application -------------------------

EFFECTFLOW = shutil.which("effectflow", path=str(Path(sys.executable).parent)) or "effectflow"


def test_resolve_records_the_same_result_with_or_without_the_app(
    runtimes: list[ef.Runtime], ledger: str, tmp_path: Path
) -> None:
    """``effectflow resolve`` without ``--app`` (no registry knows the tool) records the same step
    output as ``rt.resolve`` with it: the evidence with the contract's effect-id field set from
    ``external_effect_id``; the next step then reads that field and the run succeeds."""
    rt = runtimes[0]
    tag = uuid.uuid4().hex[:6]
    with_app = in_doubt(rt, f"app-{tag}")
    without_app = in_doubt(rt, f"noapp-{tag}")
    evidence = {"external_effect_id": "rcpt_42", "seen_in": "provider dashboard"}

    rt.resolve(with_app.effect_id, committed=True, evidence=evidence, by="alice")
    done = subprocess.run(
        [EFFECTFLOW, "resolve", without_app.effect_id, "--committed", "--by", "alice",
         "--evidence", '{"external_effect_id": "rcpt_42", "seen_in": "provider dashboard"}',
         "--db", ledger, "--tenant", "acme", "--json"],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr

    outputs = [
        next(s for s in rt.steps(e.run_id) if s.step_id == "pay").output
        for e in (with_app, without_app)
    ]
    assert outputs[0] == outputs[1] == {**evidence, "receipt_id": "rcpt_42"}
    for effect in (with_app, without_app):
        finished = rt.resume(effect.run_id)
        assert finished.status is R.SUCCEEDED, finished.error
        assert finished.output == {"receipt": "rcpt_42", "note": "noted rcpt_42"}
        assert CALLS["pay", effect.run_id] == 1


def test_a_given_result_is_the_steps_output(runtimes: list[ef.Runtime]) -> None:
    """``evidence["result"]`` is recorded as the step's output as given (what the tool would have
    returned); the rest of the evidence stays evidence."""
    rt = runtimes[0]
    effect = in_doubt(rt, f"result-{uuid.uuid4().hex[:6]}")
    result = {"receipt_id": "rcpt_7", "order": "o-7"}
    evidence = {"external_effect_id": "rcpt_7", "result": result, "ticket": "OPS-7"}
    resolved = rt.resolve(effect.effect_id, committed=True, evidence=evidence, by="alice")
    assert resolved.external_effect_id == "rcpt_7"
    assert resolved.evidence == evidence
    assert next(s for s in rt.steps(effect.run_id) if s.step_id == "pay").output == result
    assert rt.resume(effect.run_id).output == {"receipt": "rcpt_7", "note": "noted rcpt_7"}


# -- a workflow's AbandonGoal against an operator's request ----------------------------------------

ABANDON_URL: list[str] = []


@ef.tool("cas_abandon_probe", effect="pure")
def _probe(n: int) -> int:
    """While the run is executing here, an operator cancels it from another runtime."""
    with ef.Runtime(ABANDON_URL[0]) as operator:
        operator.cancel("abandon-race", reason="customer called", by="ops")
    return n


@ef.workflow("cas_abandon_flow")
def _abandoning(ctx: ef.Context) -> None:
    ctx.call("probe", _probe, n=1)
    raise ef.AbandonGoal("the workflow gave up")


def test_an_operators_cancel_is_not_written_over_by_the_workflows_abandon_goal(
    any_ledger: str,
) -> None:
    """The operator's cancel lands while the run executes; the workflow then abandons its goal:
    the run ends by the operator's request (one control), never by overwriting it."""
    ABANDON_URL[:] = [any_ledger]
    with ef.Runtime(any_ledger) as rt:
        rt.start(_abandoning, run_id="abandon-race")
        run = rt.run("abandon-race")
        assert run.control is not None
        assert run.control["kind"] == "cancel"
        assert run.control["by"] == "ops"
        kinds = [e.kind for e in rt.audit("abandon-race")]
        assert "cancel_requested" in kinds
        assert "goal_abandoned" not in kinds
