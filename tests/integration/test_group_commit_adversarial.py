"""Group commit's turns under attack: threads whose batch is refused, whose ledger is locked by
another connection, that crash or are interrupted while they wait, that pause, or whose runtime is
closed under them; a second process writing the same file; asyncio runs beside thread runs.

What must hold, checked with real threads against a real ledger: every thread finishes within a
bound (a turn that nobody passes on shows as the stall, which these tests make long so that a leak
cannot hide in it); every other run's batches commit, exactly once (the provider's own file and the
ledger read through a store of its own agree); each intent is committed before its call.
"""

from __future__ import annotations

import asyncio
import json
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

import pytest

import effectflow as ef
import ledgers
from effectflow.contracts import registry as registry_mod
from effectflow.ledger.records import StepStatus
from effectflow.ledger.store import Batch, LedgerStore, open_store
from effectflow.testing import Fault, FaultAction, FaultPlan, FaultPoint, InjectedCrash

STEPS = 3
THREADS = 6
#: The turns' stall in these tests: long, so that a thread that keeps a turn it should have
#: passed on holds the others for seconds, past ``BOUND``, instead of for 10 ms.
LONG_STALL = 8.0
#: How long every thread of a test may take (seconds).
BOUND = 4.0


class World:
    """A ledger, and the outside world: one line per write in a file the tool appends to."""

    def __init__(self, folder: Path, url: str) -> None:
        self.url = url
        self.sent = folder / "sent.txt"
        self.sent.touch()
        self._lock = threading.Lock()
        #: Per call: whether its intent was committed (seen from another connection) at the call.
        self.intent_was_durable: list[bool] = []
        #: Called inside each call (run, step number) before the effect lands.
        self.on_call: Callable[[str, int], None] = lambda run, n: None
        self._reader: LedgerStore | None = None

    def committed_status(self, run: str, step_id: str) -> str | None:
        """The step's status as a store of its own reads it: only what is committed is there."""
        with self._lock:
            if self._reader is None:
                self._reader = open_store(self.url)
            found = [s for s in self._reader.steps(run) if s.step_id == step_id]
        return found[0].status.value if found else None

    def lines(self) -> list[tuple[str, str, int]]:
        """The effects that landed: (key, run, step number)."""
        out = []
        for line in self.sent.read_text().splitlines():
            key, run, n = line.split("\t")
            out.append((key, run, int(n)))
        return out

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    made = World(tmp_path, f"sqlite:///{tmp_path / 'ledger.db'}")
    yield made
    made.close()


def _app(
    world: World, *, approval_runs: frozenset[str] = frozenset()
) -> tuple[registry_mod.Registry, ef.Workflow[..., Any], ef.Workflow[..., Any]]:
    def find(*, idempotency_key: str) -> ef.Lookup:
        if any(key == idempotency_key for key, _, _ in world.lines()):
            return ef.Lookup.confirmed(external_effect_id=idempotency_key)
        return ef.Lookup.not_committed()

    find_tool = ef.tool("gca_find", effect="read", register=False)(find)

    def send(run: str, n: int, *, idempotency_key: str) -> dict[str, Any]:
        durable = world.committed_status(run, f"send_{n}") == StepStatus.INTENT_RECORDED.value
        with world._lock:
            world.intent_was_durable.append(durable)
        world.on_call(run, n)
        with world._lock, world.sent.open("a") as fh:
            fh.write(f"{idempotency_key}\t{run}\t{n}\n")
        return {"id": idempotency_key}

    contract = {
        "effect": "external_write",
        "confirm": find_tool,
        "settles_within": 0,  # a local file append lands inside the call or never
        "register": False,
    }
    send_tool = ef.tool("gca_send", **contract)(send)  # type: ignore[arg-type]
    approved_tool = ef.tool("gca_send_approved", approval=True, **contract)(send)  # type: ignore[arg-type]

    @ef.workflow("gca_flow", register=False)
    def flow(ctx: ef.Context, run: str) -> int:
        for n in range(STEPS):
            tool = approved_tool if n == 1 and run in approval_runs else send_tool
            ctx.call(f"send_{n}", tool, run=run, n=n)
        return STEPS

    @ef.workflow("gca_async_flow", register=False)
    async def async_flow(ctx: ef.AsyncContext, run: str) -> int:
        for n in range(STEPS):
            await ctx.call(f"send_{n}", send_tool, run=run, n=n)
        return STEPS

    registry = registry_mod.Registry()
    for made in (find_tool, send_tool, approved_tool):
        registry.add_tool(made)
    registry.add_workflow(flow)
    registry.add_workflow(async_flow)
    return registry, flow, async_flow


def _runtime(world: World, registry: registry_mod.Registry, **options: Any) -> ef.Runtime:
    """A runtime whose turns stall for ``LONG_STALL``: a turn kept by mistake is seen."""
    url = options.pop("url", world.url)
    rt = ef.Runtime(url, registry=registry, group_commit=True, **options)
    assert rt.committer is not None
    assert rt.committer.turns
    rt.committer.stall = LONG_STALL
    return rt


def _together(jobs: dict[str, Callable[[], Any]], bound: float = BOUND) -> dict[str, Any]:
    """Run each job on a thread of its own, all at once; their results (or what they raised).
    Fails if any is still running after ``bound`` seconds (the threads are daemons: a hung one
    does not hang the test run)."""
    results: dict[str, Any] = {}
    start = threading.Barrier(len(jobs))

    def one(name: str, job: Callable[[], Any]) -> None:
        start.wait(10)
        try:
            results[name] = job()
        except BaseException as exc:
            results[name] = exc

    threads = [
        threading.Thread(target=one, args=(n, j), daemon=True, name=n) for n, j in jobs.items()
    ]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, began + bound - time.monotonic()))
    stuck = sorted(t.name for t in threads if t.is_alive())
    assert not stuck, f"still running after {bound} s: {stuck}"
    return results


def _starts(rt: ef.Runtime, flow: ef.Workflow[..., Any], ids: list[str]) -> dict[str, Any]:
    return {i: (lambda i=i: rt.start(flow, run_id=i, run=i)) for i in ids}


def _status(result: Any) -> Any:
    return result.status if isinstance(result, ef.RunRecord) else type(result)


def _check(world: World, confirmed: dict[str, int]) -> None:
    """The provider's file and the ledger (a store of its own) agree: each effect landed once;
    each run in ``confirmed`` has that many confirmed steps first, and that many lines; every
    line's step is recorded (its intent was durable before its call)."""
    lines = world.lines()
    keys = [key for key, _, _ in lines]
    assert len(keys) == len(set(keys)), "an effect landed twice"
    assert all(world.intent_was_durable)  # (this process's calls; another's checks its own)
    reader = open_store(world.url)
    try:
        for run, count in confirmed.items():
            steps = reader.steps(run)[:count]
            assert [s.status for s in steps] == [StepStatus.CONFIRMED] * count, run
            assert sorted(n for _, r, n in lines if r == run) == list(range(count)), run
        for _, run, n in lines:
            step = [s for s in reader.steps(run) if s.step_id == f"send_{n}"]
            assert step, (run, n)
            assert step[0].status in (StepStatus.CONFIRMED, StepStatus.INTENT_RECORDED), (run, n)
    finally:
        reader.close()


def test_a_refused_batch_passes_its_turn_on(world: World) -> None:
    """Two runs lose their lease during their first call: their outcomes are refused inside
    shared transactions and their threads leave with ``LeaseLost``; the others do not wait for
    them to come back."""
    victims = {"run-1", "run-4"}

    def steal(run: str, n: int) -> None:
        if run in victims and n == 0:
            other = open_store(world.url)
            try:
                held = other.get_run(run)
                assert held is not None
                assert other.claim(
                    run, owner="thief", expected_token=held.lease_token, ttl=60, now=time.time()
                )
            finally:
                other.close()

    world.on_call = steal
    registry, flow, _ = _app(world)
    ids = [f"run-{i}" for i in range(THREADS)]
    with _runtime(world, registry) as rt:
        results = _together(_starts(rt, flow, ids))
        assert {i: _status(r) for i, r in results.items()} == {
            i: ef.LeaseLost if i in victims else ef.RunStatus.SUCCEEDED for i in ids
        }
        assert rt.verify_audit() == []
    _check(world, {i: STEPS for i in ids if i not in victims})
    reader = open_store(world.url)
    try:
        for victim in victims:
            assert [s.status for s in reader.steps(victim)] == [StepStatus.INTENT_RECORDED]
    finally:
        reader.close()


def test_a_crash_just_after_a_commit_holds_nobody_up(world: World) -> None:
    """A run crashes (``InjectedCrash``) right after its second intent committed, while it holds
    the turn: the others finish without it, and its call never happened."""
    registry, flow, _ = _app(world)
    ids = [f"run-{i}" for i in range(THREADS)]
    with _runtime(world, registry) as rt:
        rt.faults = FaultPlan(
            [Fault(FaultPoint.AFTER_INTENT, "send_1", occurrence=2, action=FaultAction.RAISE)]
        )
        results = _together(_starts(rt, flow, ids))
        crashed = [i for i, r in results.items() if isinstance(r, InjectedCrash)]
        assert len(crashed) == 1
        assert {_status(r) for i, r in results.items() if i not in crashed} == {
            ef.RunStatus.SUCCEEDED
        }
    _check(world, {i: STEPS for i in ids if i not in crashed})
    reader = open_store(world.url)
    try:
        assert [s.status for s in reader.steps(crashed[0])] == [
            StepStatus.CONFIRMED,
            StepStatus.INTENT_RECORDED,
        ]
    finally:
        reader.close()
    assert not [n for _, r, n in world.lines() if r == crashed[0] and n == 1]


def test_a_ledger_locked_by_another_connection_holds_nobody_up(world: World) -> None:
    """While one run's call holds the file's write lock from a connection of its own, the others'
    group transactions fail ("database is locked"): their intents raise ``LedgerUnavailable``
    (their calls never start), their outcomes are retried until they commit. The threads pausing
    between two tries hold no turn."""
    locked = threading.Event()

    def lock_the_file(run: str, n: int) -> None:
        if run == "locker" and n == 0:
            raw = sqlite3.connect(world.url.removeprefix("sqlite:///"), isolation_level=None)
            try:
                raw.execute("BEGIN IMMEDIATE")
                locked.set()
                time.sleep(0.6)
                raw.execute("COMMIT")
            finally:
                raw.close()
        elif run != "locker" and n == 0:
            assert locked.wait(10)  # the outcomes of the first calls meet the lock
            time.sleep(0.05)

    world.on_call = lock_the_file
    registry, flow, _ = _app(world)
    ids = ["locker", *(f"run-{i}" for i in range(THREADS - 1))]
    url = f"{world.url}?busy_timeout=0.1"
    with _runtime(world, registry, url=url, ledger_retry=20.0) as rt:
        results = _together(_starts(rt, flow, ids))
        statuses = {i: _status(r) for i, r in results.items()}
        assert set(statuses.values()) <= {ef.RunStatus.SUCCEEDED, ef.LedgerUnavailable}, statuses
        assert statuses["locker"] is ef.RunStatus.SUCCEEDED
        assert rt.verify_audit() == []
    _check(world, {i: STEPS for i, s in statuses.items() if s is ef.RunStatus.SUCCEEDED})
    reader = open_store(world.url)
    try:
        for run, status in statuses.items():
            if status is ef.LedgerUnavailable:
                # An intent was refused: its call never started; every call before it is confirmed.
                steps = reader.steps(run)
                assert all(s.status is StepStatus.CONFIRMED for s in steps), run
                assert sorted(n for _, r, n in world.lines() if r == run) == list(range(len(steps)))
    finally:
        reader.close()


#: How many runs a thread of the interrupt test starts at most, waiting for its moment.
ATTEMPTS = 20


class _Interrupted(BaseException):
    """What the main thread's signal handler raises (as Ctrl-C raises ``KeyboardInterrupt``)."""


@pytest.fixture(params=ledgers.BACKENDS)
def any_world(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[World]:
    """A ``World`` on each backend; on PostgreSQL with a pool of 2, so that its group commit
    (asked for) has one group transaction at a time, as SQLite's, without the turns."""
    with ledgers.fresh(request.param, tmp_path, "ef_gca") as url:
        made = World(tmp_path, url)
        yield made
        made.close()


def test_a_writer_interrupted_while_it_waits_loses_no_lead(any_world: World) -> None:
    """The main thread's commit waits in the queue behind another thread's group transaction
    when a signal interrupts it (its handler raises): the lead that would have passed to it goes
    to the next writer instead, and nobody waits for the interrupted one for good."""
    world = any_world
    registry, flow, _ = _app(world)
    main = threading.get_ident()
    interrupted = threading.Event()
    sqlite = world.url.startswith("sqlite")
    url = world.url if sqlite else f"{world.url}?pool_max=2"
    with ef.Runtime(url, registry=registry, group_commit=True) as rt:
        committer = rt.committer
        assert committer is not None
        assert committer.max_parallel == 1
        assert committer.turns is sqlite
        write = committer._write

        def interrupt_the_main_thread(group: list[Any]) -> None:
            """A group transaction another thread leads: before it is written, once the main
            thread's next batch waits first in the queue behind it (the lead passes to it next),
            interrupt the main thread there."""
            # (A group with the main thread's batch in it: it waits for this one, not queued.)
            if (
                threading.get_ident() != main
                and not interrupted.is_set()
                and all(w.thread != main for w in group)
            ):
                deadline = time.monotonic() + 2
                while time.monotonic() < deadline:
                    queued = list(committer._queue)
                    if queued and queued[0].thread != main:
                        break  # the lead passes to another first: another time
                    if queued:
                        signal.pthread_kill(main, signal.SIGUSR1)
                        assert interrupted.wait(5)
                        break
                    time.sleep(0.001)
            write(group)

        committer._write = interrupt_the_main_thread  # type: ignore[method-assign]

        def handler(signum: int, frame: Any) -> None:
            raise _Interrupted

        previous = signal.signal(signal.SIGUSR1, handler)
        others: dict[str, Any] = {}

        def other(name: str) -> None:
            """Runs one after the other until the main thread was interrupted (and one more)."""
            for n in range(ATTEMPTS):
                run_id = f"{name}-{n}"
                others[run_id] = rt.start(flow, run_id=run_id, run=run_id)
                if interrupted.is_set():
                    return

        try:
            threads = [
                threading.Thread(target=other, args=(name,), daemon=True)
                for name in ("other-a", "other-b")
            ]
            for thread in threads:
                thread.start()
            mains = []
            for n in range(ATTEMPTS):  # until an interrupt finds it waiting as it should
                mains.append(f"main-{n}")
                try:
                    rt.start(flow, run_id=mains[-1], run=mains[-1])
                except _Interrupted:
                    interrupted.set()
                    break
            began = time.monotonic()
            for thread in threads:
                thread.join(max(0.0, began + BOUND - time.monotonic()))
            assert interrupted.is_set(), "the main thread never waited behind another's write"
            assert not [t for t in threads if t.is_alive()], "a writer waits for a lost lead"
        finally:
            signal.signal(signal.SIGUSR1, previous)
        assert {r.status for r in others.values()} == {ef.RunStatus.SUCCEEDED}
        # The committer still leads: a new run commits.
        late = _together(_starts(rt, flow, ["late"]))
        assert _status(late["late"]) is ef.RunStatus.SUCCEEDED
    _check(world, dict.fromkeys([*others, *mains[:-1], "late"], STEPS))


def test_runs_that_pause_or_are_cancelled_mid_turn_hold_nobody_up(world: World) -> None:
    """One run pauses for an approval at its second step, another is cancelled by an operator
    during its second call: their threads leave with the batches that pause or end their runs,
    and the others go on without waiting for them."""
    cancels: list[threading.Thread] = []

    def cancel_during_the_call(run: str, n: int) -> None:
        if run == "run-3" and n == 1:
            asked = threading.Thread(target=rt.cancel, args=("run-3",), kwargs={"reason": "test"})
            cancels.append(asked)
            asked.start()
            asked.join(2)

    world.on_call = cancel_during_the_call
    registry, flow, _ = _app(world, approval_runs=frozenset({"run-2"}))
    ids = [f"run-{i}" for i in range(THREADS)]
    with _runtime(world, registry) as rt:
        results = _together(_starts(rt, flow, ids))
        for asked in cancels:
            asked.join(BOUND)
            assert not asked.is_alive()
        statuses = {i: _status(r) for i, r in results.items()}
        assert statuses.pop("run-2") is ef.RunStatus.PAUSED
        assert statuses.pop("run-3") in (
            ef.RunStatus.CANCELLED_WITH_EFFECTS,
            ef.RunStatus.CANCELLING,
        ), results["run-3"]
        assert set(statuses.values()) == {ef.RunStatus.SUCCEEDED}
        assert rt.verify_audit() == []
    _check(world, dict.fromkeys(statuses, STEPS) | {"run-2": 1, "run-3": 2})
    reader = open_store(world.url)
    try:
        assert [s.status for s in reader.steps("run-2")][1:] == [StepStatus.AWAITING_APPROVAL]
        assert len(reader.steps("run-3")) == 2
    finally:
        reader.close()


def test_closing_the_runtime_under_threads_in_flight_hangs_nobody(world: World) -> None:
    """The runtime is closed while every run is in its second call: each thread's next write
    fails with the ledger's error (none hangs, none is told it succeeded), and what landed at
    the provider was recorded before its call."""
    registry, flow, _ = _app(world)
    ids = [f"run-{i}" for i in range(THREADS)]
    inside = threading.Barrier(THREADS + 1)
    closed = threading.Event()

    def wait_for_the_close(run: str, n: int) -> None:
        if n == 1:
            inside.wait(5)
            assert closed.wait(5)

    world.on_call = wait_for_the_close
    rt = _runtime(world, registry)

    def close() -> None:
        inside.wait(5)
        rt.close()
        closed.set()

    results = _together({**_starts(rt, flow, ids), "close": close})
    assert results.pop("close") is None
    for run, result in results.items():
        assert isinstance(result, ef.EffectflowError), (run, result)
    _check(world, {})
    assert sorted((r, n) for _, r, n in world.lines()) == sorted(
        (r, n) for r in ids for n in (0, 1)
    )


def test_a_second_process_writing_the_same_ledger(world: World, tmp_path: Path) -> None:
    """Another process runs the same workflow on the same file at the same time, with group
    commit and its turns: both serialize on the file's write lock; every run of both succeeds,
    every effect lands once, and the audit chains verify from a third connection."""
    script = tmp_path / "other_process.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys, threading
            sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]
            import test_group_commit_adversarial as t
            from pathlib import Path
            world = t.World(Path({str(tmp_path)!r}), {world.url!r})
            registry, flow, _ = t._app(world)
            import effectflow as ef
            with ef.Runtime({world.url!r}, registry=registry) as rt:
                results = t._together(t._starts(rt, flow, [f"far-{{i}}" for i in range(4)]), 20)
                assert all(_r.status is ef.RunStatus.SUCCEEDED for _r in results.values()), results
            assert all(world.intent_was_durable), world.intent_was_durable
            world.close()
            """
        )
    )
    registry, flow, _ = _app(world)
    ids = [f"near-{i}" for i in range(4)]
    with _runtime(world, registry) as rt:
        other = subprocess.Popen([sys.executable, str(script)], stderr=subprocess.PIPE, text=True)
        try:
            results = _together(_starts(rt, flow, ids), 20)
            _, err = other.communicate(timeout=20)
        finally:
            other.kill()
        assert other.returncode == 0, err
        assert {_status(r) for r in results.values()} == {ef.RunStatus.SUCCEEDED}
        assert rt.verify_audit() == []
    _check(world, dict.fromkeys([*ids, *(f"far-{i}" for i in range(4))], STEPS))
    with ef.Runtime(world.url, registry=registry) as third:
        assert third.verify_audit() == []


def test_asyncio_runs_beside_thread_runs_on_one_runtime(world: World) -> None:
    """Coroutines (``start_async``, async and sync workflows) on one event loop share the
    runtime with thread runs: the loop's group commit and the threads' write the same file at
    once, and the threads' turns do not wait for the loop's runs."""
    registry, flow, async_flow = _app(world)
    threads = [f"thread-{i}" for i in range(4)]
    coros = [f"async-{i}" for i in range(4)]
    synced = [f"async-sync-{i}" for i in range(2)]
    with _runtime(world, registry) as rt:

        async def loop_runs() -> dict[str, Any]:
            started = [rt.start_async(async_flow, run_id=i, run=i) for i in coros]
            started += [rt.start_async(flow, run_id=i, run=i) for i in synced]
            done = await asyncio.gather(*started, return_exceptions=True)
            return dict(zip([*coros, *synced], done, strict=True))

        jobs = {**_starts(rt, flow, threads), "loop": lambda: asyncio.run(loop_runs())}
        results = _together(jobs)
        from_loop = results.pop("loop")
        assert isinstance(from_loop, dict), from_loop
        results.update(from_loop)
        assert {i: _status(r) for i, r in results.items()} == dict.fromkeys(
            [*threads, *coros, *synced], ef.RunStatus.SUCCEEDED
        )
        assert rt.verify_audit() == []
    _check(world, dict.fromkeys([*threads, *coros, *synced], STEPS))


def test_an_interrupt_of_the_leader_mid_transaction_is_its_own(world: World) -> None:
    """The main thread leads a group transaction carrying other threads' batches when a signal
    interrupts it inside the transaction (its handler raises): the transaction rolls back; the
    interrupt is raised on the main thread only, and the others' writes fail as a transaction
    that did not commit does (``LedgerUnavailable``: an intent's run is left for recovery, an
    outcome is written again), never with the main thread's interrupt."""
    registry, flow, _ = _app(world)
    main = threading.get_ident()
    fired = threading.Event()
    with _runtime(world, registry) as rt:
        assert rt.committer is not None
        rt.committer.stall = 0.01  # this test is about the transaction, not the turns
        store = rt.store
        apply_many, seal = store.apply_many, store._seal_txn  # type: ignore[attr-defined]
        armed = threading.local()

        def spy_apply_many(batches: list[Batch], *, lease_ttl: float, now: float) -> Any:
            armed.on = threading.get_ident() == main and not fired.is_set()
            return apply_many(batches, lease_ttl=lease_ttl, now=now)

        def spy_seal(conn: Any, seals: list[list[Any]]) -> None:
            if getattr(armed, "on", False):
                armed.on = False
                fired.set()
                signal.pthread_kill(main, signal.SIGUSR1)  # raises at its next instruction
            seal(conn, seals)

        store.apply_many = spy_apply_many  # type: ignore[method-assign]
        store._seal_txn = spy_seal  # type: ignore[attr-defined]

        def handler(signum: int, frame: Any) -> None:
            raise _Interrupted

        previous = signal.signal(signal.SIGUSR1, handler)
        others: dict[str, Any] = {}

        def other(name: str) -> None:
            for n in range(ATTEMPTS):
                run_id = f"{name}-{n}"
                try:
                    others[run_id] = rt.start(flow, run_id=run_id, run=run_id)
                except BaseException as exc:
                    others[run_id] = exc
                if fired.is_set():
                    return

        mains: list[str] = []
        try:
            threads = [
                threading.Thread(target=other, args=(name,), daemon=True)
                for name in ("other-a", "other-b", "other-c")
            ]
            for thread in threads:
                thread.start()
            for n in range(ATTEMPTS):
                mains.append(f"main-{n}")
                try:
                    rt.start(flow, run_id=mains[-1], run=mains[-1])
                except _Interrupted:
                    break
            began = time.monotonic()
            for thread in threads:
                thread.join(max(0.0, began + BOUND - time.monotonic()))
            assert fired.is_set(), "the main thread never led a shared transaction"
            assert not [t for t in threads if t.is_alive()]
        finally:
            signal.signal(signal.SIGUSR1, previous)
        kinds = {_status(r) for r in others.values()}
        assert kinds <= {ef.RunStatus.SUCCEEDED, ef.LedgerUnavailable}, others
        assert rt.verify_audit() == []
    succeeded = [r for r, res in others.items() if _status(res) is ef.RunStatus.SUCCEEDED]
    _check(world, dict.fromkeys([*succeeded, *mains[:-1]], STEPS))


def test_a_ledger_file_that_cannot_grow_hangs_nobody_and_loses_nothing(
    world: World, tmp_path: Path
) -> None:
    """In a process whose files may not grow past a size (``RLIMIT_FSIZE``: each write past it
    fails, as on a full disk), runs on threads with group commit fill the ledger's WAL until its
    writes fail: every thread ends within the bound (a write that fails raises; an outcome is
    retried first); nothing landed at the provider whose intent was not committed; and the file,
    opened again without the limit, is whole and its audit chains verify."""
    script = tmp_path / "full_disk.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, os, resource, signal, sys
            sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]
            import test_group_commit_adversarial as t
            from pathlib import Path
            import effectflow as ef
            world = t.World(Path({str(tmp_path)!r}), {world.url!r})
            registry, flow, _ = t._app(world)
            with ef.Runtime({world.url!r}, registry=registry, ledger_retry=0.3) as rt:
                rt.start(flow, run_id="warm", run="warm")
                path = {world.url.removeprefix("sqlite:///")!r}
                sizes = [os.path.getsize(p) for p in (path, path + "-wal", world.sent)]
                signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past it fails (EFBIG)
                limit = max(sizes) + 300 * 1024  # a few transactions (each writes ~20 pages)
                resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
                ids = [f"full-{{i}}" for i in range(12)]
                jobs = {{i: (lambda i=i: rt.start(flow, run_id=i, run=i)) for i in ids}}
                results = t._together(jobs, 20)
            print(json.dumps({{i: t._status(r) if isinstance(r, ef.RunRecord) else type(r).__name__
                              for i, r in results.items()}}))
            assert all(world.intent_was_durable), world.intent_was_durable
            world.close()
            """
        )
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 0, done.stderr
    outcomes = json.loads(done.stdout.splitlines()[-1])
    assert "LedgerUnavailable" in outcomes.values(), outcomes  # the limit was met
    assert set(outcomes.values()) <= {"succeeded", "LedgerUnavailable"}, outcomes
    registry, _, _ = _app(world)
    succeeded = [i for i, o in outcomes.items() if o == "succeeded"]
    _check(world, dict.fromkeys([*succeeded, "warm"], STEPS))
    with ef.Runtime(world.url, registry=registry) as again:
        assert again.verify_audit() == []
