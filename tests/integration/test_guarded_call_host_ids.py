"""A guarded call is found by the host's own ids (its scope and call id) wherever an operator looks:
``rt.runs``, ``effectflow runs`` / ``show``, the HTTP API and the console — and only in its tenant."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import guard_app as app
import pytest
from starlette.applications import Starlette
from typer.testing import CliRunner

import effectflow as ef
from effectflow import console
from effectflow.api import create_app
from effectflow.cli import main as cli_main

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", "The anyio.abc.BlockingPortal alias", DeprecationWarning)
    from starlette.testclient import TestClient

SEND = {"to": "a@example.com", "text": "hi"}
THREAD = "langgraph:thread 42/ns"  # any host id, spaces and slashes included


@pytest.fixture(autouse=True)
def provider(tmp_path: Path) -> Path:
    path = tmp_path / "provider.jsonl"
    app.PROVIDER["file"] = str(path)
    return path


def _calls(url: str) -> dict[str, str]:
    """Three guarded calls in two scopes of tenant acme, one in tenant beta, one plain run."""
    made = {}
    with ef.Runtime(url, tenant="acme") as rt:
        for scope, call_id, to in (
            (THREAD, "call_1", "a"),
            (THREAD, "call_2", "b"),
            ("t2", "c", "c"),
        ):
            done = rt.guard(app.send, {**SEND, "to": to}, scope=scope, call_id=call_id)
            made[f"{scope}|{call_id}"] = done.run_id
    with ef.Runtime(url, tenant="beta") as rt:
        rt.guard(app.send, SEND, scope=THREAD, call_id="call_1")
    return made


def test_runs_by_scope_and_call_id_in_the_runtime(any_ledger: str) -> None:
    made = _calls(any_ledger)
    with ef.Runtime(any_ledger, tenant="acme") as rt:
        in_thread = rt.runs(scope=THREAD)
        assert {r.run_id for r in in_thread} == {made[f"{THREAD}|call_1"], made[f"{THREAD}|call_2"]}
        assert all(r.scope == THREAD for r in in_thread)
        [one] = rt.runs(scope=THREAD, call_id="call_2")
        assert one.call_id == "call_2"
        assert one.run_id == made[f"{THREAD}|call_2"]
        assert [r.run_id for r in rt.runs(call_id="c")] == [made["t2|c"]]
        assert rt.runs(scope="no such thread") == []
    with ef.Runtime(any_ledger, tenant="beta") as rt:
        [theirs] = rt.runs(scope=THREAD)
        assert theirs.run_id not in made.values()  # the same host ids, another tenant's run


def test_the_cli_lists_and_shows_the_hosts_ids(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    made = _calls(url)
    runner = CliRunner()
    listed = runner.invoke(
        cli_main.app, ["runs", "--db", url, "--tenant", "acme", "--scope", THREAD, "--json"]
    )
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.stdout)
    assert sorted(r["call_id"] for r in rows) == ["call_1", "call_2"]
    assert {r["scope"] for r in rows} == {THREAD}
    table = runner.invoke(
        cli_main.app,
        ["runs", "--db", url, "--tenant", "acme", "--scope", THREAD, "--call-id", "call_1"],
        env={"COLUMNS": "250"},
    )
    assert table.exit_code == 0, table.output
    assert "call_1" in table.stdout
    assert "call_2" not in table.stdout
    assert "1 run(s)" in table.stdout
    shown = runner.invoke(
        cli_main.app,
        ["show", made[f"{THREAD}|call_1"], "--db", url, "--tenant", "acme"],
        env={"COLUMNS": "250"},
    )
    assert shown.exit_code == 0, shown.output
    assert f"guarded call 'call_1' in scope {THREAD!r}" in shown.stdout


def test_the_api_filters_by_host_ids_within_the_tenant(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    made = _calls(url)
    tokens = {"tok-acme": "acme", "tok-beta": "beta"}
    with TestClient(create_app(url, tokens)) as client:
        acme = {"Authorization": "Bearer tok-acme"}
        page = client.get("/api/v1/runs", params={"scope": THREAD}, headers=acme).json()
        assert sorted(r["call_id"] for r in page["items"]) == ["call_1", "call_2"]
        one = client.get(
            "/api/v1/runs", params={"scope": THREAD, "call_id": "call_2", "limit": 1}, headers=acme
        ).json()
        assert [r["run_id"] for r in one["items"]] == [made[f"{THREAD}|call_2"]]
        assert one["next_cursor"] is None
        paged = client.get("/api/v1/runs", params={"scope": THREAD, "limit": 1}, headers=acme)
        second = client.get(
            "/api/v1/runs",
            params={"scope": THREAD, "limit": 1, "cursor": paged.json()["next_cursor"]},
            headers=acme,
        ).json()
        assert {paged.json()["items"][0]["call_id"], second["items"][0]["call_id"]} == {
            "call_1",
            "call_2",
        }
        beta = client.get(
            "/api/v1/runs",
            params={"scope": THREAD},
            headers={"Authorization": "Bearer tok-beta"},
        ).json()
        assert len(beta["items"]) == 1
        assert beta["items"][0]["run_id"] not in made.values()
        empty = client.get("/api/v1/runs", params={"scope": ""}, headers=acme)
        assert empty.status_code == 400
        assert "scope must not be empty" in empty.json()["detail"]


def test_the_console_finds_a_hosts_calls(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    made = _calls(url)
    site = Starlette(routes=console.routes())
    site.state.tokens = {"tok-acme": "acme"}
    runtimes: dict[str, ef.Runtime] = {}

    class Runtimes:
        def get(self, tenant: str) -> ef.Runtime:
            return runtimes.setdefault(tenant, ef.Runtime(url, tenant=tenant))

    site.state.runtimes = Runtimes()
    try:
        with TestClient(site) as client:
            form = re.search(r'name="login_csrf" value="([^"]+)"', client.get("/login").text)
            assert form is not None  # the sign-in form's own token (login CSRF)
            client.post("/login", data={"token": "tok-acme", "login_csrf": form.group(1)})
            page = client.get("/runs", params={"scope": THREAD}).text
            assert made[f"{THREAD}|call_1"] in page
            assert made[f"{THREAD}|call_2"] in page
            assert made["t2|c"] not in page
            assert '<th scope="col">Call id</th>' in page
            one = client.get("/runs", params={"scope": THREAD, "call_id": "call_1"}).text
            assert made[f"{THREAD}|call_2"] not in one
            run = client.get(f"/runs/{made[f'{THREAD}|call_1']}").text
            assert "call_1" in run
            assert "/runs?scope=langgraph%3Athread%2042/ns" in run
    finally:
        for runtime in runtimes.values():
            runtime.close()
