"""Many workers on PostgreSQL against the providers' HTTP service, with workers killed at random.

* Chaos: 4 ``effectflow worker`` processes execute 300 runs of a 4-step workflow (three effects:
  a keyed email, an idempotent CRM task, a notification that is not idempotent but searchable by
  tag) while a random worker is SIGKILLed every ~2 s and restarted, and the providers lose some
  responses. At the end the providers' own records are compared with the ledger: no effect twice,
  no effect the ledger does not know, every run finished or waiting for a person with a reason.
* Zombie: a worker is SIGSTOPped inside a call, past its lease; another worker takes the run over
  and finishes it; the first is SIGCONTed: its call reaches the provider with the original key (a
  replay, not a second email) and its writes to the ledger are refused.
"""

from __future__ import annotations

import collections
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import effectflow as ef

ROOT = Path(__file__).resolve().parents[2]
EFFECTFLOW = shutil.which("effectflow", path=str(Path(sys.executable).parent)) or "effectflow"

RUNS = 300
WORKERS = 4
LEASE_TTL = 2.0


def _worker(
    url: str, env: dict[str, str], log: Path, *extra: str, concurrency: int = 8
) -> subprocess.Popen[bytes]:
    command = [
        EFFECTFLOW, "worker", "--app", "tests.workers.app", "--db", url,
        "--concurrency", str(concurrency), "--lease-ttl", str(LEASE_TTL), *extra,
    ]  # fmt: skip
    with log.open("ab") as out:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def _settled(rt: ef.Runtime) -> tuple[int, int]:
    runs = rt.runs(limit=100_000)
    done = sum(1 for r in runs if r.status is ef.RunStatus.SUCCEEDED)
    waiting = sum(1 for r in runs if r.status is ef.RunStatus.PAUSED)
    return done, waiting


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_chaos_four_workers_sigkilled_at_random(
    pg_url: str, provider_service: Any, tmp_path: Path
) -> None:
    from effectflow.testing import HttpCrm, HttpMail, HttpNotify

    from . import app

    with ef.Runtime(pg_url) as rt:
        for i in range(RUNS):
            rt.submit(app.case, run_id=f"case-{i:03d}", case_id=f"{i:03d}")
    with HttpMail(provider_service.url) as mail, HttpNotify(provider_service.url) as notify:
        mail.inject("send", "lose_response", times=6, after=40)
        notify.inject("post", "lose_response", times=6, after=80)
    env = {
        **os.environ,
        "EFFECTFLOW_TEST_DIR": str(tmp_path),
        "EFFECTFLOW_PROVIDERS_URL": provider_service.url,
        "EFFECTFLOW_PROVIDERS_TIMEOUT": "1.5",
        # Each provider call takes 0.25 s (a slow network): runs last long enough that the
        # SIGKILLs land in the middle of calls, between intents and outcomes.
        "EFFECTFLOW_TEST_CALL_DELAY": "0.25",
        "PYTHONPATH": str(ROOT),
    }
    log = tmp_path / "workers.log"
    rng = random.Random(20261130)
    workers = [_worker(pg_url, env, log, concurrency=4) for _ in range(WORKERS)]
    kills = 0
    deadline = time.monotonic() + 400
    try:
        with ef.Runtime(pg_url) as watcher:
            while time.monotonic() < deadline:
                time.sleep(rng.uniform(1.5, 2.5))
                done, waiting = _settled(watcher)
                if done + waiting >= RUNS:
                    break
                victim = rng.randrange(WORKERS)
                workers[victim].send_signal(signal.SIGKILL)
                assert workers[victim].wait(10) == -signal.SIGKILL
                kills += 1
                workers[victim] = _worker(pg_url, env, log, concurrency=4)
            # Stop the chaos; let the survivors finish what the dead left behind.
            while time.monotonic() < deadline:
                done, waiting = _settled(watcher)
                if done + waiting >= RUNS:
                    break
                time.sleep(0.5)
    finally:
        for proc in workers:
            proc.send_signal(signal.SIGTERM)
        for proc in workers:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    with (
        ef.Runtime(pg_url) as rt,
        HttpMail(provider_service.url) as mail,
        HttpCrm(provider_service.url) as crm,
        HttpNotify(provider_service.url) as notify,
    ):
        runs = rt.runs(limit=100_000)
        effects = rt.effects(limit=1_000_000)
        messages = mail.messages()
        tasks = crm.tasks()
        notes = notify.notifications()

        by_status = collections.Counter(r.status.value for r in runs)
        mail_per_case = collections.Counter(m["to"] for m in messages)
        note_per_tag = collections.Counter(n["client_tag"] for n in notes)
        task_per_case = collections.Counter(t["case_id"] for t in tasks)
        duplicates = (
            sum(c - 1 for c in mail_per_case.values() if c > 1)
            + sum(c - 1 for c in note_per_tag.values() if c > 1)
            + sum(c - 1 for c in task_per_case.values() if c > 1)
        )
        # A provider effect is known to the ledger by its external id, or - while a person has
        # still to settle it - as an in-doubt effect under the same idempotency key.
        known = {e.external_effect_id for e in effects if e.external_effect_id}
        in_doubt = {
            e.idempotency_key
            for e in effects
            if e.status in (ef.StepStatus.NEEDS_ATTENTION, ef.StepStatus.UNKNOWN)
        }
        world = (
            [(m["provider_message_id"], m["idempotency_key"]) for m in messages]
            + [(t["task_id"], None) for t in tasks]
            + [(n["notification_id"], n["client_tag"]) for n in notes]
        )
        missing = [x for x, key in world if x not in known and key not in in_doubt]
        unexplained = [
            r.run_id
            for r in runs
            if r.status is not ef.RunStatus.SUCCEEDED
            and not (
                r.status is ef.RunStatus.PAUSED
                and r.next_action is ef.NextAction.ASK_A_PERSON
                and r.error
                and r.error.get("message")
            )
        ]
        print(
            f"\nchaos: {RUNS} runs, {WORKERS} workers, {kills} SIGKILLs; runs by status "
            f"{dict(by_status)}; provider effects: {len(messages)} emails, {len(tasks)} tasks, "
            f"{len(notes)} notifications; duplicate effects: {duplicates}; effects missing from "
            f"the ledger: {len(missing)}; runs neither finished nor waiting with a reason: "
            f"{len(unexplained)}"
        )
        assert kills >= 8, "the chaos never really happened"
        doubled = {
            "mail": [k for k, c in mail_per_case.items() if c > 1],
            "notify": [k for k, c in note_per_tag.items() if c > 1],
            "crm": [k for k, c in task_per_case.items() if c > 1],
        }
        assert duplicates == 0, f"effects twice at the providers: {doubled}"
        assert missing == []
        assert unexplained == []
        assert len(runs) == RUNS
        assert rt.verify_audit() == []


def test_a_zombie_worker_writes_nothing_and_duplicates_nothing(
    pg_url: str, provider_service: Any, tmp_path: Path
) -> None:
    from effectflow.testing import HttpMail

    from . import app

    (tmp_path / "gate").touch()
    with ef.Runtime(pg_url) as rt:
        rt.submit(app.gated, run_id="z1", case_id="1")
    env = {
        **os.environ,
        "EFFECTFLOW_TEST_DIR": str(tmp_path),
        "EFFECTFLOW_PROVIDERS_URL": provider_service.url,
        "PYTHONPATH": str(ROOT),
    }
    log = tmp_path / "workers.log"
    zombie = _worker(pg_url, env, log)
    try:
        deadline = time.monotonic() + 20
        while not (tmp_path / "entered-z1@example.com").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert (tmp_path / "entered-z1@example.com").exists(), log.read_text()
        zombie.send_signal(signal.SIGSTOP)
        time.sleep(LEASE_TTL * 2)  # the lease expires: nobody renews it
        (tmp_path / "gate").unlink()
        taker = _worker(pg_url, env, log, "--until-idle")
        assert taker.wait(30) == 0, log.read_text()
        with ef.Runtime(pg_url) as rt:
            taken = rt.run("z1")
            assert taken.status is ef.RunStatus.SUCCEEDED
            audit_before = len(rt.audit("z1"))
        zombie.send_signal(signal.SIGCONT)
        time.sleep(2.0)  # the zombie's call lands and its outcome write is refused
        zombie.send_signal(signal.SIGTERM)
        assert zombie.wait(20) == 0, log.read_text()
    finally:
        for proc in (zombie,):
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()
    output = log.read_text()
    assert "lost 1" in output, output
    with ef.Runtime(pg_url) as rt, HttpMail(provider_service.url) as mail:
        run = rt.run("z1")
        assert run.status is ef.RunStatus.SUCCEEDED
        assert len(rt.audit("z1")) == audit_before, "the zombie wrote to the ledger"
        sends = [c for c in mail.calls() if c["operation"] == "send"]
        assert [c["outcome"] for c in sends] == ["ok", "replayed"]
        assert len(mail.messages()) == 1
        [step] = [s for s in rt.steps("z1") if s.step_id == "send_email"]
        assert {c["key"] for c in sends} == {step.idempotency_key}
