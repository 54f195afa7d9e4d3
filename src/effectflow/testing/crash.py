"""A crash harness any host can be pointed at: SIGKILL a real process at each window of the write
path, let the host recover the way its own docs say, and count the effects in the provider's own
record (docs/integrations/crash_harness.md).

The question it answers is the one a user of an agent framework or durable engine has: *after a
crash at the worst moment, and my host's own recovery, did my tool's effect happen exactly once?*
It does not take effectflow's word for it: the count comes from the outside world (a file the tool
appends to, a provider's table), and the kill is a real ``SIGKILL`` of a real process, so nothing
in the host gets to flush, roll back or say goodbye.

Two halves:

- **In the host process under test**, pass ``faults_from_env()`` to the runtime
  (``ef.Runtime(url, faults=crash.faults_from_env())``): it reads ``EFFECTFLOW_CRASH_POINT`` (and
  optionally ``EFFECTFLOW_CRASH_STEP``) and kills the process at that window of the write path. A
  host *without* effectflow (the control) calls ``kill_if("after_effect")`` right after its write.
- **In the test** (or a script), ``run_matrix(start, recover, effects=...)`` runs ``start`` once per
  point with the variable set, expects it to die, runs ``recover`` in a fresh process without it,
  and asks ``effects()`` how many effects the provider shows. Each point gets a verdict: ``once``,
  ``person asked`` (at most one effect, and a person is asked to decide), ``duplicate`` or
  ``lost``. ``CrashReport.assert_safe()`` fails naming every duplicate or lost point.

The four points are where a crash changes what recovery must do (docs/concepts.md#the-write-path):
before the intent is durable (nothing happened, nothing is known), after it (nothing was sent, but
the ledger says it may be), after the effect (it happened; nobody recorded it: the dangerous one),
after the outcome (it happened and is recorded; only the host's next step is lost).

``HostScript`` drives a script with the command line ``benchmarks/compare/hosts/*.py`` share
(``start DIR [--bare]``, ``recover DIR [--bare]``, effects as lines of ``DIR/world.jsonl``); that is
what ``effectflow bench --hosts`` runs.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from effectflow.contracts.lookup import Lookup
from effectflow.contracts.tool import Tool, tool
from effectflow.runtime.faults import FaultPlan, FaultPoint
from effectflow.runtime.runtime import Runtime

#: The four SIGKILL points, in the order a call passes them.
POINTS = ("before_intent", "after_intent", "after_effect", "after_outcome")
#: Each point's window of the write path.
FAULT_POINTS: Mapping[str, FaultPoint] = {
    "before_intent": FaultPoint.BEFORE_INTENT,
    "after_intent": FaultPoint.AFTER_INTENT,
    "after_effect": FaultPoint.AFTER_CALL_BEFORE_RECORD,
    "after_outcome": FaultPoint.AFTER_RECORD,
}
#: The variable that names the point the host process dies at.
POINT_VAR = "EFFECTFLOW_CRASH_POINT"
#: The variable that narrows it to one step id (default: the first step that reaches the point).
STEP_VAR = "EFFECTFLOW_CRASH_STEP"
#: The provider's record a ``HostScript`` keeps in its directory: one JSON line per effect.
WORLD_FILE = "world.jsonl"


class Verdict(enum.StrEnum):
    """What a crash at one point left, read from the provider's record (a ``str``: compares
    equal to its value)."""

    #: Exactly one effect, and nobody needed.
    ONCE = "once"
    #: At most one effect, and a person is asked to decide (what a call in doubt with no way to
    #: check must come to: a person, never a guess).
    PERSON_ASKED = "person asked"
    #: More than one effect: the host (or the setup) repeated the call.
    DUPLICATE = "duplicate"
    #: No effect, and nobody asked: the call was silently dropped.
    LOST = "lost"

    @property
    def safe(self) -> bool:
        """Whether the point passed (``once`` or ``person asked``)."""
        return self in (Verdict.ONCE, Verdict.PERSON_ASKED)


class HarnessError(RuntimeError):
    """The harness could not run a point at all (a process hung past its timeout, an unknown
    point, a missing script): no verdict exists, which is not the same as a safe one."""


def _point(point: str) -> str:
    if point not in FAULT_POINTS:
        raise HarnessError(f"unknown crash point {point!r}: one of {', '.join(POINTS)}")
    return point


def faults_from_env(environ: Mapping[str, str] | None = None) -> FaultPlan | None:
    """The plan that SIGKILLs this process at the point ``EFFECTFLOW_CRASH_POINT`` names (for the
    step ``EFFECTFLOW_CRASH_STEP`` names, or any step), or None when it is unset or empty.

    Read in the host process under test and passed to ``ef.Runtime(url, faults=...)``; the
    harness sets the variable only for the process it means to kill, so the recovering process
    (and production) runs with no plan at all.

    Raises:
        HarnessError: the variable names no known point (a typo must not run a crash-free test
            that looks like a pass).
    """
    env = os.environ if environ is None else environ
    point = env.get(POINT_VAR, "")
    if not point:
        return None
    step = env.get(STEP_VAR) or None
    return FaultPlan.kill_at(FAULT_POINTS[_point(point)], step)


def kill_if(point: str, environ: Mapping[str, str] | None = None) -> None:
    """SIGKILL this process if ``EFFECTFLOW_CRASH_POINT`` is ``point``.

    For a host *without* effectflow, which has no write path to kill in: its tool calls
    ``kill_if("after_effect")`` right after the write, so the bare host dies in the same window
    the effectflow one does.
    """
    env = os.environ if environ is None else environ
    if env.get(POINT_VAR) == _point(point):
        os.kill(os.getpid(), signal.SIGKILL)


def verdict(effects: int, needs_person: bool) -> Verdict:
    """The verdict for a count of effects: more than one is a duplicate whoever was asked; a
    person asked covers zero or one; otherwise exactly one is ``once`` and zero is ``lost``."""
    if effects > 1:
        return Verdict.DUPLICATE
    if needs_person:
        return Verdict.PERSON_ASKED
    return Verdict.ONCE if effects == 1 else Verdict.LOST


@dataclasses.dataclass(frozen=True)
class PointResult:
    """What one crash at one point left."""

    #: The point the start process was told to die at.
    point: str
    #: Whether it really died by SIGKILL (False: the point was never reached, so this result
    #: proves nothing about that window).
    killed: bool
    #: How many effects the provider's own record shows after recovery.
    effects: int
    #: The recovering process's exit code.
    recover_rc: int
    #: What it printed (a ``HostScript`` prints one JSON line).
    recover_stdout: str
    #: Whether a person is now asked to decide.
    needs_person: bool
    #: The verdict (``verdict(effects, needs_person)``).
    verdict: Verdict
    #: The start process's exit code (``-SIGKILL`` when killed).
    start_rc: int = 0
    #: The start process's stderr (why it did not die where it was told to).
    start_stderr: str = ""
    #: The recovering process's stderr (why a recovery failed).
    recover_stderr: str = ""

    @property
    def safe(self) -> bool:
        """Whether the point passed."""
        return self.verdict.safe


def _env(env: Mapping[str, str] | None) -> dict[str, str]:
    """The environment both processes start from: ours, with ``env`` over it and no crash
    variables left over from a parent that was itself under test."""
    merged = {**os.environ, **(env or {})}
    merged.pop(POINT_VAR, None)
    merged.pop(STEP_VAR, None)
    return merged


def _run(
    argv: Sequence[str], env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            list(argv), env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise HarnessError(f"{' '.join(argv)} did not finish within {timeout} s") from exc
    except OSError as exc:
        raise HarnessError(f"cannot run {' '.join(argv)}: {exc}") from exc


def reported_needs_person(stdout: str) -> bool:
    """The ``needs_person`` of the last JSON object line of a recovery's stdout (False without
    one): what a ``HostScript``'s ``recover`` reports."""
    for line in reversed(stdout.splitlines()):
        try:
            out = json.loads(line)
        except ValueError:
            continue
        if isinstance(out, dict):
            return out.get("needs_person") is True
    return False


def ledger_needs_person(url: str, *, tenant: str = "default") -> Callable[[], bool]:
    """A ``needs_person`` for ``run_point``: whether the ledger at ``url`` has anything in its
    attention queue after recovery (an effect in doubt, an interrupted call nobody settles, an
    approval) — where effectflow asks a person, whether or not the host itself asked anyone
    (docs/concepts.md#no-effect-out-of-sight)."""

    def check() -> bool:
        with Runtime(url, tenant=tenant) as rt:
            return bool(rt.attention())

    return check


def run_point(
    start: Sequence[str],
    recover: Sequence[str],
    *,
    point: str,
    effects: Callable[[], int],
    env: Mapping[str, str] | None = None,
    timeout: float = 60.0,
    needs_person: Callable[[], bool] | None = None,
    step: str | None = None,
) -> PointResult:
    """Kill ``start`` at ``point``, run ``recover``, and judge what the world shows.

    ``start`` runs with ``EFFECTFLOW_CRASH_POINT=point`` (and ``EFFECTFLOW_CRASH_STEP=step``) over
    the current environment plus ``env``; whether it died by SIGKILL is recorded, not required.
    ``recover`` runs after it in a fresh process without the crash variables: the host's own
    recovery. ``effects()`` then counts the effects in the provider's own record, and
    ``needs_person()`` says whether a person is asked (default: the ``needs_person`` field of the
    JSON line ``recover`` printed).

    Raises:
        HarnessError: a process did not finish within ``timeout`` seconds, or could not start.
    """
    base = _env(env)
    crash_env = {**base, POINT_VAR: _point(point)}
    if step is not None:
        crash_env[STEP_VAR] = step
    started = _run(start, crash_env, timeout)
    recovered = _run(recover, base, timeout)
    count = effects()
    asked = needs_person() if needs_person is not None else reported_needs_person(recovered.stdout)
    return PointResult(
        point=point,
        killed=started.returncode == -signal.SIGKILL,
        effects=count,
        recover_rc=recovered.returncode,
        recover_stdout=recovered.stdout,
        needs_person=asked,
        verdict=verdict(count, asked),
        start_rc=started.returncode,
        start_stderr=started.stderr,
        recover_stderr=recovered.stderr,
    )


@dataclasses.dataclass(frozen=True)
class CrashReport:
    """The results of one crash matrix, one per point, in the order run."""

    #: One result per point.
    results: tuple[PointResult, ...]
    #: What was tested (a host's name and variant), for the table's title and messages.
    label: str = ""

    @property
    def safe(self) -> bool:
        """Whether every point passed."""
        return all(r.safe for r in self.results)

    def verdicts(self) -> dict[str, Verdict]:
        """Each point's verdict."""
        return {r.point: r.verdict for r in self.results}

    def assert_safe(self, *, require_killed: bool = False) -> None:
        """Fail naming every point whose verdict is ``duplicate`` or ``lost`` (and, with
        ``require_killed``, every point whose start process was never killed: a point that was
        never reached proves nothing about its window).

        Raises:
            AssertionError: with the table and the failing points' recovery output.
        """
        bad = [r for r in self.results if not r.safe or (require_killed and not r.killed)]
        if not bad:
            return
        named = ", ".join(
            f"{r.point} ({r.verdict.value}{'' if r.killed else ', never killed'})" for r in bad
        )
        lines = [f"{self.label or 'crash matrix'}: unsafe at {named}", self.table()]
        for r in bad:
            detail = (r.recover_stderr or r.start_stderr).strip().splitlines()[-5:]
            lines.append(
                f"{r.point}: recover rc={r.recover_rc} stdout={r.recover_stdout.strip()!r}"
            )
            lines.extend(f"  {line}" for line in detail)
        raise AssertionError("\n".join(lines))

    def table(self) -> str:
        """A plain-text table: point, killed, effects, person asked, verdict."""
        header = ("point", "killed", "effects", "person asked", "verdict")
        rows = [
            (r.point, _yes(r.killed), str(r.effects), _yes(r.needs_person), r.verdict.value)
            for r in self.results
        ]
        widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]
        out = [f"{self.label}"] if self.label else []
        for row in (header, *rows):
            out.append(
                "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            )
        return "\n".join(out)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def run_matrix(
    start: Sequence[str],
    recover: Sequence[str],
    *,
    effects: Callable[[], int],
    points: Iterable[str] = POINTS,
    reset: Callable[[], None] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 60.0,
    needs_person: Callable[[], bool] | None = None,
    step: str | None = None,
    label: str = "",
) -> CrashReport:
    """``run_point`` at each of ``points``, calling ``reset()`` before each so every point starts
    from a clean world and ledger (without it the points share one: the second point would see
    the first one's effect)."""
    results = []
    for point in points:
        if reset is not None:
            reset()
        results.append(
            run_point(
                start,
                recover,
                point=point,
                effects=effects,
                env=env,
                timeout=timeout,
                needs_person=needs_person,
                step=step,
            )
        )
    return CrashReport(tuple(results), label)


def count_lines(path: Path) -> int:
    """The number of non-empty lines of ``path`` (0 when it does not exist): the effects of a
    provider that appends one line per effect."""
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())


class FileWorld:
    """The outside world of a host script: a file (``DIR/world.jsonl``), one JSON line
    ``{"key": ..., "text": ...}`` per effect, and the guarded tool that appends to it with its
    lookup (the file searched for the call's key). Declared at import under names of the script's
    own, since tools live in one registry by name; ``main`` points ``file`` at its directory. The
    host alone (the control) appends with ``append`` and a key of its own."""

    def __init__(self, tool_name: str, lookup_name: str) -> None:
        self.file = Path(WORLD_FILE)
        self.find_line: Tool[..., Lookup] = tool(lookup_name, effect="read")(self._find)
        self.append_line: Tool[..., dict[str, Any]] = tool(
            tool_name,
            effect="external_write",
            confirm=self.find_line,
            effect_id="key",
            settles_within=0,
        )(self._append_line)

    def lines(self) -> list[dict[str, Any]]:
        """What the world holds, in order."""
        if not self.file.exists():
            return []
        return [json.loads(line) for line in self.file.read_text(encoding="utf-8").splitlines()]

    def append(self, text: str, key: str) -> dict[str, Any]:
        """Make the effect: one line under ``key``."""
        record = {"key": key, "text": text}
        with self.file.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        return record

    def _find(self, *, idempotency_key: str) -> Lookup:
        """The lookup: the file is the provider's own record, searched for the call's key."""
        for record in self.lines():
            if record["key"] == idempotency_key:
                return Lookup.confirmed(external_effect_id=idempotency_key, result=record)
        return Lookup.not_committed()

    def _append_line(self, text: str, *, idempotency_key: str) -> dict[str, Any]:
        """Append one line to the file."""
        return self.append(text, idempotency_key)


@dataclasses.dataclass(frozen=True)
class HostScript:
    """A host script of the shared command line, as ``effectflow bench --hosts`` runs it.

    ``python SCRIPT start DIR [--bare]`` runs one agent or workflow turn whose tool appends one
    JSON line to ``DIR/world.jsonl``; ``--bare`` is the host alone (its tool calls
    ``kill_if("after_effect")`` after the append), without it the host goes through effectflow
    with ``faults_from_env()`` and its ledger in DIR. ``python SCRIPT recover DIR [--bare]`` is the
    host's own recovery in a fresh process; it prints ``{"status": ..., "needs_person": ...}``.
    """

    #: The script.
    path: Path
    #: The interpreter that runs it.
    python: str = sys.executable

    @property
    def name(self) -> str:
        """The host's name: the script's file name without ``.py``."""
        return self.path.stem

    def start(self, directory: Path, *, bare: bool = False) -> list[str]:
        """The argv of one turn in ``directory``."""
        return self._argv("start", directory, bare)

    def recover(self, directory: Path, *, bare: bool = False) -> list[str]:
        """The argv of the host's own recovery in ``directory``."""
        return self._argv("recover", directory, bare)

    def _argv(self, mode: str, directory: Path, bare: bool) -> list[str]:
        # -P: the hosts' folder holds scripts named like the packages they drive (dbos.py,
        # langgraph.py); it must not come first on sys.path, or `import dbos` imports the script.
        flag = ["--bare"] if bare else []
        return [self.python, "-P", str(self.path), mode, str(directory), *flag]

    def run_matrix(
        self,
        directory: Path,
        *,
        bare: bool = False,
        points: Iterable[str] = POINTS,
        timeout: float = 60.0,
        env: Mapping[str, str] | None = None,
    ) -> CrashReport:
        """The crash matrix of this host, each point in an emptied ``directory`` (world,
        ledger and the host's own checkpoints all live there)."""
        if not self.path.is_file():
            raise HarnessError(f"no host script at {self.path}")

        def reset() -> None:
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)

        return run_matrix(
            self.start(directory, bare=bare),
            self.recover(directory, bare=bare),
            effects=lambda: count_lines(directory / WORLD_FILE),
            points=points,
            reset=reset,
            env=env,
            timeout=timeout,
            label=f"{self.name} ({'alone' if bare else 'with effectflow'})",
        )
