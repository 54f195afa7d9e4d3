"""A Temporal activity SIGKILLed in its attempt, in a real process, then the next attempt of the
same activity id in a fresh process — what Temporal's server schedules after the worker died
(``temporal_crash_child.py`` plays both workers under ``ActivityEnvironment``; no server runs
here, see docs/integrations/temporal.md). The effects are counted in the provider's own file.

The activity alone writes again on the retry: two lines. Through the guard the retry reaches the
same ledger run, whose lookup finds the line: one line, at every point of the write path.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import effectflow as ef
from effectflow.testing import crash

CHILD = Path(__file__).with_name("temporal_crash_child.py")


def _argv(state: Path, attempt: int, *flags: str) -> list[str]:
    return [sys.executable, str(CHILD), "attempt", str(state), str(attempt), *flags]


def _matrix(state: Path, *flags: str, points: tuple[str, ...] = crash.POINTS) -> crash.CrashReport:
    def reset() -> None:
        shutil.rmtree(state, ignore_errors=True)
        state.mkdir(parents=True)

    return crash.run_matrix(
        _argv(state, 1, *flags),
        _argv(state, 2, *flags),
        effects=lambda: crash.count_lines(state / crash.WORLD_FILE),
        points=points,
        reset=reset,
        label=f"temporal activity ({'alone' if flags else 'with effectflow'})",
    )


def test_the_activity_alone_writes_the_line_twice(tmp_path: Path) -> None:
    """The control: killed right after its write, the activity's next attempt writes again."""
    [result] = _matrix(tmp_path / "bare", "--bare", points=("after_effect",)).results
    assert result.killed, result.start_stderr
    assert result.recover_rc == 0, result.recover_stderr
    assert result.effects == 2
    assert result.verdict is crash.Verdict.DUPLICATE


def test_with_the_guard_every_crash_point_leaves_one_line(tmp_path: Path) -> None:
    """Killed before the intent, after it, after the effect or after the outcome, then the next
    attempt in a fresh process: exactly one line each time, and the attempt completes."""
    report = _matrix(tmp_path / "guarded")
    print(report.table())
    report.assert_safe(require_killed=True)
    assert {r.point: r.effects for r in report.results} == dict.fromkeys(crash.POINTS, 1)
    assert all('"status": "completed"' in r.recover_stdout for r in report.results)


def test_the_retry_after_the_kill_is_settled_by_the_lookup(tmp_path: Path) -> None:
    """After the kill right after the effect, the ledger's record of the call is confirmed by the
    lookup with the provider's own id for the line."""
    state = tmp_path / "after-effect"
    [result] = _matrix(state, points=("after_effect",)).results
    assert result.verdict is crash.Verdict.ONCE
    with ef.Runtime(f"sqlite:///{state / 'ledger.db'}") as rt:
        [run] = rt.runs(scope="temporal:wf-crash:run-1")
        assert run.input["call_id"] == "1"
        [effect] = rt.effects()
        assert effect.status is ef.StepStatus.CONFIRMED
        [line] = (state / crash.WORLD_FILE).read_text().splitlines()
        assert effect.external_effect_id in line
