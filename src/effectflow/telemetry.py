"""The one place effectflow talks to OpenTelemetry: spans, metrics and decision log lines.

OpenTelemetry is optional (``pip install 'effectflow[telemetry]'``: the API only). Without it every
function here is a cheap no-op, so the core imports and runs the same. With it, spans and metrics
go to the application's configured providers (``trace.get_tracer`` / ``metrics.get_meter``); no
exporter is forced. Tests, or an application that keeps its providers private, pass them to
``use``. What is emitted and under which names: docs/telemetry.md.

The write path is a generator the driver resumes, so a span cannot be "current" across its
yields: each span is opened with an explicit parent found by its ids (run, then step), and closed
by the hook that knows its end. Attributes carry ids, tool@version, outcomes and decision rows —
never argument values, idempotency keys, evidence or outputs.
"""

from __future__ import annotations

import functools
import logging
import os
import weakref
from collections.abc import Callable, Generator, Mapping
from typing import Any, ParamSpec, Protocol, TypeVar

__all__ = [
    "attempt_ended",
    "attempt_started",
    "claimed",
    "decided",
    "enabled",
    "inject",
    "lookup_ended",
    "lookup_started",
    "run_ended",
    "run_left",
    "run_started",
    "step",
    "unwatch",
    "use",
    "watch",
]


class _Status(Protocol):
    @property
    def value(self) -> str: ...


class _Run(Protocol):
    @property
    def run_id(self) -> str: ...
    @property
    def status(self) -> _Status: ...


_R = TypeVar("_R", bound=_Run)


class _Watched(Protocol):
    @property
    def tenant(self) -> str: ...


#: The INFO line of each decision of the table (its row and action, with the ids).
decisions_log = logging.getLogger("effectflow.decisions")

_VERSION = "0.1.0"
_PREFIX = "effectflow."

_trace: Any = None
_metrics: Any = None
_context: Any = None
_tracer_provider: Any = None
_meter_provider: Any = None
_tracer: Any = None
_instruments: dict[str, Any] = {}
#: Open spans by their ids: (run_id,), (run_id, step_id), (run_id, step_id, kind).
_open: dict[tuple[str, ...], Any] = {}
#: The open runtimes whose ledgers the gauges read when collected.
_watched: weakref.WeakSet[Any] = weakref.WeakSet()
#: Context tokens of the attempt spans made current, to detach when their outcome is known.
_attached: dict[tuple[str, ...], Any] = {}
_loaded = False
_active = False
_MISSING = object()
_metrics_internal: Any = None
#: The providers in place before the application sets one (the meters' proxy class is private).
_IDLE = frozenset(
    {"ProxyTracerProvider", "NoOpTracerProvider", "_ProxyMeterProvider", "NoOpMeterProvider"}
)
_FROM_ENV = bool(
    os.environ.get("OTEL_PYTHON_TRACER_PROVIDER") or os.environ.get("OTEL_PYTHON_METER_PROVIDER")
)


_P = ParamSpec("_P")
#: The hooks whose failure was reported (once each: a broken exporter must not flood the log).
_reported: set[str] = set()


def _shielded(hook: Callable[_P, None]) -> Callable[_P, None]:
    """``hook``, unable to fail the run it observes.

    The hooks run inside the write path (an attempt's span ends between the provider's answer and
    the outcome's record): an exception from the application's span processor, exporter or
    propagator raised there would leave a committed effect in doubt. Telemetry is an observer, so
    its failure is logged once per hook and the run goes on."""

    @functools.wraps(hook)
    def shielded(*args: _P.args, **kwargs: _P.kwargs) -> None:
        try:
            hook(*args, **kwargs)
        except Exception:
            _failed(hook.__name__)

    return shielded


def _failed(where: str) -> None:
    if where not in _reported:
        _reported.add(where)
        logging.getLogger("effectflow.telemetry").warning(
            "OpenTelemetry raised in effectflow's %s hook; the run goes on without it (reported "
            "once per hook)",
            where,
            exc_info=True,
        )


def _load() -> bool:
    """Import the OpenTelemetry API once; False (and every hook a no-op) when it is missing."""
    global _loaded, _trace, _metrics, _context, _metrics_internal
    if not _loaded:
        _loaded = True
        try:
            from opentelemetry import context, metrics, trace
        except ImportError:
            _trace = _metrics = _context = None
        else:
            _trace, _metrics, _context = trace, metrics, context
            _metrics_internal = getattr(metrics, "_internal", metrics)
    return _trace is not None


def _on() -> bool:
    """Whether anything would receive what is emitted: providers given to ``use``, or global
    ones the application configured. OpenTelemetry's default (proxy, no-op) providers would
    discard it all, at tens of microseconds a step, so until an SDK is configured nothing is made;
    once one is, that holds (global providers are set once per process)."""
    global _active
    if _active:
        return True
    if not _load():
        return False
    _active = (
        _tracer_provider is not None
        or _meter_provider is not None
        or _configured(_trace, "_TRACER_PROVIDER", _trace.get_tracer_provider)
        or _configured(_metrics_internal, "_METER_PROVIDER", _metrics.get_meter_provider)
    )
    if _active:
        _shielded(_gauges)()
    return _active


def _configured(module: Any, name: str, getter: Any) -> bool:
    """Whether the application set this global provider (to something that is not a no-op).

    Read from the API's module global: the public getter looks the environment up on every call
    (a provider named there, ``OTEL_PYTHON_*_PROVIDER``, is loaded by it: then it is asked)."""
    found = getattr(module, name, _MISSING)
    if found is _MISSING or _FROM_ENV:
        found = getter()
    return found is not None and type(found).__name__ not in _IDLE


def enabled() -> bool:
    """Whether the OpenTelemetry API is importable (spans and metrics are emitted through it)."""
    return _load()


def use(tracer_provider: Any = None, meter_provider: Any = None) -> None:
    """Emit to these providers instead of the global ones (None: the global ones again).

    OpenTelemetry's global providers can be set once per process; tests and applications that
    keep providers private pass theirs here."""
    global _tracer_provider, _meter_provider, _tracer, _active
    _tracer_provider, _meter_provider, _tracer = tracer_provider, meter_provider, None
    _active = False
    _instruments.clear()
    _open.clear()
    _attached.clear()


def _get_tracer() -> Any:
    global _tracer
    if _tracer is None:
        if _tracer_provider is not None:
            _tracer = _tracer_provider.get_tracer("effectflow", _VERSION)
        else:
            _tracer = _trace.get_tracer("effectflow", _VERSION)
    return _tracer


def _instrument(name: str) -> Any:
    """The metric instrument ``name`` (created on first use, on the current meter)."""
    found = _instruments.get(name)
    if found is None:
        if _meter_provider is not None:
            meter = _meter_provider.get_meter("effectflow", _VERSION)
        else:
            meter = _metrics.get_meter("effectflow", _VERSION)
        if name == "effectflow.step.duration":
            found = meter.create_histogram(name, unit="s", description="Step latency")
        else:
            found = meter.create_counter(name, description=_COUNTERS[name])
        _instruments[name] = found
    return found


_COUNTERS = {
    "effectflow.attempts": "Calls to a provider, by outcome",
    "effectflow.lookups": "Lookups, by result",
    "effectflow.lease.takeovers": "Runs claimed whose lease another worker held before",
}


def _attrs(values: Mapping[str, Any]) -> dict[str, Any]:
    return {_PREFIX + k: v for k, v in values.items() if v is not None}


def _start(key: tuple[str, ...], parent: tuple[str, ...] | None, name: str, **ids: Any) -> None:
    tracer = _get_tracer()
    context = None
    if parent is not None and parent in _open:
        context = _trace.set_span_in_context(_open[parent])
    _open[key] = tracer.start_span(name, context=context, attributes=_attrs(ids))


def _end(key: tuple[str, ...], **ids: Any) -> None:
    span = _open.pop(key, None)
    if span is not None:
        if ids:
            span.set_attributes(_attrs(ids))
        span.end()


def _detach(key: tuple[str, ...]) -> None:
    token = _attached.pop(key, None)
    if token is not None:
        _context.detach(token)


@_shielded
def inject(headers: dict[str, str]) -> None:
    """Add the current trace context (``traceparent``, ``tracestate``: the propagators the
    application configured) to an outgoing request's ``headers``; a header already set is kept."""
    if _on():
        from opentelemetry import propagate

        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        for name, value in carrier.items():
            headers.setdefault(name, value)


# -- the hooks the runtime calls -------------------------------------------------------------------


@_shielded
def run_started(run_id: str, workflow: str) -> None:
    """A pass of the executor over a run begins (its span parents the steps it drives)."""
    if _on():
        _start((run_id,), None, "effectflow.run", run_id=run_id, workflow=workflow)


def run_ended(run: _R) -> _R:
    """The pass ends with ``run`` (returned as it is): its status as this pass leaves it."""
    if _active:
        _shielded(_end)((run.run_id,), run_status=run.status.value)
    return run


@_shielded
def run_left(run_id: str) -> None:
    """The pass ends by an exception (a lost lease, a crash injected in a test): its span ends."""
    if _active:
        _end((run_id,), run_status="raised")


def step(
    run_id: str, step_id: str, tool: str, machine: Generator[Any, Any, Any]
) -> Generator[Any, Any, Any]:
    """``machine`` (a step's path through the runtime) inside a span of its own, with its latency
    recorded; ``machine`` itself when OpenTelemetry is missing (nothing added to the hot path)."""
    if not _on():
        return machine
    return _traced_step(run_id, step_id, tool, machine)


def _traced_step(
    run_id: str, step_id: str, tool: str, machine: Generator[Any, Any, Any]
) -> Generator[Any, Any, Any]:
    import time

    key = (run_id, step_id)
    _shielded(_start)(key, (run_id,), "effectflow.step", run_id=run_id, step_id=step_id, tool=tool)
    began = time.perf_counter()
    outcome = "error"
    try:
        value = yield from machine
        outcome = "ok"
        return value
    except BaseException as exc:
        # The run pauses at this step (an approval, an effect in doubt, a person to decide): it
        # did not fail, and a dashboard of step errors must not count it. Imported here: this
        # module imports nothing of the runtime it observes.
        from effectflow.runtime import machine_io

        if isinstance(exc, machine_io.Suspend):
            outcome = "paused"
        raise
    finally:
        _step_ended(key, tool, outcome, time.perf_counter() - began)


@_shielded
def _step_ended(key: tuple[str, str], tool: str, outcome: str, seconds: float) -> None:
    _instrument("effectflow.step.duration").record(
        seconds, _attrs({"tool": tool, "outcome": outcome})
    )
    _detach((*key, "attempt"))
    _end(key, outcome=outcome)


@_shielded
def attempt_started(run_id: str, step_id: str, tool: str, number: int) -> None:
    """A call to the provider is about to be sent: its span is made current until its outcome,
    so the tool's own instrumentation, and ``inject`` (an HTTP tool's ``traceparent``), see it."""
    if _on():
        key = (run_id, step_id, "attempt")
        _start(
            (run_id, step_id, "attempt"),
            (run_id, step_id),
            "effectflow.attempt",
            run_id=run_id,
            step_id=step_id,
            tool=tool,
            attempt=number,
        )
        _attached[key] = _context.attach(_trace.set_span_in_context(_open[key]))


@_shielded
def attempt_ended(run_id: str, step_id: str, tool: str, outcome: str) -> None:
    """The call's outcome (committed, not_committed, unknown) is known and about to be recorded."""
    if _active:
        _detach((run_id, step_id, "attempt"))
        _end((run_id, step_id, "attempt"), outcome=outcome)
        _instrument("effectflow.attempts").add(1, _attrs({"tool": tool, "outcome": outcome}))


@_shielded
def lookup_started(run_id: str, step_id: str, tool: str, lookup_tool: str) -> None:
    """The contract's lookup tool is about to be asked about a step in doubt."""
    if _on():
        _start(
            (run_id, step_id, "lookup"),
            (run_id, step_id),
            "effectflow.lookup",
            run_id=run_id,
            step_id=step_id,
            tool=tool,
            lookup_tool=lookup_tool,
        )


@_shielded
def lookup_ended(run_id: str, step_id: str, tool: str, result: str) -> None:
    """The lookup's answer (confirmed, not_committed, unknown, ...) is known."""
    if _active:
        _end((run_id, step_id, "lookup"), result=result)
        _instrument("effectflow.lookups").add(1, _attrs({"tool": tool, "result": result}))


@_shielded
def claimed(run_id: str, previous_owner: str | None, owner: str) -> None:
    """A run's lease was claimed here; held before by another owner (expired, or its process
    gone), that is a takeover."""
    if previous_owner is not None and previous_owner != owner and _on():
        _instrument("effectflow.lease.takeovers").add(1, {})


@_shielded
def watch(runtime: _Watched) -> None:
    """Report ``runtime``'s effects in doubt and effects waiting for a person as gauges, read
    from its ledger only when the metrics are collected (nothing is counted on the hot path)."""
    _watched.add(runtime)
    if _on():
        _gauges()


def unwatch(runtime: _Watched) -> None:
    """``runtime`` is closing: its ledger is no longer read."""
    _watched.discard(runtime)


def _gauges() -> None:
    """The two gauges, once per meter."""
    if "effectflow.effects.in_doubt" in _instruments:
        return
    meter = (_meter_provider or _metrics).get_meter("effectflow", _VERSION)
    for name, read, description in (
        ("effectflow.effects.in_doubt", _in_doubt, "Effects in doubt that no owner is settling"),
        ("effectflow.effects.waiting_for_person", _waiting, "Effects waiting for a person"),
    ):
        _instruments[name] = meter.create_observable_gauge(
            name, callbacks=[_observer(read)], description=description
        )


def _in_doubt(runtime: Any) -> int:
    return len(runtime.store.effects_in_doubt(tenant=runtime.tenant, now=runtime.clock()))


def _waiting(runtime: Any) -> int:
    return sum(1 for item in runtime.attention() if item.effect_id is not None)


def _observer(read: Any) -> Any:
    def observe(options: Any) -> list[Any]:
        found = []
        for runtime in list(_watched):
            try:
                value = read(runtime)
            except Exception:  # a collector must never break on one ledger; say which
                if runtime not in _watched:
                    continue  # it closed while this collection read it: nothing failed
                logging.getLogger("effectflow.telemetry").warning(
                    "reading the ledger of tenant %s for a gauge failed",
                    runtime.tenant,
                    exc_info=True,
                )
                continue
            found.append(_metrics.Observation(value, {"effectflow.tenant": runtime.tenant}))
        return found

    return observe


@_shielded
def decided(
    run_id: str,
    step_id: str,
    effect_id: str | None,
    operation_id: str | None,
    tool: str,
    row: str,
    action: str,
) -> None:
    """One decision of the table: an INFO line, and the row on the step's span."""
    ids = {
        "run_id": run_id,
        "step_id": step_id,
        "effect_id": effect_id,
        "logical_operation_id": operation_id,
        "tool": tool,
        "decision_row": row,
        "action": action,
    }
    if decisions_log.isEnabledFor(logging.INFO):
        decisions_log.info(
            "run %s step %s: row %s -> %s",
            run_id,
            step_id,
            row,
            action,
            extra={"effectflow": {k: v for k, v in ids.items() if v is not None}},
        )
    if _active:
        span = _open.get((run_id, step_id))
        if span is not None:
            span.set_attributes(_attrs(ids))
