"""``effectflow bench``: the effectflow half of the peer comparison, or the hosts' crash scorecard."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from effectflow.cli import common


def bench(
    workflows: Annotated[
        int,
        typer.Option(
            "--workflows", min=1, help="Workflows timed per workload (after a short warm-up)."
        ),
    ] = 100,
    mode: Annotated[
        str,
        typer.Option(
            "--mode",
            metavar="full|intents|normal|all",
            help="The ledger's durability: full (the default URL; every commit survives power "
            "loss), intents (?durability=intents: outcomes skip their own fsync), normal "
            "(?synchronous=normal: nothing fsynced per commit) or all three.",
        ),
    ] = "full",
    hosts: Annotated[
        bool,
        typer.Option(
            "--hosts",
            help="Instead: the crash scorecard. SIGKILL each host script of "
            "benchmarks/compare/hosts/ right after its effect, alone and with effectflow, and "
            "count the writes in the provider's record after the host's own recovery.",
        ),
    ] = False,
    trials: Annotated[
        int, typer.Option("--trials", min=1, help="With --hosts: crashes per host and point.")
    ] = 5,
    hosts_dir: Annotated[
        Path | None,
        typer.Option(
            "--hosts-dir",
            help="With --hosts: the folder of host scripts. Default: benchmarks/compare/hosts/ "
            "of the checkout this runs in.",
        ),
    ] = None,
    only: Annotated[
        str | None,
        typer.Option("--only", metavar="HOST,HOST", help="With --hosts: score only these hosts."),
    ] = None,
    as_json: common.JsonOption = False,
) -> None:
    """Run the effectflow half of the peer comparison on a temporary SQLite ledger.

    The workloads of benchmarks/compare: sequential, 8 threads, external writes with a lookup; and
    the pure and write workloads 8 at a time on asyncio (start_async).

    One sample each, timed against the same functions called directly. Beside them the floor: a
    raw SQLite WAL commit at synchronous=FULL, timed in the same run, and the write steps/s its two
    commits per step allow; each write workload's rate is given as a fraction of it.

    Side by side with DBOS and LangGraph: benchmarks/compare/run.py in the repository (BENCHMARKS.md).

    With --hosts: the crash scorecard of each agent host, alone and with effectflow
    (docs/integrations/crash_harness.md).
    """
    if hosts:
        _bench_hosts(trials, hosts_dir, only, as_json)
        return
    _bench_workloads(workflows, mode, as_json)


def _bench_workloads(workflows: int, mode: str, as_json: bool) -> None:
    """``bench`` without ``--hosts``: every workload in each ``--mode`` asked for, a progress bar
    on a terminal's stderr, then the table (or ``--json`` rows)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from effectflow import bench as bench_mod
    from effectflow.cli import render

    chosen = mode.strip().lower()
    if chosen != "all" and chosen not in bench_mod.MODES:
        raise typer.BadParameter(
            f"{mode!r} is not one of {', '.join(bench_mod.MODES)}, all", param_hint="--mode"
        )
    modes = list(bench_mod.MODES) if chosen == "all" else [chosen]
    err = Console(stderr=True)
    per_workload = workflows + bench_mod.warmup_runs(workflows)
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    ) as progress:
        workloads = len(bench_mod.WORKLOADS) + len(bench_mod.ASYNC_WORKLOADS)
        total = len(modes) * workloads * per_workload
        task = progress.add_task("measuring", total=total)

        def starting(workload: str, mode: str) -> None:
            progress.update(task, description=f"{workload}, {mode}")

        results = bench_mod.run_all(
            modes=modes,
            workflows=workflows,
            on_start=starting,
            on_run=lambda: progress.advance(task),
        )
    rows = [r.to_dict() for r in results]
    if as_json:
        common.emit_json(rows)
        return
    common.print_rich(render.bench_table(rows))
    typer.echo(floor_text(rows))


def floor_text(rows: list[dict[str, Any]]) -> str:
    """The lines under the table: the floor and each write workload's share of it."""
    written = [row for row in rows if row["floor_commit_us"] is not None]
    if not written:
        return ""
    first = written[0]
    lines = [
        f"floor: a raw SQLite WAL commit at synchronous=FULL took {first['floor_commit_us']:,.0f} "
        "µs in this run;",
        f"  a write step's two commits (intent, outcome) allow at most "
        f"{first['floor_steps_per_s']:,.0f} steps/s",
    ]
    lines += [
        f"  {row['workload']} ({row['mode']}): {row['steps_per_s']:,.0f} steps/s, "
        f"{row['of_floor']:.2f} of the floor"
        for row in written
    ]
    return "\n".join(lines)


def _bench_hosts(trials: int, hosts_dir: Path | None, only: str | None, as_json: bool) -> None:
    """``bench --hosts``: the scorecard of ``effectflow.scorecard``, the code
    benchmarks/compare/hosts_scorecard.py runs too."""
    from effectflow import scorecard as bench_mod

    names = only.split(",") if only is not None else None
    try:
        directory = hosts_dir if hosts_dir is not None else bench_mod.find_hosts_dir()
        bench_mod.host_scripts(directory)
    except bench_mod.ScorecardError as exc:
        raise typer.BadParameter(str(exc), param_hint="--hosts-dir") from None
    try:
        bench_mod.host_scripts(directory, names)
    except bench_mod.ScorecardError as exc:
        raise typer.BadParameter(str(exc), param_hint="--only") from None

    def progress(host: str, what: str) -> None:
        typer.echo(f"{host}: {what}", err=True)

    scores = bench_mod.scorecard(directory, trials=trials, hosts=names, on_trial=progress)
    if as_json:
        common.emit_json([score.to_dict() for score in scores])
        return
    typer.echo(bench_mod.scorecard_text(scores))
