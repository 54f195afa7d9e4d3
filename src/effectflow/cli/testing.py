"""``effectflow testing``: test helpers that run as their own process.

``serve-providers`` is a thin layer over :func:`effectflow.testing.service.serve`, which needs the
``testing`` extra (Starlette, uvicorn, httpx); without it the command says so and exits 1.
"""

from __future__ import annotations

import os
import pathlib
from typing import Annotated

import typer

app = typer.Typer(
    help="Test helpers: the simulated providers as a local HTTP service.", no_args_is_help=True
)

# Exit code, as in ``effectflow.cli.main`` (not imported from there: main imports this module).
_EXIT_FAILURE = 1


@app.command("serve-providers")
def serve_providers(
    directory: Annotated[
        pathlib.Path,
        typer.Option("--dir", help="Folder of the providers' SQLite files (created if missing)."),
    ],
    host: Annotated[str, typer.Option("--host", help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port; 0 picks a free one.")] = 0,
    ready_file: Annotated[
        pathlib.Path | None,
        typer.Option(
            "--ready-file", help="Write the service's URL to this file once it is listening."
        ),
    ] = None,
    hang: Annotated[
        float,
        typer.Option(
            "--hang",
            min=0.0,
            help="Seconds a lost response is held back before answering 504; keep it above the "
            "clients' read timeout.",
        ),
    ] = 60.0,
) -> None:
    """Serve the simulated providers over HTTP on loopback until SIGTERM or Ctrl-C.

    Prints the service's URL on stdout once it is listening (and writes it to --ready-file),
    so a test can start this command and wait for the file. Exits 0 after a clean shutdown.
    """
    try:
        from effectflow.testing import service
    except ModuleNotFoundError as exc:
        typer.echo(
            f"effectflow testing serve-providers needs the 'testing' extra ({exc.name} is not"
            " installed): pip install 'effectflow[testing]'",
            err=True,
        )
        raise typer.Exit(_EXIT_FAILURE) from None

    def announce(url: str) -> None:
        typer.echo(url)
        if ready_file is not None:
            _write_atomically(ready_file, url + "\n")

    try:
        service.serve(directory, host=host, port=port, hang=hang, on_ready=announce)
    except RuntimeError as exc:
        typer.echo(f"effectflow testing serve-providers: {exc}", err=True)
        raise typer.Exit(_EXIT_FAILURE) from None


def _write_atomically(path: pathlib.Path, text: str) -> None:
    """Write so that a reader polling for ``path`` never sees it half written."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)
