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

**A head over every run.** A run's own chains cannot show that the run was deleted whole, or its
newest writes cut together with their seals: what is left is consistent. So each seal is also a
link in the chain of its run's *shard* (one of ``SHARDS``, by ``shard_of(run_id)``); the
``audit_shards`` table keeps each chain's length and head, extended last in every transaction that
seals (shards locked in order, so writers never deadlock; 64 of them, so writers of different runs
rarely wait on one row). A removed seal leaves a gap, or a head its chain no longer reaches; an
emptied shard is told from one never used by the index row (``INDEX``), whose head covers the set
of used shards. With a key, nobody without it can compute a mended head.

**What no hash inside one database can show** is a rollback to a state someone watched: whoever
kept the shard rows of an earlier moment can delete everything written since and put them back.
``effectflow audit head`` exports every run's heads and every shard's, signed with the key; an
operator keeps these exports elsewhere, and ``verify --against HEADFILE`` checks that each run is
still there and that its chains and the shards' still reach the exported heads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import itertools
import json
import os
import time
import zlib
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
    rows_json: str,
    audit_head: str,
    audit_count: int,
    at: float,
    key: bytes | None = None,
) -> str:
    """The hash of one seal, chained to the run's previous seal. ``rows_json`` is the seal's rows
    map as stored (canonical JSON): it is hashed as it is, not printed again (the body is the
    canonical JSON of ``[run_id, n, rows, audit_head, audit_count, at]``)."""
    body = (
        f"[{digests.canonical_json(run_id)},{n},{rows_json},"
        f"{digests.canonical_json(audit_head)},{audit_count},{digests.canonical_json(at)}]"
    )
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


#: The record type each sealed table holds (its fields are the table's columns, in this order).
_RECORDS: dict[str, type] = {}
#: Fields stored as canonical JSON text (``<field>_json`` columns).
JSON_FIELDS = frozenset({"input", "output", "error", "evidence", "control", "detail"})
#: Per table: the record's field names, and the positions of its float fields (times).
_LAYOUT: dict[str, tuple[tuple[str, ...], tuple[int, ...]]] = {}


def _layout(table: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    found = _LAYOUT.get(table)
    if found is None:
        cls = _record_types()[table]
        names = tuple(f.name for f in dataclasses.fields(cls))
        floats = set(_float_fields(cls))
        found = (names, tuple(i for i, name in enumerate(names) if name in floats))
        _LAYOUT[table] = found
    return found


def _record_types() -> dict[str, type]:
    if not _RECORDS:
        from effectflow.ledger.store import DecisionRecord, OperationBinding

        _RECORDS.update(
            steps=records.StepRecord,
            effects=records.EffectRecord,
            attempts=records.AttemptRecord,
            approvals=records.ApprovalRecord,
            decisions=DecisionRecord,
            operations=OperationBinding,
        )
    return _RECORDS


def values_digest(table: str, values: list[Any]) -> str:
    """The digest of one state row as the values a batch writes to its columns: the record's
    fields in order, JSON ones as their canonical text (``record_values``). Written from the list
    the INSERT sends anyway (no second print of its JSON), verified from the row read back.

    A time is a float either way (SQLite hands a whole REAL back as an int; a test clock may give
    an int)."""
    floats = _layout(table)[1]
    for i in floats:
        if type(values[i]) is int:
            values = [
                float(v) if type(v) is int and j in floats else v for j, v in enumerate(values)
            ]
            break
    # 128 bits: the seal that holds it is itself hashed (and keyed); a shorter digest keeps each
    # seal, written with every batch, small. (The values are JSON scalars and canonical texts:
    # no key to sort, so the plain encoder prints them the one way.)
    text = table + _PLAIN.encode(values)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


#: A list of scalars prints the same with or without sorted keys; without, the C encoder's
#: fast path.
_PLAIN = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def record_values(table: str, record: Any) -> list[Any]:
    """A record as the values its table's columns hold: JSON fields as canonical text."""
    data = record.__dict__
    return [
        digests.canonical_json(data[f]) if f in JSON_FIELDS and data[f] is not None else data[f]
        for f in _layout(table)[0]
    ]


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


def _digest_of(table: str, record: Any, by_columns: bool = True) -> str:
    """A row's digest as a seal holds it: ``by_columns`` as version 8 writes them
    (``values_digest``), else as version 7 did (``row_digest``)."""
    if table == "runs":
        return run_state_digest(run_state_of(record))
    if table == "runs_fixed":
        fixed = {k: v for k, v in record.__dict__.items() if k not in _RUN_FIXED_DROP}
        fixed["created_at"] = float(fixed["created_at"])  # SQLite: a whole REAL comes back an int
        return digests.sha256_hex(digests.canonical_json(["runs_fixed", fixed]))[:32]
    if by_columns:
        return values_digest(table, record_values(table, record))
    return row_digest(table, record)


#: Each sealed table's id field.
_ID_FIELD = {
    "steps": "step_id",
    "effects": "effect_id",
    "attempts": "attempt_id",
    "approvals": "approval_id",
    "decisions": "decision_id",
    "operations": "logical_operation_id",
}


def row_key(table: str, record: Any) -> str:
    """The name a row has in a seal: ``table:<its id>``."""
    return f"{table}:{record.__dict__[_ID_FIELD[table]]}"


@dataclasses.dataclass(frozen=True)
class Material:
    """Everything ``verify`` reads of one run (both backends produce it the same way)."""

    run: Any  # records.RunRecord
    audit_head: str
    audit_count: int
    seal_head: str | None
    seal_count: int
    events: list[Any]  # records.AuditEvent
    #: n, rows_json (and rows, parsed), audit_head, audit_count, at, prev_hash, hash, shard,
    #: shard_seq
    seals: list[dict[str, Any]]
    rows: dict[str, Any]  # row key -> record, as the tables hold them today
    #: Operation rows past their key retention, which ``purge_expired_keys`` may have removed.
    purgeable: set[str]


@dataclasses.dataclass(frozen=True)
class Problem:
    """A place where the ledger does not verify."""

    run_id: str
    seq: int | None
    message: str


def verify_run(
    m: Material, key: bytes | None, *, sealed_since: float | None, shards_since: float | None
) -> list[Problem]:
    """Recompute a run's two chains and compare its rows with their last seals. ``sealed_since``:
    when a ledger written before version 7 began writing seals (None: sealed from its first run);
    ``shards_since``: when it began chaining them in shards (version 8)."""
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
        # Excused only as a run of a ledger that was written before seals (version 7): the ledger
        # was upgraded (``sealed_since`` is not None), the run says it is older (a second of
        # slack: SQLite records when a migration ran in whole seconds), and it has the events
        # every run has had since version 1. A run without seals in a ledger sealed from its
        # first run, or without any event, is not one.
        legacy = (
            sealed_since is not None and m.run.created_at <= sealed_since + 1 and m.events != []
        )
        if not legacy:
            problems.append(Problem(rid, None, "the run has no seals (they were removed)"))
        return problems
    prev = seal_genesis(rid)
    # Each row's last sealed digest, and whether it is one of version 8 (digested by columns; a
    # seal of version 8 has its place in a shard's chain).
    last: dict[str, tuple[str, bool]] = {}
    for i, seal in enumerate(m.seals, 1):
        where = -seal["n"]  # seals are named by negative numbers beside event seqs
        if seal["n"] != i or seal["prev_hash"] != prev:
            problems.append(Problem(rid, where, f"seal {seal['n']} is out of its chain"))
        if seal["shard_seq"] is None and shards_since is not None and seal["at"] > shards_since + 1:
            problems.append(Problem(rid, where, f"seal {seal['n']} is outside its shard's chain"))
        elif seal["shard_seq"] is not None and seal["shard"] != shard_of(rid):
            problems.append(Problem(rid, where, f"seal {seal['n']} is in another run's shard"))
        fields = {
            "run_id": rid,
            "n": seal["n"],
            "rows_json": seal["rows_json"],
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
        by_columns = seal["shard_seq"] is not None
        last.update((name, (digest, by_columns)) for name, digest in seal["rows"].items())
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
        elif _digest_of(table, record, sealed[1]) != sealed[0]:
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


def shard_heads(store: Any) -> list[dict[str, Any]]:
    """Every shard's recorded head, for an exported head."""
    rows = store.audit_rows(
        "SELECT shard, n, head FROM audit_shards WHERE shard < ? ORDER BY shard", (INDEX,)
    )
    return [{"shard": int(r["shard"]), "n": int(r["n"]), "head": str(r["head"])} for r in rows]


def export_head(
    entries: list[dict[str, Any]], key: bytes | None, shards: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The signed head of a whole ledger: every run's heads and every shard's, with a signature
    over all of them."""
    body: dict[str, Any] = {
        "format": "effectflow-audit-head/1",
        "exported_at": time.time(),
        "runs": sorted(entries, key=lambda e: e["run_id"]),
    }
    if shards is not None:
        body["shards"] = shards
    text = digests.canonical_json(body)
    body["signature"] = _hash(key, text)
    body["key_id"] = None if key is None else key_id(key)
    return body


def head_shape(head: Any) -> str | None:
    """What is wrong with the shape of a head file (None: nothing), before it is compared: a
    malformed file is one ``verify`` could not read, not a tampered ledger."""
    if not isinstance(head, dict) or head.get("format") != "effectflow-audit-head/1":
        return "not an effectflow audit head (a JSON object with format effectflow-audit-head/1)"
    fields: dict[str, dict[str, tuple[type, ...]]] = {
        "runs": {
            "run_id": (str,),
            "audit_count": (int,),
            "audit_head": (str,),
            "seal_count": (int, type(None)),
            "seal_head": (str, type(None)),
        },
        "shards": {"shard": (int,), "n": (int,), "head": (str,)},
    }
    for part, expected in fields.items():
        entries = head.get(part, [])
        if not isinstance(entries, list):
            return f"{part} is not a list"
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict):
                return f"{part}[{i}] is not an object"
            for name, kinds in expected.items():
                value = entry.get(name)
                if (part, name) == ("runs", "seal_count") and name not in entry:
                    continue
                if not isinstance(value, kinds) or isinstance(value, bool):
                    return f"{part}[{i}].{name} is {value!r}, not a {kinds[0].__name__}"
    return None


def check_head(
    head: Mapping[str, Any],
    found: Mapping[str, Material],
    key: bytes | None,
    chains: list[ShardChain] | None = None,
) -> list[Problem]:
    """Compare a ledger with a head exported earlier: each run it lists must still be there, its
    chains at least as long and passing through the exported heads; and so must each shard's
    chain (``chains``, as ``replay_shards`` recomputed them), which also covers the runs the
    export does not list by name."""
    problems: list[Problem] = []
    body = {k: head[k] for k in ("format", "exported_at", "runs", "shards") if k in head}
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
    by_shard = {c.shard: c for c in chains or ()}
    for entry in head.get("shards", []) if chains is not None else []:
        shard, n = int(entry["shard"]), int(entry["n"])
        chain = by_shard.get(shard)
        if chain is None or chain.length < n:
            problems.append(
                Problem(
                    f"(shard {shard})",
                    None,
                    "the shard's chain is shorter than exported "
                    "(seals were removed: runs deleted or cut)",
                )
            )
        elif n and chain.at.get(n) is not None and chain.at[n] != entry["head"]:
            problems.append(
                Problem(
                    f"(shard {shard})",
                    None,
                    "the shard's chain no longer passes through the exported head (rewritten)",
                )
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
    written: Mapping[str, list[list[Any]]],
) -> tuple[list[Any], str, int] | None:
    """The seal of one batch: the row values for ``seals`` (without its place in its shard's chain,
    which ``chain_shards`` gives at the end of the transaction), the run's new seal head and count
    (None: the batch wrote nothing to seal).

    ``run_state`` is the run's changing fields as the batch found them (``run_state_of`` / the
    stored columns, JSON ones as canonical text), ``changes`` what the batch sets on the run,
    ``audit_head`` / ``audit_count`` the run's event chain after the batch, and ``written`` the
    column values the batch's INSERTs sent for its steps, effects and attempts (in the batch's
    order), which are digested as they are."""
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
    rid = batch.run_id
    rows = {f"runs:{rid}": run_state_digest(apply_state(run_state, changes))}
    if batch.new_run is not None:
        rows[f"runs_fixed:{rid}"] = _digest_of("runs_fixed", batch.new_run)
    for table, found in (
        ("steps", batch.steps.values()),
        ("effects", batch.effects.values()),
        ("attempts", batch.attempts.values()),
    ):
        if found:
            for record, values in zip(found, written[table], strict=True):
                rows[row_key(table, record)] = values_digest(table, values)
    for table, found in (
        ("approvals", batch.approvals),
        ("decisions", batch.decisions),
        ("operations", batch.operations),
    ):
        for record in found:
            rows[row_key(table, record)] = values_digest(table, record_values(table, record))
    n = seal_count + 1
    prev = seal_head or seal_genesis(rid)
    rows_json = digests.canonical_json(rows)
    digest = seal_hash(
        prev,
        run_id=rid,
        n=n,
        rows_json=rows_json,
        audit_head=audit_head,
        audit_count=audit_count,
        at=now,
        key=key,
    )
    return [rid, n, rows_json, audit_head, audit_count, now, prev, digest], digest, n


#: How many shards the ledger-wide chains are spread over: each transaction extends the chains of
#: the shards its runs fall in, so concurrent writers rarely wait on one another's shard.
SHARDS = 64


def shard_of(run_id: str) -> int:
    """The shard a run's seals are chained in (stable across processes and machines)."""
    return zlib.crc32(run_id.encode("utf-8")) % SHARDS


def shard_genesis(shard: int) -> str:
    """The head of a shard's chain before its first seal (also what the migration writes)."""
    return f"effectflow-shard-genesis/{shard}"


def shard_link(prev: str, *, shard: int, seq: int, seal_hash: str, key: bytes | None) -> str:
    """A shard chain's head after the seal at ``seq``: the previous head and that seal's hash."""
    return _hash(key, f"{prev}\n{shard}\n{seq}\n{seal_hash}")


def shards_of(pending: Iterable[list[Any]]) -> list[int]:
    """The shards a transaction's seals fall in, in the order their rows are locked (sorted: two
    transactions lock shards in one order, so they never deadlock)."""
    return sorted({shard_of(values[0]) for values in pending})


def shard_heads_read(
    shards: list[int], rows: Iterable[tuple[int, int, str]]
) -> dict[int, tuple[int, str]]:
    """The ``(n, head)`` of each of ``shards`` from its ``audit_shards`` rows.

    Raises:
        errors.LedgerFileError: a shard's row is gone: the ledger was edited outside effectflow.
            Nothing is written (a chain restarted here would hide what was removed).
    """
    heads = {int(shard): (int(n), str(head)) for shard, n, head in rows}
    for shard in shards:
        if shard not in heads:
            raise errors.LedgerFileError(
                f"the ledger's audit shard {shard} has no head row: it was edited outside "
                "effectflow, so nothing more is written to it; run `effectflow audit verify`"
            )
    return heads


def chain_shards(
    pending: list[list[Any]], heads: Mapping[int, tuple[int, str]], key: bytes | None
) -> tuple[list[list[Any]], list[tuple[int, str, int]]]:
    """Give each pending seal its place in its shard's chain, in the order the transaction wrote
    them: returns the ``seals`` rows (the values with ``shard`` and ``shard_seq``) and each
    shard's new ``(n, head, shard)``. ``heads`` is each shard's ``(n, head)`` read under lock."""
    moved: dict[int, tuple[int, str]] = {}
    rows = []
    for values in pending:
        shard = shard_of(values[0])
        n, head = moved.get(shard) or heads[shard]
        n += 1
        head = shard_link(head, shard=shard, seq=n, seal_hash=values[7], key=key)
        rows.append([*values, shard, n])
        moved[shard] = (n, head)
    return rows, [(n, head, shard) for shard, (n, head) in sorted(moved.items())]


#: The ``audit_shards`` row that names the shards in use. A shard emptied of every seal would look
#: like one never used; this row's head covers the set of used shards, so emptying one means
#: writing a new head over the smaller set, which takes the key. It changes only when a shard is
#: used for the first time: at most ``SHARDS`` times in a ledger's life.
INDEX = SHARDS


def index_genesis() -> str:
    """The index row's head before any shard is used (also what the migration writes)."""
    return "effectflow-shard-index/"


def index_head(used: Iterable[int], key: bytes | None) -> str:
    """The index row's head over the set of used shards."""
    return _hash(key, "effectflow-shard-index\n" + ",".join(str(s) for s in sorted(used)))


def first_uses(heads: Mapping[int, tuple[int, str]], shards: Iterable[int]) -> bool:
    """Whether this transaction is the first to seal in one of ``shards`` (the index must move)."""
    return any(heads[s][0] == 0 for s in shards)


def index_row(used: Iterable[int], key: bytes | None) -> tuple[int, str, int]:
    """The index row's new ``(n, head, shard)``, for ``used`` (read under the index row's lock,
    plus the transaction's own shards)."""
    found = set(used)
    return len(found), index_head(found, key), INDEX


def tombstones(
    purged: Iterable[tuple[str, str, str, float]], now: float, key: bytes | None
) -> list[tuple[Any, ...]]:
    """The ``purged_keys`` rows recording bindings ``(tenant, logical_operation_id, run_id,
    key_expires_at)`` purged at ``now``, each hashed (keyed) so none can be forged."""
    return [(*p, now, purge_hash(*p, now, key=key)) for p in purged]


def purge_hash(
    tenant: str,
    logical_operation_id: str,
    run_id: str,
    key_expires_at: float,
    purged_at: float,
    *,
    key: bytes | None,
) -> str:
    """The hash of one purge record."""
    body = digests.canonical_json(
        ["purged", tenant, logical_operation_id, run_id, float(key_expires_at), float(purged_at)]
    )
    return _hash(key, body)


#: The statement that records a purged binding.
INSERT_TOMBSTONE = (
    "INSERT INTO purged_keys (tenant, logical_operation_id, run_id, key_expires_at, purged_at, "
    "hash) VALUES (?, ?, ?, ?, ?, ?)"
)


def purged_operations(store: Any, key: bytes | None) -> tuple[set[tuple[str, str]], list[Problem]]:
    """The ``(run_id, operations:<id>)`` names a purge record excuses, and the records that do not
    verify (edited or forged, written without the key, or purged before their key expired)."""
    excused: set[tuple[str, str]] = set()
    problems: list[Problem] = []
    for r in store.audit_rows("SELECT * FROM purged_keys", ()):
        fields = (r["tenant"], r["logical_operation_id"], r["run_id"], r["key_expires_at"])
        stored = str(r["hash"])
        keyed = stored.startswith(KEYED)
        if keyed and key is None:
            ok = True  # verifiable with the key only (said once, by the caller)
        elif key is not None and not keyed:
            ok = False
        else:
            ok = stored == purge_hash(*fields, r["purged_at"], key=key)
        if not ok or float(r["key_expires_at"]) > float(r["purged_at"]):
            problems.append(
                Problem(
                    str(r["run_id"]),
                    None,
                    f"the purge record of operations:{r['logical_operation_id']} does not verify "
                    "(forged, edited, or purged before its key expired)",
                )
            )
        else:
            excused.add((str(r["run_id"]), f"operations:{r['logical_operation_id']}"))
    return excused, problems


#: The statement that appends a seal (``?`` placeholders; PostgreSQL swaps in ``%s``).
INSERT_SEAL = (
    "INSERT INTO seals (run_id, n, rows_json, audit_head, audit_count, at, prev_hash, hash, "
    "shard, shard_seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
#: The statement that moves a shard's head (``chain_shards``' rows).
UPDATE_SHARD = "UPDATE audit_shards SET n = ?, head = ? WHERE shard = ?"


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
        seal["rows"] = json.loads(seal["rows_json"])
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
    """Every run's material (or one run's), by run id, read run by run through the store's own
    readers: the reference ``audit_read.materials_batched`` (what ``verify`` reads with) is
    tested against."""
    sql = "SELECT run_id, audit_head, audit_count, seal_head, seal_count FROM runs"
    heads = (
        store.audit_rows(sql + " ORDER BY run_id", ())
        if run_id is None
        else store.audit_rows(sql + " WHERE run_id = ?", (run_id,))
    )
    return {str(h["run_id"]): _material(store, h) for h in heads}


def _applied_at(store: Any, version: int) -> float | None:
    found = store.audit_rows(
        "SELECT applied_at FROM schema_migrations WHERE version = ?", (version,)
    )
    return float(found[0]["applied_at"]) if found else None


@dataclasses.dataclass(frozen=True)
class ShardChain:
    """One shard's chain as ``replay_shards`` recomputed it."""

    shard: int
    #: How many seals are in it, in order from the first (up to a gap).
    length: int
    #: The recomputed head after the seals at the positions asked for (None where it could not
    #: be recomputed: a keyed seal and no key).
    at: dict[int, str | None]


def _shard_key(row: Mapping[str, Any]) -> int:
    return int(row["shard"])


def _replay_shard(
    shard: int,
    seals: Iterable[Mapping[str, Any]],
    recorded: tuple[int, str],
    key: bytes | None,
    want: int | None,
) -> tuple[ShardChain, str]:
    """Replay one shard's seals (in ``shard_seq`` order); returns its chain and what is wrong
    with it ("" if nothing)."""
    n, head = recorded
    prev: str | None = shard_genesis(shard)
    at: dict[int, str | None] = {}
    seen = chained = 0
    gap = ""
    for seal in seals:
        if gap:
            seen += 1  # counted, no longer chained
            continue
        seq = seen + 1
        if seal["shard_seq"] != seq:
            gap = (
                f"the shard's chain skips from {seq - 1} to {seal['shard_seq']} at seal "
                f"{seal['n']} of run {seal['run_id']} (seals were removed)"
            )
            seen += 1
            continue
        keyed = str(seal["hash"]).startswith(KEYED)
        if prev is not None and keyed and key is None:
            prev = None  # verifiable with the key only (said once, by the caller)
        if prev is not None:
            prev = shard_link(
                prev, shard=shard, seq=seq, seal_hash=seal["hash"], key=key if keyed else None
            )
        seen = chained = seq
        if seq == want:
            at[seq] = prev
    if gap:
        message = gap
    elif seen != n:
        message = (
            f"the shard's chain has {seen} seals, its head records {n} (seals were removed or "
            "added)"
        )
    elif seen and prev is not None and prev != head:
        message = "the shard's chain does not end where its head says (seals or head rewritten)"
    elif not seen and head != shard_genesis(shard):
        message = "the shard has no seals and its head is not a new shard's (edited)"
    else:
        message = ""
    return ShardChain(shard, chained, at), message


def replay_shards(
    store: Any, key: bytes | None, want: Mapping[int, int] | None = None, only: int | None = None
) -> tuple[list[Problem], list[ShardChain]]:
    """Recompute every shard's chain from the seals in it (one sorted scan, in bounded memory)
    and compare it with the head the ledger records: a seal removed anywhere (a run deleted
    whole, a tail cut) breaks its shard's chain, and with a key nobody without it can mend the
    chain. ``want``: per shard, a position whose recomputed head to keep (an exported head's);
    ``only``: replay that shard alone (``verify --run``: the run's own shard)."""
    problems: list[Problem] = []
    chains: list[ShardChain] = []
    recorded = {
        int(r["shard"]): (int(r["n"]), str(r["head"]))
        for r in store.audit_rows("SELECT shard, n, head FROM audit_shards", ())
    }
    stream = store.audit_stream(
        "SELECT shard, shard_seq, run_id, n, hash FROM seals WHERE shard IS NOT NULL "
        + ("" if only is None else "AND shard = ? ")
        + "ORDER BY shard, shard_seq",
        () if only is None else (only,),
    )
    groups = itertools.groupby(stream, _shard_key)
    pending = next(groups, None)
    for shard in range(SHARDS) if only is None else [only]:
        seals: Iterable[Mapping[str, Any]] = ()
        while pending is not None and pending[0] < shard:
            # seals of a shard that does not exist: counted as unchained
            problems.append(Problem(f"(shard {pending[0]})", None, "seals in no known shard"))
            pending = next(groups, None)
        if pending is not None and pending[0] == shard:
            seals = pending[1]
        where = f"(shard {shard})"
        if shard not in recorded:
            problems.append(Problem(where, None, "the shard's head row is gone (deleted)"))
            recorded[shard] = (0, shard_genesis(shard))
        chain, message = _replay_shard(
            shard, seals, recorded[shard], key, None if want is None else want.get(shard)
        )
        if message:
            problems.append(Problem(where, None, message))
        chains.append(chain)
        if pending is not None and pending[0] == shard:
            pending = next(groups, None)
    while pending is not None:
        problems.append(Problem(f"(shard {pending[0]})", None, "seals in no known shard"))
        pending = next(groups, None)
    used = {s for s, (n, _) in recorded.items() if s != INDEX and n > 0}
    index = recorded.get(INDEX)
    if index is None:
        problems.append(
            Problem(f"(shard {INDEX})", None, "the shards' index row is gone (deleted)")
        )
    else:
        n, head = index
        keyed = head.startswith(KEYED)
        expected = index_genesis() if not used else index_head(used, key if keyed else None)
        if used and key is not None and not keyed:
            problems.append(
                Problem(f"(shard {INDEX})", None, "the index was written without the audit key")
            )
        elif n != len(used) or (not (keyed and key is None) and head != expected):
            problems.append(
                Problem(
                    f"(shard {INDEX})",
                    None,
                    f"the index names {n} shards in use, {len(used)} have seals, or its head does "
                    "not cover them (a shard was emptied, or its head row edited)",
                )
            )
    return problems, chains


def verify(store: Any, run_id: str | None, key: bytes | None) -> list[Problem]:
    """Verify the ledger (or one run): both chains of every run, its rows against its seals, the
    shards' chains over every run's seals, and what is left of runs that are gone; all read in one
    snapshot (``store.audit_snapshot``), so a live ledger's concurrent writes are no findings."""
    with store.audit_snapshot():
        return _verify(store, run_id, key)


def _verify(store: Any, run_id: str | None, key: bytes | None) -> list[Problem]:
    from effectflow.ledger import audit_read  # it reads Materials: imports this module

    sealed_since = _applied_at(store, 7)
    first = _applied_at(store, 1)
    if sealed_since is not None and first is not None and first >= sealed_since - 1:
        sealed_since = None  # created at version 7 or later: every run has seals
    shards_since = _applied_at(store, 8)
    problems: list[Problem] = []
    # A sealed binding that is gone is excused only by a purge record (version 8); before, any.
    purged, unverified = purged_operations(store, key) if shards_since is not None else (None, [])
    problems.extend(unverified)
    found = 0
    for _, material in audit_read.materials_batched(store, run_id):
        found += 1
        if purged is not None:
            rid = material.run.run_id
            material = dataclasses.replace(
                material, purgeable={n for n in material.purgeable if (rid, n) in purged}
            )
        problems.extend(
            verify_run(material, key, sealed_since=sealed_since, shards_since=shards_since)
        )
    if run_id is not None:
        if not found:
            problems.append(
                Problem(
                    run_id,
                    None,
                    "the run is not in the ledger (deleted, or never written: check the id)",
                )
            )
        if shards_since is not None:  # the run's own shard: a cut of its newest writes shows
            problems.extend(replay_shards(store, key, only=shard_of(run_id))[0])
    if run_id is None:
        problems.extend(replay_shards(store, key)[0])
        # Every row belongs to a run: one left of a run that is gone, or planted for a run that
        # never was (a binding for a future operation id), is reported.
        for table in ("audit", "seals", "steps", "effects", "attempts", "approvals", "operations"):
            orphans = store.audit_rows(
                f"SELECT DISTINCT run_id FROM {table} "
                "WHERE run_id NOT IN (SELECT run_id FROM runs) ORDER BY run_id",
                (),
            )
            problems.extend(
                Problem(str(r["run_id"]), None, f"{table} rows of a run that does not exist")
                for r in orphans
            )
        for r in store.audit_rows(
            "SELECT DISTINCT decision_id, effect_id FROM decisions "
            "WHERE effect_id NOT IN (SELECT effect_id FROM effects) ORDER BY decision_id",
            (),
        ):
            problems.append(
                Problem(
                    "-",
                    None,
                    f"decision {r['decision_id']} is about effect "
                    f"{r['effect_id']}, which does not exist",
                )
            )
    return problems
