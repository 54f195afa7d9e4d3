"""Many workers on PostgreSQL against the providers' HTTP service, with workers killed at random.

* Chaos: 4 ``effectflow worker`` processes execute 300 runs of a 4-step workflow (three effects:
  a keyed email, an idempotent CRM task, a notification that is not idempotent but searchable by
  tag) while a random worker is SIGKILLed every ~2 s and restarted, the providers lose some
  responses, and the ledger's PostgreSQL server (a private one: ``tests/pg_server.py``) is
  restarted four times, in fast and in immediate (crash) mode, with a worker SIGKILLed while it
  is down. At the end the providers' own records are compared with the ledger: every logical
  operation at most once at its provider, every effect a provider holds confirmed in the ledger
  under its key or listed in ``rt.attention()``, every confirmed effect held by its provider,
  every run finished or waiting for a person with a reason.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import psycopg_pool
import pytest

import effectflow as ef
from pg_server import Mode, PrivatePg

ROOT = Path(__file__).resolve().parents[2]
EFFECTFLOW = shutil.which("effectflow", path=str(Path(sys.executable).parent)) or "effectflow"

RUNS = 300
WORKERS = 4
LEASE_TTL = 2.0
#: The ledger server's restarts during the chaos, one every few SIGKILLs: (mode, seconds down).
RESTARTS: tuple[tuple[Mode, float], ...] = (
    ("fast", 1.0),
    ("immediate", 1.5),
    ("fast", 2.0),
    ("immediate", 1.0),
)
#: A restart every this many rounds of the chaos loop (each round SIGKILLs a worker). Every 2nd:
#: on a quick machine the 300 runs settle in about 10 rounds, and every 3rd left the last
#: restart out now and then.
RESTART_EVERY = 2

T = TypeVar("T")


def _worker(
    url: str, env: dict[str, str], log: Path, *extra: str, concurrency: int = 8
) -> subprocess.Popen[bytes]:
    command = [
        EFFECTFLOW, "worker", "--app", "tests.workers.app", "--db", url,
        "--concurrency", str(concurrency), "--lease-ttl", str(LEASE_TTL), *extra,
    ]  # fmt: skip
    with log.open("ab") as out:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def _through_restarts(read: Callable[[], T], timeout: float = 60) -> T:
    """``read()`` from the ledger, again while a restart has broken the watcher's connections."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return read()
        except (psycopg.Error, psycopg_pool.PoolTimeout, ef.LedgerUnavailable):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _story(rt: ef.Runtime, run_id: str, log: str) -> str:
    """A run's audit and attempts, and the worker log's lines that name it (for a failure)."""
    lines = [f"--- {run_id}: {rt.run(run_id).status.value}"]
    lines += [f"{e.at:.3f} {e.step_id} {e.kind} {e.actor} {e.detail}" for e in rt.audit(run_id)]
    lines += [
        f"{a.started_at:.3f}-{a.ended_at} {a.step_id} #{a.number} {a.kind} gen={a.generation} "
        f"{a.outcome} {a.error}"
        for a in rt.store.attempts(run_id)
    ]
    lines += [line for line in log.splitlines() if f"run {run_id}:" in line]
    return "\n".join(lines)


def _settled(rt: ef.Runtime) -> tuple[int, int]:
    runs = _through_restarts(lambda: rt.runs(limit=100_000))
    done = sum(1 for r in runs if r.status is ef.RunStatus.SUCCEEDED)
    waiting = sum(1 for r in runs if r.status is ef.RunStatus.PAUSED)
    return done, waiting


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_chaos_four_workers_sigkilled_at_random(
    private_pg: PrivatePg, provider_service: Any, tmp_path: Path
) -> None:
    """300 runs through SIGKILLed workers, lost responses and four ledger restarts (fast and
    immediate): no duplicate at any provider, no provider effect out of the ledger's sight."""
    from effectflow.testing import HttpCrm, HttpMail, HttpNotify

    from . import app

    pg_url = private_pg.url
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
    exits = 0  # workers that ended on their own (one started while the ledger was down)
    restarts: list[Mode] = []
    rounds = 0
    deadline = time.monotonic() + 400
    try:
        with ef.Runtime(pg_url) as watcher:
            while time.monotonic() < deadline:
                time.sleep(rng.uniform(1.5, 2.5))
                done, waiting = _settled(watcher)
                if done + waiting >= RUNS:
                    break
                rounds += 1
                for slot, proc in enumerate(workers):
                    if proc.poll() is not None:
                        exits += 1
                        workers[slot] = _worker(pg_url, env, log, concurrency=4)
                restart = None
                if rounds % RESTART_EVERY == 0 and len(restarts) < len(RESTARTS):
                    restart = RESTARTS[len(restarts)]
                    private_pg.stop(restart[0])
                    restarts.append(restart[0])
                victim = rng.randrange(WORKERS)
                workers[victim].send_signal(signal.SIGKILL)
                assert workers[victim].wait(10) == -signal.SIGKILL
                kills += 1
                workers[victim] = _worker(pg_url, env, log, concurrency=4)
                if restart is not None:
                    time.sleep(restart[1])
                    private_pg.start()
            # Stop the chaos; let the survivors finish what the dead left behind.
            while time.monotonic() < deadline:
                done, waiting = _settled(watcher)
                if done + waiting >= RUNS:
                    break
                for slot, proc in enumerate(workers):
                    if proc.poll() is not None:
                        exits += 1
                        workers[slot] = _worker(pg_url, env, log, concurrency=4)
                time.sleep(0.5)
    finally:
        private_pg.start()
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
        attention = rt.attention(limit=100_000)
        messages = mail.messages()
        tasks = crm.tasks()
        notes = notify.notifications()

        by_status = collections.Counter(r.status.value for r in runs)
        # What each provider holds: (provider, its effect id, the idempotency key it was sent).
        world = (
            [("mail", m["provider_message_id"], m["idempotency_key"]) for m in messages]
            + [("crm", t["task_id"], t["idempotency_key"]) for t in tasks]
            + [("notify", n["notification_id"], n["client_tag"]) for n in notes]
        )
        # Every logical operation (its key), and every case (one operation per provider per
        # case), at most once at its provider.
        per_key = collections.Counter((provider, key) for provider, _, key in world)
        per_case = collections.Counter(
            [("mail", m["to"]) for m in messages]
            + [("crm", t["case_id"]) for t in tasks]
            + [("notify", n["text"].split(":", 1)[0]) for n in notes]
        )
        duplicates = sum(c - 1 for c in per_key.values() if c > 1) + sum(
            c - 1 for c in per_case.values() if c > 1
        )
        # In sight: the ledger confirms the provider's effect under the key it was sent with, or
        # that key's effect is listed for a person (rt.attention()).
        confirmed = {
            (e.idempotency_key, e.external_effect_id)
            for e in effects
            if e.status is ef.StepStatus.CONFIRMED
        }
        listed = {i.effect_id for i in attention if i.effect_id}
        attention_keys = {e.idempotency_key for e in effects if e.effect_id in listed}
        out_of_sight = [
            (provider, effect_id)
            for provider, effect_id, key in world
            if (key, effect_id) not in confirmed and key not in attention_keys
        ]
        # And the other way: the ledger confirms nothing a provider does not hold.
        held = {(key, effect_id) for _, effect_id, key in world}
        phantoms = [pair for pair in confirmed if pair not in held]
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
        output = log.read_text(errors="replace")
        print(
            f"\nchaos: {RUNS} runs, {WORKERS} workers, {kills} SIGKILLs, {exits} workers that "
            f"exited on their own, ledger restarts {restarts}; runs by status {dict(by_status)}; "
            f"provider effects: {len(messages)} emails, {len(tasks)} tasks, {len(notes)} "
            f"notifications; duplicate effects: {duplicates}; effects out of sight: "
            f"{len(out_of_sight)}; phantoms: {len(phantoms)}; in attention: {len(attention)}; "
            f"runs neither finished nor waiting with a reason: {len(unexplained)}; worker log: "
            f"{output.count('ledger write failed')} outcome writes retried, "
            f"{output.count('LedgerUnavailable')} LedgerUnavailable, "
            f"{output.count('claiming runs failed')} failed claims"
        )
        assert kills >= 8, "the chaos never really happened"
        assert restarts == [mode for mode, _ in RESTARTS], "the ledger was not restarted"
        doubled = sorted(k for k, c in (per_key + per_case).items() if c > 1)
        run_of_key = {e.idempotency_key: e.run_id for e in effects}
        run_of_effect = {effect_id: run_of_key.get(key, "?") for _, effect_id, key in world} | {
            e.external_effect_id: e.run_id for e in effects
        }
        stories = sorted(
            {run_of_key[key] for _, key in doubled if key in run_of_key}
            | {run_of_effect.get(effect_id, "?") for _, effect_id in out_of_sight}
            | {run_of_key.get(key, "?") for key, _ in phantoms}
        )
        told = "\n".join(_story(rt, r, output) for r in stories if r != "?")
        assert duplicates == 0, f"effects twice at the providers: {doubled}\n{told}"
        assert out_of_sight == [], told
        assert phantoms == [], told
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
