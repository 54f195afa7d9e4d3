"""Group commit for runs executed on threads (``Runtime.start`` from many threads at once): their
commits share transactions, and on SQLite the threads take turns (``group_commit``, "Turns").

What must not change, checked with real threads against a real ledger on both backends: each
intent is committed (seen from a connection of its own) before its call, a refused batch (a stale
lease token) in a shared transaction writes nothing and the other batches of it commit, every
effect happens once, the audit chain verifies; and a thread that leaves the step machine for a
long while between two commits holds the others up for no longer than the turns' ``stall``.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import effectflow as ef
import ledgers
from effectflow.contracts import registry as registry_mod
from effectflow.ledger.records import StepStatus
from effectflow.ledger.store import Applied, Batch, LedgerStore, open_store

RUNS = 16
THREADS = 8
STEPS = 3


@pytest.fixture(params=ledgers.BACKENDS)
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a fresh ledger on each backend (``ledgers.fresh``)."""
    with ledgers.fresh(request.param, tmp_path, "ef_gct") as url:
        yield url


class World:
    """A ledger, and the outside world: one line per write in a file."""

    def __init__(self, folder: Path, url: str) -> None:
        self.url = url
        self.sent = folder / "sent.txt"
        self.sent.touch()
        self._lock = threading.Lock()
        #: Per call: whether its intent was committed (seen from another connection) at the call.
        self.intent_was_durable: list[bool] = []
        #: Run ids whose lease a test takes over inside their first call.
        self.steal: set[str] = set()
        #: When set, every first call waits here (and ``passed`` is set once all have come).
        self.together: threading.Barrier | None = None
        self.passed = threading.Event()
        #: Runs whose first call, past ``together``, waits for ``late`` to be set.
        self.late_runs: set[str] = set()
        self.late = threading.Event()
        #: When set, this run's workflow waits for ``hold`` between its first and second step.
        self.holder: str | None = None
        self.hold = threading.Event()
        self.holding = threading.Event()
        self._reader: LedgerStore | None = None

    def committed_status(self, run: str, step_id: str) -> str | None:
        """The step's status as a store of its own reads it: only what is committed is visible
        there."""
        with self._lock:
            if self._reader is None:
                self._reader = open_store(self.url)
            found = [s for s in self._reader.steps(run) if s.step_id == step_id]
        return found[0].status.value if found else None

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()


@pytest.fixture
def world(tmp_path: Path, ledger: str) -> Iterator[World]:
    made = World(tmp_path, ledger)
    yield made
    made.close()


def _app(world: World) -> tuple[registry_mod.Registry, ef.Workflow[..., Any]]:
    def find(*, idempotency_key: str) -> ef.Lookup:
        lines = world.sent.read_text().splitlines()
        if any(line.split("\t")[0] == idempotency_key for line in lines):
            return ef.Lookup.confirmed(external_effect_id=idempotency_key)
        return ef.Lookup.not_committed()

    find_tool = ef.tool("gct_find", effect="read", register=False)(find)

    def send(run: str, n: int, *, idempotency_key: str) -> dict[str, Any]:
        durable = world.committed_status(run, f"send_{n}") == StepStatus.INTENT_RECORDED.value
        with world._lock:
            world.intent_was_durable.append(durable)
        if run in world.steal and n == 0:
            # Another worker takes the run over while this call is on its way.
            other = open_store(world.url)
            try:
                held = other.get_run(run)
                assert held is not None
                taken = other.claim(
                    run, owner="thief", expected_token=held.lease_token, ttl=60, now=time.time()
                )
                assert taken is not None
            finally:
                other.close()
        if world.together is not None and n == 0:
            world.together.wait(30)
            world.passed.set()
            if run in world.late_runs:
                assert world.late.wait(30)
        with world._lock, world.sent.open("a") as fh:
            fh.write(f"{idempotency_key}\t{run}\t{n}\n")
        return {"id": idempotency_key}

    send_tool = ef.tool(
        "gct_send",
        effect="external_write",
        confirm=find_tool,
        settles_within=0,  # a local file append lands inside the call or never
        register=False,
    )(send)

    @ef.workflow("gct_flow", register=False)
    def flow(ctx: ef.Context, run: str) -> int:
        for n in range(STEPS):
            ctx.call(f"send_{n}", send_tool, run=run, n=n)
            if n == 0 and run == world.holder:
                # The workflow's own code, between two steps, away for a long while.
                world.holding.set()
                assert world.hold.wait(30), "the other runs never finished"
        return STEPS

    registry = registry_mod.Registry()
    registry.add_tool(find_tool)
    registry.add_tool(send_tool)
    registry.add_workflow(flow)
    return registry, flow


def _start_all(
    rt: ef.Runtime, flow: ef.Workflow[..., Any], ids: Sequence[str]
) -> dict[str, ef.RunRecord | BaseException]:
    def one(run_id: str) -> ef.RunRecord | BaseException:
        try:
            return rt.start(flow, run_id=run_id, run=run_id)
        except Exception as exc:
            return exc

    with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
        return dict(zip(ids, pool.map(one, ids), strict=True))


class GroupSpy:
    """Records each group transaction's batches and what became of each; and holds the first
    transaction made once every first call has come (``World.passed``) until the late runs'
    outcomes wait in the committer's queue, so that they share the next transaction."""

    def __init__(self, rt: ef.Runtime, world: World) -> None:
        self._store = rt.store
        self._apply, self._apply_many = rt.store.apply, rt.store.apply_many
        assert rt.committer is not None
        self._committer = rt.committer
        self._world = world
        self._held = False
        self.groups: list[list[tuple[Batch, Applied]]] = []
        rt.store.apply = self.apply  # type: ignore[method-assign]
        rt.store.apply_many = self.apply_many  # type: ignore[method-assign]

    def apply(self, batch: Batch, *, lease_ttl: float, now: float) -> dict[str, Any] | None:
        self._hold()
        return self._apply(batch, lease_ttl=lease_ttl, now=now)

    def apply_many(
        self, batches: Sequence[Batch], *, lease_ttl: float, now: float
    ) -> list[Applied]:
        self._hold()
        results = self._apply_many(batches, lease_ttl=lease_ttl, now=now)
        self.groups.append(list(zip(batches, results, strict=True)))
        return results

    def _hold(self) -> None:
        world = self._world
        if self._held or not world.passed.is_set():
            return
        self._held = True
        world.late.set()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            queued = {w.batch.run_id for w in list(self._committer._queue)}
            if world.late_runs <= queued:
                return
            time.sleep(0.001)


def _runtime(world: World, registry: registry_mod.Registry) -> ef.Runtime:
    # PostgreSQL's default leaves the threads' group commit off; these tests are about it.
    return ef.Runtime(world.url, registry=registry, group_commit=True)


def test_threads_share_transactions_and_each_intent_is_durable_before_its_call(
    world: World,
) -> None:
    registry, flow = _app(world)
    ids = [f"run-{i}" for i in range(RUNS)]
    with _runtime(world, registry) as rt:
        results = _start_all(rt, flow, ids)
        assert {r.status if isinstance(r, ef.RunRecord) else repr(r) for r in results.values()} == {
            ef.RunStatus.SUCCEEDED
        }
        committer = rt.committer
        assert committer is not None
        # 3 x (intent, outcome) a run at least, made 8 runs at a time.
        assert committer.batches >= RUNS * 2 * STEPS
        assert committer.batches > committer.transactions, "no transaction was shared"
        assert rt.verify_audit() == []
        for run_id in ids:
            assert [s.status for s in rt.store.steps(run_id)] == [StepStatus.CONFIRMED] * STEPS
    assert world.intent_was_durable == [True] * (RUNS * STEPS)
    keys = [line.split("\t")[0] for line in world.sent.read_text().splitlines()]
    assert len(keys) == len(set(keys)) == RUNS * STEPS


def test_a_refused_batch_in_a_shared_transaction_writes_nothing_and_the_others_commit(
    world: World,
) -> None:
    """One run loses its lease during its first call, and its outcome and another run's reach the
    ledger while a transaction is being made (``GroupSpy``): its outcome is refused (LeaseLost)
    inside the next transaction, which it shares with the other run's outcome, which commits."""
    world.steal = {"run-3"}
    world.together = threading.Barrier(THREADS)
    world.late_runs = {"run-3", "run-4"}
    registry, flow = _app(world)
    ids = [f"run-{i}" for i in range(THREADS)]
    with _runtime(world, registry) as rt:
        assert rt.committer is not None
        # One group transaction at a time (PostgreSQL allows several), so that the late outcomes
        # wait in the queue for the transaction the spy holds instead of leading their own.
        rt.committer.max_parallel = 1
        spy = GroupSpy(rt, world)
        results = _start_all(rt, flow, ids)
        assert isinstance(results.pop("run-3"), ef.LeaseLost)
        assert {r.status for r in results.values() if isinstance(r, ef.RunRecord)} == {
            ef.RunStatus.SUCCEEDED
        }
        assert len(results) == THREADS - 1
        # The refused outcome shared its transaction with others that committed.
        shared = [
            group
            for group in spy.groups
            if any(b.run_id == "run-3" and isinstance(a.error, ef.LeaseLost) for b, a in group)
        ]
        assert shared, "the refused batch was never in a group transaction"
        assert any(b.run_id == "run-4" and a.error is None for b, a in shared[0])
        # It wrote nothing: the step is as its intent left it, for the thief.
        victim = rt.store.steps("run-3")
        assert [s.status for s in victim] == [StepStatus.INTENT_RECORDED]
        assert [e.kind for e in rt.store.audit("run-3")][-1] == "intent"
        for run_id in results:
            assert [s.status for s in rt.store.steps(run_id)] == [StepStatus.CONFIRMED] * STEPS
        assert rt.verify_audit() == []
    assert world.intent_was_durable == [True] * (STEPS * (THREADS - 1) + 1)


def test_a_thread_away_between_two_commits_holds_up_no_other(world: World) -> None:
    """One run's workflow waits between its steps until every other run has ended: the others,
    whose commits shared its transactions, go on without it (no turn waits for it for good)."""
    world.holder = "run-0"
    registry, flow = _app(world)
    ids = [f"run-{i}" for i in range(THREADS)]
    with _runtime(world, registry) as rt, concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
        held = pool.submit(rt.start, flow, run_id="run-0", run="run-0")
        assert world.holding.wait(30)
        others = [pool.submit(rt.start, flow, run_id=i, run=i) for i in ids[1:]]
        done = [f.result(30) for f in others]
        assert {r.status for r in done} == {ef.RunStatus.SUCCEEDED}
        world.hold.set()
        assert held.result(30).status is ef.RunStatus.SUCCEEDED
        assert rt.verify_audit() == []
    assert world.intent_was_durable == [True] * (THREADS * STEPS)


def test_a_lone_thread_commits_each_batch_alone(world: World) -> None:
    """One run at a time: every batch is its own transaction, and nothing waits for a turn."""
    registry, flow = _app(world)
    with _runtime(world, registry) as rt:
        for i in range(3):
            assert rt.start(flow, run_id=f"alone-{i}", run=f"alone-{i}").status is (
                ef.RunStatus.SUCCEEDED
            )
        committer = rt.committer
        assert committer is not None
        assert committer.batches == committer.transactions >= 3 * 2 * STEPS
    assert world.intent_was_durable == [True] * (3 * STEPS)


def test_the_turns_are_sqlites_only(world: World) -> None:
    """Measured on SQLite only: PostgreSQL's group commit, when asked for, is as it was, even
    with a pool small enough for one group transaction at a time."""
    registry, _ = _app(world)
    sqlite = world.url.startswith("sqlite")
    url = world.url if sqlite else f"{world.url}?pool_max=2"
    with ef.Runtime(url, registry=registry, group_commit=True) as rt:
        assert rt.committer is not None
        assert rt.committer.max_parallel == 1
        assert rt.committer.turns is sqlite
