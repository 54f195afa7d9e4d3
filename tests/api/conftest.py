"""Fixtures of the API tests: providers, a ledger, a runtime per tenant to make runs, the app."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

import effectflow as ef
from effectflow.api import create_app

from . import app

with warnings.catch_warnings():
    # Starlette's test client names anyio.abc.BlockingPortal, an alias anyio 4.12+ deprecates.
    warnings.filterwarnings("ignore", "The anyio.abc.BlockingPortal alias", DeprecationWarning)
    from starlette.testclient import TestClient

#: Two tenants, each with its token.
TOKENS = {"tok-acme": "acme", "tok-beta": "beta"}
ACME = {"Authorization": "Bearer tok-acme"}
BETA = {"Authorization": "Bearer tok-beta"}


@pytest.fixture
def world(tmp_path: Path) -> Iterator[app.World]:
    made = app.use(tmp_path)
    yield made
    app.done(made)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


@pytest.fixture
def rt(url: str, world: app.World) -> Iterator[ef.Runtime]:
    """Tenant acme's runtime, to make runs the API then shows and acts on."""
    with ef.Runtime(url, tenant="acme") as runtime:
        yield runtime


@pytest.fixture
def rt_beta(url: str, world: app.World) -> Iterator[ef.Runtime]:
    """Tenant beta's runtime."""
    with ef.Runtime(url, tenant="beta") as runtime:
        yield runtime


@pytest.fixture
def client(url: str, world: app.World) -> Iterator[TestClient]:
    with TestClient(create_app(url, TOKENS)) as test_client:
        yield test_client
