"""Backoff between technical retries and lookups: exponential, capped, with jitter."""

from __future__ import annotations

import random

from effectflow.contracts.tool import RetryPolicy


def backoff(policy: RetryPolicy, retry_number: int, rng: random.Random | None = None) -> float:
    """Seconds to wait before retry ``retry_number`` (1 = the first retry).

    Jitter spreads many runs that failed together (a provider outage) so they do not retry in step.
    """
    if retry_number < 1:
        return 0.0
    base = min(policy.max_backoff, policy.initial_backoff * policy.multiplier ** (retry_number - 1))
    # "Equal jitter": keep at least (1 - jitter) of the base, randomize the rest.
    return max(0.0, base - base * policy.jitter * (rng or random).random())
