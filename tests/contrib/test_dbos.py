"""A guarded call inside a ``@DBOS.workflow``: the real dbos package on its SQLite system database
(one per test, ``DBOS.destroy()`` after it), the provider's own file as the proof.

The SIGKILL and DBOS's own recovery in a fresh process are in ``test_dbos_crash.py``.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dbos import DBOS, SetWorkflowID

import effectflow as ef
from contrib import host_world
from effectflow.contrib import dbos as ef_dbos
from effectflow.runtime import guard


class World:
    """The guarded calls the workflows below use (set by the ``host`` fixture); the provider's
    record is ``PROVIDER``'s file."""

    calls: dict[str, ef_dbos.GuardedStep] = {}  # noqa: RUF012 - reset per test by the fixture


PROVIDER = host_world.Provider()
records = PROVIDER.records
_commit = PROVIDER.commit
TOOLS = host_world.declare("dbos", PROVIDER, refund_kind="refund", mark_replays=False)
find, send, send_lost, send_untagged, refund = (
    TOOLS.find,
    TOOLS.send,
    TOOLS.send_lost,
    TOOLS.send_untagged,
    TOOLS.refund,
)


@DBOS.workflow(name="ef_test_one_call")
def one_call(tool: str, arguments: dict[str, Any]) -> Any:
    """One guarded call from the workflow's code."""
    return World.calls[tool](**arguments)


@DBOS.workflow(name="ef_test_model_call")
def model_call(arguments: dict[str, Any]) -> dict[str, Any]:
    """The call id comes from a model asked outside any step (a fresh id every execution)."""
    done = World.calls["send"].call(arguments, call_id=f"call_{uuid.uuid4().hex[:12]}")
    return {"value": done.value, "deduplicated": done.deduplicated, "run_id": done.run_id}


@DBOS.workflow(name="ef_test_twice")
def twice(arguments: dict[str, Any]) -> list[Any]:
    """The same call twice, the second after the workflow's code saw the first's result."""
    return [World.calls["send"](**arguments), World.calls["send"](**arguments)]


@DBOS.workflow(name="ef_test_catch")
def catch(arguments: dict[str, Any]) -> str:
    """A failed call as the workflow's code sees it: the error's class and code."""
    try:
        World.calls["refund"](**arguments)
    except ef.EffectflowError as exc:
        return f"{type(exc).__name__}:{exc.code}"
    return "done"


@DBOS.workflow(name="ef_test_async_call")
async def async_call(tool: str, arguments: dict[str, Any]) -> Any:
    """One guarded call from an ``async`` workflow's code."""
    return await World.calls[tool].run_async(**arguments)


def _launch(directory: Path) -> None:
    config: Any = {
        "name": "effectflow-dbos-test",
        "system_database_url": f"sqlite:///{directory / 'dbos.sqlite'}",
        "log_level": "WARNING",
    }
    DBOS(config=config)
    DBOS.launch()


@pytest.fixture
def rt(tmp_path: Path) -> Iterator[ef.Runtime]:
    """A ledger, the provider's file, DBOS launched on a fresh SQLite system database."""
    PROVIDER.file = tmp_path / "provider.jsonl"
    with ef.Runtime(f"sqlite:///{tmp_path / 'ledger.db'}") as runtime:
        World.calls = {
            "send": ef_dbos.guarded(runtime, send),
            "lost": ef_dbos.guarded(runtime, send_lost),
            "untagged": ef_dbos.guarded(runtime, send_untagged),
            "refund": ef_dbos.guarded(runtime, refund),
        }
        (tmp_path / "dbos").mkdir()
        _launch(tmp_path / "dbos")
        try:
            yield runtime
        finally:
            DBOS.destroy()


def _run(workflow_id: str, tool: str, **arguments: Any) -> Any:
    with SetWorkflowID(workflow_id):
        return one_call(tool, arguments)


def _relaunch_without_dbos_record(tmp_path: Path) -> None:
    """DBOS restarted without the checkpoint of the step: what DBOS's recovery sees when the
    process died inside the step, before DBOS recorded its output (at-least-once)."""
    DBOS.destroy()
    fresh = tmp_path / f"dbos-{uuid.uuid4().hex[:6]}"
    fresh.mkdir()
    _launch(fresh)


def test_the_call_runs_once_under_the_workflow_id_and_step_id(rt: ef.Runtime) -> None:
    """A guarded call in a workflow writes once; its ledger run is scoped by the workflow id,
    its call id is DBOS's step function id."""
    result = _run("wf-send", "send", to="ann", text="hi")
    assert records() == [result]
    [run] = rt.runs(scope="dbos:wf-send")
    assert run.status is ef.RunStatus.SUCCEEDED
    assert run.input["call_id"].startswith("step-")
    [effect] = rt.effects()
    assert effect.external_effect_id == result["id"]


def test_a_confirmed_call_that_dbos_runs_again_is_replayed_from_the_record(
    rt: ef.Runtime, tmp_path: Path
) -> None:
    """When DBOS runs the workflow again without the step's checkpoint, the same workflow id and
    step id reach the same ledger run: its recorded result, no second write."""
    first = _run("wf-replay", "send", to="ann", text="hi")
    _relaunch_without_dbos_record(tmp_path)
    again = _run("wf-replay", "send", to="ann", text="hi")
    assert again == first
    assert records() == [first]
    assert len(rt.runs(scope="dbos:wf-replay")) == 1


def test_a_lost_response_is_settled_by_the_lookup(rt: ef.Runtime) -> None:
    """The provider committed and the answer was lost: the workflow gets the provider's record
    from the contract's lookup, and nothing is written twice."""
    result = _run("wf-lost", "lost", to="bob", text="hello")
    assert records() == [result]
    [effect] = rt.effects()
    assert effect.status is ef.StepStatus.CONFIRMED
    assert effect.external_effect_id == result["id"]


def test_a_regenerated_call_id_is_deduplicated(rt: ef.Runtime, tmp_path: Path) -> None:
    """DBOS runs the workflow again without the step's checkpoint and the model, asked outside
    any step, gives a fresh tool-call id: the same tool and arguments in the same workflow are
    the first call's operation, answered from it."""
    with SetWorkflowID("wf-model"):
        first = model_call({"to": "cy", "text": "once"})
    _relaunch_without_dbos_record(tmp_path)
    with SetWorkflowID("wf-model"):
        again = model_call({"to": "cy", "text": "once"})
    assert len(records()) == 1
    assert again["value"] == first["value"] == records()[0]
    assert again["deduplicated"] is True
    calls = {r.input["call_id"] for r in rt.runs(scope="dbos:wf-model")}
    assert len(calls) == 2, "two tool-call ids, one effect"


def test_the_same_call_after_its_result_was_seen_is_a_new_request(rt: ef.Runtime) -> None:
    """Workflow code that makes the same call again after it got the first result asks
    knowingly: two writes."""
    with SetWorkflowID("wf-twice"):
        first, second = twice({"to": "dee", "text": "ping"})
    assert records() == [first, second]
    assert first["id"] != second["id"]


def test_an_approval_waits_on_dbos_messages_and_runs_once_approved(rt: ef.Runtime) -> None:
    """A financial write waits in the workflow (``DBOS.recv``) with its question published as a
    workflow event; the approval sent with ``DBOS.send`` is recorded and the refund made once."""
    handle = DBOS.start_workflow(one_call, "refund", {"order": "A-1", "amount": 30})
    asked = ef_dbos.asked(handle.workflow_id, timeout_seconds=30)
    assert asked is not None
    assert asked["kind"] == "approval"
    assert asked["call_id"].startswith("step-")
    assert records() == [], "nothing is refunded before the approval"
    ef_dbos.decide(handle.workflow_id, {"approved": True, "approver": "alice"})
    result = handle.get_result()
    assert records() == [result]
    assert result["order"] == "A-1"
    [effect] = rt.effects()
    assert effect.approval_id == f"dbos:{handle.workflow_id}:{asked['call_id']}"
    assert ef_dbos.asked(handle.workflow_id) is None


def test_a_declined_approval_is_a_step_rejected_in_the_workflow(rt: ef.Runtime) -> None:
    """A person declines: nothing is refunded, and the workflow's code gets ``StepRejected``."""
    handle = DBOS.start_workflow(catch, {"order": "B-2", "amount": 5})
    assert ef_dbos.asked(handle.workflow_id, timeout_seconds=30) is not None
    ef_dbos.decide(handle.workflow_id, {"approved": False, "approver": "bob", "reason": "no"})
    assert handle.get_result() == "StepRejected:step_rejected"
    assert records() == []


def test_a_refused_decision_asks_again_and_the_corrected_one_is_applied(rt: ef.Runtime) -> None:
    """A decision without who made it decides nothing: the question is published again with why,
    and the next decision is applied."""
    handle = DBOS.start_workflow(one_call, "refund", {"order": "C-3", "amount": 7})
    assert ef_dbos.asked(handle.workflow_id, timeout_seconds=30) is not None
    ef_dbos.decide(handle.workflow_id, {"approved": True})
    again = None
    for _ in range(200):
        again = ef_dbos.asked(handle.workflow_id)
        if again is not None and "refused" in again:
            break
        time.sleep(0.05)
    assert again is not None
    assert "who made it" in again["refused"]
    assert records() == []
    ef_dbos.decide(handle.workflow_id, {"approved": True, "approver": "carol"})
    assert handle.get_result() == records()[0]
    assert len(records()) == 1


def test_a_call_in_doubt_is_settled_by_a_persons_decision(rt: ef.Runtime) -> None:
    """An effect no lookup can settle waits for a person; their answer (it happened, with the
    provider's record as evidence) is recorded and the workflow goes on, without a second write."""
    handle = DBOS.start_workflow(one_call, "untagged", {"to": "eve", "text": "?"})
    asked = ef_dbos.asked(handle.workflow_id, timeout_seconds=30)
    assert asked is not None
    assert asked["kind"] == "in_doubt"
    assert asked["for_model"] == guard.MAY_HAVE_HAPPENED
    [line] = records()
    decision = {"committed": True, "evidence": {"result": line}, "by": "ops"}
    ef_dbos.decide(handle.workflow_id, decision)
    assert handle.get_result() == line
    assert records() == [line]
    [effect] = rt.effects()
    assert effect.status is ef.StepStatus.CONFIRMED


def test_nobody_deciding_within_the_wait_stops_the_workflow_with_no_decision(
    rt: ef.Runtime,
) -> None:
    """The wait is bounded: no answer within ``wait_seconds`` ends the workflow with
    ``NoDecision``; the call still waits in the ledger and nothing was refunded."""
    World.calls["refund"] = ef_dbos.guarded(rt, refund, wait_seconds=0.2)
    handle = DBOS.start_workflow(one_call, "refund", {"order": "D-4", "amount": 1})
    with pytest.raises(ef_dbos.NoDecision):
        handle.get_result()
    assert records() == []
    [run] = rt.runs(scope=f"dbos:{handle.workflow_id}")
    assert run.status is ef.RunStatus.PAUSED


def test_a_guarded_call_outside_a_workflow_is_refused(rt: ef.Runtime) -> None:
    """Outside a workflow there is no durable identity: refused before anything is recorded."""
    with pytest.raises(ef.ArgumentError, match=r"@DBOS\.workflow"):
        World.calls["send"](to="x", text="y")
    assert records() == []
    assert rt.runs() == []


def test_an_async_workflow_calls_once_and_is_replayed_from_the_record(
    rt: ef.Runtime, tmp_path: Path
) -> None:
    """From an ``async`` workflow the call goes through the same steps (DBOS's asyncio API): one
    write, and DBOS running the workflow again without the step's checkpoint gets the record."""

    async def run() -> Any:
        with SetWorkflowID("wf-async"):
            return await async_call("send", {"to": "fay", "text": "async"})

    first = asyncio.run(run())
    _relaunch_without_dbos_record(tmp_path)
    again = asyncio.run(run())
    assert again == first
    assert records() == [first]
    [run_record] = rt.runs(scope="dbos:wf-async")
    assert run_record.input["call_id"].startswith("step-")


def test_an_async_workflow_waits_for_an_approval_on_dbos_messages(rt: ef.Runtime) -> None:
    """An ``async`` workflow's financial write waits in ``DBOS.recv_async``; the approval sent
    with ``decide`` is applied and the refund made once."""

    async def run() -> Any:
        handle = await DBOS.start_workflow_async(
            async_call, "refund", {"order": "F-6", "amount": 3}
        )
        question = await DBOS.get_event_async(handle.workflow_id, ef_dbos.ASKED_EVENT, 30)
        assert question is not None
        assert question["kind"] == "approval"
        assert records() == []
        await asyncio.to_thread(
            ef_dbos.decide, handle.workflow_id, {"approved": True, "approver": "gus"}
        )
        return await handle.get_result()

    result = asyncio.run(run())
    assert records() == [result]
    assert result["order"] == "F-6"


def test_without_the_dbos_package_the_import_names_the_extra() -> None:
    """Without dbos installed, importing the integration fails saying which extra to install."""
    code = "import sys; sys.modules['dbos'] = None; import effectflow.contrib.dbos"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode != 0
    assert "pip install 'effectflow[dbos]'" in done.stderr
