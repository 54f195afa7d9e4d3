"""Ledger URLs: a malformed one is refused with what was given and the forms that work, before
anything is created on disk; the forms that work open the file they name."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from effectflow import errors
from effectflow.ledger.store import open_store

EFFECTFLOW = shutil.which("effectflow", path=str(Path(sys.executable).parent)) or "effectflow"
FORMS = "sqlite:///relative/path.db, sqlite:////absolute/path.db or postgresql://user@host:5432/db"

MALFORMED = [
    # Two slashes: the file's name is in the host's place (it used to open ./relative.db).
    ("sqlite://relative.db", "two slashes make 'relative.db' a host"),
    ("sqlite://sub/relative.db", "a relative path is sqlite:///sub/relative.db"),
    ("file://relative.db", "two slashes make 'relative.db' a host"),
    # One slash or none: no URL at all (it used to be a file inside a folder named "sqlite:").
    ("sqlite:/x.db", "is not a ledger URL"),
    ("sqlite:x.db", "is not a ledger URL"),
    ("postgresql:/db", "is not a ledger URL"),
    # Schemes no backend has.
    ("sqlite3:///x.db", "unknown ledger URL scheme 'sqlite3'"),
    ("postgres+psycopg://user@host/db", "unknown ledger URL scheme 'postgres+psycopg'"),
    ("mysql://user@host/db", "unknown ledger URL scheme 'mysql'"),
    # No file named.
    ("sqlite:///", "no database file"),
    ("sqlite://", "no database file"),
    ("sqlite:////", "no database file"),
    ("sqlite:///sub/", "no database file"),
    ("", "no ledger given"),
]


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize(("url", "says"), MALFORMED)
def test_a_malformed_url_is_refused_with_the_right_forms_and_creates_nothing(
    url: str, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """open_store refuses the URL naming it and the working forms, and no file or folder appears."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(errors.ContractError) as refused:
        open_store(url)
    message = refused.value.message
    assert says in message
    assert FORMS in message
    if url:
        assert repr(url) in message
    assert _tree(tmp_path) == []


@pytest.mark.parametrize(
    ("url", "where"),
    [
        ("sqlite:///effects.db", "effects.db"),
        ("sqlite:///sub/effects.db?synchronous=normal", "sub/effects.db"),
        ("effects.db", "effects.db"),
        ("file:///effects.db", "effects.db"),
    ],
)
def test_a_relative_form_opens_the_file_it_names(
    url: str, where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three slashes (or a plain path) open a ledger at that path under the current directory."""
    monkeypatch.chdir(tmp_path)
    open_store(url).close()
    with sqlite3.connect(tmp_path / where) as conn:
        tables = {n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"runs", "steps", "audit"} <= tables


def test_four_slashes_open_an_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sqlite://// + an absolute path opens that file, wherever the process runs."""
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    open_store(f"sqlite:///{tmp_path / 'abs.db'}").close()
    assert (tmp_path / "abs.db").is_file()
    assert _tree(elsewhere) == []


def test_the_cli_refuses_two_slashes_with_exit_2_and_the_message(tmp_path: Path) -> None:
    """`effectflow runs --db sqlite://x.db` exits 2, says how to write it, and creates no x.db."""
    done = subprocess.run(
        [EFFECTFLOW, "runs", "--db", "sqlite://x.db"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "400"},
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    said = " ".join(done.stderr.replace("│", " ").split())
    assert "two slashes make 'x.db' a host" in said
    assert "sqlite:///x.db" in said
    assert FORMS in said
    assert _tree(tmp_path) == []
