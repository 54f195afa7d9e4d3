"""The documentation site builds with ``mkdocs build --strict`` (what ``make docs`` runs), and its API
reference documents every public name: a broken link between pages, a docstring naming an object
that does not exist, or a name added to a public ``__all__`` and not to docs/reference/ fails here."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import griffe
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"


def _load(name: str) -> ModuleType:
    """A hook of the site's build (docs/reference/), which is not an importable package."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "docs" / "reference" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


coverage = _load("_coverage")
roles = _load("_sphinx_roles")
PUBLIC_API = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["extra"][
    "public_api"
]


def _build(config: Path, site: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", *flags, "-f", str(config), "-d", str(site)],
        cwd=config.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository's site, built as ``make docs`` builds it (into a temporary folder)."""
    out = tmp_path_factory.mktemp("site")
    done = _build(ROOT / "mkdocs.yml", out, "--strict")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    return out


def test_the_public_modules_are_found() -> None:
    """The scan is not vacuous: it finds the integrations and reads their ``__all__``."""
    modules = coverage.public_modules(PUBLIC_API, SRC)
    assert {"effectflow.contrib.langgraph", "effectflow.contrib.temporal"} <= set(modules)
    assert "effectflow.contrib._host" not in modules
    assert "EffectflowMiddleware" in coverage.public_names("effectflow.contrib.langgraph", SRC)
    assert "run_matrix" in coverage.public_names("effectflow.testing.crash", SRC)
    assert "_point" not in coverage.public_names("effectflow.testing.crash", SRC)
    assert len(coverage.public_names("effectflow", SRC)) > 50


def test_every_public_name_is_in_the_reference(site: Path) -> None:
    """Each name of a public ``__all__`` (and of ``effectflow.testing.crash``) is documented."""
    modules = coverage.public_modules(PUBLIC_API, SRC)
    assert coverage.missing(modules, coverage.inventory(site), SRC) == []


def test_the_package_page_lists_every_top_level_name() -> None:
    """docs/reference/effectflow.md says on which page each name of ``effectflow.__all__`` is."""
    page = (ROOT / "docs" / "reference" / "effectflow.md").read_text(encoding="utf-8")
    names = coverage.public_names("effectflow", SRC)
    assert [n for n in names if n != "__version__" and f"`{n}`" not in page] == []


def test_the_reference_links_what_docstrings_name(site: Path) -> None:
    """A docstring's ``:class:`ProviderTimeout``` is a link to where the reference documents it."""
    page = (site / "reference" / "testing.html").read_text(encoding="utf-8")
    assert ":class:`" not in page
    assert 'href="#effectflow.testing.ProviderTimeout"' in page


def test_every_docstring_role_names_an_object() -> None:
    """Every ``:class:``/``:func:``/``:mod:``… in a docstring of the package names an object that
    exists, the private modules' too, which the build checks only where the reference renders."""
    loader = griffe.GriffeLoader(search_paths=[str(SRC)])
    todo: list[griffe.Object | griffe.Alias] = [loader.load("effectflow")]
    seen, unresolved = 0, []
    while todo:
        obj = todo.pop()
        if isinstance(obj, griffe.Alias):
            continue
        todo.extend(obj.members.values())
        for role in roles.ROLE.finditer(obj.docstring.value if obj.docstring else ""):
            seen += 1
            made = roles.reference(obj, loader.modules_collection, "effectflow", role)
            if " optional>" not in made:
                unresolved.append(f"{obj.path}: {role[0]}")
    assert seen > 100
    assert unresolved == []


TOY = '''\
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
'''


def _toy_site(tmp_path: Path) -> Path:
    """A site with the repository's configuration (hooks, extensions, checks) over a toy package,
    one of each defect in it."""
    (tmp_path / "src" / "toy").mkdir(parents=True)
    (tmp_path / "src" / "toy" / "__init__.py").write_text(TOY)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text(
        "# Toy\n\n[a page](other.md), [a file](../src/toy/nothing.py), [real](../src/toy/)\n\n"
        "::: toy\n    options:\n      members: [Present]\n"
    )
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    config = config.replace("docs/reference/_", f"{ROOT}/docs/reference/_")
    settings = yaml.safe_load(config)
    settings["nav"] = ["index.md"]
    settings["extra"]["public_api"] = ["toy"]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(settings))
    return tmp_path / "mkdocs.yml"


def test_a_broken_site_fails_the_strict_build(tmp_path: Path) -> None:
    """The same configuration fails on each kind of defect, naming it: a link to a missing page, a
    link to a missing repository file, a docstring role naming nothing, a documented argument the
    function does not have, a public name left out of the reference."""
    done = _build(_toy_site(tmp_path), tmp_path / "site", "--strict")

    assert done.returncode == 1
    log = done.stderr
    assert "contains a link 'other.md', but the target is not found" in log
    assert "'../src/toy/nothing.py' names no file of the repository" in log
    assert "'../src/toy/'" not in log  # a folder that exists is fine
    assert "cross-reference target 'toy:Absent'" in log
    assert "cross-reference target 'toy.Present:gone'" in log
    assert "toy.Present:run" not in log  # its own method: resolved
    assert "Parameter 'total' does not appear in the function signature" in log
    assert "toy.Hidden is public but not in the API reference" in log
    assert "toy.Present is public" not in log
    # The six above, and griffe's second about ``total`` (it has no type either): nothing else.
    assert log.count("WARNING") == 7, log
