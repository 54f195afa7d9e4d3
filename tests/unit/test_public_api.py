"""The public API is exactly what ``effectflow.__all__`` lists (as httpx checks its exports)."""

from __future__ import annotations

import types

import effectflow


def test_all_is_sorted_and_lists_exactly_the_public_names() -> None:
    """``__all__`` is sorted and names every public attribute of the package, and nothing else."""
    public = sorted(
        name
        for name, value in vars(effectflow).items()
        if (not name.startswith("_") or name == "__version__")
        and not isinstance(value, types.ModuleType)
    )
    assert effectflow.__all__ == sorted(effectflow.__all__)
    assert effectflow.__all__ == public


def test_every_exported_name_resolves() -> None:
    """Each name in ``__all__`` is importable from the package."""
    for name in effectflow.__all__:
        assert getattr(effectflow, name) is not None, name
