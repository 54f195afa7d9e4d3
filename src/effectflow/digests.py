"""Canonical JSON, request digests and idempotency keys.

A digest must not change when a dict is built in another order, a float is printed differently, or a
datetime carries another UTC offset: otherwise a retry after a crash would look like a different request
and be refused (or, worse, get a fresh key and be sent twice). So every value is first normalized to
plain JSON (``to_jsonable``) and then printed one way only (``canonical_json``).

``to_jsonable`` is also the one gate every recorded value passes (a run's input, a step's arguments,
a person's evidence, a tool's result, a run's output): what it accepts, both ledgers store and give
back identically, and what one of them would refuse or alter (a NUL, a lone surrogate, an integer
past 64 bits, nesting past ``MAX_DEPTH``) it refuses first, naming the path, before anything is
recorded. ``check_id`` does the same for the ids the ledger stores as text.

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
from collections.abc import Callable, Mapping
from pathlib import PurePath
from typing import Any

from effectflow import errors

#: Prefix of every key effectflow produces; lets a provider-side log tell our keys from others.
KEY_PREFIX = "efk1_"

#: How many dicts and lists a recorded value may nest, the value itself included (``{"a": [1]}`` is
#: 2 deep). A run's input and a step's arguments are recorded as the dict of their names, so a field
#: of them may nest one less. Deep enough for any real document; shallow enough that printing,
#: digesting and every consumer's parser stay far from their recursion limits, and that a value
#: that refers to itself is refused instead of recursing until the interpreter gives up.
MAX_DEPTH = 64
#: The integers a recorded value may hold: 64-bit signed. Beyond them the ledgers disagree
#: (SQLite's JSON functions read 2**63 as the float 9.223372036854776e+18, PostgreSQL's jsonb keeps
#: it exact as numeric) and typed consumers (int64 columns, Go, Java, protobuf) overflow or round.
INT_MIN = -(2**63)
INT_MAX = 2**63 - 1

#: How much deeper than ``MAX_DEPTH`` a value may nest when it is only digested, never recorded:
#: the runtime digests envelopes around recorded values (a decision's parameters around its
#: evidence), and a value accepted for recording must not be refused for the envelope it sits in.
ENVELOPE_DEPTH = 4

_FLOAT_EXACT = 2**53
_DEEP = (
    f"is nested deeper than {MAX_DEPTH} levels of dicts and lists (or contains itself); "
    "flatten it, or record a reference (an id, a URL) instead"
)


class _Refused(Exception):
    """Raised inside ``_normalize`` at the offending value; each container it unwinds through adds
    its own path segment, so the path is built only when something is refused (never on the hot
    path, where a path string per item cost more than the normalization itself)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why
        #: Path segments from the offending value outwards (reversed when reported).
        self.segments: list[str] = []


def _key_segment(key: str) -> str:
    """``.name`` for a plain key, ``['odd key']`` (escaped, shortened) for any other, so a path
    never carries a NUL or a surrogate into a message that may itself be recorded."""
    if key and key.isprintable() and not any(c in key for c in ".[]'\""):
        return "." + (key if len(key) <= 64 else key[:61] + "...")
    return f"[{_short(key)}]"


def _short(value: object) -> str:
    """A bounded, escaped ``repr`` for messages (a refused key may be megabytes long)."""
    text = ascii(value)
    return text if len(text) <= 64 else text[:61] + "..."


def _recordable_text(text: str) -> bool:
    """Whether ``text`` has no NUL and a UTF-8 form (no lone surrogate): C-speed, no Python loop
    (an ASCII string is known as such in O(1), and only other strings are encoded)."""
    if "\x00" in text:
        return False
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_AS_BYTES = ", or pass the data as bytes"


def _text_problem(text: str, what: str, fix: str = _AS_BYTES) -> str:
    """Why ``text``, which ``_recordable_text`` refused, cannot be recorded, and what to do; only
    ever called on the way to a refusal."""
    nul = text.find("\x00")
    if nul >= 0:
        return (
            f"{what} contains a NUL character (\\x00) at index {nul}, which PostgreSQL cannot "
            f"store in text; remove it{fix}"
        )
    index, char = next((i, c) for i, c in enumerate(text) if "\ud800" <= c <= "\udfff")
    return (
        f"{what} contains a lone surrogate (U+{ord(char):04X}) at index {index}, which is not "
        f"Unicode and has no UTF-8 form (text decoded with 'surrogateescape'?); decode it "
        f"properly{fix}"
    )


def _int_problem(value: int) -> str:
    # The value itself is not quoted: the message is recorded (a run's error) and shown, and the
    # number may be a field a redaction rule keeps out of the ledger (an account number).
    sign = "negative " if value < 0 else ""
    return (
        f"a {sign}{value.bit_length()}-bit integer is outside the 64-bit integer range "
        "[-2**63, 2**63-1] that both ledgers and JSON consumers keep exactly; pass it as a string "
        "or a decimal.Decimal"
    )


def to_jsonable(value: Any, *, path: str = "$") -> Any:
    """Normalize ``value`` to JSON types (dict with str keys, list, str, int, float, bool, None).

    What is accepted is what both ledgers (SQLite and PostgreSQL) store and give back identically;
    the rest is refused here, before anything is recorded, rather than by one backend only (or
    not at all, and altered):

    - text (strings and dict keys) must be Unicode without NUL: PostgreSQL refuses ``\\x00`` in
      text and jsonb, and a lone surrogate has no UTF-8 form at all. Bytes carry anything;
    - integers must fit 64 bits signed, ``[INT_MIN, INT_MAX]`` (beyond, JSON consumers round them
      and the backends disagree); pass a larger number as a string or a ``Decimal``;
    - a value may nest at most ``MAX_DEPTH`` (64) dicts and lists, itself included: past that it
      is refused (never a ``RecursionError``, however deep, also for a value containing itself);
    - floats must be finite; datetimes aware; dict keys strings (or enums of strings).

    Dicts and lists are walked without building a path per item; ``path`` names the value in a
    refusal, which gives the full path of the offending part (``input.items[3].name``).

    Raises:
        errors.ArgumentError: with the path of the first value that cannot be recorded, and what
            to pass instead.
    """
    return _jsonable(value, path, MAX_DEPTH)


def _jsonable(value: Any, path: str, depth: int) -> Any:
    """``to_jsonable`` with ``depth`` dicts and lists allowed (``digest`` allows more)."""
    try:
        return _normalize(value, depth)
    except _Refused as refused:
        raise errors.ArgumentError(f"{_where(path, refused.segments)}: {refused.why}") from None


def _where(path: str, segments: list[str]) -> str:
    """The refused value's path: ``path`` then the segments, outermost first, a long run of one
    segment shortened (``[0][0][0]...(58 more)...[0][0][0]``: a value refused for its depth)."""
    parts: list[str] = [path]
    ordered = segments[::-1]
    i = 0
    while i < len(ordered):
        segment = ordered[i]
        run = 1
        while i + run < len(ordered) and ordered[i + run] == segment:
            run += 1
        if run > 8:
            parts.append(segment * 3 + f"...({run - 6} more)..." + segment * 3)
        else:
            parts.append(segment * run)
        i += run
    return "".join(parts)


def _normalize(value: Any, depth: int) -> Any:
    """``to_jsonable`` itself; ``depth`` is how many more dicts and lists may be opened.

    The exact built-in types come first, tested by identity (what nearly every value is); their
    subclasses and every other type take ``_other``.
    """
    kind = type(value)
    if kind is str:
        # The common case, ASCII without NUL, costs two C calls and no function call.
        if ("\x00" in value or not value.isascii()) and not _recordable_text(value):
            raise _Refused(_text_problem(value, "the text"))
        return value
    if kind is dict:
        if depth <= 0:
            raise _Refused(_DEEP)
        out: dict[str, Any] = {}
        for key, item in value.items():
            if type(key) is not str or "\x00" in key or not key.isascii():
                key = _checked_key(key)
            try:
                out[key] = _normalize(item, depth - 1)
            except _Refused as refused:
                refused.segments.append(_key_segment(key))
                raise
        return out
    if kind is int:
        if INT_MIN <= value <= INT_MAX:
            return value
        raise _Refused(_int_problem(value))
    if kind is list or kind is tuple:
        if depth <= 0:
            raise _Refused(_DEEP)
        items = []
        for index, item in enumerate(value):
            try:
                items.append(_normalize(item, depth - 1))
            except _Refused as refused:
                refused.segments.append(f"[{index}]")
                raise
        return items
    if value is None or kind is bool:
        return value
    if kind is float:
        if not math.isfinite(value):
            raise _Refused(f"{value!r} has no JSON form; pass a finite number")
        # Integral floats print as integers so 1.0 and 1 digest the same (as RFC 8785 does).
        if value.is_integer() and -_FLOAT_EXACT < value < _FLOAT_EXACT:
            return int(value)
        return value
    return _other(value, depth)


def _checked_key(key: Any) -> str:
    """A dict key as recorded: a string (an enum's value), without NUL or lone surrogates."""
    if isinstance(key, enum.Enum):
        key = key.value
    if not isinstance(key, str):
        raise _Refused(f"dict key {_short(key)} is a {type(key).__name__}; use str keys")
    if not _recordable_text(key):
        raise _Refused(_text_problem(key, f"dict key {_short(key)}", fix=""))
    return key


def _other(value: Any, depth: int) -> Any:
    """``_normalize`` for every type that is not exactly a str, dict, list, tuple, int, float,
    bool or None: subclasses of those, other containers, and the types with a JSON form."""
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        if not _recordable_text(value):
            raise _Refused(_text_problem(value, "the text"))
        return value
    if isinstance(value, int):
        return _normalize(int(value), depth)
    if isinstance(value, float):
        return _normalize(float(value), depth)
    if isinstance(value, Mapping):
        return _normalize(dict(value.items()), depth)
    if isinstance(value, list | tuple):
        return _normalize(list(value), depth)
    if isinstance(value, set | frozenset):
        if depth <= 0:
            raise _Refused(_DEEP)
        items = []
        for item in value:
            try:
                items.append(_normalize(item, depth - 1))
            except _Refused as refused:
                refused.segments.append("[]")
                raise
        return sorted(items, key=canonical_json)
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise _Refused(f"naive datetime {value.isoformat()} is ambiguous; attach a timezone")
        return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, decimal.Decimal):
        if not value.is_finite():
            raise _Refused(f"{value!r} has no JSON form; pass a finite number")
        return str(value.normalize())
    if isinstance(value, uuid.UUID | PurePath):
        return _normalize(str(value), depth)
    if isinstance(value, enum.Enum):
        return _normalize(value.value, depth)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        try:
            fields = dataclasses.asdict(value)  # recursive: a dataclass 100k deep overflows it
        except RecursionError:
            raise _Refused(_DEEP) from None
        return _normalize(fields, depth)
    # pydantic v2 models, without importing pydantic
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump):
        try:
            dumped = model_dump(mode="json")
        except RecursionError:
            raise _Refused(_DEEP) from None
        return _normalize(dumped, depth)
    raise _Refused(
        f"a {type(value).__name__} cannot be recorded; pass JSON-like data "
        "(dict, list, str, number, bool, None, datetime, bytes, dataclass or pydantic model)"
    )


def check_id(value: Any, *, path: str) -> str:
    """``value`` as an id the ledger stores as text (a run id, a step id, a host's scope or call
    id, an approval or decision id, a tenant): a string with a non-space character, without NUL
    or lone surrogates — the same rule on both ledgers (PostgreSQL refuses a NUL that SQLite would
    store), and never an empty id silently replaced by another.

    Raises:
        errors.ArgumentError: naming ``path`` and what to pass instead.
    """
    if not isinstance(value, str):
        raise errors.ArgumentError(f"{path}: must be a string, not a {type(value).__name__}")
    if not value.strip():
        raise errors.ArgumentError(
            f"{path}: must contain a non-space character, not {value!r}; pass a stable id of "
            "your own, or leave it out where a fresh id is allowed"
        )
    if not _recordable_text(value):
        raise errors.ArgumentError(f"{path}: {_text_problem(value, 'the id', fix='')}")
    return value


def recordable_text(text: str) -> str:
    """``text`` with what no ledger can store escaped: NUL as ``\\x00``, a lone surrogate as
    its ``\\u`` escape (e.g. ``\\udc80``); unchanged (the same object) when there is none,
    which is nearly always.

    For text that describes something that already happened and must be recorded whatever it
    contains (a tool's exception message, a lookup's reason): refusing it would lose the record.
    Values a caller passes are refused instead (``to_jsonable``), so the caller can fix them.
    """
    if _recordable_text(text):
        return text
    escaped = text.replace("\x00", "\\x00")
    return escaped.encode("utf-8", "backslashreplace").decode("utf-8")


def json_printer(*, sort_keys: bool) -> Callable[[Any], str]:
    """``JSONEncoder(separators=(",", ":"), ensure_ascii=False, sort_keys=...).encode`` as one C
    encoder made once (that very ``encode`` where ``json`` has no C speedups).

    ``JSONEncoder.encode`` builds a new C encoder, a float printer and a markers dict on every
    call, which costs more than printing the small values the write path prints (~30 a step).
    The C encoder made here prints the very same text (its floats by ``float.__repr__``, NaN and
    the infinities as ``NaN``/``Infinity`` as ``allow_nan`` allows, strings by the same
    ``encode_basestring``). It keeps no markers (``check_circular`` off): a markers dict shared
    by every call and thread would outlive a failed call with stale entries. A value that
    contains itself raises ``RecursionError`` instead of ``ValueError``; the values printed here
    are normalized first (``to_jsonable`` refuses a value that contains itself) or built by
    effectflow."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return json.JSONEncoder(
            sort_keys=sort_keys, separators=(",", ":"), ensure_ascii=False
        ).encode
    encode = make(
        None,  # markers: no circular check (see above)
        json.JSONEncoder().default,  # raises TypeError for a type JSON has no form for
        json.encoder.encode_basestring,  # ensure_ascii=False
        None,  # indent
        ":",
        ",",
        sort_keys,
        False,  # skipkeys
        True,  # allow_nan
    )
    join = "".join

    def printed(value: Any) -> str:
        return join(encode(value, 0))

    return printed


#: ``canonical_json`` itself (``json_printer``).
_canonical = json_printer(sort_keys=True)


def canonical_json(value: Any) -> str:
    """Print already-normalized JSON one way only: sorted keys, no spaces, UTF-8 kept as is."""
    return _canonical(value)


#: The JSON text of a string, as ``canonical_json`` prints it (a string has one print).
json_string: Callable[[str], str] = json.encoder.encode_basestring


#: ``json_number``'s memo: a finite, nonzero float's text (zero is left out: ``-0.0 == 0.0``).
_NUMBERS: dict[float, str] = {}
#: How many texts the memo keeps before it starts over (a batch's times are a few values, mostly
#: its ``now`` and the times of the rows it rewrites).
_NUMBERS_KEPT = 4096


def json_number(value: float) -> str:
    """The JSON text of a float (a time), as ``canonical_json`` prints it, remembered.

    A float's shortest round-trip text (``float.__repr__``, which the encoder prints a finite
    float with) costs ~9,000 instructions, more than anything else a row's print does, and a
    batch prints the same few times again and again (its ``now`` in half its columns, its event,
    its seal). Equal finite nonzero floats have one text, so it is kept by value. Anything else
    (an int a test clock gives, a float subclass, NaN, the infinities, zero) goes through
    ``canonical_json`` as before."""
    if type(value) is float:
        text = _NUMBERS.get(value)
        if text is not None:
            return text
        if value and math.isfinite(value):
            if len(_NUMBERS) >= _NUMBERS_KEPT:
                _NUMBERS.clear()
            text = _NUMBERS[value] = float.__repr__(value)
            return text
    return canonical_json(value)


def dumps(value: Any) -> str:
    """Normalize then print canonically: what the ledger stores."""
    return canonical_json(to_jsonable(value))


def sha256_hex(text: str) -> str:
    """Hex sha256 of a UTF-8 string.

    Raises:
        errors.ArgumentError: ``text`` has a lone surrogate (no UTF-8 form). Normalized values
            never do; raw text digested directly (a host's ids) might, and must not surface as a
            ``UnicodeEncodeError`` from deep inside a call.
    """
    try:
        return hashlib.sha256(text.encode("utf-8")).hexdigest()
    except UnicodeEncodeError:
        raise errors.ArgumentError(
            _text_problem(text, "text to digest", fix="") + " (check the ids passed)"
        ) from None


def digest(value: Any) -> str:
    """``sha256:<hex>`` of the canonical form of ``value`` (the ledger's request/response digests).

    Normalized as ``to_jsonable`` does, but ``ENVELOPE_DEPTH`` levels deeper: only the hash is
    recorded, and the value may be an envelope around a value already accepted for recording.
    """
    normalized = _jsonable(value, "$", MAX_DEPTH + ENVELOPE_DEPTH)
    return "sha256:" + sha256_hex(canonical_json(normalized))


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
