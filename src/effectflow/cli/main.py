"""The ``effectflow`` command: a thin layer over the public API.

Exit codes (documented in the README): 0 ok, 1 failure, 2 usage error, 3 something needs attention.
"""

from __future__ import annotations

import enum
import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from effectflow.cli import contracts as contracts_cli
from effectflow.cli import mcp_gateway as mcp_gateway_cli
from effectflow.cli import migrate as migrate_cli
from effectflow.cli import ops as ops_cli
from effectflow.cli import retention as retention_cli
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
app.command("migrate")(migrate_cli.migrate)
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
app.command("purge-keys")(retention_cli.purge_keys)
app.command("archive")(retention_cli.archive)

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


def _open_for_audit(verb: str, db: str, as_json: bool) -> Any:
    """The ledger opened read-only for an audit verb; a ledger that cannot be read exits 2."""
    from effectflow import errors
    from effectflow.ledger.store import open_store

    ops_cli._require_ledger(db)
    try:
        return open_store(ops_cli.read_only_url(db))
    except errors.EffectflowError as exc:
        if as_json:
            typer.echo(json.dumps({"error": exc.to_dict()}), err=True)
        else:
            typer.echo(f"effectflow audit {verb}: {exc.message}", err=True)
        raise typer.Exit(EXIT_USAGE) from None


_UNKEYED = (
    "no audit key ({env}): the chains are plain sha256, so only accidental damage is detectable; "
    "someone who can write the ledger can recompute them. Set {env} (or {env}_FILE) where the "
    "ledger is written and verified"
)


_KEYED_NO_KEY = (
    "this ledger is keyed (its hashes are hmac-sha256) and no audit key was given: the keyed "
    "hashes were not checked, so this is no proof. Set {env} (or {env}_FILE) to the ledger's key"
)


@audit_app.command("verify")
def audit_verify(
    db: DbOption = "sqlite:///effectflow.db",
    run_id: Annotated[str | None, typer.Option("--run", help="Verify one run only.")] = None,
    against: Annotated[
        Path | None,
        typer.Option(
            "--against",
            help="A head exported earlier (effectflow audit head): every run in it must still "
            "be there, its chains reaching the exported heads.",
            exists=True,
            dir_okay=False,
        ),
    ] = None,
    archive_file: Annotated[
        Path | None,
        typer.Option(
            "--archive",
            help="Verify this archive file (effectflow archive) on its own instead of a ledger.",
            exists=True,
            dir_okay=False,
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Verify the ledger, read-only: every run's audit events and seals (HMAC-chained with the
    key in EFFECTFLOW_AUDIT_KEY, when the ledger is keyed), its state rows against what was
    written, and with --against a head exported earlier; with --archive, an archive file on its
    own. Exit 0 intact, 4 tampered or damaged, 2 the ledger (or file) could not be read."""
    from effectflow.ledger import audit, audit_read

    if archive_file is not None:
        _verify_archive(archive_file, as_json)
    store = _open_for_audit("verify", db, as_json)
    try:
        key = store.audit_key
        problems = [audit.Problem(p.run_id, p.seq, p.message) for p in store.verify_audit(run_id)]
        keyed_ledger = key is None and bool(
            store.audit_rows(store.SQL["keyed_seal"], (audit.KEYED + "%",))
        )
        if against is not None:
            try:
                head = json.loads(against.read_text(encoding="utf-8"))
                shape = audit.head_shape(head)
                if shape is not None:
                    raise ValueError(shape)
            except (OSError, ValueError) as exc:
                typer.echo(f"effectflow audit verify: --against {against}: {exc}", err=True)
                raise typer.Exit(EXIT_USAGE) from None
            want = {int(e["shard"]): int(e["n"]) for e in head.get("shards", [])}
            with store.audit_snapshot():
                chains = audit.replay_shards(store, key, want)[1]
                found = dict(audit_read.materials_batched(store))
                problems += audit.check_head(head, found, key, chains, _archived(store, key))
    finally:
        store.close()
    note = None if key is not None else _UNKEYED.format(env=audit.KEY_ENV)
    if keyed_ledger:
        note = _KEYED_NO_KEY.format(env=audit.KEY_ENV)
    if as_json:
        body = {
            "ok": not problems,
            "keyed": key is not None,
            "problems": [
                {"run_id": p.run_id, "seq": p.seq, "message": p.message} for p in problems
            ],
        }
        typer.echo(json.dumps(body))
    else:
        for p in problems:
            where = (
                "chain" if p.seq is None else (f"event {p.seq}" if p.seq > 0 else f"seal {-p.seq}")
            )
            who = p.run_id[1:-1] if p.run_id.startswith("(shard ") else f"run {p.run_id}"
            typer.echo(f"{who}: {where}: {p.message}", err=True)
        if not problems:
            typer.echo("audit log intact" + ("" if against is None else f", and reaches {against}"))
        if note:
            typer.echo(note, err=True)
    raise typer.Exit(EXIT_TAMPERED if problems else EXIT_OK)


def _archived(store: Any, key: bytes | None) -> set[str]:
    """The runs archived by right (their archive records verify; verify reports the others)."""
    from effectflow.ledger import archive

    if not store.audit_rows(store.SQL["migration_applied_at"], (archive.ARCHIVES_SINCE,)):
        return set()
    return archive.check_records(store, key)[0]


def _verify_archive(path: Path, as_json: bool) -> None:
    """``audit verify --archive``: the file's runs recomputed from its own rows, with the key."""
    from effectflow.ledger import archive, audit

    key = audit.key_from_env()
    try:
        problems = archive.verify_file(path, key)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        typer.echo(f"effectflow audit verify: --archive {path}: {exc}", err=True)
        raise typer.Exit(EXIT_USAGE) from None
    if as_json:
        body = {
            "ok": not problems,
            "keyed": key is not None,
            "problems": [{"run_id": p.run_id, "message": p.message} for p in problems],
        }
        typer.echo(json.dumps(body))
    else:
        for p in problems:
            typer.echo(f"run {p.run_id}: {p.message}", err=True)
        if not problems:
            typer.echo(f"archive {path} intact")
        if key is None:
            typer.echo(_UNKEYED.format(env=audit.KEY_ENV), err=True)
    raise typer.Exit(EXIT_TAMPERED if problems else EXIT_OK)


@audit_app.command("head")
def audit_head(
    db: DbOption = "sqlite:///effectflow.db",
    out: Annotated[
        Path | None, typer.Option("--out", help="Write the head here (default: stdout).")
    ] = None,
) -> None:
    """Export the ledger's head: every run's event and seal heads and every shard's, signed with
    the audit key. Keep these exports outside the ledger (another machine, a bucket with object
    lock); `audit verify --against HEADFILE` then finds a run deleted, or its newest writes cut,
    since, even by someone who put back shard heads they had watched."""
    from effectflow.ledger import audit, audit_read

    store = _open_for_audit("head", db, False)
    try:
        with store.audit_snapshot():  # the runs' heads and the shards' of one moment
            head = audit.export_head(
                [audit.head_entry(m) for _, m in audit_read.materials_batched(store)],
                store.audit_key,
                audit.shard_heads(store),
            )
    finally:
        store.close()
    text = json.dumps(head, indent=1, sort_keys=True) + "\n"
    if out is None:
        typer.echo(text, nl=False)
    else:
        out.write_text(text, encoding="utf-8")
        typer.echo(f"{len(head['runs'])} run(s) -> {out}", err=True)
    if head["key_id"] is None:
        typer.echo(_UNKEYED.format(env=audit.KEY_ENV), err=True)


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
