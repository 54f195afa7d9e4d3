"""Fixtures every test folder may use.

pytest puts this folder on ``sys.path`` when it loads this file (``tests/`` is not a package), so
helper modules beside it (``pg_server``, ``ledgers``) import by name from tests in any folder.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import ledgers
from pg_server import private_pg, private_pg_server

__all__ = ["any_ledger", "private_pg", "private_pg_server"]


@pytest.fixture(params=ledgers.BACKENDS)
def any_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a fresh ledger on each backend (see ``ledgers.fresh``)."""
    with ledgers.fresh(request.param, tmp_path) as url:
        yield url
