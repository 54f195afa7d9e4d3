"""HTTP tools against real local servers: every row of the mapping table, over real sockets.

The simulated providers' service (a subprocess) gives the provider-shaped rows: replay by key,
lost responses, 503 before commit, rejections, key reuse, stale If-Match. A tiny server started in
the test gives what the providers cannot: the draft's in-progress 409, 5xx after sending, resets,
closes, slow answers and refused connections.
"""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

import effectflow as ef
from effectflow.contracts.registry import Registry
from effectflow.contrib.http import (
    HttpIdempotencyConflict,
    http_lookup,
    http_tool,
    signal_for_response,
    signal_for_transport_error,
)
from effectflow.testing import ProviderService

KEYED = ef.Idempotency(supported=True)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProviderService]:
    svc = ProviderService.start(tmp_path_factory.mktemp("providers"))
    yield svc
    assert svc.stop() == 0


@pytest.fixture
def client(service: ProviderService) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=service.url, timeout=5.0, trust_env=False) as made:
        yield made
        for provider in (
            "mail",
            "deploy",
            "notify",
        ):  # a fault a failed test left unconsumed must not leak
            made.post("/_admin/clear_faults", json={"provider": provider})


@pytest.fixture
def uid() -> str:
    return uuid.uuid4().hex[:12]


def inject(client: httpx.Client, provider: str, operation: str, fault: str) -> None:
    body = {"provider": provider, "operation": operation, "fault": fault}
    assert client.post("/_admin/inject", json=body).status_code == 204


def send_email(
    client: httpx.Client,
    *,
    timeout: float | None = None,
    attempts: int = 3,
    deadline_header: str | None = None,
) -> ef.Tool[..., Any]:
    return http_tool(
        "http_send_email",
        "POST",
        "/mail/send",
        effect="external_write",
        body=("to", "subject", "body", "metadata"),
        idempotency=KEYED,
        confirm="http_email_status",
        effect_id="provider_message_id",
        timeout=timeout,
        deadline_header=deadline_header,
        client=client,
        register=False,
        retry=ef.RetryPolicy(max_attempts=attempts),
    )


def email_status(client: httpx.Client) -> ef.Tool[..., ef.Lookup]:
    return http_lookup(
        "http_email_status",
        "/mail/status",
        effect_id="provider_message_id",
        client=client,
        register=False,
    )


def sent_to(client: httpx.Client, to: str) -> list[dict[str, Any]]:
    answer: list[dict[str, Any]] = client.get("/mail/messages", params={"to": to}).json()["data"]
    return answer


# -- against the simulated providers' service ----------------------------------------------------


def test_a_keyed_send_succeeds_and_a_replay_of_the_key_sends_nothing_new(
    client: httpx.Client, uid: str
) -> None:
    """2xx returns the JSON body; the same key replays the first answer (one email)."""
    send = send_email(client)
    to = f"{uid}@example.com"
    first = send(to=to, subject="Hi", body="b", idempotency_key=uid)
    again = send(to=to, subject="Hi", body="b", idempotency_key=uid)
    assert first["status"] == "accepted"
    assert again == {**first, "replayed": True}
    assert len(sent_to(client, to)) == 1
    found = email_status(client)(idempotency_key=uid)
    assert found.status is ef.LookupStatus.CONFIRMED
    assert (found.external_effect_id, found.state) == (first["provider_message_id"], "accepted")
    assert email_status(client)(idempotency_key=f"{uid}-none") == ef.Lookup.not_committed(
        evidence={"status": 404, "code": "not_found", "message": "no such object"}
    )


def test_a_lost_response_is_unknown_and_the_lookup_confirms_the_one_email(
    service: ProviderService, client: httpx.Client, uid: str, tmp_path: Path
) -> None:
    """The provider commits, the answer never comes: OutcomeUnknown; a real run then confirms it by
    key and ends succeeded, with exactly one email at the provider (one attempt allowed, so the
    runtime looks the effect up instead of replaying the key)."""
    send, status = send_email(client, timeout=1.0, attempts=1), email_status(client)
    to = f"{uid}@example.com"
    inject(client, "mail", "send", "lose_response")
    with pytest.raises(ef.OutcomeUnknown) as lost:
        send(to=f"direct-{to}", subject="Hi", body="b", idempotency_key=f"{uid}-direct")
    assert lost.value.evidence["error"] == "ReadTimeout"
    assert len(sent_to(client, f"direct-{to}")) == 1  # it did commit

    registry = Registry()
    registry.add_tool(send)
    registry.add_tool(status)

    @ef.workflow("http_mail_case", register=False)
    def case(ctx: ef.Context, email: str) -> Any:
        return ctx.call("send", send, to=email, subject="Your case", body="b")

    inject(client, "mail", "send", "lose_response")
    with ef.Runtime(f"sqlite:///{tmp_path / 'ledger.db'}", registry=registry) as rt:
        run = rt.start(case, run_id=f"run-{uid}", email=to)
        assert run.status is ef.RunStatus.SUCCEEDED
        [step] = rt.steps(run.run_id)
        attempts = [(a.kind.value, a.outcome) for a in rt.attempts(run.run_id)]
    assert step.status is ef.StepStatus.CONFIRMED
    assert attempts == [("call", "unknown"), ("lookup", "committed")]
    [message] = sent_to(client, to)
    assert run.output["provider_message_id"] == message["provider_message_id"]


def test_a_503_before_commit_is_not_committed_and_the_runtime_retries_with_the_same_key(
    client: httpx.Client, uid: str, tmp_path: Path
) -> None:
    """fail_before_commit answers 503: NotCommitted; the runtime retries and one email is sent."""
    send = send_email(client)
    to = f"{uid}@example.com"
    inject(client, "mail", "send", "fail_before_commit")
    with pytest.raises(ef.NotCommitted) as refused:
        send(to=to, subject="Hi", body="b", idempotency_key=f"{uid}-direct")
    assert refused.value.evidence["status"] == 503
    assert sent_to(client, to) == []

    @ef.workflow("http_mail_retry", register=False)
    def case(ctx: ef.Context, email: str) -> Any:
        return ctx.call("send", send, to=email, subject="Hi", body="b")

    inject(client, "mail", "send", "fail_before_commit")
    with ef.Runtime(f"sqlite:///{tmp_path / 'ledger.db'}", registry=Registry()) as rt:
        run = rt.start(case, run_id=f"run-{uid}", email=to)
        [step] = rt.steps(run.run_id)
    assert run.status is ef.RunStatus.SUCCEEDED
    assert len(sent_to(client, to)) == 1
    calls = client.get("/_admin/calls/mail", params={"operation": "send"}).json()["data"]
    assert [c["outcome"] for c in calls if c["key"] == step.idempotency_key] == [
        "not_committed",
        "ok",
    ]


def test_a_provider_rejection_is_rejected_with_its_status_and_code(
    client: httpx.Client, uid: str
) -> None:
    """A 4xx is a definite no: Rejected, with the status and the provider's code as evidence."""
    send = send_email(client)
    with pytest.raises(ef.Rejected) as rejected:
        send(to="not-an-address", subject="Hi", body="b", idempotency_key=uid)
    assert rejected.value.evidence["status"] == 422
    assert rejected.value.evidence["code"] == "invalid_address"
    inject(client, "mail", "send", "reject")
    with pytest.raises(ef.Rejected):
        send(to=f"{uid}@example.com", subject="Hi", body="b", idempotency_key=f"{uid}-2")
    assert sent_to(client, f"{uid}@example.com") == []


def test_the_same_key_with_another_payload_is_an_idempotency_conflict(
    client: httpx.Client, uid: str
) -> None:
    """422 idempotency_key_reused raises IdempotencyConflict naming the key."""
    send = send_email(client)
    send(to=f"{uid}@example.com", subject="Hi", body="b", idempotency_key=uid)
    with pytest.raises(ef.IdempotencyConflict) as reused:
        send(to=f"{uid}@example.com", subject="Hi", body="other", idempotency_key=uid)
    assert isinstance(reused.value, HttpIdempotencyConflict)
    assert reused.value.idempotency_key == uid
    assert reused.value.evidence["code"] == "idempotency_key_reused"


def test_a_stale_if_match_is_a_conflict_and_a_fresh_one_deploys(
    client: httpx.Client, uid: str
) -> None:
    """precondition.if_match travels as If-Match: a stale ETag answers 412, a Conflict."""
    target = f"svc-{uid}"
    assert client.post(f"/deploy/{target}/seed", json={"image": "v1"}).status_code == 204
    deploy = http_tool(
        "http_deploy",
        "POST",
        "/deploy/{target}/deploy",
        effect="external_write",
        body=("image",),
        idempotency=KEYED,
        client=client,
        register=False,
    )
    seen = client.get(f"/deploy/{target}").json()
    client.post(f"/deploy/{target}/concurrent_deploy", json={"image": "theirs"})
    with pytest.raises(ef.Conflict) as stale:
        deploy(
            target=target,
            image="v2",
            idempotency_key=uid,
            precondition=ef.Expect(etag=seen["etag"]),
        )
    assert stale.value.evidence["status"] == 412
    fresh = client.get(f"/deploy/{target}").json()
    done = deploy(
        target=target,
        image="v2",
        idempotency_key=f"{uid}-2",
        precondition=ef.Expect(etag=fresh["etag"]),
    )
    assert done["image"] == "v2"


def test_a_deadline_already_past_is_not_sent_at_all(client: httpx.Client, uid: str) -> None:
    """A call whose deadline passed before sending raises NotCommitted and sends nothing."""
    send = send_email(client, deadline_header="X-Request-Deadline")
    to = f"{uid}@example.com"
    with pytest.raises(ef.NotCommitted):
        send(to=to, subject="Hi", body="b", idempotency_key=uid, deadline=time.time() - 1)
    sent = send(to=to, subject="Hi", body="b", idempotency_key=uid, deadline=time.time() + 30)
    assert sent["status"] == "accepted"
    assert len(sent_to(client, to)) == 1


# -- a provider that does not deduplicate, searched by a tag ------------------------------------


def notify_post(
    client: httpx.Client,
    *,
    confirm: ef.Tool[..., Any] | None = None,
    effect: str = "external_write",
    **options: Any,
) -> ef.Tool[..., Any]:
    """A non-idempotent chat post: every call posts a new message (options: tags, bounds)."""
    return http_tool(
        "http_notify_post",
        "POST",
        "/notify/post",
        effect=effect,
        body=("channel", "text"),
        confirm=confirm,
        effect_id="notification_id",
        timeout=1.0,
        client=client,
        register=False,
        retry=ef.RetryPolicy(max_attempts=3),
        **options,
    )


def notify_search(client: httpx.Client) -> ef.Tool[..., ef.Lookup]:
    """The chat provider's search by client tag: the lookup by key, if the post carried the key."""
    return http_lookup(
        "http_notify_search",
        "/notify/search",
        key_query="client_tag",
        items="data",
        effect_id="notification_id",
        state=None,
        client=client,
        register=False,
    )


def test_a_tagged_post_is_confirmed_by_its_tag_after_a_lost_response(
    client: httpx.Client, uid: str, tmp_path: Path
) -> None:
    """A non-idempotent post carrying its key as the provider's client_tag: the provider commits
    and the answer is lost, the lookup by key finds the one message, the run succeeds, and the
    provider's own records hold exactly one post (never re-sent)."""
    search = notify_search(client)
    post = notify_post(client, confirm=search, key_field="client_tag", settles_within="PT2S")
    assert post.takes_key
    assert not post.takes_deadline
    assert post.contract.idempotency == ef.Idempotency(supported=False, tagged_as="body:client_tag")
    registry = Registry()
    registry.add_tool(post)
    registry.add_tool(search)
    channel = f"#case-{uid}"

    @ef.workflow("http_notify_case", register=False)
    def case(ctx: ef.Context) -> Any:
        return ctx.call("notify", post, channel=channel, text="case 92 is yours")

    inject(client, "notify", "post", "lose_response")
    with ef.Runtime(f"sqlite:///{tmp_path / 'ledger.db'}", registry=registry) as rt:
        run = rt.start(case, run_id=f"run-{uid}")
        assert run.status is ef.RunStatus.SUCCEEDED
        [step] = rt.steps(run.run_id)
        attempts = [(a.kind.value, a.outcome) for a in rt.attempts(run.run_id)]
    assert step.status is ef.StepStatus.CONFIRMED
    assert attempts == [("call", "unknown"), ("lookup", "committed")]
    [posted] = client.get("/notify/notifications", params={"channel": channel}).json()["data"]
    assert posted["client_tag"] == step.idempotency_key
    assert run.output["notification_id"] == posted["notification_id"]
    assert step.external_effect_id == posted["notification_id"]
    calls = client.get("/_admin/calls/notify", params={"operation": "post"}).json()["data"]
    mine = [(c["fault"], c["outcome"]) for c in calls if c["key"] == step.idempotency_key]
    assert mine == [("lose_response", "ok")]


def test_a_lookup_by_key_for_a_post_that_never_sends_the_key_is_refused_when_built(
    client: httpx.Client,
) -> None:
    """The search by client_tag would always find nothing for an untagged post, and "nothing"
    would re-send a post that may have landed: refused at build time, naming the fixes."""
    with pytest.raises(ef.ContractError) as refused:
        notify_post(client, confirm=notify_search(client))
    message = str(refused.value)
    assert "http_notify_search@1 searches by idempotency key (query:client_tag)" in message
    assert "never carries the key" in message
    for fix in ("key_header=", "key_field=", "key_query=", "supported=True", "external id"):
        assert fix in message
    by_path = http_lookup(
        "by_key_path", "/notify/{idempotency_key}", key_query=None, register=False
    )
    with pytest.raises(ef.ContractError, match=re.escape("path:{idempotency_key}")):
        notify_post(client, confirm=by_path)


def test_a_lookup_by_external_id_only_stays_allowed_for_an_untagged_post(
    client: httpx.Client,
) -> None:
    """A lookup that names the effect by the provider's id asks for nothing the call did not
    carry; the untagged post builds, takes no key and claims no tag."""
    by_id = http_lookup(
        "http_notification", "/notify/{external_effect_id}", key_query=None, register=False
    )
    post = notify_post(client, confirm=by_id, settles_within="unbounded")
    assert not post.takes_key
    assert post.contract.idempotency.tagged_as is None
    assert post.contract.confirm == by_id.ref


def test_a_post_whose_request_never_landed_is_sent_again_once_its_bound_has_passed(
    client: httpx.Client, uid: str, tmp_path: Path
) -> None:
    """settles_within, without a deadline: the request times out before the provider commits, a
    lookup before the bound is not proof (the run waits), the one after it is, and the post is
    sent again with the same key; the provider's records hold one post, and two calls."""
    search = notify_search(client)
    post = notify_post(client, confirm=search, key_field="client_tag", settles_within=2.0)
    registry = Registry()
    registry.add_tool(post)
    registry.add_tool(search)
    channel = f"#late-{uid}"

    @ef.workflow("http_notify_unlanded", register=False)
    def case(ctx: ef.Context) -> Any:
        return ctx.call("notify", post, channel=channel, text="case 93 is yours")

    inject(client, "notify", "post", "timeout_before_commit")
    started = time.monotonic()
    with ef.Runtime(f"sqlite:///{tmp_path / 'ledger.db'}", registry=registry) as rt:
        run = rt.start(case, run_id=f"run-{uid}")
        assert run.status is ef.RunStatus.SUCCEEDED
        [step] = rt.steps(run.run_id)
        attempts = [(a.kind.value, a.outcome) for a in rt.attempts(run.run_id)]
    assert time.monotonic() - started >= 2.0  # it waited for the bound before re-sending
    assert step.status is ef.StepStatus.CONFIRMED
    assert attempts[0] == ("call", "unknown")
    assert attempts[-2:] == [("lookup", "not_committed"), ("call", "committed")]
    [posted] = client.get("/notify/notifications", params={"channel": channel}).json()["data"]
    assert posted["client_tag"] == step.idempotency_key
    calls = client.get("/_admin/calls/notify", params={"operation": "post"}).json()["data"]
    mine = [(c["fault"], c["outcome"]) for c in calls if c["key"] == step.idempotency_key]
    assert mine == [("timeout_before_commit", "not_committed"), (None, "ok")]


def test_a_non_idempotent_post_with_a_lookup_and_no_bound_is_refused_naming_both_fixes(
    client: httpx.Client,
) -> None:
    """Tagged and looked up by its tag, but with neither deadline_header nor settles_within: the
    lookup's "not found" could never be proof, so the build is refused, naming the http_tool's
    fixes (not a `deadline` parameter, which an http_tool never writes)."""
    with pytest.raises(ef.ContractError) as refused:
        notify_post(client, confirm=notify_search(client), key_field="client_tag")
    message = str(refused.value)
    assert "tool http_notify_post (external_write, no idempotency)" in message
    assert "http_notify_search@1" in message
    for fix in ("deadline_header='X-Request-Deadline'", "settles_within=", "'unbounded'"):
        assert fix in message
    assert "`deadline` parameter" not in message
    assert isinstance(refused.value.__cause__, ef.ContractError)  # the engine's own refusal
    # An idempotent tool, or one declared idempotent_write, needs neither.
    keyed = send_email(client)
    assert not keyed.takes_deadline
    assert keyed.contract.settles_within is None
    natural = notify_post(
        client, confirm=notify_search(client), key_field="client_tag", effect="idempotent_write"
    )
    assert natural.contract.confirm == "http_notify_search@1"


def test_with_a_deadline_header_a_late_request_is_refused_by_the_service(
    service: ProviderService, uid: str
) -> None:
    """deadline_header opts in: the tool takes the runtime's deadline and sends it; a request that
    reaches the service after it (it left late: a slow hook before sending) is refused there,
    504 deadline_exceeded, and nothing is committed; one on time posts."""

    def leave_late(request: httpx.Request) -> None:
        if request.url.path == "/notify/post" and "late" in request.content.decode():
            time.sleep(0.5)

    hooks = {"request": [leave_late]}
    with httpx.Client(base_url=service.url, timeout=5.0, trust_env=False, event_hooks=hooks) as c:
        post = notify_post(
            c,
            confirm=notify_search(c),
            key_field="client_tag",
            deadline_header="X-Request-Deadline",
        )
        assert post.takes_deadline
        assert post.contract.settles_within is None
        channel = f"#due-{uid}"
        with pytest.raises(ef.OutcomeUnknown) as late:
            post(
                channel=channel,
                text="late",
                idempotency_key=f"{uid}-late",
                deadline=time.time() + 0.2,
            )
        assert (late.value.evidence["status"], late.value.evidence["code"]) == (
            504,
            "deadline_exceeded",
        )
        post(
            channel=channel, text="on time", idempotency_key=f"{uid}-ok", deadline=time.time() + 30
        )
        posted = c.get("/notify/notifications", params={"channel": channel}).json()["data"]
        assert [p["text"] for p in posted] == ["on time"]
        calls = c.get("/_admin/calls/notify", params={"operation": "post"}).json()["data"]
        keys = {f"{uid}-late", f"{uid}-ok"}
        mine = {call["key"]: call["outcome"] for call in calls if call["key"] in keys}
        assert mine == {f"{uid}-late": "deadline_exceeded", f"{uid}-ok": "ok"}
        with pytest.raises(ef.NotCommitted):  # already past: not even sent
            post(channel=channel, text="x", idempotency_key=f"{uid}-past", deadline=time.time())


# -- against a purpose-built server --------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    """Answers by path; ``/echo`` returns what it received."""

    protocol_version = "HTTP/1.1"
    ANSWERS: ClassVar[dict[str, tuple[int, dict[str, Any] | None]]] = {
        "/in-progress": (
            409,
            {
                "type": "https://example.com/idempotency",
                "title": "A request is outstanding for this Idempotency-Key",
            },
        ),
        "/stripe-in-use": (
            409,
            {"error": {"type": "idempotency_error", "code": "idempotency_key_in_use"}},
        ),
        "/conflict": (409, {"code": "duplicate_name", "message": "name taken"}),
        "/draft-reused": (422, {"title": "Idempotency-Key is already used"}),
        "/stripe-reused": (400, {"error": {"type": "idempotency_error", "message": "other"}}),
        "/not-found": (404, {"code": "not_found"}),
        "/throttled": (429, {"code": "rate_limited"}),
        "/unavailable": (503, {"code": "unavailable"}),
        "/500": (500, {"code": "internal"}),
        "/502": (502, None),
        "/504": (504, {"code": "timeout"}),
        "/303": (303, None),
        "/empty": (204, None),
    }

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        path = self.path.split("?")[0]
        if path == "/reset":
            # SO_LINGER 0: close() sends a RST after the request was read.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            self.connection.close()
            return
        if path == "/close":
            self.close_connection = True
            return  # no answer at all: the server just closes
        if path == "/slow":
            time.sleep(1.0)
        if path == "/text":
            self._send(200, b"plain words", "text/plain")
            return
        if path in ("/echo", "/slow"):
            echoed = {
                "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "json": json.loads(raw) if raw else None,
            }
            self._send(200, json.dumps(echoed).encode(), "application/json")
            return
        status, body = self.ANSWERS[path]
        self._send(status, b"" if body is None else json.dumps(body).encode(), "application/json")

    do_GET = do_POST

    def _send(self, status: int, payload: bytes, kind: str) -> None:
        self.send_response(status)
        if status == 429:
            self.send_header("Retry-After", "2")
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def tiny() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


def post_tool(
    url: str, *, keyed: bool = True, timeout: float = 5.0, deadline_header: str | None = None
) -> ef.Tool[..., Any]:
    return http_tool(
        "http_tiny",
        "POST",
        "/{path}",
        effect="external_write",
        body=("text",),
        query=("q",),
        idempotency=KEYED if keyed else None,
        base_url=url,
        timeout=timeout,
        deadline_header=deadline_header,
        headers=lambda: {"Authorization": "Bearer t0ken"},
        register=False,
    )


@pytest.mark.parametrize(
    ("path", "signal", "status"),
    [
        ("/in-progress", ef.NotCommitted, 409),
        ("/stripe-in-use", ef.NotCommitted, 409),
        ("/conflict", ef.Rejected, 409),
        ("/draft-reused", ef.IdempotencyConflict, 422),
        ("/stripe-reused", ef.IdempotencyConflict, 400),
        ("/not-found", ef.Rejected, 404),
        ("/throttled", ef.NotCommitted, 429),
        ("/unavailable", ef.NotCommitted, 503),
        ("/500", ef.OutcomeUnknown, 500),
        ("/502", ef.OutcomeUnknown, 502),
        ("/504", ef.OutcomeUnknown, 504),
        ("/303", ef.OutcomeUnknown, 303),
    ],
)
def test_each_status_row_maps_to_its_signal(
    tiny: str, path: str, signal: type[Exception], status: int
) -> None:
    """Every status row of the table, answered by a real server after reading the request."""
    with pytest.raises(signal) as raised:
        post_tool(tiny)(path=path.lstrip("/"), text="x", idempotency_key="k1")
    assert getattr(raised.value, "evidence", {})["status"] == status


def test_the_idempotency_rows_need_a_key_to_have_been_sent(tiny: str) -> None:
    """Without a key, "in progress" and "key reused" answers are plain rejections."""
    tool = post_tool(tiny, keyed=False)
    for path in ("/in-progress", "/draft-reused"):
        with pytest.raises(ef.Rejected):
            tool(path=path.lstrip("/"), text="x")


def test_a_reset_after_sending_is_unknown(tiny: str) -> None:
    """The server reads the request, then resets the connection: OutcomeUnknown."""
    with pytest.raises(ef.OutcomeUnknown) as reset:
        post_tool(tiny)(path="reset", text="x", idempotency_key="k1")
    assert reset.value.evidence["error"] in ("ReadError", "RemoteProtocolError")


def test_a_close_without_an_answer_is_unknown(tiny: str) -> None:
    """The server reads the request and closes without answering: OutcomeUnknown."""
    with pytest.raises(ef.OutcomeUnknown) as closed:
        post_tool(tiny)(path="close", text="x", idempotency_key="k1")
    assert closed.value.evidence["error"] == "RemoteProtocolError"


def test_a_read_timeout_is_unknown(tiny: str) -> None:
    """No answer within the tool's timeout: OutcomeUnknown."""
    with pytest.raises(ef.OutcomeUnknown) as slow:
        post_tool(tiny, timeout=0.2)(path="slow", text="x", idempotency_key="k1")
    assert slow.value.evidence["error"] == "ReadTimeout"


def test_a_refused_connection_is_not_committed() -> None:
    """Nothing listens on the port: NotCommitted, nothing was sent."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(ef.NotCommitted) as refused:
        post_tool(f"http://127.0.0.1:{port}")(path="echo", text="x", idempotency_key="k1")
    assert refused.value.evidence["error"] == "ConnectError"


def test_the_request_carries_key_if_match_deadline_auth_body_and_query(tiny: str) -> None:
    """What is sent: JSON body, query, Idempotency-Key, If-Match, the opted-in deadline, auth."""
    due = time.time() + 30
    echoed = post_tool(tiny, deadline_header="X-Request-Deadline")(
        path="echo",
        text="hello",
        q="a b",
        idempotency_key="k1",
        precondition=ef.Expect(revision=7),
        deadline=due,
    )
    headers = echoed["headers"]
    assert echoed["path"] == "/echo?q=a+b"
    assert echoed["json"] == {"text": "hello"}
    assert headers["idempotency-key"] == "k1"
    assert headers["if-match"] == '"7"'
    assert float(headers["x-request-deadline"]) == due
    assert headers["authorization"] == "Bearer t0ken"
    unkeyed = post_tool(tiny, keyed=False)(path="echo", text=None)
    assert "idempotency-key" not in unkeyed["headers"]
    assert unkeyed["json"] == {}
    own = post_tool(tiny, deadline_header="X-Deadline")(path="echo", deadline=due)
    assert float(own["headers"]["x-deadline"]) == due
    assert "x-request-deadline" not in own["headers"]


def test_without_a_deadline_header_no_deadline_is_taken_or_sent(tiny: str, tmp_path: Path) -> None:
    """The default tool claims no enforced deadline: it does not take one, refuses one given
    directly (nothing sent), and run by the runtime sends no deadline header; with the header
    named, the runtime's deadline goes out in it."""
    plain = post_tool(tiny)
    assert not plain.takes_deadline
    assert "deadline" not in plain.signature.parameters
    with pytest.raises(ef.Rejected, match="unknown"):
        plain(path="echo", idempotency_key="k1", deadline=time.time() + 30)
    opted = post_tool(tiny, deadline_header="X-Request-Deadline")

    @ef.workflow("http_echo_deadline", register=False)
    def case(ctx: ef.Context) -> Any:
        return [
            ctx.call("plain", plain, path="echo", text="a")["headers"],
            ctx.call("opted", opted, path="echo", text="b")["headers"],
        ]

    with ef.Runtime(f"sqlite:///{tmp_path / 'ledger.db'}", registry=Registry()) as rt:
        run = rt.start(case, run_id="run-echo-deadline")
    assert run.status is ef.RunStatus.SUCCEEDED
    sent_plain, sent_opted = run.output
    assert "x-request-deadline" not in sent_plain
    assert "idempotency-key" in sent_plain  # it did run through the runtime's write path
    assert time.time() < float(sent_opted["x-request-deadline"]) <= time.time() + 60


def test_empty_and_non_json_answers_are_returned_as_they_are(tiny: str) -> None:
    """204 returns None; a 2xx that is not JSON returns its text."""
    tool = post_tool(tiny)
    assert tool(path="empty", idempotency_key="k1") is None
    assert tool(path="text", idempotency_key="k1") == "plain words"


def tagged_tool(url: str, **tags: Any) -> ef.Tool[..., Any]:
    return http_tool(
        "http_tiny_tagged",
        "POST",
        "/{path}",
        effect="external_write",
        body=("text",),
        query=("q",),
        base_url=url,
        timeout=5.0,
        register=False,
        **tags,
    )


def test_a_tagged_request_carries_the_key_where_its_contract_says(tiny: str) -> None:
    """A tag puts the key in a header, a body field and a query parameter, never in
    Idempotency-Key (the provider does not deduplicate), and tagged_as names each place."""
    tool = tagged_tool(
        tiny, key_header="X-Client-Key", key_field="client_reference", key_query="ref"
    )
    assert tool.takes_key
    assert tool.contract.idempotency.tagged_as == (
        "header:X-Client-Key, body:client_reference, query:ref"
    )
    echoed = tool(path="echo", text="hi", q="a", idempotency_key="k1")
    assert echoed["headers"]["x-client-key"] == "k1"
    assert "idempotency-key" not in echoed["headers"]
    assert echoed["json"] == {"text": "hi", "client_reference": "k1"}
    assert echoed["path"] == "/echo?q=a&ref=k1"
    assert KEYED.tagged_as is None
    keyed = post_tool(tiny)
    assert keyed.contract.idempotency.tagged_as == "header:Idempotency-Key"
    mine = ef.Idempotency(supported=True, tagged_as="metadata.client_reference")
    kept = http_tool(
        "kept", "POST", "/x", effect="external_write", idempotency=mine, register=False
    )
    assert kept.contract.idempotency.tagged_as == "metadata.client_reference"


def test_a_tagged_get_sends_the_key_in_a_body_and_a_tag_is_not_a_dedup_key(tiny: str) -> None:
    """A body tag makes even a bodiless method send JSON; an "in progress" 409 for a tagged,
    non-idempotent request is a plain rejection, since the provider dedups by nothing."""
    echoed = tagged_tool(tiny, key_field="ref")(path="echo", idempotency_key="k1")
    assert echoed["json"] == {"ref": "k1"}
    with pytest.raises(ef.Rejected):
        tagged_tool(tiny, key_header="X-Client-Key")(path="in-progress", idempotency_key="k1")


@pytest.mark.parametrize(
    ("tags", "words"),
    [
        ({"key_field": "text"}, "also a body argument"),
        ({"key_query": "q"}, "also a query argument"),
        ({"key_header": "idempotency-key"}, "supported=True"),
        ({"key_header": "If-Match"}, "sets itself"),
        ({"key_header": "X-Deadline", "deadline_header": "x-deadline"}, "sets itself"),
        ({"deadline_header": "Idempotency-Key"}, "a header of its own"),
        ({"deadline_header": " "}, "a header of its own"),
    ],
)
def test_a_tag_that_overwrites_part_of_the_request_is_refused(
    tags: dict[str, str], words: str
) -> None:
    """A tag may not take over an argument or a header the tool sets for its own reasons."""
    with pytest.raises(ef.ContractError, match=words):
        tagged_tool("http://127.0.0.1:9", **tags)


def test_a_tag_on_a_read_or_a_claimed_tag_that_is_not_sent_is_refused() -> None:
    """A read has no key to tag; tagged_as on a request that carries no key is false."""
    with pytest.raises(ef.ContractError, match="no key to tag"):
        http_tool("r", "GET", "/x", effect="read", key_query="ref", register=False)
    claimed = ef.Idempotency(tagged_as="header:X-Client-Key")
    with pytest.raises(ef.ContractError, match="does not carry the key"):
        http_tool("w", "POST", "/x", effect="external_write", idempotency=claimed, register=False)


def test_settles_within_is_passed_on_to_the_contract_only_when_given() -> None:
    """settles_within reaches the contract; left out, the contract's default stands."""
    if "settles_within" not in {f.name for f in dataclasses.fields(ef.ToolContract)}:
        pytest.skip("this engine's contracts have no settles_within yet")
    bounded = tagged_tool("http://127.0.0.1:9", key_header="X-Client-Key", settles_within="PT30S")
    assert getattr(bounded.contract, "settles_within") == "PT30S"  # noqa: B009 - see the skip
    assert getattr(tagged_tool("http://127.0.0.1:9").contract, "settles_within") is None  # noqa: B009


def test_the_signature_names_exactly_the_arguments() -> None:
    """Only idempotent tools take the key; unknown or missing arguments are refused unsent."""
    keyed = post_tool("http://127.0.0.1:9")
    assert keyed.takes_key
    assert not keyed.takes_deadline
    assert post_tool("http://127.0.0.1:9", deadline_header="X-Request-Deadline").takes_deadline
    assert not post_tool("http://127.0.0.1:9", keyed=False).takes_key
    with pytest.raises(ef.ArgumentError):
        keyed.bind_arguments((), {"path": "x", "nope": 1})
    with pytest.raises(ef.Rejected):
        keyed(text="no path", idempotency_key="k1")
    with pytest.raises(ef.ContractError):
        http_tool("bad", "POST", "/{deadline}", effect="external_write", register=False)
    with pytest.raises(ef.ContractError):
        http_lookup("bad", "/{other}", register=False)


def test_a_lookup_answers_unknown_when_it_cannot_tell(tiny: str) -> None:
    """A lookup that gets a 5xx or no connection answers unknown, never not_committed."""
    lookup = http_lookup("http_tiny_lookup", "/500", base_url=tiny, register=False)
    assert lookup(idempotency_key="k1").status is ef.LookupStatus.UNKNOWN
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    gone = http_lookup("http_gone", "/x", base_url=f"http://127.0.0.1:{port}", register=False)
    assert gone(idempotency_key="k1").status is ef.LookupStatus.UNKNOWN


# -- the mapping as a pure function --------------------------------------------------------------


def _request() -> httpx.Request:
    return httpx.Request("POST", "http://provider.test/x")


@pytest.mark.parametrize(
    ("exc", "signal"),
    [
        (httpx.ConnectError("refused"), ef.NotCommitted),
        (httpx.ConnectTimeout("slow connect"), ef.NotCommitted),
        (httpx.PoolTimeout("pool"), ef.NotCommitted),
        (httpx.UnsupportedProtocol("ftp"), ef.NotCommitted),
        (httpx.ReadTimeout("slow answer"), ef.OutcomeUnknown),
        (httpx.WriteTimeout("slow send"), ef.OutcomeUnknown),
        (httpx.ReadError("reset"), ef.OutcomeUnknown),
        (httpx.WriteError("broken pipe"), ef.OutcomeUnknown),
        (httpx.RemoteProtocolError("closed"), ef.OutcomeUnknown),
    ],
)
def test_each_transport_row_maps_to_its_signal(exc: Exception, signal: type[Exception]) -> None:
    """Before sending is NotCommitted; anything after a byte may have left is OutcomeUnknown."""
    assert type(signal_for_transport_error(exc, method="POST", url="/x")) is signal


def test_a_2xx_is_no_signal() -> None:
    """A 2xx answer is the result, not a signal."""
    response = httpx.Response(201, json={"id": 1}, request=_request())
    assert signal_for_response(response, idempotency_key="k") is None


def test_statuses_can_be_declared_unknown_behind_a_gateway() -> None:
    """With not_committed_statuses=() a 503 is OutcomeUnknown, for gateways that 503 late."""
    response = httpx.Response(503, request=_request())
    signal = signal_for_response(response, not_committed_statuses=())
    assert isinstance(signal, ef.OutcomeUnknown)
