"""Retention verbs of ``effectflow``: ``purge-keys`` drops idempotency key bindings past their
retention (``rt.purge_expired_keys``).

A binding past its retention guards nothing any more (the provider has forgotten the key, so a
retry under it could duplicate anyway), but it stays in ``operations`` until someone removes it;
this verb is how an operator does, from cron or by hand. Each dropped binding leaves a hashed purge
record that ``effectflow audit verify`` accepts as why a sealed binding is gone, so the ledger
still verifies afterwards. A binding whose step is not settled (its outcome unknown, or it may
still be retried or completed under its key) is kept whatever its age.
"""

from __future__ import annotations

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
