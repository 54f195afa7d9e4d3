"""Two HTTP API servers on one ledger answer two opposite resolutions of one effect, sent at the
same moment: one 200, one 409 ``stale_state``, every time, on both backends
(docs/concepts.md#peoples-decisions-are-compare-and-swap)."""

from __future__ import annotations

import threading
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

import effectflow as ef
import ledgers
from effectflow.api import create_app

with warnings.catch_warnings():
    # Starlette's test client names anyio.abc.BlockingPortal, an alias anyio 4.12+ deprecates.
    warnings.filterwarnings("ignore", "The anyio.abc.BlockingPortal alias", DeprecationWarning)
    from starlette.testclient import TestClient

TOKENS = {"tok-acme": "acme"}
TRIALS = 60

#: Orders whose payment is lost after sending (the effect is then in doubt).
LOSE: set[str] = set()


@ef.tool("casapi_pay", effect="external_write", effect_id="receipt_id")
def pay(order: str) -> dict[str, Any]:
    if order in LOSE:
        LOSE.discard(order)
        raise ConnectionResetError("connection reset after the request was sent")
    return {"receipt_id": f"rcpt_{order}"}


@ef.workflow("casapi_order")
def order_flow(ctx: ef.Context, order: str) -> str:
    return str(ctx.call("pay", pay, order=order)["receipt_id"])


@pytest.fixture(scope="module", params=ledgers.BACKENDS)
def ledger(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """One ledger per backend for the whole module (``ledgers.fresh``)."""
    with ledgers.fresh(request.param, tmp_path_factory.mktemp("casapi"), "ef_casapi") as url:
        yield url


@pytest.fixture(scope="module")
def servers(ledger: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[TestClient]]:
    """Two API servers (each its own app, runtimes and request-key file) on the one ledger."""
    folder = tmp_path_factory.mktemp("keys")
    apps = [
        create_app(ledger, TOKENS, request_keys_path=str(folder / f"keys-{i}.db")) for i in range(2)
    ]
    with TestClient(apps[0]) as first, TestClient(apps[1]) as second:
        yield [first, second]


def post_at_once(clients: list[TestClient], posts: list[tuple[str, dict[str, Any]]]) -> list[Any]:
    """Each client sends its POST; the threads are released together."""
    barrier = threading.Barrier(len(posts))
    answers: list[Any] = [None] * len(posts)

    def send(i: int) -> None:
        url, body = posts[i]
        headers = {"Authorization": "Bearer tok-acme", "Idempotency-Key": uuid.uuid4().hex}
        barrier.wait()
        answers[i] = clients[i].post(url, headers=headers, json=body)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(posts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return answers


def test_two_opposite_resolutions_over_http_answer_one_200_and_one_409(
    servers: list[TestClient], ledger: str
) -> None:
    """Two servers get opposite resolutions of one unknown effect at once, naming the same
    version: one answers 200, the other 409 stale_state, and the ledger holds one resolution."""
    tag = uuid.uuid4().hex[:6]
    accepted = {"committed": 0, "not committed": 0}
    with ef.Runtime(ledger, tenant="acme") as rt:
        for trial in range(TRIALS):
            run_id = f"http-{tag}-{trial}"
            LOSE.add(run_id)
            assert rt.start(order_flow, run_id=run_id, order=run_id).status is ef.RunStatus.PAUSED
            [effect] = rt.effects(run_id=run_id, status="needs_attention")
            url = f"/api/v1/effects/{effect.effect_id}/resolve"
            base = {"by": "ops", "expected_version": effect.version}
            yes = {**base, "committed": True, "evidence": {"external_effect_id": "rcpt_1"}}
            no = {**base, "committed": False, "evidence": {"checked": "dashboard"}}
            answers = post_at_once(servers, [(url, yes), (url, no)])
            codes = sorted(a.status_code for a in answers)
            assert codes == [200, 409], [(a.status_code, a.text) for a in answers]
            [refused] = [a for a in answers if a.status_code == 409]
            assert refused.json()["code"] == "stale_state", refused.text
            [ok] = [a for a in answers if a.status_code == 200]
            accepted["committed" if ok.json()["status"] == "confirmed" else "not committed"] += 1
            assert [e.kind for e in rt.audit(run_id)].count("resolution") == 1
            assert [a.kind for a in rt.attempts(run_id, "pay")].count("resolution") == 1
            after = rt.store.get_effect(effect.effect_id)
            assert after is not None
            assert after.version == effect.version + 1
    print(f"\nHTTP {ledger.split(':')[0]}: {TRIALS} trials, 200 for {accepted}, {TRIALS} x 409")


def test_two_approvals_over_http_resume_the_run_once(
    servers: list[TestClient], ledger: str
) -> None:
    """Two servers get an approval of one step at once (other approval ids): one answers 200
    with the run resumed, the other 409 stale_state; the run succeeded once."""
    tag = uuid.uuid4().hex[:6]
    with ef.Runtime(ledger, tenant="acme") as rt:
        for trial in range(5):
            run_id = f"httpapr-{tag}-{trial}"
            assert rt.start(refund_flow, run_id=run_id, order=run_id).status is (
                ef.RunStatus.PAUSED
            )
            url = f"/api/v1/runs/{run_id}/steps/refund/approve"
            answers = post_at_once(
                servers,
                [(url, {"approver": "fin", "approval_id": f"A-{run_id}-{i}"}) for i in range(2)],
            )
            assert sorted(a.status_code for a in answers) == [200, 409], [a.text for a in answers]
            [ok] = [a for a in answers if a.status_code == 200]
            assert ok.json()["status"] == "succeeded"
            [refused] = [a for a in answers if a.status_code == 409]
            assert refused.json()["code"] == "stale_state", refused.text
            assert REFUNDS.count(run_id) == 1


#: Orders refunded, in call order.
REFUNDS: list[str] = []


@ef.tool("casapi_refund", effect="financial_write")
def refund(order: str) -> str:
    REFUNDS.append(order)
    return f"rf_{order}"


@ef.workflow("casapi_refund_flow")
def refund_flow(ctx: ef.Context, order: str) -> str:
    return str(ctx.call("refund", refund, order=order))
