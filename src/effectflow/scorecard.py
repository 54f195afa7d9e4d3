"""The hosts' crash scorecard: ``effectflow bench --hosts`` and ``benchmarks/compare/hosts_scorecard.py``.

Each host script of ``benchmarks/compare/hosts/`` (a host alone, or the host with effectflow, on the
command line ``start|recover DIR [--bare]``) is run through ``effectflow.testing.crash``: SIGKILLed
right after its effect, recovered by the host's own means in a fresh process, N trials, with the
writes the provider's own record shows counted per trial; with effectflow also at the other three
points of the write path (docs/integrations/crash_harness.md). ``effectflow.bench`` measures what
effectflow costs; this says what it buys.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from effectflow.testing import crash

#: Where the host scripts of the crash harness live, relative to a checkout of the repository.
HOSTS_SUBDIR = Path("benchmarks") / "compare" / "hosts"
#: The point the scorecard compares a host alone with the host + effectflow at: the effect
#: happened and nobody recorded it.
SCORED_POINT = "after_effect"


class ScorecardError(ValueError):
    """The scorecard cannot start: no hosts folder, or a host asked for that is not in it."""


def find_hosts_dir(start: Path | None = None) -> Path:
    """The ``benchmarks/compare/hosts`` folder of the checkout that holds ``start`` (default: the
    working directory) or holds this package (an editable install).

    Raises:
        ScorecardError: no such folder in either place; the message says where it looked, since
            an installed package carries no host scripts.
    """
    here = (start or Path.cwd()).resolve()
    looked = [folder / HOSTS_SUBDIR for folder in (here, *here.parents)]
    # src/effectflow/bench.py in a checkout: the repository is two folders above the package.
    looked.append(Path(__file__).resolve().parents[2] / HOSTS_SUBDIR)
    for candidate in looked:
        if candidate.is_dir():
            return candidate
    raise ScorecardError(
        f"no {HOSTS_SUBDIR}/ folder in {here}, its parents, or beside this package "
        f"({looked[-1].parent}); the host scripts ship with the effectflow repository, not the "
        "package: run from a checkout, or give --hosts-dir"
    )


def host_scripts(directory: Path, names: Iterable[str] | None = None) -> list[crash.HostScript]:
    """The host scripts in ``directory`` (every ``*.py`` not starting with ``_``), by name, or
    only those ``names``.

    Raises:
        ScorecardError: ``directory`` is not a folder, holds no script, or lacks a named host.
    """
    if not directory.is_dir():
        raise ScorecardError(f"hosts folder {directory} does not exist or is not a folder")
    found = {p.stem: crash.HostScript(p) for p in sorted(directory.glob("*.py"))}
    found = {name: script for name, script in found.items() if not name.startswith("_")}
    if not found:
        raise ScorecardError(f"no host scripts (*.py) in {directory}")
    if names is None:
        return list(found.values())
    wanted = [n.strip() for n in names if n.strip()]
    missing = [n for n in wanted if n not in found]
    if missing:
        raise ScorecardError(
            f"no host {', '.join(missing)} in {directory}; there: {', '.join(found)}"
        )
    return [found[n] for n in wanted]


@dataclasses.dataclass(frozen=True)
class Trials:
    """One host variant crashed at one point, trial after trial."""

    #: The point.
    point: str
    #: One result per trial.
    results: tuple[crash.PointResult, ...]

    @property
    def writes(self) -> list[int]:
        """The effects the provider's record showed after each trial."""
        return [r.effects for r in self.results]

    @property
    def killed(self) -> int:
        """How many trials really died at the point."""
        return sum(r.killed for r in self.results)

    @property
    def failed_recoveries(self) -> int:
        """How many recoveries exited non-zero (their verdicts are still counted)."""
        return sum(r.recover_rc != 0 for r in self.results)

    def summary(self) -> str:
        """The verdicts counted (``duplicate x5``), and any recovery that failed."""
        counts: dict[str, int] = {}
        for r in self.results:
            counts[r.verdict.value] = counts.get(r.verdict.value, 0) + 1
        parts = [f"{verdict} x{n}" for verdict, n in counts.items()]
        if self.failed_recoveries:
            parts.append(f"recovery failed x{self.failed_recoveries}")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        last_failure = next(
            (r.recover_stderr.strip()[-2000:] for r in self.results if r.recover_rc), None
        )
        return {
            "point": self.point,
            "writes": self.writes,
            "verdicts": [r.verdict.value for r in self.results],
            "killed": self.killed,
            "needs_person": [r.needs_person for r in self.results],
            "failed_recoveries": self.failed_recoveries,
            "last_failure": last_failure,
        }


@dataclasses.dataclass(frozen=True)
class HostScore:
    """One host's scorecard: alone and with effectflow at ``SCORED_POINT``, and effectflow at the
    other points."""

    #: The host's name (its script's file name).
    host: str
    #: The script.
    script: Path
    #: Trials per point.
    trials: int
    #: The host alone (``--bare``) at ``SCORED_POINT``.
    alone: Trials
    #: The host + effectflow at each point, ``SCORED_POINT`` first.
    effectflow: dict[str, Trials]
    #: Why the host could not be scored to the end (a process hung, a script that would not run).
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view."""
        return {
            "host": self.host,
            "script": str(self.script),
            "trials": self.trials,
            "point": SCORED_POINT,
            "alone": self.alone.to_dict(),
            "effectflow": {point: t.to_dict() for point, t in self.effectflow.items()},
            "error": self.error,
        }


def score_host(
    script: crash.HostScript,
    *,
    trials: int,
    workdir: Path,
    timeout: float = 120.0,
    on_trial: Callable[[str, str], None] | None = None,
) -> HostScore:
    """Crash ``script`` ``trials`` times at each point: alone at ``SCORED_POINT`` and with
    effectflow at every point, the variants interleaved trial by trial so a machine that slows
    down mid-way slows both. ``on_trial(host, what)`` hears of each crash before it runs."""
    if trials < 1:
        raise ValueError("trials must be at least 1")
    points = (SCORED_POINT, *(p for p in crash.POINTS if p != SCORED_POINT))
    alone: list[crash.PointResult] = []
    with_ef: dict[str, list[crash.PointResult]] = {p: [] for p in points}
    error = None
    try:
        for _ in range(trials):
            for point, bare in [(SCORED_POINT, True), *((p, False) for p in points)]:
                if on_trial is not None:
                    on_trial(script.name, f"{'alone' if bare else 'effectflow'} at {point}")
                report = script.run_matrix(
                    workdir / script.name, bare=bare, points=(point,), timeout=timeout
                )
                (alone if bare else with_ef[point]).extend(report.results)
    except crash.HarnessError as exc:
        error = str(exc)
    return HostScore(
        host=script.name,
        script=script.path,
        trials=trials,
        alone=Trials(SCORED_POINT, tuple(alone)),
        effectflow={p: Trials(p, tuple(r)) for p, r in with_ef.items()},
        error=error,
    )


def scorecard(
    directory: Path,
    *,
    trials: int = 5,
    hosts: Iterable[str] | None = None,
    timeout: float = 120.0,
    on_trial: Callable[[str, str], None] | None = None,
) -> list[HostScore]:
    """Every host script in ``directory`` (or the named ``hosts``) scored, in a temporary folder
    that is removed afterwards.

    Raises:
        ScorecardError: see ``host_scripts``.
    """
    scripts = host_scripts(directory, hosts)
    workdir = Path(tempfile.mkdtemp(prefix="effectflow-hosts-"))
    try:
        return [
            score_host(s, trials=trials, workdir=workdir, timeout=timeout, on_trial=on_trial)
            for s in scripts
        ]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def scorecard_text(scores: Iterable[HostScore]) -> str:
    """The scorecard as plain text: per host, writes per trial of the host alone and of the host +
    effectflow at ``SCORED_POINT``, then effectflow's at the other points."""
    blocks = []
    for score in scores:
        rows = [("", "writes per trial", "killed", "verdicts")]
        variants = [
            ("host alone", score.alone),
            ("host + effectflow", score.effectflow[SCORED_POINT]),
        ]
        others = [(f"  {p}", t) for p, t in score.effectflow.items() if p != SCORED_POINT]
        for label, trials in [*variants, ("effectflow at the other points:", None), *others]:
            if trials is None:
                rows.append((label, "", "", ""))
                continue
            writes = " ".join(str(w) for w in trials.writes) or "-"
            killed = f"{trials.killed}/{len(trials.results)}"
            rows.append((label, writes, killed, trials.summary()))
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        lines = [
            f"{score.host} ({_shown(score.script)}): SIGKILL at {SCORED_POINT}, then the host's "
            f"own recovery in a fresh process; trials per point: {score.trials}"
        ]
        for row in rows:
            lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if score.error:
            lines.append(f"stopped early: {score.error}")
        if score.trials < 5:
            lines.append("fewer than 5 trials: a smoke run, not a figure to publish")
        blocks.append("\n".join(lines))
    caption = (
        "writes = lines in the provider's own record (world.jsonl) after recovery; killed = trials "
        "that really died at the point (a host alone has only the one point to die at)."
    )
    return "\n\n".join([*blocks, caption])


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it is inside it (a checkout's paths)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
