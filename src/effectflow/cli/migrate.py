"""``effectflow migrate``: bring a ledger to this effectflow's schema, or only say whether it is.

Opening a ledger applies the migrations it has not seen, so every process migrates on its own;
this verb is for a deploy that wants it as a step of its own, before the new workers start
(docs/deploy.md, "Upgrading while workers run"), and ``--check`` for a gate that must change
nothing: it reads the ledger's version without opening the store.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from effectflow import errors
from effectflow.cli import common

if TYPE_CHECKING:
    from effectflow.ledger.versions import SchemaStatus


def migrate(
    db: common.DbOption = common.DEFAULT_DB,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Change nothing: say which migrations opening the ledger would apply; exit 1 "
            "when there are any (or there is no ledger yet), 2 when the ledger is newer.",
        ),
    ] = False,
    as_json: common.JsonOption = False,
) -> None:
    """Apply the migrations the ledger has not seen (creating an SQLite ledger that does not exist
    yet), and say from which version to which; with --check, only say what would be applied."""
    from effectflow.ledger import versions

    try:
        before = versions.status(db)
    except errors.EffectflowError as exc:
        common.fail("migrate", exc, common.EXIT_USAGE, as_json)
    if before.newer:
        newer = errors.LedgerFileError(
            f"{before.where} is at schema version {before.current}, newer than this effectflow's "
            f"{before.newest}: upgrade effectflow (pip install -U effectflow); nothing was changed"
        )
        common.fail("migrate", newer, common.EXIT_USAGE, as_json)
    if check:
        _report(before, applied=False, as_json=as_json)
        raise typer.Exit(common.EXIT_FAILURE if before.pending else common.EXIT_OK)
    if before.pending:
        from effectflow.ledger.store import open_store

        try:
            open_store(db).close()  # opening applies them, under the backend's own lock
        except errors.EffectflowError as exc:
            common.fail("migrate", exc, common.EXIT_USAGE, as_json)
    _report(before, applied=True, as_json=as_json)


def _report(status: SchemaStatus, *, applied: bool, as_json: bool) -> None:
    pending = [f"{v} ({name})" for v, name in status.pending]
    if as_json:
        common.emit_json(
            {
                "ledger": status.where,
                "version": status.newest if applied else status.current,
                "was": status.current,
                "newest": status.newest,
                "pending": [] if applied else [v for v, _ in status.pending],
                "applied": [v for v, _ in status.pending] if applied else [],
            }
        )
        return
    if not status.pending:
        typer.echo(f"{status.where}: at schema version {status.current}, this effectflow's newest")
    elif applied:
        was = "no ledger" if status.current is None else f"version {status.current}"
        typer.echo(
            f"{status.where}: migrated from {was} to version {status.newest} "
            f"(applied {', '.join(pending)})"
        )
    else:
        was = "no ledger yet" if status.current is None else f"at version {status.current}"
        typer.echo(
            f"{status.where}: {was}; opening it would apply {', '.join(pending)} "
            f"(effectflow migrate --db ... applies them)"
        )
