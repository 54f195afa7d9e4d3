"""``effectflow worker``: a long-running worker process over a shared ledger."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import signal
import sys
import traceback
from pathlib import Path
from types import FrameType, ModuleType
from typing import TYPE_CHECKING, Annotated, Any

import typer

from effectflow import errors
from effectflow.runtime.leases import DEFAULT_LEASE_TTL
from effectflow.runtime.worker import DEFAULT_DRAIN_TIMEOUT

if TYPE_CHECKING:
    from effectflow.runtime.health import HealthServer
    from effectflow.runtime.runtime import Runtime

#: Exit status when runs were still in progress at the drain deadline.
EXIT_DRAIN_TIMEOUT = 1
#: Exit status when the worker could not start (its ledger, its health port).
EXIT_START = 2


def load_app(spec: str) -> Any:
    """Import ``module``, ``module:object`` or ``path/to/app.py[:object]`` so the application's
    tools and workflows register.

    A module is found the way ``python -m`` finds it: the current directory first, then
    ``PYTHONPATH``, then the installed packages; a dotted name is a module in a package. A file
    path is run as ``python path/to/app.py`` would import it: its folder goes first on the path,
    so the modules beside it import too.

    Raises:
        typer.BadParameter: the module, the file or the object is not there (the message lists
            where it was looked for), or importing it failed (the message is that error: a
            broken import inside the application is not reported as a missing application).
    """
    target, _, attr = spec.partition(":")
    if _is_file(target):
        module, module_name = _import_file(Path(target)), Path(target).stem
    else:
        module_name = target
        module = _import_module(module_name)
    if not attr:
        return module
    try:
        return getattr(module, attr)
    except AttributeError:
        raise typer.BadParameter(
            f"module {module_name!r} ({module.__file__}) has no {attr!r}", param_hint="--app"
        ) from None


def imported_app(spec: str) -> str:
    """``spec`` loaded (:func:`load_app`) and named as ``importlib`` finds it now: a file path
    becomes its module's name, for code that imports the application by name afterwards."""
    load_app(spec)
    target, colon, attr = spec.partition(":")
    return f"{Path(target).stem}{colon}{attr}" if _is_file(target) else spec


def _is_file(target: str) -> bool:
    """A slash or a ``.py`` ending makes ``--app`` a file: no module name has either."""
    return target.endswith(".py") or os.sep in target or "/" in target


def _import_module(name: str) -> ModuleType:
    """``name`` imported with the current directory first on ``sys.path``, as ``python -m``."""
    here = os.getcwd()
    # The console script put its own folder (the venv's bin) first; python -m puts the cwd there.
    script = os.path.dirname(os.path.abspath(sys.argv[0])) if sys.argv and sys.argv[0] else None
    if sys.path and sys.path[0] == script:
        sys.path[0] = here
    elif sys.path[:1] not in ([""], [here]):
        sys.path.insert(0, here)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (name == exc.name or name.startswith(exc.name + ".")):
            raise _import_failed(name, exc) from exc
        raise typer.BadParameter(_not_found(name, exc.name), param_hint="--app") from None
    except Exception as exc:
        raise _import_failed(name, exc) from exc


def _not_found(name: str, missing: str) -> str:
    """Which module was looked for and in which directories (the package's, for a submodule)."""
    parent = missing.rpartition(".")[0]
    package = sys.modules.get(parent) if parent else None
    places = list(getattr(package, "__path__", None) or []) if package else list(sys.path)
    searched = [p or os.getcwd() for p in places if not str(p).endswith(".zip")]
    where = "\n  ".join(searched) or "(no directory)"
    wanted = f"{name!r}" if missing == name else f"{name!r} (its package {missing!r})"
    return (
        f"no module {wanted}; looked in (the current directory, PYTHONPATH, then the installed "
        f"packages):\n  {where}\na file is given by its path: --app path/to/app.py"
    )


def _import_file(path: Path) -> ModuleType:
    """The module in the file ``path``, imported under its stem with its folder first on the path."""
    if not path.is_file():
        raise typer.BadParameter(
            f"no file {str(path)!r} (looked in {os.getcwd()})", param_hint="--app"
        )
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = path.stem
    taken = getattr(sys.modules.get(name), "__file__", None)
    if taken is not None and Path(taken).resolve() != path.resolve():
        # Registering the file under a name already imported would replace that module.
        raise typer.BadParameter(
            f"{str(path)!r}: a module named {name!r} is already imported (from {taken}); "
            "rename the file",
            param_hint="--app",
        )
    spec = importlib.util.spec_from_file_location(name, path.resolve())
    if spec is None or spec.loader is None:
        raise typer.BadParameter(f"{str(path)!r} is not a Python module", param_hint="--app")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(name, None)
        raise _import_failed(str(path), exc) from exc
    return module


def _import_failed(name: str, exc: BaseException) -> typer.BadParameter:
    """The application's own import error, with the line that raised it."""
    frames = traceback.extract_tb(exc.__traceback__)
    inside = [f for f in frames if "importlib" not in f.filename]
    at = f" at {inside[-1].filename}:{inside[-1].lineno}" if inside else ""
    return typer.BadParameter(
        f"importing {name!r} failed{at}: {type(exc).__name__}: {exc}", param_hint="--app"
    )


def worker(
    app: Annotated[
        str,
        typer.Option(
            "--app",
            help="The application to import, module, module:object or path/to/app.py, so its "
            "tools and workflows are registered (e.g. myapp.flows).",
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
    health: Annotated[
        str | None,
        typer.Option(
            "--health",
            metavar="ADDR",
            help="Serve GET /healthz (liveness: the claim loop turns) and /readyz (readiness: the "
            "ledger answers at this code's schema version, not draining) on ADDR, HOST:PORT or "
            ":PORT (e.g. 127.0.0.1:8081, :8081). Off by default.",
        ),
    ] = None,
    drain_timeout: Annotated[
        float,
        typer.Option(
            "--drain-timeout",
            min=0,
            metavar="SECONDS",
            help="After SIGTERM, how long runs in progress get to reach a step boundary; then the "
            "worker exits 1 naming them (their leases pass to another worker). A second "
            "SIGTERM or Ctrl-C exits at once.",
        ),
    ] = DEFAULT_DRAIN_TIMEOUT,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log each run.")] = False,
) -> None:
    """Claim runnable runs from the ledger and execute them; SIGTERM drains and exits.

    Runs are leased (PostgreSQL: FOR UPDATE SKIP LOCKED), the leases are renewed by heartbeat,
    every write is fenced by the lease token, and runs whose worker died are taken over: at once
    when it was a process on this host (its pid is gone), else once its lease expires. On SIGTERM
    or Ctrl-C the worker stops claiming, lets each run reach its next step boundary, releases it
    for another worker, and exits 0 (1 when --drain-timeout passed first).
    """
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s",
    )
    if group_commit not in ("auto", "on", "off"):
        raise typer.BadParameter("use auto, on or off", param_hint="--group-commit")
    grouped = None if group_commit == "auto" else group_commit == "on"
    server = _health_server(health) if health is not None else None
    try:
        rt = _runtime(app, db, lease_ttl, grouped)
    except BaseException:
        if server is not None:
            server.close()
        raise
    _drive(rt, concurrency, until_idle, drain_timeout, server)


def _health_server(address: str) -> HealthServer:
    """The probes' server, bound before the ledger is opened: a bad address or a port in use
    stops the worker before it migrates or claims anything."""
    from effectflow.runtime import health

    try:
        bind = health.parse_address(address)
    except errors.ArgumentError as exc:
        raise typer.BadParameter(str(exc), param_hint="--health") from None
    try:
        return health.HealthServer(bind)
    except OSError as exc:
        typer.echo(
            f"effectflow worker: cannot serve --health on {address}: {exc.strerror or exc}; "
            "nothing was started",
            err=True,
        )
        raise typer.Exit(EXIT_START) from None


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
        raise typer.Exit(EXIT_START) from None


def _drive(
    rt: Runtime,
    concurrency: int,
    until_idle: bool,
    drain_timeout: float,
    server: HealthServer | None,
) -> None:
    """Run the worker until it is idle (``--until-idle``) or drained by SIGTERM / SIGINT, close
    the runtime, and print what it did.

    Runs still in progress at the drain deadline, or at a second signal, keep their threads, which
    a normal interpreter exit would wait for: the process ends with ``os._exit`` then, and their
    leases pass to another worker (at once on this host, where the dead pid is seen).
    """
    from effectflow.runtime.worker import Worker

    runner = Worker(rt, concurrency=concurrency, drain_timeout=drain_timeout)
    log = logging.getLogger("effectflow.worker")

    def drain(signum: int, frame: FrameType | None) -> None:
        if runner.stopping:
            log.warning(
                "signal %d again: exiting now; runs in progress (%s) pass to another worker",
                signum,
                ", ".join(runner.in_flight) or "none",
            )
            _exit_now(128 + signum)
        log.warning(
            "signal %d: draining (no new runs; runs in progress are released at their next step, "
            "within %g s)",
            signum,
            drain_timeout,
        )
        runner.stop()

    signal.signal(signal.SIGTERM, drain)
    signal.signal(signal.SIGINT, drain)
    if server is not None:
        server.serve(runner)
        typer.echo(f"effectflow worker: health on {server.where} (/healthz, /readyz)", err=True)
    try:
        stats = runner.run(until_idle=until_idle)
    finally:
        if not runner.stats.abandoned:
            rt.close()
            if server is not None:
                server.close()
    left = len(stats.abandoned)
    typer.echo(
        f"worker {rt.owner}: claimed {stats.claimed}, finished {stats.finished}, "
        f"released {stats.released}, lost {stats.lost}, crashed {stats.crashed}"
        + (f", in progress at the drain deadline {left}" if left else "")
    )
    if left:
        _exit_now(EXIT_DRAIN_TIMEOUT)


def _exit_now(code: int) -> None:
    """End the process without waiting for the run threads (output flushed first)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
