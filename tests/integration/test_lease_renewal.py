"""A run's writes renew its lease only once a third of the TTL has passed since the last renewal
(``leases.RENEW_AFTER``): a write in between leaves the lease where it is, so the run's row is
rewritten without its lease index (BENCHMARKS.md, issue 18, "Session 11").

What must not change, checked on both backends: a call never starts on less than two thirds of a
lease; a call given a deadline still gets a whole lease (the lease bounds the deadline); and a
process that keeps writing keeps its run even when its heartbeat is stalled — a real child process,
its owner looking like another host's (so only the lease's expiry tells), watched from this one by
what a worker would take over.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import effectflow as ef
import ledgers
import worlds
from effectflow.contracts import registry as registry_mod
from effectflow.ledger.store import open_store
from effectflow.runtime import leases

TTL = 30.0


@pytest.fixture(params=ledgers.BACKENDS)
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a fresh ledger on each backend (``ledgers.fresh``)."""
    with ledgers.fresh(request.param, tmp_path, "ef_lease") as url:
        yield url


def _leases_seen(url: str, clock: worlds.FakeClock, *, deadline_at: int | None = None) -> Any:
    """Run a workflow of 8 write steps whose calls each take 4 s of ``clock``; returns each call's
    (time, the run's lease expiry as a connection of its own reads it) and the deadlines given."""
    reader = open_store(url)
    seen: list[tuple[float, float | None]] = []
    deadlines: list[float] = []

    def send(n: int, *, idempotency_key: str) -> dict[str, Any]:
        run = reader.get_run("r1")
        assert run is not None
        seen.append((clock.now, run.lease_expires_at))
        clock.advance(4)
        return {"id": idempotency_key}

    def send_by(n: int, *, idempotency_key: str, deadline: float) -> dict[str, Any]:
        deadlines.append(deadline)
        return send(n, idempotency_key=idempotency_key)

    plain = ef.tool("lr_send", effect="external_write", register=False)(send)
    timed = ef.tool("lr_send_by", effect="external_write", timeout=60.0, register=False)(send_by)

    @ef.workflow("lr_flow", register=False)
    def flow(ctx: ef.Context) -> int:
        for n in range(8):
            ctx.call(f"s{n}", timed if n == deadline_at else plain, n=n)
        return 8

    registry = registry_mod.Registry()
    for made in (plain, timed):
        registry.add_tool(made)
    registry.add_workflow(flow)
    try:
        with ef.Runtime(url, registry=registry, clock=clock, lease_ttl=TTL) as rt:
            assert rt.start(flow, run_id="r1").status is ef.RunStatus.SUCCEEDED
            ended = rt.run("r1")
            assert (ended.lease_owner, ended.lease_expires_at) == (None, None)
            assert rt.store.verify_audit() == []
    finally:
        reader.close()
    return seen, deadlines


def test_a_run_s_writes_renew_its_lease_once_a_third_of_it_has_passed(
    ledger: str, clock: worlds.FakeClock
) -> None:
    """Each step's intent and outcome are writes, 4 s apart. The start leases the run until
    T0 + 30; the writes leave it there until one finds less than 20 s left (the outcome at
    T0 + 12), which renews it to T0 + 42, and so on: 2 renewals in 17 writes, not 17. (The
    heartbeat beats every 10 s of real time: it never beats in this test.)"""
    t0 = clock.now
    seen, _ = _leases_seen(ledger, clock)
    assert [(at - t0, (until or 0) - t0) for at, until in seen] == [
        (0, 30),
        (4, 30),
        (8, 30),
        (12, 42),  # the outcome of s2 at T0 + 12 found 18 s left
        (16, 42),
        (20, 42),
        (24, 54),
        (28, 54),
    ]
    # A call never starts on less than two thirds of a lease.
    assert all((until or 0) - at >= TTL * (1 - leases.RENEW_AFTER) for at, until in seen)


def test_a_call_given_a_deadline_gets_a_whole_lease(ledger: str, clock: worlds.FakeClock) -> None:
    """The third call (at T0 + 8, 22 s of the start's lease left) takes a deadline: its intent
    renews the lease whatever is left of it, so the deadline is the intent's time plus the TTL
    (within the tool's 60 s timeout), as when every write renewed — not the T0 + 30 an
    unrenewed lease would allow."""
    t0 = clock.now
    seen, deadlines = _leases_seen(ledger, clock, deadline_at=2)
    assert [d - t0 for d in deadlines] == [8 + TTL]
    assert (seen[2][0] - t0, (seen[2][1] or 0) - t0) == (8, 8 + TTL)


_CHILD = textwrap.dedent(
    """
    import json, sys, time
    from effectflow.runtime import leases
    # This process looks like another host's, so that only its lease's expiry tells another
    # worker it is gone; and its heartbeat is stalled: only the run's own writes renew the lease.
    leases.host = lambda: "another-host"
    leases.Leases._beat = lambda self: None
    import effectflow as ef

    url, sent = sys.argv[1], sys.argv[2]
    ttl, steps, pause = float(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])

    @ef.tool("lr_child_send", effect="external_write")
    def send(n: int, *, idempotency_key: str) -> dict:
        with open(sent, "a") as fh:
            fh.write(f"{idempotency_key}\\t{n}\\n")
        time.sleep(pause)
        return {"id": idempotency_key}

    @ef.workflow("lr_child_flow")
    def flow(ctx: ef.Context) -> int:
        for n in range(steps):
            ctx.call(f"s{n}", send, n=n)
        return steps

    with ef.Runtime(url, lease_ttl=ttl) as rt:
        run = rt.start(flow, run_id="held")
        print(json.dumps({"status": run.status.value, "owner": rt.owner}))
    """
)


def test_a_process_that_keeps_writing_keeps_its_run_with_its_heartbeat_stalled(
    ledger: str, tmp_path: Path
) -> None:
    """A child process writes a step every ~0.08 s for well over two TTLs of 2 s, its heartbeat
    stalled. Its writes renew the lease once 2/3 s have passed since the last renewal, so the run
    is never offered to another worker (``runs_to_recover``, polled every 20 ms from here), its
    lease is never seen expired, every effect happens once, and the lease was renewed far fewer
    times than the run wrote."""
    ttl, steps, pause = 2.0, 60, 0.08
    sent = tmp_path / "sent.txt"
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    watcher = open_store(ledger)
    offered: list[float] = []
    expired: list[float] = []
    expiries: set[float] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            now = time.time()
            if any(r.run_id == "held" for r in watcher.runs_to_recover(now=now, limit=100)):
                offered.append(now)
            run = watcher.get_run("held")
            if run is not None and run.lease_expires_at is not None:
                expiries.add(run.lease_expires_at)
                if run.lease_expires_at <= now:
                    expired.append(now)
            done.wait(0.02)

    thread = threading.Thread(target=watch)
    thread.start()
    started = time.monotonic()
    try:
        child = subprocess.run(
            [sys.executable, str(script), ledger, str(sent), str(ttl), str(steps), str(pause)],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        done.set()
        thread.join()
        watcher.close()
    took = time.monotonic() - started
    assert child.returncode == 0, child.stderr
    answer = json.loads(child.stdout.strip().splitlines()[-1])
    assert answer["status"] == "succeeded"
    assert answer["owner"].startswith("another-host:")
    assert took > 2 * ttl  # long enough that a lease nobody renewed would have expired twice
    assert offered == []
    assert expired == []
    lines = sent.read_text().splitlines()
    assert sorted(int(line.split("\t")[1]) for line in lines) == list(range(steps))
    assert len({line.split("\t")[0] for line in lines}) == steps
    # 120 writes; renewals about every 2/3 s of them (seen by a 20 ms poll: at most all of them).
    assert 2 <= len(expiries) < steps
