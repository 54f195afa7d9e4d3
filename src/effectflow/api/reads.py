"""The API's reads: health, this document, runs, a run's timeline, effects, the attention queue.

Each read runs in Starlette's thread pool, through the tenant's runtime (another tenant's run is
not found).
"""

from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from effectflow.api import endpoints, openapi, pagination
from effectflow.ledger import records


@endpoints.endpoint
async def health(request: Request) -> Response:
    """Liveness: no auth, no ledger access."""
    import effectflow

    return endpoints.json_response({"status": "ok", "version": effectflow.__version__})


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
