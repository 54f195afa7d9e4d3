"""A console on a real ledger: a paused run with an unknown effect, for two tenants, served by
``create_app`` as ``effectflow serve`` serves it."""

from __future__ import annotations

import os
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

import effectflow as ef
from effectflow.api import create_app

from . import app

TOKENS = {"tok-acme": "acme", "tok-other": "other"}

ROOT = Path(__file__).resolve().parents[2]
#: Screenshots of the end-to-end tests, kept for people to look at.
SHOTS = ROOT / "test-output" / "console"
#: Debian's Chromium, which the end-to-end tests drive through Playwright (no browser download).
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
EFFECTFLOW = shutil.which("effectflow", path=str(Path(sys.executable).parent)) or "effectflow"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EFFECTFLOW_TEST_DIR", str(tmp_path))
    (tmp_path / "reset").touch()
    return tmp_path


@pytest.fixture
def console_app(world: Path) -> Iterator[Starlette]:
    url = f"sqlite:///{world / 'ledger.db'}"
    with ef.Runtime(url, tenant="acme") as rt:
        paused = rt.start(app.case, run_id="case-7", case_id="7")
        assert paused.status is ef.RunStatus.PAUSED
    (world / "reset").unlink()
    made = create_app(url, TOKENS)  # the console as `effectflow serve` mounts it, headers included
    yield made
    made.state.runtimes.close()
    made.state.request_keys.close()


@pytest.fixture
def served(console_app: Starlette, world: Path) -> Iterator[str]:
    """`effectflow serve` in its own process, on the ledger the fixture prepared."""
    del console_app  # prepared the ledger (a paused run); the served app is `effectflow serve`'s
    port = free_port()
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
