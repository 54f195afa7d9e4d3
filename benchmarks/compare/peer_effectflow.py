"""The workloads on effectflow (SQLite ledger), run by the project's own virtual environment."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common

import effectflow as ef

PROVIDER: _common.Provider | None = None


def _provider() -> _common.Provider:
    assert PROVIDER is not None
    return PROVIDER


@ef.tool("cmp_const")
def const() -> int:
    return _common.const()


@ef.tool("cmp_find_line", effect="read")
def find_line(*, idempotency_key: str) -> ef.Lookup:
    """The lookup: the provider file has a line for the key, or it does not."""
    if _provider().find(idempotency_key):
        return ef.Lookup.confirmed(external_effect_id=idempotency_key)
    return ef.Lookup.not_committed()


@ef.tool("cmp_append_line", effect="external_write", confirm=find_line)
def append_line(payload: str, *, idempotency_key: str) -> dict[str, Any]:
    """The external write: intent recorded, line appended under its key, outcome recorded."""
    _provider().append(idempotency_key, payload)
    return {"key": idempotency_key}


@ef.workflow("cmp_pure")
def pure(ctx: ef.Context) -> None:
    for i in range(_common.STEPS):
        ctx.call(f"s{i}", const)


@ef.workflow("cmp_write")
def write(ctx: ef.Context) -> None:
    for i in range(_common.STEPS):
        ctx.call(f"w{i}", append_line, payload="x")


class Harness:
    def __init__(self, folder: Path, provider: _common.Provider, url_query: str = "") -> None:
        global PROVIDER
        PROVIDER = provider
        self.db = folder / "effectflow.db"
        self.rt = ef.Runtime(f"sqlite:///{self.db}{url_query}")

    def run(self, workload: str, runs: int, prefix: str) -> None:
        flow = write if workload == "write" else pure

        def one(r: int) -> None:
            run = self.rt.start(flow, run_id=f"{prefix}-{r}")
            if run.status is not ef.RunStatus.SUCCEEDED:
                raise RuntimeError(f"run {run.run_id} ended {run.status}: {run.error}")

        _common.fan_out(workload, runs, one)

    def close(self) -> None:
        self.rt.close()


if __name__ == "__main__":
    _common.main(Harness)
