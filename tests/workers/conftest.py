"""Fixtures of the worker tests: a fresh PostgreSQL database per test (skipped, saying why, when no
server is reachable) and the providers' HTTP service in its own process."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

PG = os.environ.get("EFFECTFLOW_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


@pytest.fixture
def pg_url() -> Iterator[str]:
    """The URL of a fresh, empty database, dropped after the test."""
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - psycopg is a dependency
        pytest.skip(f"psycopg is not installed: {exc}")
    name = f"ef_w_{uuid.uuid4().hex[:12]}"
    try:
        with psycopg.connect(PG, autocommit=True, connect_timeout=3) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.Error as exc:
        pytest.skip(f"PostgreSQL not reachable at {PG}: {exc}")
    try:
        yield PG.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(PG, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def provider_service(tmp_path: Path) -> Iterator[object]:
    """The simulated providers as an HTTP service in their own process."""
    from effectflow.testing import ProviderService

    service = ProviderService.start(tmp_path / "providers")
    try:
        yield service
    finally:
        service.stop()
