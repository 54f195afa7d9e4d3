"""DESIGN §9 and ``runtime/outage.py``: a call's outcome write is retried through a ledger outage
for ``Runtime(ledger_retry=...)`` seconds, and past that the run is left for recovery
(``LedgerUnavailable``). The bound is the caller's: a PostgreSQL server that stays down must not
hold the caller for the connection pool's own timeout (30 s) instead."""

from __future__ import annotations

import time
from typing import Any

import psycopg_pool
import pytest

import effectflow as ef
from effectflow.ledger.records import StepStatus
from pg_server import PrivatePg

#: The provider's own record: one key per post it committed.
POSTS: list[str] = []
#: The private server the provider takes down right after it committed (set by the test).
SERVER: list[PrivatePg] = []


@ef.tool("bound_find", effect="read")
def find(*, idempotency_key: str) -> ef.Lookup:
    if idempotency_key in POSTS:
        return ef.Lookup.confirmed(external_effect_id=f"p{POSTS.index(idempotency_key) + 1}")
    return ef.Lookup.not_committed()


@ef.tool(
    "bound_post",
    effect="external_write",
    confirm=find,
    effect_id="post_id",
    settles_within=0,  # the in-process provider commits inside the call or never
)
def post(text: str, *, idempotency_key: str) -> dict[str, Any]:
    POSTS.append(idempotency_key)
    for server in SERVER:
        server.stop("fast")
    return {"post_id": f"p{len(POSTS)}", "text": text}


@ef.workflow("bound_flow")
def flow(ctx: ef.Context) -> Any:
    return ctx.call("post", post, text="hello")


@pytest.mark.timeout(90)
def test_the_outcome_write_gives_up_once_ledger_retry_is_spent(private_pg: PrivatePg) -> None:
    """The server stops right after the provider committed and stays down: ``rt.start`` raises
    LedgerUnavailable about ``ledger_retry`` (1 s) later, not after the pool's 30 s timeout."""
    POSTS.clear()
    SERVER[:] = [private_pg]
    try:
        with ef.Runtime(private_pg.url, ledger_retry=1.0) as rt:
            began = time.monotonic()
            with pytest.raises(ef.LedgerUnavailable):
                rt.start(flow, run_id="stays-down")
            waited = time.monotonic() - began
            SERVER.clear()
            private_pg.start()
            # The pool reconnects in the background, with its own backoff: a read waits at most
            # the 1 s asked for, so give it a few tries.
            for _ in range(30):
                try:
                    [step] = rt.steps("stays-down")
                    break
                except psycopg_pool.PoolTimeout:
                    continue
            assert step.status is StepStatus.INTENT_RECORDED
            [run] = rt.recover()
            assert run.status is ef.RunStatus.SUCCEEDED
            assert [step.idempotency_key] == POSTS
    finally:
        SERVER.clear()
    assert waited < 1.0 + 4.0, f"the caller was held {waited:.1f} s for a 1 s ledger_retry"
