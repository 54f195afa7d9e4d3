"""mkdocs hook: the API reference documents every public name, or the build warns (and --strict fails).

The public names are read from the source, without importing it (the contrib packages import
their host frameworks): each module's ``__all__``, or, for a module without one
(``effectflow.testing.crash``), the names it defines without a leading underscore. Which modules
are public is mkdocs.yml's ``extra.public_api``; ``package.*`` there means each subpackage of
``package`` that has an ``__all__`` (``effectflow.contrib.*``: every integration, not ``_host``).
A name is documented when the built reference's inventory (``objects.inv``, written by mkdocstrings)
has it under that module's path: a ``::: module`` page lists its members, a ``::: module.Name``
directive documents one.
"""

from __future__ import annotations

import ast
import logging
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.public_api")


def public_names(module: str, src: Path) -> list[str]:
    """The module's ``__all__``, or the public names it defines (see the module docstring)."""
    path = src.joinpath(*module.split("."))
    path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    defined: list[str] = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
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
                return [str(name) for name in ast.literal_eval(value)]
            if isinstance(target, ast.Name):
                defined.append(target.id)
    return [name for name in defined if not name.startswith("_")]


def public_modules(patterns: Iterable[str], src: Path) -> list[str]:
    """The modules ``patterns`` name, each ``package.*`` expanded (see the module docstring)."""
    found: list[str] = []
    for pattern in patterns:
        if not pattern.endswith(".*"):
            found.append(pattern)
            continue
        package = pattern[:-2]
        for init in sorted(src.joinpath(*package.split(".")).glob("*/__init__.py")):
            name = init.parent.name
            if not name.startswith("_") and "__all__" in init.read_text(encoding="utf-8"):
                found.append(f"{package}.{name}")
    return found


def inventory(site: Path) -> set[str]:
    """The names a built reference documents: its objects.inv (Sphinx's inventory, version 2)."""
    header, _, body = (site / "objects.inv").read_bytes().partition(b"zlib.\n")
    if b"Sphinx inventory version 2" not in header:
        raise ValueError(f"{site / 'objects.inv'} is not a version 2 inventory")
    return {line.split(" ", 1)[0] for line in zlib.decompress(body).decode().splitlines()}


def missing(modules: Iterable[str], documented: set[str], src: Path) -> list[str]:
    """The public names of ``modules`` that ``documented`` lacks, as ``module.name``."""
    return [
        f"{module}.{name}"
        for module in modules
        for name in public_names(module, src)
        if f"{module}.{name}" not in documented
    ]


def on_post_build(*, config: Any) -> None:
    """Warn about each public name the reference leaves out (mkdocs calls it after the build)."""
    src = Path(config["config_file_path"]).parent / "src"
    modules = public_modules(config["extra"].get("public_api", ()), src)
    for name in missing(modules, inventory(Path(config["site_dir"])), src):
        log.warning("%s is public but not in the API reference (docs/reference/)", name)
