"""``GET /api/v1/ready``: what a load balancer or Kubernetes asks before it sends traffic to an
``effectflow serve`` replica — the ledger answers, at the schema version this server writes. No
token; never where the ledger is or its password."""

from __future__ import annotations

import sqlite3

import psycopg
import pytest
from starlette.testclient import TestClient

import effectflow as ef
from effectflow.api.app import create_app

TOKENS = {"tok": "default"}


def _ready(url: str) -> tuple[int, dict[str, object]]:
    with TestClient(create_app(url, TOKENS)) as client:
        answer = client.get("/api/v1/ready")  # no Authorization header
    return answer.status_code, answer.json()


def _sql(url: str, statement: str) -> None:
    if url.startswith("sqlite"):
        conn = sqlite3.connect(url.removeprefix("sqlite:///"))
        conn.execute(statement)
        conn.commit()
        conn.close()
    else:
        with psycopg.connect(url, autocommit=True) as pg:
            pg.execute(statement)


def test_ready_when_the_ledger_answers_at_the_server_s_version(any_ledger: str) -> None:
    with ef.Runtime(any_ledger):
        pass
    assert _ready(any_ledger) == (200, {"status": "ok", "schema_version": 11})


@pytest.mark.parametrize(
    ("statement", "says"),
    [
        (
            "DELETE FROM schema_migrations WHERE version = 11",
            "at schema version 10; this server writes 11 (migrate the ledger)",
        ),
        (
            "INSERT INTO schema_migrations VALUES (99, '0099_future', 0)",
            "at schema version 99; this server writes 11 (upgrade this server)",
        ),
    ],
    ids=["older", "newer"],
)
def test_not_ready_when_the_ledger_is_at_another_version(
    any_ledger: str, statement: str, says: str
) -> None:
    with ef.Runtime(any_ledger):
        pass
    _sql(any_ledger, statement)
    status, body = _ready(any_ledger)
    assert (status, body["code"]) == (503, "schema_mismatch")
    assert says in str(body["detail"])


def test_not_ready_when_the_ledger_does_not_answer_and_nothing_says_where() -> None:
    url = "postgresql://effectflow:s3cret-pw@127.0.0.1:1/ledger"  # nothing listens on port 1
    status, body = _ready(url)
    assert (status, body["code"]) == (503, "ledger_unavailable")
    text = str(body)
    assert "s3cret-pw" not in text
    assert "127.0.0.1" not in text
