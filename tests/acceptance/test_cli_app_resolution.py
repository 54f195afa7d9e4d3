"""``--app`` finds the application the way ``python -m`` does (the current directory, PYTHONPATH,
the installed packages, dotted names) or by file path, and when it cannot, says what it looked for
and where, or shows the application's own import error; driven as an operator drives it:
``effectflow worker --until-idle`` in a subprocess, the application proving its import by the file
it writes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

EFFECTFLOW = shutil.which("effectflow", path=str(Path(sys.executable).parent)) or "effectflow"

#: The application's body: it registers a tool and writes who imported it where.
APP = """
import os
import effectflow as ef

@ef.tool(name="{name}_noop", effect="read")
def noop() -> str:
    return "ok"

with open(os.environ["APP_MARK"], "a") as mark:
    mark.write(__name__ + " " + __file__ + "\\n")
"""


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _worker(
    tmp_path: Path, app: str, *, cwd: Path, pythonpath: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(APP_MARK=str(tmp_path / "mark.txt"), COLUMNS="400")
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    db = f"sqlite:///{tmp_path / 'effects.db'}"
    return subprocess.run(
        [EFFECTFLOW, "worker", "--app", app, "--db", db, "--until-idle"],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=60,
        check=False,
    )


def _said(done: subprocess.CompletedProcess[str]) -> str:
    """stderr with rich's panel borders and line wrapping taken out."""
    return " ".join(done.stderr.replace("│", " ").split())


def _marks(tmp_path: Path) -> list[str]:
    mark = tmp_path / "mark.txt"
    return mark.read_text().splitlines() if mark.exists() else []


def test_a_dotted_module_of_a_package_on_pythonpath_is_imported(tmp_path: Path) -> None:
    """--app shop.flows imports lib/shop/flows.py when PYTHONPATH names lib, from another folder."""
    _write(tmp_path / "lib" / "shop" / "__init__.py", "")
    flows = _write(tmp_path / "lib" / "shop" / "flows.py", APP.format(name="shop"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = _worker(tmp_path, "shop.flows", cwd=elsewhere, pythonpath=tmp_path / "lib")
    assert done.returncode == 0, done.stdout + done.stderr
    assert _marks(tmp_path) == [f"shop.flows {flows}"]


def test_a_module_in_the_current_directory_is_imported_first(tmp_path: Path) -> None:
    """The current directory comes before PYTHONPATH, as with python -m: ./flows.py wins."""
    here = _write(tmp_path / "here" / "flows.py", APP.format(name="here"))
    _write(tmp_path / "lib" / "flows.py", APP.format(name="lib"))
    done = _worker(tmp_path, "flows", cwd=tmp_path / "here", pythonpath=tmp_path / "lib")
    assert done.returncode == 0, done.stdout + done.stderr
    assert _marks(tmp_path) == [f"flows {here}"]


def test_a_file_path_is_imported_with_its_folder_on_the_path(tmp_path: Path) -> None:
    """--app apps/app.py imports that file, and the module beside it that it imports."""
    _write(tmp_path / "apps" / "helper.py", "NAME = 'from the helper'\n")
    app = _write(
        tmp_path / "apps" / "app.py",
        APP.format(name="file") + "import helper\nassert helper.NAME == 'from the helper'\n",
    )
    done = _worker(tmp_path, "apps/app.py", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert _marks(tmp_path) == [f"app {app}"]


def test_an_import_error_inside_the_module_is_shown_not_called_missing(tmp_path: Path) -> None:
    """A module found but failing on import exits 2 with its own error and line, not "no module"."""
    _write(tmp_path / "broken.py", "import os\nraise ImportError('the licence server is down')\n")
    done = _worker(tmp_path, "broken", cwd=tmp_path)
    said = _said(done)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "ImportError: the licence server is down" in said
    assert f"{tmp_path / 'broken.py'}:2" in said
    assert "no module" not in said


def test_a_missing_dependency_of_the_module_is_named_as_such(tmp_path: Path) -> None:
    """A module importing something not installed exits 2 naming that dependency, not the app."""
    _write(tmp_path / "needs.py", "import effectflow_no_such_dependency\n")
    done = _worker(tmp_path, "needs", cwd=tmp_path)
    said = _said(done)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "importing 'needs' failed" in said
    assert "No module named 'effectflow_no_such_dependency'" in said


def test_a_missing_module_exits_2_listing_where_it_looked(tmp_path: Path) -> None:
    """--app nosuch.flows exits 2 and lists the current directory and PYTHONPATH's folder."""
    (tmp_path / "lib").mkdir()
    done = _worker(tmp_path, "nosuch.flows", cwd=tmp_path, pythonpath=tmp_path / "lib")
    said = _said(done)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no module 'nosuch.flows' (its package 'nosuch')" in said
    looked = said.split("looked in", 1)[1]
    assert str(tmp_path) in looked
    assert str(tmp_path / "lib") in looked
    assert not (tmp_path / "effects.db").exists()


def test_a_missing_module_of_a_found_package_lists_the_package_folder(tmp_path: Path) -> None:
    """--app shop.nothere exits 2 naming the package's own folder as where it looked."""
    _write(tmp_path / "lib" / "shop" / "__init__.py", "")
    done = _worker(tmp_path, "shop.nothere", cwd=tmp_path, pythonpath=tmp_path / "lib")
    said = _said(done)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no module 'shop.nothere'" in said
    assert str(tmp_path / "lib" / "shop") in said.split("looked in", 1)[1]


def test_a_missing_file_exits_2(tmp_path: Path) -> None:
    """--app apps/gone.py exits 2 saying there is no such file and where it looked."""
    done = _worker(tmp_path, "apps/gone.py", cwd=tmp_path)
    said = _said(done)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"no file 'apps/gone.py' (looked in {tmp_path})" in said


def test_a_file_named_like_an_imported_module_is_refused_not_swapped_in(tmp_path: Path) -> None:
    """--app apps/typer.py exits 2: registering it as `typer` would replace the CLI's own typer."""
    _write(tmp_path / "apps" / "typer.py", APP.format(name="typer"))
    done = _worker(tmp_path, "apps/typer.py", cwd=tmp_path)
    said = _said(done)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "a module named 'typer' is already imported" in said
    assert _marks(tmp_path) == []
