"""Retention verbs of ``effectflow``: ``purge-keys`` drops idempotency key bindings past their
retention (``rt.purge_expired_keys``); ``archive`` moves finished runs to a file that verifies on
its own (``ledger.archive``).

A binding past its retention guards nothing any more (the provider has forgotten the key, so a
retry under it could duplicate anyway), but it stays in ``operations`` until someone removes it;
this verb is how an operator does, from cron or by hand. Each dropped binding leaves a hashed purge
record that ``effectflow audit verify`` accepts as why a sealed binding is gone, so the ledger
still verifies afterwards. A binding whose step is not settled (its outcome unknown, or it may
still be retried or completed under its key) is kept whatever its age.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from effectflow.cli import common


def purge_keys(
    db: common.DbOption = common.DEFAULT_DB,
    as_json: common.JsonOption = False,
) -> None:
    """Drop idempotency key bindings past their retention whose steps are settled; print how many.

    Each leaves a hashed purge record, so `effectflow audit verify` still passes afterwards."""
    # The purge is ledger-wide (retention is a property of the key, not of a tenant's view).
    with common.runtime("purge-keys", db, "default", as_json=as_json) as rt:
        dropped = rt.purge_expired_keys()
    if as_json:
        common.emit_json({"purged": dropped})
        return
    typer.echo(f"{dropped} expired key binding(s) purged")


def _cut_off(text: str) -> float:
    """``--before``: an ISO date or date and time (UTC unless it says otherwise), as epoch seconds."""
    import datetime as dt

    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is not an ISO date or time (e.g. 2026-01-31 or 2026-01-31T12:00:00Z)",
            param_hint="--before",
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def archive(
    before: Annotated[
        str,
        typer.Option(
            "--before",
            help="Archive the finished runs last written before this ISO date or time (UTC).",
            show_default=False,
        ),
    ],
    to: Annotated[
        Path,
        typer.Option(
            "--to", help="The JSON-lines file to write (replaced if it exists).", dir_okay=False
        ),
    ],
    db: common.DbOption = common.DEFAULT_DB,
    as_json: common.JsonOption = False,
) -> None:
    """Export finished runs (terminal, nothing in doubt, nothing waiting for a person) last written
    before --before to --to, with their events and seals, and remove them from the ledger.

    The file verifies on its own (`effectflow audit verify --archive FILE`); the ledger keeps a
    hashed record of each archived run, so `effectflow audit verify` still passes and a run
    deleted by hand is still reported. See docs/retention.md."""
    from effectflow.ledger import archive as archive_mod

    cut_off = _cut_off(before)
    with common.runtime("archive", db, "default", as_json=as_json) as rt:
        done = archive_mod.archive(rt.store, before=cut_off, to=to, now=rt.clock())
    if as_json:
        common.emit_json({"archived": done, "to": str(to)})
        return
    typer.echo(f"{len(done)} finished run(s) archived -> {to}")
