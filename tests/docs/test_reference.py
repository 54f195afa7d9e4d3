"""The documentation site builds with ``mkdocs build --strict`` (what ``make docs`` runs), and its API
reference documents every public name: a broken link between pages, a docstring naming an object
that does not exist, or a name added to a public ``__all__`` and not to docs/reference/ fails here."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"

#: The public modules outside ``effectflow.contrib`` (each contrib package with an ``__all__`` is
#: found by the scan). ``effectflow.testing.crash`` has no ``__all__``: its public names are what
#: it defines without a leading underscore.
PUBLIC_MODULES = (
    "effectflow",
    "effectflow.testing",
    "effectflow.testing.crash",
    "effectflow.telemetry",
)


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=config.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _inventory(site: Path) -> set[str]:
    """The names the built reference documents: its objects.inv (Sphinx's inventory format)."""
    header, _, body = (site / "objects.inv").read_bytes().partition(b"zlib.\n")
    assert b"Sphinx inventory version 2" in header
    return {line.split(" ", 1)[0] for line in zlib.decompress(body).decode().splitlines()}


def _source(module: str, src: Path = SRC) -> Path:
    path = src.joinpath(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _public_names(module: str, src: Path = SRC) -> list[str]:
    """The module's ``__all__``, read without importing it (the contrib packages import their host
    frameworks); without one, the names it defines (not imports) without a leading underscore."""
    tree = ast.parse(_source(module, src).read_text(encoding="utf-8"))
    defined: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.append(node.name)
            continue
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            if isinstance(target, ast.Name) and target.id == "__all__":
                return list(ast.literal_eval(value))
            if isinstance(target, ast.Name):
                defined.append(target.id)
    return [name for name in defined if not name.startswith("_")]


def _contrib_packages(src: Path = SRC) -> list[str]:
    """Every ``effectflow.contrib`` integration that declares a public API (``_host`` is private)."""
    found = []
    for init in sorted((src / "effectflow" / "contrib").glob("*/__init__.py")):
        name = f"effectflow.contrib.{init.parent.name}"
        if not init.parent.name.startswith("_") and "__all__" in init.read_text(encoding="utf-8"):
            found.append(name)
    return found


def _missing(modules: list[str], documented: set[str], src: Path = SRC) -> list[str]:
    return [
        f"{module}.{name}"
        for module in modules
        for name in _public_names(module, src)
        if f"{module}.{name}" not in documented
    ]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository's site, built as ``make docs`` builds it (into a temporary folder)."""
    out = tmp_path_factory.mktemp("site")
    done = _build(ROOT / "mkdocs.yml", out)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    return out


def test_the_public_modules_are_found() -> None:
    """The scan is not vacuous: it finds the integrations and reads their ``__all__``."""
    contrib = _contrib_packages()
    assert {"effectflow.contrib.langgraph", "effectflow.contrib.temporal"} <= set(contrib)
    assert "effectflow.contrib._host" not in contrib
    assert "EffectflowMiddleware" in _public_names("effectflow.contrib.langgraph")
    assert "run_matrix" in _public_names("effectflow.testing.crash")
    assert "_point" not in _public_names("effectflow.testing.crash")
    assert len(_public_names("effectflow")) > 50


def test_every_public_name_is_in_the_reference(site: Path) -> None:
    """Each name of a public ``__all__`` (and of ``effectflow.testing.crash``) is documented."""
    modules = [*PUBLIC_MODULES, *_contrib_packages()]
    assert _missing(modules, _inventory(site)) == []


def test_the_package_page_lists_every_top_level_name() -> None:
    """docs/reference/effectflow.md says on which page each name of ``effectflow.__all__`` is."""
    page = (ROOT / "docs" / "reference" / "effectflow.md").read_text(encoding="utf-8")
    unlisted = [
        n for n in _public_names("effectflow") if n != "__version__" and f"`{n}`" not in page
    ]
    assert unlisted == []


def test_the_reference_links_what_docstrings_name(site: Path) -> None:
    """A docstring's ``:class:`ProviderTimeout``` becomes a link to where the reference documents it."""
    page = (site / "reference" / "testing.html").read_text(encoding="utf-8")
    assert ":class:`" not in page
    assert 'href="#effectflow.testing.ProviderTimeout"' in page


def test_a_broken_site_fails_the_strict_build(tmp_path: Path) -> None:
    """The same configuration fails on each kind of defect, naming it: a link to a missing page, a
    link to a missing repository file, a docstring role naming nothing, a documented argument the
    function does not have; and a public name left out is reported missing."""
    (tmp_path / "src" / "toy").mkdir(parents=True)
    (tmp_path / "src" / "toy" / "__init__.py").write_text(
        textwrap.dedent('''\
            """A toy package: see :class:`Present`, not :class:`Absent`."""

            __all__ = ["Hidden", "Present"]


            class Present:
                """Here; :meth:`run` is its own, :func:`gone` is nobody's."""

                def run(self, count: int) -> None:
                    """Run.

                    Args:
                        total: not a parameter of run.
                    """


            class Hidden:
                """Public, and left out of the page."""
            ''')
    )
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text(
        "# Toy\n\n[a page](other.md), [a file](../src/toy/nothing.py), [real](../src/toy/)\n\n"
        "::: toy\n    options:\n      members: [Present]\n"
    )
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    config = config.replace("docs/reference/_", f"{ROOT}/docs/reference/_")
    config = config.split("\nnav:\n")[0] + "\nnav:\n  - index.md\n"
    (tmp_path / "mkdocs.yml").write_text(config)

    done = _build(tmp_path / "mkdocs.yml", tmp_path / "site")

    assert done.returncode == 1
    log = done.stderr
    assert "contains a link 'other.md', but the target is not found" in log
    assert "'../src/toy/nothing.py' names no file of the repository" in log
    assert "'../src/toy/'" not in log  # a folder that exists is fine
    assert "cross-reference target 'toy:Absent'" in log
    assert "cross-reference target 'toy.Present:gone'" in log
    assert "toy.Present:run" not in log  # its own method: resolved
    assert "Parameter 'total' does not appear in the function signature" in log
    # What the test above would say about it, from the same build without --strict.
    loose = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "-q", "-d", str(tmp_path / "loose")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert loose.returncode == 0, loose.stderr
    assert _missing(["toy"], _inventory(tmp_path / "loose"), tmp_path / "src") == ["toy.Hidden"]
