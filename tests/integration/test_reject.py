"""``rt.reject``: a person declines a step waiting for approval. The step is never called, the
workflow sees ``StepRejected``, and an approval given at the same moment cannot also take effect —
checked against the provider's own records, with real threads, on both ledgers."""

from __future__ import annotations

import json
import re
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from typer.testing import CliRunner

import effectflow as ef
from effectflow import console
from effectflow.api import create_app
from effectflow.cli import main as cli_main

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "The anyio.abc.BlockingPortal alias", DeprecationWarning)
    from starlette.testclient import TestClient

SENT: list[int] = []


@ef.tool("rj_refund", effect="financial_write", idempotency=ef.Idempotency(supported=True))
def refund(amount: int, *, idempotency_key: str) -> dict[str, Any]:
    """The provider's own record: one entry per refund it made."""
    SENT.append(amount)
    return {"id": f"rf_{len(SENT)}", "amount": amount}


@ef.workflow("rj_refund_case")
def refund_case(ctx: ef.Context, amount: int) -> dict[str, Any]:
    try:
        return {"refunded": ctx.call("refund", refund, amount=amount)}
    except ef.StepRejected as declined:
        # A decline is an answer the workflow can handle, like a provider's refusal.
        return {"declined": declined.message}


@ef.tool("rj_lost", effect="external_write", effect_id="id")
def lost(*, idempotency_key: str) -> dict[str, Any]:
    """Its answer is always lost, and nothing can look it up: a person decides."""
    raise ef.OutcomeUnknown("the answer was lost")


@ef.workflow("rj_lost_case")
def lost_case(ctx: ef.Context) -> Any:
    return ctx.call("send", lost)


@pytest.fixture
def rt(any_ledger: str) -> Iterator[ef.Runtime]:
    SENT.clear()
    with ef.Runtime(any_ledger) as runtime:
        yield runtime


def _paused(rt: ef.Runtime, run_id: str) -> None:
    run = rt.start(refund_case, run_id=run_id, amount=30)
    assert run.status is ef.RunStatus.PAUSED
    assert (run.error or {}).get("code") == "approval_required"


def test_a_declined_step_is_never_called_and_the_workflow_handles_it(rt: ef.Runtime) -> None:
    _paused(rt, "r1")
    run = rt.reject("r1", "refund", by="bob", reason="over the limit")
    assert run.status is ef.RunStatus.SUCCEEDED
    assert "declined by bob: over the limit" in run.output["declined"]
    assert SENT == []
    [step] = rt.steps("r1")
    assert step.status is ef.StepStatus.REJECTED
    assert step.error is not None
    assert step.error["code"] == "approval_declined"
    [event] = [e for e in rt.audit("r1") if e.kind == "approval_declined"]
    assert event.actor == "bob"
    assert event.detail["reason"] == "over the limit"
    assert rt.attention() == []
    # The same decline again (a retried request) is a no-op; anything else is refused.
    assert rt.reject("r1", "refund", by="bob", reason="over the limit").status is run.status
    with pytest.raises(ef.StaleState, match="not waiting for an approval"):
        rt.reject("r1", "refund", by="carol", reason="also no")
    with pytest.raises(ef.StaleState, match="not waiting for an approval"):
        rt.approve("r1", "refund", approver="alice", approval_id="ap-late")
    assert rt.start(refund_case, run_id="r1", amount=30).output == run.output  # replayed
    assert SENT == []


def test_a_decline_needs_who_and_why_and_a_step_that_waits(rt: ef.Runtime) -> None:
    _paused(rt, "r1")
    for by, reason, says in (("", "x", "by="), ("bob", " ", "reason=")):
        with pytest.raises(ef.ArgumentError, match=says):
            rt.reject("r1", "refund", by=by, reason=reason)
    with pytest.raises(ef.StaleState, match="step nope of run r1 is not waiting"):
        rt.reject("r1", "nope", by="bob", reason="x")
    with pytest.raises(ef.RunNotFound):
        rt.reject("no-such-run", "refund", by="bob", reason="x")
    assert [e.kind for e in rt.audit("r1")][-1] == "run_paused"  # nothing was recorded
    assert rt.run("r1").status is ef.RunStatus.PAUSED


def test_an_approval_and_a_decline_at_the_same_moment_one_takes_effect(
    rt: ef.Runtime, any_ledger: str
) -> None:
    """Two people, two runtimes, two threads released together, ten times: exactly one decision
    is recorded, and the provider's records agree with it."""
    for round_ in range(10):
        run_id = f"race-{round_}"
        _paused(rt, run_id)
        gate = threading.Barrier(2)
        won: dict[str, object] = {}

        def decide(
            kind: str,
            run_id: str = run_id,
            gate: threading.Barrier = gate,
            won: dict[str, object] = won,
        ) -> None:
            with ef.Runtime(any_ledger, registry=rt.registry) as mine:
                gate.wait()
                try:
                    if kind == "approve":
                        mine.approve(run_id, "refund", approver="alice", approval_id=f"ap-{run_id}")
                    else:
                        mine.reject(run_id, "refund", by="bob", reason="no")
                    won[kind] = True
                except (ef.StaleState, ef.IdempotencyConflict) as refused:
                    won[kind] = refused

        threads = [threading.Thread(target=decide, args=(k,)) for k in ("approve", "reject")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        winners = [k for k, v in won.items() if v is True]
        assert len(winners) == 1, won
        kinds = [e.kind for e in rt.audit(run_id)]
        assert ("approved" in kinds) != ("approval_declined" in kinds), kinds
        final = rt.run(run_id)
        if winners == ["approve"]:
            assert final.output["refunded"]["amount"] == 30
        else:
            assert "declined" in final.output
    approved = sum(1 for i in range(10) if "refunded" in rt.run(f"race-{i}").output)
    assert len(SENT) == approved


def test_the_cli_the_api_and_the_console_decline(tmp_path: Path) -> None:
    """Each operator surface declines a waiting step; the provider records nothing."""
    SENT.clear()
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with ef.Runtime(url) as rt:
        for run_id in ("by-cli", "by-api", "by-console"):
            _paused(rt, run_id)
    cli = CliRunner().invoke(
        cli_main.app,
        ["reject", "by-cli", "refund", "--by", "bob", "--reason", "no", "--db", url, "--json"],
    )
    assert cli.exit_code == 0, cli.output
    assert "declined" in json.loads(cli.stdout)["output"]
    with TestClient(create_app(url, {"tok": "default"})) as client:
        auth = {"Authorization": "Bearer tok"}
        path = "/api/v1/runs/by-api/steps/refund/reject"
        refused = client.post(path, headers={**auth, "Idempotency-Key": "k1"}, json={"by": "bob"})
        assert refused.status_code == 400
        done = client.post(
            path, headers={**auth, "Idempotency-Key": "k2"}, json={"by": "bob", "reason": "no"}
        )
        assert done.status_code == 200, done.text
        assert "declined" in done.json()["output"]
    site = Starlette(routes=console.routes())
    site.state.tokens = {"tok": "default"}
    made: list[ef.Runtime] = []

    class Runtimes:
        def get(self, tenant: str) -> ef.Runtime:
            made.append(ef.Runtime(url, tenant=tenant))
            return made[-1]

    site.state.runtimes = Runtimes()
    try:
        with TestClient(site) as client:
            form = re.search(r'name="login_csrf" value="([^"]+)"', client.get("/login").text)
            assert form is not None  # the sign-in form's own token (login CSRF)
            signing_in = {"token": "tok", "next": "/attention", "login_csrf": form.group(1)}
            client.post("/login", data=signing_in)
            page = client.get("/attention").text
            assert "Decline refund" in page
            csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page)
            assert csrf is not None
            form = {"csrf": csrf.group(1), "run_id": "by-console", "step_id": "refund"}
            answer = client.post("/actions/reject", data={**form, "by": "carol", "reason": "no"})
            assert "declined refund" in answer.text
    finally:
        for runtime in made:
            runtime.close()
    with ef.Runtime(url) as rt:
        for run_id in ("by-cli", "by-api", "by-console"):
            assert "declined" in rt.run(run_id).output
    assert SENT == []


def test_approval_and_decision_ids_belong_to_their_tenant(any_ledger: str) -> None:
    """Tenant B using the approval id and decision id tenant A used is not told they exist: each
    tenant has its own id space, and B's decisions take effect."""
    SENT.clear()
    with ef.Runtime(any_ledger, tenant="a") as a, ef.Runtime(any_ledger, tenant="b") as b:
        _paused(a, "ra")
        _paused(b, "rb")
        assert a.approve("ra", "refund", approver="al", approval_id="APR-1").status is (
            ef.RunStatus.SUCCEEDED
        )
        run = b.approve("rb", "refund", approver="bo", approval_id="APR-1")
        assert run.status is ef.RunStatus.SUCCEEDED
        assert len(SENT) == 2

        effects = {}
        for rt, run_id in ((a, "la"), (b, "lb")):
            assert rt.start(lost_case, run_id=run_id).status is ef.RunStatus.PAUSED
            [effects[run_id]] = rt.effects(run_id=run_id)
        for rt, run_id in ((a, "la"), (b, "lb")):
            done = rt.resolve(
                effects[run_id].effect_id,
                committed=False,
                evidence={"checked": run_id},
                by="ops",
                decision_id="DEC-1",
            )
            assert done.status is ef.StepStatus.NOT_COMMITTED
