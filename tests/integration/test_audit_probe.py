"""Adversarial probes of the ledger's tamper evidence (seals, shard chains, the index row, exported
heads), on real ledgers of both backends, driven through `effectflow audit verify` as a person
would. Each attempt is a test asserting the claim. Seven broke when first run (a malformed head
file, `verify --run` of a cut or deleted run, a live binding deleted, a back-dated unsealed run,
orphan bindings, SQLite's remembered shard head after a rollback); each was fixed, and its test
now guards it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import effectflow as ef
import ledgers
from effectflow.cli import main as cli_main
from effectflow.ledger import audit

KEY = "probe-key-" + "p" * 22
OTHER_KEY = "other-key-" + "o" * 22
SRC = str(Path(__file__).resolve().parents[2] / "src")


@ef.tool("ap_send", effect="external_write", idempotency=ef.Idempotency(supported=True),
         effect_id="id")  # fmt: skip
def send(to: str, *, idempotency_key: str) -> dict[str, str]:
    return {"id": f"msg-{to}"}


@ef.tool("ap_odd", effect="external_write", idempotency=ef.Idempotency(supported=True),
         effect_id="id")  # fmt: skip
def odd(size: int, *, idempotency_key: str) -> dict[str, Any]:
    return {
        "id": f"odd-{size}",
        "floats": [0.1 + 0.2, 1e16, -0.0, 5e-324, 1.7976931348623157e308, 1e-7, 123456789.125],
        "ints": [2**63 - 1, -(2**63), 0],
        "text": "日本語 ü \u0007 \u2028 \U0001f600 \\ \" ' end",
        "keys": {"é": 1, "e\u0301": 2, "": 3, "Z": 4, "a": 5},
        "big": "x" * size,
    }


@ef.workflow("ap_case")
def case(ctx: ef.Context, to: str) -> list[Any]:
    return [ctx.call("first", send, to=to), ctx.call("second", send, to=to + "-copy")]


@ef.workflow("ap_odd_case")
def odd_case(ctx: ef.Context, size: int) -> Any:
    return ctx.call("odd", odd, size=size)


class Ledger(ledgers.Raw):
    """SQL on one ledger, whatever its backend (the attacker's view: no key, full write access)."""

    def seal(self, run_id: str, n: int | None = None) -> dict[str, Any]:
        """One seal row of a run (its last by default), as a dict."""
        cols = ("run_id", "n", "rows_json", "audit_head", "audit_count", "at", "prev_hash",
                "hash", "shard", "shard_seq")  # fmt: skip
        where = "ORDER BY n DESC LIMIT 1" if n is None else f"AND n = {int(n)}"
        [row] = self.sql(f"SELECT {', '.join(cols)} FROM seals WHERE run_id = ? {where}", (run_id,))
        return dict(zip(cols, row, strict=True))


def _cli(*args: str) -> tuple[int, str, BaseException | None]:
    result = CliRunner().invoke(cli_main.app, list(args))
    exc = None if isinstance(result.exception, SystemExit) else result.exception
    return result.exit_code, result.output, exc


def _verify(url: str, *args: str) -> tuple[int, str]:
    code, out, exc = _cli("audit", "verify", "--db", url, *args)
    assert exc is None, f"verify crashed: {exc!r}\n{out}"
    return code, out


def _head(url: str, path: Path) -> dict[str, Any]:
    code, out, exc = _cli("audit", "head", "--db", url, "--out", str(path))
    assert (code, exc) == (0, None), out
    return json.loads(path.read_text())


def _ids_in_shard(shard: int, count: int, prefix: str) -> list[str]:
    found = [f"{prefix}-{i}" for i in range(5000) if audit.shard_of(f"{prefix}-{i}") == shard]
    return found[:count]


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(audit.KEY_ENV, KEY)
    monkeypatch.delenv(audit.KEY_FILE_ENV, raising=False)
    return KEY


@pytest.fixture(params=ledgers.BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def built(backend: str, tmp_path: Path, key: str) -> Iterator[Ledger]:
    """A keyed ledger with three finished runs (two effects each), in three different shards."""
    with ledgers.fresh(backend, tmp_path, prefix="ef_aprobe") as url:
        with ef.Runtime(url) as rt:
            for rid, to in (("keep", "a"), ("victim", "b"), ("other", "c")):
                rt.start(case, run_id=rid, to=to)
        assert len({audit.shard_of(r) for r in ("keep", "victim", "other")}) == 3
        yield Ledger(url)


def _tampered(db: Ledger, *says: str) -> str:
    code, out = _verify(db.url)
    assert code == 4, out
    assert "audit log intact" not in out
    for text in says:
        assert text in out, out
    return out


# -- a baseline ---------------------------------------------------------------------------------


def test_an_honest_keyed_ledger_verifies(built: Ledger) -> None:
    """The ledger the attacks start from verifies intact with the key, exit 0."""
    code, out = _verify(built.url)
    assert code == 0, out
    assert "audit log intact" in out


# -- seals moved, copied, edited ----------------------------------------------------------------


def test_two_runs_swapping_their_shard_positions_is_caught(built: Ledger) -> None:
    """Swapping the (shard, shard_seq) of two runs' last seals leaves each in another run's
    shard."""
    built.unprotect()
    a, b = built.seal("victim"), built.seal("keep")
    built.sql("UPDATE seals SET shard = ?, shard_seq = ? WHERE run_id = 'victim' AND n = ?",
              (b["shard"], b["shard_seq"], a["n"]))  # fmt: skip
    built.sql("UPDATE seals SET shard = ?, shard_seq = ? WHERE run_id = 'keep' AND n = ?",
              (a["shard"], a["shard_seq"], b["n"]))  # fmt: skip
    _tampered(built, "in another run's shard")


def test_a_seal_moved_to_another_shard_is_caught(built: Ledger) -> None:
    """A seal taken out of its shard's chain and appended to another's (both n moved to match)."""
    built.unprotect()
    s = built.seal("victim")
    target = (s["shard"] + 1) % audit.SHARDS
    [(n,)] = built.sql("SELECT n FROM audit_shards WHERE shard = ?", (target,))
    built.sql("UPDATE seals SET shard = ?, shard_seq = ? WHERE run_id = 'victim' AND n = ?",
              (target, n + 1, s["n"]))  # fmt: skip
    built.sql("UPDATE audit_shards SET n = n - 1 WHERE shard = ?", (s["shard"],))
    built.sql("UPDATE audit_shards SET n = n + 1 WHERE shard = ?", (target,))
    _tampered(built, "in another run's shard")


def test_a_seal_duplicated_at_the_same_shard_seq_is_caught(built: Ledger) -> None:
    """A copy of the victim's last seal as its next one, at the same place in the shard."""
    s = built.seal("victim")
    built.sql(audit.INSERT_SEAL, (s["run_id"], s["n"] + 1, s["rows_json"], s["audit_head"],
              s["audit_count"], s["at"], s["hash"], s["hash"], s["shard"], s["shard_seq"]))  # fmt: skip
    _tampered(built, "run victim")


@pytest.mark.parametrize("delta", [1, -1])
def test_a_shard_length_moved_either_way_is_caught(built: Ledger, delta: int) -> None:
    """A shard's recorded n one more or one less than its chain."""
    shard = audit.shard_of("victim")
    built.sql("UPDATE audit_shards SET n = n + ? WHERE shard = ?", (delta, shard))
    _tampered(built, f"shard {shard}:")


def test_a_seal_time_changed_is_caught(built: Ledger) -> None:
    """A seal's ``at`` moved (say, back before the shards existed): its keyed hash no longer
    matches."""
    built.unprotect()
    built.sql("UPDATE seals SET at = 1.0 WHERE run_id = 'victim' AND n = 1")
    _tampered(built, "seal 1 does not match its keyed hash")


def test_a_row_key_dropped_from_a_seal_is_caught(built: Ledger) -> None:
    """``rows_json`` edited to forget the effect it sealed: the keyed hash no longer matches."""
    built.unprotect()
    for n in range(1, built.seal("victim")["n"] + 1):
        s = built.seal("victim", n)
        rows = json.loads(s["rows_json"])
        gone = {k: v for k, v in rows.items() if not k.startswith("effects:")}
        if gone != rows:
            built.sql("UPDATE seals SET rows_json = ? WHERE run_id = 'victim' AND n = ?",
                      (json.dumps(gone, sort_keys=True, separators=(",", ":")), n))  # fmt: skip
    _tampered(built, "does not match its keyed hash")


def test_a_forged_run_with_unkeyed_seals_in_an_unused_shard_is_caught(built: Ledger) -> None:
    """A new run with seals and a shard chain computed with the public hash, in a shard no run
    used (the index moved too, unkeyed): every piece says it was written without the key."""
    used = {audit.shard_of(r) for r in ("keep", "victim", "other")}
    shard = next(s for s in range(audit.SHARDS) if s not in used)
    [rid] = _ids_in_shard(shard, 1, "forged")
    built.sql(
        "INSERT INTO runs (run_id, tenant, workflow, workflow_version, input_json, input_digest, "
        "status, output_json, error_json, next_action, generation, created_at, updated_at, "
        "audit_head, audit_count, seal_head, seal_count) SELECT ?, tenant, workflow, "
        "workflow_version, input_json, input_digest, status, output_json, error_json, "
        "next_action, generation, created_at, updated_at, ?, 0, NULL, 0 FROM runs "
        "WHERE run_id = 'keep'",
        (rid, audit.genesis(rid)),
    )
    rows = json.dumps({f"runs:{rid}": "0" * 32}, separators=(",", ":"))
    at = time.time()
    prev = audit.seal_genesis(rid)
    digest = audit.seal_hash(prev, run_id=rid, n=1, rows_json=rows, audit_head=audit.genesis(rid),
                             audit_count=0, at=at)  # fmt: skip
    built.sql(audit.INSERT_SEAL, (rid, 1, rows, audit.genesis(rid), 0, at, prev, digest, shard, 1))
    head = audit.shard_link(audit.shard_genesis(shard), shard=shard, seq=1, seal_hash=digest,
                            key=None)  # fmt: skip
    built.sql("UPDATE audit_shards SET n = 1, head = ? WHERE shard = ?", (head, shard))
    built.sql("UPDATE audit_shards SET n = ?, head = ? WHERE shard = ?",
              (len(used) + 1, audit.index_head(used | {shard}, None), audit.INDEX))  # fmt: skip
    built.sql("UPDATE runs SET seal_head = ?, seal_count = 1 WHERE run_id = ?", (digest, rid))
    _tampered(built, "written without the audit key")


def test_a_keyed_shard_extended_with_an_unkeyed_seal_is_caught(built: Ledger) -> None:
    """The shard chain's link for an unkeyed seal is computable without the key, so an attacker
    can append a forged unkeyed seal to a used shard and mend its head: the seal itself gives it
    away."""
    s = built.seal("victim")
    rows = s["rows_json"]
    digest = audit.seal_hash(s["hash"], run_id="victim", n=s["n"] + 1, rows_json=rows,
                             audit_head=s["audit_head"], audit_count=s["audit_count"],
                             at=s["at"] + 1)  # fmt: skip
    [(n, head)] = built.sql("SELECT n, head FROM audit_shards WHERE shard = ?", (s["shard"],))
    built.sql(audit.INSERT_SEAL, ("victim", s["n"] + 1, rows, s["audit_head"], s["audit_count"],
              s["at"] + 1, s["hash"], digest, s["shard"], n + 1))  # fmt: skip
    mended = audit.shard_link(head, shard=s["shard"], seq=n + 1, seal_hash=digest, key=None)
    built.sql(
        "UPDATE audit_shards SET n = ?, head = ? WHERE shard = ?", (n + 1, mended, s["shard"])
    )
    built.sql("UPDATE runs SET seal_head = ?, seal_count = ? WHERE run_id = 'victim'",
              (digest, s["n"] + 1))  # fmt: skip
    _tampered(built, "written without the audit key")


# -- the shard rows themselves --------------------------------------------------------------------


def test_the_index_row_deleted_is_caught(built: Ledger) -> None:
    """Shard 64, the index of used shards, deleted."""
    built.sql("DELETE FROM audit_shards WHERE shard = ?", (audit.INDEX,))
    _tampered(built, "index row is gone")


def test_a_keyed_index_replaced_by_an_unkeyed_one_is_caught(built: Ledger) -> None:
    """The index head recomputed with the public hash over the used shards."""
    used = [s for (s,) in built.sql("SELECT shard FROM audit_shards WHERE n > 0 AND shard < 64")]
    built.sql("UPDATE audit_shards SET head = ? WHERE shard = ?",
              (audit.index_head(used, None), audit.INDEX))  # fmt: skip
    _tampered(built, "index was written without the audit key")


def test_audit_shards_truncated_is_caught_and_stops_writes(built: Ledger) -> None:
    """Every shard row deleted: verify reports every head gone, and the next write refuses rather
    than restart a chain."""
    built.sql("DELETE FROM audit_shards")
    _tampered(built, "head row is gone", "index row is gone")
    with ef.Runtime(built.url) as rt, pytest.raises(ef.EffectflowError, match="no head row"):
        rt.start(case, run_id="after", to="z")


def test_an_emptied_shard_with_a_watched_index_is_caught_against_a_head(
    built: Ledger, tmp_path: Path
) -> None:
    """A run alone in its shard deleted with its seals, the shard reset to genesis and the index
    put back to a head watched before that shard was first used: consistent in the ledger (a
    partial rollback the attacker watched), caught by a head exported after the run."""
    [watched] = built.sql("SELECT n, head FROM audit_shards WHERE shard = ?", (audit.INDEX,))
    used = {audit.shard_of(r) for r in ("keep", "victim", "other")}
    shard = next(s for s in range(audit.SHARDS) if s not in used)
    [rid] = _ids_in_shard(shard, 1, "late")
    with ef.Runtime(built.url) as rt:
        rt.start(case, run_id=rid, to="l")
    head = tmp_path / "head.json"
    _head(built.url, head)
    built.unprotect()
    for table in ("audit", "seals", "attempts", "effects", "steps", "operations", "runs"):
        built.sql(f"DELETE FROM {table} WHERE run_id = ?", (rid,))
    built.sql("UPDATE audit_shards SET n = 0, head = ? WHERE shard = ?",
              (audit.shard_genesis(shard), shard))  # fmt: skip
    built.sql("UPDATE audit_shards SET n = ?, head = ? WHERE shard = ?", (*watched, audit.INDEX))
    assert _verify(built.url)[0] == 0  # what no hash inside the ledger can show
    code, out = _verify(built.url, "--against", str(head))
    assert code == 4, out
    assert f"run {rid}" in out, out
    assert f"shard {shard}:" in out, out


# -- keys ---------------------------------------------------------------------------------------


def test_a_wrong_key_is_reported_as_tampering(
    built: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Verified with another key, every keyed hash mismatches: exit 4 (the ledger records no key
    id, so it cannot say "wrong key" instead)."""
    monkeypatch.setenv(audit.KEY_ENV, OTHER_KEY)
    code, out = _verify(built.url)
    assert code == 4, out
    assert "does not match its keyed hash" in out


def test_a_keyed_ledger_verified_without_the_key_says_so(
    built: Ledger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the key, a keyed ledger's hashes cannot be checked: exit 0, saying that the keyed
    hashes went unchecked and this is no proof (a tampering with them goes unseen)."""
    monkeypatch.delenv(audit.KEY_ENV)
    built.unprotect()
    built.sql("UPDATE seals SET at = 1.0 WHERE run_id = 'victim' AND n = 1")
    code, out = _verify(built.url)
    assert code == 0, out
    assert "this ledger is keyed" in out
    assert "no proof" in out


def test_a_ledger_keyed_part_way_says_what_was_written_without_the_key(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Written first without a key, then with one (an operator turning the key on): with the key,
    verify reports the earlier writes as written without it (it cannot tell them from forgeries),
    and only that; without the key it is intact."""
    monkeypatch.delenv(audit.KEY_ENV, raising=False)
    with ledgers.fresh(backend, tmp_path, prefix="ef_aprobe") as url:
        with ef.Runtime(url) as rt:
            rt.start(case, run_id="early", to="e")
        monkeypatch.setenv(audit.KEY_ENV, KEY)
        with ef.Runtime(url) as rt:
            rt.start(case, run_id="late", to="l")
            [shard] = _ids_in_shard(audit.shard_of("early"), 1, "same")[:1]
            rt.start(case, run_id=shard, to="s")  # a keyed seal after unkeyed ones in one shard
        code, out = _verify(url)
        assert code == 4, out
        lines = [ln for ln in out.splitlines() if ln.startswith(("run ", "shard "))]
        assert lines, out
        assert all("without the audit key" in ln for ln in lines), out
        assert not any(ln.startswith(("run late", f"run {shard}")) for ln in lines), out
        monkeypatch.delenv(audit.KEY_ENV)
        assert _verify(url)[0] == 0


# -- exported heads -----------------------------------------------------------------------------


def test_a_head_of_another_ledger_is_not_reached(
    built: Ledger, backend: str, tmp_path: Path
) -> None:
    """A head exported from another ledger (same key): its runs are gone from this one."""
    with ledgers.fresh(backend, tmp_path / "b", prefix="ef_aprobe") as other:
        (tmp_path / "b").mkdir(exist_ok=True)
        with ef.Runtime(other) as rt:
            rt.start(case, run_id="elsewhere", to="q")
        head = tmp_path / "other.json"
        _head(other, head)
    code, out = _verify(built.url, "--against", str(head))
    assert code == 4, out
    assert "run elsewhere" in out


def test_an_edited_head_is_caught(built: Ledger, tmp_path: Path) -> None:
    """A head whose shard count was lowered (to hide a later cut) fails its signature."""
    path = tmp_path / "head.json"
    head = _head(built.url, path)
    assert _verify(built.url, "--against", str(path))[0] == 0
    head["shards"][audit.shard_of("victim")]["n"] -= 1
    path.write_text(json.dumps(head))
    code, out = _verify(built.url, "--against", str(path))
    assert code == 4, out
    assert "signature does not match" in out


def test_an_unkeyed_head_against_a_keyed_ledger_is_caught(
    built: Ledger, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A head exported without the key (by the attacker, after a rollback) fails the signature
    check of a keyed verify."""
    monkeypatch.delenv(audit.KEY_ENV)
    path = tmp_path / "head.json"
    _head(built.url, path)
    monkeypatch.setenv(audit.KEY_ENV, KEY)
    code, out = _verify(built.url, "--against", str(path))
    assert code == 4, out
    assert "signature does not match" in out


@pytest.mark.parametrize("body", [
    "[]",
    '{"format": "effectflow-audit-head/1", "runs": [{}]}',
    '{"format": "effectflow-audit-head/1", "shards": [{"shard": 1, "n": "x"}]}',
])  # fmt: skip
def test_a_malformed_head_file_is_unreadable_not_a_crash(
    built: Ledger, tmp_path: Path, body: str
) -> None:
    """A head file that is JSON but not a head: exit 2 (cannot be read), no traceback."""
    path = tmp_path / "head.json"
    path.write_text(body)
    code, out, exc = _cli("audit", "verify", "--db", built.url, "--against", str(path))
    assert exc is None, repr(exc)
    assert code == 2, out


# -- verify --run -------------------------------------------------------------------------------


def _cut_newest_write(db: Ledger, rid: str) -> None:
    """Cut a run's newest write whole (its events, its seal) and set its heads back one seal."""
    db.unprotect()
    [(n,)] = db.sql("SELECT seal_count FROM runs WHERE run_id = ?", (rid,))
    keep = db.seal(rid, n - 1)
    db.sql("DELETE FROM audit WHERE run_id = ? AND seq IN (SELECT seq FROM audit WHERE run_id = ? "
           "ORDER BY seq LIMIT 1000000 OFFSET ?)", (rid, rid, keep["audit_count"]))  # fmt: skip
    db.sql("DELETE FROM seals WHERE run_id = ? AND n = ?", (rid, n))
    db.sql("UPDATE runs SET audit_count = ?, audit_head = ?, seal_count = ?, seal_head = ? "
           "WHERE run_id = ?", (keep["audit_count"], keep["audit_head"], n - 1, keep["hash"],
                                rid))  # fmt: skip
    _unfinish(db, rid, json.loads(keep["rows_json"])[f"runs:{rid}"])


def _unfinish(db: Ledger, rid: str, sealed: str) -> None:
    """Put the run row back to the state its remaining last seal digests: row digests are plain
    sha256, so the earlier state is guessed and confirmed offline, without the key."""
    cols = ", ".join(audit.RUN_STATE).replace("output", "output_json").replace(
        "error", "error_json").replace("control", "control_json")  # fmt: skip
    [row] = db.sql(f"SELECT {cols} FROM runs WHERE run_id = ?", (rid,))
    now = dict(zip(audit.RUN_STATE, row, strict=True))
    for status in ef.RunStatus:
        for action in ("none", *(a.value for a in ef.NextAction)):
            for output in (now["output"], None):
                state = {**now, "status": status.value, "next_action": action, "output": output}
                if audit.run_state_digest(state) == sealed:
                    db.sql("UPDATE runs SET status = ?, next_action = ?, output_json = ? "
                           "WHERE run_id = ?", (status.value, action, output, rid))  # fmt: skip
                    return
    raise AssertionError("the earlier run state was not guessed")


def test_a_cut_run_is_caught_by_a_whole_verify(built: Ledger) -> None:
    """The cut leaves a gap at the end of the victim's shard chain."""
    _cut_newest_write(built, "victim")
    _tampered(built, f"shard {audit.shard_of('victim')}:")


def test_verify_of_one_cut_run_is_not_intact(built: Ledger) -> None:
    """Verifying the very run that was cut must not call it intact."""
    _cut_newest_write(built, "victim")
    code, out = _verify(built.url, "--run", "victim")
    assert code == 4, out


def test_verify_of_a_deleted_run_is_not_intact(built: Ledger) -> None:
    """A run that is not in the ledger cannot be verified intact."""
    built.unprotect()
    for table in ("audit", "seals", "attempts", "effects", "steps", "operations", "runs"):
        built.sql(f"DELETE FROM {table} WHERE run_id = 'victim'")
    assert _verify(built.url)[0] == 4  # the whole verify sees the shard's gap
    code, out = _verify(built.url, "--run", "victim")
    assert code != 0, out
    assert "audit log intact" not in out


def test_verify_of_an_untouched_run_beside_a_tampered_shard_is_intact(built: Ledger) -> None:
    """``--run keep`` reads only that run: another shard's damage is not its finding."""
    built.sql("UPDATE audit_shards SET n = n + 1 WHERE shard = ?", (audit.shard_of("victim"),))
    assert _verify(built.url, "--run", "keep")[0] == 0


# -- rows no seal covers ------------------------------------------------------------------------


def test_a_live_binding_deleted_is_caught(built: Ledger) -> None:
    """Deleting a binding within its retention removes the guard against a second request under
    that operation id: verify must call it deleted."""
    [(expires,)] = built.sql("SELECT min(key_expires_at) FROM operations WHERE run_id = 'victim'")
    assert expires > time.time() + 3600  # far from purgeable
    built.sql("DELETE FROM operations WHERE run_id = 'victim'")
    _tampered(built, "run victim")


def test_a_live_binding_deleted_with_a_forged_purge_record_is_caught(built: Ledger) -> None:
    """The record a purge leaves is hashed with the key: one written by hand does not excuse the
    deletion (and is itself reported)."""
    rows = built.sql(
        "SELECT tenant, logical_operation_id, run_id FROM operations WHERE run_id = 'victim'"
    )
    built.sql("DELETE FROM operations WHERE run_id = 'victim'")
    for tenant, op, run in rows:
        digest = audit.purge_hash(tenant, op, run, 1.0, 2.0, key=None)  # the public hash
        built.sql(
            "INSERT INTO purged_keys (tenant, logical_operation_id, run_id, key_expires_at, "
            "purged_at, hash) VALUES (?, ?, ?, 1.0, 2.0, ?)",
            (tenant, op, run, digest),
        )
    _tampered(built, "run victim")


def test_a_purge_of_expired_bindings_still_verifies(backend: str, tmp_path: Path, key: str) -> None:
    """The legitimate removal, ``purge_expired_keys`` past retention, is no finding."""
    with ledgers.fresh(backend, tmp_path, prefix="ef_aprobe") as url:
        with ef.Runtime(url) as rt:
            rt.start(case, run_id="old", to="o")
            assert rt.store.purge_expired_keys(now=time.time() + 10 * 365 * 86400) >= 1
        assert Ledger(url).sql("SELECT count(*) FROM operations")[0][0] == 0
        code, out = _verify(url)
        assert code == 0, out


def test_a_back_dated_unsealed_run_is_caught(built: Ledger) -> None:
    """A run that claims to predate the seals, in a ledger that was sealed from its first run."""
    built.sql(
        "INSERT INTO runs (run_id, tenant, workflow, workflow_version, input_json, input_digest, "
        "status, output_json, error_json, next_action, generation, created_at, updated_at, "
        "audit_head, audit_count, seal_head, seal_count) SELECT 'forged', tenant, workflow, "
        "workflow_version, input_json, input_digest, status, output_json, error_json, "
        "next_action, generation, 1000.0, 1000.0, ?, 0, NULL, 0 FROM runs WHERE run_id = 'keep'",
        (audit.genesis("forged"),),
    )
    cols = [r[1] for r in built.sql("PRAGMA table_info(effects)")] if not built.pg else [
        r[0] for r in built.sql("SELECT column_name FROM information_schema.columns "
                                "WHERE table_name = 'effects' ORDER BY ordinal_position")
    ]  # fmt: skip
    cols = [c for c in cols if c != "insert_seq"]
    values = ", ".join("'forged'" if c == "run_id" else ("'EFF-FORGED'" if c == "effect_id" else c)
                       for c in cols)  # fmt: skip
    built.sql(f"INSERT INTO effects ({', '.join(cols)}) SELECT {values} FROM effects "
              "WHERE run_id = 'keep' LIMIT 1")  # fmt: skip
    _tampered(built, "run forged")


def test_a_binding_of_a_run_that_does_not_exist_is_caught(built: Ledger) -> None:
    """A binding planted for a run id not in the ledger (to hijack a later call's operation id)."""
    built.sql(
        "INSERT INTO operations (tenant, logical_operation_id, idempotency_key, request_digest, "
        "tool, run_id, step_id, created_at, key_expires_at) VALUES ('default', 'op-future', "
        "'key-planted', 'sha256:x', 'ap_send@1', 'ghost', 'first', 1.0, 9e9)"
    )
    _tampered(built, "ghost")


# -- honest ledgers under load, crashes, odd values -----------------------------------------------


def test_odd_values_verify(backend: str, tmp_path: Path, key: str) -> None:
    """Floats at their edges, 64-bit ints, unicode (combining marks, emoji, control and line
    separators), a 900 kB output, and a 2 MB one refused as not recordable: their seals match."""
    with ledgers.fresh(backend, tmp_path, prefix="ef_aprobe") as url:
        with ef.Runtime(url) as rt:
            for size in (0, 900_000):
                done = rt.start(odd_case, run_id=f"odd-{size}", size=size)
                assert done.status is ef.RunStatus.SUCCEEDED, done
            # over the 1 MB limit: the run fails with the effect confirmed by a digest
            done = rt.start(odd_case, run_id="odd-huge", size=2_000_000)
            assert done.status is ef.RunStatus.FAILED
            assert done.error is not None
            assert done.error["code"] == "result_not_recordable"
        code, out = _verify(url)
        assert code == 0, out


def test_many_writers_on_postgres_verify(tmp_path: Path, key: str) -> None:
    """Threads sharing one runtime (group commits across shards) and threads with runtimes of
    their own, on PostgreSQL: no deadlock, and the ledger verifies."""
    with ledgers.fresh("postgres", tmp_path, prefix="ef_aprobe") as url:
        shared = ef.Runtime(url)
        own = [ef.Runtime(url) for _ in range(2)]
        failures: list[BaseException] = []

        def work(rt: ef.Runtime, name: str) -> None:
            try:
                for i in range(5):
                    rt.start(odd_case if i % 2 else case, run_id=f"{name}-{i}",
                             **({"size": 10} if i % 2 else {"to": name}))  # fmt: skip
            except BaseException as exc:  # reported below
                failures.append(exc)

        threads = [threading.Thread(target=work, args=(shared, f"s{t}")) for t in range(4)]
        threads += [threading.Thread(target=work, args=(rt, f"o{t}")) for t, rt in enumerate(own)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not any(t.is_alive() for t in threads), "a writer hung"
        for rt in (shared, *own):
            rt.close()
        assert not failures, failures
        code, out = _verify(url)
        assert code == 0, out


_WRITER = textwrap.dedent(
    """
    import sys, itertools
    import effectflow as ef

    @ef.tool("ap_kill_send", effect="external_write", idempotency=ef.Idempotency(supported=True),
             effect_id="id")
    def send(to, *, idempotency_key):
        return {"id": "m-" + to}

    @ef.workflow("ap_kill_case")
    def case(ctx, to):
        return [ctx.call("a", send, to=to), ctx.call("b", send, to=to + "x")]

    with ef.Runtime(sys.argv[1]) as rt:
        for i in itertools.count():
            rt.start(case, run_id=f"k-{i}", to=str(i))
            if i == 3:
                print("ready", flush=True)
    """
)


def test_a_writer_killed_mid_write_leaves_a_ledger_that_verifies(
    backend: str, tmp_path: Path, key: str
) -> None:
    """A process writing runs as fast as it can, SIGKILLed (most likely inside a transaction):
    what committed verifies, and a new writer continues the shard chains."""
    with ledgers.fresh(backend, tmp_path, prefix="ef_aprobe") as url:
        script = tmp_path / "writer.py"
        script.write_text(_WRITER)
        env = {**os.environ, "PYTHONPATH": SRC, audit.KEY_ENV: key}
        proc = subprocess.Popen([sys.executable, str(script), url], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, text=True)  # fmt: skip
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready", proc.stderr.read()  # type: ignore[union-attr]
            time.sleep(0.3)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=10)
        code, out = _verify(url)
        assert code == 0, out
        with ef.Runtime(url) as rt:
            for i in range(3):
                rt.start(case, run_id=f"after-{i}", to="z")
        code, out = _verify(url)
        assert code == 0, out


def _note(store: Any, run_id: str) -> None:
    """One batch, one seal: an operator's note on an existing run (unfenced, as a person's)."""
    from effectflow.ledger.store import Batch

    batch = Batch(run_id=run_id, lease_token=None)
    batch.event("note", time.time(), actor="ops", text="checked")
    store.apply(batch, lease_ttl=30.0, now=time.time())


@contextlib.contextmanager
def _rollback_once(store: Any) -> Iterator[None]:
    """The store's next transaction fails after its seals were chained (before its COMMIT)."""
    original = store._seal_txn
    left = [1]

    def seal_then_fail(conn: Any, seals: list[list[Any]]) -> None:
        original(conn, seals)
        if left and seals:
            left.pop()
            raise RuntimeError("after _seal_txn, before COMMIT")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(store, "_seal_txn", seal_then_fail)
        yield
    assert not left


def test_two_sqlite_stores_taking_turns_after_a_rollback_keep_the_chain(
    tmp_path: Path, key: str
) -> None:
    """Two stores of one file (as two processes) write one shard in turn; one rolls a
    transaction back after its seals were chained; the other then seals once; the first seals
    again. Its remembered head must not be trusted: the chain stays whole."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    [rid] = _ids_in_shard(11, 1, "turn")
    with ef.Runtime(url) as one, ef.Runtime(url) as two:
        one.start(case, run_id=rid, to="0")
        _note(two.store, rid)
        _note(one.store, rid)  # one: stale, reads the shard, remembers it
        with _rollback_once(one.store), pytest.raises(RuntimeError, match="before COMMIT"):
            _note(one.store, rid)
        assert one.store.verify_audit() == []  # nothing of the rollback landed
        _note(two.store, rid)  # the shard moves by one, as the rolled-back write had
        _note(one.store, rid)
        problems = one.store.verify_audit()
    code, out = _verify(url)
    assert problems == [], problems
    assert code == 0, out


def test_a_rollback_then_more_writes_of_one_store_keep_the_chain(tmp_path: Path, key: str) -> None:
    """One store alone: after a rolled-back transaction its next write finds another n, reads the
    shard again and chains on what committed."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    [rid] = _ids_in_shard(12, 1, "solo")
    with ef.Runtime(url) as one:
        one.start(case, run_id=rid, to="0")
        with _rollback_once(one.store), pytest.raises(RuntimeError, match="before COMMIT"):
            _note(one.store, rid)
        for _ in range(3):
            _note(one.store, rid)
    code, out = _verify(url)
    assert code == 0, out


def test_two_sqlite_stores_alternating_keep_the_chain(tmp_path: Path, key: str) -> None:
    """Two stores of one file sealing one shard alternately, one seal each: every turn finds the
    other's move, and the chain stays whole."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    [rid] = _ids_in_shard(13, 1, "alt")
    with ef.Runtime(url) as one, ef.Runtime(url) as two:
        one.start(case, run_id=rid, to="0")
        for i in range(6):
            _note((one, two)[i % 2].store, rid)
    code, out = _verify(url)
    assert code == 0, out


def test_verify_reads_a_sqlite_file_without_changing_it(built: Ledger, backend: str) -> None:
    """verify opens SQLite read-only: the file's bytes are the same after, and a file made
    read-only still verifies."""
    if backend != "sqlite":
        pytest.skip("SQLite's read-only mode")
    path = Path(built.url.removeprefix("sqlite:///"))
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    path.chmod(0o444)
    try:
        assert _verify(built.url)[0] == 0
        assert _verify(f"{built.url}?mode=ro")[0] == 0
    finally:
        path.chmod(0o644)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
