"""The feeder's half that moves batches through OpenAI's status machine:

    validating -> in_progress -> finalizing -> completed
                      |-> (window over) finalizing -> expired    (what completed is kept)
                      |-> cancelling -> finalizing -> cancelled  (what completed is kept)
    any of them -> failed  (the input cannot be read, the store cannot take the results)

A finalizing batch records its `outcome` first, so a server killed while it writes the files
ends the same batch the same way after its restart.
"""

from __future__ import annotations

import asyncio
import json
import logging

from tierserve.batch import jobs as J
from tierserve.batch.objects import errors_list

log = logging.getLogger("tierserve.batch")


class BatchLifecycle:
    async def _set(self, job: J.Job, when, **values) -> bool:
        changed = await self.svc.db(self.svc.store.update_batch, job.id, when, **values)
        if changed:
            job.row.update(values)
        return changed

    async def _advance(self, job: J.Job, now: float) -> None:
        if job.busy or not job.loaded:
            return
        status = job.status
        if status == "in_progress" and now >= job.row["expires_at"]:
            job.cancel.set()  # in-flight lines end as "client disconnected"
            if job.idle:
                await self._finalize(job, "expired")
        elif status == "cancelling":
            job.cancel.set()
            if job.idle:
                await self._finalize(job, "cancelled")
        elif status == "in_progress" and not job.pending and job.idle:
            await self._finalize(job, "completed")
        elif status == "finalizing" and job.idle:
            await self._finalize(job, job.row["outcome"] or "completed")

    async def _finalize(self, job: J.Job, outcome: str) -> None:
        job.busy = True
        try:
            if outcome in J.UNFINISHED and job.pending:
                await self.svc.db(J.record_unfinished, self.svc.store, job, outcome)
            now = self.now()
            if job.status != "finalizing":
                when = ("in_progress", "cancelling")
                if not await self._set(
                    job, when, status="finalizing", finalizing_at=now, outcome=outcome
                ):
                    return  # changed under us (a cancel): the next sync sees it
            files = await self.svc.db(J.write_outputs, self.svc.store, self.svc.bodies, job.row)
            stamp = {"completed": "completed_at", "expired": "expired_at"}.get(
                outcome, "cancelled_at"
            )
            await self._set(job, ("finalizing",), status=outcome, **{stamp: self.now()}, **files)
            self.svc.metrics.batches.labels(outcome).inc()
            self.jobs.pop(job.id, None)
            log.info("batch %s %s", job.id, outcome)
        except Exception as exc:
            await self.fail(job, f"cannot finalize the batch: {exc}")
        finally:
            job.busy = False

    async def fail(self, job: J.Job, reason: str) -> None:
        """The batch ends `failed` with `reason`; if even that cannot be written (a read-only
        database), the server remembers it and shows the batch failed until it restarts."""
        if self.jobs.get(job.id) is not job:
            return  # failed already (its late answers found the store broken too)
        log.error("batch %s failed: %s", job.id, reason)
        job.cancel.set()
        self.jobs.pop(job.id, None)
        self.svc.metrics.batches.labels("failed").inc()
        errors = json.dumps(errors_list("batch_failed", reason))
        self.svc.failed[job.id] = reason
        try:
            await self.svc.db(
                self.svc.store.update_batch,
                job.id,
                None,
                status="failed",
                failed_at=self.now(),
                errors=errors,
            )
            del self.svc.failed[job.id]
        except Exception as exc:
            log.error("batch %s: cannot record its failure either: %r", job.id, exc)

    async def _mark_risk(self, now: float) -> None:
        """Flag (status field `at_risk`, gauge) batches projected to end after their window."""
        at_risk = 0
        for job in list(self.jobs.values()):
            if job.status != "in_progress" or not job.loaded:
                continue
            end = job.projected_end(now)
            risk = end is not None and end > job.row["expires_at"]
            at_risk += risk
            if risk != bool(job.row["at_risk"]):
                try:
                    await self._set(job, None, at_risk=risk)
                except Exception as exc:
                    log.warning("batch %s: cannot record at_risk: %r", job.id, exc)
        self.svc.metrics.at_risk.set(at_risk)

    async def _drop_all(self) -> None:
        """Stop working on every batch (lease lost, shutting down): in-flight lines are aborted
        in the engine; unwritten answers are written first. Nothing is marked done that was not
        answered: the next feeder runs the rest."""
        for job in self.jobs.values():
            job.cancel.set()
        tasks = [t for j in self.jobs.values() for t in j.in_flight.values()]
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)
        await self._flush()
        self.jobs.clear()

    async def _let_go(self) -> None:
        await self._drop_all()
        if self.holding:
            try:
                await self.svc.db(self.svc.store.release_lease, self.owner)
            except Exception as exc:
                log.warning("batch feeder: cannot release its lease: %r", exc)
            self.holding = False
