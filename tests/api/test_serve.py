"""``effectflow serve``: tokens from a file or the environment, uvicorn serving the API, and a clean
exit on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import typer

from effectflow.cli import serve


def test_tokens_from_the_environment_form() -> None:
    """EFFECTFLOW_TOKENS reads as token=tenant pairs separated by commas."""
    assert serve.parse_tokens("a=acme, b=beta,") == {"a": "acme", "b": "beta"}
    with pytest.raises(typer.BadParameter):
        serve.parse_tokens("a=acme,broken")


def test_tokens_from_yaml_and_json_files(tmp_path: Path) -> None:
    """A tokens file is a YAML or JSON mapping of token to tenant; anything else is refused."""
    (tmp_path / "t.yaml").write_text("tok-a: acme\ntok-b: beta\n")
    (tmp_path / "t.json").write_text(json.dumps({"tok-a": "acme"}))
    (tmp_path / "bad.yaml").write_text("- a\n- b\n")
    assert serve.load_tokens(tmp_path / "t.yaml") == {"tok-a": "acme", "tok-b": "beta"}
    assert serve.load_tokens(tmp_path / "t.json") == {"tok-a": "acme"}
    with pytest.raises(typer.BadParameter):
        serve.load_tokens(tmp_path / "bad.yaml")
    with pytest.raises(typer.BadParameter):
        serve.load_tokens(tmp_path / "missing.yaml")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_serve_answers_over_http_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    """The served API authenticates with the file's tokens; SIGTERM stops it with exit code 0."""
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text("tok-a: acme\n")
    port = _free_port()
    command = [
        sys.executable,
        "-m",
        "effectflow.cli.main",
        "serve",
        "--db",
        f"sqlite:///{tmp_path / 'ledger.db'}",
        "--tokens",
        str(tokens),
        "--port",
        str(port),
    ]
    env = {k: v for k, v in os.environ.items() if k != "EFFECTFLOW_TOKENS"}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}/api/v1"
        deadline = time.monotonic() + 30
        while True:
            try:
                assert httpx.get(f"{base}/health").json()["status"] == "ok"
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.communicate()[0]
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.1)
        assert httpx.get(f"{base}/runs").status_code == 401
        listed = httpx.get(f"{base}/runs", headers={"Authorization": "Bearer tok-a"})
        assert listed.json() == {"items": [], "next_cursor": None}
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=30)[0].decode()
        assert proc.returncode == 0, output
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_serve_without_tokens_is_a_usage_error(tmp_path: Path) -> None:
    """No --tokens and no EFFECTFLOW_TOKENS: exit 2 before anything listens."""
    env = {k: v for k, v in os.environ.items() if k != "EFFECTFLOW_TOKENS"}
    done = subprocess.run(
        [sys.executable, "-m", "effectflow.cli.main", "serve", "--db", f"{tmp_path}/l.db"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "EFFECTFLOW_TOKENS" in done.stderr
