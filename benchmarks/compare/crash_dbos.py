"""DBOS half of crash_side_by_side.py: ``crash DIR`` dies right after the append; ``recover DIR``
relaunches DBOS, which recovers the pending workflow (run by ``.venvs/dbos``)."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common
from dbos import DBOS, SetWorkflowID

PROVIDER: _common.Provider | None = None
CRASH = False
KEY = "crash-line"


@DBOS.step()
def append_line(payload: str) -> str:
    assert PROVIDER is not None
    PROVIDER.append(KEY, payload)
    if CRASH:  # after the outside world changed, before DBOS checkpoints the step's output
        os.kill(os.getpid(), signal.SIGKILL)
    return KEY


@DBOS.workflow()
def one_write() -> None:
    append_line("the line")


def main() -> None:
    global PROVIDER, CRASH
    mode, folder = sys.argv[1], Path(sys.argv[2])
    PROVIDER = _common.Provider(folder / "provider.txt")
    db = folder / "dbos.sqlite"
    DBOS(config={"name": "effectflow-crash", "system_database_url": f"sqlite:///{db}"})
    DBOS.launch()  # on relaunch, recovers this executor's pending workflows
    try:
        if mode == "crash":
            CRASH = True
            with SetWorkflowID("crash-run"):
                one_write()
        else:
            handle = DBOS.retrieve_workflow("crash-run")
            handle.get_result()  # waits for the recovery the launch started
            print(f"recovered: {handle.get_status().status}")
    finally:
        DBOS.destroy()


if __name__ == "__main__":
    main()
