"""Fixtures of the worker tests: the world of ``app`` (its providers' files) in the test's own
folder, and the providers' HTTP service in its own process. (Their fresh PostgreSQL database per
test is the root conftest's ``pg_url``.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from . import app


@pytest.fixture
def provider_service(tmp_path: Path) -> Iterator[object]:
    """The simulated providers as an HTTP service in their own process."""
    from effectflow.testing import ProviderService

    service = ProviderService.start(tmp_path / "providers")
    try:
        yield service
    finally:
        service.stop()


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``app``'s providers keep their files in the test's folder (``EFFECTFLOW_TEST_DIR``, which
    worker subprocesses inherit), in process: closed and forgotten after the test."""
    monkeypatch.setenv("EFFECTFLOW_TEST_DIR", str(tmp_path))
    monkeypatch.delenv("EFFECTFLOW_PROVIDERS_URL", raising=False)
    app.providers.cache_clear()
    yield tmp_path
    for provider in app.providers():
        provider.close()
    app.providers.cache_clear()
