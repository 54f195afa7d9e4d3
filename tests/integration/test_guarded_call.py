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
    """DESIGN §10: a match whose original call id is still in the host's conversation
    (``known_call_ids``) is the model asking again knowingly: a new request. A match whose
    original is gone from it was regenerated after a lost turn: deduplicated. Replays of either
    stay what they were."""
    with ef.Runtime(any_ledger) as rt:
        rt.guard(app.send, SEND, scope="t", call_id="call_1")
        again = rt.guard(app.send, SEND, scope="t", call_id="call_2", known_call_ids={"call_1"})
        assert not again.deduplicated
        lost = rt.guard(app.send, SEND, scope="t", call_id="call_3", known_call_ids={"other"})
        assert lost.deduplicated
        assert rt.guard(app.send, SEND, scope="t", call_id="call_2") == again
    assert [r["id"] for r in app.records()] == ["msg_1", "msg_2"]
