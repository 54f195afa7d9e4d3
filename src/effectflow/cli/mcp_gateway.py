"""``effectflow mcp-gateway``: an MCP server (stdio) that fronts other MCP servers with contracts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from effectflow import errors


def mcp_gateway(
    config: Annotated[
        Path,
        typer.Option(
            "--config", exists=True, dir_okay=False, help="The gateway.yaml naming the upstreams."
        ),
    ],
    db: Annotated[
        str,
        typer.Option("--db", envvar="EFFECTFLOW_DB", help="Ledger URL for the gateway's runs."),
    ] = "sqlite:///mcp-gateway.db",
) -> None:
    """Serve MCP over stdio, recording every contracted upstream call as a run in the ledger.

    Tools without a contract are refused or forwarded unrecorded, as the config's default says.
    """
    try:
        import anyio

        from effectflow.contrib.mcp import config as config_mod
        from effectflow.contrib.mcp import gateway
    except ImportError as exc:
        raise typer.BadParameter(
            f"the MCP gateway needs the mcp extra: pip install 'effectflow[mcp]' ({exc})"
        ) from exc
    try:
        loaded = config_mod.load(config)
    except errors.ContractError as exc:
        raise typer.BadParameter(str(exc), param_hint="--config") from exc
    anyio.run(gateway.serve, loaded, db)
