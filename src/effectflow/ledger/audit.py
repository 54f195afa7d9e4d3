"""Tamper evidence: the audit log's hash chains, the seals of state rows, and their verification.

Two chains per run, both kept on the run's row (head and length), neither shared with other runs
(so writers of different runs never contend for one "last hash" row):

- **events**: each audit event's hash covers the previous event's hash and its own content;
- **seals**: each batch a run writes appends one seal — the digests of the rows the batch wrote
  (the run as it is after the batch, its steps, effects, attempts, approvals, decisions, operation
  bindings) and the run's audit head after it. ``verify`` compares today's rows with their last
  sealed digest: an edited ``effects.status`` or step output is caught, and so is an event tail
  cut short (the sealed audit head is longer than the chain).

**Keyed or not.** With an operator's key (``EFFECTFLOW_AUDIT_KEY``, or a file named by
``EFFECTFLOW_AUDIT_KEY_FILE``; never stored in the ledger) every hash is an HMAC-SHA256 with it,
marked ``hmac-sha256:``: whoever can write the database but not read the key cannot forge a chain.
Without a key the hashes are plain sha256 and anyone can recompute them, so only accidental damage
(a disk, a bad restore, a hand edit that forgot the hashes) is detectable — ``verify`` says so.

**What no hash in the ledger can show** is a run deleted whole, or its newest writes cut off,
together with their seals and heads: the ledger is consistent again. ``effectflow audit head``
exports every run's heads, signed with the key; an operator keeps these exports elsewhere, and
``verify --against HEADFILE`` checks that each run is still there and its chains still reach the
exported heads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from effectflow import digests, errors
from effectflow.ledger import records

#: The environment variable holding the audit key itself.
KEY_ENV = "EFFECTFLOW_AUDIT_KEY"
#: The environment variable naming a file that holds the audit key.
KEY_FILE_ENV = "EFFECTFLOW_AUDIT_KEY_FILE"
#: How a keyed hash is marked (a plain one is bare hex).
KEYED = "hmac-sha256:"

#: Run fields that change without a batch (leases), or that are the seals' own bookkeeping: not
#: sealed.
_VOLATILE = {
    "runs": {"lease_owner", "lease_token", "lease_expires_at", "updated_at"},
}


def key_from_env(environ: Mapping[str, str] | None = None) -> bytes | None:
    """The operator's audit key, from ``EFFECTFLOW_AUDIT_KEY`` or the file ``EFFECTFLOW_AUDIT_KEY_FILE``
    names (None: unkeyed).

    Raises:
        errors.ArgumentError: the key file cannot be read, or the key is shorter than 16 bytes.
    """
    env = os.environ if environ is None else environ
    text = env.get(KEY_ENV)
    if text is None and env.get(KEY_FILE_ENV):
        try:
            text = Path(env[KEY_FILE_ENV]).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise errors.ArgumentError(
                f"{KEY_FILE_ENV}={env[KEY_FILE_ENV]!r} cannot be read: {exc.strerror}"
            ) from None
    if text is None or text == "":
        return None
    key = text.encode("utf-8")
    if len(key) < 16:
        raise errors.ArgumentError(
            f"the audit key ({KEY_ENV} / {KEY_FILE_ENV}) must be at least 16 bytes; use e.g. "
            "`python -c 'import secrets; print(secrets.token_hex(32))'`"
        )
    return key


def key_id(key: bytes) -> str:
    """A short public name of a key (which key signed a head), revealing nothing of it."""
    return hashlib.sha256(b"effectflow-audit-key-id\n" + key).hexdigest()[:16]


def _hash(key: bytes | None, text: str) -> str:
    if key is None:
        return digests.sha256_hex(text)
    return KEYED + hmac.new(key, text.encode("utf-8"), hashlib.sha256).hexdigest()


def genesis(run_id: str) -> str:
    """The hash a run's event chain starts from."""
    return digests.sha256_hex(f"effectflow-audit-genesis\n{run_id}")


def seal_genesis(run_id: str) -> str:
    """The hash a run's seal chain starts from."""
    return digests.sha256_hex(f"effectflow-seal-genesis\n{run_id}")


def event_hash(
    prev_hash: str,
    *,
    run_id: str,
    step_id: str | None,
    effect_id: str | None,
    kind: str,
    actor: str,
    detail: dict[str, Any],
    at: float,
    key: bytes | None = None,
) -> str:
    """sha256 (or HMAC with ``key``) over the previous hash and the event's canonical content."""
    body = digests.canonical_json([run_id, step_id, effect_id, kind, actor, detail, at])
    return _hash(key, f"{prev_hash}\n{body}")


def seal_hash(
    prev_hash: str,
    *,
    run_id: str,
    n: int,
    rows: Mapping[str, str | None],
    audit_head: str,
    audit_count: int,
    at: float,
    key: bytes | None = None,
) -> str:
    """The hash of one seal, chained to the run's previous seal."""
    body = digests.canonical_json([run_id, n, dict(rows), audit_head, audit_count, at])
    return _hash(key, f"{prev_hash}\n{body}")


def row_digest(table: str, record: Any) -> str:
    """The digest of one state row as a record, the same whether computed from the record a batch
    writes or from the row read back (its JSON columns round-trip through canonical JSON)."""
    # The record's own fields, shallow (no deep copy: canonical JSON walks nested values once;
    # enums are strings to it). This runs for every row of every write: keep it lean.
    data: dict[str, Any] = record.__dict__
    volatile = _VOLATILE.get(table)
    if volatile:
        data = {k: v for k, v in data.items() if k not in volatile}
    ints = [k for k in _float_fields(type(record)) if type(data.get(k)) is int]
    if ints:  # SQLite hands a whole REAL back as an int: a time is a float either way
        data = {**data, **{k: float(data[k]) for k in ints}}
    # 128 bits: the seal that holds it is itself hashed (and keyed): a shorter digest keeps each
    # seal, written with every batch, small.
    return digests.sha256_hex(digests.canonical_json([table, data]))[:32]


_FLOATS: dict[type, tuple[str, ...]] = {}


def _float_fields(cls: type) -> tuple[str, ...]:
    """The record's float fields (times): what a backend may hand back as a whole int."""
    found = _FLOATS.get(cls)
    if found is None:
        found = tuple(
            f.name for f in dataclasses.fields(cls) if str(f.type).split(" |")[0] == "float"
        )
        _FLOATS[cls] = found
    return found


#: The run's fields a write may change (sealed with every write) and its JSON ones; the rest is
#: fixed at its creation and sealed once (``runs_fixed``), so a write does not encode the input.
RUN_STATE = (
    "status", "output", "error", "next_action", "generation", "control", "workflow_version",
    "workflow_code",
)  # fmt: skip
RUN_JSON = frozenset({"output", "error", "control"})
_RUN_FIXED_DROP = frozenset(RUN_STATE) | _VOLATILE["runs"]


def run_state_digest(state: Mapping[str, Any]) -> str:
    """The digest of a run's changing fields, given with its JSON fields as canonical JSON text
    (how SQLite stores them): cheap enough for every write."""
    return digests.sha256_hex(digests.canonical_json(["runs", [state[f] for f in RUN_STATE]]))[:32]


def run_state_of(run: Any, changes: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A run record's changing fields in ``run_state_digest`` form, ``changes`` applied."""
    state = {f: getattr(run, f) for f in RUN_STATE}
    state.update({k: v for k, v in (changes or {}).items() if k in state})
    return _as_state(state)


def _as_state(state: dict[str, Any]) -> dict[str, Any]:
    return {
        k: (None if v is None else digests.canonical_json(v)) if k in RUN_JSON else v
        for k, v in state.items()
    }


def apply_state(state: dict[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """A stored run state (JSON fields as text) with a batch's ``changes`` applied."""
    out = dict(state)
    out.update(_as_state({k: v for k, v in changes.items() if k in out}))
    return out


def _digest_of(table: str, record: Any) -> str:
    if table == "runs":
        return run_state_digest(run_state_of(record))
    if table == "runs_fixed":
        fixed = {k: v for k, v in record.__dict__.items() if k not in _RUN_FIXED_DROP}
        fixed["created_at"] = float(fixed["created_at"])  # SQLite: a whole REAL comes back an int
        return digests.sha256_hex(digests.canonical_json(["runs_fixed", fixed]))[:32]
    return row_digest(table, record)


def row_key(table: str, record: Any) -> str:
    """The name a row has in a seal: ``table:<its id>``."""
    ident = {
        "steps": lambda r: r.step_id,
        "effects": lambda r: r.effect_id,
        "attempts": lambda r: r.attempt_id,
        "approvals": lambda r: r.approval_id,
        "decisions": lambda r: r.decision_id,
        "operations": lambda r: r.logical_operation_id,
    }[table](record)
    return f"{table}:{ident}"


def sealed_rows(rows: Iterable[tuple[str, Any]]) -> dict[str, str]:
    """The ``rows`` map of a seal: each row's key and digest."""
    return {row_key(table, record): row_digest(table, record) for table, record in rows}


@dataclasses.dataclass(frozen=True)
class Material:
    """Everything ``verify`` reads of one run (both backends produce it the same way)."""

    run: Any  # records.RunRecord
    audit_head: str
    audit_count: int
    seal_head: str | None
    seal_count: int
    events: list[Any]  # records.AuditEvent
    seals: list[dict[str, Any]]  # n, rows, audit_head, audit_count, at, prev_hash, hash
    rows: dict[str, Any]  # row key -> record, as the tables hold them today
    #: Operation rows past their key retention, which ``purge_expired_keys`` may have removed.
    purgeable: set[str]


@dataclasses.dataclass(frozen=True)
class Problem:
    """A place where the ledger does not verify."""

    run_id: str
    seq: int | None
    message: str


def verify_run(m: Material, key: bytes | None, *, sealed_since: float | None) -> list[Problem]:
    """Recompute a run's two chains and compare its rows with their last seals."""
    rid = m.run.run_id
    problems: list[Problem] = []

    def check(hash_: str, expected_plain: str, expected_keyed: str | None, where: int | None,
              what: str) -> None:  # fmt: skip
        if hash_.startswith(KEYED):
            if key is None:
                return  # keyed: verifiable with the key only (said once, by the caller)
            if hash_ != expected_keyed:
                problems.append(Problem(rid, where, f"{what} does not match its keyed hash"))
        elif key is not None:
            problems.append(Problem(rid, where, f"{what} was written without the audit key"))
        elif hash_ != expected_plain:
            problems.append(Problem(rid, where, f"{what} does not match its hash (edited)"))

    prev = genesis(rid)
    for event in m.events:
        if event.prev_hash != prev:
            problems.append(Problem(rid, event.seq, "prev_hash does not match the previous event"))
        fields = {
            "run_id": event.run_id,
            "step_id": event.step_id,
            "effect_id": event.effect_id,
            "kind": event.kind,
            "actor": event.actor,
            "detail": event.detail,
            "at": event.at,
        }
        check(
            event.hash,
            event_hash(event.prev_hash, **fields),
            None if key is None else event_hash(event.prev_hash, **fields, key=key),
            event.seq,
            "event content",
        )
        prev = event.hash
    if len(m.events) != m.audit_count or prev != m.audit_head:
        problems.append(
            Problem(
                rid,
                None,
                f"event chain has {len(m.events)} events ending in {prev[:20]}, the run records "
                f"{m.audit_count} ending in {m.audit_head[:20]} (events were removed or added)",
            )
        )
    if not m.seals:
        # (a second of slack: SQLite records when a migration ran in whole seconds)
        if sealed_since is not None and m.run.created_at > sealed_since + 1:
            problems.append(Problem(rid, None, "the run has no seals (they were removed)"))
        return problems
    prev = seal_genesis(rid)
    last: dict[str, str | None] = {}
    for i, seal in enumerate(m.seals, 1):
        where = -seal["n"]  # seals are named by negative numbers beside event seqs
        if seal["n"] != i or seal["prev_hash"] != prev:
            problems.append(Problem(rid, where, f"seal {seal['n']} is out of its chain"))
        fields = {
            "run_id": rid,
            "n": seal["n"],
            "rows": seal["rows"],
            "audit_head": seal["audit_head"],
            "audit_count": seal["audit_count"],
            "at": seal["at"],
        }
        check(
            seal["hash"],
            seal_hash(seal["prev_hash"], **fields),
            None if key is None else seal_hash(seal["prev_hash"], **fields, key=key),
            where,
            f"seal {seal['n']}",
        )
        prev = seal["hash"]
        last.update(seal["rows"])
    final = m.seals[-1]
    if len(m.seals) != m.seal_count or prev != m.seal_head:
        problems.append(
            Problem(
                rid,
                None,
                f"seal chain has {len(m.seals)} seals, the run records {m.seal_count} "
                "(seals were removed or added)",
            )
        )
    if (final["audit_count"], final["audit_head"]) != (m.audit_count, m.audit_head):
        problems.append(
            Problem(
                rid,
                None,
                f"the last seal records {final['audit_count']} events ending in "
                f"{final['audit_head'][:20]}, the run {m.audit_count} ending in "
                f"{m.audit_head[:20]} (events were cut or added)",
            )
        )
    for name, record in m.rows.items():
        table = name.split(":", 1)[0]
        sealed = last.get(name)
        if sealed is None:
            problems.append(Problem(rid, None, f"{name} was written outside the ledger's writes"))
        elif _digest_of(table, record) != sealed:
            problems.append(Problem(rid, None, f"{name} differs from what was written (edited)"))
    for name in sorted(set(last) - set(m.rows) - m.purgeable):
        problems.append(Problem(rid, None, f"{name} was written and is gone (deleted)"))
    return problems


def head_entry(m: Material) -> dict[str, Any]:
    """One run's line in an exported head."""
    return {
        "run_id": m.run.run_id,
        "tenant": m.run.tenant,
        "audit_count": m.audit_count,
        "audit_head": m.audit_head,
        "seal_count": m.seal_count,
        "seal_head": m.seal_head,
    }


def export_head(entries: list[dict[str, Any]], key: bytes | None) -> dict[str, Any]:
    """The signed head of a whole ledger: every run's heads, with a signature over all of them."""
    body = {
        "format": "effectflow-audit-head/1",
        "exported_at": time.time(),
        "runs": sorted(entries, key=lambda e: e["run_id"]),
    }
    text = digests.canonical_json(body)
    body["signature"] = _hash(key, text)
    body["key_id"] = None if key is None else key_id(key)
    return body


def check_head(
    head: Mapping[str, Any], found: Mapping[str, Material], key: bytes | None
) -> list[Problem]:
    """Compare a ledger with a head exported earlier: each run it lists must still be there, its
    chains at least as long and passing through the exported heads."""
    problems: list[Problem] = []
    body = {k: head[k] for k in ("format", "exported_at", "runs") if k in head}
    signature = str(head.get("signature", ""))
    if signature.startswith(KEYED) and key is None:
        problems.append(Problem("-", None, "the head is signed with a key: give it to verify"))
    elif _hash(key, digests.canonical_json(body)) != signature:
        problems.append(Problem("-", None, "the head file's signature does not match (edited)"))
    for entry in head.get("runs", []):
        rid = str(entry["run_id"])
        m = found.get(rid)
        if m is None:
            problems.append(
                Problem(rid, None, "the run is in the exported head and gone (deleted)")
            )
            continue
        if len(m.events) < entry["audit_count"] or (
            entry["audit_count"] and m.events[entry["audit_count"] - 1].hash != entry["audit_head"]
        ):
            problems.append(
                Problem(
                    rid, None, "the events no longer reach the exported head (cut or rewritten)"
                )
            )
        seal_count = int(entry.get("seal_count") or 0)
        if len(m.seals) < seal_count or (
            seal_count and m.seals[seal_count - 1]["hash"] != entry["seal_head"]
        ):
            problems.append(
                Problem(rid, None, "the seals no longer reach the exported head (cut or rewritten)")
            )
    return problems


#: The run record's fields (what a batch's ``run_changes`` may name besides the chains' heads).
_RUN_FIELDS = frozenset(f.name for f in dataclasses.fields(records.RunRecord))


def seal_batch(
    batch: Any,
    run_state: dict[str, Any],
    seal_head: str | None,
    seal_count: int,
    changes: dict[str, Any],
    audit_head: str,
    audit_count: int,
    now: float,
    key: bytes | None,
) -> tuple[tuple[Any, ...], str, int] | None:
    """The seal of one batch, written in its transaction: the row values for ``seals``, the run's
    new seal head and count (None: the batch wrote nothing to seal). ``run_state`` is the run's
    changing fields as the batch found them (``run_state_of`` / the stored columns, JSON ones as
    canonical text), ``changes`` what the batch sets on the run, and ``audit_head`` /
    ``audit_count`` the run's event chain after the batch."""
    wrote = (
        batch.new_run is not None
        or batch.steps
        or batch.effects
        or batch.attempts
        or batch.approvals
        or batch.decisions
        or batch.operations
        or batch.audit
        or any(k in _RUN_FIELDS for k in changes)
    )
    if not wrote:
        return None
    rows = {f"runs:{batch.run_id}": run_state_digest(apply_state(run_state, changes))}
    if batch.new_run is not None:
        rows[f"runs_fixed:{batch.run_id}"] = _digest_of("runs_fixed", batch.new_run)
    rows |= sealed_rows(
        [
            *(("steps", s) for s in batch.steps.values()),
            *(("effects", e) for e in batch.effects.values()),
            *(("attempts", a) for a in batch.attempts.values()),
            *(("approvals", a) for a in batch.approvals),
            *(("decisions", d) for d in batch.decisions),
            *(("operations", o) for o in batch.operations),
        ]
    )
    n = seal_count + 1
    prev = seal_head or seal_genesis(batch.run_id)
    digest = seal_hash(
        prev,
        run_id=batch.run_id,
        n=n,
        rows=rows,
        audit_head=audit_head,
        audit_count=audit_count,
        at=now,
        key=key,
    )
    values = (
        batch.run_id,
        n,
        digests.canonical_json(rows),
        audit_head,
        audit_count,
        now,
        prev,
        digest,
    )
    return values, digest, n


#: The statement that appends a seal (``?`` placeholders; PostgreSQL swaps in ``%s``).
INSERT_SEAL = (
    "INSERT INTO seals (run_id, n, rows_json, audit_head, audit_count, at, prev_hash, hash) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)


def _material(store: Any, head: Mapping[str, Any]) -> Material:
    """What ``verify`` reads of one run, through the store's own readers (both backends)."""
    from effectflow.ledger.store import DecisionRecord, OperationBinding

    rid = str(head["run_id"])
    run = store.get_run(rid)
    rows: dict[str, Any] = {f"runs:{rid}": run, f"runs_fixed:{rid}": run}
    effects = store.effects(tenant=None, run_id=rid, limit=1_000_000)
    for table, found in (
        ("steps", store.steps(rid)),
        ("effects", effects),
        ("attempts", store.attempts(rid)),
        ("approvals", store.approvals(rid)),
    ):
        rows.update((row_key(table, r), r) for r in found)
    purgeable: set[str] = set()
    for r in store.audit_rows("SELECT * FROM operations WHERE run_id = ?", (rid,)):
        op = OperationBinding(**{f.name: r[f.name] for f in dataclasses.fields(OperationBinding)})
        rows[row_key("operations", op)] = op
    for e in effects:
        for r in store.audit_rows("SELECT * FROM decisions WHERE effect_id = ?", (e.effect_id,)):
            d = DecisionRecord(**{f.name: r[f.name] for f in dataclasses.fields(DecisionRecord)})
            rows[row_key("decisions", d)] = d
    seals = []
    for r in store.audit_rows("SELECT * FROM seals WHERE run_id = ? ORDER BY n", (rid,)):
        seal = dict(r)
        seal["rows"] = json.loads(seal.pop("rows_json"))
        seals.append(seal)
    # A binding past its retention may have been purged (``purge_expired_keys``): not a deletion.
    for seal in seals:
        for name in seal["rows"]:
            if name.startswith("operations:"):
                purgeable.add(name)
    purgeable -= set(rows)
    return Material(
        run=run,
        audit_head=str(head["audit_head"]),
        audit_count=int(head["audit_count"]),
        seal_head=head["seal_head"],
        seal_count=int(head["seal_count"] or 0),
        events=store.audit(rid),
        seals=seals,
        rows=rows,
        purgeable=purgeable,
    )


def materials(store: Any, run_id: str | None = None) -> dict[str, Material]:
    """Every run's material (or one run's), by run id."""
    sql = "SELECT run_id, audit_head, audit_count, seal_head, seal_count FROM runs"
    heads = (
        store.audit_rows(sql + " ORDER BY run_id", ())
        if run_id is None
        else store.audit_rows(sql + " WHERE run_id = ?", (run_id,))
    )
    return {str(h["run_id"]): _material(store, h) for h in heads}


def verify(store: Any, run_id: str | None, key: bytes | None) -> list[Problem]:
    """Verify the ledger (or one run): both chains of every run, its rows against its seals, and
    what is left of runs that are gone."""
    since = store.audit_rows("SELECT applied_at FROM schema_migrations WHERE version = 7", ())
    sealed_since = float(since[0]["applied_at"]) if since else None
    problems: list[Problem] = []
    for material in materials(store, run_id).values():
        problems.extend(verify_run(material, key, sealed_since=sealed_since))
    if run_id is None:
        for table in ("audit", "seals", "steps", "effects"):
            orphans = store.audit_rows(
                f"SELECT DISTINCT run_id FROM {table} "
                "WHERE run_id NOT IN (SELECT run_id FROM runs) ORDER BY run_id",
                (),
            )
            problems.extend(
                Problem(str(r["run_id"]), None, f"{table} rows of a run that does not exist")
                for r in orphans
            )
    return problems
