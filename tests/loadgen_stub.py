"""A stub OpenAI-compatible server for the load generator's tests: deterministic delays and
chunk timings, refusals, and every broken behaviour the client must survive. Served by uvicorn
on a loopback port, in a thread."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.server_utils import free_port


@dataclass
class StubConfig:
    """`ttft_s[class]`: delay before the first chunk; then `gap_s` between chunks; one chunk
    per output token (`max_tokens` of them). `mode`: ok | 404 | 500 | malformed | truncated |
    cut (connection dropped midway) | error_event | slow."""

    ttft_s: tuple[float, ...] = (0.0, 0.0, 0.0, 0.0)
    gap_s: float = 0.0
    mode: str = "ok"
    usage: bool = True
    usage_factor: int = 1  # usage.completion_tokens = factor x chunks sent
    refuse: dict = field(default_factory=dict)  # class -> (status, retry_after or None)
    seen: list = field(default_factory=list)  # (headers, body) of every generation request


def _priority(req: Request, body: dict) -> int:
    tier = req.headers.get("x-request-tier")
    if tier:
        return int(tier.lstrip("p"))
    return int(body.get("priority", 1))


def _chunk(api: str, text: str) -> str:
    choice = {"index": 0, "delta": {"content": text}} if api == "chat" else {"text": text}
    return "data: " + json.dumps({"choices": [{**choice, "finish_reason": None}]}) + "\n\n"


async def _events(cfg: StubConfig, api: str, prio: int, body: dict):
    n = int(body.get("max_tokens") or 4)
    await asyncio.sleep(cfg.ttft_s[prio])
    if cfg.mode == "malformed":
        yield "data: {this is not json\n\n"
        return
    if api == "chat":  # a role-only first chunk, as real servers send: not a token
        yield "data: " + json.dumps({"choices": [{"index": 0, "delta": {"role": "x"}}]}) + "\n\n"
    for i in range(n):
        if i:
            await asyncio.sleep(cfg.gap_s)
        yield _chunk(api, f" t{i}")
        if cfg.mode in ("truncated", "cut", "error_event") and i == n // 2:
            if cfg.mode == "cut":
                raise RuntimeError("connection dropped on purpose")
            if cfg.mode == "error_event":
                yield 'data: {"error": {"message": "engine failed", "type": "server_error"}}\n\n'
            return
    if cfg.usage and (body.get("stream_options") or {}).get("include_usage"):
        usage = {"prompt_tokens": 11, "completion_tokens": n * cfg.usage_factor}
        yield "data: " + json.dumps({"choices": [], "usage": usage}) + "\n\n"
    yield "data: [DONE]\n\n"


def make_app(cfg: StubConfig) -> Starlette:
    async def models(req: Request):
        if cfg.mode == "404":
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        return JSONResponse({"data": [{"id": "stub-model"}]})

    async def generate(req: Request):
        body = await req.json()
        cfg.seen.append((dict(req.headers), body))
        if cfg.mode == "404":
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        if cfg.mode == "500":
            return JSONResponse({"error": {"message": "boom"}}, status_code=500)
        prio = _priority(req, body)
        if prio in cfg.refuse:
            status, retry = cfg.refuse[prio]
            headers = {"retry-after": str(retry)} if retry is not None else {}
            return JSONResponse({"error": {"message": "queue full"}}, status, headers=headers)
        api = "chat" if req.url.path.endswith("chat/completions") else "completions"
        return StreamingResponse(_events(cfg, api, prio, body), media_type="text/event-stream")

    async def root(req: Request):
        return Response("stub")

    return Starlette(
        routes=[
            Route("/", root),
            Route("/v1/models", models),
            Route("/v1/chat/completions", generate, methods=["POST"]),
            Route("/v1/completions", generate, methods=["POST"]),
        ]
    )


@contextmanager
def serving(cfg: StubConfig, port: int | None = None):
    """Serve the stub in a thread; yield its base URL."""
    port = port or free_port()
    server = uvicorn.Server(
        uvicorn.Config(make_app(cfg), host="127.0.0.1", port=port, log_level="critical")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            httpx.get(url, timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.05)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(10)


def word_tokenizer_file(path) -> str:
    """A whitespace word-level tokenizer over the prompt corpus, saved as tokenizer.json: decoding
    and re-encoding give back the same ids, so prompt lengths come out exact."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from tierserve.loadgen.text import read_corpus

    words = set(read_corpus().split()) | {"Request"} | {f"{i}." for i in range(10_000)}
    vocab = {w: i for i, w in enumerate(["[UNK]", *sorted(words)])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.save(str(path))
    return str(path)
