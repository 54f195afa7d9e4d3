"""``effectflow serve``: tokens from a file or the environment, uvicorn serving the API, a clean
exit on SIGTERM, and the hardening options passed to the app."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer

from effectflow.api import hardening
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


def test_serve_passes_each_hardening_option_to_the_app(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every hardening option of create_app is an option of `effectflow serve` (or its variable),
    and uvicorn's own proxy-header handling is off (it would believe any local client)."""
    import uvicorn
    from typer.testing import CliRunner

    import effectflow.api
    from effectflow.cli.main import app as cli

    made: dict[str, Any] = {}
    ran: dict[str, Any] = {}
    monkeypatch.setattr(effectflow.api, "create_app", lambda *a, **kw: made.update(kw) or "app")
    monkeypatch.setattr(uvicorn, "run", lambda application, **kw: ran.update(kw))
    monkeypatch.setattr(serve.signal, "signal", lambda *a: None)
    (tmp_path / "secret").write_text("s3cret-s3cret-s3cret\n")
    args = ["serve", "--db", f"sqlite:///{tmp_path / 'l.db'}", "--max-body-bytes", "2048"]
    args += ["--max-evidence-bytes", "512", "--trust-proxy", "10.0.0.1,10.0.0.2"]
    args += ["--secure-cookies", "--secret-file", str(tmp_path / "secret")]
    env = {"EFFECTFLOW_TOKENS": "t=acme", "EFFECTFLOW_MAX_JSON_DEPTH": "6"}
    done = CliRunner().invoke(cli, args, env=env)
    assert done.exit_code == 0, done.output
    assert made["max_body_bytes"] == 2048
    assert made["max_evidence_bytes"] == 512
    assert made["max_json_depth"] == 6
    assert made["trust_proxy"] == "10.0.0.1,10.0.0.2"
    assert made["secure_cookies"] is True
    assert made["secret"] == "s3cret-s3cret-s3cret"
    assert ran["proxy_headers"] is False
    # Without the options, create_app's defaults apply (and no secret: a random one).
    made.clear()
    done = CliRunner().invoke(cli, ["serve", "--db", f"sqlite:///{tmp_path / 'l.db'}"], env=env)
    assert done.exit_code == 0, done.output
    assert "max_body_bytes" not in made
    assert made["secret"] is None
    assert made["trust_proxy"] is None


def test_the_documented_defaults_are_the_apps() -> None:
    """The defaults the options' help states are create_app's."""
    import inspect

    source = inspect.getsource(serve.serve)
    assert f"(default: {hardening.DEFAULT_MAX_BODY_BYTES}, 1 MiB)" in source
    assert f"(default: {hardening.DEFAULT_MAX_EVIDENCE_BYTES}, 64 KiB)" in source
    assert f"(default: {hardening.DEFAULT_MAX_JSON_DEPTH})" in source


def test_a_served_app_limits_bodies_and_trusts_only_the_named_proxy(tmp_path: Path) -> None:
    """Over real HTTP: a body over --max-body-bytes answers 413; X-Forwarded-Proto: https makes
    the console's cookies Secure only from the proxy --trust-proxy names."""
    port = _free_port()
    command = [
        sys.executable, "-m", "effectflow.cli.main", "serve",
        "--db", f"sqlite:///{tmp_path / 'ledger.db'}", "--port", str(port),
        "--max-body-bytes", "2048", "--trust-proxy", "127.0.0.1",
    ]  # fmt: skip
    env = {**os.environ, "EFFECTFLOW_TOKENS": "tok-a=acme"}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                assert httpx.get(f"{base}/api/v1/health").status_code == 200
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.communicate()[0]
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.1)
        big = httpx.post(
            f"{base}/api/v1/runs/r1/resume",
            headers={"Authorization": "Bearer tok-a", "Idempotency-Key": "k"},
            json={"by": "x" * 3000},
        )
        assert big.status_code == 413
        assert big.headers["content-type"] == "application/problem+json"
        assert big.json()["code"] == "payload_too_large"
        proxied = httpx.get(f"{base}/login", headers={"X-Forwarded-Proto": "https"})
        assert "secure" in proxied.headers["set-cookie"].lower()
        assert "secure" not in httpx.get(f"{base}/login").headers["set-cookie"].lower()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
