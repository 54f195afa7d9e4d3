"""Retention from the command line, on both backends with the operator's key: `effectflow
purge-keys` drops the key bindings past their retention (checked in the ledger's own tables, read
around the store), keeps a binding whose outcome is in doubt, and the ledger still verifies."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import effectflow as ef
import ledgers
from effectflow.ledger import audit

KEY = "r" * 32
EFFECTFLOW = shutil.which("effectflow", path=str(Path(sys.executable).parent)) or "effectflow"
#: Keys the provider remembers this long (seconds): short, so the test can outlive them.
RETENTION = 0.2
SENT: list[str] = []


@ef.tool("rt_send", effect="external_write", effect_id="id",
         idempotency=ef.Idempotency(supported=True, retention=RETENTION))  # fmt: skip
def send(to: str, *, idempotency_key: str) -> dict[str, str]:
    SENT.append(to)
    return {"id": f"msg-{to}"}


@ef.tool("rt_lost", effect="external_write", effect_id="id",
         idempotency=ef.Idempotency(supported=True, retention=RETENTION))  # fmt: skip
def lost(*, idempotency_key: str) -> dict[str, str]:
    raise ef.OutcomeUnknown("the answer was lost")


@ef.workflow("rt_mail")
def mail(ctx: ef.Context, to: str) -> Any:
    return ctx.call("send", send, to=to)


@ef.workflow("rt_doubt")
def doubt(ctx: ef.Context) -> Any:
    return ctx.call("lost", lost)


@pytest.fixture(params=ledgers.BACKENDS)
def url(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    monkeypatch.setenv(audit.KEY_ENV, KEY)
    with ledgers.fresh(request.param, tmp_path, prefix="ef_retain") as found:
        yield found


def _cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``effectflow ARGS --db URL`` as an operator runs it, with the audit key in its environment."""
    env = {**os.environ, audit.KEY_ENV: KEY}
    return subprocess.run(
        [EFFECTFLOW, *args, "--db", url],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip


def _operations(db: ledgers.Raw) -> set[str]:
    return {str(r[0]) for r in db.sql("SELECT run_id FROM operations")}


def test_purge_keys_drops_expired_bindings_keeps_the_doubtful_and_the_ledger_verifies(
    url: str,
) -> None:
    """Bindings past retention of settled steps are dropped (each leaving a purge record), the
    binding of an effect in doubt stays, a second purge finds nothing, and audit verify passes."""
    SENT.clear()
    with ef.Runtime(url) as rt:
        rt.start(mail, run_id="done-1", to="a")
        rt.start(mail, run_id="done-2", to="b")
        assert rt.start(doubt, run_id="doubt").status is ef.RunStatus.PAUSED
    assert SENT == ["a", "b"]  # the provider's own record: two effects, once each
    db = ledgers.Raw(url)
    assert _operations(db) == {"done-1", "done-2", "doubt"}
    time.sleep(RETENTION * 2)

    first = _cli(url, "purge-keys", "--json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout) == {"purged": 2}
    assert _operations(db) == {"doubt"}
    assert db.sql("SELECT count(*) FROM purged_keys") == [(2,)]

    again = _cli(url, "purge-keys")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == "0 expired key binding(s) purged"

    verified = _cli(url, "audit", "verify")
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "audit log intact" in verified.stdout


def test_purge_keys_refuses_a_ledger_that_is_not_there(tmp_path: Path) -> None:
    """A SQLite URL whose file does not exist is a usage error (exit 2), and no ledger is created."""
    missing = tmp_path / "nowhere.db"
    done = _cli(f"sqlite:///{missing}", "purge-keys")
    assert done.returncode == 2, done.stdout + done.stderr
    assert not missing.exists()
