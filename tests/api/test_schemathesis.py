"""Schemathesis generates requests for every operation of the published OpenAPI document and sends
them to the app in process: none may answer a server error, and every answer must match the
document (status codes, media types, bodies)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from starlette.applications import Starlette

import effectflow as ef
from effectflow.api import create_app

from . import app
from .conftest import ACME, TOKENS
from .test_api import ROUTES


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Starlette]:
    """The app over a ledger holding a few runs of the tenant the requests authenticate as."""
    made_world = app.use(tmp_path)
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with ef.Runtime(url, tenant="acme") as rt:
        rt.start(app.doubled, run_id="d1", n=1)
        rt.start(app.refund, run_id="r1", payment_id="pay_1", amount=5)
        rt.start(app.send_email, run_id="e1", to="li@example.com", lose_response=True)
    application = create_app(url, TOKENS)
    yield application
    application.state.runtimes.close()
    application.state.request_keys.close()
    app.done(made_world)


def test_no_operation_answers_a_server_error_or_off_its_schema(api: Starlette) -> None:
    """Generated requests never get a 5xx, and each answer conforms to the document."""
    schema = schemathesis.openapi.from_asgi("/api/v1/openapi.json", api)
    operations = [result.ok() for result in schema.get_all_operations()]
    # The authenticated routes, health and readiness; the document's own schemathesis leaves out.
    assert len(operations) == len(ROUTES) + 2
    checks = [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_schema_conformance,
    ]
    with ef.Runtime(str(api.state.runtimes.db_url), tenant="acme") as rt:
        effect_ids = [e.effect_id for e in rt.effects()]
    for operation in operations:

        @given(
            case=operation.as_strategy(),
            run_id=st.sampled_from([None, "d1", "r1", "e1"]),
            step_id=st.sampled_from([None, "double", "create_refund", "email"]),
            effect_id=st.sampled_from([None, *effect_ids]),
            fresh_key=st.uuids(),
        )
        @settings(
            max_examples=25,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        )
        def conforms(
            case: schemathesis.Case,
            run_id: str | None,
            step_id: str | None,
            effect_id: str | None,
            fresh_key: uuid.UUID,
        ) -> None:
            # Point half the requests at ids that exist, and give actions fresh keys, so the
            # runtime is reached rather than 404 or the key check answering every time.
            path = case.path_parameters or {}
            for name, known in (("run_id", run_id), ("step_id", step_id), ("effect_id", effect_id)):
                if name in path and known is not None:
                    path[name] = known
            headers = dict(ACME)
            if case.method == "POST" and fresh_key.int % 4:
                headers["Idempotency-Key"] = str(fresh_key)
            case.call_and_validate(headers=headers, checks=checks)

        conforms()
