"""Fixtures of the worker tests: the providers' HTTP service in its own process. (Their fresh
PostgreSQL database per test is the root conftest's ``pg_url``.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def provider_service(tmp_path: Path) -> Iterator[object]:
    """The simulated providers as an HTTP service in their own process."""
    from effectflow.testing import ProviderService

    service = ProviderService.start(tmp_path / "providers")
    try:
        yield service
    finally:
        service.stop()
