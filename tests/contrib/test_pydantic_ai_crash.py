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
"""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

import effectflow as ef
from effectflow.testing import crash

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "compare" / "hosts" / "pydantic_ai.py"
HOST = crash.HostScript(SCRIPT)


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
