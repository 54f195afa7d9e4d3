"""The console's hardening through Starlette's test client: the sign-in form's token (login CSRF),
Secure cookies on HTTPS and behind a trusted proxy only, signed flash messages (a forged ``?msg=`` or
cookie shows nothing), forms that keep their input after an error, evidence limits, readable times,
no inline script or style, and actions that run off the event loop."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

import effectflow as ef
from effectflow.api import create_app, hardening
from effectflow.console import pages

from .conftest import TOKENS
from .test_console import csrf_of, login_csrf_of, signed_in


def effect_form(page: str) -> dict[str, str]:
    """The hidden fields of the page's first "confirm with evidence" form."""
    effect_id = re.search(r'name="effect_id" value="(eff_[0-9a-f]+)"', page)
    version = re.search(r'name="expected_version" value="(\d+)"', page)
    assert effect_id
    assert version
    return {
        "csrf": csrf_of(page),
        "back": "/attention",
        "effect_id": effect_id.group(1),
        "committed": "yes",
        "expected_version": version.group(1),
    }


def cookie_header(response: Any, name: str) -> str:
    """The Set-Cookie header that sets ``name``."""
    [found] = [h for h in response.headers.get_list("set-cookie") if h.startswith(f"{name}=")]
    return str(found)


@pytest.fixture
def app_with(console_app: Starlette, world: Path) -> Iterator[Any]:
    """Makes apps over the ledger ``console_app`` prepared, with other settings."""
    made: list[Starlette] = []

    def make(**settings: Any) -> Starlette:
        application = create_app(f"sqlite:///{world / 'ledger.db'}", TOKENS, **settings)
        made.append(application)
        return application

    yield make
    for application in made:
        application.state.runtimes.close()
        application.state.request_keys.close()


# -- sign-in --------------------------------------------------------------------------------------


def test_a_sign_in_without_the_forms_token_is_refused(console_app: Starlette) -> None:
    """A post to /login that did not come from this site's form (no form token, a wrong one, or a
    browser saying cross-site) signs nobody in: the login CSRF that signed a victim into the
    attacker's tenant."""
    client = TestClient(console_app)
    nonce = login_csrf_of(client.get("/login").text)
    attempts: list[tuple[dict[str, str], dict[str, str]]] = [
        ({"token": "tok-other"}, {}),
        ({"token": "tok-other", "login_csrf": "guessed"}, {}),
        ({"token": "tok-other", "login_csrf": nonce}, {"Sec-Fetch-Site": "cross-site"}),
    ]
    for data, headers in attempts:
        refused = client.post("/login", data=data, headers=headers, follow_redirects=False)
        assert refused.status_code == 403
        assert "not sent from this site" in refused.text
        assert pages.COOKIE not in refused.headers.get("set-cookie", "").split("=")[0]
        assert client.get("/runs", follow_redirects=False).status_code == 303  # not signed in
    # A cookie-less client (the form's token from another browser) is refused as well.
    stranger = TestClient(console_app)
    refused = stranger.post("/login", data={"token": "tok-other", "login_csrf": nonce})
    assert refused.status_code == 403


def test_the_sign_in_token_is_signed_and_expires(
    console_app: Starlette, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cookie half is signed with the app's secret: a made-up cookie with a matching field is
    refused, and so is a form older than its lifetime."""
    client = TestClient(console_app)
    client.cookies.set(pages.LOGIN_COOKIE, "made-up.value")
    refused = client.post("/login", data={"token": "tok-acme", "login_csrf": "made-up"})
    assert refused.status_code == 403
    client.cookies.clear()
    nonce = login_csrf_of(client.get("/login").text)
    later = hardening.time.time() + pages.LOGIN_MAX_AGE + 5
    monkeypatch.setattr(hardening.time, "time", lambda: later)
    assert client.post("/login", data={"token": "tok-acme", "login_csrf": nonce}).status_code == 403


def test_sign_out_needs_the_forms_token(console_app: Starlette) -> None:
    """Another site cannot sign an operator out; the page's own form can."""
    client = signed_in(console_app)
    page = client.get("/runs").text
    assert client.post("/logout", data={}).status_code == 403
    assert client.get("/runs", follow_redirects=False).status_code == 200
    out = client.post("/logout", data={"csrf": csrf_of(page)}, follow_redirects=False)
    assert out.status_code == 303
    assert client.get("/runs", follow_redirects=False).status_code == 303


# -- Secure cookies -------------------------------------------------------------------------------


def test_cookies_are_secure_on_https_only(console_app: Starlette) -> None:
    """Over HTTPS every console cookie is Secure; over plain HTTP it cannot be (the browser would
    drop it), and a client's own X-Forwarded-Proto changes nothing when no proxy is trusted."""
    https = signed_in(console_app, base_url="https://testserver")
    assert "secure" in cookie_header(https.get("/login"), pages.LOGIN_COOKIE).lower()
    plain = TestClient(console_app)
    assert "secure" not in cookie_header(plain.get("/login"), pages.LOGIN_COOKIE).lower()
    claimed = plain.get("/login", headers={"X-Forwarded-Proto": "https"})
    assert "secure" not in cookie_header(claimed, pages.LOGIN_COOKIE).lower()


def test_a_trusted_proxy_says_https_and_secure_cookies_forces_it(app_with: Any) -> None:
    """With trust_proxy naming the proxy, its X-Forwarded-Proto: https makes cookies Secure (and
    the session cookie too); secure_cookies=True marks them always."""
    proxied = TestClient(app_with(trust_proxy="testclient"))
    forwarded = {"X-Forwarded-Proto": "https"}
    assert "secure" not in cookie_header(proxied.get("/login"), pages.LOGIN_COOKIE).lower()
    form = proxied.get("/login", headers=forwarded)
    set_login = cookie_header(form, pages.LOGIN_COOKIE)
    assert "secure" in set_login.lower()
    # The test client speaks plain HTTP to the app, so it would not send a Secure cookie back;
    # a browser talking HTTPS to the proxy would.
    proxied.cookies.set(pages.LOGIN_COOKIE, set_login.split(";")[0].split("=", 1)[1])
    signed = proxied.post(
        "/login",
        data={"token": "tok-acme", "login_csrf": login_csrf_of(form.text)},
        headers=forwarded,
        follow_redirects=False,
    )
    assert signed.status_code == 303
    assert "secure" in cookie_header(signed, pages.COOKIE).lower()
    untrusted = TestClient(app_with(trust_proxy="10.0.0.1"))
    assert (
        "secure"
        not in cookie_header(untrusted.get("/login", headers=forwarded), pages.LOGIN_COOKIE).lower()
    )
    always = TestClient(app_with(secure_cookies=True))
    assert "secure" in cookie_header(always.get("/login"), pages.LOGIN_COOKIE).lower()


# -- flash messages ---------------------------------------------------------------------------------


def test_a_forged_message_in_the_url_shows_nothing(console_app: Starlette) -> None:
    """?msg= and ?err= are not read: a link cannot put words in the console's mouth."""
    client = signed_in(console_app)
    page = client.get("/runs?msg=All+refunds+approved&err=Call++1-555-0100+now").text
    assert "All refunds approved" not in page
    assert "555-0100" not in page
    assert 'class="flash' not in page


def test_a_forged_or_foreign_flash_cookie_shows_nothing(console_app: Starlette) -> None:
    """Only a flash this app signed, for this tenant, is shown; and it is shown once."""
    client = signed_in(console_app)
    client.cookies.set(
        pages.FLASH_COOKIE, "eyJ2Ijp7Im1zZyI6ImZvcmdlZCJ9fQ.AAAA", domain="testserver.local"
    )
    assert 'class="flash' not in client.get("/runs").text
    signer = hardening.Signer(console_app.state.settings.secret)
    other = signer.dumps("flash", {"t": "other", "msg": "for another tenant"}, 60)
    client.cookies.set(pages.FLASH_COOKIE, other, domain="testserver.local")
    assert "for another tenant" not in client.get("/runs").text
    mine = signer.dumps("flash", {"t": "acme", "msg": "it worked"}, 60)
    client.cookies.set(pages.FLASH_COOKIE, mine, domain="testserver.local")
    shown = client.get("/runs")
    assert "it worked" in shown.text
    assert pages.FLASH_COOKIE not in client.cookies  # deleted once shown
    assert "it worked" not in client.get("/runs").text


def test_an_action_reports_through_a_signed_flash_not_the_url(console_app: Starlette) -> None:
    """The redirect after an action carries its outcome in the flash cookie; its URL is bare."""
    client = signed_in(console_app)
    page = client.get("/attention").text
    answer = client.post(
        "/actions/resolve",
        data={**effect_form(page), "evidence": "{not json", "by": "ana"},
        follow_redirects=False,
    )
    assert answer.status_code == 303
    assert answer.headers["location"] == "/attention"
    assert "httponly" in cookie_header(answer, pages.FLASH_COOKIE).lower()


# -- forms keep their input ---------------------------------------------------------------------


def test_a_form_keeps_what_was_typed_after_an_error(console_app: Starlette) -> None:
    """Bad evidence is explained, and the form is filled in again with the evidence and the name
    typed, so the operator fixes a comma instead of typing it all again; other forms stay empty."""
    client = signed_in(console_app)
    page = client.get("/attention").text
    typed = '{"external_effect_id": "msg_1", "note": "checked <the> dashboard",}'
    answer = client.post(
        "/actions/resolve", data={**effect_form(page), "evidence": typed, "by": "oncall-ana"}
    )
    assert "evidence is not JSON" in answer.text
    escaped = typed.replace('"', "&#34;").replace("<", "&lt;").replace(">", "&gt;")
    assert f"required>{escaped}</textarea>" in answer.text
    assert 'value="oncall-ana"' in answer.text
    assert answer.text.count('value="oncall-ana"') == 1  # not the "declare not committed" form
    assert "oncall-ana" not in client.get("/attention").text  # kept for one page only


def test_typed_input_too_long_for_a_cookie_is_not_kept_and_says_so(console_app: Starlette) -> None:
    """Evidence too long to fit in a cookie is not kept, and the error says to type it again."""
    client = signed_in(console_app)
    page = client.get("/attention").text
    typed = '{"notes": "' + "n" * 5000 + '"'  # not JSON: the closing brace is missing
    answer = client.post(
        "/actions/resolve", data={**effect_form(page), "evidence": typed, "by": "a"}
    )
    assert "evidence is not JSON" in answer.text
    assert "too long to keep" in answer.text
    assert "nnnnnnnnnn" not in answer.text


# -- evidence limits ------------------------------------------------------------------------------


def test_evidence_too_deep_or_too_large_is_explained_and_stores_nothing(
    app_with: Any, world: Path
) -> None:
    """The console holds evidence to the API's limits: nesting and stored size are explained on
    the form and nothing is recorded; a form larger than the body limit is refused with 413."""
    console = app_with(max_evidence_bytes=200, max_json_depth=4, max_body_bytes=8192)
    client = signed_in(console)
    with ef.Runtime(f"sqlite:///{world / 'ledger.db'}", tenant="acme") as rt:
        before = rt.effects()
        page = client.get("/attention").text
        deep = json.dumps({"a": {"b": {"c": {"d": {"e": 1}}}}})
        answer = client.post(
            "/actions/resolve", data={**effect_form(page), "evidence": deep, "by": "a"}
        )
        assert "nests deeper than 4 levels" in answer.text
        large = json.dumps({"note": "x" * 300})
        answer = client.post(
            "/actions/resolve", data={**effect_form(page), "evidence": large, "by": "a"}
        )
        assert "stores at most 200" in answer.text
        huge = json.dumps({"note": "x" * 9000})
        answer = client.post(
            "/actions/resolve", data={**effect_form(page), "evidence": huge, "by": "a"}
        )
        assert answer.status_code == 413
        assert "larger than this server accepts" in answer.text
        assert rt.effects() == before


def test_fields_longer_than_the_api_allows_are_refused(console_app: Starlette) -> None:
    """A name or reason over the API's own length limit is explained, not stored."""
    client = signed_in(console_app)
    page = client.get("/runs/case-7").text
    answer = client.post(
        "/actions/cancel",
        data={
            "csrf": csrf_of(page),
            "back": "/runs/case-7",
            "run_id": "case-7",
            "reason": "r" * 2001,
        },
    )
    assert "reason is longer than 2000 characters" in answer.text
    assert "paused" in client.get("/runs/case-7").text


# -- pages ----------------------------------------------------------------------------------------


def test_times_are_readable_and_machine_readable(console_app: Starlette) -> None:
    """Times are <time> elements with ISO 8601 UTC in datetime and a readable UTC text and
    tooltip (the script shows them in the browser's time zone); never raw epoch seconds."""
    client = signed_in(console_app)
    for path in ("/runs", "/runs/case-7", "/attention"):
        html = client.get(path).text
        times = re.findall(r'<time datetime="([^"]+)" title="([^"]+)">([^<]+)</time>', html)
        assert times, path
        for iso, title, text in times:
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", iso)
            assert title == text
            assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", text)
        assert not re.search(r">\s*1\d{9}(\.\d+)?\s*<", html)  # no epoch seconds as text


def test_pages_have_no_inline_script_or_style(console_app: Starlette) -> None:
    """The CSP allows scripts and styles only from /static: every page links them and has none of
    its own (no <script> body, <style>, style= or on*= attribute)."""
    client = signed_in(console_app)
    for path in ("/login", "/runs", "/runs/case-7", "/attention", "/runs/nope"):
        html = client.get(path).text
        assert '<script src="/static/console.js" defer></script>' in html
        assert '<link rel="stylesheet" href="/static/console.css">' in html
        assert not re.search(r"<script(?![^>]*\bsrc=)", html), path
        assert "<style" not in html
        assert not re.search(r"\s(style|on[a-z]+)=", html), path
    for name in ("console.js", "console.css"):
        static = client.get(f"/static/{name}")
        assert static.status_code == 200
        assert static.headers["x-content-type-options"] == "nosniff"


def test_console_actions_run_off_the_event_loop(
    console_app: Starlette, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runtime call behind a form runs in a worker thread, where no event loop runs: a slow
    action (a resumed workflow's tools) cannot stall other requests."""
    seen: list[bool] = []
    real = pages._act

    def spy(*args: Any) -> str:
        try:
            asyncio.get_running_loop()
            seen.append(True)
        except RuntimeError:
            seen.append(False)
        return real(*args)

    monkeypatch.setattr(pages, "_act", spy)
    client = signed_in(console_app)
    page = client.get("/runs/case-7").text
    client.post(
        "/actions/cancel", data={"csrf": csrf_of(page), "back": "/runs/case-7", "run_id": "case-7"}
    )
    assert seen == [False]
