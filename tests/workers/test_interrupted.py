"""A worker process SIGKILLed in the middle of a call leaves its run interrupted: every surface says so
(`effectflow runs` and `show`, text and --json; the runtime's view; the HTTP API; the console), the
attention queue lists the call in doubt with `recover`, and the next `effectflow worker --until-idle`
takes the run over at once (its owner's pid is dead on this host), long before the lease expires.
Both backends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from starlette.testclient import TestClient

import effectflow as ef
from effectflow.api.app import create_app
from effectflow.ledger.store import Batch
from effectflow.runtime.faults import Fault, FaultAction, FaultPlan, FaultPoint, InjectedCrash

from . import app
from .test_worker import EFFECTFLOW, ROOT, counts, ledger_url

#: The crashed worker's lease: far longer than a takeover may take, so a quick one proves the
#: dead pid was noticed (not the lease's expiry).
LONG_TTL = "300"


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The ledger of one backend."""
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return ledger_url(tmp_path)


def env_for(world: Path) -> dict[str, str]:
    return {**os.environ, "EFFECTFLOW_TEST_DIR": str(world), "PYTHONPATH": str(ROOT)}


def cli(world: Path, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [EFFECTFLOW, *args],
        cwd=ROOT,
        env=env_for(world),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == code, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def kill_mid_call(world: Path, url: str, run_id: str) -> int:
    """Submit a gated run, let a real worker process record its intent and enter the call, then
    SIGKILL it; returns the dead worker's pid."""
    (world / "gate").touch()
    with ef.Runtime(url) as rt:
        rt.submit(app.gated, run_id=run_id, case_id=run_id)
    log = world / f"worker-{run_id}.log"
    with log.open("w") as err:
        proc = subprocess.Popen(
            [
                EFFECTFLOW,
                "worker",
                "--app",
                "tests.workers.app",
                "--db",
                url,
                "--lease-ttl",
                LONG_TTL,
            ],
            cwd=ROOT,
            env=env_for(world),
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    entered = world / f"entered-z{run_id}@example.com"
    try:
        deadline = time.monotonic() + 20
        while not entered.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert entered.exists(), log.read_text()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    return proc.pid


def test_a_sigkilled_worker_leaves_its_run_interrupted_everywhere_and_a_worker_takes_it_at_once(
    world: Path, url: str
) -> None:
    """After the SIGKILL the run row still says running, but runs/show/the API/the console say
    interrupted (next: recover), attention lists the call in doubt with recover, and a new worker
    claims and finishes the run within seconds although the dead worker's lease had 300 s left."""
    pid = kill_mid_call(world, url, "z1")

    with ef.Runtime(url) as rt:
        run = rt.run("z1")
        assert run.status is ef.RunStatus.RUNNING
        assert run.lease_expires_at is not None
        assert run.lease_expires_at > time.time() + 200
        view = rt.run_view(run)
        assert view.interrupted
        assert view.next_action == "recover"
        assert f"process {pid} on this host is not running" in (view.interruption or "")
        [doubt] = rt.attention()
        assert (doubt.kind, doubt.run_id, doubt.step_id) == ("interrupted_run", "z1", "send_email")
        assert doubt.actions == ("recover", "resolve")
        assert "in flight" in doubt.reason
        [effect] = rt.effects(run_id="z1")
        assert effect.status is ef.StepStatus.INTENT_RECORDED
        assert doubt.effect_id == effect.effect_id

    [listed] = json.loads(cli(world, "runs", "--db", url, "--json").stdout)
    assert (listed["run_id"], listed["status"], listed["interrupted"]) == ("z1", "running", True)
    assert str(pid) in listed["interruption"]
    table = cli(world, "runs", "--db", url).stdout
    assert "running (interrupted)" in table
    assert "recover" in table
    shown = json.loads(cli(world, "show", "z1", "--db", url, "--json").stdout)
    assert shown["run"]["interrupted"] is True
    assert "interrupted: its owner" in cli(world, "show", "z1", "--db", url).stdout
    items = json.loads(cli(world, "attention", "--db", url, "--json", code=3).stdout)
    assert [(i["kind"], i["actions"]) for i in items] == [
        ("interrupted_run", ["recover", "resolve"])
    ]

    served = create_app(url, {"tok": "default"}, request_keys_path=str(world / "keys.db"))
    with TestClient(served) as client:
        auth = {"Authorization": "Bearer tok"}
        got = client.get("/api/v1/runs/z1", headers=auth).json()
        assert (got["status"], got["interrupted"]) == ("running", True)
        page = client.get("/api/v1/runs", headers=auth).json()
        assert [r["interrupted"] for r in page["items"]] == [True]
        timeline = client.get("/api/v1/runs/z1/timeline", headers=auth).json()
        assert timeline["run"]["interrupted"] is True
        queue = client.get("/api/v1/attention", headers=auth).json()["items"]
        assert [i["kind"] for i in queue] == ["interrupted_run"]
        client.cookies.set("effectflow_token", "tok")
        runs_html = client.get("/runs").text
        assert "interrupted" in runs_html
        assert "recover" in runs_html
        run_html = client.get("/runs/z1").text
        assert 'id="run-interruption"' in run_html
        assert ">Recover</button>" in run_html
        attention_html = client.get("/attention").text
        assert "Recover run z1" in attention_html

    (world / "gate").unlink()
    started = time.monotonic()
    done = cli(world, "worker", "--app", "tests.workers.app", "--db", url, "--until-idle")
    took = time.monotonic() - started
    assert "claimed 1, finished 1" in done.stdout, done.stdout + done.stderr
    assert took < 30, f"the takeover took {took:.1f} s: it waited for the lease"
    with ef.Runtime(url) as rt:
        run = rt.run("z1")
        assert run.status is ef.RunStatus.SUCCEEDED
        assert not rt.run_view(run).interrupted
        assert rt.attention() == []
    mail, _, notify = counts(world)
    assert (mail, notify) == (1, 1)


def test_effectflow_recover_settles_a_sigkilled_workers_run(world: Path, url: str) -> None:
    """`effectflow recover` drives the run whose worker was SIGKILLed mid-call, at once: the call in
    doubt is looked up and retried with its key, the run succeeds with one email, nothing waits."""
    kill_mid_call(world, url, "z2")
    (world / "gate").unlink()
    out = cli(world, "recover", "--app", "tests.workers.app", "--db", url, "--json").stdout
    answer = json.loads(out)
    assert [(r["run_id"], r["status"], r["interrupted"]) for r in answer["runs"]] == [
        ("z2", "succeeded", False)
    ]
    assert answer["attention"] == 0
    mail, _, notify = counts(world)
    assert (mail, notify) == (1, 1)


# -- in this process: what only the owner knows, and the attention queue ---------------------------


def crash_after_send_plan() -> FaultPlan:
    """Raise once the email is sent, before its outcome is recorded (a plan counts its hits, so
    each runtime gets its own)."""
    return FaultPlan(
        [Fault(FaultPoint.AFTER_CALL_BEFORE_RECORD, "send_email", 1, FaultAction.RAISE)]
    )


def crash_after_send(url: str, run_id: str) -> None:
    """Start a case whose email is sent but whose outcome is never recorded (the step stays
    ``intent_recorded``), in a runtime closed right after."""
    with ef.Runtime(url, faults=crash_after_send_plan()) as rt, pytest.raises(InjectedCrash):
        rt.start(app.case, run_id=run_id, case_id=run_id)


def end_as(url: str, run_id: str, status: ef.RunStatus) -> None:
    """The run ends ``status`` with its call still in doubt (as a run a ledger error stopped)."""
    with ef.Runtime(url) as rt:
        now = time.time()
        batch = Batch(run_id, lease_token=None)
        batch.run_changes.update(
            status=status, next_action=ef.NextAction.NONE, lease_owner=None, lease_expires_at=None
        )
        batch.event(f"run_{status.value}", now, note="ended by the test with a call in doubt")
        rt.store.apply(batch, lease_ttl=rt.lease_ttl, now=now)


def test_a_run_its_own_runtime_stopped_executing_is_recovered_at_once(
    world: Path, url: str
) -> None:
    """A runtime that stopped executing a run (here: the crash window raised out of start) sees it
    interrupted and recovers it at once; another process, which cannot tell, does not."""
    with ef.Runtime(url, faults=crash_after_send_plan()) as rt:
        with pytest.raises(InjectedCrash):
            rt.start(app.case, run_id="own", case_id="own")
        run = rt.run("own")
        assert run.lease_owner == rt.owner
        assert (run.lease_expires_at or 0) > time.time()
        assert "this process stopped executing it" in (rt.interruption(run) or "")
        assert [(i.kind, i.run_id) for i in rt.attention()] == [("interrupted_run", "own")]
        with ef.Runtime(url) as other:
            assert other.interruption(other.run("own")) is None
            assert other.attention() == []
        [done] = rt.recover()
        assert done.status is ef.RunStatus.SUCCEEDED
    assert counts(world)[0] == 1


def test_attention_lists_the_calls_in_doubt_of_ended_runs_but_not_of_a_live_one(
    world: Path, url: str
) -> None:
    """An intent_recorded effect is listed when its run ended failed or cancelled (resolve is what
    is left), never while its run executes under a live lease in another runtime."""
    crash_after_send(url, "f1")
    end_as(url, "f1", ef.RunStatus.FAILED)
    crash_after_send(url, "c1")
    end_as(url, "c1", ef.RunStatus.CANCELLED)
    (world / "gate").touch()
    with ef.Runtime(url) as live:
        thread = threading.Thread(
            target=live.start, args=(app.gated,), kwargs={"run_id": "live", "case_id": "live"}
        )
        thread.start()
        try:
            entered = world / "entered-zlive@example.com"
            deadline = time.monotonic() + 20
            while not entered.exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            assert entered.exists()
            with ef.Runtime(url) as rt:
                in_doubt = rt.effects(status="intent_recorded")
                assert sorted(e.run_id for e in in_doubt) == ["c1", "f1", "live"]
                items = {i.run_id: i for i in rt.attention()}
                assert not rt.run_view(rt.run("live")).interrupted
        finally:
            (world / "gate").unlink()
            thread.join(timeout=30)
    assert sorted(items) == ["c1", "f1"]
    for run_id, ended in (("f1", "failed"), ("c1", "cancelled")):
        item = items[run_id]
        assert (item.kind, item.step_id, item.actions) == (
            "unknown_effect",
            "send_email",
            ("resolve",),
        )
        assert f"its run ended {ended}" in item.reason
        assert "in flight" in item.reason
    with ef.Runtime(url) as rt:
        assert rt.run("live").status is ef.RunStatus.SUCCEEDED
        assert sorted(i.run_id for i in rt.attention()) == ["c1", "f1"]


@ef.workflow("wk_fails_after_send")
def fails_after_send(ctx: ef.Context, case_id: str) -> None:
    ctx.call("send_email", app.send_email, to=f"f{case_id}@example.com", body="then a bug")
    raise ValueError("a bug after the email")


def test_a_failed_run_lists_its_confirmed_and_in_doubt_effects(world: Path, url: str) -> None:
    """A failed run's error names the effects it caused and those in doubt (none here)."""
    with ef.Runtime(url) as rt:
        run = rt.start(fails_after_send, run_id="bug", case_id="bug")
        [effect] = rt.effects(run_id="bug")
    assert run.status is ef.RunStatus.FAILED
    assert run.error is not None
    assert run.error["confirmed_effects"] == [effect.effect_id]
    assert run.error["in_doubt_effects"] == []
