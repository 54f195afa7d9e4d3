"""The operator's actions: settling effects in doubt and interrupted runs (``reconcile``,
``recover``, ``resolve``) and a person's decisions on a run (``approve``, ``reject``, ``cancel``,
``resume``, ``compensate``).

An action may execute workflow code, so each takes ``--app`` to import the application's tools
and workflows first; its exit code says what the run it left needs (:func:`common.run_exit_code`).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer

from effectflow.cli import common

if TYPE_CHECKING:
    from effectflow.ledger import records


def reconcile(
    limit: Annotated[
        int, typer.Option("--limit", min=1, help="At most this many paused runs per pass.")
    ] = 100,
    app: common.AppOption = None,
    db: common.DbOption = common.DEFAULT_DB,
    tenant: common.TenantOption = "default",
    as_json: common.JsonOption = False,
) -> None:
    """Settle unknown outcomes through lookup tools; exit 3 if a person is still needed.

    Paused runs with an effect in doubt are looked up and continued, interrupted runs recovered;
    runs whose effects no lookup can settle stay in the attention queue.
    """
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    err = Console(stderr=True)
    with common.runtime("reconcile", db, tenant, app=app, as_json=as_json) as rt:
        # Runtime.reconcile settles every run in one call and reports no progress per run, so
        # the bar can only say that work is going on, and for how long.
        with Progress(
            SpinnerColumn(),
            TextColumn("[progress.description]{task.description}"),
            TimeElapsedColumn(),
            console=err,
            transient=True,
            disable=not err.is_terminal,
        ) as progress:
            progress.add_task("reconciling paused and interrupted runs", total=None)
            touched = rt.reconcile(limit=limit)
        waiting = [r for r in touched if common.run_exit_code(r) == common.EXIT_ATTENTION]
        left = rt.attention()
    if as_json:
        common.emit_json({"runs": [r.to_dict() for r in touched], "attention": len(left)})
    else:
        from effectflow.cli import render

        console = common.console()
        console.print(f"reconciled {len(touched)} run(s)")
        for run in touched:
            console.print(render.run_line(run))
        if left:
            console.print(
                f"{len(left)} item(s) still need a person"
                + (f" ({len(waiting)} of the runs touched)" if waiting else "")
                + ": effectflow attention"
            )
    raise typer.Exit(common.EXIT_ATTENTION if left or waiting else common.EXIT_OK)


def recover(
    limit: Annotated[
        int, typer.Option("--limit", min=1, help="At most this many runs in this pass.")
    ] = 100,
    app: common.AppOption = None,
    db: common.DbOption = common.DEFAULT_DB,
    tenant: common.TenantOption = "default",
    as_json: common.JsonOption = False,
) -> None:
    """Continue the tenant's interrupted runs now, in this process; a line per run as it is left.

    Interrupted: running, but its owner died (a dead pid on this host, at once) or its lease
    expired (another host). Each continues from its ledger: confirmed steps keep their results, a
    call in doubt is looked up or retried with its original key. Runs never claimed by a worker are
    driven too. Exit 1 if a run failed, 3 if one waits for a person, else 0.
    """
    console = common.console()
    with common.runtime("recover", db, tenant, app=app, as_json=as_json) as rt:
        if not as_json:
            console.print("recovering the interrupted runs of tenant " + rt.tenant)

        def progress(run: records.RunRecord) -> None:
            if not as_json:
                from effectflow.cli import render

                console.print(render.run_line(run))

        left = rt.recover(limit=limit, on_run=progress)
        views = [rt.run_view(r) for r in left]
        waiting = rt.attention()
    codes = {common.run_exit_code(r) for r in left}
    code = (
        common.EXIT_FAILURE if common.EXIT_FAILURE in codes else max(codes, default=common.EXIT_OK)
    )
    if as_json:
        common.emit_json({"runs": [v.to_dict() for v in views], "attention": len(waiting)})
    else:
        console.print(f"recovered {len(left)} run(s)" if left else "no run to recover")
        if waiting:
            console.print(f"{len(waiting)} item(s) need a person: effectflow attention")
    raise typer.Exit(code)


def resolve(
    effect_id: Annotated[
        str, typer.Argument(metavar="EFFECT", help="The effect's id (eff_...).", show_default=False)
    ],
    evidence: Annotated[
        str,
        typer.Option(
            "--evidence",
            help="What proves the decision, a JSON object. external_effect_id: the provider's "
            "id of the effect; result: what the tool would have returned (then the step's output "
            "as is); any other key is kept as evidence. "
            'e.g. \'{"external_effect_id": "msg_81", "ticket": "OPS-1"}\'.',
            show_default=False,
        ),
    ],
    by: Annotated[str, typer.Option("--by", help="Who decides (recorded in the audit log).")],
    committed: Annotated[bool, typer.Option("--committed", help="The effect happened.")] = False,
    not_committed: Annotated[
        bool, typer.Option("--not-committed", help="The effect did not happen.")
    ] = False,
    expected_version: Annotated[
        int | None,
        typer.Option(
            "--expected-version", help="Refuse the decision if the effect moved past this version."
        ),
    ] = None,
    decision_id: Annotated[
        str | None,
        typer.Option(
            "--decision-id", help="Makes the decision idempotent: repeating it is a no-op."
        ),
    ] = None,
    app: common.AppOption = None,
    db: common.DbOption = common.DEFAULT_DB,
    tenant: common.TenantOption = "default",
    as_json: common.JsonOption = False,
) -> None:
    """Settle an effect in doubt: it happened (--committed) or not (--not-committed).

    The audit log records who decided on what evidence; then `effectflow resume RUN` continues the
    run (a committed step returns the recorded result, a not-committed one is retried with its
    original key).

    With --committed, the step's output is evidence["result"] when given;
    otherwise the evidence, with the tool's effect-id field (such as
    provider_message_id) set to evidence["external_effect_id"], so the next
    step finds the id where it would after a call. The same with or without
    --app. Any other key is kept as evidence.

    A decision is compare-and-swap: if the effect moved on (another person
    decided first, or it is past --expected-version) nothing is recorded and
    the command exits 1 (stale_state).

    Example: the provider's dashboard shows the email as sent, id msg_81:

        effectflow resolve eff_2b9c --committed --by alice --expected-version 3 \\
          --evidence '{"external_effect_id": "msg_81", "seen_in": "dashboard"}'
    """
    proof = _decision(committed, not_committed, evidence)
    with common.runtime("resolve", db, tenant, app=app, as_json=as_json) as rt:
        effect = rt.resolve(
            effect_id,
            committed=committed,
            evidence=proof,
            by=by,
            expected_version=expected_version,
            decision_id=decision_id,
        )
    if as_json:
        common.emit_json(effect.to_dict())
        return
    from effectflow.cli import render

    common.print_rich(render.resolved_line(effect))


def _decision(committed: bool, not_committed: bool, evidence: str) -> dict[str, Any]:
    """``resolve``'s options checked before the ledger is opened: exactly one verdict, and the
    evidence a JSON object.

    Raises:
        typer.BadParameter: Naming the option at fault (a usage error, exit 2).
    """
    if committed == not_committed:
        raise typer.BadParameter(
            "say exactly one of --committed or --not-committed", param_hint="--committed"
        )
    try:
        proof: Any = json.loads(evidence)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"not JSON: {exc}", param_hint="--evidence") from None
    if not isinstance(proof, dict):
        raise typer.BadParameter("must be a JSON object", param_hint="--evidence")
    return proof


def approve(
    run_id: common.RunArg,
    step_id: Annotated[
        str,
        typer.Argument(
            metavar="STEP",
            help="The step waiting for approval (compensations: compensate:<step>).",
            show_default=False,
        ),
    ],
    approver: Annotated[str, typer.Option("--approver", help="Who approves.")],
    approval_id: Annotated[
        str, typer.Option("--approval-id", help="The approval's own id (a ticket); unique.")
    ],
    note: Annotated[
        str | None, typer.Option("--note", help="Why it is approved (recorded with it).")
    ] = None,
    app: common.AppOption = None,
    db: common.DbOption = common.DEFAULT_DB,
    tenant: common.TenantOption = "default",
    as_json: common.JsonOption = False,
) -> None:
    """Approve a step waiting for approval; the run then continues in this process."""
    with common.runtime("approve", db, tenant, app=app, as_json=as_json) as rt:
        run = rt.approve(run_id, step_id, approver=approver, approval_id=approval_id, note=note)
    common.finish_run(run, as_json)


def reject(
    run_id: common.RunArg,
    step_id: Annotated[
        str,
        typer.Argument(metavar="STEP", help="The step waiting for approval.", show_default=False),
    ],
    by: Annotated[str, typer.Option("--by", help="Who declines (recorded).")],
    reason: Annotated[str, typer.Option("--reason", help="Why it is declined (recorded).")],
    app: common.AppOption = None,
    db: common.DbOption = common.DEFAULT_DB,
    tenant: common.TenantOption = "default",
    as_json: common.JsonOption = False,
) -> None:
    """Decline a step waiting for approval: it is never called, and the run continues in this
    process with the step rejected (its workflow sees StepRejected)."""
    with common.runtime("reject", db, tenant, app=app, as_json=as_json) as rt:
        run = rt.reject(run_id, step_id, by=by, reason=reason)
    common.finish_run(run, as_json)


def cancel(
    run_id: common.RunArg,
    reason: Annotated[
        str | None, typer.Option("--reason", help="Why (recorded in the audit log).")
    ] = None,
    by: common.ByOption = "operator",
    app: common.AppOption = None,
    db: common.DbOption = common.DEFAULT_DB,
    tenant: common.TenantOption = "default",
    as_json: common.JsonOption = False,
) -> None:
    """Cancel a run and print what it left in the world.

    The inventory lists confirmed, in-flight, unknown and compensated effects and the steps that
    never started; exit 3 if unknown effects or compensations wait for reconciliation or a person.
    """
    with common.runtime("cancel", db, tenant, app=app, as_json=as_json) as rt:
        inv = rt.cancel(run_id, reason=reason, by=by)
    if as_json:
        common.emit_json(inv.to_dict())
    else:
        from effectflow.cli import render

        common.print_rich(render.inventory(inv))
    waits = inv.status in common.WAITING or bool(inv.unknown) or bool(inv.compensation_pending)
    raise typer.Exit(common.EXIT_ATTENTION if waits else common.EXIT_OK)


def resume(
    run_id: common.RunArg,
    by: common.ByOption = "operator",
    app: common.AppOption = None,
    db: common.DbOption = common.DEFAULT_DB,
    tenant: common.TenantOption = "default",
    as_json: common.JsonOption = False,
) -> None:
    """Continue a run: an interrupted one, a paused one, or (redrive) a failed one."""
    with common.runtime("resume", db, tenant, app=app, as_json=as_json) as rt:
        run = rt.resume(run_id, by=by)
    common.finish_run(run, as_json)


def compensate(
    run_id: common.RunArg,
    reason: Annotated[
        str,
        typer.Option("--reason", help="The business condition that abandons the goal."),
    ],
    by: common.ByOption = "operator",
    app: common.AppOption = None,
    db: common.DbOption = common.DEFAULT_DB,
    tenant: common.TenantOption = "default",
    as_json: common.JsonOption = False,
) -> None:
    """Abandon the run's business goal: compensate its confirmed effects.

    Each compensation is a new effect, never an undo, with an approval where money moves. Never for
    a technical failure: failed runs keep their effects as facts.
    """
    if not reason.strip():
        raise typer.BadParameter("give the business condition", param_hint="--reason")
    with common.runtime("compensate", db, tenant, app=app, as_json=as_json) as rt:
        run = rt.compensate(run_id, reason=reason, by=by)
    common.finish_run(run, as_json)
