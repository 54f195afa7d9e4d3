"""A real LangGraph worker is SIGKILLed inside its tool, right after the outside world changed; a
fresh process resumes the graph from its ``SqliteSaver`` checkpoint (issue 13).

LangGraph alone re-runs the tool (two lines in the file) in both durability modes: with
``durability="sync"`` the checkpoint holds the model's tool call and the tool node runs again; with
``"async"`` (LangGraph's default) the model's turn may be lost, the model is asked again, and its
fresh tool-call id makes a new call. With ``EffectflowMiddleware`` the file holds one line either
way: the same tool-call id is answered by the ledger's intent and the lookup, and a regenerated one
is deduplicated against the first call (or held for a person while the first is in doubt).

The model issues a fresh uuid tool-call id each time it is asked, as a real one does, so nothing
here relies on ids that repeat across processes.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import effectflow as ef

CHILD = Path(__file__).with_name("lg_crash_child.py")
#: The crashing process's store takes this long to save the model's turn (``--slow-checkpoints``):
#: with ``durability="async"`` the turn is then surely lost when the tool kills the process.
SLOW_STORE_S = 0.5


def _child(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHILD), *args], capture_output=True, text=True, timeout=60, check=False
    )


def _crash_and_resume(
    directory: Path, durability: str, *flags: str, slow: bool = False, resume: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Kill a worker inside the tool, resume in a fresh process; what the resume saw."""
    crash_flags = [*flags, "--slow-checkpoints", str(SLOW_STORE_S)] if slow else list(flags)
    killed = _child("crash", str(directory), "--durability", durability, *crash_flags)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert _lines(directory) == 1, "the kill comes right after the append"
    resumed = _child("resume", str(directory), "--durability", durability, *flags, *resume)
    assert resumed.returncode == 0, resumed.stderr
    out: dict[str, Any] = json.loads(resumed.stdout)
    assert out["lines"] == _lines(directory)
    return out


def _lines(directory: Path) -> int:
    path = directory / "world.txt"
    return len(path.read_text(encoding="utf-8").splitlines()) if path.exists() else 0


def _first_line(directory: Path) -> dict[str, Any]:
    first: dict[str, Any] = json.loads((directory / "world.txt").read_text().splitlines()[0])
    return first


@pytest.mark.parametrize(
    ("durability", "slow"),
    [("sync", False), ("async", False), ("async", True)],
    ids=["sync", "async", "async-lost-turn"],
)
def test_langgraph_alone_writes_the_line_twice(tmp_path: Path, durability: str, slow: bool) -> None:
    """The control: the setup reproduces the duplicate. Resumed from its checkpoint, the graph runs
    the tool again, for the call the checkpoint kept or for the one the model was asked again for."""
    out = _crash_and_resume(tmp_path, durability, slow=slow)
    assert out["lines"] == 2
    assert len(out["tool_calls"]) == 1
    if durability == "sync":
        # The checkpoint holds the model's turn: the same tool call is run a second time.
        assert out["saved_calls"] == out["asked"][:1] == out["tool_calls"]
    if slow:
        # The model's turn was lost: asked again, a fresh id, a second line.
        assert out["saved_calls"] == []
        assert len(out["asked"]) == 2
        assert out["tool_calls"] == out["asked"][1:]


@pytest.mark.parametrize("durability", ["sync", "async"])
def test_with_the_middleware_the_line_is_written_once(tmp_path: Path, durability: str) -> None:
    """The same crash with ``EffectflowMiddleware``: the resumed tool call is answered from the
    ledger (its intent was recorded; the lookup finds the line by key) and the agent finishes."""
    out = _crash_and_resume(tmp_path, durability, "--effectflow")
    assert out["lines"] == 1
    line = _first_line(tmp_path)
    if out["saved_calls"]:
        # The checkpoint kept the model's turn (always with "sync"; with "async" when the
        # background save won the race, the usual case here): the same tool-call id.
        assert out["tool_calls"] == out["saved_calls"] == out["asked"][:1]
        assert out["tool_messages"] == [{"status": "done", "happened": True, "result": line}]
        assert out["answer"].startswith("tool said:")
    else:
        # "async" lost the turn: the regenerated call is the first one's operation (the test
        # below makes this certain), settled by its lookup and answered as already done.
        assert durability == "async"
        assert out["interrupts"] == []
        assert [m["status"] for m in out["tool_messages"]] == ["already_done"]
    with ef.Runtime(f"sqlite:///{tmp_path / 'ledger.db'}") as rt:
        [effect] = rt.effects()
        if out["saved_calls"]:
            [run] = rt.runs()
            assert run.status is ef.RunStatus.SUCCEEDED
            assert run.input["call_id"] == out["asked"][0]
            assert effect.status is ef.StepStatus.CONFIRMED
            assert effect.external_effect_id == line["id"]


@pytest.mark.parametrize(
    "resume",
    [("--recover",), ("--settle",)],
    ids=["recover-then-resume", "resume-directly"],
)
def test_a_call_regenerated_after_a_lost_turn_is_not_written_again(
    tmp_path: Path, resume: tuple[str, ...]
) -> None:
    """``durability="async"`` lost the model's turn: the resumed graph asks the model again and
    gets a new tool-call id for the same line. effectflow takes it for the same operation as the
    first call and never writes again. With ``rt.recover()`` first, the lookup has confirmed the
    first call and the regenerated one answers ``already_done``. Resumed directly, the first call
    is still in doubt: the guard takes its run over (its host is dead), settles it through its
    lookup and answers ``already_done`` at once — nobody is interrupted."""
    out = _crash_and_resume(tmp_path, "async", "--effectflow", slow=True, resume=resume)
    assert out["lines"] == 1
    assert out["saved_calls"] == []
    first, regenerated = out["asked"]
    assert out["interrupts"] == []
    if resume == ("--recover",):
        assert out["recovered"] == ["succeeded"]
    else:
        assert out["recovered"] == [], "the guard settled the first call itself"
    assert not out["still_interrupted"]
    assert out["tool_calls"] == [regenerated]
    [message] = out["tool_messages"]
    assert message["status"] == "already_done"
    assert message["result"] == _first_line(tmp_path)
    with ef.Runtime(f"sqlite:///{tmp_path / 'ledger.db'}") as rt:
        calls = {r.input["call_id"]: r.status for r in rt.runs()}
        assert calls == {first: ef.RunStatus.SUCCEEDED, regenerated: ef.RunStatus.SUCCEEDED}
        # One effect in the ledger, the first call's, found by the lookup; the regenerated
        # call's run answers with it.
        [effect] = rt.effects()
        assert effect.status is ef.StepStatus.CONFIRMED
        assert effect.external_effect_id == _first_line(tmp_path)["id"]
        assert effect.run_id == next(r.run_id for r in rt.runs() if r.input["call_id"] == first)
