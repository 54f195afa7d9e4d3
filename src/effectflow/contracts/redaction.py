"""What a step records of its arguments: the canonical arguments with a tool's redaction rule
applied, capped in size (docs/arguments.md).

The rule is for display only. The request digest, the idempotency key, the logical operation and
the payload-conflict check are computed from the arguments *before* redaction, so a rule changes
what an operator can read, never which call is which: two calls that differ only in a dropped
secret still conflict, and adding a rule to a contract keeps every key it derived.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from effectflow import digests, errors

#: What a masked value is recorded as: the operator sees that the field was sent, not its value.
MASK = "[masked]"
#: The largest canonical JSON of a step's (redacted) arguments that is recorded as it is. Over
#: it, ``over_cap`` is recorded instead: a marker with the size and the request digest, never a
#: truncated text that would read as the whole call.
CAP_BYTES = 8192
#: The one key of the marker recorded for arguments over ``CAP_BYTES`` (not a Python identifier,
#: so it is never a tool's parameter).
OVER_CAP = "@over_cap"


@dataclasses.dataclass(frozen=True)
class Redact:
    """A tool's redaction rule: which argument fields a step records without their values.

    Each path is a parameter name, or a dotted path into a parameter that is a mapping
    (``"card.number"``, ``"headers.X-Api-Key"``: after the parameter, a segment is any key without
    a dot); inside a list (and a list of lists), the path applies to each element. ``drop``
    removes the field from what is recorded; ``mask`` keeps the field with the value
    ``"[masked]"``, so the operator sees it was sent. A path must name a parameter of the tool
    (checked when the tool is declared); a field missing from one call is simply not there to
    redact. Where a call passes something else than a mapping at a point the path goes through
    (the card as its number, not ``{"number": ...}``), that value is recorded as ``"[masked]"``:
    the rule fails closed, since the value it could not look into may be the secret.
    """

    #: Fields removed from the recorded arguments (a list or tuple of paths; kept as a tuple).
    drop: Sequence[str] = ()
    #: Fields recorded as ``"[masked]"`` (a list or tuple of paths; kept as a tuple).
    mask: Sequence[str] = ()

    def __post_init__(self) -> None:
        for name in ("drop", "mask"):
            given = getattr(self, name)
            if isinstance(given, str | bytes) or not isinstance(given, Iterable):
                raise errors.ContractError(
                    f"redact {name} must be a list of field paths, not {given!r}"
                )
            paths = tuple(given)
            for path in paths:
                _check_syntax(name, path)
            object.__setattr__(self, name, paths)
        both = sorted(set(self.drop) & set(self.mask))
        if both:
            raise errors.ContractError(
                f"redact names {both[0]!r} in both drop and mask; a field is dropped or masked"
            )

    @classmethod
    def of(cls, given: Redact | Mapping[str, Any] | None) -> Redact | None:
        """``given`` as a rule: a ``Redact``, a mapping with ``drop`` / ``mask``, or None."""
        if given is None or isinstance(given, Redact):
            return given
        if not isinstance(given, Mapping):
            raise errors.ContractError(
                f"redact must be ef.Redact(drop=[...], mask=[...]) or a mapping with drop and "
                f"mask, not {type(given).__name__}"
            )
        unknown = sorted(set(given) - {"drop", "mask"})
        if unknown:
            raise errors.ContractError(
                f"redact has unknown key {unknown[0]!r}; it takes drop and mask (lists of paths)"
            )
        return cls(drop=given.get("drop", ()), mask=given.get("mask", ()))

    @property
    def paths(self) -> tuple[str, ...]:
        """Every path the rule names, dropped then masked."""
        return (*self.drop, *self.mask)


def _check_syntax(name: str, path: object) -> None:
    """A parameter name, then keys: any text but empty or with surrounding blanks."""
    parts = path.split(".") if isinstance(path, str) else []
    if not parts or not parts[0].isidentifier() or any(p != p.strip() or not p for p in parts):
        raise errors.ContractError(
            f"redact {name} path {path!r} is not a parameter name or a dotted path such as "
            "'card.number' or 'headers.X-Api-Key'"
        )


def check_parameters(rule: Redact, signature: inspect.Signature, ref: str) -> None:
    """Refuse a rule whose path names no parameter of the tool (a misspelt secret would otherwise
    be recorded in full, silently). A function that takes ``**kwargs`` accepts any name.

    Raises:
        errors.ContractError: naming the path and the parameters that exist.
    """
    params = signature.parameters
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return
    for path in rule.paths:
        head = path.split(".", 1)[0]
        if head not in params:
            listed = ", ".join(params) or "none"
            raise errors.ContractError(
                f"tool {ref}: redact path {path!r} names no parameter of the tool "
                f"(its parameters: {listed})"
            )


def apply(arguments: Mapping[str, Any], rule: Redact | None) -> dict[str, Any]:
    """A copy of canonical ``arguments`` with ``rule`` applied (the input is not changed)."""
    out = dict(arguments)
    if rule is None:
        return out
    for path in rule.drop:
        out = _redacted(out, path.split("."), drop=True)
    for path in rule.mask:
        out = _redacted(out, path.split("."), drop=False)
    return out


def _redacted(value: dict[str, Any], parts: list[str], *, drop: bool) -> dict[str, Any]:
    head, rest = parts[0], parts[1:]
    if head not in value:
        return value
    out = dict(value)
    if not rest:
        if drop:
            del out[head]
        else:
            out[head] = MASK
        return out
    out[head] = _inside(value[head], rest, drop=drop)
    return out


def _inside(value: Any, parts: list[str], *, drop: bool) -> Any:
    """``value`` with the rest of a path applied: into a mapping, into each element of a list
    (at any depth), and a value the path cannot go into (a scalar where a mapping was expected)
    masked whole, since it may be the secret itself; null stays null."""
    if isinstance(value, dict):
        return _redacted(value, parts, drop=drop)
    if isinstance(value, list):
        return [_inside(item, parts, drop=drop) for item in value]
    return value if value is None else MASK


def recorded(
    arguments: Mapping[str, Any],
    rule: Redact | None,
    request_digest: str,
    *,
    size: int | None = None,
) -> dict[str, Any]:
    """What a step records of its canonical ``arguments``: redacted, or the over-cap marker.

    ``size``: the bytes of the arguments' canonical JSON when the caller printed it already (the
    step machine does, for the digest); without a rule it is the recorded size, so every step
    does not print its arguments a second time."""
    shown = apply(arguments, rule)
    if rule is None and size is not None:
        if size <= CAP_BYTES:
            return shown
    else:
        size = len(digests.canonical_json(shown).encode("utf-8"))
    if size > CAP_BYTES:
        return {OVER_CAP: {"bytes": size, "cap": CAP_BYTES, "request_digest": request_digest}}
    return shown
