"""The audit log's hash chain.

Each run's events form a chain: an event's hash covers the previous event's hash and its own
content, and the run's row keeps the head and the length. Editing, inserting or deleting an event
anywhere breaks a hash or the head; verification recomputes every chain. Chains are per run, not
global, so writers of different runs never contend for one "last hash" row.
"""

from __future__ import annotations

from typing import Any

from effectflow import digests


def genesis(run_id: str) -> str:
    """The hash a run's chain starts from."""
    return digests.sha256_hex(f"effectflow-audit-genesis\n{run_id}")


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
) -> str:
    """sha256 over the previous hash and the event's canonical content."""
    body = digests.canonical_json([run_id, step_id, effect_id, kind, actor, detail, at])
    return digests.sha256_hex(f"{prev_hash}\n{body}")
