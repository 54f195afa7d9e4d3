"""``effectflow migrate``: a version-10 ledger (the fixture of test_upgrade_v11) on both backends
is reported, unchanged, by ``--check``, then migrated; a newer ledger is refused untouched; a
missing SQLite file is not created by ``--check``."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from test_upgrade_v8 import KEY, ledger_at, raw
from test_upgrade_v11 import FIXTURE
from typer.testing import CliRunner

import effectflow as ef
import ledgers
from effectflow.cli import main as cli_main
from effectflow.ledger import audit


@pytest.fixture(params=ledgers.BACKENDS)
def v10(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    monkeypatch.setenv(audit.KEY_ENV, KEY)
    with ledger_at(request.param, tmp_path, 10, FIXTURE) as url:
        yield url


def _migrate(url: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli_main.app, ["migrate", "--db", url, *args])
    return result.exit_code, result.output


def test_check_reports_what_opening_would_apply_and_changes_nothing_then_migrate_applies_it(
    v10: str,
) -> None:
    code, out = _migrate(v10, "--check")
    assert code == 1, out
    assert "at version 10; opening it would apply 11 (0011_step_arguments)" in out
    assert raw(v10, "SELECT max(version) FROM schema_migrations") == [(10,)]
    code, out = _migrate(v10, "--check", "--json")
    assert code == 1
    assert json.loads(out)["pending"] == [11]

    code, out = _migrate(v10)
    assert code == 0, out
    assert "migrated from version 10 to version 11 (applied 11 (0011_step_arguments))" in out
    assert raw(v10, "SELECT max(version) FROM schema_migrations") == [(11,)]
    code, out = _migrate(v10, "--check")
    assert (code, "at schema version 11, this effectflow's newest" in out) == (0, True)
    with ef.Runtime(v10) as rt:
        assert rt.verify_audit() == []


def test_a_ledger_newer_than_the_code_is_refused_untouched(v10: str) -> None:
    """Both with and without --check: exit 2, saying to upgrade effectflow; nothing applied."""
    if v10.startswith("sqlite"):
        conn = sqlite3.connect(v10.removeprefix("sqlite:///"))
        conn.execute("INSERT INTO schema_migrations VALUES (99, '0099_future', 0)")
        conn.commit()
        conn.close()
    else:
        with psycopg.connect(v10, autocommit=True) as pg:
            pg.execute("INSERT INTO schema_migrations VALUES (99, '0099_future', 0)")
    for args in (["--check"], []):
        code, out = _migrate(v10, *args)
        assert code == 2, out
        assert "newer than this effectflow's 11: upgrade effectflow" in out
    assert raw(v10, "SELECT version FROM schema_migrations WHERE version = 11") == []


def test_check_creates_no_ledger_and_refuses_another_application_s_file(tmp_path: Path) -> None:
    missing = tmp_path / "none.db"
    code, out = _migrate(f"sqlite:///{missing}", "--check")
    assert code == 1, out
    assert "no ledger yet; opening it would apply 1 (0001_initial)" in out
    assert not missing.exists()
    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE invoices (id INTEGER)")
    conn.commit()
    conn.close()
    for args in (["--check"], []):
        code, out = _migrate(f"sqlite:///{other}", *args)
        assert code == 2, out
        assert "another application" in out
