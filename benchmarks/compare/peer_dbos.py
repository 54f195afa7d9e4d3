"""The workloads on DBOS Transact for Python (SQLite system database), run by ``.venvs/dbos``."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common
from dbos import DBOS, SetWorkflowID

PROVIDER: _common.Provider | None = None


@DBOS.step()
def const() -> int:
    return _common.const()


@DBOS.step()
def append_line(key: str, payload: str) -> str:
    """A DBOS step: checkpointed after it returns; re-run from the start if the process died in it."""
    assert PROVIDER is not None
    PROVIDER.append(key, payload)
    return key


@DBOS.workflow()
def pure() -> None:
    for _ in range(_common.STEPS):
        const()


@DBOS.workflow()
def write(run: str) -> None:
    for i in range(_common.STEPS):
        append_line(f"{run}-w{i}", "x")


def launch(folder: Path) -> Path:
    db = folder / "dbos.sqlite"
    DBOS(config={"name": "effectflow-compare", "system_database_url": f"sqlite:///{db}"})
    DBOS.launch()
    return db


class Harness:
    def __init__(self, folder: Path, provider: _common.Provider) -> None:
        global PROVIDER
        PROVIDER = provider
        self.db = launch(folder)

    def run(self, workload: str, runs: int, prefix: str) -> None:
        def one(r: int) -> None:
            with SetWorkflowID(f"{prefix}-{r}"):
                if workload == "write":
                    write(f"{prefix}-{r}")
                else:
                    pure()

        _common.fan_out(workload, runs, one)

    def close(self) -> None:
        DBOS.destroy()


if __name__ == "__main__":
    _common.main(Harness)
