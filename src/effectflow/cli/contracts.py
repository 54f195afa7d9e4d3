"""``effectflow contracts``: validate contract files."""

from __future__ import annotations

import typer

app = typer.Typer(help="Work with side-effect and step contract files.", no_args_is_help=True)
