"""What one more WAL frame costs a durable SQLite commit on this machine (issue 18).

Session 8 measured twenty one-row INSERTs into twenty tables against one table a commit and found
the difference inside the noise ("pages are cheap at FULL"), so the write step's ≈ 20 WAL frames a
commit were taken to cost little beyond the fsync itself. This measures it directly, in one
interleaved run: raw commits (``BEGIN IMMEDIATE``, one row into each of N tables, ``COMMIT``, as
the ledger commits) for N = 1, 5, 10, 20 — N tables write N leaf pages, so N WAL frames a
commit — at ``synchronous=FULL`` and ``off``, on fresh files, with keys in order or random
(``uuid4``, as the ledger's ids are). Printed: µs of wall time and of process CPU (user + system,
which includes the kernel's work for each fsync) a commit, medians; FULL's wall time less off's
(what the flush itself costs); and the least-squares slopes over N = 5 … 20 (a one-frame commit
is its own case on a virtual disk: it was slower than a five-frame one in some runs) of FULL's
wall time and of the flush's: the price of one more frame a commit.

``--file`` also times the same bytes written straight to a file and ``fdatasync``-ed: N frames as
SQLite writes them (a 24-byte header and a 4,096-byte page, two ``pwrite`` each) against one
``pwrite`` of them all, to tell the write calls from the bytes.

Run::

    .venv/bin/python benchmarks/frame_cost.py                # ~1 min
    .venv/bin/python benchmarks/frame_cost.py --repeats 3 --commits 500 --file
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import tempfile
import time
import uuid
from pathlib import Path

FRAMES = (1, 5, 10, 20)
FRAME_BYTES = 24 + 4096


def _commits(
    folder: Path, tables: int, commits: int, sync: str, random_keys: bool
) -> tuple[float, float]:
    """µs of wall time and of process CPU a commit of one row into each of ``tables`` tables."""
    path = folder / f"t{tables}-{sync}-{random_keys}-{time.monotonic_ns()}.db"
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={sync}")
        for t in range(tables):
            conn.execute(f"CREATE TABLE t{t} (k TEXT PRIMARY KEY, v TEXT NOT NULL)")
        inserts = [f"INSERT INTO t{t} (k, v) VALUES (?, ?)" for t in range(tables)]
        payload = "x" * 100

        def loop(first: int, n: int) -> None:
            for i in range(first, first + n):
                conn.execute("BEGIN IMMEDIATE")
                for sql in inserts:
                    conn.execute(sql, (uuid.uuid4().hex if random_keys else f"{i:012d}", payload))
                conn.execute("COMMIT")

        loop(0, max(20, commits // 5))  # warm-up: the files' first pages, the WAL's creation
        wall, cpu = time.perf_counter(), time.process_time()
        loop(10**6, commits)
        return (
            (time.perf_counter() - wall) / commits * 1e6,
            (time.process_time() - cpu) / commits * 1e6,
        )
    finally:
        conn.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)


def _file(folder: Path, frames: int, commits: int, split: bool) -> tuple[float, float]:
    """µs a commit of ``frames`` frames written to a file of their own and fdatasync-ed."""
    path = folder / f"f{frames}-{split}-{time.monotonic_ns()}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    header, page = b"h" * 24, b"p" * (FRAME_BYTES - 24)
    whole = (header + page) * frames
    limit = 4 << 20  # as a WAL of ~1,000 frames: written from the start again once full
    try:
        offset = 0

        def one() -> None:
            nonlocal offset
            if offset + len(whole) > limit:
                offset = 0
            if split:
                for f in range(frames):
                    at = offset + f * FRAME_BYTES
                    os.pwrite(fd, header, at)
                    os.pwrite(fd, page, at + 24)
            else:
                os.pwrite(fd, whole, offset)
            offset += len(whole)
            os.fdatasync(fd)

        for _ in range(max(20, commits // 5)):
            one()
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(commits):
            one()
        return (
            (time.perf_counter() - wall) / commits * 1e6,
            (time.process_time() - cpu) / commits * 1e6,
        )
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)


def _slope(xs: list[float], ys: list[float]) -> float:
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--commits", type=int, default=400, help="timed commits a sample")
    parser.add_argument("--file", action="store_true", help="also the bare file writes")
    parser.add_argument("--dir", default=None, help="where the files go (keep it off tmpfs)")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="effectflow-frame-cost-", dir=args.dir))
    try:
        cases = [
            (frames, sync, keys)
            for keys in (False, True)
            for sync in ("FULL", "OFF")
            for frames in FRAMES
        ]
        samples: dict[tuple[int, str, bool], list[tuple[float, float]]] = {c: [] for c in cases}
        files = (
            [(frames, split) for split in (True, False) for frames in FRAMES] if args.file else []
        )
        file_samples: dict[tuple[int, bool], list[tuple[float, float]]] = {c: [] for c in files}
        for r in range(args.repeats):
            for case in cases[r % len(cases) :] + cases[: r % len(cases)]:  # rotated each repeat
                samples[case].append(_commits(folder, case[0], args.commits, case[1], case[2]))
            for fcase in files:
                file_samples[fcase].append(_file(folder, fcase[0], args.commits, fcase[1]))
        print(
            f"# SQLite {sqlite3.sqlite_version}, {args.commits} commits a sample, medians of {args.repeats}"
        )
        print(
            "| keys | frames a commit | FULL wall µs | FULL CPU µs | off wall µs | off CPU µs "
            "| FULL − off wall µs |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for keys in (False, True):
            full_walls, flushes = [], []
            for frames in FRAMES:
                full = samples[(frames, "FULL", keys)]
                off = samples[(frames, "OFF", keys)]
                fw = statistics.median(w for w, _ in full)
                ow = statistics.median(w for w, _ in off)
                if frames >= 5:
                    full_walls.append(fw)
                    flushes.append(fw - ow)
                print(
                    f"| {'random' if keys else 'in order'} | {frames} | {fw:,.0f} | "
                    f"{statistics.median(c for _, c in full):,.0f} | {ow:,.0f} | "
                    f"{statistics.median(c for _, c in off):,.0f} | {fw - ow:,.0f} |"
                )
            xs = [float(f) for f in FRAMES if f >= 5]
            print(
                f"| {'random' if keys else 'in order'} | slope, 5 … 20 | "
                f"{_slope(xs, full_walls):,.1f} µs a frame | | | | "
                f"{_slope(xs, flushes):,.1f} µs a frame |"
            )
        if files:
            print()
            print("| file writes | frames a commit | wall µs | CPU µs |")
            print("| --- | ---: | ---: | ---: |")
            for split in (True, False):
                for frames in FRAMES:
                    got = file_samples[(frames, split)]
                    print(
                        f"| {'2 pwrite a frame' if split else 'one pwrite'} | {frames} | "
                        f"{statistics.median(w for w, _ in got):,.0f} | "
                        f"{statistics.median(c for _, c in got):,.0f} |"
                    )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
