"""Group commit for runs driven by asyncio (``start_async``): the commits of coroutines that reach
one in the same turn of the event loop share a transaction, with no thread involved.

What must not change: each intent is durable before its call (checked from the tool itself, through
a connection of its own), a refused batch sinks nothing else in its group, and every effect happens
once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import effectflow as ef
import ledgers
from effectflow.contracts import registry as registry_mod
from effectflow.ledger.records import StepStatus
from effectflow.ledger.store import LedgerStore, open_store

RUNS = 16
AT_A_TIME = 8
STEPS = 3


@pytest.fixture(params=ledgers.BACKENDS)
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """The URL of a fresh ledger on each backend (``ledgers.fresh``)."""
    with ledgers.fresh(request.param, tmp_path, "ef_agc") as url:
        yield url


class World:
    """A ledger, and the outside world: one line per write in a file."""

    def __init__(self, folder: Path, url: str) -> None:
        self.url = url
        self.sent = folder / "sent.txt"
        self.sent.touch()
        #: Per call: whether its intent was committed (seen from another connection) at the call.
        self.intent_was_durable: list[bool] = []
        #: Run ids whose lease a test takes over inside their first call.
        self.steal: set[str] = set()
        #: When set, a call signals ``entered`` and waits for ``gate``.
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self._reader: LedgerStore | None = None

    def committed_status(self, run: str, step_id: str) -> str | None:
        """The step's status as a store of its own reads it: only what is committed is visible
        there."""
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

    find_tool = ef.tool("agc_find", effect="read", register=False)(find)

    def send(run: str, n: int, *, idempotency_key: str) -> dict[str, Any]:
        world.intent_was_durable.append(
            world.committed_status(run, f"send_{n}") == StepStatus.INTENT_RECORDED.value
        )
        if run in world.steal and n == 0:
            # Another worker takes the run over while this call is on its way.
            other = ef.Runtime(world.url)
            try:
                held = other.store.get_run(run)
                assert held is not None
                taken = other.store.claim(
                    run, owner="thief", expected_token=held.lease_token, ttl=60, now=time.time()
                )
                assert taken is not None
            finally:
                other.close()
        if world.gate is not None:
            world.entered.set()
            world.gate.wait(10)
        with world.sent.open("a") as fh:
            fh.write(f"{idempotency_key}\t{run}\t{n}\n")
        return {"id": idempotency_key}

    send_tool = ef.tool(
        "agc_send",
        effect="external_write",
        confirm=find_tool,
        settles_within=0,  # a local file append lands inside the call or never
        register=False,
    )(send)

    @ef.workflow("agc_flow", register=False)
    async def flow(ctx: ef.AsyncContext, run: str) -> int:
        for n in range(STEPS):
            await ctx.call(f"send_{n}", send_tool, run=run, n=n)
        return STEPS

    registry = registry_mod.Registry()
    registry.add_tool(find_tool)
    registry.add_tool(send_tool)
    registry.add_workflow(flow)
    return registry, flow


async def _start_all(
    rt: ef.Runtime, flow: ef.Workflow[..., Any], ids: list[str]
) -> list[ef.RunRecord | BaseException]:
    gate = asyncio.Semaphore(AT_A_TIME)

    async def one(run_id: str) -> ef.RunRecord:
        async with gate:
            return await rt.start_async(flow, run_id=run_id, run=run_id)

    return await asyncio.gather(*(one(i) for i in ids), return_exceptions=True)


def test_async_runs_started_together_share_transactions(world: World) -> None:
    registry, flow = _app(world)
    ids = [f"run-{i}" for i in range(RUNS)]
    with ef.Runtime(world.url, registry=registry) as rt:
        results = asyncio.run(_start_all(rt, flow, ids))
        assert all(isinstance(r, ef.RunRecord) for r in results), results
        assert {r.status for r in results if isinstance(r, ef.RunRecord)} == {
            ef.RunStatus.SUCCEEDED
        }
        committer = rt.async_committer
        assert committer is not None
        # Start, 3 x (intent, outcome), end: 8 commits a run, made 8 runs at a time.
        assert committer.batches == RUNS * (2 + 2 * STEPS)
        assert committer.batches >= 4 * committer.transactions, "transactions were not shared"
        assert rt.verify_audit() == []
        for run_id in ids:
            steps = rt.store.steps(run_id)
            assert [s.status for s in steps] == [StepStatus.CONFIRMED] * STEPS
    assert world.intent_was_durable == [True] * (RUNS * STEPS)
    keys = [line.split("\t")[0] for line in world.sent.read_text().splitlines()]
    assert len(keys) == len(set(keys)) == RUNS * STEPS


def test_a_refused_batch_does_not_sink_the_others_in_its_group(world: World) -> None:
    """One run loses its lease during its first call: its outcome is refused (LeaseLost) in a
    transaction it shares with the other runs' outcomes, which commit."""
    world.steal = {"run-3"}
    registry, flow = _app(world)
    ids = [f"run-{i}" for i in range(AT_A_TIME)]
    with ef.Runtime(world.url, registry=registry) as rt:
        results = dict(zip(ids, asyncio.run(_start_all(rt, flow, ids)), strict=True))
        assert isinstance(results.pop("run-3"), ef.LeaseLost)
        assert {r.status for r in results.values() if isinstance(r, ef.RunRecord)} == {
            ef.RunStatus.SUCCEEDED
        }
        assert len(results) == AT_A_TIME - 1
        # The refused outcome wrote nothing: the step is as its intent left it, for the thief.
        victim = rt.store.steps("run-3")
        assert [s.status for s in victim] == [StepStatus.INTENT_RECORDED]
        committer = rt.async_committer
        assert committer is not None
        assert committer.batches > committer.transactions
        assert rt.verify_audit() == []


def test_the_same_run_id_started_twice_at_once_is_one_run(world: World) -> None:
    """Two callers start the same run id in the same turn of the loop, beside other runs: one
    creates it, the other gets that run back (as ``start`` does); the group is unaffected."""
    registry, flow = _app(world)
    ids = ["twice", "twice", "other-1", "other-2"]
    with ef.Runtime(world.url, registry=registry) as rt:
        results = asyncio.run(_start_all(rt, flow, ids))
        assert all(isinstance(r, ef.RunRecord) for r in results), results
        assert {r.run_id for r in results if isinstance(r, ef.RunRecord)} == {
            "twice",
            "other-1",
            "other-2",
        }
        for run_id in ("twice", "other-1", "other-2"):
            assert rt.run(run_id).status is ef.RunStatus.SUCCEEDED
            assert len(rt.store.steps(run_id)) == STEPS
        assert rt.verify_audit() == []
    keys = [line.split("\t")[0] for line in world.sent.read_text().splitlines()]
    assert len(keys) == len(set(keys)) == 3 * STEPS


def test_starting_a_run_this_process_is_executing_does_not_take_it_over(world: World) -> None:
    """``start`` of a run id another thread of this process is executing returns the run as it
    stands, instead of claiming its lease (which would stop the first caller with LeaseLost)."""
    registry, flow = _app(world)
    world.gate = threading.Event()
    with (
        ef.Runtime(world.url, registry=registry) as rt,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        first = pool.submit(rt.start, flow, run_id="busy", run="busy")
        assert world.entered.wait(10)
        second = rt.start(flow, run_id="busy", run="busy")
        assert second.status is ef.RunStatus.RUNNING
        world.gate.set()
        assert first.result(10).status is ef.RunStatus.SUCCEEDED
    assert len(world.sent.read_text().splitlines()) == STEPS


@pytest.mark.parametrize("group_commit", [True, False])
def test_a_lone_async_run_and_group_commit_off_commit_each_batch(
    world: World, group_commit: bool
) -> None:
    """One run at a time, or group commit off: every batch is its own transaction, as before."""
    registry, flow = _app(world)
    with ef.Runtime(world.url, registry=registry, group_commit=group_commit) as rt:
        for i in range(3):
            run = asyncio.run(rt.start_async(flow, run_id=f"alone-{i}", run=f"alone-{i}"))
            assert run.status is ef.RunStatus.SUCCEEDED
        committer = rt.async_committer
        if group_commit:
            assert committer is not None
            assert committer.batches == committer.transactions == 3 * (2 + 2 * STEPS)
        else:
            assert committer is None
    assert world.intent_was_durable == [True] * (3 * STEPS)
