"""The console end to end in a real headless Chromium (Debian's package, driven by Playwright).

`effectflow serve` runs as a real process on a ledger with a paused run. An operator signs in, finds
the run whose email is unknown in the attention queue, confirms it with evidence through the page,
and sees the run continue to its end. Screenshots of each stage are saved under
``test-output/console/`` (and the test's tmp dir).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette

from effectflow.testing import MailProvider

from .conftest import TOKENS

ROOT = Path(__file__).resolve().parents[2]
SHOTS = ROOT / "test-output" / "console"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
EFFECTFLOW = shutil.which("effectflow", path=str(Path(sys.executable).parent)) or "effectflow"

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)"
)


@pytest.fixture
def served(console_app: Starlette, world: Path) -> Iterator[str]:
    """`effectflow serve` in its own process, on the ledger the fixture prepared."""
    del console_app  # prepared the ledger (a paused run); the served app is `effectflow serve`'s
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        **os.environ,
        "EFFECTFLOW_TEST_DIR": str(world),
        "EFFECTFLOW_TOKENS": ",".join(f"{t}={tenant}" for t, tenant in TOKENS.items()),
        "PYTHONPATH": str(ROOT),
    }
    command = [
        EFFECTFLOW, "serve", "--db", f"sqlite:///{world / 'ledger.db'}",
        "--port", str(port), "--app", "tests.console.app",
    ]  # fmt: skip
    log = (world / "serve.log").open("wb")
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                time.sleep(0.05)
        else:
            raise AssertionError((world / "serve.log").read_text())
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_an_operator_confirms_an_unknown_effect_and_the_run_continues(
    served: str, world: Path, tmp_path: Path
) -> None:
    from playwright.sync_api import expect, sync_playwright

    mail = MailProvider(world / "mail.db")
    [message] = mail.messages()
    mail.close()
    SHOTS.mkdir(parents=True, exist_ok=True)

    def shot(page: object, name: str) -> None:
        path = tmp_path / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)  # type: ignore[attr-defined]
        shutil.copy(path, SHOTS / f"{name}.png")

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.goto(f"{served}/runs")
            expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
            page.get_by_label("API token").fill("tok-acme")
            page.get_by_role("button", name="Sign in").click()
            expect(page.get_by_role("heading", name="Runs")).to_be_visible()
            expect(page.get_by_role("link", name="case-7")).to_be_visible()
            shot(page, "1-runs")

            page.get_by_role("link", name="1 item(s) need attention").click()
            expect(page.get_by_role("heading", name="Needs attention")).to_be_visible()
            confirm = page.get_by_role("form", name=re.compile("^Confirm eff_"))
            confirm.get_by_label(re.compile("^Evidence")).fill(
                json.dumps({"external_effect_id": message["provider_message_id"]})
            )
            confirm.get_by_label("Your name").fill("oncall-ana")
            shot(page, "2-attention")
            confirm.get_by_role("button", name="Confirm with evidence").click()

            expect(page.get_by_role("status")).to_contain_text("confirmed")
            expect(page.get_by_role("status")).to_contain_text("succeeded")
            page.goto(f"{served}/runs/case-7")
            expect(page.locator("#run-status")).to_have_text("succeeded")
            expect(page.locator("#step-email")).to_contain_text(message["provider_message_id"])
            shot(page, "3-run-continued")
        finally:
            browser.close()
