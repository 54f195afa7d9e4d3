"""The crash harness pointed at a real host: LangGraph's ``create_agent`` on ``SqliteSaver``
(``benchmarks/compare/hosts/langgraph.py``), SIGKILLed at each of the four points and resumed from
its checkpoint by a fresh process, with the lines of the file its tool appends to counted.

LangGraph alone writes the line twice after a kill right after the write: its checkpoint holds the
model's tool call, and the resumed graph runs it again. With ``EffectflowMiddleware`` the file holds
one line at every point: the resumed call is the same guarded call, answered from its record or
settled by the lookup.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import effectflow as ef
from effectflow.testing import crash

REPO = Path(__file__).resolve().parents[2]
HOST = crash.HostScript(REPO / "benchmarks" / "compare" / "hosts" / "langgraph.py")


def test_langgraph_alone_duplicates_the_write_after_the_effect(tmp_path: Path) -> None:
    """The control: killed right after the append, LangGraph resumed from its checkpoint re-runs
    the tool call, and the provider's file shows two lines under two different keys."""
    report = HOST.run_matrix(tmp_path / "state", bare=True, points=("after_effect",))
    [result] = report.results
    assert result.killed, result.start_stderr
    assert result.recover_rc == 0, result.recover_stderr
    assert (result.effects, result.needs_person, result.verdict) == (2, False, "duplicate")
    lines = (tmp_path / "state" / crash.WORLD_FILE).read_text(encoding="utf-8").splitlines()
    assert len({json.loads(line)["key"] for line in lines}) == 2
    with pytest.raises(AssertionError, match=r"unsafe at after_effect \(duplicate\)"):
        report.assert_safe()


def test_langgraph_with_effectflow_is_safe_at_every_point(tmp_path: Path) -> None:
    """With ``EffectflowMiddleware``, a SIGKILL at each of the four points and LangGraph's own
    resume leave exactly one line in the file, and the ledger's one effect names that line's key."""
    state = tmp_path / "state"
    results = []
    for point in crash.POINTS:
        [result] = HOST.run_matrix(state, points=(point,)).results
        assert result.recover_rc == 0, result.recover_stderr
        assert json.loads(result.recover_stdout)["status"] == "done"
        [line] = (state / crash.WORLD_FILE).read_text(encoding="utf-8").splitlines()
        with ef.Runtime(f"sqlite:///{state / 'ledger.db'}") as rt:
            [effect] = rt.effects()
            assert effect.status is ef.StepStatus.CONFIRMED
            assert effect.external_effect_id == json.loads(line)["key"]
        results.append(result)
    report = crash.CrashReport(tuple(results), "langgraph (with effectflow)")
    assert report.verdicts() == dict.fromkeys(crash.POINTS, "once")
    report.assert_safe(require_killed=True)
