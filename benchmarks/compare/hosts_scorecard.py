"""The crash scorecard of the agent hosts: each script of ``hosts/`` SIGKILLed right after its tool's
effect, alone and with effectflow, then recovered by the host's own means in a fresh process; the
writes in the provider's record counted per trial (docs/integrations/crash_harness.md).

Run::

    .venv/bin/python benchmarks/compare/hosts_scorecard.py --trials 5
    .venv/bin/python benchmarks/compare/hosts_scorecard.py --trials 5 --hosts langgraph,dbos --json

The same code as ``effectflow bench --hosts`` (``effectflow.scorecard``); this script only
defaults to the ``hosts/`` folder beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from effectflow import scorecard as bench

HOSTS = Path(__file__).resolve().parent / "hosts"


def main(argv: list[str]) -> int:
    """Print the scorecard; exit 2 when there is nothing to score."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5, help="crashes per host and point")
    parser.add_argument("--hosts", help="only these hosts, comma-separated (default: all)")
    parser.add_argument("--hosts-dir", type=Path, default=HOSTS, help="the host scripts' folder")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    names = args.hosts.split(",") if args.hosts else None
    try:
        bench.host_scripts(args.hosts_dir, names)
    except bench.ScorecardError as exc:
        parser.error(str(exc))

    def progress(host: str, what: str) -> None:
        print(f"{host}: {what}", file=sys.stderr, flush=True)

    scores = bench.scorecard(args.hosts_dir, trials=args.trials, hosts=names, on_trial=progress)
    if args.json:
        print(json.dumps([score.to_dict() for score in scores], indent=2))
    else:
        print(bench.scorecard_text(scores))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
