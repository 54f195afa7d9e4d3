"""The HTTP API end to end over a real SQLite ledger and the simulated providers: every route, auth
and tenants, problem documents, idempotent actions, stale decisions and cursor pagination."""

from __future__ import annotations

import itertools
import sys
import types
from typing import Any

import pytest
from openapi_spec_validator import validate
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Mount, Route

import effectflow as ef
from effectflow.api import create_app

from . import app
from .conftest import ACME, BETA, TOKENS, TestClient

R = ef.RunStatus
S = ef.StepStatus
PROBLEM = "application/problem+json"


def key(name: str) -> dict[str, str]:
    return {**ACME, "Idempotency-Key": name}


def assert_problem(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == PROBLEM
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    assert body["code"] == code
    assert body["type"] == f"urn:effectflow:problem:{code}"
    assert body["instance"] == response.request.url.path
    assert body["title"]
    assert body["detail"]
    return body


def unknown_email(rt: ef.Runtime, run_id: str) -> ef.EffectRecord:
    """A run whose email may or may not have been sent: its effect waits for a person."""
    run = rt.start(app.send_email, run_id=run_id, to="li@example.com", lose_response=True)
    assert run.status is R.PAUSED
    [effect] = rt.effects(run_id=run_id)
    assert effect.status in (S.UNKNOWN, S.NEEDS_ATTENTION)
    return effect


def waiting_refund(rt: ef.Runtime, run_id: str) -> ef.RunRecord:
    """A run whose refund waits for an approval."""
    run = rt.start(app.refund, run_id=run_id, payment_id=f"pay_{run_id}", amount=500)
    assert run.status is R.PAUSED
    return run


# -- auth and tenants -------------------------------------------------------------------------------

ROUTES = [
    ("GET", "/api/v1/runs"),
    ("GET", "/api/v1/runs/r1"),
    ("GET", "/api/v1/runs/r1/timeline"),
    ("GET", "/api/v1/effects"),
    ("GET", "/api/v1/attention"),
    ("POST", "/api/v1/effects/eff_1/resolve"),
    ("POST", "/api/v1/runs/r1/steps/s1/approve"),
    ("POST", "/api/v1/runs/r1/steps/s1/reject"),
    ("POST", "/api/v1/runs/r1/cancel"),
    ("POST", "/api/v1/runs/r1/compensate"),
    ("POST", "/api/v1/runs/r1/resume"),
]


@pytest.mark.parametrize(("method", "path"), ROUTES)
@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic dG9rLWFjbWU="}],
    ids=["no token", "unknown token", "other scheme"],
)
def test_every_route_but_health_needs_a_known_bearer_token(
    client: TestClient, method: str, path: str, headers: dict[str, str]
) -> None:
    """Without a known bearer token every route answers 401 with WWW-Authenticate: Bearer."""
    response = client.request(method, path, headers={**headers, "Idempotency-Key": "k"})
    assert_problem(response, 401, "unauthorized")
    assert response.headers["www-authenticate"].startswith("Bearer")


def test_health_and_the_document_need_no_token(client: TestClient) -> None:
    """Health and the OpenAPI document answer without a token."""
    assert client.get("/api/v1/health").json() == {"status": "ok", "version": ef.__version__}
    assert client.get("/api/v1/openapi.json").json()["openapi"] == "3.1.0"


def test_without_a_console_the_root_redirects_to_the_document(
    url: str, world: app.World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where effectflow.console is not installed, / redirects to the OpenAPI document."""
    monkeypatch.setitem(sys.modules, "effectflow.console", None)  # makes its import fail
    with TestClient(create_app(url, TOKENS)) as bare:
        root = bare.get("/", follow_redirects=False)
    assert root.status_code == 307
    assert root.headers["location"] == "/api/v1/openapi.json"


def test_a_console_is_mounted_at_the_root_and_never_shadows_the_api(
    url: str, world: app.World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """effectflow.console.routes() are served at /, while every /api/v1 path stays the API's,
    its errors included."""

    async def page(request: Request) -> Response:
        return PlainTextResponse("console " + request.url.path)

    console = types.ModuleType("effectflow.console")
    console.routes = lambda: [Route("/", page), Route("/{rest:path}", page)]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "effectflow.console", console)
    with TestClient(create_app(url, TOKENS)) as with_console:
        assert with_console.get("/").text == "console /"
        assert with_console.get("/runs/r1").text == "console /runs/r1"
        assert with_console.get("/api/v1/health").json()["status"] == "ok"
        assert_problem(with_console.get("/api/v1/nothing"), 404, "not_found")
        assert_problem(
            with_console.get("/api/v1/runs", headers=BETA | {"Authorization": "x"}),
            401,
            "unauthorized",
        )


def test_another_tenants_run_and_effect_look_missing(
    client: TestClient, rt: ef.Runtime, rt_beta: ef.Runtime
) -> None:
    """A token sees only its tenant: another tenant's run and effect answer 404 exactly as a
    missing id does, on reads and on actions."""
    effect = unknown_email(rt_beta, "theirs")
    for path in ("/api/v1/runs/{}", "/api/v1/runs/{}/timeline", "/api/v1/effects?run_id={}"):
        foreign = client.get(path.format("theirs"), headers=ACME)
        missing = client.get(path.format("absent"), headers=ACME)
        a = assert_problem(foreign, 404, "run_not_found")
        b = assert_problem(missing, 404, "run_not_found")
        assert a["detail"].replace("theirs", "X") == b["detail"].replace("absent", "X")
    for verb in ("cancel", "resume"):
        response = client.post(f"/api/v1/runs/theirs/{verb}", headers=key(f"k-{verb}"), json={})
        assert_problem(response, 404, "run_not_found")
    body = {"committed": True, "evidence": {}, "by": "ops", "expected_version": effect.version}
    foreign = client.post(
        f"/api/v1/effects/{effect.effect_id}/resolve", headers=key("k1"), json=body
    )
    missing = client.post("/api/v1/effects/eff_absent/resolve", headers=key("k2"), json=body)
    a = assert_problem(foreign, 404, "effect_not_found")
    b = assert_problem(missing, 404, "effect_not_found")
    assert a["detail"].replace(effect.effect_id, "X") == b["detail"].replace("eff_absent", "X")
    assert rt_beta.effects(run_id="theirs") == [effect], "nothing changed in the other tenant"
    assert client.get("/api/v1/runs", headers=ACME).json()["items"] == []
    assert [r["run_id"] for r in client.get("/api/v1/runs", headers=BETA).json()["items"]] == [
        "theirs"
    ]


# -- reads ----------------------------------------------------------------------------------------


def test_runs_a_run_and_its_timeline(client: TestClient, rt: ef.Runtime) -> None:
    """Runs list newest first with status filters (repeatable); a run and its timeline render the
    runtime's own views."""
    rt.start(app.doubled, run_id="d1", n=2)
    waiting_refund(rt, "r1")
    listed = client.get("/api/v1/runs", headers=ACME).json()
    assert [r["run_id"] for r in listed["items"]] == ["r1", "d1"]
    assert listed["next_cursor"] is None
    paused = client.get("/api/v1/runs?status=paused", headers=ACME).json()["items"]
    assert [r["run_id"] for r in paused] == ["r1"]
    both = client.get("/api/v1/runs?status=paused&status=succeeded", headers=ACME).json()
    assert len(both["items"]) == 2
    shown = client.get("/api/v1/runs/d1", headers=ACME).json()
    assert shown == rt.run_view(rt.run("d1")).to_dict()
    assert (shown["interrupted"], shown["interruption"]) == (False, None)
    timeline = client.get("/api/v1/runs/d1/timeline", headers=ACME).json()
    assert timeline == {**rt.timeline("d1").to_dict(), "run": shown}
    assert timeline["run"]["output"] == 4
    assert_problem(client.get("/api/v1/runs?status=bogus", headers=ACME), 400, "invalid_request")
    assert_problem(client.get("/api/v1/runs?limit=0", headers=ACME), 400, "invalid_request")
    assert_problem(client.get("/api/v1/runs?limit=x", headers=ACME), 400, "invalid_request")
    assert_problem(client.get("/api/v1/runs?cursor=zzz", headers=ACME), 400, "invalid_request")


def test_effects_and_the_attention_queue(client: TestClient, rt: ef.Runtime) -> None:
    """Effects filter by status and run; the attention queue lists the unknown effect and the
    approval with what a person can do."""
    effect = unknown_email(rt, "e1")
    waiting_refund(rt, "r1")
    items = client.get("/api/v1/effects", headers=ACME).json()["items"]
    assert items == [e.to_dict() for e in rt.effects()]
    by_status = client.get(f"/api/v1/effects?status={effect.status}", headers=ACME).json()
    assert [e["effect_id"] for e in by_status["items"]] == [effect.effect_id]
    assert client.get("/api/v1/effects?status=confirmed", headers=ACME).json()["items"] == []
    of_run = client.get("/api/v1/effects?run_id=e1", headers=ACME).json()["items"]
    assert [e["effect_id"] for e in of_run] == [effect.effect_id]
    queue = client.get("/api/v1/attention", headers=ACME).json()["items"]
    assert {(i["kind"], i["run_id"], i["step_id"]) for i in queue} == {
        ("unknown_effect", "e1", "email"),
        ("approval", "r1", "create_refund"),
    }
    assert queue == [i.to_dict() | {"actions": list(i.actions)} for i in rt.attention()]


class Ticks:
    """A clock that answers each instant ``repeat`` times: runs and effects tie on created_at."""

    def __init__(self, repeat: int = 3) -> None:
        self.counter = itertools.count()
        self.repeat = repeat

    def __call__(self) -> float:
        return 1_700_000_000.0 + next(self.counter) // self.repeat


@pytest.mark.parametrize("limit", [1, 2, 3, 7, 50])
def test_cursor_pagination_walks_every_run_exactly_once(
    client: TestClient, url: str, world: app.World, limit: int
) -> None:
    """Following next_cursor from the first page yields every run of the tenant once, newest
    first, even where runs share a created_at."""
    with ef.Runtime(url, tenant="acme", clock=Ticks()) as ticking:
        for n in range(17):
            ticking.submit(app.doubled, run_id=f"run{n:02}", n=n)
        instants = {r.created_at for r in ticking.runs()}
    assert len(instants) < 17, "some runs share an instant"
    with ef.Runtime(url, tenant="beta") as other:
        other.submit(app.doubled, run_id="beta-run", n=1)
    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        query = f"/api/v1/runs?limit={limit}" + (f"&cursor={cursor}" if cursor else "")
        page = client.get(query, headers=ACME).json()
        assert len(page["items"]) <= limit
        seen.extend(r["run_id"] for r in page["items"])
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == [f"run{n:02}" for n in range(17)]
    assert len(seen) == len(set(seen)) == 17
    created = [
        rt_run["created_at"] for rt_run in client.get("/api/v1/runs", headers=ACME).json()["items"]
    ]
    assert created == sorted(created, reverse=True)
    assert pages == -(-17 // limit) or pages == 17 // limit + 1


@pytest.mark.parametrize("limit", [1, 2, 5])
def test_cursor_pagination_walks_every_effect_exactly_once(
    client: TestClient, url: str, world: app.World, limit: int
) -> None:
    """Effects page oldest first; following next_cursor yields each once despite tied times."""
    with ef.Runtime(url, tenant="acme", clock=Ticks(repeat=40)) as ticking:
        for n in range(6):
            ticking.start(app.send_email, run_id=f"m{n}", to=f"u{n}@example.com")
    effects = ticking_effects(url)
    expected = {e.effect_id for e in effects}
    assert len(expected) == 6
    assert len({e.created_at for e in effects}) < 6, "some effects share an instant"
    seen: list[str] = []
    cursor: str | None = None
    while True:
        query = f"/api/v1/effects?limit={limit}" + (f"&cursor={cursor}" if cursor else "")
        page = client.get(query, headers=ACME).json()
        seen.extend(e["effect_id"] for e in page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen))
    assert set(seen) == expected
    runs_cursor = client.get("/api/v1/runs?limit=1", headers=ACME).json()["next_cursor"]
    assert_problem(
        client.get(f"/api/v1/effects?cursor={runs_cursor}", headers=ACME), 400, "invalid_request"
    )


def ticking_effects(url: str) -> list[ef.EffectRecord]:
    with ef.Runtime(url, tenant="acme") as reader:
        return reader.effects()


# -- actions ----------------------------------------------------------------------------------------


def test_resolve_then_resume_settles_an_unknown_effect(client: TestClient, rt: ef.Runtime) -> None:
    """A person resolves the unknown email as sent (naming the version they saw); resuming the
    run then uses the recorded result and never sends it again."""
    effect = unknown_email(rt, "e1")
    body = {
        "committed": True,
        "evidence": {"mailbox": "found in sent items"},
        "by": "ops-lead",
        "expected_version": effect.version,
    }
    response = client.post(
        f"/api/v1/effects/{effect.effect_id}/resolve", headers=key("res-1"), json=body
    )
    assert response.status_code == 200, response.text
    assert response.json()["status"] == "confirmed"
    assert response.json()["resolved_by"] == "ops-lead"
    resumed = client.post("/api/v1/runs/e1/resume", headers=key("resume-1"))
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["status"] == "succeeded"
    assert len(app.world().mail.messages()) == 1


def test_a_stale_resolve_answers_409_and_changes_nothing(
    client: TestClient, rt: ef.Runtime
) -> None:
    """Resolving with a version the effect has moved past answers 409 stale_state and leaves the
    ledger exactly as it was."""
    effect = unknown_email(rt, "e1")
    before = rt.effects()
    audit_before = rt.audit("e1")
    body = {
        "committed": False,
        "evidence": {},
        "by": "ops",
        "expected_version": effect.version - 1,
    }
    response = client.post(
        f"/api/v1/effects/{effect.effect_id}/resolve", headers=key("stale"), json=body
    )
    problem = assert_problem(response, 409, "stale_state")
    assert problem["effect_id"] == effect.effect_id
    assert rt.effects() == before
    assert rt.audit("e1") == audit_before
    assert rt.run("e1").status is R.PAUSED


def test_an_approval_replayed_with_its_key_answers_the_same_and_acts_once(
    client: TestClient, rt: ef.Runtime
) -> None:
    """The same Idempotency-Key and body get the first answer again (marked as replayed) and no
    second refund; the same key with another body is refused with 422."""
    waiting_refund(rt, "r1")
    url = "/api/v1/runs/r1/steps/create_refund/approve"
    first = client.post(url, headers=key("appr-1"), json={"approver": "finance"})
    assert first.status_code == 200, first.text
    assert first.json()["status"] == "succeeded"
    again = client.post(url, headers=key("appr-1"), content=b'{ "approver" : "finance" }')
    assert again.status_code == 200
    assert again.content == first.content
    assert again.headers["idempotent-replayed"] == "true"
    assert len(app.world().pay.refunds()) == 1
    assert len(rt.effects(run_id="r1")) == 1
    [refund] = rt.effects(run_id="r1")
    assert refund.approval_id is not None
    assert refund.approval_id.startswith("api-")
    other = client.post(url, headers=key("appr-1"), json={"approver": "someone else"})
    assert_problem(other, 422, "idempotency_key_reused")
    elsewhere = client.post("/api/v1/runs/r1/resume", headers=key("appr-1"))
    assert_problem(elsewhere, 422, "idempotency_key_reused")
    beta_same_key = client.post(url, headers={**BETA, "Idempotency-Key": "appr-1"}, json={})
    assert_problem(beta_same_key, 400, "invalid_request")  # keys are per tenant


def test_keys_survive_a_restart_of_the_api(url: str, rt: ef.Runtime) -> None:
    """The key table is a file, not process memory: a new app over the same ledger replays."""
    waiting_refund(rt, "r1")
    path = "/api/v1/runs/r1/steps/create_refund/approve"
    with TestClient(create_app(url, TOKENS)) as first_app:
        first = first_app.post(path, headers=key("k"), json={"approver": "finance"})
    with TestClient(create_app(url, TOKENS)) as second_app:
        again = second_app.post(path, headers=key("k"), json={"approver": "finance"})
    assert (again.status_code, again.content) == (first.status_code, first.content)
    assert again.headers["idempotent-replayed"] == "true"
    assert len(app.world().pay.refunds()) == 1


def test_actions_need_a_key_and_a_valid_body(client: TestClient, rt: ef.Runtime) -> None:
    """An action without Idempotency-Key is refused; a body off its schema answers 400 listing
    what is wrong; an approval of a step that does not wait answers 409."""
    waiting_refund(rt, "r1")
    path = "/api/v1/runs/r1/steps/create_refund/approve"
    assert_problem(client.post(path, headers=ACME, json={}), 400, "idempotency_key_missing")
    bad = assert_problem(
        client.post(path, headers=key("b1"), json={"approver": 3}), 400, "invalid_request"
    )
    assert bad["errors"] == ["approver: 3 is not of type 'string'"]
    assert_problem(client.post(path, headers=key("b2"), content=b"{"), 400, "invalid_request")
    assert rt.run("r1").status is R.PAUSED
    wrong_step = client.post(
        "/api/v1/runs/r1/steps/nope/approve", headers=key("b3"), json={"approver": "x"}
    )
    assert_problem(wrong_step, 409, "stale_state")


def test_cancel_compensate_and_resume(client: TestClient, rt: ef.Runtime) -> None:
    """Cancel answers the inventory; compensate needs a reason and answers the run; resume of a
    finished run answers it unchanged."""
    waiting_refund(rt, "r1")
    cancelled = client.post(
        "/api/v1/runs/r1/cancel", headers=key("c1"), json={"reason": "duplicate", "by": "ops"}
    )
    assert cancelled.status_code == 200, cancelled.text
    inventory = cancelled.json()
    assert inventory["run_id"] == "r1"
    assert inventory["status"] == "cancelled"
    assert inventory["cancelled_steps"] == ["create_refund"]
    assert app.world().pay.refunds() == []
    rt.start(app.doubled, run_id="d1", n=1)
    no_reason = client.post("/api/v1/runs/d1/compensate", headers=key("p0"), json={})
    assert_problem(no_reason, 400, "invalid_request")
    compensated = client.post(
        "/api/v1/runs/d1/compensate", headers=key("p1"), json={"reason": "order withdrawn"}
    )
    assert compensated.status_code == 200, compensated.text
    assert compensated.json()["run_id"] == "d1"
    resumed = client.post("/api/v1/runs/d1/resume", headers=key("p2"), json={"by": "ops"})
    assert resumed.status_code == 200, resumed.text
    assert resumed.json() == rt.run_view(rt.run("d1")).to_dict()


def test_unknown_routes_and_methods_answer_problems(client: TestClient) -> None:
    """Routing errors are problem documents too."""
    assert_problem(client.get("/api/v1/nothing", headers=ACME), 404, "not_found")
    assert_problem(client.get("/api/v1/runs/r1/cancel", headers=ACME), 405, "method_not_allowed")
    assert_problem(client.delete("/api/v1/runs/r1", headers=ACME), 405, "method_not_allowed")


def test_state_holds_the_tokens_and_one_runtime_per_tenant(client: TestClient) -> None:
    """app.state exposes the token map and the per-tenant runtimes the console will reuse."""
    state = client.app.state  # type: ignore[attr-defined]
    assert state.tokens == TOKENS
    acme = state.runtimes.get("acme")
    assert acme is state.runtimes.get("acme")
    assert acme.tenant == "acme"
    assert state.runtimes.get("beta").tenant == "beta"


def test_app_module_is_imported(url: str, world: app.World) -> None:
    """create_app imports the application module given, so its workflows are registered."""
    made = create_app(url, TOKENS, app_module=app.__name__)
    assert made.state.tokens == TOKENS
    with pytest.raises(ImportError):
        create_app(url, TOKENS, app_module="no_such_module_here")


# -- the document -----------------------------------------------------------------------------------


def test_the_openapi_document_is_valid_and_lists_every_route(client: TestClient) -> None:
    """The published document validates as OpenAPI 3.1, declares bearer security and the problem
    schema, and has an operation for every route of the app (and none it lacks)."""
    spec = client.get("/api/v1/openapi.json").json()
    validate(spec)
    assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert "Problem" in spec["components"]["schemas"]
    [mount] = [r for r in client.app.routes if isinstance(r, Mount) and r.path == "/api/v1"]  # type: ignore[attr-defined]
    served = {
        (method.lower(), "/api/v1" + route.path)
        for route in mount.routes
        if isinstance(route, Route)
        for method in (route.methods or set()) - {"HEAD"}
    }
    documented = {(m, p) for p, ops in spec["paths"].items() for m in ops}
    assert served == documented
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            params = {p["name"] for p in op.get("parameters", [])}
            assert {seg[1:-1] for seg in path.split("/") if seg.startswith("{")} <= params
            if method == "post":
                assert "Idempotency-Key" in params
                assert "requestBody" in op
            assert "200" in op["responses"]
