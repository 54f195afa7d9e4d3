"""Probing ``renews_lease`` (a write renews its run's lease only once a third of the TTL has passed
since the last renewal, or for the intent of a call given a deadline) with real components: a real
ledger on each backend, real threads, asyncio runs, a real child process killed with SIGKILL.

What is checked at every call, against the ledger as a connection of its own reads it (never the
runtime's opinion of itself):

1. the ledger's lease is never earlier than the runtime's own belief (``lease_valid_until``): no
   call starts on a lease the ledger no longer has;
2. a call starts with at least two thirds of a TTL of lease left (real clocks: less a small
   allowance for the commit's own latency);
3. a deadline given to a tool never exceeds the ledger's lease at the call;
4. every effect happens once, and none is lost.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import importlib.util
import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import effectflow as ef
import ledgers
import worlds
from effectflow.contracts import registry as registry_mod
from effectflow.ledger.store import open_store
from effectflow.runtime import leases
from effectflow.runtime.worker import Worker

#: The TTL of the fake-clock tests (seconds of ``worlds.FakeClock``).
TTL = 30.0
#: What a call must start with at least.
TWO_THIRDS = 1 - leases.RENEW_AFTER


@pytest.fixture(params=ledgers.BACKENDS)
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a fresh ledger on each backend (``ledgers.fresh``)."""
    with ledgers.fresh(request.param, tmp_path, "ef_lprobe") as url:
        yield url


def _with_option(url: str, option: str) -> str:
    return url + ("&" if "?" in url else "?") + option


@dataclasses.dataclass(frozen=True)
class Seen:
    """One call as the tool saw it: when, what the runtime believed, what the ledger holds."""

    run: str
    key: str
    tool: str
    at: float
    belief: float | None
    ledger: float | None
    owner: str | None
    deadline: float | None


class Probe:
    """The outside world of a test: a provider that records each effect by its key, and, at each
    call, the run's lease as the runtime believes it and as a store of its own reads it."""

    def __init__(self, url: str, clock: Callable[[], float]) -> None:
        self.url = url
        self.clock = clock
        self.reader = open_store(url)
        self.lock = threading.Lock()
        self.seen: list[Seen] = []
        self.sent: collections.Counter[str] = collections.Counter()
        self.rt: ef.Runtime | None = None
        #: Called inside each forward call (run, step number), after it is seen.
        self.on_call: Callable[[str, int], None] = lambda run, n: None

    def close(self) -> None:
        self.reader.close()

    def _belief(self, run: str) -> float | None:
        assert self.rt is not None
        for state in self.rt.leases.held():
            if state.run.run_id == run:
                return state.lease_valid_until
        return None

    def saw(self, run: str, key: str, tool: str, deadline: float | None = None) -> None:
        at = self.clock()
        belief = self._belief(run)  # first: the ledger read after it can only be later
        with self.lock:
            record = self._read(run)
            self.seen.append(
                Seen(
                    run,
                    key,
                    tool,
                    at,
                    belief,
                    record.lease_expires_at,
                    record.lease_owner,
                    deadline,
                )
            )

    def _read(self, run: str) -> Any:
        """The run's record (a reader whose connection an outage cut reads again)."""
        for _ in range(50):
            try:
                record = self.reader.get_run(run)
            except ef.LedgerUnavailable:
                time.sleep(0.05)
                continue
            assert record is not None
            return record
        raise AssertionError("the ledger stayed away from the reader")

    def land(self, key: str) -> None:
        with self.lock:
            self.sent[key] += 1

    def landed(self, key: str) -> bool:
        with self.lock:
            return key in self.sent

    def check(self, ttl: float, *, slack: float = 0.0, race: float = 0.0) -> None:
        """Invariants 1-3 at every call seen. ``slack``: what a real clock's commit may take
        between the fence's decision and the call; ``race``: how far a heartbeat that read the
        clock just before a renewing write and landed just after it may move the lease back (a
        real clock: milliseconds; ``test_a_heartbeat_that_read_the_clock_before_...``)."""
        assert self.seen
        for s in self.seen:
            assert s.ledger is not None, s
            assert s.owner is not None, s
            assert s.belief is not None, s
            assert s.ledger >= s.belief - race, (
                f"(1) the ledger's lease is earlier than believed: {s}"
            )
            assert s.ledger - s.at >= ttl * TWO_THIRDS - slack, f"(2) short lease at call: {s}"
            if s.deadline is not None:
                assert s.deadline <= s.ledger + race, f"(3) deadline past the ledger's lease: {s}"

    def once(self, expected: int) -> None:
        """Invariant 4: ``expected`` effects, each once."""
        assert len(self.sent) == expected, sorted(self.sent)
        assert set(self.sent.values()) == {1}, self.sent


@pytest.fixture
def probe_of(tmp_path: Path) -> Iterator[Callable[[str, Callable[[], float]], Probe]]:
    made: list[Probe] = []

    def make(url: str, clock: Callable[[], float]) -> Probe:
        made.append(Probe(url, clock))
        return made[-1]

    yield make
    for p in made:
        p.close()


@dataclasses.dataclass
class App:
    registry: registry_mod.Registry
    flow: ef.Workflow[..., Any]
    async_flow: ef.Workflow[..., Any]
    tools: dict[str, Any]


def _app(probe: Probe, *, timed_every: int = 3) -> App:
    """Tools that report to ``probe`` and a workflow of ``steps`` external writes; every
    ``timed_every``-th takes a deadline, and each has a compensation (which cannot take one: a
    compensation's arguments come from the effect)."""

    def find(*, idempotency_key: str) -> ef.Lookup:
        if probe.landed(idempotency_key):
            return ef.Lookup.confirmed(external_effect_id=idempotency_key)
        return ef.Lookup.not_committed()

    def undo(sent_id: str, *, idempotency_key: str) -> dict[str, Any]:
        run = sent_id.split("|", 1)[0]
        probe.saw(run, idempotency_key, "undo")
        probe.on_call(run, -1)
        probe.land(idempotency_key)
        return {"undone": sent_id}

    def send(run: str, n: int, *, idempotency_key: str) -> dict[str, Any]:
        probe.saw(run, idempotency_key, "send")
        probe.on_call(run, n)
        probe.land(idempotency_key)
        return {"sent_id": f"{run}|{n}|{idempotency_key}"}

    def send_by(run: str, n: int, *, idempotency_key: str, deadline: float) -> dict[str, Any]:
        probe.saw(run, idempotency_key, "send_by", deadline)
        probe.on_call(run, n)
        probe.land(idempotency_key)
        return {"sent_id": f"{run}|{n}|{idempotency_key}"}

    def note(n: int, *, tx: ef.LocalTransaction) -> int:
        tx.execute("CREATE TABLE IF NOT EXISTS lprobe_notes (n INTEGER)")
        mark = "?" if tx.paramstyle == "qmark" else "%s"
        tx.execute(f"INSERT INTO lprobe_notes (n) VALUES ({mark})", (n,))
        return n

    find_tool = ef.tool("lp_find", effect="read", register=False)(find)
    undo_tool = ef.tool(
        "lp_undo", effect="external_write", approval=False, timeout=60.0, register=False
    )(undo)
    common: dict[str, Any] = {
        "effect": "external_write",
        "confirm": find_tool,
        "effect_id": "sent_id",
        "settles_within": 0,
        "compensation": ef.Compensation(tool=undo_tool, automatic=True),
        "register": False,
    }
    plain = ef.tool("lp_send", **common)(send)
    timed = ef.tool("lp_send_by", timeout=60.0, **common)(send_by)
    local = ef.tool("lp_note", effect="external_write", commit="local_transaction", register=False)(
        note
    )

    def pick(n: int) -> Any:
        return timed if n % timed_every == timed_every - 1 else plain

    @ef.workflow("lp_flow", register=False)
    def flow(ctx: ef.Context, run: str, steps: int, local_every: int = 0) -> int:
        for n in range(steps):
            ctx.call(f"s{n}", pick(n), run=run, n=n)
            if local_every and n % local_every == 0:
                ctx.call(f"l{n}", local, n=n)
        return steps

    @ef.workflow("lp_async_flow", register=False)
    async def async_flow(ctx: ef.AsyncContext, run: str, steps: int) -> int:
        for n in range(steps):
            await ctx.call(f"s{n}", pick(n), run=run, n=n)
        return steps

    registry = registry_mod.Registry()
    tools = {"find": find_tool, "undo": undo_tool, "plain": plain, "timed": timed, "local": local}
    for made in tools.values():
        registry.add_tool(made)
    registry.add_workflow(flow)
    registry.add_workflow(async_flow)
    return App(registry, flow, async_flow, tools)


def _succeeded(rt: ef.Runtime, runs: list[str]) -> None:
    """Each run succeeded, its lease given up (its expiry is not checked: a heartbeat that took
    its snapshot before the end may set it again, ``test_a_heartbeat_that_lands_after_...``)."""
    for run in runs:
        record = rt.run(run)
        assert record.status is ef.RunStatus.SUCCEEDED, (run, record.error)
        assert record.lease_owner is None
    assert rt.verify_audit() == []


# -- concurrency on real clocks -------------------------------------------------------------------

#: The TTL of the real-clock tests: the heartbeat beats every 0.5 s, so that it races the writes.
REAL_TTL = 1.5
#: What a real clock's commit may take between the fence's decision and the call.
SLACK = 0.25
#: How far back a late heartbeat may move a lease on a real clock: none, since the heartbeat and
#: the writes move it forward only (checks (1) and (3) are exact).
RACE = 0.0


def _together(jobs: dict[str, Callable[[], Any]], timeout: float = 60) -> dict[str, Any]:
    results: dict[str, Any] = {}
    go = threading.Barrier(len(jobs))

    def run(name: str, job: Callable[[], Any]) -> None:
        go.wait()
        try:
            results[name] = job()
        except BaseException as exc:
            results[name] = exc

    threads = [threading.Thread(target=run, args=item) for item in jobs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads)
    return results


def test_eight_threads_on_one_runtime_never_call_past_the_ledger_s_lease(
    ledger: str, probe_of: Callable[..., Probe]
) -> None:
    """8 threads share one Runtime with group commit on (the committer applies each group with
    its own ``now``) while the heartbeat beats every 0.5 s: at every call the ledger's lease is at
    least the runtime's belief, at least 2/3 of a TTL ahead, and past any deadline given."""
    probe = probe_of(ledger, time.time)
    app = _app(probe)
    probe.on_call = lambda run, n: time.sleep(0.03)
    runs = [f"t{i}" for i in range(8)]
    with ef.Runtime(ledger, registry=app.registry, lease_ttl=REAL_TTL, group_commit=True) as rt:
        probe.rt = rt
        assert rt.committer is not None
        results = _together(
            {r: (lambda r=r: rt.start(app.flow, run_id=r, run=r, steps=30)) for r in runs}
        )
        assert all(isinstance(v, ef.RunRecord) for v in results.values()), results
        _succeeded(rt, runs)
        assert rt.committer.batches >= 8 * 30 * 2  # every write went through the committer
    probe.check(REAL_TTL, slack=SLACK, race=RACE)
    probe.once(8 * 30)
    # The writes left the lease alone most of the time: far fewer expiries than calls.
    assert len({s.ledger for s in probe.seen}) < len(probe.seen) // 2


def test_asyncio_runs_never_call_past_the_ledger_s_lease(
    ledger: str, probe_of: Callable[..., Probe]
) -> None:
    """8 async runs on one event loop (``start_async``: the AsyncGroupCommitter flushes each turn
    with its own ``now``), the heartbeat racing them: the same invariants."""
    probe = probe_of(ledger, time.time)
    app = _app(probe)
    probe.on_call = lambda run, n: time.sleep(0.01)
    runs = [f"a{i}" for i in range(8)]
    with ef.Runtime(ledger, registry=app.registry, lease_ttl=REAL_TTL) as rt:
        probe.rt = rt
        assert rt.async_committer is not None

        async def all_runs() -> list[Any]:
            return await asyncio.gather(
                *(rt.start_async(app.async_flow, run_id=r, run=r, steps=40) for r in runs)
            )

        done = asyncio.run(all_runs())
        assert all(r.status is ef.RunStatus.SUCCEEDED for r in done), done
        assert rt.async_committer.transactions < rt.async_committer.batches
        _succeeded(rt, runs)
    probe.check(REAL_TTL, slack=SLACK, race=RACE)
    probe.once(8 * 40)


def test_a_worker_s_claimed_runs_never_call_past_the_ledger_s_lease(
    ledger: str, probe_of: Callable[..., Probe]
) -> None:
    """Runs submitted for workers and claimed (in bulk) by a Worker of 4 threads: the state it
    builds from the claimed record believes no more than the ledger holds."""
    probe = probe_of(ledger, time.time)
    app = _app(probe)
    probe.on_call = lambda run, n: time.sleep(0.02)
    runs = [f"w{i}" for i in range(8)]
    with ef.Runtime(ledger, registry=app.registry, lease_ttl=REAL_TTL) as rt:
        probe.rt = rt
        for r in runs:
            rt.submit(app.flow, run_id=r, run=r, steps=12)
        stats = Worker(rt, concurrency=4, idle_wait=0.05).run(until_idle=True)
        assert (stats.claimed, stats.finished, stats.lost, stats.crashed) == (8, 8, 0, 0)
        _succeeded(rt, runs)
    probe.check(REAL_TTL, slack=SLACK, race=RACE)
    probe.once(8 * 12)


# -- one run on a fake clock: exact --------------------------------------------------------------


def _fake_runtime(url: str, app: App, clock: worlds.FakeClock, **options: Any) -> ef.Runtime:
    return ef.Runtime(url, registry=app.registry, clock=clock, lease_ttl=TTL, **options)


@pytest.mark.parametrize("statements", [False, True], ids=["one_trip", "statements"])
def test_a_clock_that_jumps_back_then_far_forward(
    ledger: str, probe_of: Callable[..., Probe], clock: worlds.FakeClock, statements: bool
) -> None:
    """Each call takes 4 s; in the middle the clock jumps back 100 s, later forward 1000 s (past
    several TTLs). Whatever the clock does, every call starts on 2/3 of a TTL of the ledger's
    lease in the clock's own terms, and the deadline stays within it. (``statements``: on
    PostgreSQL every batch goes statement by statement, through ``fence_run``'s COALESCE.)"""
    if statements and not ledger.startswith("postgres"):
        pytest.skip("SQLite writes every batch one way")
    probe = probe_of(ledger, clock)
    app = _app(probe)
    jumps = {5: -100.0, 11: 1000.0}

    def on_call(run: str, n: int) -> None:
        clock.advance(4 + jumps.get(n, 0.0))

    probe.on_call = on_call
    with _fake_runtime(ledger, app, clock) as rt:
        probe.rt = rt
        if statements:
            rt.store.one_trip = False  # type: ignore[attr-defined]
        run = rt.start(app.flow, run_id="jumpy", run="jumpy", steps=18)
        assert run.status is ef.RunStatus.SUCCEEDED, run.error
        _succeeded(rt, ["jumpy"])
        if statements:
            assert rt.store.trips["one_trip"] == 0  # type: ignore[attr-defined]
    probe.check(TTL)
    probe.once(18)
    # Renewals stay rare: fewer distinct expiries than half the calls.
    assert len({s.ledger for s in probe.seen}) <= len(probe.seen) // 2 + 1


def test_local_transactions_between_writes_keep_the_lease_proven(
    ledger: str, probe_of: Callable[..., Probe], clock: worlds.FakeClock
) -> None:
    """``local_transaction`` steps (``commit_with`` -> ``apply_with``, which renews the ledger's
    lease without telling the runtime) between external writes: the belief stays at or below the
    ledger's lease, and calls still start on 2/3 of a TTL."""
    probe = probe_of(ledger, clock)
    app = _app(probe)
    probe.on_call = lambda run, n: clock.advance(3)
    with _fake_runtime(ledger, app, clock) as rt:
        probe.rt = rt
        run = rt.start(app.flow, run_id="loc", run="loc", steps=14, local_every=2)
        assert run.status is ef.RunStatus.SUCCEEDED, run.error
        _succeeded(rt, ["loc"])
    probe.check(TTL)
    probe.once(14)


class _AdvanceOnRetry(logging.Handler):
    """Moves the fake clock forward when the outcome write is retried (the ledger is away
    between two tries): the second try must decide its renewal again."""

    def __init__(self, clock: worlds.FakeClock, by: float) -> None:
        super().__init__()
        self.clock = clock
        self.by = by
        self.retries = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "ledger write failed" in record.getMessage():
            self.retries += 1
            if self.retries == 1:
                self.clock.advance(self.by)


def _hold_sqlite_lock(path: str, hold: float, held: threading.Event) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        held.set()
        time.sleep(hold)
        conn.execute("ROLLBACK")
    finally:
        conn.close()


def _terminate_connections(url: str) -> None:
    database = url.rsplit("/", 1)[1].split("?", 1)[0]
    with psycopg.connect(ledgers.PG, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (database,),
        )


def test_an_outage_between_tries_decides_the_renewal_again(
    ledger: str, probe_of: Callable[..., Probe], clock: worlds.FakeClock
) -> None:
    """The ledger goes away during s1's call, whose outcome (at T0 + 8: 22 s of the start's lease
    left) does not renew on its first try; the clock moves 15 s while the ledger is away. The
    retried outcome (``outage.write`` runs ``_fence`` again) finds 7 s left and must renew: s2's
    call starts on a whole lease, and the ledger agrees with the runtime."""
    pg = ledger.startswith("postgres")
    url = _with_option(ledger, "pool_max=1" if pg else "busy_timeout=0.1")
    probe = probe_of(url, clock)
    app = _app(probe, timed_every=1000)  # no deadlines: only the writes renew
    handler = _AdvanceOnRetry(clock, 15.0)
    logger = logging.getLogger("effectflow.runtime.outage")
    logger.addHandler(handler)

    def on_call(run: str, n: int) -> None:
        clock.advance(4)
        if n != 1:
            return
        if pg:
            _terminate_connections(ledger)
            return
        held = threading.Event()
        path = ledger.removeprefix("sqlite:///")
        threading.Thread(target=_hold_sqlite_lock, args=(path, 0.5, held), daemon=True).start()
        assert held.wait(10)

    probe.on_call = on_call
    t0 = clock.now
    try:
        with _fake_runtime(url, app, clock, ledger_retry=600.0) as rt:
            probe.rt = rt
            run = rt.start(app.flow, run_id="away", run="away", steps=6)
            assert run.status is ef.RunStatus.SUCCEEDED, run.error
            _succeeded(rt, ["away"])
    finally:
        logger.removeHandler(handler)
    assert handler.retries >= 1  # the outage was real
    probe.check(TTL)
    probe.once(6)
    # s2's call (T0 + 23) runs on the lease the retried outcome renewed at T0 + 23.
    s2 = probe.seen[2]
    assert (s2.at - t0, (s2.ledger or 0) - t0) == (23, 23 + TTL)


def test_a_compensate_recorded_elsewhere_is_applied_on_proven_leases(
    ledger: str, probe_of: Callable[..., Probe], clock: worlds.FakeClock
) -> None:
    """A second runtime records a compensate while the run is held (during s4's call); the
    holder learns it with its next write and compensates every effect, each compensation taking
    4 s: every call, forward or compensating, on a proven lease."""
    probe = probe_of(ledger, clock)
    app = _app(probe)
    other = ef.Runtime(ledger, registry=app.registry, clock=clock, lease_ttl=TTL)

    def on_call(run: str, n: int) -> None:
        clock.advance(4)
        if run == "undone" and n == 4:
            other.compensate("undone", reason="the customer called it off", by="ops")

    probe.on_call = on_call
    try:
        with _fake_runtime(ledger, app, clock) as rt:
            probe.rt = rt
            run = rt.start(app.flow, run_id="undone", run="undone", steps=8)
            assert run.status is ef.RunStatus.COMPENSATED, (run.status, run.error)
            assert rt.verify_audit() == []
    finally:
        other.close()
    undos = [s for s in probe.seen if s.tool == "undo"]
    forward = [s for s in probe.seen if s.tool != "undo"]
    assert len(forward) in (5, 6)
    assert len(undos) == len(forward)
    probe.check(TTL)
    probe.once(2 * len(forward))


def test_a_run_paused_for_an_approval_and_resumed_later_calls_on_a_fresh_lease(
    ledger: str, probe_of: Callable[..., Probe], clock: worlds.FakeClock
) -> None:
    """s2's tool needs an approval: the run pauses (its lease released), the clock moves 500 s,
    a second runtime approves and resumes it (``reopen``: a fenced batch written by the store
    itself, then a claim): the resumed run believes only what the ledger holds."""
    probe = probe_of(ledger, clock)
    app = _app(probe)

    def send_gated(run: str, n: int, *, idempotency_key: str, deadline: float) -> dict[str, Any]:
        probe.saw(run, idempotency_key, "gated", deadline)
        clock.advance(4)
        probe.land(idempotency_key)
        return {"id": idempotency_key}

    gated = ef.tool(
        "lp_send_gated", effect="external_write", approval=True, timeout=60.0, register=False
    )(send_gated)
    app.registry.add_tool(gated)

    @ef.workflow("lp_gated_flow", register=False)
    def gated_flow(ctx: ef.Context, run: str) -> int:
        for n in range(6):
            ctx.call(f"s{n}", gated if n == 2 else app.tools["plain"], run=run, n=n)
        return 6

    app.registry.add_workflow(gated_flow)
    probe.on_call = lambda run, n: clock.advance(4)
    with _fake_runtime(ledger, app, clock) as rt:
        probe.rt = rt
        paused = rt.start(gated_flow, run_id="gated", run="gated")
        assert paused.status is ef.RunStatus.PAUSED, paused.error
        assert (paused.lease_owner, paused.lease_expires_at) == (None, None)
    clock.advance(500)
    with _fake_runtime(ledger, app, clock) as again:
        probe.rt = again
        done = again.approve("gated", "s2", approver="li", approval_id="ap-1")
        assert done.status is ef.RunStatus.SUCCEEDED, done.error
        _succeeded(again, ["gated"])
    probe.check(TTL)
    probe.once(6)


# -- a slow intent commit ----------------------------------------------------------------------


class _Setup(Exception):
    """The scenario did not unfold as planned (not the invariant under test)."""


def test_an_intent_that_waits_for_the_ledger_s_lock_still_starts_on_two_thirds(
    ledger: str, probe_of: Callable[..., Probe], clock: worlds.FakeClock
) -> None:
    """s2's outcome (T0 + 12) renews to T0 + 42; s4's call takes 5.5 s, so s5's intent fences at
    T0 + 21.5 with 20.5 s left: no renewal. Another connection holds the ledger's lock (the SQLite
    file's; the run's row on PostgreSQL) while 1 s passes: the intent commits at T0 + 22.5 with
    19.5 s left, less than 2/3 of a TTL, and the heartbeat could not have helped (it needs the
    same lock). The writer renews it then (``LedgerWriter._renew_if_short``), so s5's call starts
    on two thirds of a TTL or more. (Deciding only before the wait, it started on 19.5 s.)"""
    pg = ledger.startswith("postgres")
    probe = probe_of(ledger, clock)
    app = _app(probe, timed_every=1000)
    release = threading.Event()
    held = threading.Event()

    def hold() -> None:
        if pg:
            with psycopg.connect(ledger) as conn:
                conn.execute("SELECT 1 FROM runs WHERE run_id = 'slow' FOR UPDATE")
                held.set()
                release.wait(10)
                time.sleep(0.3)  # the intent's fence has read the clock and waits for the row
                clock.advance(1)
                conn.rollback()
        else:
            conn = sqlite3.connect(ledger.removeprefix("sqlite:///"), isolation_level=None)
            try:
                conn.execute("BEGIN EXCLUSIVE")
                held.set()
                release.wait(10)
                time.sleep(0.3)
                clock.advance(1)
                conn.execute("ROLLBACK")
            finally:
                conn.close()

    @ef.workflow("lp_slow_flow", register=False)
    def slow_flow(ctx: ef.Context) -> int:
        for n in range(7):
            if n == 5:  # workflow code between two steps: the next write is s5's intent
                threading.Thread(target=hold, daemon=True).start()
                if not held.wait(10):
                    raise _Setup("the lock was not taken")
                release.set()
            ctx.call(f"s{n}", app.tools["plain"], run="slow", n=n)
        return 7

    app.registry.add_workflow(slow_flow)
    probe.on_call = lambda run, n: clock.advance(5.5 if n == 4 else 4)
    t0 = clock.now
    with _fake_runtime(ledger, app, clock) as rt:
        probe.rt = rt
        run = rt.start(slow_flow, run_id="slow")
        if run.status is not ef.RunStatus.SUCCEEDED or rt.verify_audit() != []:
            raise _Setup(f"the run did not succeed: {run.status} {run.error}")
    if sorted(probe.sent.values()) != [1] * 7:
        raise _Setup(f"effects: {probe.sent}")
    s5 = probe.seen[5]
    if s5.at - t0 != 22.5:
        raise _Setup(f"s5's call is not where planned: {s5} (T0 = {t0})")
    probe.check(TTL)  # (2): 19 s left at the call


class _LateClock:
    """A fake clock whose read by a thread named ``late-beat`` then waits for ``gate``: a
    heartbeat descheduled between reading the time and writing the renewal."""

    def __init__(self, fake: worlds.FakeClock) -> None:
        self.fake = fake
        self.read = threading.Event()
        self.gate = threading.Event()

    def __call__(self) -> float:
        now = self.fake.now
        if threading.current_thread().name == "late-beat":
            self.read.set()
            self.gate.wait(10)
        return now


@pytest.mark.parametrize("how", ["ended", "released"])
def test_a_heartbeat_that_lands_after_the_run_let_its_lease_go_leaves_it_alone(
    ledger: str, probe_of: Callable[..., Probe], clock: worlds.FakeClock, how: str
) -> None:
    """The heartbeat snapshots the runs held (``Leases.held``) and reads the clock during s1's
    call; before its UPDATE lands, the run ends (or, the runtime draining, is released at its next
    step boundary: lease_owner and lease_expires_at NULL, for another worker to take at once).
    The late UPDATE must not give the run an expiry back: a released run with one is not
    claimable (``claim_runnable``: ``lease_expires_at IS NULL OR < now``) for a whole TTL."""
    probe = probe_of(ledger, clock)
    app = _app(probe, timed_every=1000)
    late = _LateClock(clock)
    beats: list[Any] = []
    with ef.Runtime(ledger, registry=app.registry, clock=late, lease_ttl=TTL) as rt:
        probe.rt = rt

        def on_call(run: str, n: int) -> None:
            clock.advance(4)
            if n == 1:
                beat = threading.Thread(
                    target=lambda: beats.append(rt.leases.beat()), name="late-beat"
                )
                beat.start()
                if not late.read.wait(10):
                    raise _Setup("the beat did not read the clock")
                if how == "released":
                    rt.draining = True

        probe.on_call = on_call
        run = rt.start(app.flow, run_id="late", run="late", steps=3)
        expected = ef.RunStatus.RUNNING if how == "released" else ef.RunStatus.SUCCEEDED
        if run.status is not expected or run.lease_owner is not None:
            raise _Setup(f"the run is {run.status}, held by {run.lease_owner}")
        late.gate.set()
        for t in threading.enumerate():
            if t.name == "late-beat":
                t.join(10)
        if beats != [[]]:
            raise _Setup(f"the beat answered {beats}")
        rt.draining = False
    after = probe._read("late")
    assert (after.lease_owner, after.lease_expires_at) == (None, None), after
    if how == "released":
        with ef.Runtime(ledger, registry=app.registry, clock=clock, lease_ttl=TTL) as other:
            assert [r.run_id for r in other.recover()] == ["late"]


def test_a_heartbeat_that_read_the_clock_before_a_renewal_does_not_move_the_lease_back(
    ledger: str, probe_of: Callable[..., Probe], clock: worlds.FakeClock
) -> None:
    """The heartbeat reads the clock (T0 + 4) during s1's call and is descheduled; s2's intent
    (a deadline: it renews) fences at T0 + 8 and gives s2 the deadline T0 + 38. During s2's call
    the beat lands: the ledger's lease goes back to T0 + 34, under the deadline of the call in
    flight. (Seen on real clocks too, by milliseconds, before the heartbeat and the writes moved
    the lease forward only: the real-clock tests allow no ``RACE`` now.)"""
    probe = probe_of(ledger, clock)
    app = _app(probe)  # s2 takes a deadline
    late = _LateClock(clock)
    beats: list[Any] = []
    with ef.Runtime(ledger, registry=app.registry, clock=late, lease_ttl=TTL) as rt:
        probe.rt = rt
        beat = threading.Thread(target=lambda: beats.append(rt.leases.beat()), name="late-beat")

        def on_call(run: str, n: int) -> None:
            if n == 1:
                beat.start()
                if not late.read.wait(10):
                    raise _Setup("the beat did not read the clock")
            if n == 2:
                late.gate.set()
                beat.join(10)
                probe.saw(run, "after-the-beat", "send_by", probe.seen[-1].deadline)
            clock.advance(4)

        probe.on_call = on_call
        t0 = clock.now
        run = rt.start(app.flow, run_id="late", run="late", steps=4)
        if run.status is not ef.RunStatus.SUCCEEDED or beats != [[]]:
            raise _Setup(f"the run is {run.status} ({run.error}), the beat answered {beats}")
    after = next(s for s in probe.seen if s.key == "after-the-beat")
    if (after.deadline or 0) - t0 != 8 + TTL:
        raise _Setup(f"s2's deadline is not where planned: {after}")
    probe.check(TTL)


# -- a real child process killed with SIGKILL mid-call ------------------------------------------

_CHILD_APP = textwrap.dedent(
    """
    import json, time
    import effectflow as ef
    from effectflow.contracts import registry as registry_mod
    from effectflow.ledger.store import open_store

    def make(folder, url):
        sent = folder + "/sent.txt"
        calls = folder + "/calls.jsonl"
        holder = {"rt": None, "reader": None}

        def landed():
            try:
                with open(sent) as fh:
                    return [line.split("\\t")[0] for line in fh.read().splitlines()]
            except FileNotFoundError:
                return []

        def saw(run, key, deadline):
            rt = holder["rt"]
            belief = None
            if rt is not None:
                for state in rt.leases.held():
                    if state.run.run_id == run:
                        belief = state.lease_valid_until
            if holder["reader"] is None:
                holder["reader"] = open_store(url)
            record = holder["reader"].get_run(run)
            with open(calls, "a") as fh:
                fh.write(json.dumps({
                    "key": key, "at": time.time(), "belief": belief,
                    "ledger": record.lease_expires_at, "owner": record.lease_owner,
                    "deadline": deadline, "pid": __import__("os").getpid(),
                }) + "\\n")

        def land(key, n):
            with open(sent, "a") as fh:
                fh.write(f"{key}\\t{n}\\n")
                fh.flush()

        def find(*, idempotency_key):
            if idempotency_key in landed():
                return ef.Lookup.confirmed(external_effect_id=idempotency_key)
            return ef.Lookup.not_committed()

        find_tool = ef.tool("lpk_find", effect="read", register=False)(find)

        def send_by(run, n, hang, *, idempotency_key, deadline):
            saw(run, idempotency_key, deadline)
            land(idempotency_key, n)
            if hang:
                time.sleep(600)  # killed here, its effect landed
            time.sleep(0.05)
            return {"id": idempotency_key}

        timed = ef.tool(
            "lpk_send_by", effect="external_write", confirm=find_tool, timeout=60.0,
            register=False,
        )(send_by)

        @ef.workflow("lpk_flow", register=False)
        def flow(ctx, run, steps, hang_at):
            for n in range(steps):
                ctx.call(f"s{n}", timed, run=run, n=n, hang=(n == hang_at))
            return steps

        registry = registry_mod.Registry()
        registry.add_tool(find_tool)
        registry.add_tool(timed)
        registry.add_workflow(flow)
        return registry, flow, holder, landed
    """
)

_CHILD = textwrap.dedent(
    """
    import sys
    from effectflow.runtime import leases
    leases.host = lambda: "another-host"  # only the lease's expiry tells it is gone
    import effectflow as ef
    sys.path.insert(0, sys.argv[1])
    import lpk_app

    folder, url, ttl = sys.argv[1], sys.argv[2], float(sys.argv[3])
    registry, flow, holder, _ = lpk_app.make(folder, url)
    with ef.Runtime(url, registry=registry, lease_ttl=ttl) as rt:
        holder["rt"] = rt
        rt.start(flow, run_id="killed", run="killed", steps=8, hang_at=int(sys.argv[4]))
    """
)


def _load_app(folder: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"lpk_app_{os.getpid()}", folder / "lpk_app.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_child_killed_mid_call_left_a_lease_that_covers_its_deadline(
    ledger: str, tmp_path: Path
) -> None:
    """A real child process runs a workflow of calls given deadlines, heartbeat and all, and is
    killed with SIGKILL inside s5's call, after its effect landed. Its calls all started on 2/3
    of a TTL, none believed more than the ledger held, and the ledger's lease at the kill covers
    the deadline the killed call was given: nobody may take the run before that call can no
    longer land. A runtime here cannot take the run before the lease expires, takes it after,
    settles s5 by lookup (it landed) and finishes the run: every effect once."""
    ttl = 2.0
    (tmp_path / "lpk_app.py").write_text(_CHILD_APP)
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    child = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), ledger, str(ttl), "5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    calls = tmp_path / "calls.jsonl"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if calls.exists() and len(calls.read_text().splitlines()) >= 6:
                break
            assert child.poll() is None, child.communicate()
            time.sleep(0.01)
        else:
            pytest.fail("the child never reached s5's call")
        sent = tmp_path / "sent.txt"
        while len(sent.read_text().splitlines()) < 6:
            time.sleep(0.005)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    killed_at = time.time()
    seen = [json.loads(line) for line in calls.read_text().splitlines()]
    assert len(seen) == 6
    for s in seen:
        assert s["belief"] is not None, s
        assert s["ledger"] >= s["belief"] - RACE, s
        assert s["ledger"] - s["at"] >= ttl * TWO_THIRDS - SLACK, s
        assert s["deadline"] <= s["ledger"] + RACE, s
    app = _load_app(tmp_path)
    registry, _flow, holder, landed = app.make(str(tmp_path), ledger)
    with ef.Runtime(ledger, registry=registry, lease_ttl=ttl) as rt:
        holder["rt"] = rt
        at_kill = rt.run("killed")
        assert at_kill.lease_owner is not None
        assert at_kill.lease_owner.startswith("another-host:")
        assert at_kill.lease_expires_at is not None
        assert at_kill.lease_expires_at >= seen[-1]["deadline"]  # (3), as the kill left it
        if at_kill.lease_expires_at - time.time() > 0.3:
            assert rt.recover() == []  # not before the lease expires
            assert rt.run("killed").lease_owner == at_kill.lease_owner
        time.sleep(max(0.0, at_kill.lease_expires_at - time.time()) + 0.05)
        [recovered] = rt.recover()
        assert recovered.status is ef.RunStatus.SUCCEEDED, recovered.error
        assert rt.verify_audit() == []
    keys = landed()
    assert len(keys) == 8
    assert len(set(keys)) == 8
    assert time.time() - killed_at < 10
    with contextlib.suppress(Exception):
        child.stdout.close()  # type: ignore[union-attr]
        child.stderr.close()  # type: ignore[union-attr]
