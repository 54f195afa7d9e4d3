"""No effect out of sight (docs/concepts.md#no-effect-out-of-sight): the ledger goes away right
after the provider committed, before the outcome is recorded. The outcome write is retried on a
fresh connection; if the ledger stays away, nothing is recorded as failed and the run is left for
recovery, which settles the step by the decision table. Checked against the provider's own record:
one post, confirmed.

Outages are real: PostgreSQL restarted (fast and immediate mode) or its connections terminated,
a SQLite file locked past its busy timeout, a SQLite ledger on a full tmpfs.
"""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import effectflow as ef
import ledgers
from effectflow.ledger.records import StepStatus
from pg_server import Mode, PrivatePg

#: The shared PostgreSQL server's maintenance database.
PG = ledgers.PG

#: The provider's own record: one key per post it committed.
POSTS: list[str] = []
#: What the provider does to the ledger right after it committed (set by each test).
AFTER_COMMIT: list[Callable[[], None]] = []


@ef.tool("out_find", effect="read")
def find(*, idempotency_key: str) -> ef.Lookup:
    if idempotency_key in POSTS:
        return ef.Lookup.confirmed(external_effect_id=f"p{POSTS.index(idempotency_key) + 1}")
    return ef.Lookup.not_committed()


@ef.tool(
    "out_post",
    effect="external_write",
    confirm=find,
    effect_id="post_id",
    settles_within=0,  # the in-process provider commits inside the call or never
)
def post(text: str, *, idempotency_key: str) -> dict[str, Any]:
    POSTS.append(idempotency_key)
    for outage in AFTER_COMMIT:
        outage()
    return {"post_id": f"p{len(POSTS)}", "text": text}


@ef.tool("out_note", effect="pure")
def note(post_id: str) -> str:
    return f"posted {post_id}"


@ef.workflow("out_flow")
def flow(ctx: ef.Context) -> Any:
    sent = ctx.call("post", post, text="hello")
    return ctx.call("note", note, post_id=sent["post_id"])


@pytest.fixture(autouse=True)
def _fresh_provider() -> Iterator[None]:
    POSTS.clear()
    AFTER_COMMIT.clear()
    yield
    AFTER_COMMIT.clear()


def _retried(caplog: pytest.LogCaptureFixture) -> None:
    """The outcome write did fail at first (the outage was real) and was retried."""
    assert any("ledger write failed" in r.getMessage() for r in caplog.records)


def _settled_once(rt: ef.Runtime, run: ef.RunRecord) -> None:
    """The run succeeded with the one post the provider holds, confirmed; nothing waits."""
    assert run.status is ef.RunStatus.SUCCEEDED, run.error
    assert run.output == "posted p1"
    [step, _] = rt.steps(run.run_id)
    assert step.status is StepStatus.CONFIRMED
    assert [step.idempotency_key] == POSTS
    assert rt.attention() == []
    assert rt.verify_audit(run.run_id) == []


# -- outages short enough to ride out -------------------------------------------------------------


def _in_background(outage: Callable[[], None], started: threading.Event) -> Callable[[], None]:
    def begin() -> None:
        threading.Thread(target=outage, daemon=True).start()
        assert started.wait(30)

    return begin


def _pg_database(url: str) -> str:
    return url.rsplit("/", 1)[1].split("?", 1)[0]


def _terminate_connections(url: str) -> None:
    with psycopg.connect(PG, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (_pg_database(url),),
        )


def _pg_up(timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        with contextlib.suppress(psycopg.Error):
            psycopg.connect(PG, connect_timeout=2).close()
            return
        time.sleep(0.2)
    raise AssertionError("PostgreSQL did not come back")


def _stop_then_start(pg: PrivatePg, mode: Mode, down_for: float, started: threading.Event) -> None:
    """Stop the private server in ``mode``, stay down ``down_for`` s, start it (it accepts
    connections again when this returns)."""
    try:
        pg.stop(mode)
        started.set()
        time.sleep(down_for)
    finally:
        pg.start()


@pytest.fixture
def pg_url(pg_url: str) -> Iterator[str]:
    """A fresh PostgreSQL ledger of its own; the server is up again before its database is
    dropped."""
    yield pg_url
    _pg_up()


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_a_postgresql_restart_before_the_outcome_is_ridden_out(
    private_pg: PrivatePg, mode: Mode, caplog: pytest.LogCaptureFixture
) -> None:
    """The server is stopped right after the provider committed and started 1 s later: the outcome
    write is retried on fresh connections until it lands; the run goes on."""
    started = threading.Event()
    AFTER_COMMIT.append(
        _in_background(lambda: _stop_then_start(private_pg, mode, 1.0, started), started)
    )
    with ef.Runtime(private_pg.url) as rt:
        run = rt.start(flow, run_id=f"restart-{mode}")
        AFTER_COMMIT.clear()
        _settled_once(rt, run)
    _retried(caplog)


def test_terminated_connections_before_the_outcome_are_ridden_out(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Every connection of the ledger is killed right after the commit (pool_max=1: the one the
    outcome would use): the write is retried on a fresh one."""
    AFTER_COMMIT.append(lambda: _terminate_connections(pg_url))
    with ef.Runtime(pg_url + "?pool_max=1") as rt:
        _settled_once(rt, rt.start(flow, run_id="cut"))
    _retried(caplog)


def _hold_sqlite_lock(path: Path, hold: float, started: threading.Event) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN EXCLUSIVE")
        started.set()
        time.sleep(hold)
        conn.execute("ROLLBACK")
    finally:
        conn.close()


def test_a_sqlite_lock_held_past_the_busy_timeout_is_ridden_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "l.db"
    started = threading.Event()
    AFTER_COMMIT.append(_in_background(lambda: _hold_sqlite_lock(path, 1.0, started), started))
    with ef.Runtime(f"sqlite:///{path}?busy_timeout=0.1") as rt:
        _settled_once(rt, rt.start(flow, run_id="locked"))
    _retried(caplog)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MB tmpfs of its own (skipped where this process may not mount one)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(disk: Path) -> Path:
    filler = disk / "filler"
    with filler.open("wb") as fh, contextlib.suppress(OSError):
        while True:
            fh.write(b"\0" * 65536)
            fh.flush()
    return filler


def test_a_full_disk_before_the_outcome_is_ridden_out(
    small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The disk fills right after the provider committed; space comes back 1 s later."""

    def fill_then_free() -> None:
        filler = _fill(small_disk)
        threading.Timer(1.0, filler.unlink).start()

    AFTER_COMMIT.append(fill_then_free)
    with ef.Runtime(f"sqlite:///{small_disk / 'l.db'}") as rt:
        _settled_once(rt, rt.start(flow, run_id="full"))
    _retried(caplog)


# -- outages that outlast the retry: left for recovery, never recorded as failed ------------------


def _reachable_again(rt: ef.Runtime, run_id: str) -> None:
    """Wait for the first read after an outage: the pool reconnects in the background with its
    own backoff, and a read waits for it at most the ``ledger_retry`` asked for."""
    for _ in range(30):
        try:
            rt.steps(run_id)
            return
        except ef.LedgerUnavailable:
            continue


def _left_for_recovery(rt: ef.Runtime, run_id: str) -> None:
    [step] = rt.steps(run_id)
    assert step.status is StepStatus.INTENT_RECORDED
    assert rt.run(run_id).status is ef.RunStatus.RUNNING  # not "failed": nothing was pretended
    assert [i.effect_id for i in rt.attention()] == [step.effect_id]


def test_a_full_disk_that_stays_full_leaves_the_run_for_recovery(small_disk: Path) -> None:
    fillers: list[Path] = []
    AFTER_COMMIT.append(lambda: fillers.append(_fill(small_disk)))
    with ef.Runtime(f"sqlite:///{small_disk / 'l.db'}", ledger_retry=0.5) as rt:
        with pytest.raises(ef.LedgerUnavailable, match="left for recovery"):
            rt.start(flow, run_id="stays-full")
        AFTER_COMMIT.clear()
        fillers[0].unlink()
        _left_for_recovery(rt, "stays-full")
        [run] = rt.recover()
        _settled_once(rt, run)


def test_a_postgresql_outage_past_the_retry_leaves_the_run_for_recovery(
    private_pg: PrivatePg,
) -> None:
    """The server stays down 3 s, past the 1 s the outcome write is retried: LedgerUnavailable,
    the step still intent_recorded and in attention; recovery settles it once the server is back."""
    started = threading.Event()
    outage = threading.Thread(
        target=_stop_then_start, args=(private_pg, "fast", 3.0, started), daemon=True
    )

    def begin() -> None:
        outage.start()
        assert started.wait(30)

    AFTER_COMMIT.append(begin)
    with ef.Runtime(private_pg.url, ledger_retry=1.0) as rt:
        with pytest.raises(ef.LedgerUnavailable):
            rt.start(flow, run_id="long-outage")
        AFTER_COMMIT.clear()
        outage.join(60)  # the server is back
        assert not outage.is_alive()
        _reachable_again(rt, "long-outage")
        _left_for_recovery(rt, "long-outage")
        [run] = rt.recover()
        _settled_once(rt, run)


@pytest.mark.timeout(90)
def test_the_outcome_write_gives_up_once_ledger_retry_is_spent(private_pg: PrivatePg) -> None:
    """The server stops right after the provider committed and stays down: ``rt.start`` raises
    LedgerUnavailable about ``ledger_retry`` (1 s) later, not after the pool's 30 s timeout."""
    AFTER_COMMIT.append(lambda: private_pg.stop("fast"))
    with ef.Runtime(private_pg.url, ledger_retry=1.0) as rt:
        began = time.monotonic()
        with pytest.raises(ef.LedgerUnavailable):
            rt.start(flow, run_id="stays-down")
        waited = time.monotonic() - began
        AFTER_COMMIT.clear()
        private_pg.start()
        _reachable_again(rt, "stays-down")
        _left_for_recovery(rt, "stays-down")
        [run] = rt.recover()
        _settled_once(rt, run)
    assert waited < 1.0 + 4.0, f"the caller was held {waited:.1f} s for a 1 s ledger_retry"
