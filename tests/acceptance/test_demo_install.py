"""`make demo` installs only what the demo needs, and that is enough: the Makefile's demo target
installs the ``demo`` extra (not ``dev``), and every scenario of ``effectflow demo`` runs, worker
subprocesses included, with every installed package outside the core and that extra made
unimportable."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
EFFECTFLOW = shutil.which("effectflow", path=str(Path(sys.executable).parent)) or "effectflow"
SCENARIOS = ["customer_case", "refund", "deploy", "agent"]

#: Installed in every process through PYTHONPATH: a module of a distribution outside the demo's
#: install raises ModuleNotFoundError, as it would where only the demo's install exists; each
#: process that has the guard says so, and each refusal is logged.
GUARD = """
import json, os, sys

_FOREIGN = frozenset(json.loads(os.environ["DEMO_GUARD_FOREIGN"]))
_LOG = os.environ["DEMO_GUARD_LOG"]


def _log(line):
    with open(_LOG, "a") as log:
        log.write(line + "\\n")


class _Guard:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in _FOREIGN:
            _log("blocked " + top)
            raise ModuleNotFoundError(f"No module named {top!r} (not in the demo's install)", name=top)
        return None


sys.meta_path.insert(0, _Guard)
_log(f"guarded {os.getpid()}")
"""


def _pip_installs(target: str, venv: Path) -> list[str]:
    """The ``pip install`` lines ``make TARGET`` would run for a fresh venv."""
    done = subprocess.run(
        ["make", "-n", target, f"VENV={venv}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    return [line for line in done.stdout.splitlines() if "pip install" in line]


def _demo_closure() -> set[str]:
    """The distributions the core dependencies and the ``demo`` extra pull in, transitively, as
    installed here (pyproject.toml for effectflow's own, the installed metadata below it)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["demo"]]
    todo = [(Requirement(r), "") for r in wanted]
    seen: set[tuple[str, frozenset[str]]] = set()
    closure = {"effectflow"}
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        key = (name, frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        closure.add(name)
        if name == "effectflow":  # a self-reference with extras: read from pyproject.toml
            extras = project["optional-dependencies"]
            todo += [(Requirement(r), "") for e in req.extras for r in extras[e]]
            continue
        for line in metadata.distribution(name).requires or []:
            sub = Requirement(line)
            if sub.marker is None:
                todo.append((sub, ""))
            else:
                todo += [(sub, e) for e in ("", *req.extras)]
    return closure


def _foreign_modules(closure: set[str]) -> set[str]:
    """Top-level modules that only distributions outside ``closure`` provide."""
    by_module = metadata.packages_distributions()
    return {
        module
        for module, dists in by_module.items()
        if not {canonicalize_name(d) for d in dists} & closure and module.isidentifier()
    }


def test_the_demo_target_installs_the_demo_extra_and_test_the_dev_one(tmp_path: Path) -> None:
    """On a fresh venv, make demo pip-installs -e '.[demo]' only; make test installs '.[dev]'."""
    demo = _pip_installs("demo", tmp_path / "venv")
    assert demo == [f"{tmp_path / 'venv'}/bin/python -m pip install --quiet -e '.[demo]'"]
    assert any("-e '.[dev]'" in line for line in _pip_installs("test", tmp_path / "venv"))
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    [self_ref] = [r for r in dev["optional-dependencies"]["dev"] if r.startswith("effectflow[")]
    assert "demo" in re.split(r"[\[\],]", self_ref)  # dev keeps everything the demo needs


@pytest.fixture(scope="module")
def guard(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment that runs a process with only the demo's install importable."""
    folder = tmp_path_factory.mktemp("guard")
    (folder / "sitecustomize.py").write_text(GUARD)
    foreign = _foreign_modules(_demo_closure())
    # The guard must have something to refuse here, or the demo runs would prove nothing.
    assert {"httpx", "starlette", "playwright", "mypy"} <= foreign
    return {
        **os.environ,
        "PYTHONPATH": str(folder),
        "DEMO_GUARD_FOREIGN": json.dumps(sorted(foreign)),
        "DEMO_GUARD_LOG": str(folder / "guard.log"),
    }


def _log(env: dict[str, str]) -> list[str]:
    log = Path(env["DEMO_GUARD_LOG"])
    return log.read_text().splitlines() if log.exists() else []


def test_the_guard_refuses_a_package_outside_the_demo_install(guard: dict[str, str]) -> None:
    """httpx is installed here, but under the guard importing it fails as on a demo-only install."""
    done = subprocess.run(
        [sys.executable, "-c", "import httpx"],
        capture_output=True,
        text=True,
        env=guard,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "not in the demo's install" in done.stderr


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_every_demo_scenario_runs_on_the_demo_install_alone(
    scenario: str, guard: dict[str, str], tmp_path: Path
) -> None:
    """Each scenario exits 0 with every package outside the core and the demo extra refused."""
    Path(guard["DEMO_GUARD_LOG"]).unlink(missing_ok=True)
    done = subprocess.run(
        [EFFECTFLOW, "demo", "--scenario", scenario, "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        env=guard,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    log = _log(guard)
    guarded = [line for line in log if line.startswith("guarded ")]
    # customer_case and agent SIGKILL a worker subprocess and recover in another: guarded too.
    assert len(guarded) >= (3 if scenario in ("customer_case", "agent") else 1), log
    assert (tmp_path / "effects.db").is_file()
