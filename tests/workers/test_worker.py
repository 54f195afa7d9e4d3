"""Workers on one ledger: claiming, group commit, heartbeat, lost leases and SIGTERM draining.

The multi-process PostgreSQL tests (chaos, zombie) are in ``test_chaos.py``; these run on SQLite, in
process where a real process adds nothing, and as a real ``effectflow worker`` subprocess for
signals.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import effectflow as ef
from effectflow.runtime.worker import Worker
from effectflow.testing import CrmProvider, MailProvider, NotifyProvider

from . import app

ROOT = Path(__file__).resolve().parents[2]
EFFECTFLOW = shutil.which("effectflow", path=str(Path(sys.executable).parent)) or "effectflow"


def ledger_url(folder: Path) -> str:
    return f"sqlite:///{folder / 'ledger.db'}"


def counts(folder: Path) -> tuple[int, int, int]:
    mail, crm, notify = (
        MailProvider(folder / "mail.db"),
        CrmProvider(folder / "crm.db"),
        NotifyProvider(folder / "notify.db"),
    )
    try:
        return len(mail.messages()), len(crm.tasks()), len(notify.notifications())
    finally:
        for provider in (mail, crm, notify):
            provider.close()


def test_a_worker_executes_submitted_runs_with_group_commit(world: Path) -> None:
    """40 submitted runs, 8 at a time: every run succeeds, one effect of each kind per run, and
    the writes of concurrent runs shared transactions."""
    with ef.Runtime(ledger_url(world)) as rt:
        for i in range(40):
            rt.submit(app.case, run_id=f"case-{i}", case_id=str(i))
        stats = Worker(rt, concurrency=8).run(until_idle=True)
        assert stats.claimed == 40
        assert stats.finished == 40
        assert set(stats.statuses.values()) == {"succeeded"}
        assert rt.committer is not None
        assert rt.committer.batches > rt.committer.transactions, "no transaction was shared"
        assert rt.verify_audit() == []
    assert counts(world) == (40, 40, 40)


def test_two_workers_never_run_the_same_run(world: Path) -> None:
    """Two workers (two runtimes) on one ledger split the runs between them; none runs twice."""
    with ef.Runtime(ledger_url(world)) as rt:
        for i in range(30):
            rt.submit(app.case, run_id=f"case-{i}", case_id=str(i))
    results: list[ef.runtime.worker.WorkerStats] = []

    def work() -> None:
        with ef.Runtime(ledger_url(world)) as mine:
            results.append(Worker(mine, concurrency=4).run(until_idle=True))

    threads = [threading.Thread(target=work) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    ran = [run_id for stats in results for run_id in stats.statuses]
    assert sorted(ran) == sorted(f"case-{i}" for i in range(30))
    assert len(ran) == len(set(ran))
    assert counts(world) == (30, 30, 30)


def test_the_heartbeat_keeps_a_long_call_leased(world: Path) -> None:
    """A step that outlasts the lease TTL keeps its lease: nobody can claim the run meanwhile."""
    (world / "gate").touch()
    with ef.Runtime(ledger_url(world), lease_ttl=0.6) as rt:
        rt.submit(app.slow_case, run_id="slow", case_id="1")
        worker = Worker(rt, concurrency=1)
        runner = threading.Thread(target=worker.run, kwargs={"until_idle": True})
        runner.start()
        deadline = time.monotonic() + 10
        while not (world / "entered-1").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(1.5)  # well past the TTL: only the heartbeat keeps the lease alive
        with ef.Runtime(ledger_url(world), lease_ttl=0.6) as other:
            assert other.store.claim_runnable(owner="thief", ttl=5, now=time.time(), limit=5) == []
        (world / "gate").unlink()
        runner.join(10)
        assert worker.stats.statuses == {"slow": "succeeded"}


def test_a_lost_lease_makes_the_worker_write_nothing_more(world: Path) -> None:
    """Another worker takes the run over during a long step: the first one's writes are refused,
    and the new owner finishes the run with exactly one effect of each kind."""
    (world / "gate").touch()
    with ef.Runtime(ledger_url(world), lease_ttl=30) as rt:
        rt.submit(app.slow_case, run_id="slow", case_id="1")
        first = Worker(rt, concurrency=1)
        runner = threading.Thread(target=first.run, kwargs={"until_idle": True})
        runner.start()
        deadline = time.monotonic() + 10
        while not (world / "entered-1").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        held = rt.run("slow")
        with ef.Runtime(ledger_url(world)) as other:
            taken = other.store.claim(
                "slow", owner="other", expected_token=held.lease_token, ttl=30, now=time.time()
            )
            assert taken is not None
            (world / "gate").unlink()
            runner.join(10)
            assert first.stats.lost == 1
            assert first.stats.finished == 0
            # The new owner continues from the recorded facts (its lease is the current one).
            finished = other.drive_claimed(taken, app.slow_case)
            assert finished.status is ef.RunStatus.SUCCEEDED
    mail, _, notify = counts(world)
    assert (mail, notify) == (1, 1)


def test_sigterm_drains_a_worker_process_and_another_worker_finishes(world: Path) -> None:
    """A real `effectflow worker` gets SIGTERM during a slow step: it finishes the step, releases
    the run at the next step boundary and exits 0; a second worker finishes the run."""
    (world / "gate").touch()
    with ef.Runtime(ledger_url(world)) as rt:
        rt.submit(app.slow_case, run_id="slow", case_id="1")
    env = {**os.environ, "EFFECTFLOW_TEST_DIR": str(world), "PYTHONPATH": str(ROOT)}
    command = [EFFECTFLOW, "worker", "--app", "tests.workers.app", "--db", ledger_url(world)]
    proc = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 15
        while not (world / "entered-1").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert (world / "entered-1").exists(), proc.stderr.read() if proc.stderr else ""
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        (world / "gate").unlink()
        out, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "released 1" in out
    with ef.Runtime(ledger_url(world)) as rt:
        run = rt.run("slow")
        assert run.status is ef.RunStatus.RUNNING
        assert run.lease_owner is None
        assert [s.step_id for s in rt.steps("slow")] == ["send_email", "wait"]
    done = subprocess.run(
        [*command, "--until-idle"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    with ef.Runtime(ledger_url(world)) as rt:
        assert rt.run("slow").status is ef.RunStatus.SUCCEEDED
    mail, _, notify = counts(world)
    assert (mail, notify) == (1, 1)
