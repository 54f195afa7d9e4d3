"""The operator verbs of ``effectflow``: each a thin layer over one public method of ``ef.Runtime``.

Reads (``runs``, ``show``, ``effects``, ``attention``) print rich tables or, with ``--json``, the
records' ``to_dict()``. Actions (``reconcile``, ``resolve``, ``approve``, ``cancel``, ``resume``,
``compensate``) may execute workflow code, so they take ``--app`` to import the application's tools
and workflows first.

Exit codes (as in ``effectflow.cli.main``, not imported from there: main imports this module):
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
from effectflow.ledger.records import NextAction, RunStatus, StepStatus

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from effectflow.ledger import records
    from effectflow.runtime.runtime import Runtime

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_ATTENTION = 3

#: Run statuses after which a person must act before the run moves on.
_WAITING = frozenset({RunStatus.PAUSED, RunStatus.CANCELLED_PENDING_RECONCILIATION})

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
        help="The application to import first, module or module:object, so the tools and "
        "workflows the run executes are registered (e.g. myapp.flows).",
    ),
]
RunArg = Annotated[str, typer.Argument(metavar="RUN", help="The run's id.", show_default=False)]
ByOption = Annotated[str, typer.Option("--by", help="Who acts (recorded in the audit log).")]

DEFAULT_DB = "sqlite:///effectflow.db"


# -- shared plumbing --------------------------------------------------------------------------------


def _console() -> Console:
    from rich.console import Console

    # A pipe gets a fixed width, so scripts and tests see the same lines on every terminal.
    return Console(width=None if sys.stdout.isatty() else 140)


def _print(renderable: RenderableType) -> None:
    _console().print(renderable)


def _emit_json(value: Any) -> None:
    # StrEnum members serialise as their values; ``default=str`` covers any stray non-JSON value.
    typer.echo(json.dumps(value, indent=2, default=str))


def _fail(
    verb: str, exc: errors.EffectflowError, code: int, as_json: bool, hint: str = ""
) -> NoReturn:
    if as_json:
        typer.echo(json.dumps({"error": exc.to_dict()}), err=True)
    else:
        typer.echo(f"effectflow {verb}: {exc.message}{hint}", err=True)
    raise typer.Exit(code)


def _require_ledger(db: str) -> None:
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
def _runtime(
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
    _require_ledger(db)
    try:
        rt = Runtime(read_only_url(db) if read_only else db, tenant=tenant, registry=registry)
    except errors.EffectflowError as exc:
        _fail(verb, exc, EXIT_USAGE, as_json)
    try:
        yield rt
    except errors.ContractError as exc:
        hint = "" if app else " (pass --app to import the application's tools and workflows)"
        _fail(verb, exc, EXIT_FAILURE, as_json, hint)
    except errors.EffectflowError as exc:
        _fail(verb, exc, EXIT_FAILURE, as_json)
    finally:
        rt.close()


def run_exit_code(run: records.RunRecord) -> int:
    """What an action's resulting run means for the exit code: 3 if a person must act, 1 if the
    run failed, else 0."""
    if run.status in _WAITING or run.next_action is NextAction.ASK_A_PERSON:
        return EXIT_ATTENTION
    if run.status is RunStatus.FAILED:
        return EXIT_FAILURE
    return EXIT_OK


def _finish_run(run: records.RunRecord, as_json: bool) -> NoReturn:
    if as_json:
        _emit_json(run.to_dict())
    else:
        from effectflow.cli import render

        _print(render.run_line(run))
    raise typer.Exit(run_exit_code(run))


# -- reads ------------------------------------------------------------------------------------------


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
    db: DbOption = DEFAULT_DB,
    tenant: TenantOption = "default",
    as_json: JsonOption = False,
) -> None:
    """List the tenant's runs, newest first; an interrupted run (its owner died, its lease expired)
    says so, and `effectflow recover` continues it. A guarded call (`rt.guard`: a LangGraph tool
    call, an MCP client's call) shows the host's scope and call id, and `--scope` / `--call-id`
    find it by them."""
    with _runtime("runs", db, tenant, as_json=as_json, read_only=True) as rt:
        runs = rt.runs(
            status=[s.value for s in status] if status else None,
            limit=limit,
            scope=scope,
            call_id=call_id,
        )
        found = [rt.run_view(r) for r in runs]
    if as_json:
        _emit_json([v.to_dict() for v in found])
        return
    from effectflow.cli import render

    _print(render.runs_table(found))


def show(
    run_id: RunArg,
    db: DbOption = DEFAULT_DB,
    tenant: TenantOption = "default",
    as_json: JsonOption = False,
) -> None:
    """Show a run's timeline: its steps as a tree, then its audit events.

    Each step shows its status, completion state and attempts (kind, outcome, error), its effect
    (external id, request and response digests, approval, compensation status) and the
    compensation that answers it; then the audit events in order, with actor and details.
    """
    with _runtime("show", db, tenant, as_json=as_json, read_only=True) as rt:
        tl = rt.timeline(run_id)
        view = rt.run_view(tl.run)
    if as_json:
        _emit_json({**tl.to_dict(), "run": view.to_dict()})
        return
    from effectflow.cli import render

    _print(render.timeline(tl, view))


def effects(
    status: Annotated[
        list[StepStatus] | None,
        typer.Option(
            "--status", help="Only effects in this status, e.g. unknown (repeat for several)."
        ),
    ] = None,
    run_id: Annotated[str | None, typer.Option("--run", help="Only this run's effects.")] = None,
    db: DbOption = DEFAULT_DB,
    tenant: TenantOption = "default",
    as_json: JsonOption = False,
) -> None:
    """List External Effect Records: what happened, or may have, in outside systems."""
    with _runtime("effects", db, tenant, as_json=as_json, read_only=True) as rt:
        found = rt.effects(run_id=run_id, status=[s.value for s in status] if status else None)
    if as_json:
        _emit_json([e.to_dict() for e in found])
        return
    from effectflow.cli import render

    _print(render.effects_table(found))


def attention(
    db: DbOption = DEFAULT_DB,
    tenant: TenantOption = "default",
    as_json: JsonOption = False,
) -> None:
    """List what waits for a person; exit 3 when anything does.

    Effects in doubt, steps waiting for approval and failed compensations, oldest first, each with
    the actions that settle it.
    """
    with _runtime("attention", db, tenant, as_json=as_json, read_only=True) as rt:
        items = rt.attention()
    if as_json:
        _emit_json([i.to_dict() for i in items])
    else:
        from effectflow.cli import render

        _print(render.attention_table(items))
    raise typer.Exit(EXIT_ATTENTION if items else EXIT_OK)


# -- actions ----------------------------------------------------------------------------------------


def reconcile(
    limit: Annotated[
        int, typer.Option("--limit", min=1, help="At most this many paused runs per pass.")
    ] = 100,
    app: AppOption = None,
    db: DbOption = DEFAULT_DB,
    tenant: TenantOption = "default",
    as_json: JsonOption = False,
) -> None:
    """Settle unknown outcomes through lookup tools; exit 3 if a person is still needed.

    Paused runs with an effect in doubt are looked up and continued, interrupted runs recovered;
    runs whose effects no lookup can settle stay in the attention queue.
    """
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    err = Console(stderr=True)
    with _runtime("reconcile", db, tenant, app=app, as_json=as_json) as rt:
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
        waiting = [r for r in touched if run_exit_code(r) == EXIT_ATTENTION]
        left = rt.attention()
    if as_json:
        _emit_json({"runs": [r.to_dict() for r in touched], "attention": len(left)})
    else:
        from effectflow.cli import render

        console = _console()
        console.print(f"reconciled {len(touched)} run(s)")
        for run in touched:
            console.print(render.run_line(run))
        if left:
            console.print(
                f"{len(left)} item(s) still need a person"
                + (f" ({len(waiting)} of the runs touched)" if waiting else "")
                + ": effectflow attention"
            )
    raise typer.Exit(EXIT_ATTENTION if left or waiting else EXIT_OK)


def recover(
    limit: Annotated[
        int, typer.Option("--limit", min=1, help="At most this many runs in this pass.")
    ] = 100,
    app: AppOption = None,
    db: DbOption = DEFAULT_DB,
    tenant: TenantOption = "default",
    as_json: JsonOption = False,
) -> None:
    """Continue the tenant's interrupted runs now, in this process; a line per run as it is left.

    Interrupted: running, but its owner died (a dead pid on this host, at once) or its lease
    expired (another host). Each continues from its ledger: confirmed steps keep their results, a
    call in doubt is looked up or retried with its original key. Runs never claimed by a worker are
    driven too. Exit 1 if a run failed, 3 if one waits for a person, else 0.
    """
    console = _console()
    with _runtime("recover", db, tenant, app=app, as_json=as_json) as rt:
        if not as_json:
            console.print("recovering the interrupted runs of tenant " + rt.tenant)

        def progress(run: records.RunRecord) -> None:
            if not as_json:
                from effectflow.cli import render

                console.print(render.run_line(run))

        left = rt.recover(limit=limit, on_run=progress)
        views = [rt.run_view(r) for r in left]
        waiting = rt.attention()
    codes = {run_exit_code(r) for r in left}
    code = EXIT_FAILURE if EXIT_FAILURE in codes else max(codes, default=EXIT_OK)
    if as_json:
        _emit_json({"runs": [v.to_dict() for v in views], "attention": len(waiting)})
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
    app: AppOption = None,
    db: DbOption = DEFAULT_DB,
    tenant: TenantOption = "default",
    as_json: JsonOption = False,
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
    if committed == not_committed:
        raise typer.BadParameter(
            "say exactly one of --committed or --not-committed", param_hint="--committed"
        )
    try:
        proof = json.loads(evidence)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"not JSON: {exc}", param_hint="--evidence") from None
    if not isinstance(proof, dict):
        raise typer.BadParameter("must be a JSON object", param_hint="--evidence")
    with _runtime("resolve", db, tenant, app=app, as_json=as_json) as rt:
        effect = rt.resolve(
            effect_id,
            committed=committed,
            evidence=proof,
            by=by,
            expected_version=expected_version,
            decision_id=decision_id,
        )
    if as_json:
        _emit_json(effect.to_dict())
        return
    from effectflow.cli import render

    _print(render.resolved_line(effect))


def approve(
    run_id: RunArg,
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
    app: AppOption = None,
    db: DbOption = DEFAULT_DB,
    tenant: TenantOption = "default",
    as_json: JsonOption = False,
) -> None:
    """Approve a step waiting for approval; the run then continues in this process."""
    with _runtime("approve", db, tenant, app=app, as_json=as_json) as rt:
        run = rt.approve(run_id, step_id, approver=approver, approval_id=approval_id, note=note)
    _finish_run(run, as_json)


def reject(
    run_id: RunArg,
    step_id: Annotated[
        str,
        typer.Argument(metavar="STEP", help="The step waiting for approval.", show_default=False),
    ],
    by: Annotated[str, typer.Option("--by", help="Who declines (recorded).")],
    reason: Annotated[str, typer.Option("--reason", help="Why it is declined (recorded).")],
    app: AppOption = None,
    db: DbOption = DEFAULT_DB,
    tenant: TenantOption = "default",
    as_json: JsonOption = False,
) -> None:
    """Decline a step waiting for approval: it is never called, and the run continues in this
    process with the step rejected (its workflow sees StepRejected)."""
    with _runtime("reject", db, tenant, app=app, as_json=as_json) as rt:
        run = rt.reject(run_id, step_id, by=by, reason=reason)
    _finish_run(run, as_json)


def cancel(
    run_id: RunArg,
    reason: Annotated[
        str | None, typer.Option("--reason", help="Why (recorded in the audit log).")
    ] = None,
    by: ByOption = "operator",
    app: AppOption = None,
    db: DbOption = DEFAULT_DB,
    tenant: TenantOption = "default",
    as_json: JsonOption = False,
) -> None:
    """Cancel a run and print what it left in the world.

    The inventory lists confirmed, in-flight, unknown and compensated effects and the steps that
    never started; exit 3 if unknown effects or compensations wait for reconciliation or a person.
    """
    with _runtime("cancel", db, tenant, app=app, as_json=as_json) as rt:
        inv = rt.cancel(run_id, reason=reason, by=by)
    if as_json:
        _emit_json(inv.to_dict())
    else:
        from effectflow.cli import render

        _print(render.inventory(inv))
    waits = inv.status in _WAITING or bool(inv.unknown) or bool(inv.compensation_pending)
    raise typer.Exit(EXIT_ATTENTION if waits else EXIT_OK)


def resume(
    run_id: RunArg,
    by: ByOption = "operator",
    app: AppOption = None,
    db: DbOption = DEFAULT_DB,
    tenant: TenantOption = "default",
    as_json: JsonOption = False,
) -> None:
    """Continue a run: an interrupted one, a paused one, or (redrive) a failed one."""
    with _runtime("resume", db, tenant, app=app, as_json=as_json) as rt:
        run = rt.resume(run_id, by=by)
    _finish_run(run, as_json)


def compensate(
    run_id: RunArg,
    reason: Annotated[
        str,
        typer.Option("--reason", help="The business condition that abandons the goal."),
    ],
    by: ByOption = "operator",
    app: AppOption = None,
    db: DbOption = DEFAULT_DB,
    tenant: TenantOption = "default",
    as_json: JsonOption = False,
) -> None:
    """Abandon the run's business goal: compensate its confirmed effects.

    Each compensation is a new effect, never an undo, with an approval where money moves. Never for
    a technical failure: failed runs keep their effects as facts.
    """
    if not reason.strip():
        raise typer.BadParameter("give the business condition", param_hint="--reason")
    with _runtime("compensate", db, tenant, app=app, as_json=as_json) as rt:
        run = rt.compensate(run_id, reason=reason, by=by)
    _finish_run(run, as_json)


# -- bench ------------------------------------------------------------------------------------------


def bench(
    workflows: Annotated[
        int,
        typer.Option(
            "--workflows", min=1, help="Workflows timed per workload (after a short warm-up)."
        ),
    ] = 100,
    mode: Annotated[
        str,
        typer.Option(
            "--mode",
            metavar="full|intents|normal|all",
            help="The ledger's durability: full (the default URL; every commit survives power "
            "loss), intents (?durability=intents: outcomes skip their own fsync), normal "
            "(?synchronous=normal: nothing fsynced per commit) or all three.",
        ),
    ] = "full",
    hosts: Annotated[
        bool,
        typer.Option(
            "--hosts",
            help="Instead: the crash scorecard. SIGKILL each host script of "
            "benchmarks/compare/hosts/ right after its effect, alone and with effectflow, and "
            "count the writes in the provider's record after the host's own recovery.",
        ),
    ] = False,
    trials: Annotated[
        int, typer.Option("--trials", min=1, help="With --hosts: crashes per host and point.")
    ] = 5,
    hosts_dir: Annotated[
        Path | None,
        typer.Option(
            "--hosts-dir",
            help="With --hosts: the folder of host scripts. Default: benchmarks/compare/hosts/ "
            "of the checkout this runs in.",
        ),
    ] = None,
    only: Annotated[
        str | None,
        typer.Option("--only", metavar="HOST,HOST", help="With --hosts: score only these hosts."),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Run the effectflow half of the peer comparison on a temporary SQLite ledger.

    The workloads of benchmarks/compare: sequential, 8 threads, external writes with a lookup; and
    the pure and write workloads 8 at a time on asyncio (start_async).

    One sample each, timed against the same functions called directly.

    Side by side with DBOS and LangGraph: benchmarks/compare/run.py in the repository (BENCHMARKS.md).

    With --hosts: the crash scorecard of each agent host, alone and with effectflow
    (docs/integrations/crash_harness.md).
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from effectflow import bench as bench_mod
    from effectflow.cli import render

    if hosts:
        _bench_hosts(trials, hosts_dir, only, as_json)
        return
    chosen = mode.strip().lower()
    if chosen != "all" and chosen not in bench_mod.MODES:
        raise typer.BadParameter(
            f"{mode!r} is not one of {', '.join(bench_mod.MODES)}, all", param_hint="--mode"
        )
    modes = list(bench_mod.MODES) if chosen == "all" else [chosen]
    err = Console(stderr=True)
    per_workload = workflows + bench_mod.warmup_runs(workflows)
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    ) as progress:
        workloads = len(bench_mod.WORKLOADS) + len(bench_mod.ASYNC_WORKLOADS)
        total = len(modes) * workloads * per_workload
        task = progress.add_task("measuring", total=total)

        def starting(workload: str, mode: str) -> None:
            progress.update(task, description=f"{workload}, {mode}")

        results = bench_mod.run_all(
            modes=modes,
            workflows=workflows,
            on_start=starting,
            on_run=lambda: progress.advance(task),
        )
    rows = [r.to_dict() for r in results]
    if as_json:
        _emit_json(rows)
        return
    _print(render.bench_table(rows))


def _bench_hosts(trials: int, hosts_dir: Path | None, only: str | None, as_json: bool) -> None:
    """``bench --hosts``: the scorecard of ``effectflow.bench.scorecard``, the code
    benchmarks/compare/hosts_scorecard.py runs too."""
    from effectflow import bench as bench_mod

    names = only.split(",") if only is not None else None
    try:
        directory = hosts_dir if hosts_dir is not None else bench_mod.find_hosts_dir()
        bench_mod.host_scripts(directory)
    except bench_mod.ScorecardError as exc:
        raise typer.BadParameter(str(exc), param_hint="--hosts-dir") from None
    try:
        bench_mod.host_scripts(directory, names)
    except bench_mod.ScorecardError as exc:
        raise typer.BadParameter(str(exc), param_hint="--only") from None

    def progress(host: str, what: str) -> None:
        typer.echo(f"{host}: {what}", err=True)

    scores = bench_mod.scorecard(directory, trials=trials, hosts=names, on_trial=progress)
    if as_json:
        _emit_json([score.to_dict() for score in scores])
        return
    typer.echo(bench_mod.scorecard_text(scores))
