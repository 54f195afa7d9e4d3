"""effectflow half of crash_side_by_side.py: ``crash DIR`` dies right after the append; ``recover DIR``."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common

import effectflow as ef

PROVIDER: _common.Provider | None = None
CRASH = False


@ef.tool("crash_find_line", effect="read")
def find_line(*, idempotency_key: str) -> ef.Lookup:
    """The lookup: reads the file for the key."""
    assert PROVIDER is not None
    if PROVIDER.find(idempotency_key):
        return ef.Lookup.confirmed(external_effect_id=idempotency_key)
    return ef.Lookup.not_committed()


@ef.tool("crash_append_line", effect="external_write", confirm=find_line, settles_within=0)
def append_line(payload: str, *, idempotency_key: str) -> dict[str, Any]:
    assert PROVIDER is not None
    PROVIDER.append(idempotency_key, payload)
    if CRASH:  # after the outside world changed, before the outcome is recorded
        os.kill(os.getpid(), signal.SIGKILL)
    return {"key": idempotency_key}


@ef.workflow("crash_one_write")
def one_write(ctx: ef.Context) -> None:
    ctx.call("append", append_line, payload="the line")


def main() -> None:
    global PROVIDER, CRASH
    mode, folder = sys.argv[1], Path(sys.argv[2])
    PROVIDER = _common.Provider(folder / "provider.txt")
    durability = os.environ.get("EFFECTFLOW_DURABILITY", "full")
    rt = ef.Runtime(f"sqlite:///{folder / 'effectflow.db'}?durability={durability}")
    try:
        if mode == "crash":
            CRASH = True
            rt.start(one_write, run_id="crash-run")
        else:
            done = rt.recover()
            print(f"recovered: {[str(r.status) for r in done]}")
    finally:
        rt.close()


if __name__ == "__main__":
    main()
