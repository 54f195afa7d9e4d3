"""The workload of ``benchmarks/workers.py``: runs of external-write steps with no provider behind
them, so what is measured is the runtime (intent and outcome, both durable) and the ledger."""

from __future__ import annotations

import effectflow as ef


@ef.tool("bench_write", effect="external_write", effect_id="id")
def write(n: int) -> dict[str, int]:
    return {"id": n}


@ef.workflow("bench_writes")
def writes(ctx: ef.Context, steps: int) -> int:
    for i in range(steps):
        ctx.call(f"w{i}", write, n=i)
    return steps
