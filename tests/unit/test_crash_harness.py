"""``effectflow.testing.crash``: every verdict the harness gives can really occur, with real
processes SIGKILLed at each point and the effects counted in the file the tool appends to.

The host is a tiny script written to the test's directory: a plain ``ef.Runtime`` and one
``ef.tool`` that appends a JSON line, called through ``rt.guard`` as an agent host would. Its
``--setup`` says which setup is under test: ``correct`` (a lookup that reads the file by key),
``no-lookup`` (a write nobody can check), ``forget`` (a recovery that does nothing), ``bare`` (no
effectflow: the tool kills itself after its write, the host re-runs what its own checkpoint does not
show as done).
"""

from __future__ import annotations

import json
import shutil
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from effectflow.runtime.faults import FaultPoint
from effectflow.testing import crash

HOST = """
import json, sys
from pathlib import Path

import effectflow as ef
from effectflow.testing import crash

mode, directory, setup = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
world = directory / "world.jsonl"


def append(text, key):
    with world.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps({"key": key, "text": text}) + "\\n")
        fh.flush()
    return {"key": key}


@ef.tool("harness_find", effect="read")
def find(*, idempotency_key):
    for line in world.read_text().splitlines() if world.exists() else []:
        if json.loads(line)["key"] == idempotency_key:
            return ef.Lookup.confirmed(external_effect_id=idempotency_key)
    return ef.Lookup.not_committed()


if setup == "no-lookup":
    @ef.tool("harness_append", effect="external_write")
    def append_line(text, *, idempotency_key):
        return append(text, idempotency_key)
else:
    @ef.tool("harness_append", effect="external_write", confirm=find, effect_id="key",
             settles_within=0)
    def append_line(text, *, idempotency_key):
        return append(text, idempotency_key)


def turn(rt):
    try:
        rt.guard(append_line, {"text": "hello"}, scope="unit-thread", call_id="call-1")
    except ef.NeedsPerson:
        return {"status": "needs_person", "needs_person": True}
    return {"status": "done", "needs_person": False}


if setup == "bare":
    done = directory / "checkpoint.done"
    if mode == "start" or not done.exists():
        append("hello", "bare")
        crash.kill_if("after_effect")
        done.write_text("done")
    print(json.dumps({"status": "done", "needs_person": False}))
elif mode == "start":
    with ef.Runtime(f"sqlite:///{directory / 'ledger.db'}", faults=crash.faults_from_env()) as rt:
        print(json.dumps(turn(rt)))
elif setup == "forget":
    print(json.dumps({"status": "nothing", "needs_person": False}))
else:
    with ef.Runtime(f"sqlite:///{directory / 'ledger.db'}") as rt:
        print(json.dumps(turn(rt)))
"""


def _matrix(
    tmp_path: Path,
    setup: str,
    points: tuple[str, ...] = crash.POINTS,
    needs_person: Callable[[], bool] | None = None,
) -> crash.CrashReport:
    script = tmp_path / "host.py"
    script.write_text(HOST, encoding="utf-8")
    world = tmp_path / "world"

    def reset() -> None:
        shutil.rmtree(world, ignore_errors=True)
        world.mkdir()

    argv = [sys.executable, str(script)]
    return crash.run_matrix(
        [*argv, "start", str(world), setup],
        [*argv, "recover", str(world), setup],
        effects=lambda: crash.count_lines(world / crash.WORLD_FILE),
        points=points,
        reset=reset,
        label=setup,
        needs_person=needs_person,
    )


@pytest.fixture(scope="module")
def correct(tmp_path_factory: pytest.TempPathFactory) -> crash.CrashReport:
    return _matrix(tmp_path_factory.mktemp("correct"), "correct")


def test_correct_setup_is_once_at_all_four_points(correct: crash.CrashReport) -> None:
    """A write with a lookup, replayed by the host after a SIGKILL at each of the four points,
    leaves exactly one line in the file every time, and the start process really died there."""
    assert [r.point for r in correct.results] == list(crash.POINTS)
    assert [(r.killed, r.effects, r.verdict) for r in correct.results] == [(True, 1, "once")] * 4
    assert all(r.start_rc == -signal.SIGKILL and r.recover_rc == 0 for r in correct.results)
    correct.assert_safe(require_killed=True)
    assert correct.safe


def test_the_table_names_each_point_and_its_verdict(correct: crash.CrashReport) -> None:
    """The table has a header and one row per point with its effect count and verdict."""
    table = correct.table().splitlines()
    assert table[0] == "correct"
    assert table[1].split() == ["point", "killed", "effects", "person", "asked", "verdict"]
    assert [row.split() for row in table[2:]] == [
        [point, "yes", "1", "no", "once"] for point in crash.POINTS
    ]


def test_a_bare_host_duplicates_after_the_effect(tmp_path: Path) -> None:
    """Without effectflow, a kill right after the write and the host's re-run of the turn its
    checkpoint does not show as done writes the line twice; assert_safe names that point."""
    report = _matrix(tmp_path, "bare", ("before_intent", "after_effect"))
    before, after = report.results
    assert (before.killed, before.effects, before.verdict) == (False, 1, "once")
    assert (after.killed, after.effects, after.verdict) == (True, 2, "duplicate")
    lines = (tmp_path / "world" / crash.WORLD_FILE).read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["key"] for line in lines] == ["bare", "bare"]
    with pytest.raises(AssertionError, match=r"(?m)^bare: unsafe at after_effect \(duplicate\)$"):
        report.assert_safe()
    with pytest.raises(AssertionError, match=r"before_intent \(once, never killed\)"):
        report.assert_safe(require_killed=True)


def test_a_write_nobody_can_check_asks_a_person(tmp_path: Path) -> None:
    """A write with no lookup and no idempotency, killed after its effect: the replay does not
    write again (one line) and a person is asked: the verdict is "person asked", which is safe."""
    report = _matrix(tmp_path, "no-lookup", ("after_effect",))
    [result] = report.results
    assert (result.killed, result.effects, result.needs_person) == (True, 1, True)
    assert result.verdict == "person asked"
    assert json.loads(result.recover_stdout)["status"] == "needs_person"
    report.assert_safe()


def test_a_setup_that_forgets_to_recover_loses_the_call(tmp_path: Path) -> None:
    """A recovery that neither replays the host nor recovers the ledger, after a kill before the
    write: the file stays empty and nobody is asked: "lost", named by assert_safe."""
    report = _matrix(tmp_path, "forget", ("after_intent",))
    [result] = report.results
    assert (result.killed, result.effects, result.needs_person) == (True, 0, False)
    assert result.verdict == "lost"
    with pytest.raises(AssertionError, match=r"unsafe at after_intent \(lost\)"):
        report.assert_safe()


def test_the_ledger_keeps_a_forgotten_call_in_sight(tmp_path: Path) -> None:
    """The same forgetful recovery, judged by the ledger's attention queue instead of the host:
    killed after the intent, the call is there for a person (person asked); killed before it,
    nothing was recorded and the call is lost; a correct setup leaves nothing to ask."""
    url = f"sqlite:///{tmp_path / 'world' / 'ledger.db'}"
    report = _matrix(
        tmp_path,
        "forget",
        ("after_intent", "before_intent"),
        needs_person=crash.ledger_needs_person(url),
    )
    assert [(r.effects, r.verdict) for r in report.results] == [(0, "person asked"), (0, "lost")]
    with pytest.raises(AssertionError, match=r"(?m)unsafe at before_intent \(lost\)$"):
        report.assert_safe()
    correct = _matrix(
        tmp_path, "correct", ("after_effect",), needs_person=crash.ledger_needs_person(url)
    )
    assert [(r.effects, r.verdict) for r in correct.results] == [(1, "once")]


@pytest.mark.parametrize(
    ("effects", "asked", "expected"),
    [
        (0, False, "lost"),
        (1, False, "once"),
        (0, True, "person asked"),
        (1, True, "person asked"),
        (2, True, "duplicate"),
        (3, False, "duplicate"),
    ],
)
def test_verdicts(effects: int, asked: bool, expected: str) -> None:
    """More than one effect is a duplicate whoever is asked; a person asked covers zero or one."""
    assert crash.verdict(effects, asked) == expected


def test_faults_from_env_maps_the_four_points_to_the_write_path() -> None:
    """Each point names its write-path window, for one step or any; unset or empty is no plan."""
    expected = [
        FaultPoint.BEFORE_INTENT,
        FaultPoint.AFTER_INTENT,
        FaultPoint.AFTER_CALL_BEFORE_RECORD,
        FaultPoint.AFTER_RECORD,
    ]
    for point, window in zip(crash.POINTS, expected, strict=True):
        plan = crash.faults_from_env({crash.POINT_VAR: point, crash.STEP_VAR: "send"})
        assert plan is not None
        [fault] = plan.faults
        assert (fault.point, fault.step_id) == (window, "send")
    any_step = crash.faults_from_env({crash.POINT_VAR: "after_effect"})
    assert any_step is not None
    assert any_step.faults[0].step_id is None
    assert crash.faults_from_env({}) is None
    assert crash.faults_from_env({crash.POINT_VAR: ""}) is None


def test_an_unknown_point_is_refused_not_ignored() -> None:
    """A misspelt point would run a crash-free test that passes: the harness refuses it."""
    with pytest.raises(crash.HarnessError, match="after_efect"):
        crash.faults_from_env({crash.POINT_VAR: "after_efect"})
    with pytest.raises(crash.HarnessError, match="after_efect"):
        crash.kill_if("after_efect", {})
    crash.kill_if("after_effect", {crash.POINT_VAR: "after_intent"})  # another point: no kill


def test_a_recovery_that_hangs_is_a_harness_error(tmp_path: Path) -> None:
    """A process that does not finish in time gives no verdict (not a safe one): HarnessError."""
    sleep = [sys.executable, "-c", "import time; time.sleep(30)"]
    with pytest.raises(crash.HarnessError, match=r"did not finish within 0\.5 s"):
        crash.run_point(sleep, sleep, point="after_effect", effects=lambda: 0, timeout=0.5)


def test_a_host_script_runs_the_shared_command_line(tmp_path: Path) -> None:
    """``HostScript`` runs ``start DIR [--bare]`` killed and ``recover DIR [--bare]`` in an
    emptied directory per point, counts ``world.jsonl`` and reads needs_person from recover."""
    script = tmp_path / "echo_host.py"
    script.write_text(
        "import json, sys\n"
        "from pathlib import Path\n"
        "from effectflow.testing import crash\n"
        "mode, d = sys.argv[1], Path(sys.argv[2])\n"
        "bare = '--bare' in sys.argv\n"
        "with (d / 'world.jsonl').open('a') as fh:\n"
        "    fh.write(json.dumps({'key': mode}) + '\\n')\n"
        "if mode == 'start':\n"
        "    crash.kill_if('after_effect')\n"
        "print(json.dumps({'status': 'ok', 'needs_person': not bare}))\n",
        encoding="utf-8",
    )
    host = crash.HostScript(script)
    assert host.name == "echo_host"
    report = host.run_matrix(tmp_path / "run", bare=True, points=("after_effect", "after_intent"))
    assert report.label == "echo_host (alone)"
    assert [(r.point, r.killed, r.effects, r.needs_person) for r in report.results] == [
        ("after_effect", True, 2, False),
        ("after_intent", False, 2, False),
    ]
    [with_ef] = host.run_matrix(tmp_path / "run", points=("after_effect",)).results
    assert (with_ef.effects, with_ef.needs_person, with_ef.verdict) == (2, True, "duplicate")
    with pytest.raises(crash.HarnessError, match="no host script"):
        crash.HostScript(tmp_path / "missing.py").run_matrix(tmp_path / "run")
