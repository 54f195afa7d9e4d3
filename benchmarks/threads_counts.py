"""What 8 threads add to a write step, in counts that load does not move: instructions and syscalls
(issue 18, BENCHMARKS.md "Session 10", "Threads: the wakeups, not the Python").

``threads_write.py`` times 8 threads against one; this says where the difference goes. Each
measurement is a child process running ``effectflow.bench.Workloads``' write workflow on a fresh
SQLite ledger through a ``ThreadPoolExecutor`` of 1 or ``--threads`` threads sharing one Runtime:

- ``--callgrind``: instructions a step at ``synchronous=off`` under ``valgrind --tool=callgrind``,
  collected only inside each timed run (every run is called through ``sys.call_tracing``, the one
  function callgrind collects in: ``--toggle-collect=sys_call_tracing``), so every thread's
  instructions count and the warm-up's do not;
- by default: syscalls a step at the default durability (FULL) under ``strace -f -c``, two child
  runs of N and N + ``--runs`` workflows subtracted, so start-up cancels out: ``futex`` (the GIL's
  and the group committer's handoffs), ``pwrite64`` (WAL frames), ``fdatasync``, ``fcntl``.

Usage::

    .venv/bin/python benchmarks/threads_counts.py              # syscalls, 1 and 8 threads (~1 min)
    .venv/bin/python benchmarks/threads_counts.py --callgrind  # instructions (~3 min)
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import _callgrind

SYSCALLS = ("futex", "pwrite64", "fdatasync", "fcntl", "pread64")


def _child(threads: int, runs: int, query: str, traced: bool) -> None:
    """In the measured process: a warm-up, then ``runs`` workflows on ``threads`` threads."""
    from effectflow import bench

    folder = Path(tempfile.mkdtemp(prefix="effectflow-threads-counts-"))
    provider = bench.Provider(folder / "provider.txt")
    w = bench.Workloads(f"sqlite:///{folder / 'ledger.db'}{query}", provider)
    flow = w._flows["write"]
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda r: w.rt.start(flow, run_id=f"warm-{r}"), range(16)))

    def one(r: int) -> object:
        start = functools.partial(w.rt.start, flow, run_id=f"timed-{r}")
        return sys.call_tracing(start, ()) if traced else start()

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(runs)))
    committer = w.rt.committer
    grouped = committer.batches / max(1, committer.transactions) if committer else 1.0
    w.close()
    provider.close()
    print(json.dumps({"batches_per_txn": grouped}))


def _command(threads: int, runs: int, query: str, traced: bool) -> list[str]:
    argv = [sys.executable, __file__, "--child", str(threads), str(runs), query]
    return [*argv, "--traced"] if traced else argv


def instructions(threads: int, runs: int) -> float:
    """Instructions a step (every thread's) at ``synchronous=off``."""
    command = _command(threads, runs, "?synchronous=off", traced=True)
    return _callgrind.instructions(command) / (runs * 10)


def _strace_counts(threads: int, runs: int) -> dict[str, int]:
    with tempfile.TemporaryDirectory(prefix="effectflow-threads-strace-") as folder:
        out = Path(folder) / "strace.txt"
        subprocess.run(
            ["strace", "-f", "-c", "-o", str(out), *_command(threads, runs, "", traced=False)],
            check=True,
            capture_output=True,
        )
        counts: dict[str, int] = {}
        for line in out.read_text().splitlines():
            fields = line.split()
            if len(fields) >= 5 and fields[0][0].isdigit() and fields[-1] in SYSCALLS:
                counts[fields[-1]] = int(fields[3])
        return counts


def syscalls(threads: int, runs: int) -> dict[str, float]:
    """Syscalls a step at FULL: a child of ``runs`` + 8 workflows minus one of 8."""
    small, large = _strace_counts(threads, 8), _strace_counts(threads, runs + 8)
    return {name: (large.get(name, 0) - small.get(name, 0)) / (runs * 10) for name in SYSCALLS}


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        threads, runs, query = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
        _child(threads, runs, query, traced="--traced" in sys.argv[5:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--runs", type=int, default=100, help="measured workflows (10 steps each)")
    parser.add_argument("--callgrind", action="store_true", help="instructions instead of syscalls")
    args = parser.parse_args()
    if args.threads < 2 or args.runs < 1:
        parser.error("--threads must be at least 2 and --runs at least 1")
    counts = (1, args.threads)
    if args.callgrind:
        runs = min(args.runs, 40)
        print(f"# instructions a write step, synchronous=off, {runs} workflows (callgrind)")
        for n in counts:
            print(f"  {n} thread(s): {instructions(n, runs):,.0f}", flush=True)
        return
    print(
        f"# syscalls a write step, FULL, {args.runs} workflows (strace -f -c, start-up subtracted)"
    )
    print("| threads | " + " | ".join(SYSCALLS) + " |")
    print("| ---: | " + " | ".join("---:" for _ in SYSCALLS) + " |")
    for n in counts:
        found = syscalls(n, args.runs)
        print(f"| {n} | " + " | ".join(f"{found[s]:.2f}" for s in SYSCALLS) + " |", flush=True)


if __name__ == "__main__":
    main()
