"""The worker's health and readiness endpoints (``effectflow worker --health``) and its drain.

Real ``effectflow worker`` subprocesses on both ledgers, probed over HTTP as an orchestrator
would: liveness and readiness while it works, readiness failing with the reason while it drains,
when the ledger's schema is not the code's, and when PostgreSQL stops answering; the drain
deadline and a second signal. A hung claim loop is made in process (a Worker whose claim blocks).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

import effectflow as ef
import ledgers
from effectflow.cli import main as cli_main
from effectflow.ledger import upgrades
from effectflow.runtime import health
from effectflow.runtime.worker import Worker
from effectflow.testing import MailProvider, NotifyProvider

from . import app

ROOT = Path(__file__).resolve().parents[2]
EFFECTFLOW = shutil.which("effectflow", path=str(Path(sys.executable).parent)) or "effectflow"
#: How often the tests probe, as an orchestrator would (faster).
POLL = 0.05


class Proc:
    """An ``effectflow worker --health 127.0.0.1:0`` subprocess and the port it said it bound."""

    def __init__(self, url: str, folder: Path, *extra: str) -> None:
        env = {**os.environ, "EFFECTFLOW_TEST_DIR": str(folder), "PYTHONPATH": str(ROOT)}
        self.command = [EFFECTFLOW, "worker", "--app", "tests.workers.app", "--db", url]
        self.env = env
        self.popen = subprocess.Popen(
            [*self.command, "--health", "127.0.0.1:0", *extra],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.popen.stderr is not None
        self.seen: list[str] = []
        for line in self.popen.stderr:
            self.seen.append(line)
            if "health on 127.0.0.1:" in line:
                self.port = int(line.split("127.0.0.1:")[1].split()[0])
                break
        else:
            raise AssertionError(f"the worker did not serve its probes: {''.join(self.seen)}")

    def get(self, path: str) -> tuple[int, dict[str, Any]]:
        return get(self.port, path)

    def until(self, path: str, ok: Callable[[int, dict[str, Any]], bool]) -> dict[str, Any]:
        return until(self.port, path, ok)

    def finish(self, timeout: float = 15) -> tuple[int, str, str]:
        try:
            out, err = self.popen.communicate(timeout=timeout)
        finally:
            if self.popen.poll() is None:
                self.popen.kill()
                self.popen.wait()
        return self.popen.returncode, out, "".join(self.seen) + err


def get(port: int, path: str) -> tuple[int, dict[str, Any]]:
    """The status and JSON body of ``GET path``."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def until(
    port: int, path: str, ok: Callable[[int, dict[str, Any]], bool], timeout: float = 10
) -> dict[str, Any]:
    """Probe ``path`` every ``POLL`` s until ``ok(status, body)``; that body."""
    deadline = time.monotonic() + timeout
    status, body = get(port, path)
    while not ok(status, body):
        assert time.monotonic() < deadline, (status, body)
        time.sleep(POLL)
        status, body = get(port, path)
    return body


def entered(folder: Path, case: str) -> None:
    deadline = time.monotonic() + 15
    while not (folder / f"entered-{case}").exists():
        assert time.monotonic() < deadline, "the slow step never started"
        time.sleep(POLL)


def effects(folder: Path) -> tuple[int, int]:
    mail, notify = MailProvider(folder / "mail.db"), NotifyProvider(folder / "notify.db")
    try:
        return len(mail.messages()), len(notify.notifications())
    finally:
        mail.close()
        notify.close()


def failing(check: str, status: int, body: dict[str, Any]) -> bool:
    return status == 503 and body["checks"][check]["status"] == "failing"


def test_probes_pass_while_working_and_readiness_fails_while_draining(
    any_ledger: str, world: Path
) -> None:
    """Both probes answer 200 while the worker runs a slow step; after SIGTERM readiness answers
    503 ``draining`` naming the run while liveness stays 200; the step ends, the run is released
    at its boundary and the process exits 0."""
    (world / "gate").touch()
    with ef.Runtime(any_ledger) as rt:
        rt.submit(app.slow_case, run_id="slow", case_id="1")
    worker = Proc(any_ledger, world)
    try:
        entered(world, "1")
        assert worker.get("/healthz")[0] == 200
        status, ready = worker.get("/readyz")
        assert status == 200, ready
        assert ready["status"] == "ok"
        assert ready["checks"]["draining"]["detail"] == "claiming; 1 run(s) in progress"
        assert ready["checks"]["schema"]["status"] == "ok"
        assert worker.get("/nope")[0] == 404
        worker.popen.send_signal(signal.SIGTERM)
        body = worker.until("/readyz", lambda s, b: failing("draining", s, b))
        assert body["status"] == "failing"
        assert body["checks"]["draining"]["detail"].startswith("draining")
        assert "(slow)" in body["checks"]["draining"]["detail"]
        assert worker.get("/healthz")[0] == 200  # draining is not dying: no restart wanted
        (world / "gate").unlink()
    finally:
        code, out, err = worker.finish()
    assert code == 0, err
    assert "released 1" in out
    with ef.Runtime(any_ledger) as rt:
        run = rt.run("slow")
        assert (run.status, run.lease_owner) == (ef.RunStatus.RUNNING, None)
        assert [s.step_id for s in rt.steps("slow")] == ["send_email", "wait"]


def test_readiness_names_a_schema_the_code_does_not_write(any_ledger: str, world: Path) -> None:
    """A ledger upgraded past this code under a running worker (a newer effectflow migrated it),
    then one behind it (restored from an older backup): readiness answers 503 naming the version
    and what to do, liveness stays 200, and the worker still claims and runs what it is given
    (nothing re-checks the version: docs/deploy.md says so); back at the code's version, ready."""
    known = upgrades.packaged("sqlite" if any_ledger.startswith("sqlite") else "postgres")[-1]
    raw = ledgers.Raw(any_ledger)
    worker = Proc(any_ledger, world)
    submitter = ef.Runtime(any_ledger)  # opened before the upgrade, as the old worker was
    try:
        worker.until("/readyz", lambda s, b: s == 200)
        raw.sql("INSERT INTO schema_migrations VALUES (?, ?, 0)", (known[0] + 1, "0099_future"))
        body = worker.until("/readyz", lambda s, b: failing("schema", s, b))
        newer = body["checks"]["schema"]["detail"]
        assert f"schema version {known[0] + 1}, newer than this effectflow" in newer
        assert "upgrade this worker" in newer
        assert body["checks"]["ledger"]["status"] == "ok"
        assert worker.get("/healthz")[0] == 200
        submitter.submit(app.case, run_id="after-upgrade", case_id="7")
        deadline = time.monotonic() + 15
        while raw.sql("SELECT status FROM runs WHERE run_id = ?", ("after-upgrade",)) != [
            ("succeeded",)
        ]:
            assert time.monotonic() < deadline, "the old worker did not run the new run"
            time.sleep(POLL)
        raw.sql("DELETE FROM schema_migrations WHERE version >= ?", (known[0],))
        body = worker.until("/readyz", lambda s, b: "older" in b["checks"]["schema"]["detail"])
        assert body["status"] == "failing"
        assert f"schema version {known[0] - 1}, older than" in body["checks"]["schema"]["detail"]
        raw.sql("INSERT INTO schema_migrations VALUES (?, ?, 0)", (known[0], known[1]))
        worker.until("/readyz", lambda s, b: s == 200)
    finally:
        submitter.close()
        # Killed: an idle worker on PostgreSQL sees SIGTERM only when its LISTEN wait ends.
        worker.popen.kill()
        worker.finish()


def test_readiness_fails_when_postgresql_stops_answering(pg_url: str, world: Path) -> None:
    """The worker's database is dropped under it (its sessions ended): readiness answers 503 for
    the ledger, with no password in the answer, while liveness stays 200 (the loop keeps turning,
    retrying: a restart would not bring the database back)."""
    with_password = pg_url.replace("postgres@", "postgres:s3cret-pw@", 1)  # trust auth ignores it
    worker = Proc(with_password, world)
    try:
        worker.until("/readyz", lambda s, b: s == 200)
        database = pg_url.rsplit("/", 1)[1]
        with psycopg.connect(ledgers.PG, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{database}" WITH (FORCE)')
        body = worker.until("/readyz", lambda s, b: failing("ledger", s, b))
        assert body["checks"]["ledger"]["detail"].startswith("the ledger did not answer")
        assert body["checks"]["schema"]["status"] == "failing"
        assert worker.get("/healthz")[0] == 200
        assert "s3cret-pw" not in json.dumps(body)
        worker.popen.send_signal(signal.SIGTERM)
    finally:
        code, _, err = worker.finish()
    assert code == 0, err
    assert "s3cret-pw" not in err


def test_a_hung_claim_loop_fails_liveness(world: Path) -> None:
    """A claim that never returns stops the loop's turns: /healthz (and /readyz) answer 503 once
    ``stall_after`` passed, and 200 again when the loop turns; a loop that ended is not alive."""
    with ef.Runtime(f"sqlite:///{world / 'ledger.db'}") as rt:
        blocked, release = threading.Event(), threading.Event()
        claim = rt.store.claim_runnable

        def hung_claim(**kwargs: Any) -> Any:
            if not release.is_set():
                blocked.set()
                release.wait(10)
            return claim(**kwargs)

        rt.store.claim_runnable = hung_claim  # type: ignore[method-assign]
        worker = Worker(rt, concurrency=1, idle_wait=0.05, stall_after=0.3)
        server = health.HealthServer(("127.0.0.1", 0))
        server.serve(worker)
        runner = threading.Thread(target=worker.run)
        try:
            assert get(server.port, "/healthz")[0] == 503  # not started yet
            runner.start()
            assert blocked.wait(5)
            body = until(server.port, "/healthz", lambda s, b: s == 503)
            assert "hung after 0.3 s" in body["checks"]["loop"]["detail"]
            assert failing("loop", *get(server.port, "/readyz"))
            release.set()
            until(server.port, "/healthz", lambda s, b: s == 200)
        finally:
            release.set()
            worker.stop()
            runner.join(10)
        try:
            status, body = get(server.port, "/healthz")
            assert status == 503
            assert body["checks"]["loop"]["detail"] == "the claim loop is not running"
        finally:
            server.close()


def test_the_ledger_probe_never_tells_the_password() -> None:
    """A ledger error that quotes the URL's password is answered with the password masked."""

    class Store:
        url = "postgresql://app:hunter2-pw@db.internal/ledger"

        def schema_version(self) -> int:
            raise ConnectionError(f"cannot reach {self.url}")

    ledger, _ = health.LedgerProbe(Store(), timeout=2).check()
    assert not ledger.ok
    assert "hunter2-pw" not in ledger.detail
    assert "app:***@db.internal" in ledger.detail


#: The worker command run in process (``--until-idle``: were it to start, it would still end).
IN_PROCESS = ["worker", "--app", "tests.workers.app", "--until-idle"]

BAD_ADDRESSES = ["8081", "localhost", "host:port", ":99999", "::1:8081", "a b:80", "http://x:80"]


@pytest.mark.parametrize("address", BAD_ADDRESSES)
def test_a_bad_health_address_is_refused_before_anything_starts(
    address: str, tmp_path: Path
) -> None:
    """Each malformed ``--health`` exits 2 naming the forms that work; no ledger is created."""
    ledger = tmp_path / "ledger.db"
    answer = CliRunner().invoke(
        cli_main.app, [*IN_PROCESS, "--db", f"sqlite:///{ledger}", "--health", address]
    )
    assert answer.exit_code == 2, answer.output
    assert "HOST:PORT or :PORT" in " ".join(answer.output.split())
    assert not ledger.exists()


def test_parse_address_reads_the_forms_it_names() -> None:
    """``HOST:PORT``, ``:PORT`` (every interface) and bracketed IPv6 are read as such."""
    assert health.parse_address("127.0.0.1:8081") == ("127.0.0.1", 8081)
    assert health.parse_address(":8081") == ("0.0.0.0", 8081)
    assert health.parse_address("[::]:8081") == ("::", 8081)
    assert health.parse_address("localhost:0") == ("localhost", 0)


def test_a_health_port_in_use_stops_the_worker_before_it_claims(world: Path) -> None:
    """A port another process holds: exit 2 with the reason, the submitted run left unclaimed."""
    url = f"sqlite:///{world / 'ledger.db'}"
    with ef.Runtime(url) as rt:
        rt.submit(app.slow_case, run_id="waiting", case_id="1")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        answer = CliRunner().invoke(
            cli_main.app, [*IN_PROCESS, "--db", url, "--health", f"127.0.0.1:{port}"]
        )
    assert answer.exit_code == 2, answer.output
    assert f"cannot serve --health on 127.0.0.1:{port}" in answer.output
    assert "nothing was started" in answer.output
    with ef.Runtime(url) as rt:
        run = rt.run("waiting")
        assert run.lease_owner is None
        assert rt.steps("waiting") == []
    assert not (world / "entered-1").exists()


def test_the_drain_deadline_exits_1_naming_the_run_and_another_worker_finishes_it(
    world: Path,
) -> None:
    """A step that outlasts ``--drain-timeout`` after SIGTERM: the worker exits 1 at the deadline
    naming the run; the next worker takes it over at once (its owner's pid is gone) and finishes
    it, each effect once."""
    url = f"sqlite:///{world / 'ledger.db'}"
    (world / "gate").touch()
    with ef.Runtime(url) as rt:
        rt.submit(app.slow_case, run_id="slow", case_id="1")
    worker = Proc(url, world, "--drain-timeout", "0.3")
    try:
        entered(world, "1")
        sent = time.monotonic()
        worker.popen.send_signal(signal.SIGTERM)
        code, out, err = worker.finish()
        took = time.monotonic() - sent
    finally:
        (world / "gate").unlink()
    assert code == 1, err
    assert 0.3 <= took < 5, took
    assert "drain timeout (0.3 s) passed with 1 run(s) in progress: slow" in err
    assert "in progress at the drain deadline 1" in out
    done = subprocess.run(
        [*worker.command, "--until-idle"],
        cwd=ROOT,
        env=worker.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    with ef.Runtime(url) as rt:
        assert rt.run("slow").status is ef.RunStatus.SUCCEEDED
    assert effects(world) == (1, 1)


def test_a_second_signal_exits_at_once(world: Path) -> None:
    """SIGTERM starts the drain; a second one, while a step still runs, ends the process at once
    with 128 + the signal, naming the run left to its lease."""
    url = f"sqlite:///{world / 'ledger.db'}"
    (world / "gate").touch()
    with ef.Runtime(url) as rt:
        rt.submit(app.slow_case, run_id="slow", case_id="1")
    worker = Proc(url, world)
    try:
        entered(world, "1")
        worker.popen.send_signal(signal.SIGTERM)
        worker.until("/readyz", lambda s, b: failing("draining", s, b))
        sent = time.monotonic()
        worker.popen.send_signal(signal.SIGTERM)
        code, _, err = worker.finish()
        took = time.monotonic() - sent
    finally:
        (world / "gate").unlink()
    assert code == 128 + signal.SIGTERM, err
    assert took < 3, took
    assert "exiting now; runs in progress (slow) pass to another worker" in err


def test_an_idle_worker_stops_at_once_on_sigterm(any_ledger: str, world: Path) -> None:
    """An idle worker waits for work (PostgreSQL: in ``LISTEN``, up to its idle wait of 5 s);
    SIGTERM ends it within a slice of that wait, not after it, so a rolling deploy does not wait
    out every idle worker's ``LISTEN``."""
    worker = Proc(any_ledger, world)
    worker.until("/readyz", lambda s, b: s == 200)
    time.sleep(0.3)  # well inside its wait for work
    sent = time.monotonic()
    worker.popen.send_signal(signal.SIGTERM)
    code, _, err = worker.finish()
    took = time.monotonic() - sent
    assert code == 0, err
    assert took < 2, took
