"""A griffe extension: the docstrings' Sphinx roles as checked cross-references.

effectflow's docstrings name other objects the Sphinx way (``:class:`ProviderError```,
``:mod:`.mapping```, ``:meth:`~effectflow.testing._base.SqliteProvider.inject```), which Markdown
would print as the literal role. Each role becomes an autorefs cross-reference to the full path it
names, resolved from the docstring's own scope as Sphinx does (the object, then its parents; a
leading dot: from the enclosing package down):

- a name found in the package becomes an *optional* reference: a link when the reference documents
  it, its name in code otherwise (a private helper is named, not documented);
- a name of the package (effectflow) found nowhere becomes a required reference, which autorefs
  reports as unresolved, so ``mkdocs build --strict`` fails on a docstring that points at nothing;
- a name of another package (``httpx.Timeout``) is optional: it cannot be checked here.

A paragraph ending in the reStructuredText ``::`` (a literal block follows) ends in ``:``.
"""

from __future__ import annotations

import functools
import html
import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:mod|class|func|meth|attr|data|exc|obj|const):`(?P<target>[^`]+)`")
_LITERAL_BLOCK = re.compile(r"(?<=\S)::\n(?=\s*\n)")


def _exists(collection: griffe.ModulesCollection, path: str) -> bool:
    try:
        collection[path]
    except (KeyError, ValueError, griffe.AliasResolutionError, griffe.CyclicAliasError):
        return False
    return True


def _module_of(obj: griffe.Object | griffe.Alias) -> griffe.Module:
    while not isinstance(obj, griffe.Module):
        assert obj.parent is not None
        obj = obj.parent
    return obj


def _resolve(obj: griffe.Object, name: str, collection: griffe.ModulesCollection) -> str | None:
    """The full path ``name`` means in ``obj``'s docstring, or None when it means nothing."""
    if name.startswith("."):
        module = _module_of(obj)
        package = module if module.is_init_module else module.parent
        scope: griffe.Object | griffe.Alias | None = package
        while scope is not None:
            candidate = f"{scope.path}{name}"
            if _exists(collection, candidate):
                return candidate
            scope = scope.parent
        return None
    if _exists(collection, name):
        return name
    first, _, rest = name.partition(".")
    scope = obj
    while scope is not None:
        members = scope.all_members  # a class's inherited methods too
        if first in members:
            member = members[first]
            target = member.path
            if isinstance(member, griffe.Alias):
                try:
                    target = member.final_target.path
                except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                    target = member.target_path  # another package's name: kept as written
            return f"{target}.{rest}" if rest else target
        scope = scope.parent
    return None


def reference(
    obj: griffe.Object, collection: griffe.ModulesCollection, root: str, role: re.Match[str]
) -> str:
    """The cross-reference that replaces one role of ``obj``'s docstring."""
    written = role["target"]
    short = written.startswith("~")
    name = written.lstrip("~")
    shown = name.rsplit(".", 1)[-1] if short else name.lstrip(".")
    resolved = _resolve(obj, name, collection)
    if resolved is not None and resolved.split(".", 1)[0] == root:
        resolved = resolved if _exists(collection, resolved) else None
    code = f"<code>{html.escape(shown)}</code>"
    if resolved is None:
        absolute = name.lstrip(".")
        if absolute.split(".", 1)[0] != root and "." in absolute:
            return f'<autoref identifier="{html.escape(absolute)}" optional>{code}</autoref>'
        # Unresolvable from here: a required reference to what the docstring wrote, so autorefs
        # reports it (with the object's path, to find the docstring).
        identifier = html.escape(f"{obj.path}:{written}")
        return f'<autoref identifier="{identifier}">{code}</autoref>'
    return f'<autoref identifier="{html.escape(resolved)}" optional>{code}</autoref>'


class SphinxRoles(griffe.Extension):
    """Rewrites the roles of every docstring of the loaded package (see the module docstring)."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        collection = loader.modules_collection
        todo: list[griffe.Object | griffe.Alias] = [pkg]
        while todo:
            obj = todo.pop()
            if obj.is_alias:
                continue
            assert isinstance(obj, griffe.Object)
            todo.extend(obj.members.values())
            if obj.docstring is None:
                continue
            value = ROLE.sub(
                functools.partial(reference, obj, collection, pkg.name), obj.docstring.value
            )
            obj.docstring.value = _LITERAL_BLOCK.sub(":\n", value)
