"""The simulated providers behind a real HTTP service in a subprocess, through the HTTP clients.

The service runs as ``effectflow testing serve-providers`` in its own process (started by
``ProviderService``), so every call below crosses a real socket on loopback. The providers' files
stay the truth: a test that loses a response opens the file directly and finds the effect there.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from effectflow.testing import (
    CrmProvider,
    DeployTarget,
    HttpCrm,
    HttpDeploy,
    HttpMail,
    HttpNotify,
    HttpPayments,
    IdempotencyKeyReused,
    MailProvider,
    NotifyProvider,
    PaymentsProvider,
    ProviderRejected,
    ProviderService,
    ProviderTimeout,
    ProviderUnavailable,
    RevisionConflict,
)

#: A client read timeout short enough to keep lost-response tests quick, long enough for fsync.
SHORT_TIMEOUT = 0.5


class Clients:
    """One HTTP client per provider, all pointed at one service."""

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        self.mail = HttpMail(url, timeout=timeout)
        self.crm = HttpCrm(url, timeout=timeout)
        self.notify = HttpNotify(url, timeout=timeout)
        self.payments = HttpPayments(url, timeout=timeout)
        self.deploy = HttpDeploy(url, timeout=timeout)
        self.all = (self.mail, self.crm, self.notify, self.payments, self.deploy)

    def close(self) -> None:
        for client in self.all:
            client.close()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProviderService]:
    svc = ProviderService.start(tmp_path_factory.mktemp("providers"))
    yield svc
    assert svc.stop() == 0


@pytest.fixture
def clients(service: ProviderService) -> Iterator[Clients]:
    made = Clients(service.url)
    yield made
    for client in made.all:
        client.clear_faults()  # a fault a failed test left unconsumed must not leak
    made.close()


@pytest.fixture
def short(service: ProviderService) -> Iterator[Clients]:
    made = Clients(service.url, timeout=SHORT_TIMEOUT)
    yield made
    made.close()


@pytest.fixture
def uid() -> str:
    return uuid.uuid4().hex[:12]


# -- each provider over HTTP ---------------------------------------------------------------------


def test_mail_send_replays_a_key_and_refuses_it_for_another_payload(
    clients: Clients, uid: str
) -> None:
    """A repeated key replays the first answer; the same key with another body is refused (422)."""
    to = f"{uid}@example.com"
    first = clients.mail.send(to, "Hi", "body", idempotency_key=uid, metadata={"op": uid})
    again = clients.mail.send(to, "Hi", "body", idempotency_key=uid, metadata={"op": uid})
    assert first["replayed"] is False
    assert again == {**first, "replayed": True}
    with pytest.raises(IdempotencyKeyReused) as reused:
        clients.mail.send(to, "Hi", "another body", idempotency_key=uid)
    assert (reused.value.status, reused.value.code) == (422, "idempotency_key_reused")
    assert reused.value.idempotency_key == uid
    status = clients.mail.status(idempotency_key=uid)
    assert status is not None
    assert status["provider_message_id"] == first["provider_message_id"]
    assert [m["provider_message_id"] for m in clients.mail.messages(to=to)] == [
        first["provider_message_id"]
    ]
    assert [m["to"] for m in clients.mail.find(op=uid)] == [to]
    assert clients.mail.status(message_id="msg_999999999") is None
    with pytest.raises(ValueError, match="exactly one"):
        clients.mail.status()
    with pytest.raises(ProviderRejected) as rejected:
        clients.mail.send("not-an-address", "Hi", "body")
    assert (rejected.value.code, rejected.value.status) == ("invalid_address", 422)


def test_crm_upsert_is_idempotent_by_key(clients: Clients, uid: str) -> None:
    """The task is created once per key; another payload under the key and empty fields are refused."""
    task = clients.crm.upsert_task(f"case-{uid}", "Call back", idempotency_key=uid, owner="ana")
    again = clients.crm.upsert_task(f"case-{uid}", "Call back", idempotency_key=uid, owner="ana")
    assert again == {**task, "replayed": True}
    with pytest.raises(IdempotencyKeyReused):
        clients.crm.upsert_task(f"case-{uid}", "Something else", idempotency_key=uid)
    assert clients.crm.get_task(idempotency_key=uid) == clients.crm.get_task(
        task_id=task["task_id"]
    )
    assert [t["task_id"] for t in clients.crm.tasks(case_id=f"case-{uid}")] == [task["task_id"]]
    assert clients.crm.get_task(idempotency_key=f"{uid}-none") is None
    with pytest.raises(ProviderRejected) as rejected:
        clients.crm.upsert_task(f"case-{uid}", "", idempotency_key=f"{uid}-2")
    assert (rejected.value.code, rejected.value.status) == ("invalid_field", 400)


def test_notify_posts_every_call_and_finds_them_by_tag(clients: Clients, uid: str) -> None:
    """Posting twice with one tag posts twice (no deduplication); search finds both."""
    first = clients.notify.post("#support", "hello", client_tag=uid)
    second = clients.notify.post("#support", "hello", client_tag=uid)
    assert first["notification_id"] != second["notification_id"]
    assert [n["notification_id"] for n in clients.notify.search(client_tag=uid)] == [
        first["notification_id"],
        second["notification_id"],
    ]
    assert first in clients.notify.notifications(channel="#support")
    with pytest.raises(ProviderRejected) as rejected:
        clients.notify.post("", "hello")
    assert (rejected.value.code, rejected.value.status) == ("channel_not_found", 404)


def test_payments_refund_replay_lookup_and_cancel(clients: Clients, uid: str) -> None:
    """A refund replays under its key, is found by key and id, and is cancelled once."""
    payment = f"pay_{uid}"
    refund = clients.payments.create_refund(payment, 500, idempotency_key=uid, metadata={"a": "b"})
    again = clients.payments.create_refund(payment, 500, idempotency_key=uid, metadata={"a": "b"})
    assert again == {**refund, "replayed": True}
    with pytest.raises(IdempotencyKeyReused):
        clients.payments.create_refund(payment, 600, idempotency_key=uid)
    by_key = clients.payments.get_refund_by_idempotency_key(uid)
    assert by_key is not None
    assert by_key == clients.payments.get_refund(refund["refund_id"])
    assert by_key["metadata"] == {"a": "b"}
    assert clients.payments.get_refund_by_idempotency_key(f"{uid}-none") is None
    assert clients.payments.get_refund("re_999999999") is None

    cancel = clients.payments.cancel_refund(refund["refund_id"], idempotency_key=f"{uid}-c")
    assert cancel["status"] == "canceled"
    with pytest.raises(ProviderRejected) as twice:
        clients.payments.cancel_refund(refund["refund_id"], idempotency_key=f"{uid}-c2")
    assert (twice.value.code, twice.value.status) == ("refund_already_canceled", 409)
    assert clients.payments.count_refunds(payment) == 1
    assert clients.payments.count_refunds(payment, status="succeeded") == 0
    with pytest.raises(ProviderRejected) as no_key:
        clients.payments.create_refund(payment, 1, idempotency_key="")
    assert (no_key.value.code, no_key.value.status) == ("invalid_idempotency_key", 400)


def test_deploy_precondition_conflict_is_a_412(clients: Clients, uid: str) -> None:
    """A deploy on a stale If-Match raises RevisionConflict and writes nothing."""
    target = f"deployment/{uid}"
    clients.deploy.seed(target, "app:1")
    with pytest.raises(ValueError, match="already has state"):
        clients.deploy.seed(target, "app:1")
    seen = clients.deploy.observe(target)
    assert (seen["revision"], seen["image"], seen["etag"]) == (1, "app:1", '"r1"')
    clients.deploy.concurrent_deploy(target, "app:theirs")
    with pytest.raises(RevisionConflict) as conflict:
        clients.deploy.deploy(target, "app:2", if_match=seen["etag"], idempotency_key=uid)
    assert (conflict.value.status, conflict.value.code) == (412, "revision_mismatch")
    assert (conflict.value.target, conflict.value.expected, conflict.value.current) == (
        target,
        1,
        2,
    )
    fresh = clients.deploy.observe(target)
    done = clients.deploy.deploy(target, "app:2", if_match=fresh["etag"], idempotency_key=uid)
    assert (done["revision"], done["replayed"]) == (3, False)
    again = clients.deploy.deploy(target, "app:2", if_match=fresh["etag"], idempotency_key=uid)
    assert again == {**done, "replayed": True}
    assert [d["writer"] for d in clients.deploy.history(target)] == ["other", "us"]
    assert clients.deploy.overwrites(target) == 0
    found = clients.deploy.get_deployment_by_idempotency_key(uid)
    assert found is not None
    assert found["deployment_id"] == done["deployment_id"]
    with pytest.raises(ProviderRejected) as bad:
        clients.deploy.deploy(target, "app:3", if_match="r3")
    assert (bad.value.code, bad.value.status) == ("invalid_precondition", 400)


# -- injected faults across the network ----------------------------------------------------------


def _lose(kind: str, c: Clients, key: str) -> None:
    if kind == "mail":
        c.mail.send(f"{key}@example.com", "s", "b", idempotency_key=key)
    elif kind == "crm":
        c.crm.upsert_task(f"case-{key}", "t", idempotency_key=key)
    elif kind == "notify":
        c.notify.post("#ops", "t", client_tag=key)
    elif kind == "payments":
        c.payments.create_refund(f"pay_{key}", 100, idempotency_key=key)
    else:
        c.deploy.deploy(f"svc/{key}", "app:1", idempotency_key=key)


def _committed(kind: str, path: Path, key: str) -> bool:
    """Whether the provider's own file shows the effect made under ``key``."""
    if kind == "mail":
        with MailProvider(path) as mail:
            return mail.status(idempotency_key=key) is not None
    if kind == "crm":
        with CrmProvider(path) as crm:
            return crm.get_task(idempotency_key=key) is not None
    if kind == "notify":
        with NotifyProvider(path) as notify:
            return len(notify.search(client_tag=key)) == 1
    if kind == "payments":
        with PaymentsProvider(path) as payments:
            return payments.get_refund_by_idempotency_key(key) is not None
    with DeployTarget(path) as deploy:
        return deploy.get_deployment_by_idempotency_key(key) is not None


OPERATION = {
    "mail": "send",
    "crm": "upsert_task",
    "notify": "post",
    "payments": "create_refund",
    "deploy": "deploy",
}


@pytest.mark.parametrize("kind", list(OPERATION))
def test_a_lost_response_is_a_real_read_timeout_after_the_commit(
    service: ProviderService, clients: Clients, short: Clients, kind: str, uid: str
) -> None:
    """lose_response: the client's read timeout fires and the provider's file has the effect."""
    # Only the call that loses its response uses the short timeout; set-up and checks do not.
    client = getattr(clients, kind)
    client.inject(OPERATION[kind], "lose_response")
    started = time.monotonic()
    with pytest.raises(ProviderTimeout) as lost:
        _lose(kind, short, uid)
    waited = time.monotonic() - started
    assert isinstance(lost.value.__cause__, httpx.ReadTimeout)
    assert (lost.value.operation, lost.value.key) == (OPERATION[kind], uid)
    assert SHORT_TIMEOUT <= waited < SHORT_TIMEOUT + 2
    assert _committed(kind, service.path(kind), uid)
    last = client.calls(OPERATION[kind])[-1]
    assert (last["fault"], last["outcome"], last["key"]) == ("lose_response", "ok", uid)


def test_a_retry_after_a_lost_response_replays_instead_of_refunding_twice(
    clients: Clients, short: Clients, uid: str
) -> None:
    """After a lost response the same key answers the first refund, replayed, and moves no money."""
    clients.payments.inject("create_refund", "lose_response")
    with pytest.raises(ProviderTimeout):
        short.payments.create_refund(f"pay_{uid}", 100, idempotency_key=uid)
    retry = clients.payments.create_refund(f"pay_{uid}", 100, idempotency_key=uid)
    assert retry["replayed"] is True
    assert clients.payments.count_refunds(f"pay_{uid}") == 1


def test_timeout_before_commit_times_out_with_nothing_committed(
    service: ProviderService, clients: Clients, short: Clients, uid: str
) -> None:
    """timeout_before_commit looks the same to the client, but the file has no effect."""
    clients.mail.inject("send", "timeout_before_commit")
    with pytest.raises(ProviderTimeout):
        _lose("mail", short, uid)
    assert not _committed("mail", service.path("mail"), uid)


@pytest.mark.parametrize("kind", list(OPERATION))
def test_fail_before_commit_is_a_503_with_nothing_committed(
    service: ProviderService, clients: Clients, kind: str, uid: str
) -> None:
    """fail_before_commit: ProviderUnavailable (503) and the provider's file has no effect."""
    getattr(clients, kind).inject(OPERATION[kind], "fail_before_commit")
    with pytest.raises(ProviderUnavailable) as unavailable:
        _lose(kind, clients, uid)
    assert (unavailable.value.status, unavailable.value.operation) == (503, OPERATION[kind])
    assert not _committed(kind, service.path(kind), uid)


def test_an_injected_reject_and_a_delayed_fault(
    service: ProviderService, clients: Clients, uid: str
) -> None:
    """``after`` lets calls through first; the rejected call commits nothing."""
    clients.crm.inject("upsert_task", "reject", after=1)
    clients.crm.upsert_task(f"case-{uid}", "t", idempotency_key=f"{uid}-1")
    with pytest.raises(ProviderRejected) as rejected:
        clients.crm.upsert_task(f"case-{uid}", "t", idempotency_key=f"{uid}-2")
    assert (rejected.value.code, rejected.value.status) == ("rejected", 422)
    assert _committed("crm", service.path("crm"), f"{uid}-1")
    assert not _committed("crm", service.path("crm"), f"{uid}-2")
    with pytest.raises(ValueError, match="unknown operation"):
        clients.crm.inject("delete_everything", "reject")


def test_a_malformed_request_is_a_400(service: ProviderService) -> None:
    """A body that is not JSON or lacks a field answers 400 invalid_request, never a 500."""
    with httpx.Client(base_url=service.url, trust_env=False) as raw:
        not_json = raw.post("/mail/send", content=b"{")
        missing = raw.post("/payments/refunds", json={"payment_id": "pay_1"})
        health = raw.get("/_admin/health")
    assert (not_json.status_code, not_json.json()["code"]) == (400, "invalid_request")
    assert (missing.status_code, missing.json()["code"]) == (400, "invalid_request")
    assert health.json()["status"] == "ok"
    assert set(health.json()["providers"]) == set(OPERATION)


# -- the network itself --------------------------------------------------------------------------


def test_connection_refused_is_unavailable() -> None:
    """Nothing listening: the request never left, so ProviderUnavailable (safe to retry)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with (
        HttpMail(f"http://127.0.0.1:{port}", timeout=2) as mail,
        pytest.raises(ProviderUnavailable),
    ):
        mail.send("a@example.com", "s", "b", idempotency_key="k")


def test_a_reset_after_the_request_was_sent_is_an_unknown_outcome() -> None:
    """The server reads the request and resets the connection: ProviderTimeout, not unavailable."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def read_then_reset() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(65536)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

        server = threading.Thread(target=read_then_reset)
        server.start()
        try:
            with (
                HttpPayments(f"http://127.0.0.1:{port}", timeout=5) as payments,
                pytest.raises(ProviderTimeout) as lost,
            ):
                payments.create_refund("pay_1", 100, idempotency_key="k-reset")
        finally:
            server.join(5)
    assert lost.value.key == "k-reset"


def _in_thread(call: Callable[[], Any]) -> tuple[threading.Thread, dict[str, BaseException]]:
    seen: dict[str, BaseException] = {}

    def run() -> None:
        try:
            call()
        except BaseException as exc:
            seen["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, seen


def test_sigterm_shuts_down_cleanly_even_while_a_response_is_held(tmp_path: Path) -> None:
    """SIGTERM exits 0 promptly although a lost response is being held; its client times out."""
    svc = ProviderService.start(tmp_path / "svc")
    try:
        with HttpNotify(svc.url, timeout=30) as notify:
            notify.inject("post", "lose_response")
            thread, seen = _in_thread(lambda: notify.post("#ops", "t", client_tag="held"))
            deadline = time.monotonic() + 5
            while not _committed("notify", svc.path("notify"), "held"):
                assert time.monotonic() < deadline, "the post never reached the provider"
                time.sleep(0.01)
            started = time.monotonic()
            code = svc.stop(timeout=10)
            stopped_in = time.monotonic() - started
            thread.join(10)
    finally:
        svc.stop()
    assert code == 0
    assert stopped_in < 3
    assert isinstance(seen.get("error"), ProviderTimeout)
    log = (svc.directory / ProviderService.LOG_NAME).read_text()
    assert "Traceback" not in log


def test_without_the_testing_extra_the_command_names_it(tmp_path: Path) -> None:
    """serve-providers without uvicorn installed says which extra to install, and exits 1."""
    # A fresh interpreter in which importing uvicorn fails, as where the extra is not installed.
    script = (
        "import sys; sys.modules['uvicorn'] = None; from effectflow.cli.main import main; "
        f"sys.argv = ['effectflow', 'testing', 'serve-providers', '--dir', {str(tmp_path)!r}]; "
        "main()"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 1
    assert "pip install 'effectflow[testing]'" in result.stderr
    assert "uvicorn" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_port_in_use_is_a_clear_failure(tmp_path: Path) -> None:
    """serve-providers on a port already taken exits 1 and says it could not listen."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        command = [sys.executable, "-m", "effectflow.cli.main", "testing", "serve-providers"]
        result = subprocess.run(
            [*command, "--dir", str(tmp_path), "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert result.returncode == 1
    assert f"could not listen on 127.0.0.1:{port}" in result.stderr
