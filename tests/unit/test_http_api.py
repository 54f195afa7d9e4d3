"""Each simulated provider's HTTP API is declared once, in its table, and both the service's routes
and the HTTP clients are made from it (``effectflow.testing.http_api``)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from effectflow.testing import http_api, http_clients, service
from effectflow.testing._base import SqliteProvider
from effectflow.testing.deploy import DeployApi, DeployTarget
from effectflow.testing.mail import MailApi, MailProvider
from effectflow.testing.payments import PaymentsApi, PaymentsProvider

#: The provider class, its table and its client, by kind.
PROVIDERS = {
    "mail": (MailProvider, http_clients.HttpMail),
    "crm": (service.CrmProvider, http_clients.HttpCrm),
    "notify": (service.NotifyProvider, http_clients.HttpNotify),
    "payments": (PaymentsProvider, http_clients.HttpPayments),
    "deploy": (DeployTarget, http_clients.HttpDeploy),
}

#: Public methods every provider has that are not its API: the admin calls (their own routes) and
#: the local helpers.
NOT_OPERATIONS = {"inject", "clear_faults", "calls", "close", "count_refunds"}


def _operations(provider: type[SqliteProvider]) -> set[str]:
    return {
        name
        for name, value in vars(provider).items()
        if inspect.isfunction(value) and not name.startswith("_") and name not in NOT_OPERATIONS
    }


@pytest.mark.parametrize("kind", list(PROVIDERS))
def test_every_operation_of_a_provider_is_in_its_table_once(kind: str) -> None:
    """The table of each provider has one entry per public operation, and the service routes every
    table (one per kind)."""
    provider, _ = PROVIDERS[kind]
    [table] = [t for t in service.TABLES if kind == t.KIND]
    names = [entry.operation for entry in table.endpoints()]
    assert sorted(names) == sorted(_operations(provider))
    assert len(service.TABLES) == len(PROVIDERS) == len(service.PROVIDER_FILES)


@pytest.mark.parametrize("kind", list(PROVIDERS))
def test_a_client_method_has_its_provider_methods_signature(kind: str) -> None:
    """``HttpMail(url).send`` takes exactly what ``MailProvider.send`` takes (without ``self``)."""
    provider, client_class = PROVIDERS[kind]
    client = client_class("http://127.0.0.1:9")
    try:
        for name in _operations(provider):
            expected = inspect.signature(getattr(provider, name))
            expected = expected.replace(parameters=list(expected.parameters.values())[1:])
            method = getattr(client, name)
            assert inspect.signature(method) == expected, name
            assert method.__doc__ == getattr(provider, name).__doc__
    finally:
        client.close()


def test_a_request_quotes_its_path_and_drops_what_is_none() -> None:
    """A refund id is quoted whole, a deploy target keeps its slashes; a body field is sent even
    when None, a header or query parameter only when it is not."""
    cancel = PaymentsApi.cancel_refund.request("re_1/x", idempotency_key="k")
    assert (cancel.verb, cancel.path, cancel.json) == (
        "POST",
        "/payments/refunds/re_1%2Fx/cancel",
        {},
    )
    assert cancel.headers == {"Idempotency-Key": "k"}
    deploy = DeployApi.deploy.request("deployment/prod", "app:2", if_match='"r-42"')
    assert deploy.path == "/deploy/deployment/prod/deploy"
    assert deploy.json == {"image": "app:2", "expected_revision": None}
    assert deploy.headers == {"If-Match": '"r-42"'}
    assert deploy.key is None
    seed = DeployApi.seed.request("t", None)
    assert seed.json == {"image": None, "revision": 1}  # the method's default travels
    status = MailApi.status.request(message_id="msg_1")
    assert (status.verb, status.json, status.params) == ("GET", None, {"message_id": "msg_1"})
    find = MailApi.find.request(op="1", case="2")
    assert find.params == {"op": "1", "case": "2"}
    with pytest.raises(TypeError):
        MailApi.send.request("a@example.com")  # subject and body missing: refused before sending


def test_the_service_reads_what_a_request_leaves_out_as_the_methods_default() -> None:
    """A missing optional field or header is the method's default; a required one is refused,
    except a header without a default, which is "" (the provider refuses an empty key)."""
    send = MailApi.send
    body = {"to": "a@example.com", "subject": "s", "body": "b", "metadata": None}
    assert send.arguments({}, {}, {}, body) == {"to": "a@example.com", "subject": "s", "body": "b"}
    refund = PaymentsApi.create_refund.arguments({}, {}, {}, {"payment_id": "pay_1", "amount": 5})
    assert refund == {"payment_id": "pay_1", "amount": 5, "idempotency_key": ""}
    seed = DeployApi.seed.arguments({"target": "t"}, {}, {}, {})
    assert seed == {"target": "t", "image": None}  # revision: the method's default
    with pytest.raises(http_api.BadRequest, match="amount is required"):
        PaymentsApi.create_refund.arguments({}, {}, {}, {"payment_id": "pay_1"})
    with pytest.raises(http_api.BadRequest, match="idempotency_key is required"):
        DeployApi.get_deployment_by_idempotency_key.arguments({}, {}, {}, {})


def test_a_shared_route_is_chosen_by_its_query() -> None:
    """``GET /payments/refunds`` is the lookup by key with ``idempotency_key``, else the list;
    both at once are refused."""
    shared = [PaymentsApi.get_refund_by_idempotency_key, PaymentsApi.refunds]
    assert http_api.choose(shared, {"idempotency_key": "k"}) is shared[0]
    assert http_api.choose(shared, {"payment_id": "pay_1"}) is shared[1]
    assert http_api.choose(shared, {}) is shared[1]
    with pytest.raises(
        http_api.BadRequest, match="give at most one of idempotency_key and payment_id"
    ):
        http_api.choose(shared, {"idempotency_key": "k", "payment_id": "pay_1"})
    with pytest.raises(TypeError, match="each but the last needs a selected_by"):
        http_api.check_shared(list(reversed(shared)))


def _declare(**entries: Any) -> type[http_api.Table]:
    return type("Bad", (http_api.Table,), {"KIND": "mail", **entries})


def test_a_table_entry_must_place_every_parameter_once() -> None:
    """An entry that leaves a parameter of its method unplaced, places one twice, puts a body on a
    GET, or is named after another operation, is refused when it is declared."""
    with pytest.raises(TypeError, match="the method takes"):
        http_api.post("/mail/send", MailProvider.send, body={"to": http_api.TEXT})
    with pytest.raises(TypeError, match="the method takes"):
        http_api.get("/mail/status", MailProvider.status, query=("message_id", "message_id"))
    with pytest.raises(TypeError, match="key 'nope' is not a parameter"):
        http_api.post(
            "/deploy/{target}/concurrent_deploy",
            DeployTarget.concurrent_deploy,
            body={"image": http_api.TEXT},
            key="nope",
        )
    with pytest.raises(TypeError, match="name it so"):
        _declare(post=http_api.get("/mail/messages", MailProvider.messages, query=("to",)))
