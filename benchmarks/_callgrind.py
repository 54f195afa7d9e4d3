"""The instructions a command executes inside ``sys.call_tracing`` (valgrind's callgrind), for the
benchmarks that count instructions instead of timing: the same binary, inputs and environment
count the same whatever else the machine is doing."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path


def instructions(command: list[str]) -> int:
    """Run ``command`` (``PYTHONHASHSEED=0``) under callgrind, collecting only inside
    ``sys.call_tracing`` (a C function nothing else calls: the measured code is called through
    it), and return the instructions collected."""
    with tempfile.TemporaryDirectory(prefix="effectflow-callgrind-") as folder:
        out = Path(folder) / "callgrind.out"
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--collect-atstart=no",
                "--toggle-collect=sys_call_tracing",
                f"--callgrind-out-file={out}",
                *command,
            ],
            env={**os.environ, "PYTHONHASHSEED": "0"},
            check=True,
            capture_output=True,
        )
        for line in out.read_text().splitlines():
            if line.startswith("summary:"):
                return int(line.split()[1])
    raise RuntimeError(f"callgrind wrote no summary line for {command}")
