"""The OpenAI Agents SDK SIGKILLed at each of the four points, then its own recovery in a fresh
process, through the crash harness (``effectflow.testing.crash``); effects counted in the file
the tool appends to (the provider's own record).

Two recoveries, the two an application on the SDK has (it has no durable execution of its own):

- the turn run again in the same ``SQLiteSession`` (``benchmarks/compare/hosts/openai_agents.py``):
  the model, asked again, calls the tool with a new tool-call id;
- the run resumed from the ``RunState`` the application saved at the approval
  (``tests/contrib/oa_crash_child.py``): the same tool call, the same tool-call id.

The SDK alone writes twice after a kill right after the write, either way; with
``effectflow_tools`` the file holds one line at every point.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import effectflow as ef
from effectflow.testing import crash

REPO = Path(__file__).resolve().parents[2]
HOST = crash.HostScript(REPO / "benchmarks" / "compare" / "hosts" / "openai_agents.py")
CHILD = Path(__file__).with_name("oa_crash_child.py")


def _lines(directory: Path) -> list[dict[str, Any]]:
    path = directory / crash.WORLD_FILE
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_the_sdk_alone_writes_twice_when_the_turn_is_run_again(tmp_path: Path) -> None:
    """The control: killed right after the append, the turn run again in the same session asks
    the model again, which calls the tool again: two lines under two keys."""
    report = HOST.run_matrix(tmp_path / "state", bare=True, points=("after_effect",))
    [result] = report.results
    assert result.killed, result.start_stderr
    assert result.recover_rc == 0, result.recover_stderr
    assert (result.effects, result.needs_person, result.verdict) == (2, False, "duplicate")
    assert len({line["key"] for line in _lines(tmp_path / "state")}) == 2
    with pytest.raises(AssertionError, match=r"unsafe at after_effect \(duplicate\)"):
        report.assert_safe()


def test_with_effectflow_the_turn_run_again_writes_once_at_every_point(tmp_path: Path) -> None:
    """With ``effectflow_tools``, a SIGKILL at each point and the turn run again leave one line;
    after the effect, the new tool-call id is the first call's operation: the first call is
    settled by its lookup and the second answers with its result."""
    state = tmp_path / "state"
    results = []
    for point in crash.POINTS:
        [result] = HOST.run_matrix(state, points=(point,)).results
        assert result.recover_rc == 0, result.recover_stderr
        [line] = _lines(state)
        with ef.Runtime(f"sqlite:///{state / 'ledger.db'}") as rt:
            [effect] = rt.effects()
            assert effect.status is ef.StepStatus.CONFIRMED
            assert effect.external_effect_id == line["key"]
            if point == "after_effect":
                runs = rt.runs()
                assert len(runs) == 2, "the call the kill interrupted, and the one asked again"
                assert {r.status for r in runs} == {ef.RunStatus.SUCCEEDED}
                assert effect.run_id == min(runs, key=lambda r: r.created_at).run_id
        results.append(result)
    report = crash.CrashReport(tuple(results), "openai_agents (with effectflow)")
    assert report.verdicts() == dict.fromkeys(crash.POINTS, "once")
    report.assert_safe(require_killed=True)


def _resume_matrix(
    directory: Path, *, bare: bool, points: tuple[str, ...], flags: tuple[str, ...] = ()
) -> crash.CrashReport:
    """The turn run to its interruption, approved and saved (not killed) once, in a directory of
    its own; then per point: a copy of that directory, the resume from the saved state killed at
    the point, the recovery a resume from the same saved state in a fresh process. (A fresh
    approval per point made the same saved state at the cost of one more start of the SDK.)"""
    flag = ["--bare", *flags] if bare else list(flags)
    approved_dir = directory.with_name(f"{directory.name}-approved")
    shutil.rmtree(approved_dir, ignore_errors=True)
    approved_dir.mkdir(parents=True)
    approved = subprocess.run(
        [sys.executable, str(CHILD), "approve", str(approved_dir), *flag],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert approved.returncode == 0, approved.stderr
    assert _lines(approved_dir) == [], "nothing is done before the approved run resumes"
    resume = [sys.executable, str(CHILD), "resume", str(directory), *flag]
    results = []
    for point in points:
        shutil.rmtree(directory, ignore_errors=True)
        shutil.copytree(approved_dir, directory)
        results.append(
            crash.run_point(
                resume,
                resume,
                point=point,
                effects=lambda: crash.count_lines(directory / crash.WORLD_FILE),
            )
        )
    return crash.CrashReport(tuple(results), f"resume ({'alone' if bare else 'with effectflow'})")


def test_the_sdk_alone_refunds_twice_when_the_saved_run_state_is_resumed_again(
    tmp_path: Path,
) -> None:
    """The control: killed right after the approved refund, the run resumed again from the state
    the application saved runs the same approved tool call again: two refunds."""
    report = _resume_matrix(tmp_path / "state", bare=True, points=("after_effect",))
    [result] = report.results
    assert result.killed, result.start_stderr
    assert result.recover_rc == 0, result.recover_stderr
    assert (result.effects, result.verdict) == (2, "duplicate")


def test_with_effectflow_the_saved_run_state_resumed_again_refunds_once_at_every_point(
    tmp_path: Path,
) -> None:
    """With ``effectflow_tools``, the same tool call resumed again from the saved state is the
    same guarded call: answered from its record, or settled by its lookup — one refund at every
    point, and the model gets it as done."""
    state = tmp_path / "state"
    report = _resume_matrix(state, bare=False, points=crash.POINTS)
    for result in report.results:
        assert result.recover_rc == 0, result.recover_stderr
        out = json.loads(result.recover_stdout)
        [output] = out["outputs"]
        assert json.loads(output)["status"] == "done", (result.point, output)
    assert report.verdicts() == dict.fromkeys(crash.POINTS, "once")
    report.assert_safe(require_killed=True)
    [line] = _lines(state)
    with ef.Runtime(f"sqlite:///{state / 'ledger.db'}") as rt:
        [effect] = rt.effects()
        assert effect.external_effect_id == line["key"]
        [run] = rt.runs()
        [approval] = rt.store.approvals(run.run_id, "call")
        assert approval.approver == "openai-agents:RunState.approve"


def test_with_effectflow_a_refund_nobody_can_look_up_is_left_to_a_person_not_repeated(
    tmp_path: Path,
) -> None:
    """The provider cannot be searched: killed right after the refund, the resumed call cannot
    tell whether it happened. It is not made again: the model is told it may have happened, the
    ledger asks a person; once the person says it happened, the next resume answers ``done``
    with the provider still holding one refund."""
    state = tmp_path / "state"
    report = _resume_matrix(state, bare=False, points=("after_effect",), flags=("--no-lookup",))
    [result] = report.results
    assert result.killed, result.start_stderr
    assert (result.effects, result.needs_person, result.verdict) == (1, True, "person asked")
    [output] = json.loads(result.recover_stdout)["outputs"]
    assert json.loads(output)["status"] == "unknown"
    [line] = _lines(state)
    with ef.Runtime(f"sqlite:///{state / 'ledger.db'}") as rt:
        [item] = rt.attention()
        assert item.effect_id is not None
        rt.resolve(item.effect_id, committed=True, evidence={"result": line}, by="ops")
    resumed = subprocess.run(
        [sys.executable, str(CHILD), "resume", str(state), "--no-lookup"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stderr
    out = json.loads(resumed.stdout)
    [output] = out["outputs"]
    assert json.loads(output) == {"status": "done", "happened": True, "result": line}
    assert (out["lines"], out["needs_person"]) == (1, False)
