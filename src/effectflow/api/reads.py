"""The API's reads: health and readiness, this document, runs, a run's timeline, effects, the
attention queue.

Each read runs in Starlette's thread pool, through the tenant's runtime (another tenant's run is
not found).
"""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from effectflow import errors
from effectflow.api import endpoints, openapi, pagination, problems
from effectflow.ledger import records


@endpoints.endpoint
async def health(request: Request) -> Response:
    """Liveness: no auth, no ledger access."""
    import effectflow

    return endpoints.json_response({"status": "ok", "version": effectflow.__version__})


#: Seconds readiness waits for the ledger's answer (a probe's own timeout is usually a few more).
READY_TIMEOUT = 2.0


@endpoints.endpoint
async def ready(request: Request) -> Response:
    """Readiness: no auth; 200 when the ledger answers within ``READY_TIMEOUT`` at the schema
    version this server writes, else 503 saying which (never where the ledger is: no auth)."""
    import anyio

    from effectflow.ledger import versions

    db_url = request.app.state.runtimes.db_url
    try:
        with anyio.fail_after(READY_TIMEOUT):
            found = await anyio.to_thread.run_sync(versions.status, db_url, abandon_on_cancel=True)
    except TimeoutError:
        raise problems.Problem(
            503, "ledger_unavailable", f"the ledger did not answer within {READY_TIMEOUT:g} s"
        ) from None
    except errors.EffectflowError:
        raise problems.Problem(503, "ledger_unavailable", "the ledger cannot be read") from None
    if found.current != found.newest:
        detail = (
            "there is no effectflow ledger there yet (effectflow migrate creates it)"
            if found.current is None
            else f"the ledger is at schema version {found.current}; this server writes "
            f"{found.newest} ({'upgrade this server' if found.newer else 'migrate the ledger'})"
        )
        raise problems.Problem(503, "schema_mismatch", detail)
    return endpoints.json_response({"status": "ok", "schema_version": found.current})


@endpoints.endpoint
async def openapi_document(request: Request) -> Response:
    """The OpenAPI document."""
    return endpoints.json_response(request.app.state.openapi)


@endpoints.endpoint
async def list_runs(request: Request) -> Response:
    """A page of runs, newest first."""
    rt = endpoints.request_runtime(request)
    statuses = endpoints.statuses_param(request, records.RunStatus)
    limit = endpoints.limit_param(request)
    cursor = request.query_params.get("cursor")
    host = {name: endpoints.text_param(request, name) for name in ("scope", "call_id")}

    def read() -> tuple[list[dict[str, Any]], str | None]:
        page, after = pagination.runs_page(rt.store, rt.tenant, statuses, limit, cursor, **host)
        return [rt.run_view(r).to_dict() for r in page], after

    items, after = await run_in_threadpool(read)
    return endpoints.json_response({"items": items, "next_cursor": after})


@endpoints.endpoint
async def get_run(request: Request) -> Response:
    """One run."""
    rt = endpoints.request_runtime(request)
    view = await run_in_threadpool(lambda: rt.run_view(rt.run(request.path_params["run_id"])))
    return endpoints.json_response(view.to_dict())


@endpoints.endpoint
async def get_timeline(request: Request) -> Response:
    """A run's timeline."""
    rt = endpoints.request_runtime(request)

    def read() -> dict[str, Any]:
        timeline = rt.timeline(request.path_params["run_id"])
        return {**timeline.to_dict(), "run": rt.run_view(timeline.run).to_dict()}

    return endpoints.json_response(await run_in_threadpool(read))


@endpoints.endpoint
async def list_effects(request: Request) -> Response:
    """A page of effects, oldest first."""
    rt = endpoints.request_runtime(request)
    statuses = endpoints.statuses_param(request, records.StepStatus)
    limit = endpoints.limit_param(request)
    run_id = request.query_params.get("run_id")
    cursor = request.query_params.get("cursor")

    def read() -> tuple[list[records.EffectRecord], str | None]:
        if run_id is not None:
            rt.run(run_id)  # another tenant's run is not found
        return pagination.effects_page(rt.store, rt.tenant, run_id, statuses, limit, cursor)

    page, after = await run_in_threadpool(read)
    return endpoints.json_response({"items": [e.to_dict() for e in page], "next_cursor": after})


@endpoints.endpoint
async def list_attention(request: Request) -> Response:
    """The attention queue."""
    rt = endpoints.request_runtime(request)
    limit = endpoints.limit_param(request, default=openapi.MAX_LIMIT)
    items = await run_in_threadpool(lambda: rt.attention(limit=limit))
    return endpoints.json_response({"items": [i.to_dict() for i in items]})
