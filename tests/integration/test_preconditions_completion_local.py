"""Preconditions (conflict → re-observe), completion semantics, and local transactions, end to end.

The deploy target and the mail provider keep their state in their own SQLite files; local
transactions write into the ledger's own database. Each test reads the ledger and that truth.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import effectflow as ef
from effectflow.testing import (
    DeployTarget,
    Fault,
    FaultAction,
    FaultPlan,
    FaultPoint,
    InjectedCrash,
    MailProvider,
)
from worlds import Current, step

FAST = ef.RetryPolicy(max_attempts=3, max_lookups=2, initial_backoff=0.001, max_backoff=0.02)
S = ef.StepStatus
R = ef.RunStatus
PROD = "deployment/prod"


class World:
    """A deploy target with a racing writer, a mail provider with slow delivery."""

    def __init__(self, tmp_path: Path) -> None:
        self.deploy = DeployTarget(tmp_path / "deploy.db")
        self.deploy.seed(PROD, "app:2.7", revision=42)
        self.mail = MailProvider(tmp_path / "mail.db", sent_after=0.02, delivered_after=0.05)
        #: How many more times the other team deploys between our observation and our write.
        self.races = 0

    def close(self) -> None:
        self.deploy.close()
        self.mail.close()


#: The world of the running test, for the tools below.
world = Current[World]()


# -- tools ------------------------------------------------------------------------------------------


@ef.tool("pc_observe", effect="read")
def observe(target: str) -> dict[str, Any]:
    seen = world().deploy.observe(target)
    if world().races:
        world().races -= 1
        world().deploy.concurrent_deploy(target, f"hotfix:{world().races}")
    return seen


@ef.tool(
    "pc_deploy",
    effect="external_write",
    idempotency=ef.Idempotency(supported=True),
    effect_id="deployment_id",
    retry=FAST,
)
def deploy(
    target: str, image: str, *, precondition: ef.Expect, idempotency_key: str
) -> dict[str, Any]:
    # RevisionConflict is the provider's 412: the runtime reads it as a precondition failure.
    if precondition.etag is not None:
        return world().deploy.deploy(
            target, image, if_match=precondition.etag, idempotency_key=idempotency_key
        )
    assert isinstance(precondition.revision, int)
    return world().deploy.deploy(
        target, image, expected_revision=precondition.revision, idempotency_key=idempotency_key
    )


@ef.tool("pc_mail_status", effect="read")
def mail_status(
    *, idempotency_key: str | None = None, external_effect_id: str | None = None
) -> ef.Lookup:
    found = world().mail.status(idempotency_key=idempotency_key)
    if found is None:
        return ef.Lookup.not_committed()
    return ef.Lookup.confirmed(
        external_effect_id=found["provider_message_id"], state=found["status"]
    )


@ef.tool(
    "pc_send",
    effect="external_write",
    idempotency=ef.Idempotency(supported=True),
    confirm=mail_status,
    effect_id="provider_message_id",
    completion=ef.Completion(states=["accepted", "sent", "delivered"], required="delivered"),
    retry=FAST,
)
def send(to: str, *, idempotency_key: str) -> dict[str, Any]:
    return dict(world().mail.send(to, "Notice", "Body", idempotency_key=idempotency_key))


@ef.tool(
    "pc_send_quick_deadline",
    effect="external_write",
    idempotency=ef.Idempotency(supported=True),
    confirm=mail_status,
    effect_id="provider_message_id",
    completion=ef.Completion(
        states=["accepted", "sent", "delivered"], required="delivered", deadline=0.05
    ),
    retry=FAST,
)
def send_quick_deadline(to: str, *, idempotency_key: str) -> dict[str, Any]:
    return dict(world().mail.send(to, "Notice", "Body", idempotency_key=idempotency_key))


@ef.tool("pc_reserve", effect="external_write", commit="local_transaction")
def reserve(seat: str, *, tx: ef.LocalTransaction) -> dict[str, Any]:
    tx.execute("CREATE TABLE IF NOT EXISTS seats (seat TEXT PRIMARY KEY, holder TEXT)")
    tx.execute("INSERT INTO seats VALUES (?, ?)", (seat, "li"))
    return {"seat": seat}


# -- workflows --------------------------------------------------------------------------------------


@ef.workflow("pc_release")
def release(ctx: ef.Context, image: str) -> Any:
    seen = ctx.call("observe", observe, target=PROD)
    return ctx.call(
        "deploy",
        deploy,
        target=PROD,
        image=image,
        precondition=ef.Expect(revision=seen["revision"]),
        observe="observe",
    )


@ef.workflow("pc_release_blind")
def release_without_observe(ctx: ef.Context, image: str) -> Any:
    seen = ctx.call("observe", observe, target=PROD)
    return ctx.call(
        "deploy", deploy, target=PROD, image=image, precondition=ef.Expect(etag=seen["etag"])
    )


@ef.workflow("pc_notify")
def notify(ctx: ef.Context, to: str) -> Any:
    return ctx.call("send", send, to=to)


@ef.workflow("pc_notify_deadline")
def notify_deadline(ctx: ef.Context, to: str) -> Any:
    return ctx.call("send", send_quick_deadline, to=to)


@ef.workflow("pc_notify_sent", steps=[ef.StepContract("send", required_state="sent")])
def notify_sent(ctx: ef.Context, to: str) -> Any:
    return ctx.call("send", send, to=to)


@ef.workflow("pc_book")
def book(ctx: ef.Context, seat: str) -> Any:
    return ctx.call("reserve", reserve, seat=seat)


# -- fixtures ---------------------------------------------------------------------------------------


@pytest.fixture
def w(tmp_path: Path) -> Iterator[World]:
    with world.entered(World(tmp_path)) as made:
        yield made


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    return tmp_path / "ledger.db"


@pytest.fixture
def rt(ledger: Path, w: World) -> Iterator[ef.Runtime]:
    with ef.Runtime(f"sqlite:///{ledger}") as runtime:
        yield runtime


# -- preconditions ----------------------------------------------------------------------------------


def test_a_conflict_reobserves_and_writes_on_the_new_revision(rt: ef.Runtime, w: World) -> None:
    """Row "precondition conflict": the write is refused (nothing applied), the observation runs
    again as a new step revision, and the write goes on top of the other writer's revision."""
    w.races = 1
    run = rt.start(release, run_id="d1", image="app:2.8")
    assert run.status is R.SUCCEEDED
    history = w.deploy.history(PROD)
    assert [(h["writer"], h["image"]) for h in history] == [
        ("other", "hotfix:0"),
        ("us", "app:2.8"),
    ]
    assert history[1]["based_on"] == history[0]["revision"] == 43
    assert w.deploy.overwrites(PROD) == 0
    observed, wrote = step(rt, "d1", "observe"), step(rt, "d1", "deploy")
    assert (observed.step_revision, wrote.step_revision) == (2, 2)
    effects = rt.effects(run_id="d1")
    assert [e.status for e in effects] == [S.CONFLICT, S.CONFIRMED]
    assert effects[0].idempotency_key != effects[1].idempotency_key
    assert run.output is not None
    assert run.output["previous_revision"] == 43
    # The stale precondition was sent once and never retried.
    deploys = [c for c in w.deploy.calls() if c["operation"] == "deploy"]
    assert [c["outcome"] for c in deploys] == ["revision_mismatch", "ok"]
    assert "reobserve" in [e.kind for e in rt.audit("d1")]


def test_a_conflict_without_an_observation_step_pauses_for_a_person(
    rt: ef.Runtime, w: World
) -> None:
    """No observe step named: the run pauses; the write is never repeated with the stale ETag."""
    w.races = 1
    run = rt.start(release_without_observe, run_id="d1", image="app:2.8")
    assert run.status is R.PAUSED
    assert step(rt, "d1", "deploy").status is S.NEEDS_ATTENTION
    assert [h["writer"] for h in w.deploy.history(PROD)] == ["other"]
    deploys = [c for c in w.deploy.calls() if c["operation"] == "deploy"]
    assert [c["outcome"] for c in deploys] == ["revision_mismatch"]


def test_conflicts_past_the_reobserve_budget_pause(rt: ef.Runtime, w: World) -> None:
    """Another writer wins every race: after three re-observations the run asks a person."""
    w.races = 10
    run = rt.start(release, run_id="d1", image="app:2.8")
    assert run.status is R.PAUSED
    assert step(rt, "d1", "observe").step_revision == 4
    assert all(h["writer"] == "other" for h in w.deploy.history(PROD))
    assert w.deploy.overwrites(PROD) == 0


# -- completion semantics ---------------------------------------------------------------------------


def test_a_step_requiring_delivery_waits_for_it(rt: ef.Runtime, w: World) -> None:
    """Row "accepted but required state is delivered": awaiting_completion, polled to delivered."""
    run = rt.start(notify, run_id="n1", to="li@example.com")
    assert run.status is R.SUCCEEDED
    sent = step(rt, "n1", "send")
    assert sent.status is S.CONFIRMED
    assert (sent.completion_state, sent.required_state) == ("delivered", "delivered")
    polls = [a for a in rt.attempts("n1", "send") if a.kind.value == "lookup"]
    assert polls, "delivery was confirmed through the lookup, not assumed"
    outcomes = [e.detail.get("completion_state") for e in rt.audit("n1") if e.kind == "outcome"]
    assert outcomes == ["accepted"]
    [message] = w.mail.messages()
    assert message["status"] == "delivered"


def test_a_missed_completion_deadline_asks_a_person(rt: ef.Runtime, w: World) -> None:
    """Delivery takes longer than the contract allows: needs_attention, run paused, one email."""
    w.mail.delivered_after = 100.0
    run = rt.start(notify_deadline, run_id="n1", to="li@example.com")
    assert run.status is R.PAUSED
    assert run.error is not None
    assert run.error["row"] == "completion_deadline"
    sent = step(rt, "n1", "send")
    assert sent.status is S.NEEDS_ATTENTION
    assert sent.completion_state in ("accepted", "sent")
    assert len(w.mail.messages()) == 1


def test_the_required_state_cannot_change_for_a_running_step(ledger: Path, w: World) -> None:
    """Started requiring delivered; resumed under a contract requiring sent: refused."""
    w.mail.delivered_after = 100.0
    crash = FaultPlan([Fault(FaultPoint.AFTER_RECORD, "send", action=FaultAction.RAISE)])
    with ef.Runtime(f"sqlite:///{ledger}", faults=crash) as dying, pytest.raises(InjectedCrash):
        dying.start(notify, run_id="n1", to="li@example.com")
    with ef.Runtime(f"sqlite:///{ledger}", clock=lambda: time.time() + 3600) as rt:
        assert step(rt, "n1", "send").status is S.AWAITING_COMPLETION
        # The same run under the changed contract.
        run = rt._executor.drive(rt.run("n1"), notify_sent)
        assert run.status is R.FAILED
        assert run.error is not None
        assert run.error["code"] == "contract_error"
        assert "cannot change for a running step" in run.error["message"]
        assert step(rt, "n1", "send").required_state == "delivered"
        assert len(w.mail.messages()) == 1


# -- local transactions -----------------------------------------------------------------------------


def test_a_local_transaction_commits_with_its_checkpoint(
    rt: ef.Runtime, ledger: Path, w: World
) -> None:
    """The tool's row and the confirmed step are in the ledger together; a resume does not rerun."""
    run = rt.start(book, run_id="b1", seat="1A")
    assert run.status is R.SUCCEEDED
    reserved = step(rt, "b1", "reserve")
    assert reserved.status is S.CONFIRMED
    [effect] = rt.effects(run_id="b1")
    assert (effect.status, effect.external_system) == (S.CONFIRMED, "ledger")
    assert rt.start(book, run_id="b1", seat="1A").status is R.SUCCEEDED
    with sqlite3.connect(ledger) as conn:
        assert conn.execute("SELECT seat FROM seats").fetchall() == [("1A",)]
    assert [e.kind for e in rt.audit("b1")].count("local_commit") == 1
