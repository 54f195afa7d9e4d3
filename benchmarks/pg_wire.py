"""What a write step sends to PostgreSQL, counted on the wire: libpq's trace of every pooled
connection, for the effectflow on ``PYTHONPATH`` (this tree, or an exported commit's ``src``).

A fresh database; ``--warm`` write workflows first (enough that every one of the 64 audit shards
has its first seal, which goes statement by statement), then ``--runs`` traced ones. Printed: the
frontend messages a step (Bind/Execute: statements; Sync and Flush: the waits for the server), and
the store's ``trips`` where it has them (one_trip / moved / by_statement). Run::

    .venv/bin/python benchmarks/pg_wire.py
    PYTHONPATH=<tree>/src .venv/bin/python benchmarks/pg_wire.py --warm 80
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pg_write_step
from psycopg import pq

from effectflow import bench


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm", type=int, default=300)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args(argv)
    fd, trace = tempfile.mkstemp(prefix="pg-wire-")
    with (
        tempfile.TemporaryDirectory() as folder,
        pg_write_step.fresh_database("pgwire") as url,
    ):
        provider = bench.Provider(Path(folder) / "provider.txt")
        workloads = bench.Workloads(url, provider)
        workloads.run("write", args.warm, "warm")
        pool = workloads.rt.store._pool  # type: ignore[attr-defined]
        idle = list(pool._pool)  # every connection is idle between runs
        for conn in idle:
            conn.pgconn.trace(os.dup(fd))
            conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        workloads.run("write", args.runs, "traced")
        for conn in idle:
            conn.pgconn.untrace()
        trips = getattr(workloads.rt.store, "trips", None)
        workloads.close()
        provider.close()
    kinds: collections.Counter[str] = collections.Counter()
    for line in Path(trace).read_text("utf-8", errors="replace").splitlines():
        parts = line.split("\t")
        if len(parts) > 2 and parts[0] == "F":
            kinds[parts[2].split()[0]] += 1
    os.close(fd)
    os.unlink(trace)
    steps = args.runs * pg_write_step.STEPS
    waits = kinds["Sync"] + kinds["Flush"] + kinds["Query"]
    print({kind: round(n / steps, 2) for kind, n in sorted(kinds.items())}, "a step")
    print(f"waits for the server a step (Sync + Flush + Query): {waits / steps:.2f}")
    print(f"store trips (all runs): {trips}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
