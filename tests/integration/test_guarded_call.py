"""The guarded call (``rt.guard``): one contracted call through the whole write path when the host
owns the control flow. Checked against the provider's own records, on both backends."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import guard_app as app
import pytest

import effectflow as ef
from effectflow.ledger.records import StepStatus

CHILD = Path(app.__file__)
SEND = {"to": "a@example.com", "text": "hi"}


@pytest.fixture(autouse=True)
def provider(tmp_path: Path) -> Path:
    path = tmp_path / "provider.jsonl"
    app.PROVIDER["file"] = str(path)
    return path


def _host(ledger: str, provider: Path, *args: str, slow: float = 0) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), ledger, str(provider), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "GD_SLOW": str(slow)},
    )


def test_a_replay_returns_the_recorded_result_and_calls_nothing(any_ledger: str) -> None:
    with ef.Runtime(any_ledger) as rt:
        first = rt.guard(app.send, SEND, scope="thread-1", call_id="call_a")
        again = rt.guard("gd_send", SEND, scope="thread-1", call_id="call_a")
        assert first == again
        assert first.value == app.records()[0]
        assert not first.deduplicated
        [run] = rt.runs()
        assert run.workflow == "effectflow.guarded_call"
        assert run.input["scope"] == "thread-1"
        assert run.input["call_id"] == "call_a"
        [step] = rt.steps(run.run_id)
        assert step.effect_id == first.effect_id
    assert len(app.records()) == 1


def test_the_async_form_is_the_same_call(any_ledger: str) -> None:
    async def main(rt: ef.Runtime) -> tuple[ef.Guarded, ef.Guarded]:
        first = await rt.guard_async(app.send, SEND, scope="t", call_id="c")
        return first, await rt.guard_async(app.send, SEND, scope="t", call_id="c")

    with ef.Runtime(any_ledger) as rt:
        first, again = asyncio.run(main(rt))
    assert first == again
    assert len(app.records()) == 1


def test_a_regenerated_call_id_is_the_same_operation_unless_the_contract_says_otherwise(
    any_ledger: str,
) -> None:
    """The host lost the model's turn and asked again: a new call id, the same tool and
    arguments in the same scope. Not done again (the answer says so); another scope, or a tool
    with ``each_call_new``, is a new request."""
    with ef.Runtime(any_ledger) as rt:
        first = rt.guard(app.send, SEND, scope="t", call_id="call_1")
        again = rt.guard(app.send, SEND, scope="t", call_id="call_2")
        assert again.value == first.value
        assert again.deduplicated
        assert again.run_id != first.run_id
        other = rt.guard(app.send, SEND, scope="another-thread", call_id="call_2")
        assert other.value != first.value
        rt.guard(app.search_web, {"query": "x"}, scope="t", call_id="q1")
        rt.guard(app.search_web, {"query": "x"}, scope="t", call_id="q2")
    assert [r["id"] for r in app.records()] == ["msg_1", "msg_2", "q_3", "q_4"]


@pytest.mark.parametrize(
    ("tool", "arguments", "says"),
    [
        ("gd_nope", SEND, "unknown tool 'gd_nope'"),
        ("gd_send", {"to": "a"}, "missing a required argument: 'text'"),
        ("gd_send", {**SEND, "cc": "b"}, "unexpected keyword argument 'cc'"),
        ("gd_send", {"to": "a", "text": float("nan")}, "has no JSON form"),
        ("gd_send", ["a", "hi"], "arguments must be a mapping"),
    ],
)
def test_bad_input_is_a_clear_error_and_records_nothing(
    any_ledger: str, tool: str, arguments: object, says: str
) -> None:
    with ef.Runtime(any_ledger) as rt:
        with pytest.raises((ef.ArgumentError, ef.ContractError), match=says):
            rt.guard(tool, arguments, scope="t", call_id="c")  # type: ignore[arg-type]
        for scope, call_id in (("", "c"), ("t", None)):
            with pytest.raises(ef.ArgumentError, match="non-empty string"):
                rt.guard(app.send, SEND, scope=scope, call_id=call_id)  # type: ignore[arg-type]
        assert rt.runs() == []
    assert app.records() == []


def test_a_call_that_may_have_happened_needs_a_person_whose_answer_the_replay_returns(
    any_ledger: str,
) -> None:
    with ef.Runtime(any_ledger) as rt:
        with pytest.raises(ef.NeedsPerson) as asked:
            rt.guard(app.untagged, {"to": "b"}, scope="t", call_id="c")
        signal_ = asked.value
        assert signal_.kind == "in_doubt"
        assert signal_.next_action == "resolve"
        assert "may or may not have happened" in signal_.for_model
        assert signal_.effect_id is not None
        # A replay before anyone decided asks again; it calls nothing.
        with pytest.raises(ef.NeedsPerson):
            rt.guard(app.untagged, {"to": "b"}, scope="t", call_id="c")
        [held] = app.records()
        rt.resolve(signal_.effect_id, committed=True, evidence={"result": held}, by="ops")
        done = rt.guard(app.untagged, {"to": "b"}, scope="t", call_id="c")
        assert done.value == held
    assert len(app.records()) == 1


def test_an_approval_comes_back_as_needs_person_and_the_approved_call_runs_once(
    any_ledger: str,
) -> None:
    arguments = {"order": "o1", "amount": 300}
    with ef.Runtime(any_ledger) as rt:
        with pytest.raises(ef.NeedsPerson) as asked:
            rt.guard(app.refund, arguments, scope="t", call_id="c")
        assert asked.value.kind == "approval"
        assert asked.value.next_action == "approve"
        assert app.records() == []
        rt.approve(asked.value.run_id or "", "call", approver="alice", approval_id="ap-1")
        done = rt.guard(app.refund, arguments, scope="t", call_id="c")
        assert done.value["order"] == "o1"
    assert len(app.records()) == 1


def test_a_host_killed_between_call_and_outcome_is_settled_by_lookup_on_replay(
    any_ledger: str, provider: Path
) -> None:
    host = _host(any_ledger, provider, "gd_send", "t", "c", "--kill")
    host.communicate(timeout=60)
    assert host.returncode == -signal.SIGKILL
    [sent] = app.records()
    with ef.Runtime(any_ledger) as rt:
        [run] = rt.runs()
        [step] = rt.steps(run.run_id)
        assert step.status is StepStatus.INTENT_RECORDED
        done = rt.guard(app.send, SEND, scope="t", call_id="c")  # the host's replay
        assert done.value == sent
        lookups = [e.detail["answer"] for e in rt.audit(run.run_id) if e.kind == "lookup"]
        assert lookups == ["confirmed"]
    assert app.records() == [sent]


def test_concurrent_replays_of_one_call_from_two_processes_make_one_effect(
    any_ledger: str, provider: Path
) -> None:
    with ef.Runtime(any_ledger):
        pass  # the ledger's schema exists before the two hosts race to it
    hosts = [_host(any_ledger, provider, "gd_send", "t", "same", slow=0.5) for _ in range(2)]
    answers = [h.communicate(timeout=90) for h in hosts]
    assert [h.returncode for h in hosts] == [0, 0], answers
    values = [json.loads(out) for out, _ in answers]
    assert values[0] == values[1]
    assert len(app.records()) == 1


def test_a_repeat_the_hosts_conversation_still_shows_is_a_new_request(any_ledger: str) -> None:
    """A match whose original call id is still in the host's conversation (``known_call_ids``) is
    the model asking again knowingly: a new request. A match whose original is gone from it was
    regenerated after a lost turn: deduplicated (docs/concepts.md#regenerated-calls). Replays of
    either stay what they were."""
    with ef.Runtime(any_ledger) as rt:
        rt.guard(app.send, SEND, scope="t", call_id="call_1")
        again = rt.guard(app.send, SEND, scope="t", call_id="call_2", known_call_ids={"call_1"})
        assert not again.deduplicated
        lost = rt.guard(app.send, SEND, scope="t", call_id="call_3", known_call_ids={"other"})
        assert lost.deduplicated
        assert rt.guard(app.send, SEND, scope="t", call_id="call_2") == again
    assert [r["id"] for r in app.records()] == ["msg_1", "msg_2"]


def test_a_repeat_while_the_first_may_have_happened_is_never_a_second_effect(
    any_ledger: str,
) -> None:
    """The model was told the first call may have happened and asked again anyway (the first is
    still in its conversation, so this would be a new request): not while the first is in doubt.
    The person is asked about the first call, and once it is settled a regenerated repeat is
    answered by it."""
    with ef.Runtime(any_ledger) as rt:
        with pytest.raises(ef.NeedsPerson) as first:
            rt.guard(app.untagged, {"to": "b"}, scope="t", call_id="c1")
        for call_id, known in (("c2", {"c1"}), ("c3", set())):
            with pytest.raises(ef.NeedsPerson) as again:
                rt.guard(
                    app.untagged, {"to": "b"}, scope="t", call_id=call_id, known_call_ids=known
                )
            assert again.value.run_id == first.value.run_id
            assert again.value.effect_id == first.value.effect_id
            assert again.value.kind == "in_doubt"
        assert len(rt.runs()) == 1  # the repeats recorded nothing of their own
        [held] = app.records()
        rt.resolve(first.value.effect_id or "", committed=True, evidence={"result": held}, by="ops")
        answered = rt.guard(app.untagged, {"to": "b"}, scope="t", call_id="c4")
        assert answered.deduplicated
        assert answered.value == held
    assert len(app.records()) == 1


def test_a_regenerated_call_after_its_host_died_settles_the_first_by_lookup(
    any_ledger: str, provider: Path
) -> None:
    """The host died between the provider's commit and the outcome, and the model, asked again,
    gave a new call id: the first call is recovered (its key, its lookup) and answers this one —
    nobody is asked, nothing is sent twice."""
    host = _host(any_ledger, provider, "gd_send", "t", "c1", "--kill")
    host.communicate(timeout=60)
    assert host.returncode == -signal.SIGKILL
    [sent] = app.records()
    with ef.Runtime(any_ledger) as rt:
        done = rt.guard(app.send, SEND, scope="t", call_id="c2")
        assert done.deduplicated
        assert done.value == sent
        statuses = {r.call_id: r.status for r in rt.runs()}
        assert statuses == {"c1": ef.RunStatus.SUCCEEDED, "c2": ef.RunStatus.SUCCEEDED}
    assert app.records() == [sent]


def test_a_regenerated_approval_asks_about_the_first_call_only(any_ledger: str) -> None:
    arguments = {"order": "o1", "amount": 300}
    with ef.Runtime(any_ledger) as rt:
        with pytest.raises(ef.NeedsPerson) as first:
            rt.guard(app.refund, arguments, scope="t", call_id="c1")
        with pytest.raises(ef.NeedsPerson) as again:
            rt.guard(app.refund, arguments, scope="t", call_id="c2")
        assert again.value.kind == "approval"
        assert again.value.run_id == first.value.run_id
        assert len(rt.attention()) == 1  # one approval to give, not two
        rt.approve(first.value.run_id or "", "call", approver="alice", approval_id="ap-1")
        done = rt.guard(app.refund, arguments, scope="t", call_id="c2")
        assert done.deduplicated
    assert len(app.records()) == 1


def test_a_repeat_of_a_declined_call_is_a_request_of_its_own(any_ledger: str) -> None:
    """A call that provably did not happen (declined, rejected, not committed) answers no
    repeat: the repeat is the first call that may happen, and waits for its own approval."""
    arguments = {"order": "o1", "amount": 300}
    with ef.Runtime(any_ledger) as rt:
        with pytest.raises(ef.NeedsPerson) as first:
            rt.guard(app.refund, arguments, scope="t", call_id="c1")
        rt.reject(first.value.run_id or "", "call", by="bob", reason="wrong order")
        with pytest.raises(ef.StepRejected, match="declined by bob: wrong order"):
            rt.guard(app.refund, arguments, scope="t", call_id="c1")
        with pytest.raises(ef.NeedsPerson) as again:
            rt.guard(app.refund, arguments, scope="t", call_id="c2")
        assert again.value.run_id != first.value.run_id
        rt.approve(again.value.run_id or "", "call", approver="alice", approval_id="ap-2")
        done = rt.guard(app.refund, arguments, scope="t", call_id="c2")
        assert not done.deduplicated
    assert len(app.records()) == 1
