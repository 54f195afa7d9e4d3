"""What a workflow receives as ``ctx``: ``ctx.call`` runs one step through the step machine."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, ParamSpec, TypeVar, overload

from effectflow import telemetry
from effectflow.contracts.tool import Tool
from effectflow.runtime import driver, step_machine
from effectflow.runtime import state as state_mod
from effectflow.runtime.port import Port
from effectflow.runtime.step_call import StepCall

P = ParamSpec("P")
R = TypeVar("R")


class _Base:
    def __init__(self, port: Port, state: state_mod.RunState) -> None:
        self._port = port
        self._state = state

    @property
    def run_id(self) -> str:
        """The run being executed."""
        return self._state.run.run_id

    @property
    def tenant(self) -> str:
        """The run's tenant."""
        return self._state.run.tenant

    @property
    def input(self) -> dict[str, Any]:
        """The run's recorded input."""
        return dict(self._state.run.input)

    def _call(
        self,
        step_id: str,
        tool: Tool[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        operation_id: str | None,
        key_target: str | None,
        observe: str | None,
    ) -> StepCall:
        return StepCall(
            self._port,
            self._state,
            step_id,
            tool,
            args,
            kwargs,
            operation_id=operation_id,
            target=key_target,
            observe=observe,
        )


class Context(_Base):
    """The context of a sync workflow: ``ctx.call`` returns the step's value."""

    # The signatures mypy checks a call against (docs/typing.md): an async tool's (the runtime
    # awaits it, so the step's value is the coroutine's), then a sync tool's; each without and with
    # the call's options. A ParamSpec takes no keyword-only parameter beside it, so the options
    # are written before ``*args`` there: give a tool's arguments by keyword with an option.
    @overload
    def call(
        self,
        step_id: str,
        tool: Tool[P, Coroutine[Any, Any, R]],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R: ...

    @overload
    def call(self, step_id: str, tool: Tool[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R: ...

    @overload
    def call(
        self,
        step_id: str,
        tool: Tool[P, Coroutine[Any, Any, R]],
        /,
        operation_id: str | None = None,
        key_target: str | None = None,
        observe: str | None = None,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R: ...

    @overload
    def call(
        self,
        step_id: str,
        tool: Tool[P, R],
        /,
        operation_id: str | None = None,
        key_target: str | None = None,
        observe: str | None = None,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R: ...

    def call(  # type: ignore[misc]  # the options are keyword-only here, which no overload can say
        self,
        step_id: str,
        tool: Tool[..., Any],
        /,
        *args: Any,
        operation_id: str | None = None,
        key_target: str | None = None,
        observe: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run one step through its contract and return its (recorded) result.

        Typed from the tool (docs/typing.md): mypy checks the arguments against the decorated
        function's signature and types the call with the function's result. What the runtime
        passes (``idempotency_key``, ``deadline``, ``tx``) is part of that signature too, and no
        annotation can take a keyword-only parameter out of it: a tool called in typed code
        declares them with a default (``*, idempotency_key: str = ""``), which the runtime always
        overrides. A ``Tool[..., Any]`` (a registry's, a YAML contract's) takes any arguments and
        returns ``Any``.

        Args:
            step_id: stable id of the step within the workflow.
            tool: a tool declared with ``@ef.tool``.
            operation_id: the logical operation (``op_case_92_email``); defaults to run + step.
            key_target: the resource the call acts on, part of the key (defaults to the value of
                the argument the contract names as ``target``).
            observe: the read step this write's ``precondition=ef.Expect(...)`` came from; on a
                conflict the run re-runs it and tries again with the new observation.
        """
        call = self._call(step_id, tool, args, kwargs, operation_id, key_target, observe)
        return driver.drive(
            self._port,
            self._state,
            telemetry.step(call.run_id, call.step_id, call.tool.ref, step_machine.run(call)),
        )


class AsyncContext(_Base):
    """The context of an ``async def`` workflow: ``await ctx.call(...)``."""

    # As Context.call's: async tool, sync tool, each without and with the options.
    @overload
    async def call(
        self,
        step_id: str,
        tool: Tool[P, Coroutine[Any, Any, R]],
        /,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R: ...

    @overload
    async def call(
        self, step_id: str, tool: Tool[P, R], /, *args: P.args, **kwargs: P.kwargs
    ) -> R: ...

    @overload
    async def call(
        self,
        step_id: str,
        tool: Tool[P, Coroutine[Any, Any, R]],
        /,
        operation_id: str | None = None,
        key_target: str | None = None,
        observe: str | None = None,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R: ...

    @overload
    async def call(
        self,
        step_id: str,
        tool: Tool[P, R],
        /,
        operation_id: str | None = None,
        key_target: str | None = None,
        observe: str | None = None,
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> R: ...

    async def call(  # type: ignore[misc]  # as Context.call: options keyword-only at run time
        self,
        step_id: str,
        tool: Tool[..., Any],
        /,
        *args: Any,
        operation_id: str | None = None,
        key_target: str | None = None,
        observe: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """The async twin of ``Context.call``, typed the same way (``await`` gives the result)."""
        call = self._call(step_id, tool, args, kwargs, operation_id, key_target, observe)
        return await driver.drive_async(
            self._port,
            self._state,
            telemetry.step(call.run_id, call.step_id, call.tool.ref, step_machine.run(call)),
        )
