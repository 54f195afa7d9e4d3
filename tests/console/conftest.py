"""A console on a real ledger: a paused run with an unknown effect, for two tenants."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette

import effectflow as ef
from effectflow import console

from . import app

TOKENS = {"tok-acme": "acme", "tok-other": "other"}


class Runtimes:
    """One runtime per tenant on one ledger (what ``effectflow serve`` puts on app.state)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._made: dict[str, ef.Runtime] = {}

    def get(self, tenant: str) -> ef.Runtime:
        if tenant not in self._made:
            self._made[tenant] = ef.Runtime(self.url, tenant=tenant)
        return self._made[tenant]

    def close(self) -> None:
        for runtime in self._made.values():
            runtime.close()


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EFFECTFLOW_TEST_DIR", str(tmp_path))
    (tmp_path / "reset").touch()
    return tmp_path


@pytest.fixture
def console_app(world: Path) -> Iterator[Starlette]:
    url = f"sqlite:///{world / 'ledger.db'}"
    with ef.Runtime(url, tenant="acme") as rt:
        paused = rt.start(app.case, run_id="case-7", case_id="7")
        assert paused.status is ef.RunStatus.PAUSED
    (world / "reset").unlink()
    made = Starlette(routes=console.routes())
    made.state.tokens = TOKENS
    runtimes = Runtimes(url)
    made.state.runtimes = runtimes
    yield made
    runtimes.close()
