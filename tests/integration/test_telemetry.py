"""Telemetry through the OpenTelemetry API (docs/telemetry.md): a run whose first call's response
is lost and is settled by its lookup, captured with the SDK's in-memory exporter and reader.

The mail provider's own file says what happened (one message); the spans, metrics and decision
log lines must tell the same story, and carry ids only: no argument value or key anywhere.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import effectflow as ef
from effectflow import telemetry
from effectflow.cli.worker import load_app
from effectflow.contracts.registry import Registry
from effectflow.contrib.http import http_tool
from effectflow.runtime.worker import Worker
from effectflow.testing import NotifyProvider, ProviderTimeout
from worlds import Current

EFFECTFLOW = shutil.which("effectflow", path=str(Path(sys.executable).parent)) or "effectflow"
FAST = ef.RetryPolicy(max_attempts=3, max_lookups=2, initial_backoff=0.001, max_backoff=0.005)

#: Argument values no attribute or log record may carry.
SECRET_TO = "#secret-channel"
SECRET_BODY = "the-private-body-text"

notify = Current[NotifyProvider]()
#: Non-empty while the provider's search lags: the lookup cannot tell.
LAGGING: set[str] = set()


@ef.tool("tel_find_post", effect="read")
def find_post(*, idempotency_key: str) -> ef.Lookup:
    if LAGGING:
        return ef.Lookup.unknown(reason="the search index is behind")
    found = notify().search(client_tag=idempotency_key)
    if not found:
        return ef.Lookup.not_committed()
    return ef.Lookup.confirmed(external_effect_id=found[0]["notification_id"], result=found[0])


# Not idempotent (every post is a new message) but tagged with the key and searchable: an answer
# lost on the way back is settled by the lookup, never by a second post.
@ef.tool(
    "tel_post",
    version=2,
    effect="external_write",
    confirm=find_post,
    effect_id="notification_id",
    retry=FAST,
    settles_within=0,  # the in-process provider commits inside the call or not at all
)
def post(channel: str, text: str, *, idempotency_key: str) -> dict[str, Any]:
    try:
        return notify().post(channel, text, client_tag=idempotency_key)
    except ProviderTimeout as exc:
        raise ef.OutcomeUnknown(str(exc)) from exc


@ef.workflow("tel_flow")
def tel_flow(ctx: ef.Context, channel: str, text: str) -> str:
    posted = ctx.call("send", post, channel=channel, text=text, operation_id="op_tel_send")
    return str(posted["notification_id"])


class Captured:
    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.metrics = InMemoryMetricReader()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.meter_provider = MeterProvider(metric_readers=[self.metrics])

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def points(self) -> dict[str, list[tuple[dict[str, Any], Any]]]:
        """Each metric's data points as (attributes, value or histogram count)."""
        data = self.metrics.get_metrics_data()
        found: dict[str, list[tuple[dict[str, Any], Any]]] = {}
        assert data is not None
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        value = getattr(point, "value", None)
                        if value is None:
                            value = point.count  # type: ignore[union-attr]
                        found.setdefault(metric.name, []).append((dict(point.attributes), value))
        return found


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[NotifyProvider]:
    with notify.entered(NotifyProvider(tmp_path / "notify.db")) as found:
        yield found


@pytest.fixture
def captured() -> Iterator[Captured]:
    found = Captured()
    telemetry.use(tracer_provider=found.tracer_provider, meter_provider=found.meter_provider)
    yield found
    telemetry.use()
    found.tracer_provider.shutdown()
    found.meter_provider.shutdown()


def _lost_then_looked_up(tmp_path: Path, provider: NotifyProvider) -> tuple[ef.RunRecord, Any]:
    provider.inject("post", "lose_response")
    with ef.Runtime(f"sqlite:///{tmp_path / 'ledger.db'}") as rt:
        run = rt.start(tel_flow, run_id="tel-1", channel=SECRET_TO, text=SECRET_BODY)
        [step] = rt.steps("tel-1")
    return run, step


def test_a_lost_response_settled_by_lookup_is_one_span_tree_with_ids_only(
    tmp_path: Path,
    provider: NotifyProvider,
    captured: Captured,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """run -> step -> (attempt, lookup): the attempt is unknown, the lookup confirmed, the step's
    span names the decision row; attempts and lookups are counted by outcome; no argument value
    or key appears in any attribute or decision log line."""
    caplog.set_level(logging.INFO, logger="effectflow.decisions")
    run, step = _lost_then_looked_up(tmp_path, provider)
    assert run.status is ef.RunStatus.SUCCEEDED, run.error
    [message] = provider.notifications()  # the provider's own record: one post, sent once
    assert message["channel"] == SECRET_TO

    spans = {s.name: s for s in captured.finished()}
    assert sorted(spans) == [
        "effectflow.attempt",
        "effectflow.lookup",
        "effectflow.run",
        "effectflow.step",
    ]
    run_span, step_span = spans["effectflow.run"], spans["effectflow.step"]
    attempt, look = spans["effectflow.attempt"], spans["effectflow.lookup"]
    assert run_span.parent is None
    assert step_span.parent is not None
    assert step_span.parent.span_id == run_span.context.span_id
    for child in (attempt, look):
        assert child.parent is not None
        assert child.parent.span_id == step_span.context.span_id
        assert child.context.trace_id == run_span.context.trace_id
    assert run_span.attributes is not None
    assert run_span.attributes["effectflow.run_id"] == "tel-1"
    assert run_span.attributes["effectflow.run_status"] == "succeeded"
    assert attempt.attributes is not None
    assert attempt.attributes["effectflow.tool"] == "tel_post@2"
    assert attempt.attributes["effectflow.outcome"] == "unknown"
    assert look.attributes is not None
    assert look.attributes["effectflow.result"] == "confirmed"
    assert look.attributes["effectflow.lookup_tool"] == "tel_find_post@1"
    assert step_span.attributes is not None
    assert step_span.attributes["effectflow.step_id"] == "send"
    assert step_span.attributes["effectflow.effect_id"] == step.effect_id
    assert step_span.attributes["effectflow.logical_operation_id"] == step.logical_operation_id
    assert step_span.attributes["effectflow.decision_row"] == "confirmed"
    assert step_span.attributes["effectflow.outcome"] == "ok"

    points = captured.points()
    assert points["effectflow.attempts"] == [
        ({"effectflow.tool": "tel_post@2", "effectflow.outcome": "unknown"}, 1)
    ]
    assert points["effectflow.lookups"] == [
        ({"effectflow.tool": "tel_post@2", "effectflow.result": "confirmed"}, 1)
    ]
    [(_, latency_count)] = points["effectflow.step.duration"]
    assert latency_count == 1

    decisions = [r for r in caplog.records if r.name == "effectflow.decisions"]
    logged = [r.effectflow for r in decisions]  # type: ignore[attr-defined]
    assert [(d["decision_row"], d["action"]) for d in logged] == [
        ("in_doubt_lookup", "lookup"),
        ("confirmed", "use_recorded"),
    ]
    assert all(d["effect_id"] == step.effect_id and d["run_id"] == "tel-1" for d in logged)
    assert all(r.levelno == logging.INFO for r in decisions)

    forbidden = [SECRET_TO, SECRET_BODY, step.idempotency_key]
    emitted = [str(v) for s in captured.finished() for v in (s.attributes or {}).values()]
    emitted += [r.getMessage() for r in decisions] + [str(d) for d in logged]
    assert step.idempotency_key
    assert not [text for text in emitted for secret in forbidden if secret and secret in text]


def test_without_opentelemetry_the_run_is_the_same_and_nothing_is_emitted(
    tmp_path: Path,
    provider: NotifyProvider,
    captured: Captured,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the API unimportable the hooks are no-ops: the run settles the same way, the
    provider holds one message, and the providers passed in receive nothing."""
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    monkeypatch.setattr(telemetry, "_loaded", False)
    monkeypatch.setattr(telemetry, "_trace", None)
    monkeypatch.setattr(telemetry, "_metrics", None)
    monkeypatch.setattr(telemetry, "_context", None)
    run, _ = _lost_then_looked_up(tmp_path, provider)
    assert run.status is ef.RunStatus.SUCCEEDED, run.error
    assert len(provider.notifications()) == 1
    assert captured.finished() == []
    data = captured.metrics.get_metrics_data()
    assert data is None or all(not r.scope_metrics for r in data.resource_metrics)


WORKER_APP = """
import os
import effectflow as ef

@ef.tool("tel_w_note", effect="read")
def note(text: str) -> str:
    with open(os.environ["TEL_NOTES"], "a") as notes:
        notes.write(text + "\\n")
    return text

@ef.workflow("tel_w_flow")
def flow(ctx: ef.Context, text: str) -> str:
    return ctx.call("note", note, text=text)
"""


def test_worker_verbose_logs_one_line_per_run(tmp_path: Path) -> None:
    """``effectflow worker -v`` logs one INFO line per run it executes, naming the run, its
    workflow and the status it left it in; the tool's own file shows each run really ran."""
    app_file = tmp_path / "tel_worker_app.py"
    app_file.write_text(WORKER_APP)
    loaded = load_app(str(app_file))
    db = f"sqlite:///{tmp_path / 'w.db'}"
    with ef.Runtime(db) as rt:
        for n in (1, 2):
            rt.submit(loaded.flow, run_id=f"w-{n}", text=f"note {n}")
    env = {**os.environ, "TEL_NOTES": str(tmp_path / "notes.txt")}
    done = subprocess.run(
        [EFFECTFLOW, "worker", "--app", str(app_file), "--db", db, "--until-idle", "-v"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert sorted((tmp_path / "notes.txt").read_text().splitlines()) == ["note 1", "note 2"]
    lines = [line for line in done.stderr.splitlines() if "effectflow.runtime.worker" in line]
    assert sorted(line.split(": ", 1)[1] for line in lines) == [
        "run w-1 (tel_w_flow): succeeded",
        "run w-2 (tel_w_flow): succeeded",
    ]


class _Headers(BaseHTTPRequestHandler):
    """A local provider that accepts every POST and keeps the headers it was sent."""

    seen: ClassVar[list[dict[str, str]]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        _Headers.seen.append({k.lower(): v for k, v in self.headers.items()})
        body = json.dumps({"id": f"h{len(_Headers.seen)}"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the test reads what the server kept, not its log."""


@pytest.fixture
def local_server() -> Iterator[str]:
    _Headers.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Headers)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _http_run(tmp_path: Path, base_url: str) -> ef.RunRecord:
    registry = Registry()
    send = http_tool(
        "tel_http_send",
        "POST",
        "/send",
        effect="external_write",
        body=("text",),
        idempotency=ef.Idempotency(supported=True),
        effect_id="id",
        base_url=base_url,
        timeout=5.0,  # the call runs in the driver's thread pool: the context must follow it
        register=False,
    )
    registry.add_tool(send)

    @ef.workflow("tel_http_flow", register=False)
    def flow(ctx: ef.Context) -> Any:
        return ctx.call("send", send, text=SECRET_BODY)

    with ef.Runtime(f"sqlite:///{tmp_path / 'h.db'}", registry=registry) as rt:
        return rt.start(flow, run_id="tel-http")


def test_an_http_tool_sends_the_attempt_s_traceparent(
    tmp_path: Path, local_server: str, captured: Captured
) -> None:
    """The request the local server received carries a W3C ``traceparent`` naming the run's
    trace and the attempt's span as its parent."""
    run = _http_run(tmp_path, local_server)
    assert run.status is ef.RunStatus.SUCCEEDED, run.error
    [headers] = _Headers.seen
    version, trace_id, parent_id, _flags = headers["traceparent"].split("-")
    [attempt] = [s for s in captured.finished() if s.name == "effectflow.attempt"]
    assert version == "00"
    assert int(trace_id, 16) == attempt.context.trace_id
    assert int(parent_id, 16) == attempt.context.span_id


def test_without_opentelemetry_an_http_tool_sends_no_traceparent(
    tmp_path: Path, local_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the API unimportable, the request goes out as before: no trace header added."""
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    monkeypatch.setattr(telemetry, "_loaded", False)
    monkeypatch.setattr(telemetry, "_trace", None)
    monkeypatch.setattr(telemetry, "_metrics", None)
    monkeypatch.setattr(telemetry, "_context", None)
    run = _http_run(tmp_path, local_server)
    assert run.status is ef.RunStatus.SUCCEEDED, run.error
    [headers] = _Headers.seen
    assert "traceparent" not in headers


def test_effects_in_doubt_and_waiting_for_a_person_are_gauges_read_from_the_ledger(
    tmp_path: Path,
    provider: NotifyProvider,
    captured: Captured,
) -> None:
    """A lost post whose lookup cannot tell pauses its run: when collected, the gauges read one
    effect in doubt and one waiting for a person (the provider holds the one post); once the
    lookup confirms it and the run goes on, both read zero."""
    LAGGING.add("gauges")
    try:
        provider.inject("post", "lose_response")
        with ef.Runtime(f"sqlite:///{tmp_path / 'ledger.db'}") as rt:
            run = rt.start(tel_flow, run_id="tel-g", channel=SECRET_TO, text=SECRET_BODY)
            assert run.status is ef.RunStatus.PAUSED, run.error
            assert len(provider.notifications()) == 1
            gauges = captured.points()
            assert gauges["effectflow.effects.in_doubt"] == [({"effectflow.tenant": "default"}, 1)]
            assert gauges["effectflow.effects.waiting_for_person"] == [
                ({"effectflow.tenant": "default"}, 1)
            ]
            LAGGING.clear()
            assert rt.resume("tel-g").status is ef.RunStatus.SUCCEEDED
            gauges = captured.points()
            assert gauges["effectflow.effects.in_doubt"] == [({"effectflow.tenant": "default"}, 0)]
            assert gauges["effectflow.effects.waiting_for_person"] == [
                ({"effectflow.tenant": "default"}, 0)
            ]
    finally:
        LAGGING.clear()
    assert len(provider.notifications()) == 1


def test_a_run_whose_lease_another_owner_let_expire_is_counted_as_a_takeover(
    tmp_path: Path, provider: NotifyProvider, captured: Captured
) -> None:
    """A submitted run leased by another owner whose lease expired is resumed here: one
    takeover is counted, and the provider holds the one post the run made."""
    with ef.Runtime(f"sqlite:///{tmp_path / 'ledger.db'}") as rt:
        run = rt.submit(tel_flow, run_id="tel-t", channel="#c", text="t")
        other = rt.store.claim(
            "tel-t", owner="elsewhere:1:x", expected_token=run.lease_token, ttl=0.01, now=rt.clock()
        )
        assert other is not None
        time.sleep(0.05)
        assert captured.points().get("effectflow.lease.takeovers") is None
        assert rt.resume("tel-t").status is ef.RunStatus.SUCCEEDED
    assert captured.points()["effectflow.lease.takeovers"] == [({}, 1)]
    assert len(provider.notifications()) == 1


def test_a_worker_that_claims_runs_whose_owners_let_their_leases_expire_counts_each_takeover(
    any_ledger: str, provider: NotifyProvider, captured: Captured
) -> None:
    """Two runs held by a worker whose leases expired, and one nobody held: ``effectflow
    worker``'s claim loop takes all three, counts two takeovers (not three), and each run posts
    once."""
    with ef.Runtime(any_ledger) as rt:
        for n in range(3):
            run = rt.submit(tel_undoable_flow, run_id=f"tel-w{n}", channel="#c")
            if n < 2:
                other = rt.store.claim(
                    run.run_id,
                    owner="gone:1:x",
                    expected_token=run.lease_token,
                    ttl=0.01,
                    now=rt.clock(),
                )
                assert other is not None
        time.sleep(0.05)
        stats = Worker(rt, concurrency=2).run(until_idle=True)
        assert stats.claimed == 3
        assert all(r.status is ef.RunStatus.SUCCEEDED for r in rt.runs(limit=10))
    assert captured.points()["effectflow.lease.takeovers"] == [({}, 2)]
    assert len(provider.notifications()) == 3


@ef.tool(
    "tel_post_async",
    effect="external_write",
    confirm=find_post,
    effect_id="notification_id",
    retry=FAST,
    settles_within=0,
)
async def post_async(channel: str, text: str, *, idempotency_key: str) -> dict[str, Any]:
    try:
        return notify().post(channel, text, client_tag=idempotency_key)
    except ProviderTimeout as exc:
        raise ef.OutcomeUnknown(str(exc)) from exc


@ef.workflow("tel_flow_async")
async def tel_flow_async(ctx: ef.AsyncContext, channel: str, text: str) -> str:
    posted = await ctx.call("send", post_async, channel=channel, text=text)
    return str(posted["notification_id"])


def test_an_async_run_makes_the_same_span_tree(
    tmp_path: Path, provider: NotifyProvider, captured: Captured
) -> None:
    """On the event loop too: run -> step -> (attempt unknown, lookup confirmed), one post."""
    provider.inject("post", "lose_response")

    async def main() -> ef.RunRecord:
        with ef.Runtime(f"sqlite:///{tmp_path / 'a.db'}") as rt:
            return await rt.start_async(tel_flow_async, run_id="tel-a", channel="#a", text="a")

    run = asyncio.run(main())
    assert run.status is ef.RunStatus.SUCCEEDED, run.error
    assert len(provider.notifications()) == 1
    spans = {s.name: s for s in captured.finished()}
    step_span = spans["effectflow.step"]
    assert step_span.parent is not None
    assert step_span.parent.span_id == spans["effectflow.run"].context.span_id
    for name, key, value in (
        ("effectflow.attempt", "effectflow.outcome", "unknown"),
        ("effectflow.lookup", "effectflow.result", "confirmed"),
    ):
        child = spans[name]
        assert child.parent is not None
        assert child.parent.span_id == step_span.context.span_id
        assert (child.attributes or {})[key] == value


def test_a_step_that_pauses_its_run_ends_paused_not_error(
    tmp_path: Path, provider: NotifyProvider, captured: Captured
) -> None:
    """A refund that waits for approval pauses its run: the step's span and its latency say
    ``paused`` — nothing failed, and a dashboard of step errors must not count it."""
    with ef.Runtime(f"sqlite:///{tmp_path / 'ledger.db'}") as rt:
        run = rt.start(tel_approved_flow, run_id="tel-a", channel="#c")
        assert run.status is ef.RunStatus.PAUSED
    [step_span] = [s for s in captured.finished() if s.name == "effectflow.step"]
    assert step_span.attributes is not None
    assert step_span.attributes["effectflow.outcome"] == "paused"
    [(attributes, count)] = captured.points()["effectflow.step.duration"]
    assert attributes["effectflow.outcome"] == "paused"
    assert count == 1
    assert provider.notifications() == []


RELEASED: list[str] = []


@ef.tool("tel_unpost", effect="external_write", approval=False)
def unpost(notification_id: str) -> dict[str, Any]:
    RELEASED.append(notification_id)
    return {"retracted": notification_id}


@ef.tool(
    "tel_post_undoable",
    effect="external_write",
    confirm=find_post,
    effect_id="notification_id",
    compensation=ef.Compensation(tool=unpost, automatic=True),
    retry=FAST,
    settles_within=0,
)
def post_undoable(channel: str, text: str, *, idempotency_key: str) -> dict[str, Any]:
    return notify().post(channel, text, client_tag=idempotency_key)


@ef.tool("tel_refund", effect="external_write", approval=True, effect_id="notification_id")
def refund(channel: str, *, idempotency_key: str) -> dict[str, Any]:
    return notify().post(channel, "refunded", client_tag=idempotency_key)


@ef.workflow("tel_approved_flow")
def tel_approved_flow(ctx: ef.Context, channel: str) -> Any:
    return ctx.call("refund", refund, channel=channel)


@ef.workflow("tel_undoable_flow")
def tel_undoable_flow(ctx: ef.Context, channel: str) -> Any:
    return ctx.call("post", post_undoable, channel=channel, text="on its way")


@ef.workflow("tel_abandoned_flow")
def tel_abandoned_flow(ctx: ef.Context, channel: str) -> Any:
    ctx.call("post", post_undoable, channel=channel, text="on its way")
    raise ef.AbandonGoal("the order was cancelled")


def test_a_compensation_is_a_step_span_of_the_run_it_answers(
    tmp_path: Path, provider: NotifyProvider, captured: Captured
) -> None:
    """A run abandons its goal after a post: the compensation that answers the post is a step
    span of its own (``compensate:post``) under the run's span, with its attempt under it."""
    RELEASED.clear()
    with ef.Runtime(f"sqlite:///{tmp_path / 'ledger.db'}") as rt:
        run = rt.start(tel_abandoned_flow, run_id="tel-c", channel="#c")
        assert run.status is ef.RunStatus.COMPENSATED, run.error
    [posted] = provider.notifications()
    assert [posted["notification_id"]] == RELEASED
    spans = captured.finished()
    [run_span] = [s for s in spans if s.name == "effectflow.run"]
    steps = {
        str((s.attributes or {})["effectflow.step_id"]): s
        for s in spans
        if s.name == "effectflow.step"
    }
    assert set(steps) == {"post", "compensate:post"}
    for step_span in steps.values():
        assert step_span.parent is not None
        assert step_span.parent.span_id == run_span.context.span_id
    attempts = [s for s in spans if s.name == "effectflow.attempt"]
    assert {str((a.attributes or {})["effectflow.step_id"]) for a in attempts} == set(steps)
    for attempt in attempts:
        step_id = str((attempt.attributes or {})["effectflow.step_id"])
        assert attempt.parent is not None
        assert attempt.parent.span_id == steps[step_id].context.span_id
    compensation = steps["compensate:post"].attributes or {}
    assert compensation["effectflow.tool"] == "tel_unpost@1"
    assert compensation["effectflow.outcome"] == "ok"


class _Collected(MetricExporter):
    """Keeps each export's gauge values (what a periodic exporter's thread read)."""

    def __init__(self) -> None:
        super().__init__()
        self.exports: list[dict[str, int]] = []

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        values: dict[str, int] = {}
        for resource in metrics_data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name.startswith("effectflow.effects."):
                        for point in metric.data.data_points:
                            values[metric.name] = int(getattr(point, "value", 0))
        self.exports.append(values)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None


def test_a_periodic_exporter_reads_the_gauges_from_its_own_thread_while_runs_write(
    any_ledger: str, provider: NotifyProvider, caplog: pytest.LogCaptureFixture
) -> None:
    """The SDK's periodic reader collects on its own thread every 20 ms while this thread runs
    workflows against the same ledger: every collection reads the ledger (no gauge read fails,
    nothing is logged as failed), and the last one says what the ledger holds."""
    exporter = _Collected()
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=20)
    meter_provider = MeterProvider(metric_readers=[reader])
    telemetry.use(meter_provider=meter_provider)
    try:
        with (
            caplog.at_level(logging.WARNING, logger="effectflow.telemetry"),
            ef.Runtime(any_ledger) as rt,
        ):
            LAGGING.add("periodic")
            provider.inject("post", "lose_response")
            paused = rt.start(tel_flow, run_id="tel-p0", channel="#c", text="t")
            assert paused.status is ef.RunStatus.PAUSED
            LAGGING.clear()
            for n in range(1, 25):  # runs of their own operation: each posts once
                done = rt.start(tel_undoable_flow, run_id=f"tel-p{n}", channel="#c")
                assert done.status is ef.RunStatus.SUCCEEDED, done.error
            meter_provider.force_flush()
        assert caplog.records == []
        read = [e for e in exporter.exports if e]
        assert len(read) >= 2, exporter.exports
        assert read[-1] == {
            "effectflow.effects.in_doubt": 1,
            "effectflow.effects.waiting_for_person": 1,
        }
    finally:
        LAGGING.clear()
        telemetry.use()
        meter_provider.shutdown()
    assert len(provider.notifications()) == 25


class _Broken(SpanProcessor):
    """An application's span processor with a bug: it raises on every span."""

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        raise RuntimeError("the processor's bug (on_start)")

    def on_end(self, span: ReadableSpan) -> None:
        raise RuntimeError("the processor's bug (on_end)")


def test_a_span_processor_that_raises_does_not_fail_the_run_or_put_its_effect_in_doubt(
    tmp_path: Path, provider: NotifyProvider, caplog: pytest.LogCaptureFixture
) -> None:
    """Telemetry is an observer: a processor raising inside the write path (the attempt's span
    ends between the provider's answer and the outcome's record) must leave the run as it would
    be without it — one post, confirmed, no lookup — and say once per hook what broke."""
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(_Broken())
    telemetry.use(tracer_provider=tracer_provider)
    try:
        with (
            caplog.at_level(logging.WARNING, logger="effectflow.telemetry"),
            ef.Runtime(f"sqlite:///{tmp_path / 'ledger.db'}") as rt,
        ):
            for n in range(3):
                run = rt.start(tel_undoable_flow, run_id=f"tel-b{n}", channel="#c")
                assert run.status is ef.RunStatus.SUCCEEDED, run.error
                [step] = rt.steps(f"tel-b{n}")
                assert step.status is ef.StepStatus.CONFIRMED
                assert [a.outcome for a in rt.attempts(f"tel-b{n}")] == ["committed"]
    finally:
        telemetry.use()
        tracer_provider.shutdown()
    assert len(provider.notifications()) == 3
    hooks = [r.getMessage() for r in caplog.records]
    assert hooks, "the failure is said"
    assert len(hooks) == len(set(hooks)), "once per hook, not once per span"
    assert all("the run goes on without it" in h for h in hooks)
