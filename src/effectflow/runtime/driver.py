"""The drivers of the step machine: they do what it asks (commit, call a tool, wait, sleep).

A step machine is a generator of ``machine_io`` requests; the same one runs under the blocking driver
(``drive``, for sync workflows and for the settling paths) and the asyncio one (``drive_async``).
Each answers one request at a time (``_answer`` / ``_answer_async``); only how they wait differs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import time
from typing import Any

from effectflow import errors
from effectflow.ledger.local import LocalTransaction
from effectflow.runtime import machine_io
from effectflow.runtime import state as state_mod
from effectflow.runtime.port import Port


def drive(port: Port, state: state_mod.RunState, gen: machine_io.Machine) -> Any:
    """Run a step machine to its value, doing its requests with blocking I/O."""
    answer: Any = None
    try:
        while True:
            try:
                request = gen.send(answer)
            except StopIteration as stop:
                return stop.value
            answer = _answer(port, state, request)
    except BaseException:
        # The thread leaves with an error (a crash right after a commit, a refused batch): no
        # turn of group commit waits for its next commit.
        port.writer.away()
        raise


async def drive_async(port: Port, state: state_mod.RunState, gen: machine_io.Machine) -> Any:
    """Run a step machine to its value on the event loop."""
    answer: Any = None
    while True:
        try:
            request = gen.send(answer)
        except StopIteration as stop:
            return stop.value
        answer = await _answer_async(port, state, request)


def _answer(port: Port, state: state_mod.RunState, request: machine_io.Request) -> Any:
    if isinstance(request, machine_io.Commit):
        port.writer.commit(state, request.batch)
        return None
    port.writer.away()  # a call or a wait: group commit's turns go on without this thread
    if isinstance(request, machine_io.Invoke):
        return call_sync(request)
    if isinstance(request, machine_io.AwaitCall):
        return _ended(request.handle, request.seconds)
    if isinstance(request, machine_io.InTransaction):
        return _in_transaction(port, state, request)
    time.sleep(request.seconds)
    return None


async def _answer_async(port: Port, state: state_mod.RunState, request: machine_io.Request) -> Any:
    if isinstance(request, machine_io.Commit):
        await port.writer.commit_async(state, request.batch)
        return None
    if isinstance(request, machine_io.Invoke):
        return await _call_async(request)
    if isinstance(request, machine_io.AwaitCall):
        return await _ended_async(request.handle, request.seconds)
    if isinstance(request, machine_io.InTransaction):
        # The ledger's transaction is synchronous; the tool runs inside it on this thread.
        return _in_transaction(port, state, request)
    await asyncio.sleep(request.seconds)
    return None


def call_sync(request: machine_io.Invoke) -> machine_io.Result:
    """Call the tool, waiting at most its timeout. A call still running then is left running (it
    may still land at the provider) and handed back as ``Result.pending``, never abandoned."""
    tool, args, kwargs, timeout = request.tool, request.args, request.kwargs, request.timeout
    try:
        if timeout is None:
            if tool.is_async:
                return machine_io.Result(asyncio.run(tool.fn(*args, **kwargs)))
            return machine_io.Result(tool.fn(*args, **kwargs))
    except Exception as exc:
        return machine_io.Result(error=exc)
    # An async tool runs to its end on a loop of its own in the thread: cancelling it at the
    # timeout would not unsend a request already on the wire, only lose its answer.
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=tool.name)
    try:
        # The call sees the caller's context variables (its trace context), as asyncio.to_thread.
        run_here = contextvars.copy_context().run
        if tool.is_async:
            future = pool.submit(run_here, asyncio.run, tool.fn(*args, **kwargs))
        else:
            future = pool.submit(run_here, tool.fn, *args, **kwargs)
        return _ended(future, timeout) or _timed_out(request, future)
    finally:
        pool.shutdown(wait=False)


async def _call_async(request: machine_io.Invoke) -> machine_io.Result:
    """``call_sync`` on the event loop: a call still running at its timeout keeps running as a
    task (or in its thread) and is handed back as ``Result.pending``."""
    tool = request.tool
    try:
        if tool.is_async:
            coro = tool.fn(*request.args, **request.kwargs)
        elif request.timeout is None:
            return machine_io.Result(tool.fn(*request.args, **request.kwargs))
        else:
            coro = asyncio.to_thread(tool.fn, *request.args, **request.kwargs)
        if request.timeout is None:
            return machine_io.Result(await coro)
    except Exception as exc:
        return machine_io.Result(error=exc)
    task = asyncio.ensure_future(coro)
    return await _ended_async(task, request.timeout) or _timed_out(request, task)


def _timed_out(request: machine_io.Invoke, handle: Any) -> machine_io.Result:
    return machine_io.Result(
        error=TimeoutError(f"{request.tool.ref} did not answer within {request.timeout} s"),
        pending=handle,
    )


def _ended(future: concurrent.futures.Future[Any], timeout: float) -> machine_io.Result | None:
    """The call's result once it ended within ``timeout``; None while it still runs."""
    done, _ = concurrent.futures.wait([future], timeout=max(0.0, timeout))
    return _result_of(future) if done else None


async def _ended_async(handle: Any, timeout: float) -> machine_io.Result | None:
    """The call's result once it ended within ``timeout``; None while it still runs."""
    future = (
        asyncio.wrap_future(handle) if isinstance(handle, concurrent.futures.Future) else handle
    )
    done, _ = await asyncio.wait({future}, timeout=max(0.0, timeout))
    return _result_of(future) if done else None


def _result_of(future: Any) -> machine_io.Result:
    """The result of a call that ended (a ``concurrent.futures`` or an ``asyncio`` future)."""
    exc = future.exception()
    if exc is not None:
        if not isinstance(exc, Exception):  # pragma: no cover - a BaseException in a tool thread
            raise exc
        return machine_io.Result(error=exc)
    return machine_io.Result(future.result())


def _in_transaction(
    port: Port, state: state_mod.RunState, request: machine_io.InTransaction
) -> machine_io.Result:
    """The tool's writes and ``request.finish``'s checkpoint commit together, or neither does."""

    def work(tx: LocalTransaction) -> Any:
        return request.tool.fn(*request.args, **request.kwargs, tx=tx)

    try:
        value = port.writer.commit_with(state, work, request.finish)
    except errors.LeaseLost:
        raise
    except Exception as exc:
        return machine_io.Result(error=exc)
    return machine_io.Result(value)
