"""Tamper evidence, attacked on copies of a real ledger on both backends: `effectflow audit verify`
reports every tampering with its own exit code (4), with and without the operator's key, and says
plainly what an unkeyed ledger cannot show."""

from __future__ import annotations

import contextlib
import json
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from typer.testing import CliRunner

import effectflow as ef
import ledgers
from effectflow import digests
from effectflow.cli import main as cli_main
from effectflow.ledger import audit

KEY = "k" * 32
SENT: list[str] = []


@ef.tool("tp_send", effect="external_write", idempotency=ef.Idempotency(supported=True),
         effect_id="id")  # fmt: skip
def send(to: str, *, idempotency_key: str) -> dict[str, str]:
    SENT.append(to)
    return {"id": f"msg-{to}"}


@ef.tool("tp_lost", effect="external_write", effect_id="id")
def lost(*, idempotency_key: str) -> dict[str, str]:
    raise ef.OutcomeUnknown("the answer was lost")


@ef.workflow("tp_case")
def case(ctx: ef.Context, to: str) -> list[Any]:
    return [ctx.call("first", send, to=to), ctx.call("second", send, to=to + "-copy")]


@ef.workflow("tp_doubt")
def doubt(ctx: ef.Context) -> Any:
    return ctx.call("lost", lost)


#: SQL on a ledger around the store, as an attacker with write access reaches it.
Ledger = ledgers.Raw


def _build(url: str) -> None:
    """Three runs: two finished with two effects each, one whose effect a person resolved."""
    with ef.Runtime(url) as rt:
        rt.start(case, run_id="keep", to="a")
        rt.start(case, run_id="victim", to="b")
        paused = rt.start(doubt, run_id="doubt")
        assert paused.status is ef.RunStatus.PAUSED
        [effect] = rt.effects(run_id="doubt")
        rt.resolve(effect.effect_id, committed=True, evidence={"id": "x-1"}, by="ops")


@pytest.fixture(params=["unkeyed", "keyed"])
def keyed(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    if request.param == "keyed":
        monkeypatch.setenv(audit.KEY_ENV, KEY)
    else:
        monkeypatch.delenv(audit.KEY_ENV, raising=False)
    return request.param == "keyed"


@pytest.fixture(params=ledgers.BACKENDS)
def original(request: pytest.FixtureRequest, tmp_path: Path, keyed: bool) -> Iterator[str]:
    with ledgers.fresh(request.param, tmp_path / "orig", prefix="ef_tamper") as url:
        (tmp_path / "orig").mkdir(exist_ok=True)
        _build(url)
        yield url


@contextlib.contextmanager
def _copy(original: str, tmp_path: Path) -> Iterator[Ledger]:
    if original.startswith("sqlite"):
        target = tmp_path / f"copy-{uuid.uuid4().hex[:6]}.db"
        shutil.copy(original.removeprefix("sqlite:///"), target)
        yield Ledger(f"sqlite:///{target}")
        return
    name = f"ef_tcopy_{uuid.uuid4().hex[:10]}"
    source = original.rsplit("/", 1)[1]
    with psycopg.connect(ledgers.PG, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{source}"')
    try:
        yield Ledger(ledgers.PG.rsplit("/", 1)[0] + "/" + name)
    finally:
        with psycopg.connect(ledgers.PG, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _verify(url: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli_main.app, ["audit", "verify", "--db", url, *args])
    return result.exit_code, result.output


# -- the tamperings --------------------------------------------------------------------------


def _edit_effect_status(db: Ledger) -> None:
    db.sql(
        "UPDATE effects SET status = 'not_committed' WHERE run_id = 'victim' AND step_id = 'first'"
    )


def _edit_step_output(db: Ledger) -> None:
    col = "output_json"
    value = '{"id": "msg-forged"}'
    if db.url.startswith("postgres"):
        db.sql(
            f"UPDATE steps SET {col} = ?::jsonb WHERE run_id = 'victim' AND step_id = 'second'",
            (value,),
        )
    else:
        db.sql(
            f"UPDATE steps SET {col} = ? WHERE run_id = 'victim' AND step_id = 'second'", (value,)
        )


def _edit_run_status(db: Ledger) -> None:
    db.sql("UPDATE runs SET status = 'failed' WHERE run_id = 'victim'")


def _insert_approval(db: Ledger) -> None:
    db.sql(
        "INSERT INTO approvals (approval_id, tenant, run_id, step_id, request_digest, approver, "
        "note, approved_at) VALUES ('APR-X', 'default', 'victim', 'first', 'sha256:x', 'mallory', "
        "NULL, 1.0)"
    )


def _cut_tail(db: Ledger) -> None:
    db.unprotect()
    [(seq, prev)] = db.sql(
        "SELECT seq, prev_hash FROM audit WHERE run_id = 'victim' ORDER BY seq DESC LIMIT 1"
    )
    db.sql("DELETE FROM audit WHERE seq = ?", (seq,))
    db.sql(
        "UPDATE runs SET audit_head = ?, audit_count = audit_count - 1 WHERE run_id = 'victim'",
        (prev,),
    )


def _rewrite_and_rehash(db: Ledger) -> None:
    """Rewrite an event's actor and recompute the whole chain — and the seals — with the public
    (unkeyed) hash functions, as someone who read this source would."""
    db.unprotect()
    rows = db.sql(
        "SELECT seq, step_id, effect_id, kind, actor, detail_json, at FROM audit "
        "WHERE run_id = 'victim' ORDER BY seq"
    )
    prev = audit.genesis("victim")
    for seq, step_id, effect_id, kind, actor, detail, at in rows:
        actor = "someone-else" if kind == "run_started" else actor
        detail = json.loads(detail) if isinstance(detail, str) else detail
        digest = audit.event_hash(prev, run_id="victim", step_id=step_id, effect_id=effect_id,
                                  kind=kind, actor=actor, detail=detail, at=at)  # fmt: skip
        db.sql("UPDATE audit SET actor = ?, prev_hash = ?, hash = ? WHERE seq = ?",
               (actor, prev, digest, seq))  # fmt: skip
        prev = digest
    db.sql("UPDATE runs SET audit_head = ? WHERE run_id = 'victim'", (prev,))
    seals = db.sql(
        "SELECT n, rows_json, audit_count, at FROM seals WHERE run_id = 'victim' ORDER BY n"
    )
    events = db.sql("SELECT hash FROM audit WHERE run_id = 'victim' ORDER BY seq")
    sprev = audit.seal_genesis("victim")
    for n, rows_json, count, at in seals:
        head = events[count - 1][0]
        digest = audit.seal_hash(sprev, run_id="victim", n=n, rows_json=rows_json,
                                 audit_head=head, audit_count=count, at=at)  # fmt: skip
        db.sql("UPDATE seals SET audit_head = ?, prev_hash = ?, hash = ? WHERE run_id = 'victim' "
               "AND n = ?", (head, sprev, digest, n))  # fmt: skip
        sprev = digest
    db.sql("UPDATE runs SET seal_head = ? WHERE run_id = 'victim'", (sprev,))
    _mend_shards(db)


def _mend_shards(db: Ledger, *, only: int | None = None) -> None:
    """Recompute every shard's chain (or one's) over the seals left, and the index, with the
    public (unkeyed) hash."""
    for shard in range(audit.SHARDS) if only is None else [only]:
        seals = db.sql("SELECT hash FROM seals WHERE shard = ? ORDER BY shard_seq", (shard,))
        head = audit.shard_genesis(shard)
        for seq, (seal_hash,) in enumerate(seals, 1):
            db.sql("UPDATE seals SET shard_seq = ? WHERE shard = ? AND hash = ?",
                   (-seq, shard, seal_hash))  # fmt: skip
            head = audit.shard_link(head, shard=shard, seq=seq, seal_hash=seal_hash, key=None)
        db.sql("UPDATE seals SET shard_seq = -shard_seq WHERE shard = ? AND shard_seq < 0",
               (shard,))  # fmt: skip
        db.sql("UPDATE audit_shards SET n = ?, head = ? WHERE shard = ?", (len(seals), head, shard))
    used = [shard for (shard,) in db.sql("SELECT shard FROM audit_shards WHERE n > 0 AND shard < ?",
                                         (audit.INDEX,))]  # fmt: skip
    db.sql("UPDATE audit_shards SET n = ?, head = ? WHERE shard = ?",
           (len(used), audit.index_head(used, None) if used else audit.index_genesis(),
            audit.INDEX))  # fmt: skip


def _delete_run(db: Ledger) -> None:
    db.unprotect()
    for table in ("audit", "seals", "attempts", "effects", "steps", "operations", "runs"):
        db.sql(f"DELETE FROM {table} WHERE run_id = 'victim'")


def _delete_run_and_mend_shards(db: Ledger) -> None:
    _delete_run(db)
    _mend_shards(db, only=audit.shard_of("victim"))


def _cut_run_with_its_seals(db: Ledger) -> None:
    """Cut the victim's newest write whole: its events, its seal, and the run's heads set back to
    the seal before, which is consistent within the run."""
    db.unprotect()
    [(n,)] = db.sql("SELECT seal_count FROM runs WHERE run_id = 'victim'")
    [(keep_count, keep_head, seal_head)] = db.sql(
        "SELECT audit_count, audit_head, hash FROM seals WHERE run_id = 'victim' AND n = ?",
        (n - 1,),
    )
    db.sql("DELETE FROM audit WHERE run_id = 'victim' AND seq IN (SELECT seq FROM audit WHERE "
           "run_id = 'victim' ORDER BY seq LIMIT -1 OFFSET ?)".replace(
               "LIMIT -1", "LIMIT 1000000"), (keep_count,))  # fmt: skip
    db.sql("DELETE FROM seals WHERE run_id = 'victim' AND n = ?", (n,))
    db.sql("UPDATE runs SET audit_count = ?, audit_head = ?, seal_count = ?, seal_head = ? "
           "WHERE run_id = 'victim'", (keep_count, keep_head, n - 1, seal_head))  # fmt: skip


TAMPERINGS: dict[str, tuple[Callable[[Ledger], None], str]] = {
    "effect_status": (_edit_effect_status, "effects:"),
    "step_output": (_edit_step_output, "steps:second differs"),
    "run_status": (_edit_run_status, "runs:victim differs"),
    "inserted_approval": (_insert_approval, "approvals:APR-X was written outside"),
    "cut_tail": (_cut_tail, "events were cut or added"),
}


def test_an_untouched_ledger_verifies(original: str, keyed: bool) -> None:
    code, out = _verify(original)
    assert code == 0, out
    assert "audit log intact" in out
    assert ("only accidental damage is detectable" in out) is not keyed


@pytest.mark.parametrize("keyed", ["keyed"], indirect=True)
def test_a_keyed_ledger_verified_without_its_key_says_the_keyed_hashes_went_unchecked(
    original: str, keyed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert keyed
    monkeypatch.delenv(audit.KEY_ENV)
    code, out = _verify(original)
    assert code == 0, out
    assert "this ledger is keyed" in out
    assert "no proof" in out
    assert "plain sha256" not in out


@pytest.mark.parametrize("name", sorted(TAMPERINGS))
def test_a_tampering_is_reported_with_its_own_exit_code(
    original: str, keyed: bool, tmp_path: Path, name: str
) -> None:
    tamper, says = TAMPERINGS[name]
    with _copy(original, tmp_path) as db:
        tamper(db)
        code, out = _verify(db.url)
    assert code == 4, out
    assert "run victim" in out
    assert says in out
    assert "run keep" not in out  # the untouched runs still verify


def test_a_chain_recomputed_with_the_public_hash_is_caught_only_with_the_key(
    original: str, keyed: bool, tmp_path: Path
) -> None:
    with _copy(original, tmp_path) as db:
        _rewrite_and_rehash(db)
        code, out = _verify(db.url)
    if keyed:
        assert code == 4, out
        assert "written without the audit key" in out
    else:
        # Honest: without a key anyone can recompute the chains, and verify says it cannot tell.
        assert code == 0, out
        assert "only accidental damage is detectable" in out


def test_a_deleted_run_is_caught_inside_the_ledger(
    original: str, keyed: bool, tmp_path: Path
) -> None:
    """Deleted whole, its seals too: the shard chain its seals were links of has a gap."""
    with _copy(original, tmp_path) as db:
        _delete_run(db)
        code, out = _verify(db.url)
    assert code == 4, out
    assert f"shard {audit.shard_of('victim')}:" in out
    assert "seals were removed" in out


def test_a_run_cut_with_its_seals_is_caught_inside_the_ledger(
    original: str, keyed: bool, tmp_path: Path
) -> None:
    with _copy(original, tmp_path) as db:
        _cut_run_with_its_seals(db)
        code, out = _verify(db.url)
    assert code == 4, out
    assert f"shard {audit.shard_of('victim')}:" in out


def test_a_deleted_run_with_the_shards_recomputed_is_caught_only_with_the_key(
    original: str, keyed: bool, tmp_path: Path
) -> None:
    with _copy(original, tmp_path) as db:
        _delete_run_and_mend_shards(db)
        code, out = _verify(db.url)
    if keyed:
        assert code == 4, out
        # emptied: only the index tells it from a shard never used; else its mended chain
        assert f"shard {audit.INDEX}:" in out or f"shard {audit.shard_of('victim')}:" in out
    else:
        assert code == 0, out  # honest: without a key anyone can recompute the shards too
        assert "only accidental damage is detectable" in out


def test_a_deleted_run_is_caught_against_an_exported_head(
    original: str, keyed: bool, tmp_path: Path
) -> None:
    head_file = tmp_path / "head.json"
    exported = CliRunner().invoke(
        cli_main.app, ["audit", "head", "--db", original, "--out", str(head_file)]
    )
    assert exported.exit_code == 0, exported.output
    head = json.loads(head_file.read_text())
    assert sorted(r["run_id"] for r in head["runs"]) == ["doubt", "keep", "victim"]
    assert len(head["shards"]) == audit.SHARDS
    assert (head["key_id"] is not None) is keyed
    assert _verify(original, "--against", str(head_file))[0] == 0
    with _copy(original, tmp_path) as db:
        _delete_run_and_mend_shards(db)
        against = _verify(db.url, "--against", str(head_file))
    assert against[0] == 4, against[1]
    assert "run victim" in against[1]
    assert "gone (deleted)" in against[1]
    assert f"shard {audit.shard_of('victim')}:" in against[1]
    forged = {**head, "runs": [r for r in head["runs"] if r["run_id"] != "victim"]}
    head_file.write_text(json.dumps(forged))
    code, out = _verify(original, "--against", str(head_file))
    assert code == 4
    assert "signature does not match" in out


def test_a_rollback_to_an_observed_state_is_caught_only_against_an_exported_head(
    original: str, keyed: bool, tmp_path: Path
) -> None:
    """Someone who watched the ledger and kept its shard rows can put them back after deleting
    the runs written since: consistent again, keyed or not (what no hash inside one database can
    show). A head exported in between, kept elsewhere, catches it."""
    head_file = tmp_path / "head.json"
    with _copy(original, tmp_path) as db:
        observed = db.sql("SELECT shard, n, head FROM audit_shards")
        with ef.Runtime(db.url) as rt:
            rt.start(case, run_id="late", to="c")
        assert _verify(db.url)[0] == 0
        exported = CliRunner().invoke(
            cli_main.app, ["audit", "head", "--db", db.url, "--out", str(head_file)]
        )
        assert exported.exit_code == 0, exported.output
        db.unprotect()
        for table in ("audit", "seals", "attempts", "effects", "steps", "operations", "runs"):
            db.sql(f"DELETE FROM {table} WHERE run_id = 'late'")
        for shard, n, head in observed:
            db.sql("UPDATE audit_shards SET n = ?, head = ? WHERE shard = ?", (n, head, shard))
        alone = _verify(db.url)
        against = _verify(db.url, "--against", str(head_file))
    assert alone[0] == 0, alone[1]
    assert against[0] == 4, against[1]
    assert "run late" in against[1]
    assert f"shard {audit.shard_of('late')}:" in against[1]


def test_a_ledger_that_cannot_be_read_is_not_called_tampered(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.db"
    bogus.write_text("not a ledger")
    code, out = _verify(f"sqlite:///{bogus}")
    assert code == 2
    assert "not an SQLite database" in out


def test_seal_digests_are_the_rows_as_both_backends_give_them_back() -> None:
    """A whole REAL comes back from SQLite as an int: the digest must not tell them apart."""
    from effectflow.ledger.records import NextAction, RunRecord, RunStatus

    def run(at: float) -> RunRecord:
        return RunRecord("r", "t", "w", "1", {"n": 1}, "sha256:x", RunStatus.RUNNING, None, None,
                         NextAction.EXECUTE, 0, at, at)  # fmt: skip

    assert audit.row_digest("runs", run(1700000000)) == audit.row_digest("runs", run(1.7e9))
    assert digests.canonical_json({"n": 1}) != digests.canonical_json({"n": 1.0})  # JSON keeps it


@pytest.mark.parametrize("backend", ledgers.BACKENDS)
def test_concurrent_writers_chain_every_seal_into_its_shard(tmp_path: Path, backend: str) -> None:
    """Real threads, some sharing a runtime (group commits of many runs' batches, shards locked
    in one order) and some with runtimes of their own (separate connections): no deadlock, every
    seal has its place in its shard's chain, and the ledger verifies."""
    import threading

    with ledgers.fresh(backend, tmp_path, prefix="ef_shards") as url:
        shared = ef.Runtime(url)
        own = [ef.Runtime(url) for _ in range(3)]
        failures: list[BaseException] = []

        def work(rt: ef.Runtime, name: str) -> None:
            try:
                for i in range(8):
                    rt.start(case, run_id=f"{name}-{i}", to=f"{name}{i}")
            except BaseException as exc:  # reported below, with the thread's name
                failures.append(exc)

        threads = [threading.Thread(target=work, args=(shared, f"s{t}")) for t in range(4)]
        threads += [threading.Thread(target=work, args=(rt, f"o{t}")) for t, rt in enumerate(own)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not failures, failures
        assert shared.store.verify_audit() == []
        db = Ledger(url)
        [(sealed, chained)] = db.sql("SELECT count(*), count(shard_seq) FROM seals")
        [(total,)] = db.sql("SELECT sum(n) FROM audit_shards WHERE shard < ?", (audit.INDEX,))
        assert sealed == chained == total > 7 * 8
        for rt in (shared, *own):
            rt.close()
        code, out = _verify(url)
        assert code == 0, out


@pytest.mark.parametrize("backend", ledgers.BACKENDS)
def test_verify_on_a_live_ledger_reads_one_moment(tmp_path: Path, backend: str) -> None:
    """While a writer keeps sealing, verify (from a process's own store, as the CLI does) reads
    every run's row, its seals and the shards as of one moment: no finding is a write that
    landed between two of its reads."""
    import threading

    with ledgers.fresh(backend, tmp_path, prefix="ef_live") as url:
        stop = threading.Event()
        written: list[int] = []

        def write() -> None:
            with ef.Runtime(url) as rt:
                while not stop.is_set():
                    rt.start(case, run_id=f"live-{len(written)}", to="x")
                    written.append(1)

        writer = threading.Thread(target=write)
        writer.start()
        verified = 0
        try:
            deadline = time.monotonic() + 30
            while not written and time.monotonic() < deadline:
                time.sleep(0.01)  # the writer's runtime creates the ledger first
            while verified < 4 or len(written) < 12:
                code, out = _verify(url)
                assert code == 0, out
                verified += 1
                assert verified < 500, "the writer did not write"
        finally:
            stop.set()
            writer.join(timeout=60)


def test_two_stores_of_one_sqlite_file_take_turns_in_one_shard(tmp_path: Path) -> None:
    """A store remembers each shard's head from its own last commit; when another process moved
    the shard since, its confirming UPDATE finds another length, and it reads the shard and
    chains anew: the chain stays whole."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ids = [f"turn-{i}" for i in range(400) if audit.shard_of(f"turn-{i}") == 7][:6]
    assert len(ids) == 6
    with ef.Runtime(url) as one, ef.Runtime(url) as two:
        for i, run_id in enumerate(ids):
            (one if i % 2 == 0 else two).start(case, run_id=run_id, to=run_id)
        assert one.store.verify_audit() == []
    [(n,)] = Ledger(url).sql("SELECT n FROM audit_shards WHERE shard = 7")
    [(sealed,)] = Ledger(url).sql("SELECT count(*) FROM seals WHERE shard = 7")
    assert n == sealed > 6
