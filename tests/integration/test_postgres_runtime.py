"""The runtime end to end on a PostgreSQL ledger: the same workflows as on SQLite, the same facts.

Each test gets a fresh database on the server named by ``EFFECTFLOW_TEST_PG`` (default: the local
one) and drops it after (the root conftest's ``pg_url``): the tests skip, saying why, when no server
answers, and fail where ``EFFECTFLOW_REQUIRE_PG`` is set. The mail provider keeps its truth in its
own SQLite file; local transactions write into the ledger's own database.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import effectflow as ef
from effectflow.testing import MailProvider
from worlds import Current, step

FAST = ef.RetryPolicy(max_attempts=3, max_lookups=2, initial_backoff=0.001, max_backoff=0.005)
S = ef.StepStatus
R = ef.RunStatus


class World:
    """The mail provider and a reversible slot service (in memory) the tools of this module use."""

    def __init__(self, tmp_path: Path) -> None:
        self.mail = MailProvider(tmp_path / "mail.db")
        #: Slots reserved and released, in call order.
        self.reserved: list[str] = []
        self.released: list[str] = []

    def close(self) -> None:
        self.mail.close()


#: The world of the running test, for the tools below.
world = Current[World]()


# -- tools ------------------------------------------------------------------------------------------


@ef.tool("pg_draft_email", effect="pure")
def draft_email(case_id: str) -> str:
    return f"About your case {case_id}"


@ef.tool("pg_email_status", effect="read")
def email_status(
    *, idempotency_key: str | None = None, external_effect_id: str | None = None
) -> ef.Lookup:
    found = world().mail.status(idempotency_key=idempotency_key)
    if found is None:
        return ef.Lookup.not_committed()
    return ef.Lookup.confirmed(external_effect_id=found["provider_message_id"], state="accepted")


@ef.tool(
    "pg_send_email",
    effect="external_write",
    reversible=False,
    idempotency=ef.Idempotency(supported=True, retention="PT1H"),
    confirm=email_status,
    effect_id="provider_message_id",
    retry=FAST,
    external_system="mail",
)
def send_email(to: str, body: str, *, idempotency_key: str) -> dict[str, Any]:
    return dict(world().mail.send(to, "Your case", body, idempotency_key=idempotency_key))


@ef.tool("pg_record_case", effect="external_write", commit="local_transaction")
def record_case(case_id: str, message_id: str, *, tx: ef.LocalTransaction) -> dict[str, Any]:
    tx.execute("CREATE TABLE IF NOT EXISTS case_notes (case_id TEXT PRIMARY KEY, message TEXT)")
    tx.execute("INSERT INTO case_notes (case_id, message) VALUES (%s, %s)", (case_id, message_id))
    return {"case_id": case_id, "backend": tx.backend, "paramstyle": tx.paramstyle}


@ef.tool("pg_refuse_case", effect="external_write", commit="local_transaction")
def refuse_case(case_id: str, *, tx: ef.LocalTransaction) -> dict[str, Any]:
    tx.execute("CREATE TABLE IF NOT EXISTS case_notes (case_id TEXT PRIMARY KEY, message TEXT)")
    tx.execute("INSERT INTO case_notes (case_id, message) VALUES (%s, 'refused')", (case_id,))
    raise ef.Rejected("the case is closed")


@ef.tool("pg_release_slot", effect="external_write", approval=False)
def release_slot(slot_id: str) -> dict[str, Any]:
    world().released.append(slot_id)
    return {"released": slot_id}


@ef.tool(
    "pg_reserve_slot",
    effect="external_write",
    effect_id="slot_id",
    compensation=ef.Compensation(tool=release_slot, automatic=True),
)
def reserve_slot(name: str) -> dict[str, Any]:
    world().reserved.append(name)
    return {"slot_id": f"slot_{name}"}


# -- workflows --------------------------------------------------------------------------------------


@ef.workflow("pg_customer_case")
def customer_case(ctx: ef.Context, case_id: str, email: str) -> dict[str, Any]:
    draft = ctx.call("draft_email", draft_email, case_id=case_id)
    sent = ctx.call("send_case_email", send_email, to=email, body=draft)
    recorded = ctx.call(
        "record_case", record_case, case_id=case_id, message_id=sent["provider_message_id"]
    )
    return {"message": sent["provider_message_id"], "recorded": recorded}


@ef.workflow("pg_refused_case")
def refused_case(ctx: ef.Context, case_id: str) -> Any:
    try:
        return ctx.call("refuse_case", refuse_case, case_id=case_id)
    except ef.StepRejected:
        return "refused"


@ef.workflow("pg_trip")
def trip(ctx: ef.Context, names: list[str]) -> Any:
    for name in names:
        ctx.call(f"reserve_{name}", reserve_slot, name=name)
    raise ef.AbandonGoal("the trip was called off")


# -- fixtures ---------------------------------------------------------------------------------------


@pytest.fixture
def url(pg_url: str) -> str:
    """A fresh, empty database: the runtime migrates it when it opens the ledger."""
    return pg_url


@pytest.fixture
def w(tmp_path: Path) -> Iterator[World]:
    with world.entered(World(tmp_path)) as made:
        yield made


@pytest.fixture
def rt(url: str, w: World) -> Iterator[ef.Runtime]:
    with ef.Runtime(url) as runtime:
        yield runtime


def rows(url: str, sql: str) -> list[tuple[Any, ...]]:
    """Read the ledger's database behind the runtime's back."""
    with psycopg.connect(url) as conn:
        return conn.execute(sql).fetchall()


# -- tests ------------------------------------------------------------------------------------------


def test_a_customer_case_settles_a_lost_response_by_key_and_commits_locally(
    rt: ef.Runtime, w: World, url: str
) -> None:
    """The send's response is lost; the retry with the same key is replayed, so one email exists,
    and the case note commits in the ledger's own transaction with its checkpoint."""
    w.mail.inject("send", "lose_response")
    run = rt.start(customer_case, run_id="case-92", case_id="92", email="li@example.com")

    assert run.status is R.SUCCEEDED
    assert run.output == {
        "message": "msg_1",
        "recorded": {"case_id": "92", "backend": "postgresql", "paramstyle": "format"},
    }
    sent = step(rt, "case-92", "send_case_email")
    assert (sent.status, sent.external_effect_id) == (S.CONFIRMED, "msg_1")
    attempts = rt.attempts("case-92", "send_case_email")
    assert [(a.kind, a.outcome) for a in attempts] == [("call", "unknown"), ("call", "committed")]
    calls = w.mail.calls("send")
    assert [(c["outcome"], c["key"]) for c in calls] == [
        ("ok", sent.idempotency_key),
        ("replayed", sent.idempotency_key),
    ]
    assert len(w.mail.messages()) == 1
    assert rows(url, "SELECT case_id, message FROM case_notes") == [("92", "msg_1")]
    assert step(rt, "case-92", "record_case").status is S.CONFIRMED
    assert [e.kind for e in rt.audit("case-92")].count("local_commit") == 1

    again = rt.start(customer_case, run_id="case-92", case_id="92", email="li@example.com")
    assert again.status is R.SUCCEEDED
    assert len(w.mail.messages()) == 1
    assert rows(url, "SELECT count(*) FROM case_notes") == [(1,)]
    assert rt.verify_audit() == []


def test_a_refused_local_transaction_leaves_nothing_behind(
    rt: ef.Runtime, w: World, url: str
) -> None:
    """A local transaction that raises rolls its own row back with the checkpoint."""
    run = rt.start(refused_case, run_id="refused", case_id="7")
    assert (run.status, run.output) == (R.SUCCEEDED, "refused")
    assert step(rt, "refused", "refuse_case").status is S.REJECTED
    assert rows(url, "SELECT to_regclass('case_notes') IS NULL") == [(True,)]
    assert rt.verify_audit() == []


def test_an_abandoned_goal_is_compensated_newest_first(rt: ef.Runtime, w: World) -> None:
    """AbandonGoal after two reservations releases both, newest first; the run is compensated."""
    run = rt.start(trip, run_id="trip", names=["x", "y"])
    assert run.status is R.COMPENSATED
    assert (w.reserved, w.released) == (["x", "y"], ["slot_y", "slot_x"])
    originals = [e for e in rt.effects(run_id="trip") if e.compensates is None]
    assert [(e.step_id, e.compensation_status) for e in originals] == [
        ("reserve_x", "compensated"),
        ("reserve_y", "compensated"),
    ]
    assert rt.verify_audit() == []
