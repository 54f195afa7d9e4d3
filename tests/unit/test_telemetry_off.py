"""Without the OpenTelemetry API installed, effectflow.telemetry is a no-op that adds nothing to
the hot path (docs/telemetry.md)."""

from __future__ import annotations

import sys
from collections.abc import Generator
from typing import Any

import pytest

from effectflow import telemetry


@pytest.fixture
def without_opentelemetry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The API made unimportable (``import opentelemetry`` raises ImportError), as on a core
    install; telemetry forgets what it loaded before."""
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    monkeypatch.setattr(telemetry, "_loaded", False)
    monkeypatch.setattr(telemetry, "_trace", None)
    monkeypatch.setattr(telemetry, "_metrics", None)
    monkeypatch.setattr(telemetry, "_context", None)


def _machine() -> Generator[int, Any, str]:
    yield 1
    return "done"


def test_without_the_api_telemetry_is_disabled_and_every_hook_is_a_no_op(
    without_opentelemetry: None,
) -> None:
    """enabled() is False, the hooks open no span (nothing is held), and a step's machine is
    handed back itself, not wrapped."""
    assert telemetry.enabled() is False
    telemetry.run_started("r", "wf")
    telemetry.attempt_started("r", "s", "t@1", 1)
    telemetry.attempt_ended("r", "s", "t@1", "unknown")
    telemetry.lookup_started("r", "s", "t@1", "l@1")
    telemetry.lookup_ended("r", "s", "t@1", "confirmed")
    telemetry.decided("r", "s", "e", "op", "t@1", "row", "lookup")
    telemetry.run_left("r")
    headers: dict[str, str] = {}
    telemetry.inject(headers)
    assert headers == {}
    assert telemetry._open == {}
    assert telemetry._attached == {}
    machine = _machine()
    assert telemetry.step("r", "s", "t@1", machine) is machine


def test_the_api_is_imported_by_nothing_but_telemetry() -> None:
    """The core's modules never import opentelemetry themselves: telemetry is the one place,
    and it imports the API only inside a function."""
    import ast
    from pathlib import Path

    import effectflow

    root = Path(effectflow.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        if path.parts[-2:] == ("effectflow", "telemetry.py") or "contrib" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            if any(n.split(".")[0] == "opentelemetry" for n in names):
                offenders.append(str(path.relative_to(root)))
    assert offenders == []


def test_with_the_api_but_no_sdk_configured_nothing_is_made() -> None:
    """The API installed but no provider set (OpenTelemetry's proxies would discard it all): a
    step's machine is handed back unwrapped and no span is opened, so an unconfigured install
    costs a flag check, not a no-op span per step."""
    pytest.importorskip("opentelemetry")
    from opentelemetry import trace

    if type(trace.get_tracer_provider()).__name__ != "ProxyTracerProvider":
        pytest.fail(
            "a test set OpenTelemetry's global tracer provider; tests must use telemetry.use"
        )
    telemetry.use()
    assert telemetry.enabled() is True
    machine = _machine()
    assert telemetry.step("r", "s", "t@1", machine) is machine
    telemetry.run_started("r", "wf")
    telemetry.attempt_started("r", "s", "t@1", 1)
    assert telemetry._open == {}
    assert telemetry._attached == {}
