"""The ``effectflow`` command: a thin layer over the public API.

Exit codes (documented in the README): 0 ok, 1 failure, 2 usage error, 3 something needs attention.
"""

from __future__ import annotations

import enum
import json
import os
from pathlib import Path
from typing import Annotated

import typer

from effectflow.cli import contracts as contracts_cli
from effectflow.cli import mcp_gateway as mcp_gateway_cli
from effectflow.cli import ops as ops_cli
from effectflow.cli import serve as serve_cli
from effectflow.cli import testing as testing_cli
from effectflow.cli import worker as worker_cli

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_ATTENTION = 3
#: ``audit verify``: the ledger was read and it was tampered with (or damaged).
EXIT_TAMPERED = 4

app = typer.Typer(
    name="effectflow",
    help="Run tool calls with real side effects, and know after any crash which effects happened.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(contracts_cli.app, name="contracts")
app.add_typer(testing_cli.app, name="testing")
audit_app = typer.Typer(
    help="Inspect the append-only, hash-chained audit log.", no_args_is_help=True
)
app.add_typer(audit_app, name="audit")
app.command("worker")(worker_cli.worker)
app.command("serve")(serve_cli.serve)
app.command("mcp-gateway")(mcp_gateway_cli.mcp_gateway)
app.command("runs")(ops_cli.runs)
app.command("show")(ops_cli.show)
app.command("effects")(ops_cli.effects)
app.command("attention")(ops_cli.attention)
app.command("reconcile")(ops_cli.reconcile)
app.command("recover")(ops_cli.recover)
app.command("resolve")(ops_cli.resolve)
app.command("approve")(ops_cli.approve)
app.command("reject")(ops_cli.reject)
app.command("cancel")(ops_cli.cancel)
app.command("resume")(ops_cli.resume)
app.command("compensate")(ops_cli.compensate)
app.command("bench")(ops_cli.bench)

DbOption = Annotated[
    str,
    typer.Option(
        "--db",
        envvar="EFFECTFLOW_DB",
        help="Ledger URL (sqlite:///path.db). Default: the embedded SQLite file effectflow.db.",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]


class Scenario(enum.StrEnum):
    """The stories ``effectflow demo`` can tell."""

    #: A worker is SIGKILLed mid-call and a fresh process recovers (the default).
    CUSTOMER_CASE = "customer_case"
    #: A refund needs approval, loses its response, then is cancelled when the goal is abandoned.
    REFUND = "refund"
    #: A deploy with a precondition meets a concurrent writer, re-observes and never overwrites.
    DEPLOY = "deploy"
    #: A model uses tools; its worker is SIGKILLed mid-turn and no recorded turn is asked again.
    AGENT = "agent"


@app.command()
def demo(
    folder: Annotated[
        Path | None,
        typer.Option("--dir", help="Keep the demo's ledger and provider files in this folder."),
    ] = None,
    scenario: Annotated[
        Scenario,
        typer.Option(
            "--scenario",
            help="customer_case: SIGKILL and recovery; refund: approvals and compensation; "
            "deploy: a precondition conflict and re-observation; agent: a model's tool calls "
            "survive a SIGKILL without asking it again.",
        ),
    ] = Scenario.CUSTOMER_CASE,
) -> None:
    """Run a demo; the default, customer_case, SIGKILLs a worker mid-call and recovers the run.

    Every scenario ends with the providers' own truth, read back from their files.
    """
    from rich.console import Console

    console = Console(width=None if os.isatty(1) else 120)
    # Import only the scenario asked for: each one registers its own tools and workflow.
    if scenario is Scenario.REFUND:
        from effectflow.demo import refund

        raise typer.Exit(refund.run(folder, console))
    if scenario is Scenario.DEPLOY:
        from effectflow.demo import deploy

        raise typer.Exit(deploy.run(folder, console))
    if scenario is Scenario.AGENT:
        from effectflow.demo import agent

        raise typer.Exit(agent.run(folder, console))
    from effectflow.demo import runner

    raise typer.Exit(runner.run(folder, console))


@audit_app.command("verify")
def audit_verify(
    db: DbOption = "sqlite:///effectflow.db",
    run_id: Annotated[str | None, typer.Option("--run", help="Verify one run only.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Recompute every run's audit hash chain, read-only; exit 4 if any event was edited, added
    or removed, 2 if the ledger could not be read."""
    from effectflow import errors
    from effectflow.ledger.store import open_store

    ops_cli._require_ledger(db)
    try:
        store = open_store(ops_cli.read_only_url(db))
    except errors.EffectflowError as exc:
        if as_json:
            typer.echo(json.dumps({"error": exc.to_dict()}), err=True)
        else:
            typer.echo(f"effectflow audit verify: {exc.message}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    try:
        problems = store.verify_audit(run_id)
    finally:
        store.close()
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "ok": not problems,
                    "problems": [
                        {"run_id": p.run_id, "seq": p.seq, "message": p.message} for p in problems
                    ],
                }
            )
        )
    elif problems:
        for p in problems:
            where = f"event {p.seq}" if p.seq is not None else "chain"
            typer.echo(f"run {p.run_id}: {where}: {p.message}", err=True)
    else:
        typer.echo("audit log intact")
    raise typer.Exit(EXIT_TAMPERED if problems else EXIT_OK)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
