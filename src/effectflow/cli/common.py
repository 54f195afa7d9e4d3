"""What the operator verbs share: the options, the exit codes, the runtime each verb opens, and how
a verb fails or reports the run it left.

Exit codes (as in ``effectflow.cli.main``, not imported from there: main imports the verbs):
0 ok; 1 failure (no such run or effect, a stale or conflicting decision, a run that failed);
2 usage; 3 something waits for a person (the attention queue is not empty, or the run an action
left is paused, pending reconciliation, or asks for a person).
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from effectflow import errors
from effectflow.cli import worker as worker_cli
from effectflow.ledger.records import NextAction, RunStatus

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from effectflow.ledger import records
    from effectflow.runtime.runtime import Runtime

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_ATTENTION = 3

#: Run statuses after which a person must act before the run moves on.
WAITING = frozenset({RunStatus.PAUSED, RunStatus.CANCELLED_PENDING_RECONCILIATION})

DbOption = Annotated[
    str,
    typer.Option(
        "--db",
        envvar="EFFECTFLOW_DB",
        help="Ledger URL (sqlite:///path.db or postgresql://...). Default: effectflow.db here.",
    ),
]
TenantOption = Annotated[str, typer.Option("--tenant", help="The tenant whose runs to act on.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
AppOption = Annotated[
    str | None,
    typer.Option(
        "--app",
        help="The application to import first, module, module:object or path/to/app.py, so the "
        "tools and workflows the run executes are registered (e.g. myapp.flows).",
    ),
]
RunArg = Annotated[str, typer.Argument(metavar="RUN", help="The run's id.", show_default=False)]
ByOption = Annotated[str, typer.Option("--by", help="Who acts (recorded in the audit log).")]

DEFAULT_DB = "sqlite:///effectflow.db"


def console() -> Console:
    """A console for stdout, imported only when a verb prints (rich is slow to import)."""
    from rich.console import Console

    # A pipe gets a fixed width, so scripts and tests see the same lines on every terminal.
    return Console(width=None if sys.stdout.isatty() else 140)


def print_rich(renderable: RenderableType) -> None:
    """Print a table or a line on a fresh stdout console."""
    console().print(renderable)


def emit_json(value: Any) -> None:
    """Print ``--json`` output."""
    # StrEnum members serialise as their values; ``default=str`` covers any stray non-JSON value.
    typer.echo(json.dumps(value, indent=2, default=str))


def fail(
    verb: str, exc: errors.EffectflowError, code: int, as_json: bool, hint: str = ""
) -> NoReturn:
    """Exit with ``code``, the error on stderr: its ``to_dict()`` with ``--json``, else a line."""
    if as_json:
        typer.echo(json.dumps({"error": exc.to_dict()}), err=True)
    else:
        typer.echo(f"effectflow {verb}: {exc.message}{hint}", err=True)
    raise typer.Exit(code)


def require_ledger(db: str) -> None:
    """Refuse a SQLite URL whose file does not exist, instead of creating an empty ledger there."""
    if "://" in db and not db.startswith(("sqlite:", "file:")):
        return
    from effectflow.ledger import sqlite

    try:
        path, _ = sqlite.parse_url(db)
    except errors.ContractError as exc:
        raise typer.BadParameter(exc.message, param_hint="--db") from None
    if path != ":memory:" and not Path(path).exists():
        raise typer.BadParameter(f"no ledger at {path}", param_hint="--db")


def read_only_url(db: str) -> str:
    """The ledger URL opened read-only, for verbs that only read: an SQLite ledger gets SQLite's
    read-only mode (``?mode=ro``), so a read can change nothing — not the journal mode, not a
    migration — and a read-only file can still be read. Other backends are left to their own
    permissions."""
    if "://" in db and not db.startswith(("sqlite:", "file:")):
        return db
    if "://" not in db:
        db = f"sqlite:///{db}"
    if "mode=" in db.split("?", 1)[-1] and "?" in db:
        return db
    return f"{db}{'&' if '?' in db else '?'}mode=ro"


@contextlib.contextmanager
def runtime(
    verb: str,
    db: str,
    tenant: str,
    *,
    app: str | None = None,
    as_json: bool = False,
    read_only: bool = False,
) -> Iterator[Runtime]:
    """A runtime on the ledger, closed afterwards; the runtime's errors become exit 1 (a ledger
    that cannot be opened: exit 2)."""
    from effectflow.contracts.registry import Registry
    from effectflow.runtime.runtime import Runtime

    registry = None
    if app is not None:
        loaded = worker_cli.load_app(app)
        registry = loaded if isinstance(loaded, Registry) else None
    require_ledger(db)
    try:
        rt = Runtime(read_only_url(db) if read_only else db, tenant=tenant, registry=registry)
    except errors.EffectflowError as exc:
        fail(verb, exc, EXIT_USAGE, as_json)
    try:
        yield rt
    except errors.ContractError as exc:
        hint = "" if app else " (pass --app to import the application's tools and workflows)"
        fail(verb, exc, EXIT_FAILURE, as_json, hint)
    except errors.EffectflowError as exc:
        fail(verb, exc, EXIT_FAILURE, as_json)
    finally:
        rt.close()


def run_exit_code(run: records.RunRecord) -> int:
    """What an action's resulting run means for the exit code: 3 if a person must act, 1 if the
    run failed, else 0."""
    if run.status in WAITING or run.next_action is NextAction.ASK_A_PERSON:
        return EXIT_ATTENTION
    if run.status is RunStatus.FAILED:
        return EXIT_FAILURE
    return EXIT_OK


def finish_run(run: records.RunRecord, as_json: bool) -> NoReturn:
    """Print the run an action left and exit with what it means (:func:`run_exit_code`)."""
    if as_json:
        emit_json(run.to_dict())
    else:
        from effectflow.cli import render

        print_rich(render.run_line(run))
    raise typer.Exit(run_exit_code(run))
