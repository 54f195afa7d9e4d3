"""How the one-round-trip batches of several processes go on one PostgreSQL ledger.

``N`` runtimes, each with its own store (its own pool and remembered heads, as a process has), on
one fresh database; after ``--warm`` write workflows (every audit shard's first seal), each drives
``--runs`` write workflows from a thread of its own, all at once. Printed: the stores' ``trips``
summed (one_trip / moved / by_statement) and the round trips a batch they come to (a moved batch
costs one more; one applied by statement is counted as two). Run::

    .venv/bin/python benchmarks/pg_stores.py 1 4
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pg_write_step

from effectflow import bench


def measure(stores: int, warm: int, runs: int) -> dict[str, int]:
    """One measurement: ``stores`` runtimes on a fresh database."""
    with (
        tempfile.TemporaryDirectory() as folder,
        pg_write_step.fresh_database("pgstores") as url,
    ):
        providers = [bench.Provider(Path(folder) / f"p{i}.txt") for i in range(stores)]
        workloads = [bench.Workloads(url, provider) for provider in providers]
        try:
            workloads[0].run("write", warm, "warm")
            trips = [w.rt.store.trips for w in workloads]  # type: ignore[attr-defined]
            for found in trips:
                found.update(one_trip=0, moved=0, by_statement=0)
            threads = [
                threading.Thread(target=w.run, args=("write", runs, f"s{i}"))
                for i, w in enumerate(workloads)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            return {k: sum(t[k] for t in trips) for k in ("one_trip", "moved", "by_statement")}
        finally:
            for w in workloads:
                w.close()
            for provider in providers:
                provider.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("stores", type=int, nargs="+")
    parser.add_argument("--warm", type=int, default=300)
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args(argv)
    for stores in args.stores:
        total = measure(stores, args.warm, args.runs)
        batches = total["one_trip"] + total["by_statement"]
        trips = total["one_trip"] + total["moved"] + 2 * total["by_statement"]
        print(f"{stores} store(s): {total}; round trips a batch: {trips / batches:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
