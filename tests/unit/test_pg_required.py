"""Where PostgreSQL must run (CI), a missing server fails the suite instead of skipping half of it.

``EFFECTFLOW_REQUIRE_PG`` (set by ``.ci/run`` and by ``make test`` under ``CI=true``) turns every
"PostgreSQL not reachable" skip into a failure; without it a developer's machine without a server
still runs the SQLite half. The probes below run pytest in a subprocess on a test that asks for the
root conftest's fixtures, pointed at a port where nothing listens.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ledgers

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
#: A server URL where nothing answers (port 1 on loopback: refused at once).
NOWHERE = "postgresql://postgres@127.0.0.1:1/postgres"

PROBE = """
def test_on_every_backend(any_ledger):
    assert any_ledger


def test_with_a_database(pg_url):
    assert pg_url
"""


def _pytest(folder: Path, **env: str) -> subprocess.CompletedProcess[str]:
    (folder / "test_probe.py").write_text(PROBE)
    environ = {k: v for k, v in os.environ.items() if k != ledgers.REQUIRE_PG}
    # No plugin autoload: the probe needs none of the installed ones, and each costs start-up time.
    environ.update(
        EFFECTFLOW_TEST_PG=NOWHERE,
        PYTHONPATH=str(TESTS),
        PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
        **env,
    )
    return subprocess.run(
        # -p conftest: the root conftest (on PYTHONPATH) as a plugin, so the probe gets its fixtures.
        [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q", "-rs"],
        cwd=folder,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("value", [None, "", "0"])
def test_without_the_variable_an_unreachable_server_skips_the_postgres_tests(
    tmp_path: Path, value: str | None
) -> None:
    """Unset, empty or 0: the SQLite half passes, the PostgreSQL half skips saying why, and pytest
    exits 0."""
    done = _pytest(tmp_path, **({} if value is None else {ledgers.REQUIRE_PG: value}))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed, 2 skipped" in done.stdout
    assert f"PostgreSQL not reachable at {NOWHERE}" in done.stdout


@pytest.mark.parametrize("value", ["1", "true"])
def test_with_the_variable_an_unreachable_server_fails_the_postgres_tests(
    tmp_path: Path, value: str
) -> None:
    """Set (to anything but 0): the same tests fail, naming the server and the variable."""
    done = _pytest(tmp_path, **{ledgers.REQUIRE_PG: value})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 passed, 2 errors" in done.stdout
    assert f"PostgreSQL not reachable at {NOWHERE}" in done.stdout
    assert "EFFECTFLOW_REQUIRE_PG is set: the PostgreSQL tests must run" in done.stdout


def test_no_test_skips_for_a_missing_postgresql_on_its_own() -> None:
    """Every skip for a missing server goes through ``ledgers.pg_missing``, so the variable
    reaches it: no other ``pytest.skip`` in the tests mentions PostgreSQL."""
    offenders = []
    for path in sorted(TESTS.rglob("*.py")):
        if path == TESTS / "ledgers.py":
            continue
        source = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(source)):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "skip"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "pytest"
            ):
                call = ast.get_source_segment(source, node) or ""
                if "postgres" in call.lower() or "psycopg" in call.lower():
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert offenders == []


def test_ci_run_stops_when_postgresql_does_not_answer(tmp_path: Path) -> None:
    """``.ci/run`` exits non-zero, saying so, before any test when its server does not answer (a
    server named by EFFECTFLOW_TEST_PG: the script starts only the local cluster)."""
    environ = {**os.environ, "EFFECTFLOW_TEST_PG": NOWHERE, "PG_WAIT_S": "1"}
    done = subprocess.run(
        ["bash", str(REPO / ".ci" / "run")],
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        f"PostgreSQL is not accepting connections at {NOWHERE}" in done.stderr
        or "pg_isready not found" in done.stderr
    )
