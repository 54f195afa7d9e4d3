"""Deadline propagation: the runtime gives calls a deadline within its lease, providers refuse calls
that arrive after their deadline, so a call can be known to be unable to land any more."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import effectflow as ef
from effectflow import testing
from effectflow.testing import NotifyProvider, ProviderService

SEEN: list[float] = []


@ef.tool("dl_post", effect="external_write", timeout=2.0)
def post(text: str, *, deadline: float) -> dict[str, Any]:
    SEEN.append(deadline)
    return {"text": text}


@ef.workflow("dl_flow")
def flow(ctx: ef.Context) -> Any:
    return ctx.call("post", post, text="hello")


def test_a_tool_that_takes_a_deadline_gets_one_within_its_lease_and_timeout(
    tmp_path: Path,
) -> None:
    SEEN.clear()
    with ef.Runtime(f"sqlite:///{tmp_path / 'l.db'}", lease_ttl=30) as rt:
        before = time.time()
        assert rt.start(flow, run_id="r1").status is ef.RunStatus.SUCCEEDED
        run = rt.run("r1")
    [due] = SEEN
    assert before < due <= time.time() + 2.0
    assert run.created_at + 30 >= due


def test_an_in_process_provider_refuses_a_call_after_its_deadline(tmp_path: Path) -> None:
    notify = NotifyProvider(tmp_path / "notify.db")
    try:
        with testing.deadline(time.time() - 1), pytest.raises(testing.DeadlineExceeded):
            notify.post("#c", "late", client_tag="k1")
        with testing.deadline(time.time() + 10):
            notify.post("#c", "on time", client_tag="k2")
        assert [n["text"] for n in notify.notifications()] == ["on time"]
        assert [c["outcome"] for c in notify.calls()] == ["deadline_exceeded", "ok"]
    finally:
        notify.close()


def test_the_http_service_refuses_a_call_after_its_deadline(tmp_path: Path) -> None:
    """The deadline travels as X-Request-Deadline; a late call is refused, nothing committed, and
    the client raises DeadlineExceeded (a definite "not done"), not a timeout."""
    service = ProviderService.start(tmp_path / "providers")
    try:
        with testing.HttpNotify(service.url) as notify:
            with testing.deadline(time.time() + 10):
                notify.post("#c", "on time", client_tag="k2")
            with testing.deadline(time.time() - 1), pytest.raises(testing.DeadlineExceeded):
                notify.post("#c", "late", client_tag="k1")  # refused before sending
            assert [n["text"] for n in notify.notifications()] == ["on time"]
        # A request that reaches the server after its deadline is refused there, not committed.
        late = httpx.post(
            f"{service.url}/notify/post",
            json={"channel": "#c", "text": "late at the server", "client_tag": "k3"},
            headers={"X-Request-Deadline": repr(time.time() - 0.001)},
            timeout=5,
        )
        assert late.status_code == 504
        assert late.json()["code"] == "deadline_exceeded"
        with testing.HttpNotify(service.url) as notify:
            assert [n["text"] for n in notify.notifications()] == ["on time"]
    finally:
        assert service.stop() == 0
