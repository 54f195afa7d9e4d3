"""An adversarial probe of what was sent and its redaction (docs/arguments.md): real ledgers (both
backends) and, where processes matter, real hosts SIGKILLed mid-call and recovered by a process
that never had the secret, checked against the provider's own record (``redaction_probe_app``).

The promise probed: a secret field never reaches the ledger, the API, the console or a log line,
while the key, the digest and the payload-conflict check are the same as without redaction.

Each test asserts what a demanding user expects. The ones effectflow gets wrong today are marked
``xfail(strict=True)`` with the finding as the reason; they pass, and must lose their marker, once
src/ is fixed. The others are promises that held.
"""

from __future__ import annotations

import dataclasses
import http.server
import json
import logging
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redaction_probe_app as app
from mcp import types
from typer.testing import CliRunner

import effectflow as ef
from effectflow import digests
from effectflow.cli import main as cli_main
from effectflow.contracts import redaction
from effectflow.contracts.registry import Registry
from effectflow.contrib.mcp import config as mcp_config
from effectflow.contrib.mcp import gateway
from effectflow.ledger import records
from effectflow.runtime import guard_args

CHILD = Path(app.__file__)
#: Secrets unique enough that finding their bytes anywhere is a leak, not a coincidence.
TOKEN = "tok-7e1b4c9a0d3f5e62"
OTHER_TOKEN = "tok-2a8d6f0c4e9b1735"
CARD = "5412-7534-9810-3367"
API_KEY = "key-b93f0e6c1d4a7258"
PIN = "4821"
BIG_ACCOUNT = 98765432109876543210987

# -- findings (the reasons of the xfail markers) -------------------------------------------------

DIGEST_REVEALS = (
    "the request digest is an unsalted sha256 of the whole call's canonical JSON, recorded beside "
    "the masked arguments (and in the over-cap marker): a low-entropy masked field (a PIN, a CVV) "
    "is recovered from the ledger by trying each value, 10,000 digests for a 4-digit PIN"
)

# -- helpers -------------------------------------------------------------------------------------


def _stored(url: str, folder: Path) -> bytes:
    """Every byte the ledger holds: the SQLite files in ``folder``, or every row of every
    PostgreSQL table printed as text."""
    if url.startswith("sqlite"):
        files = sorted(p for p in folder.rglob("*") if p.is_file() and "ledger" in p.name)
        assert files, f"no ledger file in {folder}"
        return b"".join(p.read_bytes() for p in files)
    with psycopg.connect(url) as pg:
        tables = [
            t
            for (t,) in pg.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
            )
        ]
        rows = [r for t in tables for (r,) in pg.execute(f'SELECT t::text FROM "{t}" t')]
    return "\n".join(rows).encode("utf-8")


def _step(rt: ef.Runtime, run_id: str, step_id: str) -> records.StepRecord:
    return next(s for s in rt.store.steps(run_id) if s.step_id == step_id)


def _show(url: str, run_id: str) -> str:
    out = CliRunner().invoke(cli_main.app, ["show", run_id, "--db", url, "--json"])
    assert out.exit_code == 0, out.output
    return out.output


# -- what the digest and the rule's paths let through --------------------------------------------


@ef.tool(
    "rp_withdraw",
    effect="external_write",
    idempotency=ef.Idempotency(supported=True),
    redact=ef.Redact(mask=["pin"]),
)
def withdraw(account: str, amount: int, pin: str, *, idempotency_key: str) -> dict[str, Any]:
    return {"ok": amount}


@ef.workflow("rp_cash")
def cash(ctx: ef.Context) -> Any:
    return ctx.call("withdraw", withdraw, account="ac-77", amount=40, pin=PIN)


@pytest.mark.xfail(strict=True, reason=DIGEST_REVEALS)
def test_a_masked_pin_cannot_be_recovered_from_the_ledger(any_ledger: str) -> None:
    """Someone with the ledger (a read-only replica, a backup) reads the masked arguments and the
    request digest of the step, and tries every 4-digit PIN: none may match."""
    with ef.Runtime(any_ledger) as rt:
        assert rt.start(cash, run_id="cash").status is ef.RunStatus.SUCCEEDED
    with ef.Runtime(any_ledger) as reader:
        step = _step(reader, "cash", "withdraw")
    assert step.arguments == {"account": "ac-77", "amount": 40, "pin": redaction.MASK}
    shown = dict(step.arguments)
    found = None
    for n in range(10_000):
        shown["pin"] = f"{n:04d}"
        if "sha256:" + digests.sha256_hex(digests.canonical_json(shown)) == step.request_digest:
            found = shown["pin"]
            break
    assert found is None, f"the masked PIN {found} is the request digest's preimage"


@ef.tool(
    "rp_charge",
    effect="external_write",
    idempotency=ef.Idempotency(supported=True),
    redact=ef.Redact(mask=["card.number"], drop=["batches.token"]),
)
def charge(card: Any, batches: list[Any], *, idempotency_key: str) -> dict[str, str]:
    return {"id": "ch-1"}


@ef.workflow("rp_card_as_text")
def card_as_text(ctx: ef.Context) -> Any:
    return ctx.call("charge", charge, card=CARD, batches=[])


@ef.workflow("rp_nested_batches")
def nested_batches(ctx: ef.Context) -> Any:
    card = {"number": "4000-0000-0000-0002"}
    return ctx.call("charge", charge, card=card, batches=[[{"token": TOKEN, "n": 1}]])


def test_a_path_into_a_value_that_is_not_a_mapping_still_hides_it(tmp_path: Path) -> None:
    """``mask card.number`` and a caller that passes the card as its number: the secret is the
    value the path could not look into, and must not be recorded."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with ef.Runtime(url) as rt:
        assert rt.start(card_as_text, run_id="t").status is ef.RunStatus.SUCCEEDED
        recorded = _step(rt, "t", "charge").arguments
    assert CARD.encode() not in _stored(url, tmp_path), f"recorded: {recorded}"


def test_a_path_applies_inside_a_list_of_lists(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with ef.Runtime(url) as rt:
        assert rt.start(nested_batches, run_id="n").status is ef.RunStatus.SUCCEEDED
        recorded = _step(rt, "n", "charge").arguments
    assert recorded["card"] == {"number": redaction.MASK}  # one level: applied
    assert TOKEN.encode() not in _stored(url, tmp_path), f"recorded: {recorded}"


@ef.tool(
    "rp_transfer",
    effect="external_write",
    idempotency=ef.Idempotency(supported=True),
    redact=ef.Redact(mask=["account"]),
)
def transfer(account: int, *, idempotency_key: str) -> dict[str, str]:
    return {"id": "tr-1"}


@ef.workflow("rp_big_account")
def big_account(ctx: ef.Context) -> Any:
    return ctx.call("transfer", transfer, account=BIG_ACCOUNT)


def test_a_refused_masked_argument_is_not_quoted_in_the_recorded_error(
    any_ledger: str, tmp_path: Path
) -> None:
    """The call is refused (a clear error, nothing sent): right. Its message, which the run
    records, must not carry the masked value."""
    secret = str(BIG_ACCOUNT)
    with ef.Runtime(any_ledger) as rt:
        # A guarded call is refused before anything is recorded; the host gets the message.
        with pytest.raises(ef.ArgumentError) as refused:
            rt.guard(transfer, {"account": BIG_ACCOUNT}, scope="g", call_id="c1")
        assert rt.runs(scope="g") == []
        failed = rt.start(big_account, run_id="b")
        assert failed.status is ef.RunStatus.FAILED
        assert (failed.error or {}).get("type") == "ArgumentError"
    assert secret.encode() not in _stored(any_ledger, tmp_path), "the run's error holds it"
    assert secret not in _show(any_ledger, "b"), "effectflow show prints the masked value"
    assert secret not in str(refused.value), "the host's exception quotes the masked value"


def test_a_path_segment_that_is_not_an_identifier_is_refused_clearly() -> None:
    """The refusal itself holds: a bad path is refused at declaration with what to write."""
    for bad in ("", "card..number", " token", "card. number", "0.card"):
        with pytest.raises(ef.ContractError, match="is not a parameter name or a dotted path"):
            ef.Redact(drop=[bad])
    with pytest.raises(ef.ContractError, match="in both drop and mask"):
        ef.Redact(drop=["card.number"], mask=["card.number"])


def test_a_header_named_x_api_key_can_be_masked(tmp_path: Path) -> None:
    rule = ef.Redact(mask=["headers.X-Api-Key"])  # after the parameter, any key without a dot

    @ef.tool("rp_hook", effect="external_write", redact=rule, register=False)
    def hook(url: str, headers: dict[str, str]) -> str:
        return "ok"

    assert redaction.apply({"url": "u", "headers": {"X-Api-Key": API_KEY}}, hook.contract.redact)[
        "headers"
    ] == {"X-Api-Key": redaction.MASK}


# -- what held: the call's identity, and other shapes --------------------------------------------


@dataclasses.dataclass
class Card:
    number: str
    exp: str


@ef.workflow("rp_typed")
def typed(ctx: ef.Context) -> Any:
    card = Card(number=CARD, exp="09/29")
    return ctx.call("charge", charge, card=card, batches=({"token": TOKEN, "n": 2},))


def test_a_dataclass_and_a_tuple_are_redacted_as_their_json(tmp_path: Path) -> None:
    """The rule applies to the arguments' JSON form (normalized first): a dataclass is a mapping
    and a tuple a list there."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with ef.Runtime(url) as rt:
        assert rt.start(typed, run_id="d").status is ef.RunStatus.SUCCEEDED
        assert _step(rt, "d", "charge").arguments == {
            "card": {"number": redaction.MASK, "exp": "09/29"},
            "batches": [{"n": 2}],
        }
    stored = _stored(url, tmp_path)
    assert CARD.encode() not in stored
    assert TOKEN.encode() not in stored


@ef.tool(
    "rp_letter",
    effect="external_write",
    idempotency=ef.Idempotency(supported=True),
    redact=ef.Redact(mask=["secret"]),
)
def letter(body: str, secret: str, *, idempotency_key: str) -> dict[str, str]:
    return {"id": "l-1"}


@ef.workflow("rp_letters")
def letters(ctx: ef.Context) -> Any:
    # Multibyte text: 3,000 characters are 9,000 bytes, over the cap only when counted in bytes;
    # the secret is long and masked, so the redacted form of the second call is under the cap.
    long_secret = TOKEN + "é" * 10_000
    ctx.call("over", letter, body="€" * 3_000, secret=TOKEN)
    return ctx.call("under", letter, body="short", secret=long_secret)


def test_the_cap_is_measured_after_redaction_and_its_marker_carries_no_text(
    any_ledger: str, tmp_path: Path
) -> None:
    with ef.Runtime(any_ledger) as rt:
        assert rt.start(letters, run_id="l").status is ef.RunStatus.SUCCEEDED
        over = _step(rt, "l", "over")
        under = _step(rt, "l", "under")
    assert over.arguments == {
        redaction.OVER_CAP: {
            "bytes": len(
                digests.canonical_json({"body": "€" * 3000, "secret": redaction.MASK}).encode()
            ),
            "cap": redaction.CAP_BYTES,
            "request_digest": over.request_digest,
        }
    }
    assert under.arguments == {"body": "short", "secret": redaction.MASK}
    assert TOKEN.encode() not in _stored(any_ledger, tmp_path)


def test_another_secret_is_another_request_told_apart_by_its_digest(
    any_ledger: str, tmp_path: Path
) -> None:
    """Two calls of a guarded tool that differ only in the dropped token record the same
    arguments: both are sent (another request, not a repeat), and the operator tells them apart
    by their request digests; the same call id with another token is a payload conflict whose
    message carries neither token."""
    app.PROVIDER["file"] = str(tmp_path / "provider.jsonl")
    with ef.Runtime(any_ledger) as rt:
        one = rt.guard(app.pay, {"amount": 7, "token": TOKEN}, scope="s", call_id="c1")
        two = rt.guard(app.pay, {"amount": 7, "token": OTHER_TOKEN}, scope="s", call_id="c2")
        assert not two.deduplicated
        with pytest.raises(ef.IdempotencyConflict) as conflict:
            rt.guard(app.pay, {"amount": 7, "token": OTHER_TOKEN}, scope="s", call_id="c1")
        first, second = _step(rt, one.run_id, "call"), _step(rt, two.run_id, "call")
        assert rt.verify_audit() == []
    assert [r["token"] for r in app.records()] == [TOKEN, OTHER_TOKEN]
    assert first.arguments == second.arguments == {"amount": 7}
    assert first.request_digest != second.request_digest
    assert first.idempotency_key != second.idempotency_key
    message = str(conflict.value)
    assert TOKEN not in message
    assert OTHER_TOKEN not in message
    stored = _stored(any_ledger, tmp_path)
    assert TOKEN.encode() not in stored
    assert OTHER_TOKEN.encode() not in stored


def test_an_archive_of_redacted_runs_holds_no_secret(tmp_path: Path) -> None:
    """``effectflow archive`` exports the runs as the ledger recorded them: redacted; the file
    verifies on its own."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    app.PROVIDER["file"] = str(tmp_path / "provider.jsonl")
    with ef.Runtime(url) as rt:
        assert rt.start(cash, run_id="cash").status is ef.RunStatus.SUCCEEDED
        rt.guard(app.pay, {"amount": 7, "token": TOKEN}, scope="s", call_id="c1")
    target = tmp_path / "archive.jsonl"
    runner = CliRunner()
    out = runner.invoke(
        cli_main.app, ["archive", "--before", "2999-01-01", "--to", str(target), "--db", url]
    )
    assert out.exit_code == 0, out.output
    text = target.read_text()
    # The rows are in it, their JSON columns as text: the step's arguments, redacted.
    assert '\\"pin\\":\\"[masked]\\"' in text
    assert TOKEN not in text
    assert '\\"pin\\":\\"' + PIN not in text
    out = runner.invoke(cli_main.app, ["audit", "verify", "--archive", str(target)])
    assert out.exit_code == 0, out.output


# -- the MCP gateway -------------------------------------------------------------------------------


class _Upstream:
    """An upstream MCP session as the gateway's tools see it: one that records what it got."""

    def __init__(self) -> None:
        self.got: list[dict[str, Any]] = []

    def call(self, upstream: str, tool: str, arguments: dict[str, Any]) -> types.CallToolResult:
        self.got.append(arguments)
        return types.CallToolResult(content=[], structuredContent={"id": f"m-{len(self.got)}"})


def test_the_mcp_gateway_honours_or_refuses_a_redact_rule(tmp_path: Path) -> None:
    """An operator writes ``redact: {drop: [api_key]}`` in the gateway's contract of a tool: it
    is applied (the upstream gets the key, the ledger never holds it), not ignored."""
    data = {
        "upstreams": {
            "hooks": {
                "command": "unused",
                "tools": {
                    "post": {
                        "effect": "external_write",
                        "idempotency_key": "idempotency_key",
                        "effect_id": "id",
                        "redact": {"drop": ["api_key"]},
                    }
                },
            }
        }
    }
    parsed = mcp_config.parse(data)
    upstream = _Upstream()
    cfg = parsed.upstreams[0].tools["post"]
    made, helpers = gateway.build_tool(upstream, "hooks", cfg, default_timeout=5)  # type: ignore[arg-type]
    registry = Registry()
    for t in (made, *helpers):
        registry.add_tool(t)
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with ef.Runtime(url, registry=registry) as rt:
        sent = {"arguments": {"text": "hi", "api_key": API_KEY}}
        rt.guard(made.ref, sent, scope="mcp", call_id="post:op-1", new_request=True)
    forwarded = [{k: v for k, v in got.items() if k != "idempotency_key"} for got in upstream.got]
    assert forwarded == [{"text": "hi", "api_key": API_KEY}]  # the whole call reached upstream
    assert API_KEY.encode() not in _stored(url, tmp_path)


# -- hosts that die: recovered without the token, continued by their replay ------------------------


def _host(
    url: str, provider: Path, call_id: str, *args: str, slow: float = 0
) -> subprocess.Popen[str]:
    env = {"RP_SLOW": str(slow), "PATH": "/usr/bin:/bin"}
    return subprocess.Popen(
        [sys.executable, str(CHILD), url, str(provider), "h", call_id, TOKEN, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _answer(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    return dict(json.loads(out.strip().splitlines()[-1]))


def _killed(url: str, provider: Path, point: str) -> None:
    proc = _host(url, provider, "c1", "--kill", point)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -9, err


def _recover(url: str, provider: Path) -> subprocess.CompletedProcess[str]:
    """``effectflow recover`` in a process of its own, which never had the token."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "effectflow.cli.main",
            "recover",
            "--app",
            str(CHILD),
            "--db",
            url,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={"RP_PROVIDER": str(provider), "PATH": "/usr/bin:/bin"},
    )


def _paused_for_host(url: str) -> records.RunRecord:
    with ef.Runtime(url) as rt:
        [run] = rt.runs(scope="h")
    assert run.status is ef.RunStatus.PAUSED, (run.status, run.error)
    assert (run.error or {}).get("code") == guard_args.NEEDS_HOST
    return run


@pytest.mark.parametrize("point", ["after_intent", "after_call_before_record"])
def test_a_host_killed_mid_call_is_recovered_without_the_token_and_continued_by_its_replay(
    any_ledger: str, tmp_path: Path, point: str
) -> None:
    """The host is SIGKILLed with its intent recorded (nothing sent), or after the provider
    charged (the answer lost): ``effectflow recover`` in another process, which has only the
    redacted arguments, sends nothing and leaves the run waiting for its host; the host's
    replay charges once in all, with the whole token; the token is in no byte of the ledger."""
    provider = tmp_path / "provider.jsonl"
    app.PROVIDER["file"] = str(provider)
    _killed(any_ledger, provider, point)
    charged = len(app.records())
    assert charged == (0 if point == "after_intent" else 1)
    recovered = _recover(any_ledger, provider)
    assert recovered.returncode in (0, 3), recovered.stdout + recovered.stderr
    assert len(app.records()) == charged, "the recovery sent a call"
    _paused_for_host(any_ledger)
    first = _answer(_host(any_ledger, provider, "c1"))
    assert first.get("value") == {"id": "pay_1", "amount": 7}, first
    again = _answer(_host(any_ledger, provider, "c1"))
    assert again["value"] == first["value"]
    assert [(r["amount"], r["token"]) for r in app.records()] == [(7, TOKEN)]
    assert TOKEN.encode() not in _stored(any_ledger, tmp_path)
    assert TOKEN not in recovered.stdout + recovered.stderr
    with ef.Runtime(any_ledger) as rt:
        assert rt.verify_audit() == []


def test_two_hosts_replaying_a_call_that_waits_for_them_charge_once(
    any_ledger: str, tmp_path: Path
) -> None:
    """The call waits for its host (recovered without the token); two host processes replay it
    at the same moment, the provider slow: one charge, and each host gets it or a clear error."""
    provider = tmp_path / "provider.jsonl"
    app.PROVIDER["file"] = str(provider)
    _killed(any_ledger, provider, "after_intent")
    _recover(any_ledger, provider)
    _paused_for_host(any_ledger)
    gate = threading.Barrier(2)
    procs: list[subprocess.Popen[str]] = []

    def start() -> None:
        gate.wait()
        procs.append(_host(any_ledger, provider, "c1", slow=0.3))

    threads = [threading.Thread(target=start) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    answers = [_answer(p) for p in procs]
    assert len(app.records()) == 1, answers
    values = [a["value"] for a in answers if "value" in a]
    assert values, answers
    assert all(v == {"id": "pay_1", "amount": 7} for v in values), answers


def _cli(url: str, provider: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """An ``effectflow`` command in a process of its own, which never had the token (``--app``
    this probe's tools, for the commands that run them)."""
    app_arg = [] if args[0] == "attention" else ["--app", str(CHILD)]
    return subprocess.run(
        [sys.executable, "-m", "effectflow.cli.main", *args, *app_arg, "--db", url],
        capture_output=True,
        text=True,
        timeout=60,
        env={"RP_PROVIDER": str(provider), "PATH": "/usr/bin:/bin"},
    )


def test_an_approval_given_in_another_process_waits_for_the_host_and_is_sent_once(
    any_ledger: str, tmp_path: Path
) -> None:
    """A redacted guarded call that needs an approval, approved with ``effectflow approve`` in
    another process (which has only the redacted arguments): nothing is sent there; the run waits
    for its host and is no longer an approval in the attention queue; the host's replay refunds
    once, with the token."""
    provider = tmp_path / "provider.jsonl"
    app.PROVIDER["file"] = str(provider)
    asked = _answer(_host(any_ledger, provider, "c1", "--tool", "refund"))
    assert (asked.get("error"), asked.get("kind")) == ("NeedsPerson", "approval"), asked
    waiting = _cli(any_ledger, provider, "attention", "--json")
    assert waiting.returncode == 3, waiting.stdout + waiting.stderr
    assert [i["kind"] for i in json.loads(waiting.stdout)] == ["approval"], waiting.stdout
    approved = _cli(
        any_ledger, provider, "approve", asked["run_id"], "call", "--approver", "ops",
        "--approval-id", "A-rp-1",
    )  # fmt: skip
    assert approved.returncode in (0, 3), approved.stdout + approved.stderr
    assert app.records() == [], "the approving process sent the redacted call"
    _paused_for_host(any_ledger)
    attention = _cli(any_ledger, provider, "attention", "--json")
    assert attention.returncode == 0, attention.stdout + attention.stderr
    assert json.loads(attention.stdout) == [], attention.stdout
    done = _answer(_host(any_ledger, provider, "c1", "--tool", "refund"))
    assert done.get("value") == {"id": "pay_1", "amount": 7}, done
    assert [(r["amount"], r["token"]) for r in app.records()] == [(7, TOKEN)]
    for out in (waiting, approved, attention):
        assert TOKEN not in out.stdout + out.stderr
    assert TOKEN.encode() not in _stored(any_ledger, tmp_path)


def test_a_regenerated_call_of_one_waiting_for_its_host_charges_once(
    any_ledger: str, tmp_path: Path
) -> None:
    """The host dies after the intent of c1 (recovered without the token: waiting for its host),
    then its conversation regenerates the call as c2 (same tool and arguments): c2 is not a
    second charge, before or after c1 is continued by its replay."""
    provider = tmp_path / "provider.jsonl"
    app.PROVIDER["file"] = str(provider)
    _killed(any_ledger, provider, "after_intent")
    _recover(any_ledger, provider)
    _paused_for_host(any_ledger)
    regenerated = _answer(_host(any_ledger, provider, "c2"))
    original = _answer(_host(any_ledger, provider, "c1"))
    again = _answer(_host(any_ledger, provider, "c2"))
    answers = [regenerated, original, again]
    assert len(app.records()) == 1, answers
    assert original.get("value") == {"id": "pay_1", "amount": 7}, answers
    for answer in (regenerated, again):
        assert answer.get("value", original["value"]) == original["value"], answers
        assert "value" in answer or answer["error"] == "NeedsPerson", answers


def _span_text(span: Any) -> str:
    parts = [span.name, repr(dict(span.attributes or {})), repr(span.status.description)]
    parts += [f"{e.name} {dict(e.attributes or {})!r}" for e in span.events]
    return "\n".join(parts)


def test_no_secret_reaches_a_span_a_metric_or_a_log_line(
    any_ledger: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Spans (their attributes, events and status), metrics and every log record of redacted
    workflow steps and guarded calls (done, refused as a conflict, waiting for an approval and
    then for the host) carry no secret, and no masked PIN."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from effectflow import telemetry

    spans, metrics = InMemorySpanExporter(), InMemoryMetricReader()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    meter_provider = MeterProvider(metric_readers=[metrics])
    telemetry.use(tracer_provider=tracer_provider, meter_provider=meter_provider)
    caplog.set_level(logging.DEBUG)
    app.PROVIDER["file"] = str(tmp_path / "provider.jsonl")
    try:
        with ef.Runtime(any_ledger) as rt:
            assert rt.start(cash, run_id="cash").status is ef.RunStatus.SUCCEEDED
            assert rt.start(typed, run_id="typed").status is ef.RunStatus.SUCCEEDED
            rt.guard(app.pay, {"amount": 7, "token": TOKEN}, scope="s", call_id="c1")
            with pytest.raises(ef.IdempotencyConflict):
                rt.guard(app.pay, {"amount": 7, "token": OTHER_TOKEN}, scope="s", call_id="c1")
            with pytest.raises(ef.NeedsPerson) as asked:
                rt.guard(app.refund, {"amount": 7, "token": TOKEN}, scope="s", call_id="r1")
            assert asked.value.run_id is not None
            waiting = rt.approve(asked.value.run_id, "call", approver="ops", approval_id="A-t")
            assert (waiting.error or {}).get("code") == guard_args.NEEDS_HOST
            rt.guard(app.refund, {"amount": 7, "token": TOKEN}, scope="s", call_id="r1")
        data = metrics.get_metrics_data()
    finally:
        telemetry.use()
        tracer_provider.shutdown()
        meter_provider.shutdown()
    finished = spans.get_finished_spans()
    assert {s.name for s in finished} >= {"effectflow.step"}, [s.name for s in finished]
    assert len(app.records()) == 2  # the pay and the refund, each once
    texts = {f"span {s.name}": _span_text(s) for s in finished}
    texts["metrics"] = data.to_json() if data is not None else ""
    assert caplog.records, "nothing was logged: the log check would prove nothing"
    for record in caplog.records:
        texts[f"log {record.name}"] = texts.get(f"log {record.name}", "") + (
            record.getMessage() + repr(record.args) + (record.exc_text or "")
        )
    for where, text in texts.items():
        for secret in (TOKEN, OTHER_TOKEN, CARD, f"pin={PIN}", f"'pin': '{PIN}'"):
            assert secret not in text, f"{secret} in {where}"


# -- HTTP tools: the request's URL --------------------------------------------------------------

HOOK_SECRET = "hk-31c9e07ab54f2d68"


class _Refusing(http.server.BaseHTTPRequestHandler):
    """A provider that refuses every request (422, a JSON error), as a bad payload would be."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"code": "invalid_text", "message": "text is too long"}).encode()
        self.send_response(422)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_an_http_tool_refused_by_its_provider_records_no_masked_argument(tmp_path: Path) -> None:
    from effectflow.contrib.http import http_tool

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        hook = http_tool(
            "rp_http_hook",
            "POST",
            "/hooks/{hook_secret}",
            effect="external_write",
            body=["text"],
            query=["api_key"],
            base_url=f"http://127.0.0.1:{server.server_address[1]}",
            redact={"mask": ["hook_secret", "api_key"]},
            register=False,
        )
        registry = Registry()
        registry.add_tool(hook)

        def post(ctx: ef.Context) -> Any:
            return ctx.call("post", hook, hook_secret=HOOK_SECRET, api_key=API_KEY, text="hi")

        registry.add_workflow(ef.workflow("rp_http_post", register=False)(post))
        url = f"sqlite:///{tmp_path / 'ledger.db'}"
        with ef.Runtime(url, registry=registry) as rt:
            ended = rt.start(registry.workflow("rp_http_post"), run_id="h")
            step = _step(rt, "h", "post")
    finally:
        server.shutdown()
        server.server_close()
    assert ended.status is ef.RunStatus.FAILED, ended.status
    assert step.arguments == {"hook_secret": "[masked]", "api_key": "[masked]", "text": "hi"}
    stored = _stored(url, tmp_path)
    assert API_KEY.encode() not in stored, (step.error, ended.error)
    assert HOOK_SECRET.encode() not in stored, (step.error, ended.error)


def test_a_workflow_step_killed_mid_call_is_recovered_under_its_rule(tmp_path: Path) -> None:
    """A workflow's redacted step, its process SIGKILLed after the provider charged: ``effectflow
    recover`` in another process (the application's: its vault has the token) retries with the
    original key (one charge) and records the step's arguments under the rule again; the token is
    in no byte of the ledger."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    provider = tmp_path / "provider.jsonl"
    app.PROVIDER["file"] = str(provider)
    proc = _host(url, provider, "w1", "--workflow", "--kill", "after_call_before_record")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == -9, err
    assert len(app.records()) == 1
    recovered = subprocess.run(
        [sys.executable, "-m", "effectflow.cli.main", "recover", "--app", str(CHILD), "--db", url],
        capture_output=True,
        text=True,
        timeout=60,
        env={"RP_PROVIDER": str(provider), "RP_VAULT": TOKEN, "PATH": "/usr/bin:/bin"},
    )
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    with ef.Runtime(url) as rt:
        run = rt.run("w1")
        step = _step(rt, "w1", "pay")
        assert rt.verify_audit() == []
    assert run.status is ef.RunStatus.SUCCEEDED, (run.status, run.error)
    assert run.output == {"id": "pay_1", "amount": 7}
    assert step.arguments == {"amount": 7}
    assert [(r["amount"], r["token"]) for r in app.records()] == [(7, TOKEN)]
    assert TOKEN.encode() not in _stored(url, tmp_path)
    assert TOKEN not in recovered.stdout + recovered.stderr


@ef.tool(
    "rp_fields",
    effect="external_write",
    idempotency=ef.Idempotency(supported=True),
    redact=ef.Redact(drop=["token"], mask=["auth.password"]),
)
def fields(to: str, *, idempotency_key: str, **extra: Any) -> dict[str, Any]:
    return {"got": sorted(extra)}


def test_a_rule_on_a_kwargs_tool_applies_to_the_names_it_was_given(tmp_path: Path) -> None:
    """A ``**kwargs`` tool takes any path; the call's extra names are redacted like parameters
    (the whole call still reaches the tool), in the guarded call's input and its step."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    args = {"to": "a", "token": TOKEN, "auth": {"password": OTHER_TOKEN, "user": "li"}}
    with ef.Runtime(url) as rt:
        done = rt.guard(fields, args, scope="k", call_id="c1")
        shown = {"to": "a", "auth": {"password": redaction.MASK, "user": "li"}}
        assert done.value == {"got": ["auth", "token"]}
        assert rt.run(done.run_id).input["arguments"] == shown
        assert _step(rt, done.run_id, "call").arguments == shown
    stored = _stored(url, tmp_path)
    assert TOKEN.encode() not in stored
    assert OTHER_TOKEN.encode() not in stored


# -- agent hosts: what effectflow puts in front of the person ------------------------------------


def test_the_approval_interrupt_shows_the_redacted_arguments(tmp_path: Path) -> None:
    from langchain.agents import create_agent
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage, BaseMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langgraph.checkpoint.memory import InMemorySaver

    from effectflow.contrib import langgraph as ef_langgraph

    class Scripted(BaseChatModel):
        """Asks for the refund once (the token in its arguments, as a model given it would)."""

        @property
        def _llm_type(self) -> str:
            return "scripted"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Scripted:  # type: ignore[override]
            return self

        def _generate(self, messages: list[BaseMessage], *a: Any, **kw: Any) -> ChatResult:
            call = {"name": "rp_refund", "args": {"amount": 7, "token": TOKEN}, "id": "call_1"}
            reply = AIMessage(content="", tool_calls=[{**call, "type": "tool_call"}])
            return ChatResult(generations=[ChatGeneration(message=reply)])

    app.PROVIDER["file"] = str(tmp_path / "provider.jsonl")
    with ef.Runtime(f"sqlite:///{tmp_path / 'ledger.db'}") as rt:
        middleware = ef_langgraph.EffectflowMiddleware(rt, tools=[app.refund])
        agent = create_agent(Scripted(), middleware=[middleware], checkpointer=InMemorySaver())
        config = {"configurable": {"thread_id": "T1"}}
        state = agent.invoke({"messages": [{"role": "user", "content": "refund"}]}, config)
        [asked] = state["__interrupt__"]
        [item] = rt.attention()
    assert item.arguments == {"amount": 7}  # what effectflow's own surfaces show
    assert asked.value["kind"] == "approval"
    assert app.records() == []
    assert asked.value["arguments"] == {"amount": 7}, asked.value["arguments"]
