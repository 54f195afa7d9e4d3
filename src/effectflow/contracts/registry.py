"""Where tools and workflows are found by name.

Recovery happens in a fresh process that knows a run only by the names the ledger recorded
(``customer_case``, ``send_email@4``): importing the application's module registers them here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from effectflow import errors

if TYPE_CHECKING:
    from effectflow.contracts.tool import Tool
    from effectflow.contracts.workflow import Workflow


class Registry:
    """Tools by ``name@version`` (and by bare name for the newest), workflows by name."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool[..., Any]] = {}
        self._latest: dict[str, Tool[..., Any]] = {}
        self._workflows: dict[str, Workflow[..., Any]] = {}

    def add_tool(self, tool: Tool[..., Any]) -> None:
        """Register ``tool``; re-registering the same function (a module re-import) is allowed."""
        existing = self._tools.get(tool.ref)
        if existing is not None and existing.fn.__qualname__ != tool.fn.__qualname__:
            raise errors.ContractError(
                f"tool {tool.ref} is already registered by {existing.fn.__qualname__}; "
                "give the new one another name or version"
            )
        self._tools[tool.ref] = tool
        self._latest[tool.name] = tool

    def add_workflow(self, workflow: Workflow[..., Any]) -> None:
        """Register ``workflow`` by name."""
        existing = self._workflows.get(workflow.name)
        if existing is not None and existing.fn.__qualname__ != workflow.fn.__qualname__:
            raise errors.ContractError(
                f"workflow {workflow.name!r} is already registered by {existing.fn.__qualname__}"
            )
        self._workflows[workflow.name] = workflow

    def tool(self, ref: str) -> Tool[..., Any]:
        """The tool named ``name@version``, or the newest registered under a bare ``name``.

        Raises:
            errors.ContractError: when no such tool is registered in this process.
        """
        found = self._tools.get(ref) or self._latest.get(ref)
        if found is None:
            raise errors.ContractError(
                f"unknown tool {ref!r}: no tool of that name is registered in this process; "
                "import the module that defines it (known: "
                f"{sorted(self._tools) or 'none'})"
            )
        return found

    def workflow(self, name: str) -> Workflow[..., Any]:
        """The workflow registered as ``name``.

        Raises:
            errors.ContractError: when it is not registered in this process.
        """
        found = self._workflows.get(name)
        if found is None:
            raise errors.ContractError(
                f"unknown workflow {name!r}: import the module that defines it before resuming "
                f"(known: {sorted(self._workflows) or 'none'})"
            )
        return found

    def tools(self) -> list[Tool[..., Any]]:
        """Every registered tool."""
        return list(self._tools.values())


#: The process-wide registry ``@ef.tool`` and ``@ef.workflow`` add to.
DEFAULT = Registry()
