"""The console end to end in a real headless Chromium (Debian's package, driven by Playwright).

`effectflow serve` runs as a real process on a ledger with a paused run. An operator signs in, finds
the run whose email is unknown in the attention queue, confirms it with evidence through the page,
and sees the run continue to its end. Screenshots of each stage are saved under
``test-output/console/`` (and the test's tmp dir).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from effectflow.testing import MailProvider

from .conftest import CHROMIUM, SHOTS

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (.ci/run installs it)"
)


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
