"""The API's hardening: security headers on every answer, the body limit (413 before any route runs,
nothing stored), the evidence cap, the JSON nesting limit (400, never a 500), constant-time token
checks and the settings' validation."""

from __future__ import annotations

import hmac
import json
import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest

import effectflow as ef
from effectflow import errors
from effectflow.api import create_app, hardening, idempotency

from . import app
from .conftest import ACME, TOKENS, TestClient
from .test_api import assert_problem, unknown_email

HEADERS = {
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; frame-ancestors 'none'; "
        "base-uri 'none'; form-action 'self'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
}


def key(name: str) -> dict[str, str]:
    return {**ACME, "Idempotency-Key": name}


def stored_keys(url: str) -> int:
    """Rows in the Idempotency-Key table: a refused request must not have claimed its key."""
    with sqlite3.connect(idempotency.default_path(url)) as db:
        count: int = db.execute("SELECT count(*) FROM api_requests").fetchone()[0]
    return count


@pytest.fixture
def small(url: str, world: app.World) -> Iterator[TestClient]:
    """An app with small limits, so the tests send small bodies."""
    made = create_app(url, TOKENS, max_body_bytes=4096, max_evidence_bytes=512, max_json_depth=8)
    with TestClient(made) as test_client:
        yield test_client


def resolve_body(effect: ef.EffectRecord, evidence: Any) -> dict[str, Any]:
    return {
        "committed": True,
        "evidence": evidence,
        "by": "ops",
        "expected_version": effect.version,
    }


# -- headers ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/api/v1/health", 200),
        ("GET", "/api/v1/runs", 401),
        ("GET", "/api/v1/nothing", 404),
        ("DELETE", "/api/v1/runs/r1", 405),
        ("GET", "/login", 200),
        ("GET", "/static/console.js", 200),
        ("GET", "/static/nothing.css", 404),
    ],
)
def test_every_answer_carries_the_security_headers(
    client: TestClient, method: str, path: str, status: int
) -> None:
    """A CSP without inline script, no framing, no sniffing and no referrer, on success and error
    answers of the API and the console alike."""
    response = client.request(method, path)
    assert response.status_code == status
    for name, value in HEADERS.items():
        assert response.headers[name] == value


# -- the body limit -------------------------------------------------------------------------------


def test_an_oversized_body_answers_413_and_nothing_is_stored(
    small: TestClient, url: str, rt: ef.Runtime
) -> None:
    """A body over the limit is refused before any route runs: no key claimed, no decision made;
    the same key then works for a request of a normal size."""
    effect = unknown_email(rt, "e1")
    before, audit_before = rt.effects(), rt.audit("e1")
    path = f"/api/v1/effects/{effect.effect_id}/resolve"
    big = resolve_body(effect, {"blob": "x" * 5000})
    response = small.post(path, headers=key("big"), json=big)
    problem = assert_problem(response, 413, "payload_too_large")
    assert "4096" in problem["detail"]
    assert response.headers["x-content-type-options"] == "nosniff"
    assert rt.effects() == before
    assert rt.audit("e1") == audit_before
    assert stored_keys(url) == 0
    fine = small.post(path, headers=key("big"), json=resolve_body(effect, {"ok": 1}))
    assert fine.status_code == 200, fine.text


def test_a_chunked_body_without_a_length_is_counted_too(
    small: TestClient, url: str, rt: ef.Runtime
) -> None:
    """Without Content-Length the body is counted as it arrives and refused once past the limit."""
    effect = unknown_email(rt, "e1")
    before = rt.effects()

    def chunks() -> Iterator[bytes]:
        yield b'{"committed": true, "by": "ops", "evidence": {"blob": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}, "expected_version": 1}'

    response = small.post(
        f"/api/v1/effects/{effect.effect_id}/resolve",
        headers={**key("chunked"), "Content-Type": "application/json"},
        content=chunks(),
    )
    assert "content-length" not in response.request.headers
    assert_problem(response, 413, "payload_too_large")
    assert rt.effects() == before
    assert stored_keys(url) == 0


def test_the_default_limit_is_one_mebibyte(client: TestClient, rt: ef.Runtime) -> None:
    """`create_app` without limits refuses a body over 1 MiB (the 30 MB evidence of the report)."""
    effect = unknown_email(rt, "e1")
    response = client.post(
        f"/api/v1/effects/{effect.effect_id}/resolve",
        headers=key("huge"),
        json=resolve_body(effect, {"blob": "x" * (1024 * 1024)}),
    )
    assert_problem(response, 413, "payload_too_large")
    assert rt.effects(run_id="e1")[0].evidence == effect.evidence


def test_evidence_over_the_cap_answers_413_and_the_effect_stays_in_doubt(
    small: TestClient, rt: ef.Runtime
) -> None:
    """Evidence larger than the stored cap (here 512 bytes, within the body limit) is refused with
    its own code; the effect is still waiting for a person."""
    effect = unknown_email(rt, "e1")
    response = small.post(
        f"/api/v1/effects/{effect.effect_id}/resolve",
        headers=key("ev"),
        json=resolve_body(effect, {"note": "y" * 600}),
    )
    problem = assert_problem(response, 413, "evidence_too_large")
    assert problem["max_bytes"] == 512
    [after] = rt.effects(run_id="e1")
    assert after.status is effect.status
    assert after.version == effect.version


# -- nesting --------------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [9, 100_000], ids=["over the limit", "past the parser's"])
def test_deeply_nested_json_answers_400_not_500(
    small: TestClient, rt: ef.Runtime, depth: int
) -> None:
    """JSON nested past the limit is refused with json_too_deep: a little past it, and so deep
    (within the body limit) that Python's own parser would raise RecursionError."""
    effect = unknown_email(rt, "e1")
    before = rt.effects()
    if depth < 1000:
        evidence: Any = "leaf"
        for _ in range(depth - 1):  # the body object itself is the first level
            evidence = {"k": evidence}
        raw = json.dumps(resolve_body(effect, evidence)).encode()
    else:
        raw = b"[" * 2000 + b"]" * 2000
    assert len(raw) <= 4096
    response = small.post(
        f"/api/v1/effects/{effect.effect_id}/resolve",
        headers={**key(f"deep-{depth}"), "Content-Type": "application/json"},
        content=raw,
    )
    problem = assert_problem(response, 400, "json_too_deep")
    assert problem["max_depth"] == 8
    assert rt.effects() == before


def test_nesting_at_the_limit_is_accepted(small: TestClient, rt: ef.Runtime) -> None:
    """Evidence that nests exactly to the limit is stored as given."""
    effect = unknown_email(rt, "e1")
    evidence: Any = "leaf"
    for _ in range(7):
        evidence = {"k": evidence}
    response = small.post(
        f"/api/v1/effects/{effect.effect_id}/resolve",
        headers=key("at-limit"),
        json=resolve_body(effect, evidence),
    )
    assert response.status_code == 200, response.text
    assert response.json()["evidence"] == evidence


def test_json_depth_counts_without_recursion() -> None:
    """The depth count stops past the limit and never recurses, whatever the shape."""
    assert hardening.json_depth(1, 5) == 0
    assert hardening.json_depth({"a": [1, {"b": []}]}, 5) == 4
    deep: Any = []
    for _ in range(50_000):
        deep = [deep]
    assert hardening.json_depth(deep, 10) == 11
    with pytest.raises(hardening.JSONTooDeep):
        hardening.loads_limited(b"[" * 200_000 + b"]" * 200_000, 32)
    with pytest.raises(ValueError):
        hardening.loads_limited(b"{not json", 32)


# -- tokens and settings ----------------------------------------------------------------------------


def test_tokens_are_compared_in_constant_time_against_every_known_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each check compares fixed-length digests with hmac.compare_digest and never stops early,
    whether the guess is the first token, the last or none."""
    calls: list[tuple[int, int]] = []
    real = hmac.compare_digest

    def counted(a: bytes, b: bytes) -> bool:
        calls.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(hardening.hmac, "compare_digest", counted)
    tokens = {"tok-a": "acme", "tok-b": "beta", "tok-c": "gamma"}
    assert hardening.tenant_of(tokens, "tok-a") == "acme"
    assert hardening.tenant_of(tokens, "tok-c") == "gamma"
    assert hardening.tenant_of(tokens, "tok-") is None
    assert hardening.tenant_of(tokens, "x" * 10_000) is None
    assert len(calls) == 4 * len(tokens)
    assert set(calls) == {(32, 32)}


def test_the_api_authenticates_through_the_constant_time_check(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bearer token is looked up with tenant_of, not a dict lookup."""
    seen: list[str] = []
    real = hardening.tenant_of

    def spy(tokens: dict[str, str], candidate: str) -> str | None:
        seen.append(candidate)
        return real(tokens, candidate)

    monkeypatch.setattr(hardening, "tenant_of", spy)
    assert client.get("/api/v1/runs", headers=ACME).status_code == 200
    assert seen == ["tok-acme"]


@pytest.mark.parametrize(
    "bad",
    [{"max_body_bytes": 0}, {"max_evidence_bytes": -1}, {"max_json_depth": 0}, {"secret": "short"}],
)
def test_settings_are_validated(url: str, bad: dict[str, Any]) -> None:
    """A limit that is not a positive integer, or a secret under 16 bytes, is refused."""
    with pytest.raises(errors.ArgumentError):
        create_app(url, TOKENS, **bad)
