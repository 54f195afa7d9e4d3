"""A lookup that finds nothing proves "not committed" only once the call can no longer land
(docs/decision-table.md#when-not-found-is-proof). The runtime's timeout is when it stops waiting,
never when the provider stops committing.

Each test runs a real HTTP provider that commits ``latency`` seconds after a request arrives, and
checks the provider's own records: never two posts for one logical operation, and the post it holds
is confirmed in the ledger or listed for a person.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import latency_app as app
import pytest

import effectflow as ef
from effectflow.ledger.records import StepStatus
from effectflow.runtime import lookup

CHILD = Path(app.__file__)


@pytest.fixture
def slow() -> Iterator[app.SlowPosts]:
    provider = app.SlowPosts(latency=1.5)
    app.PROVIDER["url"] = provider.url
    yield provider
    provider.close()


def _outcomes(rt: ef.Runtime, run_id: str) -> list[dict[str, object]]:
    return [e.detail for e in rt.audit(run_id) if e.kind == "outcome"]


@pytest.mark.parametrize("tool", ["lat_post_bounded", "lat_post_unbounded"])
def test_a_provider_committing_after_the_timeout_is_never_posted_twice(
    any_ledger: str, slow: app.SlowPosts, tool: str
) -> None:
    """timeout=1, the provider commits at 1.5 s, no crash: the call that outlived its timeout is
    waited for instead of being re-sent; its late answer is recorded as the outcome."""
    with ef.Runtime(any_ledger) as rt:
        run = rt.start(app.flow, run_id="late", tool=tool)
        assert run.status is ef.RunStatus.SUCCEEDED, run.error
        [step] = rt.steps("late")
        assert step.status is StepStatus.CONFIRMED
        assert step.external_effect_id == "p1"
        first, late = _outcomes(rt, "late")
        assert first["outcome"] == "unknown"
        assert first["error"]["code"] == "timeout_still_running"  # type: ignore[index]
        assert late == {**late, "outcome": "committed", "late": True, "external_effect_id": "p1"}
    assert slow.arrivals == [step.idempotency_key]
    assert len(slow.posts) == 1


def test_an_async_tool_outliving_its_timeout_is_waited_for_too(
    any_ledger: str, slow: app.SlowPosts
) -> None:
    """The coroutine keeps running as a task after the timeout (it is not cancelled: that would
    not unsend the request); its late answer is the outcome."""

    async def main() -> ef.RunRecord:
        with ef.Runtime(any_ledger) as rt:
            return await rt.start_async(app.flow_async, run_id="late-async", tool="lat_post_async")

    run = asyncio.run(main())
    assert run.status is ef.RunStatus.SUCCEEDED, run.error
    assert len(slow.arrivals) == 1
    assert len(slow.posts) == 1


def test_a_call_that_never_answers_goes_to_a_person_not_to_a_second_call(
    tmp_path: Path, slow: app.SlowPosts, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no bound and a call still running after every lookup found nothing, a person decides;
    the provider's late commit is then the only post, and the call's late answer, when it comes,
    confirms the effect (so the person's queue empties and a resume goes on without a call)."""
    monkeypatch.setattr(lookup, "LATE_ANSWER_WAIT", 0.2)
    slow.latency = 3.0
    with ef.Runtime(f"sqlite:///{tmp_path / 'l.db'}") as rt:
        run = rt.start(app.flow, run_id="hung", tool="lat_post_unbounded")
        assert run.status is ef.RunStatus.PAUSED
        assert run.error is not None
        assert run.error["row"] == "in_doubt_may_still_land"
        [step] = rt.steps("hung")
        assert step.status is StepStatus.NEEDS_ATTENTION
        lookups = [e.detail for e in rt.audit("hung") if e.kind == "lookup"]
        assert lookups
        assert all(d["answer"] == "unknown" for d in lookups)
        assert all("may still land" in str(d["reason"]) for d in lookups)
        assert [i.effect_id for i in rt.attention()] == [step.effect_id]
        deadline = time.time() + 15
        while rt.steps("hung")[0].status is not StepStatus.CONFIRMED and time.time() < deadline:
            time.sleep(0.1)
        [step] = rt.steps("hung")
        assert step.status is StepStatus.CONFIRMED
        assert step.external_effect_id == "p1"
        assert rt.attention() == []
        late = [e.detail for e in rt.audit("hung") if e.kind == "outcome"][-1]
        assert late["late"] is True
        assert late["confirmed"] is True
        assert rt.resume("hung").status is ef.RunStatus.SUCCEEDED
        assert rt.verify_audit("hung") == []
    assert len(slow.arrivals) == 1
    assert len(slow.posts) == 1


def _kill_on_the_wire(ledger: str, slow: app.SlowPosts, tool: str) -> None:
    """Start the run in a child process and SIGKILL it once its request reached the provider,
    before the provider commits."""
    child = subprocess.Popen(
        [sys.executable, str(CHILD), ledger, slow.url, tool],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    arrived = slow.arrived.wait(30)
    child.send_signal(signal.SIGKILL)
    _, err = child.communicate(timeout=10)
    assert arrived, err
    assert child.returncode == -signal.SIGKILL
    assert slow.posts == []  # still on the wire: the provider has not committed yet


def test_after_a_sigkill_on_the_wire_nothing_is_re_sent_before_the_bound(
    any_ledger: str, slow: app.SlowPosts
) -> None:
    """settles_within=3: the recovering process finds nothing at first, waits out the bound,
    then finds the post that landed after its sender died."""
    _kill_on_the_wire(any_ledger, slow, "lat_post_bounded")
    with ef.Runtime(any_ledger) as rt:
        [run] = rt.recover()
        assert run.status is ef.RunStatus.SUCCEEDED, run.error
        [step] = rt.steps("wire")
        assert step.status is StepStatus.CONFIRMED
        lookups = [e.detail for e in rt.audit("wire") if e.kind == "lookup"]
        assert [d["answer"] for d in lookups] == ["unknown", "confirmed"]
    assert len(slow.arrivals) == 1
    assert len(slow.posts) == 1


def test_after_a_sigkill_on_the_wire_with_no_bound_a_person_decides(
    any_ledger: str, slow: app.SlowPosts
) -> None:
    """settles_within='unbounded': "not found" never leads to a second call; after the lookup
    budget the step is listed for a person, and the post that lands later is the only one."""
    _kill_on_the_wire(any_ledger, slow, "lat_post_unbounded")
    with ef.Runtime(any_ledger) as rt:
        [run] = rt.recover()
        assert run.status is ef.RunStatus.PAUSED
        assert run.error is not None
        assert run.error["row"] == "in_doubt_may_still_land"
        [step] = rt.steps("wire")
        assert step.status is StepStatus.NEEDS_ATTENTION
        assert [i.effect_id for i in rt.attention()] == [step.effect_id]
        deadline = time.time() + 10
        while not slow.posts and time.time() < deadline:
            time.sleep(0.1)
        # The person looks, finds the post, and says so: the run goes on without a second call.
        rt.resolve(
            step.effect_id or "", committed=True, evidence={"external_effect_id": "p1"}, by="ops"
        )
        assert rt.resume("wire").status is ef.RunStatus.SUCCEEDED
    assert len(slow.arrivals) == 1
    assert len(slow.posts) == 1
