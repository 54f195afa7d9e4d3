"""What a workflow receives as ``ctx``: the sync and async drivers of the step machine."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from typing import Any

from effectflow import errors
from effectflow.contracts.tool import Tool
from effectflow.ledger.local import LocalTransaction
from effectflow.runtime import engine, requests
from effectflow.runtime import state as state_mod


class _Base:
    def __init__(self, state: state_mod.RunState) -> None:
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


def _call_sync(
    tool: Tool[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], timeout: float | None
) -> Any:
    if tool.is_async:
        coro = tool.fn(*args, **kwargs)
        if timeout is not None:
            coro = asyncio.wait_for(coro, timeout)
        return asyncio.run(coro)
    if timeout is None:
        return tool.fn(*args, **kwargs)
    # The call keeps running in its thread after the timeout: exactly why its outcome is unknown.
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=tool.name)
    try:
        future = pool.submit(tool.fn, *args, **kwargs)
        try:
            return future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"{tool.ref} did not answer within {timeout} s") from None
    finally:
        pool.shutdown(wait=False)


def drive(state: state_mod.RunState, gen: requests.Machine) -> Any:
    """Run a step machine to its value, doing its requests with blocking I/O."""
    answer: Any = None
    while True:
        try:
            request = gen.send(answer)
        except StopIteration as stop:
            return stop.value
        answer = None
        if isinstance(request, requests.Commit):
            state.runtime.commit(state, request.batch)
        elif isinstance(request, requests.Invoke):
            try:
                answer = requests.Result(
                    _call_sync(request.tool, request.args, request.kwargs, request.timeout)
                )
            except Exception as exc:
                answer = requests.Result(error=exc)
        elif isinstance(request, requests.InTransaction):
            answer = _in_transaction(state, request)
        else:
            time.sleep(request.seconds)


def _in_transaction(state: state_mod.RunState, request: requests.InTransaction) -> requests.Result:
    """The tool's writes and ``request.finish``'s checkpoint commit together, or neither does."""

    def work(tx: LocalTransaction) -> Any:
        return request.tool.fn(*request.args, **request.kwargs, tx=tx)

    try:
        value = state.runtime.commit_with(state, work, request.finish)
    except errors.LeaseLost:
        raise
    except Exception as exc:
        return requests.Result(error=exc)
    return requests.Result(value)


class Context(_Base):
    """The context of a sync workflow: ``ctx.call`` returns the step's value."""

    def call(
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

        Args:
            step_id: stable id of the step within the workflow.
            tool: a tool declared with ``@ef.tool``.
            operation_id: the logical operation (``op_case_92_email``); defaults to run + step.
            key_target: the resource the call acts on, part of the key (defaults to the value of
                the argument the contract names as ``target``).
            observe: the read step this write's ``precondition=ef.Expect(...)`` came from; on a
                conflict the run re-runs it and tries again with the new observation.
        """
        machine = engine.StepMachine(
            self._state,
            step_id,
            tool,
            args,
            kwargs,
            operation_id=operation_id,
            target=key_target,
            observe=observe,
        )
        return drive(self._state, machine.run())


class AsyncContext(_Base):
    """The context of an ``async def`` workflow: ``await ctx.call(...)``."""

    async def call(
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
        """The async twin of ``Context.call``."""
        machine = engine.StepMachine(
            self._state,
            step_id,
            tool,
            args,
            kwargs,
            operation_id=operation_id,
            target=key_target,
            observe=observe,
        )
        gen = machine.run()
        answer: Any = None
        while True:
            try:
                request = gen.send(answer)
            except StopIteration as stop:
                return stop.value
            answer = None
            if isinstance(request, requests.Commit):
                await self._state.runtime.commit_async(self._state, request.batch)
            elif isinstance(request, requests.Invoke):
                try:
                    answer = requests.Result(await _call_async(request))
                except Exception as exc:
                    answer = requests.Result(error=exc)
            elif isinstance(request, requests.InTransaction):
                # The ledger's transaction is synchronous; the tool runs inside it on this thread.
                answer = _in_transaction(self._state, request)
            else:
                await asyncio.sleep(request.seconds)


async def _call_async(request: requests.Invoke) -> Any:
    tool = request.tool
    if tool.is_async:
        coro = tool.fn(*request.args, **request.kwargs)
    elif request.timeout is None:
        return tool.fn(*request.args, **request.kwargs)
    else:
        coro = asyncio.to_thread(tool.fn, *request.args, **request.kwargs)
    if request.timeout is None:
        return await coro
    try:
        return await asyncio.wait_for(coro, request.timeout)
    except TimeoutError:
        raise TimeoutError(f"{tool.ref} did not answer within {request.timeout} s") from None
