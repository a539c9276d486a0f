"""Run a real uvicorn server with the embedded model on a loopback port, in a thread."""

from __future__ import annotations

import gc
import threading
import time
from contextlib import contextmanager
from dataclasses import replace

import httpx
import uvicorn

from tierserve.api.settings import ServerSettings
from tierserve.engine.args import EngineArgs
from tierserve.engine.builder import BuiltEngine
from tierserve.host.memory import freeze_heap
from tierserve.loadgen.server import free_port
from tierserve.server import build_app, build_state, uvicorn_config


@contextmanager
def running_server(built: BuiltEngine, settings: ServerSettings | None = None, **admission):
    """Serve `built` (its engine is reused between servers) with the given settings and
    admission overrides; yield (base_url, state)."""
    args = built.args
    if admission:
        args = replace(args, admission=replace(args.admission, **admission))
    settings = replace(settings or ServerSettings(), port=free_port())
    state = build_state(args, settings, built)
    settings = replace(settings, log_level="warning")
    server = uvicorn.Server(uvicorn_config(build_app(state), settings))
    thread = threading.Thread(target=server.run, daemon=True)
    freeze_heap()  # as `tierserve serve` does; undone below (this process is the test run)
    thread.start()
    url = f"http://127.0.0.1:{settings.port}"
    for _ in range(200):
        try:
            if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    try:
        yield url, state
    finally:
        server.should_exit = True
        thread.join(30)
        gc.unfreeze()
        # The next server reuses this engine: it must be empty.
        assert not built.engine.has_unfinished(), "requests left in the engine"


def small_engine_args(**kw) -> EngineArgs:
    # float32 products and KV cache: the servers under test are compared with transformers
    # and with themselves bit for bit (bf16 products, the default where the CPU has
    # AVX512_BF16, are measured in test_quant.py; the CPU's default float16 cache, which moves
    # logprobs by ~1e-3, in test_kv_dtype.py)
    base = dict(
        kv_cache_gib=0.25,
        max_num_seqs=32,
        max_num_batched_tokens=1024,
        seed=0,
        activations="float32",
        kv_cache_dtype="float32",
    )
    base.update(kw)
    return EngineArgs(**base)
