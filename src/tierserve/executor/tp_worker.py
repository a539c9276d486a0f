"""Tensor parallelism's processes: rank 0 is the engine's own process (scheduler, KV manager,
policies, sampling, and shard 0 of the model); ranks 1..N-1 are worker processes that hold their
shard and its part of the KV cache and run what rank 0 tells them.

The protocol, over one pipe per worker (a pickled message each, never a tensor):

* ``("step", SchedulerOutput, failed, drafts, hooked)``: one step, as rank 0 prepared it (the
  requests whose sampling state it refused, the drafts its drafter proposed). Each worker
  applies the same state changes (block tables, swaps) and runs its shard; inside the model
  the ranks meet at the all-reduces, and after sampling they take rank 0's tokens
  (`executor/parallel.py`). Every rank holds the scheduler's block ids, so preemption, swap,
  prefix caching and speculation need nothing more.
* with `hooked` (the engine's cut-in point is set), rank 0 sends ``("cont",)`` at every layer
  boundary once its hook has returned, after the messages of any step the hook ran (P0's
  cut-in): a worker at a boundary runs those steps, then goes on.
* ``("stop",)``: the worker leaves.

Faults: a worker that dies fails rank 0's next collective at once, one that hangs after
``$TIERSERVE_TP_TIMEOUT_S``; a watchdog thread sees a worker exit even while the engine idles.
Either way `TPDriverExecutor` raises `ExecutorLost`, which stops the engine: every stream ends
with an error, `/health` turns unhealthy and the server exits non-zero (server.py).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import socket
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

from tierserve.core.outputs import ExecutorOutput, SchedulerOutput
from tierserve.executor.base import ExecutorLost
from tierserve.executor.parallel import TPGroup
from tierserve.executor.torch_executor import TorchExecutor

log = logging.getLogger("tierserve.tp")


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs to build its shard and executor (the engine's choices, made once)."""

    args: object  # EngineArgs
    rank: int
    size: int
    port: int
    device: str
    num_blocks: int
    num_cpu_blocks: int
    threads: int | None
    log_level: int
    shm_path: str | None = None  # the CPU's shared-memory collectives (executor/shm_comm.py)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_device(device: str, rank: int) -> str:
    """Rank `rank`'s device: ``cuda:<rank>`` on CUDA, the CPU otherwise."""
    return f"cuda:{rank}" if str(device).startswith("cuda") else "cpu"


class TPWorkers:
    """Ranks 1..N-1: started, watched, stopped."""

    def __init__(self, specs: list[WorkerSpec]) -> None:
        ctx = mp.get_context("spawn")
        self.conns: list[Connection] = []
        self.procs = []
        for spec in specs:
            mine, theirs = ctx.Pipe()
            p = ctx.Process(
                target=worker_main, args=(spec, theirs), name=f"tierserve-tp{spec.rank}"
            )
            p.daemon = True
            p.start()
            theirs.close()
            self.conns.append(mine)
            self.procs.append(p)
        self.lost: str | None = None
        self._stopping = False

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def connect(self, group: TPGroup, port: int) -> None:
        """Rank 0 joins the group (which waits for every worker to join), watching the workers:
        one that dies first fails the start at once, not at the group's timeout."""
        box: list[BaseException] = []

        def join() -> None:
            try:
                group.connect(port)
            except BaseException as exc:  # raised on the caller's thread
                box.append(exc)

        t = threading.Thread(target=join, name="tierserve-tp-join", daemon=True)
        t.start()
        while t.is_alive():
            t.join(0.1)
            for rank, (conn, p) in enumerate(zip(self.conns, self.procs, strict=True), 1):
                if not p.is_alive():  # (a worker that fails says why, then exits)
                    raise ExecutorLost(self._why_not_started(rank, conn, p))
        if box:
            raise box[0]

    def _why_not_started(self, rank: int, conn: Connection, p) -> str:
        last = conn.recv() if conn.poll() else None
        if last is not None and last[0] == "error":
            return f"tensor-parallel worker {rank} could not start: {last[1]}"
        return f"tensor-parallel worker {rank} exited while starting (status {p.exitcode})"

    def wait_loaded(self) -> None:
        """Until every worker has built its shard; a worker's start-up error is raised here."""
        for rank, (conn, p) in enumerate(zip(self.conns, self.procs, strict=True), 1):
            wait([conn, p.sentinel])
            if not conn.poll():  # the process ended without a word
                raise ExecutorLost(self._why_not_started(rank, conn, p))
            kind, detail = conn.recv()
            if kind == "error":
                raise ExecutorLost(f"tensor-parallel worker {rank} could not start: {detail}")

    def watch(self, on_lost: Callable[[str], None]) -> None:
        """A thread that calls `on_lost(why)` when a worker process ends unasked."""

        def run() -> None:
            wait([p.sentinel for p in self.procs])
            why = None if self._stopping else self.gone()
            if why:
                self.lost = why
                log.error("%s: the engine stops", why)
                on_lost(why)

        threading.Thread(target=run, name="tierserve-tp-watch", daemon=True).start()

    def gone(self) -> str | None:
        """Why a worker is gone, looking at the processes now (None: all running)."""
        if self.lost:
            return self.lost
        for rank, p in enumerate(self.procs, 1):
            if not p.is_alive():
                return f"tensor-parallel worker {rank} (pid {p.pid}) exited ({p.exitcode})"
        return None

    def diagnose(self, exc: BaseException, wait_s: float = 1.0) -> str:
        """Why a step failed, in one line: a worker that exited (waiting `wait_s` for its end to
        be seen), else the error's first line (a hung worker: the collective timed out)."""
        if self.lost:
            return self.lost
        wait([p.sentinel for p in self.procs], timeout=wait_s)
        gone = self.gone()
        if gone:
            return gone
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
        return f"tensor-parallel step failed ({type(exc).__name__}: {first[:200]})"

    def send(self, msg: tuple) -> None:
        for rank, conn in enumerate(self.conns, 1):
            try:
                conn.send(msg)
            except OSError as exc:
                raise ExecutorLost(f"tensor-parallel worker {rank} is gone: {exc}") from exc

    def stop(self, timeout: float = 10.0) -> None:
        """Ask each worker to leave; kill what is still there after `timeout` (at once when a
        worker was lost: the others may be stuck in a collective)."""
        if self.lost:
            timeout = 0.0
        self._stopping = True
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.send(("stop",))
        for p in self.procs:
            p.join(timeout)
            if p.is_alive():
                p.kill()  # (a hung worker, or one stopped by a signal)
                p.join(1.0)


class TPDriverExecutor(TorchExecutor):
    """Rank 0's executor: each step goes to the workers in one message, then runs here."""

    def __init__(self, model, *args, workers: TPWorkers, **kwargs) -> None:
        self.workers = workers
        self._hooked = False
        if model.tp is not None:  # a shared-memory wait gives up once a worker is gone
            model.tp.abort = workers.gone
        super().__init__(model, *args, **kwargs)

    def execute(self, out: SchedulerOutput) -> ExecutorOutput:
        if self.workers.lost:
            raise ExecutorLost(self.workers.lost)
        try:
            scheduled, drafts, failed = self.prepare(out)
            self.workers.send(("step", out, failed, drafts, self._hooked))
            return self.run_step(scheduled, drafts, failed)
        except ExecutorLost:
            raise
        except Exception as exc:  # the ranks may be out of step: nothing can run any more
            why = self.workers.diagnose(exc)
            self.workers.lost = why
            raise ExecutorLost(why) from exc

    @property
    def lost(self) -> str | None:
        """Why a worker is gone (None while all are running)."""
        return self.workers.lost

    def watch(self, on_lost: Callable[[str], None]) -> None:
        self.workers.watch(on_lost)

    def set_layer_hook(self, hook: Callable[[], None] | None) -> None:
        super().set_layer_hook(hook)
        self._hooked = hook is not None
        if hook is None:
            return
        inner = self.model.layer_hook

        def boundary() -> None:  # the workers wait here for the steps the hook runs
            try:
                inner()
            finally:
                self.workers.send(("cont",))

        self.model.layer_hook = boundary

    def close(self) -> None:
        self.workers.stop()
        if self.tp is not None:
            self.tp.close()


class TPFollowerExecutor(TorchExecutor):
    """Ranks 1..N-1: the steps rank 0 sends, on this rank's shard."""

    def follow(self, conn: Connection) -> None:
        self.conn = conn
        while True:
            try:
                msg = conn.recv()
            except EOFError:  # rank 0 is gone
                return
            if msg[0] == "stop":
                return
            self._step(msg)

    def _step(self, msg: tuple) -> None:
        _, out, failed, drafts, hooked = msg
        self.model.layer_hook = self._boundary if hooked else None
        self.run_step(*self.prepare(out, failed, drafts))

    def _boundary(self) -> None:
        while True:
            msg = self.conn.recv()
            if msg[0] == "cont":
                return
            self._step(msg)  # a step rank 0's hook ran (a cut-in), then this one goes on
            self.model.layer_hook = self._boundary


def worker_main(spec: WorkerSpec, conn: Connection) -> None:
    """A worker process: join the group, build the shard, tell rank 0, follow its steps."""
    logging.basicConfig(
        level=spec.log_level, format=f"%(levelname)s tp{spec.rank} %(name)s: %(message)s"
    )
    try:
        from tierserve.engine.builder import build_follower

        group = TPGroup(spec.rank, spec.size, spec.device, spec.shm_path)
        parent = os.getppid()
        group.abort = lambda: "rank 0 is gone" if os.getppid() != parent else None
        group.connect(spec.port)
        executor = build_follower(spec, group, lambda: conn.send(("loaded", None)))
    except BaseException as exc:  # told to rank 0, in one line
        with contextlib.suppress(OSError):
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
        log.debug("%s", traceback.format_exc())
        os._exit(1)
    try:
        executor.follow(conn)
    except BaseException:  # rank 0 sees the collective fail (or the process end)
        log.exception("tensor-parallel worker %d failed", spec.rank)
        os._exit(1)
    group.close()
