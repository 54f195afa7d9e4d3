"""ISO 8601 durations (``PT24H``, ``P1D``, ``PT10M``), the form the seed's contracts use for retention
and deadlines."""

from __future__ import annotations

import datetime as dt
import math
import re

from effectflow import errors

_DURATION = re.compile(
    r"^P(?!$)(?:(?P<days>\d+(?:\.\d+)?)D)?"
    r"(?:T(?!$)(?:(?P<hours>\d+(?:\.\d+)?)H)?(?:(?P<minutes>\d+(?:\.\d+)?)M)?"
    r"(?:(?P<seconds>\d+(?:\.\d+)?)S)?)?$"
)


def parse_duration(value: str | float | int | dt.timedelta, *, field: str = "duration") -> float:
    """Seconds in an ISO 8601 duration, a number of seconds, or a timedelta.

    Raises:
        errors.ContractError: naming ``field`` when the value is not a duration.
    """
    if isinstance(value, dt.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool):
        raise errors.ContractError(f"{field}: {value!r} is not a duration; write e.g. 'PT24H'")
    elif isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION.match(value.strip().upper())
        if match is None:
            raise errors.ContractError(
                f"{field}: {value!r} is not an ISO 8601 duration; write e.g. 'PT24H', 'PT10M', 'P1D'"
            )
        parts = {k: float(v) for k, v in match.groupdict().items() if v is not None}
        seconds = (
            parts.get("days", 0.0) * 86400
            + parts.get("hours", 0.0) * 3600
            + parts.get("minutes", 0.0) * 60
            + parts.get("seconds", 0.0)
        )
    else:
        raise errors.ContractError(f"{field}: {value!r} is not a duration; write e.g. 'PT24H'")
    if not math.isfinite(seconds):
        raise errors.ContractError(f"{field}: {value!r} is not a finite duration")
    if seconds < 0:
        raise errors.ContractError(f"{field}: a duration cannot be negative ({value!r})")
    return seconds
