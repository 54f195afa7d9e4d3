"""``effectflow worker``: a long-running worker process over a shared ledger."""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

import typer

from effectflow import errors
from effectflow.runtime.leases import DEFAULT_LEASE_TTL

if TYPE_CHECKING:
    from effectflow.runtime.runtime import Runtime


def load_app(spec: str) -> Any:
    """Import ``module`` or ``module:object`` so the application's tools and workflows register.

    Raises:
        typer.BadParameter: the module or the object cannot be found (a usage error).
    """
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise typer.BadParameter(
            f"cannot import {module_name!r}: {exc}", param_hint="--app"
        ) from exc
    if not attr:
        return module
    try:
        return getattr(module, attr)
    except AttributeError:
        raise typer.BadParameter(
            f"module {module_name!r} has no {attr!r}", param_hint="--app"
        ) from None


def worker(
    app: Annotated[
        str,
        typer.Option(
            "--app",
            help="The application to import, module or module:object, so its tools and "
            "workflows are registered (e.g. myapp.flows).",
        ),
    ],
    db: Annotated[
        str,
        typer.Option("--db", envvar="EFFECTFLOW_DB", help="Ledger URL shared by the workers."),
    ] = "sqlite:///effectflow.db",
    concurrency: Annotated[
        int, typer.Option("--concurrency", min=1, help="Runs executed at once.")
    ] = 8,
    lease_ttl: Annotated[
        float,
        typer.Option(
            "--lease-ttl",
            min=0.5,
            help="Seconds a lease lasts without a heartbeat renewing it (renewed every third of "
            "it): how long a run whose worker died on another host waits to be taken over.",
        ),
    ] = DEFAULT_LEASE_TTL,
    until_idle: Annotated[
        bool, typer.Option("--until-idle", help="Exit once no run is left to execute.")
    ] = False,
    group_commit: Annotated[
        str,
        typer.Option(
            "--group-commit",
            help="Share transactions between the writes of concurrent runs: auto (the backend's "
            "default: on for SQLite, off for PostgreSQL), on or off.",
        ),
    ] = "auto",
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log each run.")] = False,
) -> None:
    """Claim runnable runs from the ledger and execute them; SIGTERM drains and exits.

    Runs are leased (PostgreSQL: FOR UPDATE SKIP LOCKED), the leases are renewed by heartbeat,
    every write is fenced by the lease token, and runs whose worker died are taken over: at once
    when it was a process on this host (its pid is gone), else once its lease expires. On SIGTERM
    or Ctrl-C the worker stops claiming, lets each run reach its next step boundary, releases it
    for another worker, and exits 0.
    """
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s",
    )
    if group_commit not in ("auto", "on", "off"):
        raise typer.BadParameter("use auto, on or off", param_hint="--group-commit")
    grouped = None if group_commit == "auto" else group_commit == "on"
    rt = _runtime(app, db, lease_ttl, grouped)
    _drive(rt, concurrency, until_idle)


def _runtime(app: str, db: str, lease_ttl: float, grouped: bool | None) -> Runtime:
    """The worker's runtime, the application imported first (its registry, if it names one); a
    ledger that cannot be opened exits 2."""
    import effectflow as ef
    from effectflow.contracts.registry import Registry

    loaded = load_app(app)
    registry = loaded if isinstance(loaded, Registry) else None
    try:
        return ef.Runtime(db, lease_ttl=lease_ttl, registry=registry, group_commit=grouped)
    except errors.EffectflowError as exc:
        typer.echo(f"effectflow worker: {exc}", err=True)
        raise typer.Exit(2) from None


def _drive(rt: Runtime, concurrency: int, until_idle: bool) -> None:
    """Run the worker until it is idle (``--until-idle``) or drained by SIGTERM / SIGINT, close
    the runtime, and print what it did."""
    from effectflow.runtime.worker import Worker

    runner = Worker(rt, concurrency=concurrency)

    def drain(signum: int, frame: FrameType | None) -> None:
        logging.getLogger("effectflow.worker").warning(
            "signal %d: draining (no new runs; runs in progress are released at their next step)",
            signum,
        )
        runner.stop()

    signal.signal(signal.SIGTERM, drain)
    signal.signal(signal.SIGINT, drain)
    try:
        stats = runner.run(until_idle=until_idle)
    finally:
        rt.close()
    typer.echo(
        f"worker {rt.owner}: claimed {stats.claimed}, finished {stats.finished}, "
        f"released {stats.released}, lost {stats.lost}, crashed {stats.crashed}"
    )
