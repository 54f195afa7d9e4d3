"""What was sent, without the secrets it carried (docs/arguments.md), on both ledgers.

A tool drops a token and masks a card number. Called by a workflow and as a guarded call, the
secret's bytes reach nothing an operator or an attacker with the database can read — the ledger's
raw storage, the API's answers, the console's pages, the log, ``effectflow show`` — while the
idempotency key, the request digest and the logical operation are those of the same call made
without the rule, and a call of the same operation with another secret is still refused as a
payload conflict.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
import warnings
from pathlib import Path
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

import effectflow as ef
from effectflow import testing
from effectflow.api import create_app
from effectflow.cli import main as cli_main
from effectflow.contracts import redaction
from effectflow.contracts.registry import Registry
from effectflow.ledger import records
from effectflow.runtime import guard_args

with warnings.catch_warnings():
    # Starlette's test client names anyio.abc.BlockingPortal, an alias anyio 4.12+ deprecates.
    warnings.filterwarnings("ignore", "The anyio.abc.BlockingPortal alias", DeprecationWarning)
    from starlette.testclient import TestClient

#: The secrets, each unique enough that finding its bytes anywhere is a leak, not a coincidence.
TOKEN = "tok-9f3c71d2e8a64b5f"
OTHER_TOKEN = "tok-5b2e94c1a7d3f860"
CARD = "4929-7716-2043-5518"
GUARD_TOKEN = "tok-c4e8a1f7b9d2063e"
PAY_TOKEN = "tok-0d6b3f9e2c7a5184"
SECRETS = (TOKEN, OTHER_TOKEN, CARD, GUARD_TOKEN, PAY_TOKEN)
RULE = ef.Redact(drop=["token"], mask=["card.number"])
#: What the provider received (the tools' calls), to prove the whole call was sent.
SENT: list[dict[str, Any]] = []
#: Where the workflow finds each order's token (never in the run's input, which is not redacted).
VAULT: dict[str, str] = {}
CALLER = {"token": "tok-ops", "tenant": "default"}


def _charge(amount: int, card: dict[str, Any], token: str, *, idempotency_key: str) -> Any:
    SENT.append({"amount": amount, "card": card, "token": token})
    return {"id": f"ch-{amount}", "last4": card["number"][-4:]}


charge = ef.tool(
    "r_charge", effect="external_write", idempotency=ef.Idempotency(supported=True), redact=RULE
)(_charge)
#: The same tool without the rule (in a registry of its own), to compare keys and digests.
charge_plain = ef.tool(
    "r_charge", effect="external_write", idempotency=ef.Idempotency(supported=True), register=False
)(_charge)


@ef.tool(
    "r_pay",
    effect="financial_write",
    idempotency=ef.Idempotency(supported=True),
    redact={"drop": ["token"]},
)
def pay(amount: int, token: str, *, idempotency_key: str) -> dict[str, Any]:
    SENT.append({"amount": amount, "token": token})
    return {"id": f"pay-{amount}"}


@ef.tool("r_post", effect="external_write", idempotency=ef.Idempotency(supported=True))
def post(body: str, *, idempotency_key: str) -> dict[str, str]:
    return {"id": f"post-{len(body)}"}


def _case(ctx: ef.Context, order: str, amount: int) -> Any:
    tool = charge if ctx._port.registry is not PLAIN else charge_plain
    card = {"number": CARD, "exp": "12/30"}
    return ctx.call(
        "charge", tool, operation_id=f"op-{amount}", amount=amount, card=card, token=VAULT[order]
    )


case = ef.workflow("r_case")(_case)
PLAIN = Registry()
PLAIN.add_tool(charge_plain)
PLAIN.add_workflow(ef.workflow("r_case", register=False)(_case))


@ef.workflow("r_big")
def big(ctx: ef.Context) -> Any:
    return ctx.call("post", post, body="x" * (redaction.CAP_BYTES + 100))


@pytest.fixture(autouse=True)
def _clean() -> None:
    SENT.clear()
    VAULT.clear()


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    return caplog


def _stored_text(url: str, folder: Path) -> bytes:
    """Every byte the ledger holds: the SQLite files (the database, its WAL, the API's request
    keys beside it), or every row of every PostgreSQL table printed as text."""
    if url.startswith("sqlite"):
        files = sorted(p for p in folder.iterdir() if p.is_file() and "ledger" in p.name)
        assert any(p.name == "ledger.db" for p in files), files
        return b"".join(p.read_bytes() for p in files)
    with psycopg.connect(url) as pg:
        tables = [
            t
            for (t,) in pg.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
            )
        ]
        assert {"runs", "steps", "audit", "seals", "effects"} <= set(tables)
        rows = [r for t in tables for (r,) in pg.execute(f'SELECT t::text FROM "{t}" t')]
    return "\n".join(rows).encode("utf-8")


def _no_secret(where: str, text: str | bytes) -> None:
    data = text.encode("utf-8") if isinstance(text, str) else text
    for secret in SECRETS:
        assert secret.encode("utf-8") not in data, f"{secret} found in {where}"


def _step(rt: ef.Runtime, run_id: str, step_id: str) -> records.StepRecord:
    return next(s for s in rt.store.steps(run_id) if s.step_id == step_id)


def _identity(step: records.StepRecord) -> tuple[str | None, str, str | None]:
    return step.idempotency_key, step.request_digest, step.logical_operation_id


def test_a_secret_reaches_no_ledger_api_console_log_or_show(
    any_ledger: str, tmp_path: Path, logs: pytest.LogCaptureFixture
) -> None:
    """The required test (issue 17): a dropped token and a masked card number, sent by a workflow
    and by a guarded call, are nowhere but at the provider; what is shown says what was sent."""
    VAULT.update(a=TOKEN, b=OTHER_TOKEN)
    card_shown = {"number": "[masked]", "exp": "12/30"}
    with ef.Runtime(any_ledger) as rt:
        done = rt.start(case, run_id="a", order="a", amount=5)
        assert done.status is ef.RunStatus.SUCCEEDED
        assert SENT == [{"amount": 5, "card": {"number": CARD, "exp": "12/30"}, "token": TOKEN}]
        assert _step(rt, "a", "charge").arguments == {"amount": 5, "card": card_shown}
        # Another secret under the same operation: still a payload conflict, nothing sent.
        conflicted = rt.start(case, run_id="b", order="b", amount=5)
        assert conflicted.status is ef.RunStatus.FAILED
        assert (conflicted.error or {}).get("code") == "idempotency_conflict"
        guarded = {"amount": 3, "card": {"number": CARD, "exp": "12/30"}, "token": GUARD_TOKEN}
        first = rt.guard(charge, guarded, scope="s", call_id="c1")
        assert first.value == {"id": "ch-3", "last4": "5518"}
        assert rt.guard(charge, guarded, scope="s", call_id="c1").value == first.value
        copy = rt.guard(charge, guarded, scope="s", call_id="c2")
        assert copy.deduplicated
        with pytest.raises(ef.IdempotencyConflict):
            rt.guard(charge, {**guarded, "token": OTHER_TOKEN}, scope="s", call_id="c1")
        assert len(SENT) == 2  # the workflow's charge and the guarded call's, once each
        guard_run = rt.run(first.run_id)
        assert guard_run.input["arguments"] == {"amount": 3, "card": card_shown}
        paused = rt.start(_pay_case, run_id="p", amount=9)
        assert paused.status is ef.RunStatus.PAUSED
        wrote = {
            "a": _identity(_step(rt, "a", "charge")),
            "guard": _identity(_step(rt, first.run_id, "call")),
        }
        [waiting] = [i for i in rt.attention() if i.kind == "approval"]
        assert waiting.arguments == {"amount": 9}
        assert rt.verify_audit() == []

    # The same calls without the rule: the same key, digest and operation.
    plain_url = f"sqlite:///{tmp_path / 'plain' / 'plain.db'}"
    (tmp_path / "plain").mkdir()
    with ef.Runtime(plain_url, registry=PLAIN) as plain:
        VAULT["a"] = TOKEN
        plain.start(PLAIN.workflow("r_case"), run_id="a", order="a", amount=5)
        again = plain.guard(charge_plain, guarded, scope="s", call_id="c1")
        assert again.run_id == first.run_id
        assert _identity(_step(plain, "a", "charge")) == wrote["a"]
        assert _identity(_step(plain, again.run_id, "call")) == wrote["guard"]
        assert _step(plain, "a", "charge").arguments == {
            "amount": 5,
            "card": {"number": CARD, "exp": "12/30"},
            "token": TOKEN,
        }

    _no_secret("the ledger's storage", _stored_text(any_ledger, tmp_path))
    shown = _api_and_console(any_ledger, ["a", "b", first.run_id, copy.run_id, "p"])
    assert json.dumps({"amount": 5, "card": card_shown}, sort_keys=True) in shown["console a"]
    for where, text in shown.items():
        _no_secret(where, text)
    for run_id in ("a", "b", first.run_id, "p"):
        for as_json in ([], ["--json"]):
            out = CliRunner().invoke(cli_main.app, ["show", run_id, "--db", any_ledger, *as_json])
            assert out.exit_code == 0, out.output
            _no_secret(f"effectflow show {run_id} {as_json}", out.output)
    out = CliRunner().invoke(cli_main.app, ["show", "a", "--db", any_ledger])
    assert "arguments {" in out.output
    assert "[masked]" in out.output
    out = CliRunner().invoke(cli_main.app, ["show", "a", "--db", any_ledger, "--json"])
    [step] = json.loads(out.output)["steps"]
    assert step["step"]["arguments"] == {"amount": 5, "card": card_shown}
    out = CliRunner().invoke(cli_main.app, ["attention", "--db", any_ledger])
    assert out.exit_code == 3
    assert '{"amount":9}' in out.output
    _no_secret("effectflow attention", out.output)
    assert logs.records, "nothing was logged: the log check would prove nothing"
    for record in logs.records:
        _no_secret(f"log record {record.name}", record.getMessage() + repr(record.args))


def _pay(ctx: ef.Context, amount: int) -> Any:
    return ctx.call("pay", pay, amount=amount, token=PAY_TOKEN)


_pay_case = ef.workflow("r_pay_case")(_pay)


def _api_and_console(url: str, run_ids: list[str]) -> dict[str, str]:
    """Every read of the API (runs, each run, its timeline, effects, attention, the OpenAPI
    document) and the console's pages (runs, each run, attention), as served."""
    app = create_app(url, {CALLER["token"]: CALLER["tenant"]})
    shown: dict[str, str] = {}
    auth = {"Authorization": f"Bearer {CALLER['token']}"}
    with TestClient(app) as client:
        for path in ("/api/v1/runs", "/api/v1/effects", "/api/v1/attention", "/api/v1/health"):
            answer = client.get(path, headers=auth)
            assert answer.status_code == 200, (path, answer.text)
            shown[f"GET {path}"] = answer.text
        for run_id in run_ids:
            for path in (f"/api/v1/runs/{run_id}", f"/api/v1/runs/{run_id}/timeline"):
                answer = client.get(path, headers=auth)
                assert answer.status_code == 200, (path, answer.text)
                shown[f"GET {path}"] = answer.text
        timeline = client.get("/api/v1/runs/a/timeline", headers=auth).json()
        assert timeline["steps"][0]["step"]["arguments"]["card"]["number"] == "[masked]"
        [item] = client.get("/api/v1/attention", headers=auth).json()["items"]
        assert item["arguments"] == {"amount": 9}
        _sign_in(client)
        for path in ["/runs", "/attention", *(f"/runs/{r}" for r in run_ids)]:
            page = client.get(path)
            assert page.status_code == 200, (path, page.text)
            shown[f"console {path.rsplit('/', 1)[-1] if path.startswith('/runs/') else path}"] = (
                page.text.replace("&#34;", '"')
            )
        assert "[masked]" in shown["console a"]
        assert "{&#34;amount&#34;: 9}" in client.get("/attention").text  # escaped, shown
    return shown


def test_a_guarded_call_continued_without_its_host_waits_for_it(any_ledger: str) -> None:
    """Approved in a process that does not hold the whole arguments (the console's, a worker's),
    a redacted guarded call is not sent with the redacted ones: its run pauses for its host,
    whose replay sends it once, with the token."""
    args = {"amount": 4, "token": GUARD_TOKEN}
    with ef.Runtime(any_ledger) as rt:
        with pytest.raises(ef.NeedsPerson) as asked:
            rt.guard(pay, args, scope="h", call_id="c1")
        run_id = asked.value.run_id
        assert run_id is not None
        assert guard_args.sent(rt.run(run_id).input["request_digest"]) is None
        approved = rt.approve(run_id, "call", approver="ops", approval_id="A-h1")
        assert approved.status is ef.RunStatus.PAUSED
        assert (approved.error or {}).get("code") == guard_args.NEEDS_HOST
        assert SENT == []
        assert rt.attention() == []  # approved: it waits for its host, not for a person
        done = rt.guard(pay, args, scope="h", call_id="c1")
        assert done.value == {"id": "pay-4"}
        assert SENT == [{"amount": 4, "token": GUARD_TOKEN}]
        assert rt.guard(pay, args, scope="h", call_id="c1").value == done.value
        assert len(SENT) == 1
        assert rt.verify_audit() == []


def test_arguments_over_the_cap_record_the_marker(any_ledger: str) -> None:
    """A call whose arguments are over 8 KiB of JSON is made whole; its step records the marker
    (size, cap, request digest), never a cut text."""
    with ef.Runtime(any_ledger) as rt:
        assert rt.start(big, run_id="big").status is ef.RunStatus.SUCCEEDED
        step = _step(rt, "big", "post")
    assert step.arguments == {
        redaction.OVER_CAP: {
            "bytes": redaction.CAP_BYTES + 100 + len('{"body":""}'),
            "cap": redaction.CAP_BYTES,
            "request_digest": step.request_digest,
        }
    }


def test_a_bad_rule_records_nothing(any_ledger: str) -> None:
    """A tool whose rule names no parameter is refused at declaration: no run, no row."""
    with pytest.raises(ef.ContractError, match="redact path 'tokn' names no parameter"):
        ef.tool("r_bad", effect="external_write", redact=ef.Redact(drop=["tokn"]))(
            lambda token: None
        )
    with ef.Runtime(any_ledger) as rt:
        assert rt.runs() == []
    if any_ledger.startswith("sqlite"):
        conn = sqlite3.connect(any_ledger.removeprefix("sqlite:///"))
        try:
            assert conn.execute("SELECT count(*) FROM steps").fetchone() == (0,)
        finally:
            conn.close()


@ef.tool("r_draft", redact={"drop": ["api_key"]})
def draft(name: str, api_key: str) -> str:
    return f"hello {name}"


@ef.tool("r_hold", effect="external_write", commit="local_transaction", redact={"mask": ["pin"]})
def hold(seat: str, pin: str, *, tx: ef.LocalTransaction) -> dict[str, str]:
    tx.execute("CREATE TABLE IF NOT EXISTS r_seats (seat TEXT PRIMARY KEY)")
    tx.execute(f"INSERT INTO r_seats VALUES ('{seat}')")  # a constant here, on both drivers
    return {"seat": seat}


@ef.tool("r_release", effect="external_write", approval=False, redact={"mask": ["slot_id"]})
def release(slot_id: str) -> dict[str, str]:
    return {"released": slot_id}


@ef.tool(
    "r_book",
    effect="external_write",
    effect_id="slot_id",
    compensation=ef.Compensation(tool=release, automatic=True),
    redact={"drop": ["secret"]},
)
def book(name: str, secret: str) -> dict[str, str]:
    return {"slot_id": f"slot-{name}"}


@ef.workflow("r_each")
def each(ctx: ef.Context) -> Any:
    text = ctx.call("draft", draft, name="li", api_key=TOKEN)
    ctx.call("hold", hold, seat="12A", pin=CARD)
    return [text, ctx.call("book", book, name="li", secret=OTHER_TOKEN)]


def test_every_kind_of_step_records_its_redacted_arguments(any_ledger: str, tmp_path: Path) -> None:
    """A pure step, a local transaction, a write and the compensation that answers it each
    record what they were called with under their tool's rule, and the secrets are nowhere."""
    with ef.Runtime(any_ledger) as rt:
        assert rt.start(each, run_id="e").status is ef.RunStatus.SUCCEEDED
        rt.compensate("e", reason="the customer cancelled")
        steps = {s.step_id: s for s in rt.store.steps("e")}
        assert steps["draft"].arguments == {"name": "li"}
        assert steps["hold"].arguments == {"seat": "12A", "pin": "[masked]"}
        assert steps["book"].arguments == {"name": "li"}
        [answer] = [s for s in steps.values() if s.compensates is not None]
        assert answer.status is ef.StepStatus.CONFIRMED
        assert answer.arguments == {"slot_id": "[masked]"}
        assert rt.verify_audit() == []
    _no_secret("the ledger's storage", _stored_text(any_ledger, tmp_path))


#: The notification provider's records by idempotency key (what its lookup searches).
NOTIFIED: dict[str, dict[str, Any]] = {}


@ef.tool("r_find_notice", effect="read")
def find_notice(*, idempotency_key: str) -> ef.Lookup:
    found = NOTIFIED.get(idempotency_key)
    if found is None:
        return ef.Lookup.not_committed()
    return ef.Lookup.confirmed(external_effect_id=found["id"], result=found)


@ef.tool(
    "r_notify",
    effect="external_write",
    confirm=find_notice,
    effect_id="id",
    settles_within=0,
    redact={"drop": ["token"]},
)
def notify(to: str, token: str, *, idempotency_key: str) -> dict[str, Any]:
    SENT.append({"to": to, "token": token})
    NOTIFIED[idempotency_key] = {"id": f"n-{len(NOTIFIED) + 1}", "to": to}
    return NOTIFIED[idempotency_key]


def test_a_guarded_call_in_doubt_is_settled_by_its_lookup_without_its_host(
    any_ledger: str,
) -> None:
    """The host crashed after the provider committed and before the answer was recorded; another
    process, which never had the token, recovers the run: the lookup (by the recorded key)
    confirms the effect and the run ends with it, nothing sent again."""
    NOTIFIED.clear()
    crash = testing.FaultPlan(
        [
            testing.Fault(
                testing.FaultPoint.AFTER_CALL_BEFORE_RECORD, action=testing.FaultAction.RAISE
            )
        ]
    )
    args = {"to": "li@example.com", "token": GUARD_TOKEN}
    with ef.Runtime(any_ledger, faults=crash, lease_ttl=0.2) as host:
        with pytest.raises(testing.InjectedCrash):
            host.guard(notify, args, scope="n", call_id="c1")
        [run] = host.runs(scope="n")
    assert len(SENT) == 1
    time.sleep(0.3)  # the crashed host's lease runs out
    with ef.Runtime(any_ledger) as worker:
        ended = worker.resume(run.run_id)
        assert ended.status is ef.RunStatus.SUCCEEDED
        assert ended.output == {"id": "n-1", "to": "li@example.com"}
        assert len(SENT) == 1
        assert _step(worker, run.run_id, "call").arguments == {"to": "li@example.com"}
        assert worker.verify_audit() == []


def test_a_replay_after_the_rule_changed_is_the_same_call(any_ledger: str) -> None:
    """A guarded call recorded without a rule, replayed once the contract redacts (and the other
    way round), is the same call: its recorded result, nothing sent again; another token is
    still another request."""
    args = {"amount": 6, "card": {"number": CARD, "exp": "01/31"}, "token": GUARD_TOKEN}
    with ef.Runtime(any_ledger, registry=PLAIN) as plain:
        before = plain.guard(charge_plain, args, scope="rc", call_id="c1")
    with ef.Runtime(any_ledger) as rt:
        assert rt.guard(charge, args, scope="rc", call_id="c1") == before
        later = rt.guard(charge, args, scope="rc", call_id="c2", known_call_ids=["c1"])
        with pytest.raises(ef.IdempotencyConflict):
            rt.guard(charge, {**args, "token": OTHER_TOKEN}, scope="rc", call_id="c2")
    with ef.Runtime(any_ledger, registry=PLAIN) as plain:
        assert plain.guard(charge_plain, args, scope="rc", call_id="c2") == later
    assert len(SENT) == 2


@ef.workflow("r_markup")
def markup(ctx: ef.Context) -> Any:
    return ctx.call("draft", draft, name="<script>alert(1)</script>", api_key=TOKEN)


def test_the_console_escapes_the_arguments_it_shows(tmp_path: Path) -> None:
    """An argument that is markup is shown as text on the run page, never as markup."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with ef.Runtime(url) as rt:
        assert rt.start(markup, run_id="m").status is ef.RunStatus.SUCCEEDED
    page = _console_page(url, "/runs/m")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script>alert(1)" not in page
    _no_secret("the run page", page)


def _console_page(url: str, path: str) -> str:
    with TestClient(create_app(url, {CALLER["token"]: CALLER["tenant"]})) as client:
        _sign_in(client)
        page = client.get(path)
        assert page.status_code == 200
        return page.text


def _sign_in(client: TestClient) -> None:
    """Sign the console's client in as an operator does: the form, then its post."""
    form = client.get("/login").text
    csrf = form.split('name="login_csrf" value="', 1)[1].split('"', 1)[0]
    data = {"token": CALLER["token"], "next": "/runs", "login_csrf": csrf}
    assert client.post("/login", data=data, follow_redirects=False).status_code == 303
