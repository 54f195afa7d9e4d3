"""Fixtures every test folder may use.

pytest puts this folder on ``sys.path`` when it loads this file (``tests/`` is not a package), so
helper modules beside it (``pg_server``, ``ledgers``, ``worlds``) import by name from tests in any
folder: ``ledgers`` for a fresh ledger on each backend and what a missing PostgreSQL means,
``pg_server`` for a private server a test may restart, ``worlds`` for the world a module's tools
talk to, a clock that moves when told, and a step's record.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import ledgers
import worlds
from pg_server import private_pg, private_pg_server

__all__ = ["any_ledger", "clock", "pg_url", "private_pg", "private_pg_server"]


def pytest_report_header() -> str:
    """Say which PostgreSQL server the postgres half uses, and whether it may be skipped."""
    required = (
        "required"
        if ledgers.pg_required()
        else f"skipped if absent ({ledgers.REQUIRE_PG}=1: required)"
    )
    return f"PostgreSQL: {ledgers.PG} ({required})"


def pytest_sessionfinish() -> None:
    """Drop the PostgreSQL databases this process still holds (``ledgers.SPARES``)."""
    ledgers.SPARES.finish()


@pytest.fixture(params=ledgers.BACKENDS)
def any_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a fresh ledger on each backend (see ``ledgers.fresh``)."""
    with ledgers.fresh(request.param, tmp_path) as url:
        yield url


@pytest.fixture
def pg_url() -> Iterator[str]:
    """The URL of a fresh, empty PostgreSQL database, dropped after the test (see
    ``ledgers.pg_database``)."""
    with ledgers.pg_database("ef_pg") as url:
        yield url


@pytest.fixture
def clock() -> worlds.FakeClock:
    """A clock at ``worlds.T0`` that moves only when the test says so."""
    return worlds.FakeClock()
