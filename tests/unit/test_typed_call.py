"""``ctx.call`` is typed from the tool: mypy ``--strict`` passes tests/typing/usage_ok.py and fails
each marked line of tests/typing/usage_bad.py with its code, and no other line (docs/typing.md)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TYPING = ROOT / "tests" / "typing"
ERROR = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+): error: .*\[(?P<code>[a-z0-9-]+)\]$")
MARK = re.compile(r"#\s*E:\s*(?P<code>[a-z0-9-]+)\s*$")


def _mypy(tmp_path: Path, *files: Path) -> dict[tuple[str, int], set[str]]:
    """mypy's errors by (file name, line). Its cache goes under ``tmp_path``: a cold run (about two
    seconds here) never shares files with a developer's ``.mypy_cache`` or another test run."""
    env = dict(os.environ, MYPYPATH=str(ROOT / "src"))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--cache-dir",
            str(tmp_path / "mypy_cache"),
            "--no-error-summary",
            "--hide-error-context",
            "--no-pretty",
            "--show-error-codes",
            *(str(f) for f in files),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode in (0, 1), done.stdout + done.stderr  # 2 = mypy itself failed
    errors: dict[tuple[str, int], set[str]] = {}
    for line in done.stdout.splitlines():
        found = ERROR.match(line)
        if found:
            key = (Path(found["file"]).name, int(found["line"]))
            errors.setdefault(key, set()).add(found["code"])
        else:
            assert ": error:" not in line, f"an error without a code: {line}"
    return errors


def _marked(path: Path) -> dict[int, str]:
    marked: dict[int, str] = {}
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        found = MARK.search(text)
        if found:
            marked[number] = found["code"]
    return marked


@pytest.fixture(scope="module")
def mypy_errors(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], set[str]]:
    return _mypy(tmp_path_factory.mktemp("mypy"), TYPING / "usage_ok.py", TYPING / "usage_bad.py")


def test_typed_usage_passes_strict(mypy_errors: dict[tuple[str, int], set[str]]) -> None:
    """Right calls (sync, async, with options, an async tool, a ``Tool[..., Any]``) have no error."""
    assert {k: v for k, v in mypy_errors.items() if k[0] == "usage_ok.py"} == {}


def test_each_marked_line_fails_with_its_code(
    mypy_errors: dict[tuple[str, int], set[str]],
) -> None:
    """Every ``# E: code`` line of usage_bad.py has an error of that code."""
    marked = _marked(TYPING / "usage_bad.py")
    assert len(marked) >= 10
    missing = {
        line: code
        for line, code in marked.items()
        if code not in mypy_errors.get(("usage_bad.py", line), set())
    }
    assert missing == {}, f"marked lines mypy accepted (or refused otherwise): {missing}"


def test_no_unmarked_line_fails(mypy_errors: dict[tuple[str, int], set[str]]) -> None:
    """No error falls on a line of usage_bad.py without a mark, nor on any file but the two."""
    marked = _marked(TYPING / "usage_bad.py")
    stray = {
        key: codes
        for key, codes in mypy_errors.items()
        if key[0] not in ("usage_ok.py", "usage_bad.py")
        or (key[0] == "usage_bad.py" and key[1] not in marked)
    }
    assert stray == {}
