"""Canonical JSON, request digests and idempotency keys.

A digest must not change when a dict is built in another order, a float is printed differently, or a
datetime carries another UTC offset: otherwise a retry after a crash would look like a different request
and be refused (or, worse, get a fresh key and be sent twice). So every value is first normalized to
plain JSON (``to_jsonable``) and then printed one way only (``canonical_json``).

Keys are hashes of the logical operation, never raw parameters: a key travels to providers and logs,
and must not leak an email address or an amount.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import decimal
import enum
import hashlib
import json
import math
import uuid
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

from effectflow import errors

#: Prefix of every key effectflow produces; lets a provider-side log tell our keys from others.
KEY_PREFIX = "efk1_"


def to_jsonable(value: Any, *, path: str = "$") -> Any:
    """Normalize ``value`` to JSON types (dict with str keys, list, str, int, float, bool, None).

    Raises:
        errors.ArgumentError: with the path of the first value that has no JSON form.
    """
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            raise errors.ArgumentError(f"{path}: {value!r} has no JSON form; pass a finite number")
        # Integral floats print as integers so 1.0 and 1 digest the same (as RFC 8785 does).
        if value.is_integer() and abs(value) < 2**53:
            return int(value)
        return value
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if isinstance(key, enum.Enum):
                key = key.value
            if not isinstance(key, str):
                raise errors.ArgumentError(
                    f"{path}: dict key {key!r} is a {type(key).__name__}; use str keys"
                )
            out[key] = to_jsonable(item, path=f"{path}.{key}")
        return out
    if isinstance(value, list | tuple):
        return [to_jsonable(item, path=f"{path}[{i}]") for i, item in enumerate(value)]
    if isinstance(value, set | frozenset):
        items = [to_jsonable(item, path=f"{path}[]") for item in value]
        return sorted(items, key=canonical_json)
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise errors.ArgumentError(
                f"{path}: naive datetime {value.isoformat()} is ambiguous; attach a timezone"
            )
        return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            raise errors.ArgumentError(f"{path}: {value!r} has no JSON form; pass a finite number")
        return str(value.normalize())
    if isinstance(value, uuid.UUID | PurePath):
        return str(value)
    if isinstance(value, enum.Enum):
        return to_jsonable(value.value, path=path)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_jsonable(dataclasses.asdict(value), path=path)
    # pydantic v2 models, without importing pydantic
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump):
        return to_jsonable(model_dump(mode="json"), path=path)
    raise errors.ArgumentError(
        f"{path}: a {type(value).__name__} cannot be recorded; pass JSON-like data "
        "(dict, list, str, number, bool, None, datetime, bytes, dataclass or pydantic model)"
    )


#: One encoder for every canonical print: ``json.dumps`` with these options builds a new encoder a
#: call, and the write path prints ~10 values a step.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def canonical_json(value: Any) -> str:
    """Print already-normalized JSON one way only: sorted keys, no spaces, UTF-8 kept as is."""
    return _CANONICAL.encode(value)


def dumps(value: Any) -> str:
    """Normalize then print canonically: what the ledger stores."""
    return canonical_json(to_jsonable(value))


def sha256_hex(text: str) -> str:
    """Hex sha256 of a UTF-8 string."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def digest(value: Any) -> str:
    """``sha256:<hex>`` of the canonical form of ``value`` (the ledger's request/response digests)."""
    return "sha256:" + sha256_hex(dumps(value))


def idempotency_key(
    *,
    tenant: str,
    operation_type: str,
    target: str,
    payload_digest: str,
    logical_operation_id: str,
) -> str:
    """``stable_hash(tenant, operation_type, target, normalized_payload, logical_operation_id)``.

    The payload enters as its digest, so the key reveals nothing of it. Technical retries of one logical
    operation reproduce the same key; a new logical operation (a new user request) gets a new one.
    """
    material = canonical_json(
        [tenant, operation_type, target, payload_digest, logical_operation_id]
    )
    return KEY_PREFIX + sha256_hex(material)[:48]
