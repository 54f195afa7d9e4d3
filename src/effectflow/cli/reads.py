"""The operator's reads: ``runs``, ``show``, ``effects``, ``attention``.

Each opens the ledger read-only and prints rich tables or, with ``--json``, the records'
``to_dict()``.
"""

from __future__ import annotations

from typing import Annotated

import typer

from effectflow.cli import common
from effectflow.ledger.records import RunStatus, StepStatus


def runs(
    status: Annotated[
        list[RunStatus] | None,
        typer.Option("--status", help="Only runs in this status (repeat for several)."),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many runs.")] = 100,
    scope: Annotated[
        str | None,
        typer.Option(
            "--scope",
            help="Only the guarded calls a host made in this scope (e.g. a LangGraph thread).",
        ),
    ] = None,
    call_id: Annotated[
        str | None,
        typer.Option("--call-id", help="Only the guarded call with this call id (a tool-call id)."),
    ] = None,
    db: common.DbOption = common.DEFAULT_DB,
    tenant: common.TenantOption = "default",
    as_json: common.JsonOption = False,
) -> None:
    """List the tenant's runs, newest first; an interrupted run (its owner died, its lease expired)
    says so, and `effectflow recover` continues it. A guarded call (`rt.guard`: a LangGraph tool
    call, an MCP client's call) shows the host's scope and call id, and `--scope` / `--call-id`
    find it by them."""
    with common.runtime("runs", db, tenant, as_json=as_json, read_only=True) as rt:
        runs = rt.runs(
            status=[s.value for s in status] if status else None,
            limit=limit,
            scope=scope,
            call_id=call_id,
        )
        found = [rt.run_view(r) for r in runs]
    if as_json:
        common.emit_json([v.to_dict() for v in found])
        return
    from effectflow.cli import render

    common.print_rich(render.runs_table(found))


def show(
    run_id: common.RunArg,
    db: common.DbOption = common.DEFAULT_DB,
    tenant: common.TenantOption = "default",
    as_json: common.JsonOption = False,
) -> None:
    """Show a run's timeline: its steps as a tree, then its audit events.

    Each step shows its status, completion state and attempts (kind, outcome, error), its effect
    (external id, request and response digests, approval, compensation status) and the
    compensation that answers it; then the audit events in order, with actor and details.
    """
    with common.runtime("show", db, tenant, as_json=as_json, read_only=True) as rt:
        tl = rt.timeline(run_id)
        view = rt.run_view(tl.run)
    if as_json:
        common.emit_json({**tl.to_dict(), "run": view.to_dict()})
        return
    from effectflow.cli import render

    common.print_rich(render.timeline(tl, view))


def effects(
    status: Annotated[
        list[StepStatus] | None,
        typer.Option(
            "--status", help="Only effects in this status, e.g. unknown (repeat for several)."
        ),
    ] = None,
    run_id: Annotated[str | None, typer.Option("--run", help="Only this run's effects.")] = None,
    db: common.DbOption = common.DEFAULT_DB,
    tenant: common.TenantOption = "default",
    as_json: common.JsonOption = False,
) -> None:
    """List External Effect Records: what happened, or may have, in outside systems."""
    with common.runtime("effects", db, tenant, as_json=as_json, read_only=True) as rt:
        found = rt.effects(run_id=run_id, status=[s.value for s in status] if status else None)
    if as_json:
        common.emit_json([e.to_dict() for e in found])
        return
    from effectflow.cli import render

    common.print_rich(render.effects_table(found))


def attention(
    db: common.DbOption = common.DEFAULT_DB,
    tenant: common.TenantOption = "default",
    as_json: common.JsonOption = False,
) -> None:
    """List what waits for a person; exit 3 when anything does.

    Effects in doubt, steps waiting for approval and failed compensations, oldest first, each with
    the actions that settle it.
    """
    with common.runtime("attention", db, tenant, as_json=as_json, read_only=True) as rt:
        items = rt.attention()
    if as_json:
        common.emit_json([i.to_dict() for i in items])
    else:
        from effectflow.cli import render

        common.print_rich(render.attention_table(items))
    raise typer.Exit(common.EXIT_ATTENTION if items else common.EXIT_OK)
