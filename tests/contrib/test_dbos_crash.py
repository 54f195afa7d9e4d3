"""A real DBOS process SIGKILLed inside its workflow's write, then DBOS's own recovery in a fresh
process (``DBOS.launch()`` recovers the pending workflow), through the crash harness and the host
script ``benchmarks/compare/hosts/dbos.py``; the effects are counted in the provider's own file.

DBOS alone runs the step again (its output was never checkpointed): two lines. Through the
guarded call the step DBOS runs again reaches the same ledger run, whose lookup finds the line:
one line, at every point of the write path.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import effectflow as ef
from effectflow.testing import crash

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "compare" / "hosts" / "dbos.py"
HOST = crash.HostScript(SCRIPT)


def test_dbos_alone_writes_the_line_twice(tmp_path: Path) -> None:
    """The control: killed right after its write, the plain ``@DBOS.step`` runs again when DBOS
    recovers the workflow, and the provider holds two lines."""
    report = HOST.run_matrix(tmp_path / "bare", bare=True, points=("after_effect",))
    [result] = report.results
    assert result.killed, result.start_stderr
    assert result.recover_rc == 0, result.recover_stderr
    assert result.effects == 2
    assert result.verdict is crash.Verdict.DUPLICATE
    assert json.loads(result.recover_stdout.splitlines()[-1])["status"] == "SUCCESS"


def test_with_the_guard_every_crash_point_leaves_one_line(tmp_path: Path) -> None:
    """Killed before the intent, after it, after the effect or after the outcome, then recovered
    by DBOS: the provider holds exactly one line each time."""
    report = HOST.run_matrix(tmp_path / "guarded")
    print(report.table())
    report.assert_safe(require_killed=True)
    assert {r.point: r.effects for r in report.results} == dict.fromkeys(crash.POINTS, 1)
    assert all(r.verdict is crash.Verdict.ONCE for r in report.results)


def test_a_call_regenerated_by_the_replay_is_not_written_again(tmp_path: Path) -> None:
    """The call id comes from a model asked outside any step, so DBOS's replay after the kill
    asks with a fresh id: the guard takes it for the first call's operation, settles that call
    by its lookup (its process is dead) and answers with its line."""
    state = tmp_path / "model-ids"

    def reset() -> None:
        shutil.rmtree(state, ignore_errors=True)
        state.mkdir()

    reset()
    argv = [sys.executable, str(SCRIPT)]
    result = crash.run_point(
        [*argv, "start", str(state), "--model-ids"],
        [*argv, "recover", str(state), "--model-ids"],
        point="after_effect",
        effects=lambda: crash.count_lines(state / crash.WORLD_FILE),
    )
    assert result.killed, result.start_stderr
    assert result.recover_rc == 0, result.recover_stderr
    assert result.verdict is crash.Verdict.ONCE
    with ef.Runtime(f"sqlite:///{state / 'ledger.db'}") as rt:
        runs = rt.runs(scope="dbos:harness-turn")
        assert len({r.input["call_id"] for r in runs}) == 2, "two tool-call ids"
        assert {r.status for r in runs} == {ef.RunStatus.SUCCEEDED}
        [effect] = rt.effects()
        [line] = (state / crash.WORLD_FILE).read_text().splitlines()
        assert effect.external_effect_id == json.loads(line)["key"]


def test_a_write_nothing_can_check_ends_at_a_person_not_a_second_line(tmp_path: Path) -> None:
    """Without a lookup or a key, DBOS's replay cannot be told whether the killed call happened:
    the workflow waits for a person (its question published, ``DBOS.recv``), the provider holds
    the one line, and the ledger's attention queue names the call."""
    state = tmp_path / "no-lookup"
    state.mkdir()
    argv = [sys.executable, str(SCRIPT)]
    result = crash.run_point(
        [*argv, "start", str(state), "--no-lookup"],
        [*argv, "recover", str(state), "--no-lookup"],
        point="after_effect",
        effects=lambda: crash.count_lines(state / crash.WORLD_FILE),
    )
    assert result.killed, result.start_stderr
    assert result.verdict is crash.Verdict.PERSON_ASKED
    assert result.effects == 1
    with ef.Runtime(f"sqlite:///{state / 'ledger.db'}") as rt:
        [item] = rt.attention()
        [run] = rt.runs(scope="dbos:harness-turn")
        assert item.run_id == run.run_id
