"""The guard inside a Temporal activity, run under ``temporalio.testing.ActivityEnvironment`` (the
real temporalio package; no Temporal server: see docs/integrations/temporal.md). The provider's own
file is the proof.

Each test sets the activity's ``Info`` as Temporal's worker would for an attempt: the workflow id
and run id, the activity id every attempt of one scheduled activity shares, the attempt number.
The SIGKILL between two attempts, in real processes, is in ``test_temporal_crash.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.failure.v1 import Failure
from temporalio.converter import DataConverter
from temporalio.exceptions import ActivityError, ApplicationError, RetryState
from temporalio.testing import ActivityEnvironment

import effectflow as ef
from contrib import host_world
from effectflow.contrib import temporal as ef_temporal

PROVIDER = host_world.Provider()
records = PROVIDER.records
_commit = PROVIDER.commit
TOOLS = host_world.declare("tmp", PROVIDER, refund_kind="refund", mark_replays=False)
find, send, send_lost, send_untagged, refund = (
    TOOLS.find,
    TOOLS.send,
    TOOLS.send_lost,
    TOOLS.send_untagged,
    TOOLS.refund,
)


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[ef.Runtime]:
    """A ledger and the provider's file."""
    PROVIDER.file = tmp_path / "provider.jsonl"
    with ef.Runtime(f"sqlite:///{tmp_path / 'ledger.db'}") as runtime:
        yield runtime


Beats = list[tuple[Any, ...]]


def _attempt(
    fn: Callable[..., Any],
    *args: Any,
    activity_id: str = "1",
    attempt: int = 1,
    workflow_id: str | None = "wf-1",
    run_id: str = "run-1",
    beats: Beats | None = None,
) -> Any:
    """One attempt of an activity as Temporal's worker would start it."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        ActivityEnvironment.default_info(),
        activity_id=activity_id,
        activity_type=activity._Definition.must_from_callable(fn).name,
        attempt=attempt,
        workflow_id=workflow_id,
        workflow_run_id=run_id if workflow_id is not None else None,
        workflow_type="support" if workflow_id is not None else None,
    )
    if beats is not None:
        env.on_heartbeat = lambda *details: beats.append(details)

    async def run() -> Any:
        return await env.run(fn, *args)

    return asyncio.run(run())


def _needs_person(fn: Callable[..., Any], *args: Any, **info: Any) -> ApplicationError:
    with pytest.raises(ApplicationError) as caught:
        _attempt(fn, *args, **info)
    assert caught.value.type == ef_temporal.NEEDS_PERSON
    assert caught.value.non_retryable
    return caught.value


def test_the_activity_keeps_the_tools_name_and_parameters(rt: ef.Runtime) -> None:
    """Temporal sees the tool's name and its parameters without the injected key."""
    act = ef_temporal.guarded(rt, send)
    defn = activity._Definition.must_from_callable(act)
    assert defn.name == "tmp_send"
    assert defn.arg_types == [str, str]
    assert list(inspect.signature(act).parameters) == ["to", "text"]


def test_a_confirmed_call_is_replayed_for_the_same_activity_id(rt: ef.Runtime) -> None:
    """A second attempt of the same activity id (Temporal's retry after it lost the completion)
    gets the recorded result; the provider is written once."""
    act = ef_temporal.guarded(rt, send)
    first = _attempt(act, "ann", "hi")
    again = _attempt(act, "ann", "hi", attempt=2)
    assert again == first
    assert records() == [first]
    [run] = rt.runs(scope="temporal:wf-1:run-1")
    assert run.input["call_id"] == "1"


def test_a_lost_response_is_settled_by_the_lookup(rt: ef.Runtime) -> None:
    """The provider committed and its answer was lost: the attempt returns the provider's record
    found by the contract's lookup, and a retry of the same activity id writes nothing more."""
    act = ef_temporal.guarded(rt, send_lost)
    result = _attempt(act, "bob", "hello")
    assert records() == [result]
    assert _attempt(act, "bob", "hello", attempt=2) == result
    assert records() == [result]
    [effect] = rt.effects()
    assert effect.status is ef.StepStatus.CONFIRMED


def test_a_regenerated_activity_id_is_deduplicated(rt: ef.Runtime) -> None:
    """The workflow schedules the same call again under a new activity id (it gave up on the
    first after its timeouts): the same tool and arguments in the same workflow run are the first
    call's operation, answered with its result."""
    act = ef_temporal.guarded(rt, send)
    first = _attempt(act, "cy", "once", activity_id="1")
    again = _attempt(act, "cy", "once", activity_id="7")
    assert again == first
    assert records() == [first]
    assert {r.input["call_id"] for r in rt.runs(scope="temporal:wf-1:run-1")} == {"1", "7"}


def test_a_new_workflow_run_is_a_scope_of_its_own(rt: ef.Runtime) -> None:
    """Activity ids restart in each workflow run (a reset, a continue-as-new): activity ``1`` of
    another run is another call."""
    act = ef_temporal.guarded(rt, send)
    first = _attempt(act, "dee", "x", run_id="run-1")
    second = _attempt(act, "dee", "x", run_id="run-2")
    assert records() == [first, second]


def test_an_approval_ends_the_attempt_and_the_retried_attempt_completes(rt: ef.Runtime) -> None:
    """A financial write ends its attempt with a non-retryable ``NEEDS_PERSON`` error naming the
    ledger run; once a person approves, the next attempt of the same activity id completes with
    the one refund."""
    act = ef_temporal.guarded(rt, refund)
    error = _needs_person(act, "A-1", 30)
    asked = ef_temporal.asked_of(error)
    assert asked is not None
    assert asked["kind"] == "approval"
    assert records() == [], "nothing is refunded before the approval"
    rt.approve(asked["run_id"], asked["step_id"], approver="alice", approval_id="CR-1")
    result = _attempt(act, "A-1", 30, attempt=2)
    assert records() == [result]
    assert result["order"] == "A-1"
    [effect] = rt.effects()
    assert effect.approval_id == "CR-1"


def test_the_decision_activity_applies_the_decision_and_completes_the_call(
    rt: ef.Runtime,
) -> None:
    """What a workflow runs after the signal with the person's decision: the approval is recorded
    and the call's own result comes back, once."""
    act = ef_temporal.guarded(rt, refund)
    decide = ef_temporal.decision_activity(rt)
    asked = ef_temporal.asked_of(_needs_person(act, "B-2", 5, activity_id="3"))
    assert asked is not None
    result = _attempt(decide, asked, {"approved": True, "approver": "bob"}, activity_id="4")
    assert records() == [result]
    assert _attempt(act, "B-2", 5, activity_id="3", attempt=2) == result
    assert len(records()) == 1


def test_a_declined_decision_is_a_non_retryable_step_rejected(rt: ef.Runtime) -> None:
    """A person declines: nothing is refunded, and the decision activity fails for good."""
    act = ef_temporal.guarded(rt, refund)
    decide = ef_temporal.decision_activity(rt)
    asked = ef_temporal.asked_of(_needs_person(act, "C-3", 9))
    with pytest.raises(ApplicationError) as caught:
        _attempt(
            decide, asked, {"approved": False, "approver": "bob", "reason": "no"}, activity_id="2"
        )
    assert caught.value.type == "EffectflowStepRejected"
    assert caught.value.non_retryable
    assert records() == []


def test_a_decision_without_who_made_it_is_refused(rt: ef.Runtime) -> None:
    """A decision that does not say who decided changes nothing and fails for good."""
    act = ef_temporal.guarded(rt, refund)
    decide = ef_temporal.decision_activity(rt)
    asked = ef_temporal.asked_of(_needs_person(act, "D-4", 1))
    with pytest.raises(ApplicationError, match="who made it") as caught:
        _attempt(decide, asked, {"approved": True}, activity_id="2")
    assert caught.value.type == "EffectflowArgumentError"
    assert records() == []
    assert ef_temporal.asked_of(_needs_person(act, "D-4", 1, attempt=2)) is not None


def test_heartbeats_and_errors_carry_no_argument_values_or_keys(rt: ef.Runtime) -> None:
    """What Temporal stores in the workflow's history from these activities — heartbeat details
    and the ``NEEDS_PERSON`` error's details — holds ids and state names, never an argument value
    or the idempotency key."""
    beats: Beats = []
    secret_to, secret_text = "ann.secret@example.com", "the confidential body"
    _attempt(ef_temporal.guarded(rt, send), secret_to, secret_text, beats=beats)
    refund_act = ef_temporal.guarded(rt, refund)
    error = _needs_person(refund_act, "ORDER-SECRET-9", 4242, activity_id="2", beats=beats)
    keys = [e.idempotency_key for e in rt.effects()] + [r["key"] for r in records()]
    stored = json.dumps([list(b) for b in beats]) + json.dumps(list(error.details))
    assert beats, "the activities heartbeat"
    assert [b[0]["state"] for b in beats] == ["call", "done", "call", "needs_person"]
    for value in (secret_to, secret_text, "ORDER-SECRET-9", "4242", *keys):
        assert value not in stored
    assert all(set(b[0]) == {"effectflow_run", "state"} for b in beats)


def test_an_activity_not_scheduled_by_a_workflow_is_refused(rt: ef.Runtime) -> None:
    """A standalone activity has no workflow identity to scope the call: it fails for good, and
    nothing is written or recorded."""
    with pytest.raises(ApplicationError, match="not scheduled by a workflow") as caught:
        _attempt(ef_temporal.guarded(rt, send), "x", "y", workflow_id=None)
    assert caught.value.non_retryable
    assert records() == []
    assert rt.runs() == []


def test_the_decorator_form_over_an_ef_tool(rt: ef.Runtime) -> None:
    """``@guarded(rt)`` over an ``ef.tool`` is the same activity."""

    @ef_temporal.guarded(rt, name="tmp_send_decorated")
    @ef.tool(
        "tmp_send_deco", effect="external_write", confirm=find, effect_id="id", settles_within=0
    )
    def send_decorated(to: str, text: str, *, idempotency_key: str) -> dict[str, Any]:
        """Send a message."""
        return _commit("msg", idempotency_key, to=to, text=text)

    result = _attempt(send_decorated, "eve", "hey")
    assert _attempt(send_decorated, "eve", "hey", attempt=2) == result
    assert records() == [result]
    assert activity._Definition.must_from_callable(send_decorated).name == "tmp_send_decorated"


def test_the_workflow_finds_the_question_after_temporals_failure_conversion(
    rt: ef.Runtime,
) -> None:
    """The ``NEEDS_PERSON`` error goes to the workflow as Temporal's failure proto inside an
    ``ActivityError`` (its details as payloads); decoded by Temporal's default data converter, as
    the workflow's side does, ``asked_of`` gets the same question back, and the decision activity
    completes the call with it."""
    act = ef_temporal.guarded(rt, refund)
    error = _needs_person(act, "E-5", 12, activity_id="9")
    wrapped = ActivityError(
        "activity task failed",
        scheduled_event_id=5,
        started_event_id=6,
        identity="worker-1",
        activity_type="tmp_refund",
        activity_id="9",
        retry_state=RetryState.NON_RETRYABLE_FAILURE,
    )
    wrapped.__cause__ = error
    converter = DataConverter.default

    async def round_trip() -> BaseException:
        failure = Failure()
        await converter.encode_failure(wrapped, failure)
        return await converter.decode_failure(failure)

    seen = asyncio.run(round_trip())
    assert isinstance(seen, ActivityError)
    asked = ef_temporal.asked_of(seen)
    assert asked == ef_temporal.asked_of(error)
    assert asked is not None
    decide = ef_temporal.decision_activity(rt)
    result = _attempt(decide, asked, {"approved": True, "approver": "ann"}, activity_id="10")
    assert records() == [result]


def test_without_the_temporalio_package_the_import_names_the_extra() -> None:
    """Without temporalio installed, importing the integration fails saying which extra to
    install."""
    code = "import sys; sys.modules['temporalio'] = None; import effectflow.contrib.temporal"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode != 0
    assert "pip install 'effectflow[temporal]'" in done.stderr


def test_a_scope_of_the_workflow_id_alone_spans_its_runs(rt: ef.Runtime) -> None:
    """With ``scope=`` naming the workflow id only, a reset's new run asking for the same call is
    answered from the first run's record instead of writing again."""
    act = ef_temporal.guarded(rt, send, scope=lambda info: f"temporal:{info.workflow_id}")
    first = _attempt(act, "gil", "reset", run_id="run-1")
    again = _attempt(act, "gil", "reset", run_id="run-2")
    assert again == first
    assert records() == [first]


@ef.tool(
    "tmp_refund_card",
    effect="financial_write",
    idempotency=ef.Idempotency(supported=True),
    effect_id="id",
    redact=ef.Redact(drop=["card"]),
)
def refund_card(order: str, card: str, *, idempotency_key: str) -> dict[str, Any]:
    """A refund to a card: the card number is the provider's to see, never the ledger's (the
    result, which the ledger records, leaves it out)."""
    done = next((r for r in records() if r["key"] == idempotency_key), None)
    done = done or _commit("refund", idempotency_key, order=order, card=card)
    return {k: v for k, v in done.items() if k != "card"}


def test_a_decision_about_a_call_whose_tool_redacts_completes_it_with_the_workflow_s_arguments(
    rt: ef.Runtime, tmp_path: Path
) -> None:
    """The ledger holds the refund's arguments without the card, so the decision activity (run by
    any worker) cannot complete the call from the record: the workflow passes the guarded
    activity's own arguments, and the provider gets the card once; the ledger never holds it."""
    act = ef_temporal.guarded(rt, refund_card)
    decide = ef_temporal.decision_activity(rt)
    asked = ef_temporal.asked_of(_needs_person(act, "E-5", "4111-SECRET", activity_id="3"))
    assert asked is not None
    result = _attempt(
        decide,
        asked,
        {"approved": True, "approver": "bob"},
        ["E-5", "4111-SECRET"],
        activity_id="4",
    )
    [refunded] = records()
    assert (refunded["id"], refunded["card"]) == (result["id"], "4111-SECRET")
    assert _attempt(act, "E-5", "4111-SECRET", activity_id="3", attempt=2) == result
    assert len(records()) == 1
    rt.close()
    for name in ("ledger.db", "ledger.db-wal"):
        path = tmp_path / name
        assert not path.exists() or b"4111-SECRET" not in path.read_bytes()


def test_a_decision_without_the_arguments_of_a_redacting_tool_sends_nothing(
    rt: ef.Runtime,
) -> None:
    """Without the workflow's arguments the decision activity has only the redacted record: the
    approval is recorded, nothing is sent, and the activity says what to pass."""
    act = ef_temporal.guarded(rt, refund_card)
    decide = ef_temporal.decision_activity(rt)
    asked = ef_temporal.asked_of(_needs_person(act, "F-6", "4111-SECRET", activity_id="3"))
    with pytest.raises(ApplicationError, match="third argument") as caught:
        _attempt(decide, asked, {"approved": True, "approver": "bob"}, activity_id="4")
    assert caught.value.type == "EffectflowArgumentError"
    assert caught.value.non_retryable
    assert records() == []
    # The approval stands: the decision activity run again with the arguments makes the call.
    result = _attempt(decide, asked, {}, ["F-6", "4111-SECRET"], activity_id="5")
    [refunded] = records()
    assert refunded["id"] == result["id"]
