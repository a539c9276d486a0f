"""The Batch API's routes: `/v1/files` and `/v1/batches`, OpenAI's shapes and errors. Each
tenant sees, cancels and deletes only its own files and batches (another tenant's id is a 404,
as an unknown one)."""

from __future__ import annotations

import logging
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, FastAPI, Query
from fastapi import Request as HTTPRequest
from fastapi.responses import FileResponse
from pydantic import BaseModel, Field
from starlette.datastructures import UploadFile

from tierserve.api.auth import authenticated, request_tenant
from tierserve.api.errors import APIError
from tierserve.api.protocol import BODY
from tierserve.batch import objects as O
from tierserve.batch.config import BatchConfig
from tierserve.batch.service import BatchService
from tierserve.host.paths import cache_dir

log = logging.getLogger("tierserve.batch")

router = APIRouter(dependencies=[Depends(authenticated)])
FORM_FIELDS = {"file", "purpose"}
_Key = Annotated[str, Field(max_length=64)]
_Value = Annotated[str, Field(max_length=512)]


class BatchCreate(BaseModel):
    model_config = BODY

    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: Annotated[dict[_Key, _Value], Field(max_length=16)] | None = None
    output_expires_after: None = Field(
        None, description="not supported yet: output files are kept until deleted"
    )


def _svc(http: HTTPRequest) -> BatchService:
    return http.app.state.batch


def _tenant(http: HTTPRequest):
    return request_tenant(http.app.state.tierserve, http)


@router.post("/v1/files")
async def upload_file(http: HTTPRequest):
    form = await http.form(max_files=1, max_fields=8)
    try:
        unknown = sorted(set(form) - FORM_FIELDS)
        if unknown:
            raise APIError(
                400,
                f"unknown form field {unknown[0]!r} (expected file and purpose)",
                param=unknown[0],
            )
        upload, purpose = form.get("file"), form.get("purpose")
        if not isinstance(upload, UploadFile):
            raise APIError(400, "missing the file (a multipart field named 'file')", param="file")
        if not isinstance(purpose, str):
            raise APIError(400, "missing required field 'purpose'", param="purpose")
        name = upload.filename or "upload.jsonl"
        return await _svc(http).upload(_tenant(http), name, purpose, upload.file)
    finally:
        await form.close()


@router.get("/v1/files")
async def list_files(
    http: HTTPRequest,
    purpose: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    after: str | None = None,
    order: Literal["asc", "desc"] = "desc",
):
    svc = _svc(http)
    rows = await svc.db(
        svc.store.list_files, _tenant(http).name, purpose, after, limit + 1, order == "desc"
    )
    return O.page([O.file_object(r) for r in rows[:limit]], len(rows) > limit)


@router.get("/v1/files/{file_id}")
async def retrieve_file(file_id: str, http: HTTPRequest):
    return O.file_object(await _svc(http).file_row(_tenant(http), file_id))


@router.get("/v1/files/{file_id}/content")
async def file_content(file_id: str, http: HTTPRequest):
    svc = _svc(http)
    row = await svc.file_row(_tenant(http), file_id)
    return FileResponse(svc.bodies.path(row["path"]), media_type="application/jsonl")


@router.delete("/v1/files/{file_id}")
async def delete_file(file_id: str, http: HTTPRequest):
    return await _svc(http).delete_file(_tenant(http), file_id)


@router.post("/v1/batches")
async def create_batch(body: BatchCreate, http: HTTPRequest):
    return await _svc(http).create(_tenant(http), body)


@router.get("/v1/batches")
async def list_batches(
    http: HTTPRequest,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: str | None = None,
):
    return await _svc(http).list(_tenant(http), after, limit)


@router.get("/v1/batches/{batch_id}")
async def retrieve_batch(batch_id: str, http: HTTPRequest):
    return await _svc(http).batch(_tenant(http), batch_id)


@router.post("/v1/batches/{batch_id}/cancel")
async def cancel_batch(batch_id: str, http: HTTPRequest):
    return await _svc(http).cancel(_tenant(http), batch_id)


def batch_config(settings) -> BatchConfig | None:
    """The Batch API's settings from the server's (None: the Batch API is off)."""
    if not getattr(settings, "batch_db", None):
        return None
    window = settings.batch_window
    kw = {"max_in_flight": window, "max_in_flight_per_batch": window} if window else {}
    return BatchConfig(
        db_url=settings.batch_db,
        files_dir=settings.files_dir or str(cache_dir() / "batch" / "files"),
        max_line_bytes=settings.max_request_bytes,
        **kw,
    )


def mount_batch(app: FastAPI, state) -> BatchService | None:
    """Add the Batch API to `app` when the settings name a database; the service (whose
    feeder the app's lifespan starts and stops) is kept as `app.state.batch`. A database that
    cannot be opened (not SQLite, unreadable, a bad URL) does not stop the server: one log line,
    chat and completions serve, and the Batch API answers 503 `batch_unavailable` naming the
    database; the file is left as it is."""
    cfg = batch_config(state.settings)
    if cfg is None:
        return None
    try:
        svc = BatchService(state, cfg)
    except Exception as exc:  # SQLAlchemy's errors, OSError, ...: the reason, in one line
        reason = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
        why = (
            f"the Batch API is unavailable: its database {cfg.db_url} could not be opened "
            f"({reason}); fix or move the file, or start with --batch-db PATH (off: no Batch API)"
        )
        log.error("%s", why)
        app.include_router(_unavailable_router(why))
        return None
    app.state.batch = svc
    app.include_router(router)
    return svc


def _unavailable_router(why: str) -> APIRouter:
    """Every Batch API path, answered 503 `batch_unavailable` with `why`."""
    down = APIRouter(dependencies=[Depends(authenticated)])

    async def unavailable() -> None:
        raise APIError(503, why, "server_error", code="batch_unavailable")

    for path in ("/v1/files", "/v1/files/{file_id}", "/v1/files/{file_id}/content"):
        down.add_api_route(path, unavailable, methods=["GET", "POST", "DELETE"])
    for path in ("/v1/batches", "/v1/batches/{batch_id}", "/v1/batches/{batch_id}/cancel"):
        down.add_api_route(path, unavailable, methods=["GET", "POST"])
    return down
