"""The console's hardening in a real headless Chromium (Debian's package, driven by Playwright)
against `effectflow serve` in its own process.

* Every answer carries the security headers, and the browser reports no CSP violation on any page
  (so no inline script or style is left), while the page's script does run.
* A form on another origin that posts to /login (the login CSRF that signed a victim into the
  attacker's tenant) is refused, from another site and from another port of the same host alike.
* A link with a forged ``?msg=`` shows no banner.
* Times read as dates in the browser's time zone, and the run page fits a narrow window.
* A form keeps what the operator typed after an error.
* An approval whose resumed tool takes 3 s does not hold up other requests: ``/api/v1/health`` is
  measured from another thread while it runs.
"""

from __future__ import annotations

import re
import shutil
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest

import effectflow as ef

from . import app
from .conftest import CHROMIUM, SHOTS, free_port

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)"
)

HEADERS = {
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; frame-ancestors 'none'; "
        "base-uri 'none'; form-action 'self'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
}


@pytest.fixture
def attacker(served: str) -> Iterator[dict[str, str]]:
    """Another origin's page with a form that posts the attacker's token to the console's /login:
    served at 127.0.0.2 (another site) and at 127.0.0.1 on another port (same site, other origin)."""
    html = (
        "<!doctype html><title>Win a prize</title><h1>Win a prize</h1>"
        f'<form method="post" action="{served}/login">'
        '<input type="hidden" name="token" value="tok-other">'
        '<input type="hidden" name="next" value="/runs">'
        "<button>Claim it</button></form>"
    ).encode()

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(html)))
            self.end_headers()
            self.wfile.write(html)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    servers = {
        "cross-site": ThreadingHTTPServer(("127.0.0.2", free_port()), Page),
        "same-site": ThreadingHTTPServer(("127.0.0.1", free_port()), Page),
    }
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers.values()]
    for thread in threads:
        thread.start()
    try:
        yield {
            name: f"http://{s.server_address[0]}:{s.server_address[1]}/"
            for name, s in servers.items()
        }
    finally:
        for server in servers.values():
            server.shutdown()
            server.server_close()


def shot(page: Any, tmp_path: Path, name: str) -> None:
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    SHOTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, SHOTS / f"{name}.png")


def test_headers_login_csrf_forged_messages_times_and_layout(
    served: str, attacker: dict[str, str], tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            context = browser.new_context(timezone_id="Asia/Tokyo", locale="en-US")
            page = context.new_page()
            violations: list[str] = []
            page.on(
                "console",
                lambda m: (
                    violations.append(m.text) if "Content Security Policy" in m.text else None
                ),
            )

            # The headers, on a console page, its static files and an API answer.
            answer = page.goto(f"{served}/login")
            assert answer is not None
            for url in (
                f"{served}/login",
                f"{served}/static/console.js",
                f"{served}/api/v1/health",
            ):
                headers = answer.headers if url.endswith("/login") else httpx.get(url).headers
                for name, value in HEADERS.items():
                    assert headers[name] == value, (url, name)

            # uvicorn's own proxy-header handling is off: a local client claiming HTTPS gets no
            # Secure cookie from a server that trusts no proxy.
            claimed = httpx.get(f"{served}/login", headers={"X-Forwarded-Proto": "https"})
            assert "secure" not in claimed.headers["set-cookie"].lower()

            # Login CSRF: the victim has the sign-in form open, then visits the attacker's pages.
            for origin in ("cross-site", "same-site"):
                page.goto(attacker[origin])
                with page.expect_response(f"{served}/login") as posted:
                    page.get_by_role("button", name="Claim it").click()
                assert posted.value.status == 403, origin
                expect(page.get_by_role("alert")).to_contain_text("not sent from this site")
                assert not [c for c in context.cookies() if c["name"] == "effectflow_token"]
            shot(page, tmp_path, "security-1-login-csrf-refused")

            # The refusal page's own form signs in (its token is fresh).
            page.get_by_label("API token").fill("tok-acme")
            page.get_by_role("button", name="Sign in").click()
            expect(page.get_by_role("heading", name="Runs")).to_be_visible()
            expect(page.get_by_text("tenant acme")).to_be_visible()

            # A forged ?msg= / ?err= shows nothing.
            page.goto(f"{served}/runs?msg=All+refunds+approved&err=Call+1-555-0100")
            expect(page.get_by_role("heading", name="Runs")).to_be_visible()
            expect(page.locator(".flash")).to_have_count(0)
            expect(page.get_by_text("All refunds approved")).to_have_count(0)

            # Times: readable, in the browser's zone (Tokyo), the UTC value in the tooltip.
            updated = page.locator("tr", has_text="case-7").locator("time")
            expect(updated).to_have_attribute("data-local", "1")
            iso = updated.get_attribute("datetime")
            assert iso is not None
            tokyo = datetime.fromisoformat(iso).astimezone(ZoneInfo("Asia/Tokyo"))
            text = updated.inner_text()
            assert tokyo.strftime("%b") in text
            assert f"{tokyo.day}, {tokyo.year}" in text
            assert f":{tokyo:%M}:{tokyo:%S}" in text
            assert "GMT+9" in text
            assert "UTC" in (updated.get_attribute("title") or "")
            shot(page, tmp_path, "security-2-runs-local-times")

            # The run page fits a narrow window: wide tables scroll in their own box.
            page.set_viewport_size({"width": 720, "height": 900})
            page.goto(f"{served}/runs/case-7")
            expect(page.locator("#run-status")).to_be_visible()
            widths = page.evaluate(
                "() => [document.documentElement.scrollWidth, window.innerWidth,"
                " document.querySelector('header').getBoundingClientRect().width]"
            )
            assert widths[0] <= widths[1], widths
            assert widths[2] == widths[0], widths
            shot(page, tmp_path, "security-3-run-narrow")

            # A form keeps what was typed after an error (here a trailing comma in the evidence).
            page.set_viewport_size({"width": 1280, "height": 900})
            page.goto(f"{served}/attention")
            confirm = page.get_by_role("form", name=re.compile("^Confirm eff_"))
            typed = '{"external_effect_id": "msg_1",}'
            confirm.get_by_label(re.compile("^Evidence")).fill(typed)
            confirm.get_by_label("Your name").fill("oncall-ana")
            confirm.get_by_role("button", name="Confirm with evidence").click()
            expect(page.get_by_role("alert")).to_contain_text("evidence is not JSON")
            confirm = page.get_by_role("form", name=re.compile("^Confirm eff_"))
            expect(confirm.get_by_label(re.compile("^Evidence"))).to_have_value(typed)
            expect(confirm.get_by_label("Your name")).to_have_value("oncall-ana")
            shot(page, tmp_path, "security-5-form-kept-after-error")
            assert violations == []
        finally:
            browser.close()


def test_a_three_second_action_does_not_delay_other_requests(
    served: str, world: Path, tmp_path: Path
) -> None:
    """Approving a payout whose tool sleeps 3 s (it runs as the approval resumes the run): while
    the action runs, /api/v1/health keeps answering in milliseconds."""
    from playwright.sync_api import expect, sync_playwright

    with ef.Runtime(f"sqlite:///{world / 'ledger.db'}", tenant="acme") as rt:
        assert rt.start(app.slow, run_id="slow-1", amount=5).status is ef.RunStatus.PAUSED
    health = f"{served}/api/v1/health"
    samples: list[tuple[float, float]] = []  # (sent at, seconds to answer)
    stop = threading.Event()

    def probe() -> None:
        with httpx.Client(timeout=10) as client:
            while not stop.is_set():
                sent = time.monotonic()
                assert client.get(health).status_code == 200
                samples.append((sent, time.monotonic() - sent))
                time.sleep(0.05)

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(f"{served}/login")
            page.get_by_label("API token").fill("tok-acme")
            page.get_by_role("button", name="Sign in").click()
            expect(page.get_by_role("heading", name="Runs")).to_be_visible()
            page.goto(f"{served}/runs/slow-1")
            form = page.get_by_role("form", name="Approve pay")
            form.get_by_label("Approver").fill("oncall-ana")
            form.get_by_label("Approval id (ticket)").fill("APR-7")
            prober = threading.Thread(target=probe, daemon=True)
            prober.start()
            began = time.monotonic()
            form.get_by_role("button", name="Approve").click()
            expect(page.get_by_role("status")).to_contain_text("succeeded", timeout=20_000)
            took = time.monotonic() - began
            stop.set()
            prober.join(15)
            shot(page, tmp_path, "security-4-slow-approval-done")
        finally:
            stop.set()
            browser.close()
    # Every probe that was in flight at some moment of the action (after its first 0.2 s).
    window = (began + 0.2, began + took - 0.5)
    during = [lat for sent, lat in samples if sent <= window[1] and sent + lat >= window[0]]
    worst = max(during, default=0.0)
    print(
        f"action took {took:.2f} s; /health during it: {len(during)} requests, "
        f"max {worst * 1000:.0f} ms"
    )
    assert took >= app.SLOW_S
    assert worst < 0.5, f"/health took {worst:.2f} s while the action ran"
    assert len(during) >= 10
