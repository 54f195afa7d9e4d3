"""The console's pages and actions through Starlette's test client, on a real ledger."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.testclient import TestClient

from effectflow.testing import MailProvider


def login_csrf_of(html: str) -> str:
    found = re.search(r'name="login_csrf" value="([^"]+)"', html)
    assert found, "no sign-in form token on the page"
    return found.group(1)


def signed_in(app: Starlette, token: str = "tok-acme", **client_args: Any) -> TestClient:
    """A client signed in as an operator would: the sign-in form first, then its post."""
    client = TestClient(app, **client_args)
    form = client.get("/login")
    data = {"token": token, "next": "/runs", "login_csrf": login_csrf_of(form.text)}
    answer = client.post("/login", data=data, follow_redirects=False)
    assert answer.status_code == 303
    return client


def csrf_of(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert found, "no form token on the page"
    return found.group(1)


def test_pages_need_a_sign_in_and_refuse_an_unknown_token(console_app: Starlette) -> None:
    client = TestClient(console_app)
    assert client.get("/runs", follow_redirects=False).headers["location"].startswith("/login")
    form = login_csrf_of(client.get("/login").text)
    refused = client.post("/login", data={"token": "nope", "login_csrf": form})
    assert refused.status_code == 401
    assert "not known" in refused.text


def test_runs_list_run_page_and_attention_queue(console_app: Starlette) -> None:
    client = signed_in(console_app)
    runs = client.get("/runs")
    assert "case-7" in runs.text
    assert "paused" in runs.text
    assert client.get("/runs?status=succeeded").text.count("case-7") == 0
    page = client.get("/runs/case-7")
    assert "needs_attention" in page.text
    assert "Confirm with evidence" in page.text
    queue = client.get("/attention")
    assert "unknown effect" in queue.text
    assert "case-7" in queue.text


def test_another_tenants_run_is_not_found(console_app: Starlette) -> None:
    client = signed_in(console_app, "tok-other")
    assert client.get("/runs/case-7").status_code == 404
    assert "case-7" not in client.get("/runs").text


def test_confirming_with_evidence_through_the_form_continues_the_run(
    console_app: Starlette, world: Path
) -> None:
    client = signed_in(console_app)
    page = client.get("/attention").text
    effect_id = re.search(r'name="effect_id" value="(eff_[0-9a-f]+)"', page)
    version = re.search(r'name="expected_version" value="(\d+)"', page)
    assert effect_id
    assert version
    mail = MailProvider(world / "mail.db")
    [message] = mail.messages()
    mail.close()
    form = {
        "csrf": csrf_of(page),
        "back": "/runs/case-7",
        "effect_id": effect_id.group(1),
        "committed": "yes",
        "expected_version": version.group(1),
        "evidence": json.dumps({"external_effect_id": message["provider_message_id"]}),
        "by": "oncall-ana",
    }
    done = client.post("/actions/resolve", data=form)
    assert done.status_code == 200
    assert "succeeded" in done.text
    assert client.get("/attention").text.count("unknown effect") == 0


def test_a_form_without_its_token_changes_nothing(console_app: Starlette) -> None:
    client = signed_in(console_app)
    answer = client.post("/actions/cancel", data={"run_id": "case-7", "csrf": "forged"})
    assert answer.status_code == 403
    assert "paused" in client.get("/runs/case-7").text


def test_bad_evidence_is_explained_and_changes_nothing(console_app: Starlette) -> None:
    client = signed_in(console_app)
    page = client.get("/attention").text
    effect_id = re.search(r'name="effect_id" value="(eff_[0-9a-f]+)"', page)
    assert effect_id
    answer = client.post(
        "/actions/resolve",
        data={
            "csrf": csrf_of(page),
            "back": "/attention",
            "effect_id": effect_id.group(1),
            "committed": "yes",
            "evidence": "{not json",
            "by": "ana",
        },
    )
    assert "evidence is not JSON" in answer.text
    assert "unknown effect" in answer.text
