"""A real Pydantic AI agent under its DBOS durability (``DBOSDurability``, DBOS on a SQLite system
database) SIGKILLed inside its tool, then DBOS's own recovery in a fresh process (``DBOS.launch()``
resumes the pending workflow), through the crash harness and the host script
``benchmarks/compare/hosts/pydantic_ai.py``; the effects are counted in the provider's own file.

Pydantic AI and DBOS alone run the tool again: DBOS replays the recorded model step, which gives
the same tool call, and the write (a ``@DBOS.step`` whose output was never checkpointed) runs a
second time: two lines. With the ``Effectflow`` capability the replayed call is the same guarded
call (the scope comes from the conversation id Pydantic AI derives from the workflow id, the call
id is the recorded tool-call id): answered from its record, or settled by the lookup; one line at
every point of the write path.

Without a durable engine (``pai_crash_child.py``) the application saves the conversation when a
run returns; a kill inside the tool loses the model's turn, and the application asks again in the
same conversation: the model calls with a new tool-call id. Alone that is a second line; with
``Effectflow`` the regenerated call is the first one's operation, answered as already done.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest

import effectflow as ef
from effectflow.testing import crash

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "compare" / "hosts" / "pydantic_ai.py"
HOST = crash.HostScript(SCRIPT)
#: Plain Pydantic AI, no durable engine: the application saves the conversation after each run.
CHILD = Path(__file__).with_name("pai_crash_child.py")


def _dbos_steps(directory: Path) -> list[tuple[int, str]]:
    """The steps DBOS recorded for the turn's workflow, read from its own system database."""
    with closing(sqlite3.connect(directory / "dbos.sqlite")) as db:
        rows = db.execute(
            "SELECT function_id, function_name FROM operation_outputs WHERE workflow_uuid = ? "
            "ORDER BY function_id",
            ("pai-turn",),
        ).fetchall()
    return [(int(i), str(name)) for i, name in rows]


def test_pydantic_ai_under_dbos_alone_writes_the_line_twice(tmp_path: Path) -> None:
    """The control: killed right after its write, the recovered workflow replays the model's
    recorded tool call and runs the write again; the provider holds two lines for that one call."""
    report = HOST.run_matrix(tmp_path / "bare", bare=True, points=("after_effect",))
    [result] = report.results
    assert result.killed, result.start_stderr
    assert result.recover_rc == 0, result.recover_stderr
    assert (result.effects, result.needs_person, result.verdict) == (2, False, "duplicate")
    assert json.loads(result.recover_stdout.splitlines()[-1])["status"] == "SUCCESS"
    lines = (tmp_path / "bare" / crash.WORLD_FILE).read_text(encoding="utf-8").splitlines()
    [key] = {json.loads(line)["key"] for line in lines}
    assert key.startswith("plain-call_"), "one tool call (DBOS replayed it), written twice"
    with pytest.raises(AssertionError, match=r"unsafe at after_effect \(duplicate\)"):
        report.assert_safe()


@pytest.mark.parametrize("point", crash.POINTS)
def test_with_effectflow_each_crash_point_leaves_one_line(tmp_path: Path, point: str) -> None:
    """Killed at each of the four points, then recovered by DBOS: one line in the provider's file;
    the ledger's one effect names its key; DBOS's record holds the model's steps and no step of
    the tool (the guarded call owns the effect)."""
    state = tmp_path / "state"
    [result] = HOST.run_matrix(state, points=(point,)).results
    assert result.killed, result.start_stderr
    assert result.recover_rc == 0, result.recover_stderr
    out = json.loads(result.recover_stdout.splitlines()[-1])
    assert (out["status"], out["needs_person"]) == ("SUCCESS", False)
    assert result.verdict is crash.Verdict.ONCE
    [line] = (state / crash.WORLD_FILE).read_text(encoding="utf-8").splitlines()
    with ef.Runtime(f"sqlite:///{state / 'ledger.db'}") as rt:
        [effect] = rt.effects()
        assert effect.status is ef.StepStatus.CONFIRMED
        assert effect.external_effect_id == json.loads(line)["key"]
        [run] = rt.runs()
        assert run.status is ef.RunStatus.SUCCEEDED
        assert str(run.input["scope"]).startswith("pydantic_ai:")
    # DBOS owns the agent's progress: the model's two requests are its steps, replayed on
    # recovery; the tool's write is no step of DBOS's.
    assert _dbos_steps(state) == [(1, "pai_host__model.request"), (2, "pai_host__model.request")]


def _plain(directory: Path, *, bare: bool, point: str = "after_effect") -> crash.PointResult:
    """A SIGKILL of the plain Pydantic AI process at ``point``, then the application's retry."""
    flags = ["--bare"] if bare else []
    argv = [sys.executable, str(CHILD)]
    return crash.run_point(
        [*argv, "start", str(directory), *flags],
        [*argv, "recover", str(directory), *flags],
        point=point,
        effects=lambda: crash.count_lines(directory / crash.WORLD_FILE),
    )


def test_plain_pydantic_ai_alone_writes_again_when_the_lost_turn_is_asked_again(
    tmp_path: Path,
) -> None:
    """The control: the kill lost the model's turn; asked again, the model calls with a new id and
    the tool writes a second line, under a second key."""
    state = tmp_path / "plain"
    state.mkdir()
    result = _plain(state, bare=True)
    assert result.killed, result.start_stderr
    assert result.recover_rc == 0, result.recover_stderr
    assert result.verdict is crash.Verdict.DUPLICATE
    lines = (state / crash.WORLD_FILE).read_text(encoding="utf-8").splitlines()
    assert len({json.loads(line)["key"] for line in lines}) == 2


@pytest.mark.parametrize("point", crash.POINTS)
def test_with_effectflow_the_call_asked_again_after_a_lost_turn_is_not_written_again(
    tmp_path: Path, point: str
) -> None:
    """Killed at each point, the turn lost, the request asked again with a new tool-call id: one
    line: the regenerated call is answered ``already_done`` with the first call's line, and the
    ledger holds one effect, the first call's."""
    state = tmp_path / "plain"
    shutil.rmtree(state, ignore_errors=True)
    state.mkdir()
    result = _plain(state, bare=False, point=point)
    assert result.killed, result.start_stderr
    assert result.recover_rc == 0, result.recover_stderr
    assert result.verdict is crash.Verdict.ONCE
    out = json.loads(result.recover_stdout.splitlines()[-1])
    [line] = (state / crash.WORLD_FILE).read_text(encoding="utf-8").splitlines()
    [regenerated] = out["tool_calls"]
    [told] = out["tool_returns"]
    with ef.Runtime(f"sqlite:///{state / 'ledger.db'}") as rt:
        [effect] = rt.effects()
        assert effect.external_effect_id == json.loads(line)["key"]
        calls = {r.input["call_id"]: r for r in rt.runs()}
    # Even killed before its intent, the first call's run was recorded: the call asked again
    # settles it first (its host is dead: it is recovered and made), then is answered by it.
    [first] = set(calls) - {regenerated}
    assert effect.run_id == calls[first].run_id, "the effect is the first call's"
    assert told["status"] == "already_done"
    assert told["result"] == json.loads(line)


def test_a_write_nothing_can_check_ends_at_a_person_and_their_answer_is_its_result(
    tmp_path: Path,
) -> None:
    """No lookup and no key the provider honours: killed right after the write, the recovered run
    cannot know and ends with ``DeferredToolRequests`` (a person asked, the ledger lists the
    effect). The person finds the line; their ``committed`` answer, in a new workflow of the same
    conversation, is recorded and becomes the tool's result. One line throughout."""
    state = tmp_path / "unchecked"
    state.mkdir()
    argv = [sys.executable, "-P", str(SCRIPT)]
    result = crash.run_point(
        [*argv, "start", str(state), "--no-lookup"],
        [*argv, "recover", str(state), "--no-lookup"],
        point="after_effect",
        effects=lambda: crash.count_lines(state / crash.WORLD_FILE),
    )
    assert result.killed, result.start_stderr
    assert result.recover_rc == 0, result.recover_stderr
    assert result.verdict is crash.Verdict.PERSON_ASKED
    assert crash.ledger_needs_person(f"sqlite:///{state / 'ledger.db'}")()
    answered = subprocess.run(
        [*argv, "answer", str(state), "--no-lookup"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert answered.returncode == 0, answered.stderr
    out = json.loads(answered.stdout.splitlines()[-1])
    [line] = (state / crash.WORLD_FILE).read_text(encoding="utf-8").splitlines()
    assert out["needs_person"] is False
    assert out["tool_returns"] == [{"status": "done", "happened": True, "result": json.loads(line)}]
    with ef.Runtime(f"sqlite:///{state / 'ledger.db'}") as rt:
        [effect] = rt.effects()
        assert effect.status is ef.StepStatus.CONFIRMED
        assert rt.attention() == []
        assert any(e.actor == "ops" for e in rt.audit(effect.run_id))
