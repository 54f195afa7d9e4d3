"""Retention from the command line, on both backends with the operator's key: `effectflow
purge-keys` drops the key bindings past their retention, keeping a binding whose outcome is in
doubt; `effectflow archive` moves finished runs to a file that verifies on its own and leaves the
runs in doubt or waiting untouched; the ledger still verifies, and a run deleted by hand or an
edited archive is still reported. The ledger's tables are read around the store."""

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


# -- archive ----------------------------------------------------------------------------------


@ef.workflow("rt_two")
def two(ctx: ef.Context, to: str) -> Any:
    return [ctx.call("one", send, to=to), ctx.call("two", send, to=to + "-2")]


@ef.tool("rt_refund", effect="external_write", effect_id="id",
         idempotency=ef.Idempotency(supported=True), approval="always")  # fmt: skip
def refund(amount: int, *, idempotency_key: str) -> dict[str, str]:
    SENT.append(f"refund-{amount}")
    return {"id": f"r-{amount}"}


@ef.workflow("rt_paused")
def paused(ctx: ef.Context) -> Any:
    return ctx.call("refund", refund, amount=5)


FUTURE = "2999-01-01"


def _ledger_rows(db: ledgers.Raw, run_id: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row a run has in the ledger, table by table, read around the store."""
    tables = ("runs", "steps", "effects", "attempts", "audit", "seals", "approvals")
    return {t: sorted(map(tuple, db.sql(f"SELECT * FROM {t} WHERE run_id = ?", (run_id,))),
                      key=repr) for t in tables}  # fmt: skip


@pytest.fixture
def archived(url: str, tmp_path: Path) -> tuple[str, Path, dict[str, Any]]:
    """A ledger with three finished runs, one in doubt and one waiting for approval, archived."""
    SENT.clear()
    with ef.Runtime(url) as rt:
        for i in range(3):
            rt.start(two, run_id=f"fin-{i}", to=f"f{i}")
        assert rt.start(doubt, run_id="doubt").status is ef.RunStatus.PAUSED
        assert rt.start(paused, run_id="waits").status is ef.RunStatus.PAUSED
    db = ledgers.Raw(url)
    before = {rid: _ledger_rows(db, rid) for rid in ("doubt", "waits")}
    head = _cli(url, "audit", "head", "--out", str(tmp_path / "head.json"))
    assert head.returncode == 0, head.stderr
    out = tmp_path / "archive.jsonl"
    done = _cli(url, "archive", "--before", FUTURE, "--to", str(out), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(json.loads(done.stdout)["archived"]) == ["fin-0", "fin-1", "fin-2"]
    return url, out, before


def test_archive_round_trip(archived: tuple[str, Path, dict[str, Any]]) -> None:
    """Finished runs are in the file and gone from every table, the runs in doubt or waiting are
    untouched row for row, the file verifies on its own and the ledger still verifies."""
    url, out, before = archived
    db = ledgers.Raw(url)
    for rid in ("fin-0", "fin-1", "fin-2"):
        assert all(rows == [] for rows in _ledger_rows(db, rid).values()), rid
    assert {rid: _ledger_rows(db, rid) for rid in before} == before
    lines = [json.loads(x) for x in out.read_text(encoding="utf-8").splitlines()]
    runs = {e["record"]["run_id"]: e for e in lines if e["kind"] == "run"}
    assert sorted(runs) == ["fin-0", "fin-1", "fin-2"]
    assert all(len(e["events"]) == e["record"]["audit_count"] > 0 for e in runs.values())
    assert db.sql("SELECT count(*) FROM archived_runs") == [(3,)]

    alone = _cli(url, "audit", "verify", "--archive", str(out))
    assert alone.returncode == 0, alone.stdout + alone.stderr
    ledger = _cli(url, "audit", "verify")
    assert ledger.returncode == 0, ledger.stdout + ledger.stderr

    # The ledger goes on: a new run's seals chain after the archived links, and it verifies.
    with ef.Runtime(url) as rt:
        rt.start(two, run_id="later", to="z")
    assert _cli(url, "audit", "verify").returncode == 0


def test_an_archive_edited_by_hand_fails_its_verify(
    archived: tuple[str, Path, dict[str, Any]],
) -> None:
    """A step's output changed in the archive file is reported (exit 4)."""
    url, out, _ = archived
    text = out.read_text(encoding="utf-8")
    assert '"id\\":\\"msg-f1\\"' in text
    out.write_text(text.replace('"id\\":\\"msg-f1\\"', '"id\\":\\"msg-XX\\"'), encoding="utf-8")
    done = _cli(url, "audit", "verify", "--archive", str(out))
    assert done.returncode == 4, done.stdout + done.stderr
    assert "fin-1" in done.stderr


def test_a_run_deleted_by_hand_without_a_record_is_still_reported(
    archived: tuple[str, Path, dict[str, Any]],
) -> None:
    """Deleting an unarchived run (triggers dropped, no archive record) breaks its shard's chain."""
    url, _, _ = archived
    db = ledgers.Raw(url)
    db.unprotect()
    for table in ("attempts", "approvals", "operations", "effects", "steps", "runs", "audit",
                  "seals"):  # fmt: skip
        db.sql(f"DELETE FROM {table} WHERE run_id = ?", ("doubt",))
    done = _cli(url, "audit", "verify")
    assert done.returncode == 4, done.stdout + done.stderr
    assert "shard" in done.stderr


def test_a_forged_archive_record_excuses_nothing(
    archived: tuple[str, Path, dict[str, Any]],
) -> None:
    """A record written without the key for a run deleted by hand, its seal links copied, is
    reported: only the key makes an archive record."""
    url, _, _ = archived
    db = ledgers.Raw(url)
    [(tenant, audit_count, audit_head, seal_count, seal_head)] = db.sql(
        "SELECT tenant, audit_count, audit_head, seal_count, seal_head FROM runs WHERE run_id = ?",
        ("doubt",),
    )
    db.sql("INSERT INTO archived_runs VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
           ("doubt", tenant, 1.0, audit_count, audit_head, seal_count, seal_head, "sha256:00"))  # fmt: skip
    db.sql("INSERT INTO archived_seals SELECT run_id, n, shard, shard_seq, hash FROM seals "
           "WHERE run_id = ?", ("doubt",))  # fmt: skip
    for table in ("attempts", "approvals", "operations", "effects", "steps", "runs", "audit",
                  "seals"):  # fmt: skip
        db.sql(f"DELETE FROM {table} WHERE run_id = ?", ("doubt",))
    done = _cli(url, "audit", "verify")
    assert done.returncode == 4, done.stdout + done.stderr
    assert "archive record" in done.stderr


def test_append_only_holds_for_runs_that_are_not_archived(url: str) -> None:
    """The triggers still refuse to delete a live run's audit events and seals."""
    with ef.Runtime(url) as rt:
        rt.start(mail, run_id="live", to="x")
    db = ledgers.Raw(url)
    for table in ("audit", "seals"):
        with pytest.raises(Exception, match="append-only"):
            db.sql(f"DELETE FROM {table} WHERE run_id = ?", ("live",))


def test_a_keyed_ledger_is_not_archived_without_its_key(url: str, tmp_path: Path) -> None:
    """Without the audit key nothing is archived (exit 1): its records would not verify."""
    with ef.Runtime(url) as rt:
        rt.start(mail, run_id="kept", to="k")
    out = tmp_path / "none.jsonl"
    env = {k: v for k, v in os.environ.items() if k != audit.KEY_ENV}
    done = subprocess.run(
        [EFFECTFLOW, "archive", "--before", FUTURE, "--to", str(out), "--db", url],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "audit key" in done.stderr
    assert ledgers.Raw(url).sql("SELECT count(*) FROM runs WHERE run_id = ?", ("kept",)) == [(1,)]
    assert not out.exists()


def test_a_head_exported_before_archiving_is_still_reached(
    archived: tuple[str, Path, dict[str, Any]], tmp_path: Path
) -> None:
    """A head exported before the archive verifies against the ledger after it (the archived runs
    are gone by right, the shards' chains still reach their exported heads), and a run deleted by
    hand since is still caught against it."""
    url, _, _ = archived
    head = str(tmp_path / "head.json")
    done = _cli(url, "audit", "verify", "--against", head)
    assert done.returncode == 0, done.stdout + done.stderr
    db = ledgers.Raw(url)
    db.unprotect()
    for table in ("attempts", "approvals", "operations", "effects", "steps", "runs", "audit",
                  "seals"):  # fmt: skip
        db.sql(f"DELETE FROM {table} WHERE run_id = ?", ("waits",))
    done = _cli(url, "audit", "verify", "--against", head)
    assert done.returncode == 4, done.stdout + done.stderr
    assert "run waits" in done.stderr
