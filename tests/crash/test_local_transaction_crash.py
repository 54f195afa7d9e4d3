"""A ``local_transaction`` tool writes into the ledger's own database, in the transaction that holds its
step checkpoint: a crash between the tool's write and the checkpoint leaves neither, an exception
rolls both back, and the tool cannot commit on its own (docs/concepts.md#the-write-path and
docs/concepts.md#what-a-tool-tells-the-runtime).

The crash test kills a real worker process and then reads the ledger file with ``sqlite3`` itself,
not through the runtime: the file is the truth of what survived.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

import effectflow as ef
from effectflow.runtime.faults import FaultPoint

from . import app, app_stop
from .conftest import World, assert_clean, assert_killed

S = ef.StepStatus
APPS = ("app_stop",)
SEAT = "12A"


def _ledger_file(world: World) -> Path:
    return world.directory / app.LEDGER_FILE


def _query(world: World, sql: str, params: tuple[str, ...] = ()) -> list[tuple[object, ...]]:
    """Read the ledger file directly (a fresh connection: only committed data is visible)."""
    with closing(sqlite3.connect(_ledger_file(world))) as conn:
        return conn.execute(sql, params).fetchall()


def _seats(world: World, run_id: str) -> list[str]:
    return [
        str(seat)
        for (seat,) in _query(
            world, f"SELECT seat FROM {app_stop.SEATS_TABLE} WHERE run_id = ?", (run_id,)
        )
    ]


@pytest.fixture
def seats_world(world: World) -> World:
    """A world whose ledger file holds the ``crash_seats`` table the booking writes."""
    with world.ledger():
        pass  # creates the ledger's own schema
    with closing(sqlite3.connect(_ledger_file(world))) as conn:
        conn.execute(app_stop.SEATS_DDL)
        conn.commit()
    return world


@pytest.fixture
def rt(seats_world: World) -> Iterator[ef.Runtime]:
    """An in-process runtime on the seats world's ledger."""
    with ef.Runtime(seats_world.url) as runtime:
        yield runtime


def test_crash_in_local_transaction_leaves_neither_then_recovery_runs_it_once(
    seats_world: World,
) -> None:
    """SIGKILL after the tool's write, before the checkpoint commits: no row, no step, no effect;
    a fresh process then runs the step once: one row, step and effect confirmed."""
    world = seats_world
    run_id = "seat-crash"
    start = ((app_stop.SEAT_WORKFLOW, run_id, {"seat": SEAT}),)

    assert_killed(
        world.child(
            apps=APPS, start=start, kill=f"{FaultPoint.IN_LOCAL_TRANSACTION}:{app_stop.RESERVE}"
        )
    )
    # The file itself: neither the tool's row nor any record of its step survived. (The pure step
    # before it rode with the same checkpoint, as pure results do, so it is gone too and runs again.)
    assert _seats(world, run_id) == []
    assert _query(world, f"SELECT count(*) FROM {app_stop.SEATS_TABLE}") == [(0,)]
    for table in ("steps", "effects", "attempts", "audit"):
        rows = _query(
            world,
            f"SELECT count(*) FROM {table} WHERE run_id = ? AND step_id = ?",
            (run_id, app_stop.RESERVE),
        )
        assert rows == [(0,)], f"{table} holds a record of the rolled-back step"
    assert _query(world, "SELECT status FROM runs WHERE run_id = ?", (run_id,)) == [
        (ef.RunStatus.RUNNING.value,)
    ]

    statuses = assert_clean(world.child(apps=APPS, recover=True))
    assert statuses == {run_id: ef.RunStatus.SUCCEEDED.value}

    assert _seats(world, run_id) == [SEAT]
    with world.ledger() as rt:
        run = rt.run(run_id)
        steps = {s.step_id: s for s in rt.steps(run_id)}
        reserve = steps[app_stop.RESERVE]
        (effect,) = rt.effects(run_id=run_id)
        assert run.status is ef.RunStatus.SUCCEEDED
        assert run.output is not None
        assert run.output["reserved"] == {"seat": SEAT, "reserved": True}
        assert reserve.status is S.CONFIRMED
        assert reserve.output == {"seat": SEAT, "reserved": True}
        assert steps[app_stop.TICKET].status is S.CONFIRMED
        assert effect.step_id == app_stop.RESERVE
        assert effect.effect_id == reserve.effect_id
        assert effect.status is S.CONFIRMED
        assert effect.evidence == {"transaction": "committed"}
        attempts = rt.attempts(run_id, app_stop.RESERVE)
        assert [a.outcome.value for a in attempts if a.outcome] == ["committed"]
        assert len(attempts) == 1
        kinds = [e.kind for e in rt.audit(run_id) if e.step_id == app_stop.RESERVE]
        assert kinds == ["local_commit"]
        assert rt.verify_audit() == []


def test_exception_in_local_transaction_rolls_back_write_and_checkpoint(
    seats_world: World, rt: ef.Runtime
) -> None:
    """A tool that raises after its write: no row, the step ``not_committed``, a ``rollback`` event."""
    run = rt.start(app_stop.book_seat, run_id="seat-fail", seat=SEAT, mode="fail")

    assert run.status is ef.RunStatus.FAILED
    assert _seats(seats_world, "seat-fail") == []
    steps = {s.step_id: s for s in rt.steps("seat-fail")}
    reserve = steps[app_stop.RESERVE]
    assert reserve.status is S.NOT_COMMITTED
    assert reserve.error is not None
    assert reserve.error["type"] == "RuntimeError"
    assert "seat map changed" in reserve.error["message"]
    assert app_stop.TICKET not in steps
    (effect,) = rt.effects(run_id="seat-fail")
    assert effect.status is S.NOT_COMMITTED
    assert effect.evidence == {"transaction": "rolled_back"}
    events = [e for e in rt.audit("seat-fail") if e.step_id == app_stop.RESERVE]
    assert [e.kind for e in events] == ["rollback"]
    assert events[0].detail["row"] == "local_rollback"
    assert "local_commit" not in [e.kind for e in rt.audit("seat-fail")]
    assert rt.verify_audit() == []


def test_local_transaction_tool_cannot_commit_on_its_own(
    seats_world: World, rt: ef.Runtime
) -> None:
    """``tx.execute("COMMIT")`` is refused with a ContractError; the write before it rolls back."""
    run = rt.start(app_stop.book_seat, run_id="seat-commit", seat=SEAT, mode="commit")

    assert run.status is ef.RunStatus.FAILED
    assert _seats(seats_world, "seat-commit") == []
    reserve = {s.step_id: s for s in rt.steps("seat-commit")}[app_stop.RESERVE]
    assert reserve.status is S.NOT_COMMITTED
    assert reserve.error is not None
    assert reserve.error["type"] == ef.ContractError.__name__
    assert "a local_transaction tool may not run COMMIT" in reserve.error["message"]
    assert run.error is not None
    assert "may not run COMMIT" in run.error["message"]
    assert [e.kind for e in rt.audit("seat-commit") if e.step_id == app_stop.RESERVE] == [
        "rollback"
    ]
    # The ledger's transaction was not split: the next booking commits normally, once.
    ok = rt.start(app_stop.book_seat, run_id="seat-ok", seat=SEAT)
    assert ok.status is ef.RunStatus.SUCCEEDED
    assert _seats(seats_world, "seat-ok") == [SEAT]
    assert _seats(seats_world, "seat-commit") == []
    assert rt.verify_audit() == []
