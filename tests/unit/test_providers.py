"""The simulated providers behave like the real APIs they stand for, durably, across processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from effectflow.testing.providers import (
    CrmProvider,
    IdempotencyKeyReused,
    MailProvider,
    NotifyProvider,
    ProviderError,
    ProviderRejected,
    ProviderTimeout,
    ProviderUnavailable,
)
from worlds import FakeClock


@pytest.fixture
def mail(tmp_path: Path, clock: FakeClock) -> Iterator[MailProvider]:
    provider = MailProvider(tmp_path / "mail.db", clock=clock)
    yield provider
    provider.close()


@pytest.fixture
def crm(tmp_path: Path, clock: FakeClock) -> Iterator[CrmProvider]:
    provider = CrmProvider(tmp_path / "crm.db", clock=clock)
    yield provider
    provider.close()


@pytest.fixture
def notify(tmp_path: Path, clock: FakeClock) -> Iterator[NotifyProvider]:
    provider = NotifyProvider(tmp_path / "notify.db", clock=clock)
    yield provider
    provider.close()


# -- mail ------------------------------------------------------------------------------------


def test_send_returns_accepted_with_sequential_ids(mail: MailProvider) -> None:
    """A send answers accepted with a msg_<n> id and an ISO-8601 UTC timestamp."""
    first = mail.send("a@example.com", "hi", "body")
    second = mail.send("b@example.com", "hi", "body")
    assert first == {
        "provider_message_id": "msg_1",
        "status": "accepted",
        "accepted_at": "2023-11-14T22:13:20.000000+00:00",
        "replayed": False,
    }
    assert second["provider_message_id"] == "msg_2"


def test_send_same_key_same_payload_replays_original(mail: MailProvider, clock: FakeClock) -> None:
    """A retry with the same key and payload returns the original answer and sends nothing."""
    original = mail.send("a@example.com", "hi", "body", idempotency_key="k1")
    clock.advance(60)
    replay = mail.send("a@example.com", "hi", "body", idempotency_key="k1")
    assert replay == {**original, "replayed": True}
    assert len(mail.messages()) == 1
    assert [c["outcome"] for c in mail.calls("send")] == ["ok", "replayed"]


def test_send_same_key_different_payload_is_rejected_and_writes_nothing(
    mail: MailProvider,
) -> None:
    """The same key with a different payload raises IdempotencyKeyReused and changes nothing."""
    mail.send("a@example.com", "hi", "body", idempotency_key="k1")
    with pytest.raises(IdempotencyKeyReused) as info:
        mail.send("a@example.com", "hi", "another body", idempotency_key="k1")
    assert info.value.code == "idempotency_key_reused"
    assert info.value.status == 422
    assert [m["body"] for m in mail.messages()] == ["body"]
    assert mail.status(idempotency_key="k1") is not None
    assert mail.status(idempotency_key="k1")["body"] == "body"  # type: ignore[index]


def test_send_key_forgotten_after_retention(tmp_path: Path, clock: FakeClock) -> None:
    """After key_retention the key is forgotten and a retry really sends a duplicate."""
    with MailProvider(tmp_path / "mail.db", clock=clock, key_retention=100.0) as mail:
        mail.send("a@example.com", "hi", "body", idempotency_key="k1")
        clock.advance(100.0)
        assert mail.send("a@example.com", "hi", "body", idempotency_key="k1")["replayed"] is True
        clock.advance(0.5)
        assert mail.status(idempotency_key="k1") is None
        again = mail.send("a@example.com", "hi", "other", idempotency_key="k1")
        assert (again["provider_message_id"], again["replayed"]) == ("msg_2", False)
        assert len(mail.messages()) == 2
        assert mail.status(idempotency_key="k1")["provider_message_id"] == "msg_2"  # type: ignore[index]


def test_status_progresses_accepted_sent_delivered(mail: MailProvider, clock: FakeClock) -> None:
    """Status is computed from the clock: accepted, then sent, then delivered."""
    sent = mail.send("a@example.com", "hi", "body", idempotency_key="k1")
    status = mail.status(message_id=sent["provider_message_id"])
    assert status is not None
    assert status["status"] == "accepted"
    assert "sent_at" not in status
    assert "delivered_at" not in status
    clock.advance(0.3)
    status = mail.status(message_id=sent["provider_message_id"])
    assert status is not None
    assert status["status"] == "sent"
    assert status["sent_at"] == "2023-11-14T22:13:20.300000+00:00"
    assert "delivered_at" not in status
    clock.advance(0.5)
    status = mail.status(message_id=sent["provider_message_id"])
    assert status is not None
    assert status["status"] == "delivered"
    assert status["delivered_at"] == "2023-11-14T22:13:20.800000+00:00"


def test_status_looks_up_by_key_and_by_id(mail: MailProvider) -> None:
    """status() finds a message by idempotency key or by provider id, and None otherwise."""
    sent = mail.send("a@example.com", "hi", "body", idempotency_key="k1", metadata={"op": "x"})
    by_key = mail.status(idempotency_key="k1")
    by_id = mail.status(message_id=sent["provider_message_id"])
    assert by_key == by_id
    assert by_key is not None
    assert by_key["idempotency_key"] == "k1"
    assert by_key["metadata"] == {"op": "x"}
    assert by_key["to"] == "a@example.com"
    assert mail.status(idempotency_key="nope") is None
    assert mail.status(message_id="msg_99") is None
    assert mail.status(message_id="garbage") is None
    with pytest.raises(ValueError):
        mail.status()
    with pytest.raises(ValueError):
        mail.status(idempotency_key="k1", message_id="msg_1")


def test_find_by_metadata_and_filter_messages_by_recipient(mail: MailProvider) -> None:
    """find() matches messages containing every given metadata pair; messages() filters by to."""
    mail.send("a@example.com", "s", "b", metadata={"case": "92", "op": "email"})
    mail.send("b@example.com", "s", "b", metadata={"case": "92"})
    mail.send("a@example.com", "s", "b")
    assert [m["provider_message_id"] for m in mail.find(case="92")] == ["msg_1", "msg_2"]
    assert [m["provider_message_id"] for m in mail.find(case="92", op="email")] == ["msg_1"]
    assert mail.find(case="93") == []
    assert [m["provider_message_id"] for m in mail.messages(to="a@example.com")] == [
        "msg_1",
        "msg_3",
    ]


def test_send_invalid_address_is_rejected(mail: MailProvider) -> None:
    """An address without "@" raises ProviderRejected(invalid_address) and sends nothing."""
    with pytest.raises(ProviderRejected) as info:
        mail.send("not-an-address", "hi", "body", idempotency_key="k1")
    assert info.value.code == "invalid_address"
    assert mail.messages() == []
    assert mail.status(idempotency_key="k1") is None
    assert mail.calls()[0]["outcome"] == "invalid_address"


# -- crm -------------------------------------------------------------------------------------


def test_crm_upsert_is_idempotent_by_key(crm: CrmProvider) -> None:
    """Repeating an upsert with the same key and payload returns the same task, created once."""
    first = crm.upsert_task("case_92", "Call back", idempotency_key="k1", owner="ann")
    again = crm.upsert_task("case_92", "Call back", idempotency_key="k1", owner="ann")
    assert first == {
        "task_id": "task_1",
        "case_id": "case_92",
        "title": "Call back",
        "owner": "ann",
        "created_at": "2023-11-14T22:13:20.000000+00:00",
        "replayed": False,
    }
    assert again == {**first, "replayed": True}
    assert len(crm.tasks()) == 1
    assert crm.get_task(idempotency_key="k1") == crm.get_task(task_id="task_1")
    assert crm.get_task(task_id="task_1") == {
        **{k: v for k, v in first.items() if k != "replayed"},
        "idempotency_key": "k1",
    }
    assert crm.get_task(idempotency_key="other") is None
    assert crm.get_task(task_id="task_9") is None


def test_crm_same_key_different_payload_is_rejected(crm: CrmProvider) -> None:
    """An upsert reusing a key with a different payload raises and leaves the task unchanged."""
    crm.upsert_task("case_92", "Call back", idempotency_key="k1")
    with pytest.raises(IdempotencyKeyReused):
        crm.upsert_task("case_92", "Something else", idempotency_key="k1")
    assert [t["title"] for t in crm.tasks()] == ["Call back"]


def test_crm_tasks_filter_by_case(crm: CrmProvider) -> None:
    """tasks(case_id=...) lists only that case's tasks."""
    crm.upsert_task("case_1", "a", idempotency_key="k1")
    crm.upsert_task("case_2", "b", idempotency_key="k2")
    assert [t["task_id"] for t in crm.tasks(case_id="case_2")] == ["task_2"]


# -- notify ----------------------------------------------------------------------------------


def test_notify_posts_duplicates_but_search_by_tag_finds_them(notify: NotifyProvider) -> None:
    """Posting twice with one tag posts twice (no dedup); search by tag finds both."""
    first = notify.post("#ops", "case 92 done", client_tag="op_92")
    second = notify.post("#ops", "case 92 done", client_tag="op_92")
    notify.post("#other", "unrelated")
    assert first == {
        "notification_id": "ntf_1",
        "channel": "#ops",
        "text": "case 92 done",
        "client_tag": "op_92",
        "posted_at": "2023-11-14T22:13:20.000000+00:00",
    }
    assert second["notification_id"] == "ntf_2"
    assert [n["notification_id"] for n in notify.search(client_tag="op_92")] == ["ntf_1", "ntf_2"]
    assert notify.search(client_tag="missing") == []
    assert len(notify.notifications()) == 3
    assert [n["notification_id"] for n in notify.notifications(channel="#other")] == ["ntf_3"]


def test_notify_rejects_empty_channel(notify: NotifyProvider) -> None:
    """An empty channel is rejected like Slack's channel_not_found, posting nothing."""
    with pytest.raises(ProviderRejected) as info:
        notify.post("", "text")
    assert info.value.code == "channel_not_found"
    assert notify.notifications() == []


# -- faults ----------------------------------------------------------------------------------


def test_lose_response_commits_then_raises_timeout(mail: MailProvider) -> None:
    """lose_response commits the send durably, then the caller gets ProviderTimeout."""
    mail.inject("send", "lose_response")
    with pytest.raises(ProviderTimeout):
        mail.send("a@example.com", "hi", "body", idempotency_key="k1")
    assert len(mail.messages()) == 1
    assert mail.status(idempotency_key="k1") is not None
    retry = mail.send("a@example.com", "hi", "body", idempotency_key="k1")
    assert retry["replayed"] is True
    assert [c["fault"] for c in mail.calls()] == ["lose_response", None]


def test_lose_response_on_crm_and_notify_commits(crm: CrmProvider, notify: NotifyProvider) -> None:
    """lose_response commits on every provider: the task and the post exist after the timeout."""
    crm.inject("upsert_task", "lose_response")
    notify.inject("post", "lose_response")
    with pytest.raises(ProviderTimeout):
        crm.upsert_task("case_1", "t", idempotency_key="k1")
    with pytest.raises(ProviderTimeout):
        notify.post("#ops", "hello", client_tag="tag1")
    assert crm.get_task(idempotency_key="k1") is not None
    assert len(notify.search(client_tag="tag1")) == 1


@pytest.mark.parametrize(
    ("fault", "raised"),
    [
        ("fail_before_commit", ProviderUnavailable),
        ("timeout_before_commit", ProviderTimeout),
        ("reject", ProviderRejected),
    ],
)
def test_faults_before_commit_commit_nothing(
    tmp_path: Path, clock: FakeClock, fault: str, raised: type[Exception]
) -> None:
    """fail_before_commit, timeout_before_commit and reject raise and commit nothing anywhere."""
    with (
        MailProvider(tmp_path / "mail.db", clock=clock) as mail,
        CrmProvider(tmp_path / "crm.db", clock=clock) as crm,
        NotifyProvider(tmp_path / "notify.db", clock=clock) as notify,
    ):
        mail.inject("send", fault)  # type: ignore[arg-type]
        crm.inject("upsert_task", fault)  # type: ignore[arg-type]
        notify.inject("post", fault)  # type: ignore[arg-type]
        with pytest.raises(raised):
            mail.send("a@example.com", "hi", "body", idempotency_key="k1")
        with pytest.raises(raised):
            crm.upsert_task("case_1", "t", idempotency_key="k1")
        with pytest.raises(raised):
            notify.post("#ops", "hello", client_tag="tag1")
        assert mail.messages() == []
        assert mail.status(idempotency_key="k1") is None
        assert crm.tasks() == []
        assert notify.notifications() == []
        assert mail.calls() == [
            {
                "call_id": 1,
                "operation": "send",
                "at": "2023-11-14T22:13:20.000000+00:00",
                "fault": fault,
                "key": "k1",
                "outcome": "not_committed",
            }
        ]
        # The fault was consumed: the next call goes through.
        mail.send("a@example.com", "hi", "body", idempotency_key="k1")
        assert len(mail.messages()) == 1


def test_fault_error_attributes(mail: MailProvider) -> None:
    """Injected errors carry stable codes and statuses; a timeout is not a ProviderError."""
    mail.inject("send", "fail_before_commit")
    mail.inject("send", "reject")
    with pytest.raises(ProviderUnavailable) as unavailable:
        mail.send("a@example.com", "s", "b")
    assert (unavailable.value.code, unavailable.value.status) == ("unavailable", 503)
    with pytest.raises(ProviderRejected) as rejected:
        mail.send("a@example.com", "s", "b")
    assert rejected.value.code == "rejected"
    assert not issubclass(ProviderTimeout, ProviderError)
    assert issubclass(ProviderTimeout, TimeoutError)


def test_fault_after_and_times(mail: MailProvider) -> None:
    """after=N lets N calls through, then times=M calls get the fault, then calls succeed."""
    mail.inject("send", "fail_before_commit", after=2, times=2)
    outcomes = []
    for i in range(5):
        try:
            mail.send("a@example.com", "s", f"b{i}")
            outcomes.append("ok")
        except ProviderUnavailable:
            outcomes.append("unavailable")
    assert outcomes == ["ok", "ok", "unavailable", "unavailable", "ok"]
    assert [c["fault"] for c in mail.calls("send")] == [
        None,
        None,
        "fail_before_commit",
        "fail_before_commit",
        None,
    ]


def test_clear_faults_removes_pending_rules(mail: MailProvider) -> None:
    """clear_faults() drops every pending rule so the next call succeeds."""
    mail.inject("send", "fail_before_commit", times=3)
    mail.clear_faults()
    assert mail.send("a@example.com", "s", "b")["status"] == "accepted"


def test_inject_validates_its_arguments(mail: MailProvider) -> None:
    """inject() refuses unknown operations, unknown faults and nonsensical counts."""
    with pytest.raises(ValueError):
        mail.inject("post", "reject")
    with pytest.raises(ValueError):
        mail.inject("send", "explode")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        mail.inject("send", "reject", times=0)
    with pytest.raises(ValueError):
        mail.inject("send", "reject", after=-1)


def test_fault_rule_is_shared_through_the_file(tmp_path: Path, clock: FakeClock) -> None:
    """A rule injected by one provider object applies to a second object on the same file."""
    path = tmp_path / "mail.db"
    with MailProvider(path, clock=clock) as tester, MailProvider(path, clock=clock) as worker:
        tester.inject("send", "lose_response")
        with pytest.raises(ProviderTimeout):
            worker.send("a@example.com", "s", "b", idempotency_key="k1")
        assert tester.status(idempotency_key="k1") is not None
        assert tester.calls()[0]["fault"] == "lose_response"
        assert worker.send("a@example.com", "s", "b", idempotency_key="k1")["replayed"] is True


def test_fault_rule_is_consumed_once_under_concurrency(tmp_path: Path) -> None:
    """With many threads on several objects, a times=3 rule hits exactly three calls."""
    path = tmp_path / "mail.db"
    providers = [MailProvider(path) for _ in range(4)]
    providers[0].inject("send", "fail_before_commit", times=3)
    failures: list[int] = []
    lock = threading.Lock()

    def worker(provider: MailProvider, n: int) -> None:
        for i in range(10):
            try:
                provider.send("a@example.com", "s", f"{n}-{i}")
            except ProviderUnavailable:
                with lock:
                    failures.append(n)

    threads = [threading.Thread(target=worker, args=(p, n)) for n, p in enumerate(providers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(failures) == 3
    assert len(providers[0].messages()) == 37
    for provider in providers:
        provider.close()


def test_closed_provider_refuses_calls(tmp_path: Path) -> None:
    """A closed provider raises instead of touching a closed connection; close() is repeatable."""
    mail = MailProvider(tmp_path / "mail.db")
    mail.close()
    mail.close()
    with pytest.raises(RuntimeError):
        mail.send("a@example.com", "s", "b")


# -- durability across a SIGKILL -------------------------------------------------------------


@pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL")
def test_send_survives_sigkill_of_the_calling_process(tmp_path: Path) -> None:
    """A process SIGKILLed right after send returned leaves exactly one message in the file."""
    path = tmp_path / "mail.db"
    child = textwrap.dedent(
        """
        import os, signal, sys
        from effectflow.testing.providers import MailProvider

        mail = MailProvider(sys.argv[1])
        mail.send("a@example.com", "hi", "body", idempotency_key="k1")
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    src = Path(__file__).resolve().parents[2] / "src"
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    result = subprocess.run(
        [sys.executable, "-c", child, str(path)], env=env, capture_output=True, timeout=60
    )
    assert result.returncode == -signal.SIGKILL, result.stderr.decode()
    with MailProvider(path) as mail:
        messages = mail.messages()
        assert len(messages) == 1
        assert messages[0]["idempotency_key"] == "k1"
        assert mail.send("a@example.com", "hi", "body", idempotency_key="k1")["replayed"] is True
