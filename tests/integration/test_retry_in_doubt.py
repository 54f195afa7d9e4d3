"""The write path (docs/concepts.md#the-write-path): a retry's attempt is durable before its call,
"like an intent". A process that dies between that call and its outcome's record leaves the call in
doubt, whatever the step's status said before (here: ``not_committed``, from the first call's
definite refusal). The runtime that takes the run over must look the call up before it sends the
write again; a blind re-send duplicates a write that is not idempotent, and leaves the first effect
out of the ledger's sight.

Found by ``tests/workers/test_chaos.py`` (a worker SIGKILLed during a retried ``wk_notify``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import effectflow as ef
from effectflow.ledger.records import StepStatus
from effectflow.runtime.faults import Fault, FaultAction, FaultPlan, FaultPoint, InjectedCrash

#: The provider's own record: one key per post it committed.
POSTS: list[str] = []
#: How many calls the provider refused before committing anything (set by each test).
REFUSE: list[int] = [0]


@ef.tool("rid_find", effect="read")
def find(*, idempotency_key: str) -> ef.Lookup:
    if idempotency_key in POSTS:
        return ef.Lookup.confirmed(external_effect_id=f"p{POSTS.index(idempotency_key) + 1}")
    return ef.Lookup.not_committed()


@ef.tool(
    "rid_post",
    effect="external_write",
    confirm=find,
    effect_id="post_id",
    settles_within=0,  # the in-process provider commits inside the call or never
    retry=ef.RetryPolicy(max_attempts=4, max_lookups=3, initial_backoff=0.01, max_backoff=0.05),
)
def post(text: str, *, idempotency_key: str) -> dict[str, Any]:
    if REFUSE[0] > 0:
        REFUSE[0] -= 1
        raise ef.NotCommitted("the provider refused the call: nothing was posted")
    POSTS.append(idempotency_key)
    return {"post_id": f"p{len(POSTS)}", "text": text}


@ef.workflow("rid_flow")
def flow(ctx: ef.Context) -> Any:
    return ctx.call("post", post, text="hello")


@pytest.fixture(autouse=True)
def _fresh_provider() -> Iterator[None]:
    POSTS.clear()
    REFUSE[0] = 0
    yield
    POSTS.clear()


def test_a_crash_during_a_retried_call_is_looked_up_not_sent_again(any_ledger: str) -> None:
    """The first call is refused (not committed), the retry posts and the process dies before
    recording it: recovery finds the post by its key and confirms it; the provider holds one."""
    REFUSE[0] = 1
    crash = FaultPlan([Fault(FaultPoint.AFTER_CALL_BEFORE_RECORD, "post", 2, FaultAction.RAISE)])
    with ef.Runtime(any_ledger, faults=crash) as rt:
        with pytest.raises(InjectedCrash):
            rt.start(flow, run_id="retried")
        assert len(POSTS) == 1  # the retry did post
        [run] = rt.recover()
        [step] = rt.steps("retried")
        assert [step.idempotency_key] == POSTS, "the retried post was sent again"
        assert run.status is ef.RunStatus.SUCCEEDED, run.error
        assert step.status is StepStatus.CONFIRMED
        assert step.external_effect_id == "p1"
        assert rt.attention() == []
