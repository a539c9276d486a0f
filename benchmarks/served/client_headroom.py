"""How fast a client can drive a server that costs nothing: the load generator's headroom.

    python benchmarks/served/client_headroom.py [--seconds 5] [--concurrency 64]

A stub server (Starlette under uvicorn, in its own process) answers `GET /health` at once and
streams `POST /stream` as server-sent events (`--events` per request, no delay). Each client
(aiohttp, as `tierserve bench serve` now uses, and httpx, as it used before) is driven for
`--seconds` with `--concurrency` requests in flight: requests per second on /health, and
streamed events per second. A served benchmark measures the server only while the server's
rates stay well below these.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import time

import aiohttp
import httpx

from tierserve.loadgen.server import free_port

EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'


def stub(port: int, events: int) -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    async def health(_):
        return PlainTextResponse("ok")

    async def stream(_):
        async def body():
            for _ in range(events):
                yield EVENT
            yield b"data: [DONE]\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/health", health), Route("/stream", stream, methods=["POST"])])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


async def drive(kind: str, url: str, seconds: float, concurrency: int) -> dict:
    counts = {"health": 0, "events": 0}

    async def loop_aiohttp(http, what: str, stop: float):
        while time.perf_counter() < stop:
            if what == "health":
                async with http.get(f"{url}/health") as r:
                    await r.read()
                counts["health"] += 1
            else:
                async with http.post(f"{url}/stream", json={}) as r:
                    async for line in r.content:
                        if line.startswith(b"data: {"):
                            counts["events"] += 1

    async def loop_httpx(http, what: str, stop: float):
        while time.perf_counter() < stop:
            if what == "health":
                (await http.get(f"{url}/health")).raise_for_status()
                counts["health"] += 1
            else:
                async with http.stream("POST", f"{url}/stream", json={}) as r:
                    async for line in r.aiter_lines():
                        if line.startswith("data: {"):
                            counts["events"] += 1

    out = {}
    for what in ("health", "events"):
        if kind == "aiohttp":
            conn = aiohttp.TCPConnector(limit=0)
            client = aiohttp.ClientSession(connector=conn)
            body = loop_aiohttp
        else:
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=1024)
            client = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(None))
            body = loop_httpx
        async with client as http:
            start = time.perf_counter()
            stop = start + seconds
            await asyncio.gather(*(body(http, what, stop) for _ in range(concurrency)))
            out[f"{what}_per_s"] = round(counts[what] / (time.perf_counter() - start))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--events", type=int, default=200, help="events per streamed request")
    args = p.parse_args()
    port = free_port()
    server = multiprocessing.get_context("spawn").Process(target=stub, args=(port, args.events))
    server.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.1)
    try:
        res = {
            kind: asyncio.run(drive(kind, url, args.seconds, args.concurrency))
            for kind in ("aiohttp", "httpx")
        }
    finally:
        server.terminate()
        server.join()
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
