"""The ``effectflow`` command: a thin layer over the public API.

Exit codes (documented in the README): 0 ok, 1 failure, 2 usage error, 3 something needs attention.
"""

from __future__ import annotations

import typer

from effectflow.cli import contracts as contracts_cli

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_ATTENTION = 3

app = typer.Typer(
    name="effectflow",
    help="Run tool calls with real side effects, and know after any crash which effects happened.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(contracts_cli.app, name="contracts")


def main() -> None:
    """Console-script entry point."""
    app()
