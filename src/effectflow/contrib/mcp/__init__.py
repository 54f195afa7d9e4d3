"""An MCP gateway: side-effect contracts in front of any MCP server's tools (``pip install
effectflow[mcp]``, ``effectflow mcp-gateway --config gateway.yaml``)."""

from effectflow.contrib.mcp.config import GatewayConfig, load, parse
from effectflow.contrib.mcp.gateway import UNKNOWN_PHRASE, Gateway, serve

__all__ = ["UNKNOWN_PHRASE", "Gateway", "GatewayConfig", "load", "parse", "serve"]
