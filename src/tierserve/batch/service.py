"""BatchService: what the routes call, and the feeder's home. Database and file work runs on
one worker thread (`db`), never on the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import BinaryIO

from tierserve.admission import AdmissionController
from tierserve.api.errors import APIError
from tierserve.api.state import ServerState
from tierserve.api.tenancy import Tenant
from tierserve.batch import objects as O
from tierserve.batch.config import ENDPOINTS, BatchConfig, TenantBatchLimits, parse_window
from tierserve.batch.feeder import Feeder
from tierserve.batch.files import FileBodies, FileFormatError, FileTooLarge, check_batch_input
from tierserve.batch.jobs import estimate_tokens
from tierserve.batch.metrics import BatchMetrics
from tierserve.batch.store import BatchStore, db_url
from tierserve.priority import Priority, parse_priority

log = logging.getLogger("tierserve.batch")
BATCH_TIERS = (Priority.P2, Priority.P3)


def feeder_state(state: ServerState) -> ServerState:
    """The server's state with an admission controller of the feeder's own: the same limits
    and the same queue view, but token buckets of its own, so batch lines never spend the
    interactive clients' budget (nor they the batch's)."""
    adm = state.admission
    own = AdmissionController(adm.config, adm.queue, adm.clock, adm.priorities)
    for t in state.tenants.tenants.values():
        if t.bucket is not None:
            own.set_tenant_bucket(t.name, t.bucket)
    return replace(state, admission=own, batch_lines=True)


class BatchService:
    def __init__(self, state: ServerState, cfg: BatchConfig) -> None:
        self.state = state
        self.cfg = cfg
        self.store = BatchStore(db_url(cfg.db_url))
        self.bodies = FileBodies(cfg.files_dir)
        self.metrics = BatchMetrics(state.metrics.registry)
        self.feeder_state = feeder_state(state)
        self.failed: dict[str, str] = {}  # batch id -> why, when the store could not say it
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="tierserve-batch-db")
        self.feeder = Feeder(self, cfg)
        self.metrics.in_flight.set_function(self.feeder.in_flight)
        self._task: asyncio.Task | None = None

    @property
    def draining(self) -> bool:
        return self.state.draining

    async def db(self, fn, *args, **kw):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kw))

    @property
    def upload_limits(self) -> dict[str, int]:
        """A file upload may exceed the request body limit: up to the file limit, plus room
        for the multipart envelope."""
        return {"/v1/files": self.cfg.max_file_bytes + (1 << 20)}

    async def start(self) -> None:
        self._task = asyncio.create_task(self.feeder.run())

    async def stop(self) -> None:
        await self.feeder.stop()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, 10.0)
        self._pool.shutdown(wait=True)
        self.store.close()

    # -- files ---------------------------------------------------------------------------------
    def limits(self, tenant: Tenant) -> TenantBatchLimits:
        return getattr(tenant, "batch_limits", None) or self.cfg.limits

    async def upload(self, tenant: Tenant, filename: str, purpose: str, src: BinaryIO) -> dict:
        if purpose != "batch":
            raise APIError(400, f"purpose must be 'batch', got {purpose!r}", param="purpose")
        lim = self.limits(tenant)
        n_files, n_bytes = await self.db(self.store.file_usage, tenant.name)
        if n_files >= lim.max_files:
            raise APIError(
                429,
                f"file limit reached: {n_files} files (limit {lim.max_files}); delete some",
                "rate_limit_error",
                code="file_limit_exceeded",
            )
        file_id = O.new_id("file-")
        path = f"{file_id}.jsonl"
        room = min(self.cfg.max_file_bytes, lim.max_bytes - n_bytes)
        try:
            checked = await self.db(self._save_checked, path, src, room)
        except FileTooLarge:
            if room < self.cfg.max_file_bytes:
                raise APIError(
                    429,
                    f"storage limit reached: {n_bytes} of {lim.max_bytes} bytes "
                    "used; delete some files",
                    "rate_limit_error",
                    code="storage_limit_exceeded",
                ) from None
            raise APIError(
                413,
                f"the file is larger than {self.cfg.max_file_bytes} bytes",
                param="file",
                code="file_too_large",
            ) from None
        except FileFormatError as exc:
            raise APIError(
                400, f"invalid batch input file: {exc}", param="file", code="invalid_file"
            ) from None
        row = dict(
            id=file_id,
            tenant=tenant.name,
            filename=filename,
            purpose=purpose,
            bytes=checked.bytes,
            lines=checked.lines,
            created_at=time.time(),
            path=path,
        )
        await self.db(self.store.add_file, row)
        return O.file_object(row)

    def _save_checked(self, path: str, src: BinaryIO, limit: int):
        self.bodies.save_stream(path, src, limit)
        try:
            with self.bodies.open(path) as f:
                return check_batch_input(f, self.cfg.max_line_bytes, self.cfg.max_lines)
        except Exception:
            self.bodies.remove(path)
            raise

    async def file_row(self, tenant: Tenant, file_id: str) -> dict:
        row = await self.db(self.store.get_file, file_id, tenant.name)
        if row is None:
            raise APIError(404, f"no file {file_id!r}", param="file_id", code="file_not_found")
        return row

    async def delete_file(self, tenant: Tenant, file_id: str) -> dict:
        await self.file_row(tenant, file_id)
        busy = [
            b["id"]
            for b in await self.db(self.store.active_batches)
            if b["input_file_id"] == file_id
        ]
        if busy:
            raise APIError(
                400,
                f"file {file_id!r} is the input of batch {busy[0]}, which is "
                "not finished; cancel it first",
                param="file_id",
            )
        row = await self.db(self.store.delete_file, file_id, tenant.name)
        await self.db(self.bodies.remove, row["path"])
        return {"id": file_id, "object": "file", "deleted": True}

    # -- batches -------------------------------------------------------------------------------
    def _tier(self, tenant: Tenant, metadata: dict | None) -> Priority:
        asked = (metadata or {}).get("tier")
        if asked is None:
            tier = getattr(tenant, "batch_tier", None) or self.cfg.default_tier
        else:
            try:
                tier = parse_priority(asked)
            except ValueError:
                tier = None
            if tier not in BATCH_TIERS:
                raise APIError(
                    400,
                    f"metadata.tier must be batch or background, got {asked!r}",
                    param="metadata",
                )
        return max(tier, tenant.max_priority)

    async def create(self, tenant: Tenant, body) -> dict:
        if body.endpoint not in ENDPOINTS:
            raise APIError(
                400,
                f"endpoint {body.endpoint!r} is not supported for batches; "
                f"supported are {', '.join(ENDPOINTS)}",
                param="endpoint",
            )
        try:
            window_s = parse_window(body.completion_window)
        except ValueError as exc:
            raise APIError(400, str(exc), param="completion_window") from None
        tier = self._tier(tenant, body.metadata)
        f = await self.db(self.store.get_file, body.input_file_id, tenant.name)
        if f is None or f["purpose"] != "batch":
            raise APIError(
                404,
                f"no batch input file {body.input_file_id!r}",
                param="input_file_id",
                code="file_not_found",
            )
        est = await self.db(self._estimate, f, body.endpoint)
        lim = self.limits(tenant)
        queued = await self.db(self.store.queued_tokens, tenant.name)
        if queued + est > lim.max_queued_tokens:
            raise APIError(
                429,
                f"enqueued token limit reached: {queued} tokens queued in "
                f"unfinished batches, this one ~{est}, limit {lim.max_queued_tokens}",
                "rate_limit_error",
                code="token_limit_exceeded",
            )
        now = time.time()
        row = dict(
            id=O.new_id("batch_"),
            tenant=tenant.name,
            endpoint=body.endpoint,
            input_file_id=f["id"],
            completion_window=body.completion_window,
            status="validating",
            priority=int(tier),
            est_tokens=est,
            metadata=json.dumps(body.metadata) if body.metadata is not None else None,
            total=f["lines"],
            completed=0,
            failed=0,
            created_at=now,
            expires_at=now + window_s,
            at_risk=False,
        )
        await self.db(self.store.add_batch, row)
        self.feeder.poke()
        return O.batch_object(await self.db(self.store.get_batch, row["id"]))

    def _estimate(self, f: dict, endpoint: str) -> int:
        """The file's estimated tokens; a 400 naming the first line for another endpoint."""
        from tierserve.batch.files import iter_lines

        total = 0
        with self.bodies.open(f["path"]) as src:
            for x in iter_lines(src, self.cfg.max_line_bytes):
                if x.url != endpoint:
                    raise APIError(
                        400,
                        f"line {x.line} of {f['id']}: url {x.url!r} differs from "
                        f"the batch's endpoint {endpoint!r}",
                        param="input_file_id",
                    )
                total += estimate_tokens(
                    x.body, self.state.settings.default_max_tokens, self.state.max_model_len
                )
        return total

    async def batch(self, tenant: Tenant, batch_id: str) -> dict:
        row = await self.db(self.store.get_batch, batch_id, tenant.name)
        if row is None:
            raise APIError(404, f"no batch {batch_id!r}", param="batch_id", code="batch_not_found")
        return self._shown(row)

    def _shown(self, row: dict) -> dict:
        if row["id"] in self.failed and row["status"] not in ("completed", "failed"):
            reason = self.failed[row["id"]]
            row = {
                **row,
                "status": "failed",
                "errors": json.dumps(O.errors_list("batch_failed", reason)),
            }
        return O.batch_object(row)

    async def list(self, tenant: Tenant, after: str | None, limit: int) -> dict:
        rows = await self.db(self.store.list_batches, tenant.name, after, limit + 1)
        return O.page([self._shown(r) for r in rows[:limit]], len(rows) > limit)

    async def cancel(self, tenant: Tenant, batch_id: str) -> dict:
        row = await self.db(self.store.get_batch, batch_id, tenant.name)
        if row is None:
            raise APIError(404, f"no batch {batch_id!r}", param="batch_id", code="batch_not_found")
        if row["status"] in ("cancelling", "cancelled"):
            return self._shown(row)
        ok = await self.db(
            self.store.update_batch,
            batch_id,
            ("validating", "in_progress"),
            status="cancelling",
            cancelling_at=time.time(),
        )
        if not ok:
            row = await self.db(self.store.get_batch, batch_id, tenant.name)
            raise APIError(
                409,
                f"batch {batch_id} is {row['status']}: only a validating or "
                "in-progress batch can be cancelled",
                code="batch_not_cancellable",
            )
        self.feeder.poke()
        return await self.batch(tenant, batch_id)
