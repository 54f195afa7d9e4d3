"""``effectflow contracts``: validate contract files, print the published schema.

``check`` is a thin layer over :func:`effectflow.contracts.loader.load_contracts`: the CLI and the
library never disagree about what a valid file is.
"""

from __future__ import annotations

import json
import pathlib
from typing import Annotated, Any

import typer

from effectflow import errors
from effectflow.contracts import loader

app = typer.Typer(help="Work with side-effect and step contract files.", no_args_is_help=True)

# Exit codes, as in ``effectflow.cli.main`` (not imported from there: main imports this module).
_EXIT_FAILURE = 1
_EXIT_USAGE = 2


@app.command("check")
def check(
    files: Annotated[
        list[pathlib.Path],
        typer.Argument(help="Contract files (YAML) to validate.", show_default=False),
    ],
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON report on stdout, for scripts.")
    ] = False,
) -> None:
    """Validate contract files against the published schema and the runtime's rules.

    Each valid file prints "OK  path: N tool contracts, M step contracts"; each problem prints
    as "path:line: field: message" on stderr. Exits 0 when every file is valid, 1 when any file
    has a problem, 2 when a file cannot be read.
    """
    for path in files:
        if not path.is_file():
            reason = "is a directory" if path.is_dir() else "no such file"
            typer.echo(f"effectflow contracts check: {path}: {reason}", err=True)
            raise typer.Exit(_EXIT_USAGE)
    reports = [_check_one(path) for path in files]
    if as_json:
        typer.echo(json.dumps({"files": reports}, indent=2))
    else:
        for report in reports:
            if report["ok"]:
                typer.echo(
                    f"OK  {report['file']}: {len(report['tools'])} tool contracts, "
                    f"{len(report['steps'])} step contracts"
                )
            for problem in report["problems"]:
                typer.echo(
                    f"{problem['file']}:{problem['line']}: {problem['field']}: "
                    f"{problem['message']}",
                    err=True,
                )
    if not all(report["ok"] for report in reports):
        raise typer.Exit(_EXIT_FAILURE)


@app.command("schema")
def schema() -> None:
    """Print the published JSON Schema of a contract file (draft 2020-12), for editors and CI."""
    typer.echo(json.dumps(loader.schema(), indent=2))


def _check_one(path: pathlib.Path) -> dict[str, Any]:
    """One file's report; a file that cannot be read is a usage error, so it exits 2 here."""
    name = str(path)
    try:
        contracts = loader.load_contracts(path)
    except errors.ContractFileError as exc:
        problems = [
            {"file": p.file, "line": p.line, "field": p.field, "message": p.message}
            for p in exc.problems
        ]
        return {"file": name, "ok": False, "problems": problems, "tools": [], "steps": []}
    except OSError as exc:
        typer.echo(f"effectflow contracts check: {path}: {exc.strerror or exc}", err=True)
        raise typer.Exit(_EXIT_USAGE) from None
    steps = [{"workflow": workflow, "step_id": step_id} for workflow, step_id in contracts.steps]
    return {
        "file": name,
        "ok": True,
        "problems": [],
        "tools": list(contracts.tools),
        "steps": steps,
    }
