"""The audit key and the hashes every chain is made of: one run's events, one run's seals.

A hash is plain sha256 (bare hex) without the operator's key and an HMAC-SHA256 marked
``hmac-sha256:`` with it; both are computed by ``_hash`` alone, so a ledger written by one version
verifies in the next only while this module's texts stay byte for byte what they are.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from effectflow import digests, errors

#: The environment variable holding the audit key itself.
KEY_ENV = "EFFECTFLOW_AUDIT_KEY"
#: The environment variable naming a file that holds the audit key.
KEY_FILE_ENV = "EFFECTFLOW_AUDIT_KEY_FILE"
#: How a keyed hash is marked (a plain one is bare hex).
KEYED = "hmac-sha256:"


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
    return event_hash_of_text(
        prev_hash,
        run_id=run_id,
        step_id=step_id,
        effect_id=effect_id,
        kind=kind,
        actor=actor,
        detail_json=digests.canonical_json(detail),
        at=at,
        key=key,
    )


def event_hash_of_text(
    prev_hash: str,
    *,
    run_id: str,
    step_id: str | None,
    effect_id: str | None,
    kind: str,
    actor: str,
    detail_json: str,
    at: float,
    key: bytes | None = None,
) -> str:
    """``event_hash`` with the detail already printed canonically (as the audit row stores it):
    the write path prints it once for both. The body is the canonical JSON of the list, built
    from its items' canonical prints (a list prints as its items joined, without spaces)."""
    head = digests.canonical_json([run_id, step_id, effect_id, kind, actor])
    body = f"{head[:-1]},{detail_json},{digests.json_number(at)}]"
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
        f"[{digests.json_string(run_id)},{n},{rows_json},"
        f"{digests.json_string(audit_head)},{audit_count},{digests.json_number(at)}]"
    )
    return _hash(key, f"{prev_hash}\n{body}")
