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


def _call_sync(request: requests.Invoke) -> requests.Result:
    """Call the tool, waiting at most its timeout. A call still running then is left running (it
    may still land at the provider) and handed back as ``Result.pending``, never abandoned."""
    tool, args, kwargs, timeout = request.tool, request.args, request.kwargs, request.timeout
    try:
        if timeout is None:
            if tool.is_async:
                return requests.Result(asyncio.run(tool.fn(*args, **kwargs)))
            return requests.Result(tool.fn(*args, **kwargs))
    except Exception as exc:
        return requests.Result(error=exc)
    # An async tool runs to its end on a loop of its own in the thread: cancelling it at the
    # timeout would not unsend a request already on the wire, only lose its answer.
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=tool.name)
    try:
        if tool.is_async:
            future = pool.submit(asyncio.run, tool.fn(*args, **kwargs))
        else:
            future = pool.submit(tool.fn, *args, **kwargs)
        return _ended(future, timeout) or requests.Result(
            error=TimeoutError(f"{tool.ref} did not answer within {timeout} s"), pending=future
        )
    finally:
        pool.shutdown(wait=False)


def _ended(future: concurrent.futures.Future[Any], timeout: float) -> requests.Result | None:
    """The call's result once it ended within ``timeout``; None while it still runs."""
    done, _ = concurrent.futures.wait([future], timeout=max(0.0, timeout))
    if not done:
        return None
    exc = future.exception()
    if exc is not None:
        if not isinstance(exc, Exception):  # pragma: no cover - a BaseException in a tool thread
            raise exc
        return requests.Result(error=exc)
    return requests.Result(future.result())


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
            answer = _call_sync(request)
        elif isinstance(request, requests.AwaitCall):
            answer = _ended(request.handle, request.seconds)
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
                answer = await _call_async(request)
            elif isinstance(request, requests.AwaitCall):
                answer = await _ended_async(request.handle, request.seconds)
            elif isinstance(request, requests.InTransaction):
                # The ledger's transaction is synchronous; the tool runs inside it on this thread.
                answer = _in_transaction(self._state, request)
            else:
                await asyncio.sleep(request.seconds)


async def _call_async(request: requests.Invoke) -> requests.Result:
    """``_call_sync`` on the event loop: a call still running at its timeout keeps running as a
    task (or in its thread) and is handed back as ``Result.pending``."""
    tool = request.tool
    try:
        if tool.is_async:
            coro = tool.fn(*request.args, **request.kwargs)
        elif request.timeout is None:
            return requests.Result(tool.fn(*request.args, **request.kwargs))
        else:
            coro = asyncio.to_thread(tool.fn, *request.args, **request.kwargs)
        if request.timeout is None:
            return requests.Result(await coro)
    except Exception as exc:
        return requests.Result(error=exc)
    task = asyncio.ensure_future(coro)
    return await _ended_async(task, request.timeout) or requests.Result(
        error=TimeoutError(f"{tool.ref} did not answer within {request.timeout} s"), pending=task
    )


async def _ended_async(handle: Any, timeout: float) -> requests.Result | None:
    """The call's result once it ended within ``timeout``; None while it still runs."""
    future = (
        asyncio.wrap_future(handle) if isinstance(handle, concurrent.futures.Future) else handle
    )
    done, _ = await asyncio.wait({future}, timeout=max(0.0, timeout))
    if not done:
        return None
    exc = future.exception()
    if exc is not None:
        if not isinstance(exc, Exception):  # pragma: no cover - cancelled from outside
            raise exc
        return requests.Result(error=exc)
    return requests.Result(future.result())
