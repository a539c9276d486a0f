"""Slow clients cannot hold the server's sockets (issue 23, item 6): a request's headers and
body have deadlines (408, then the connection closes) and open connections are capped (503).
Through real sockets against the server's own uvicorn configuration."""

from __future__ import annotations

import socket
import time
from contextlib import closing

import httpx

from tests.fake_engine import fake_built, words
from tests.server_utils import running_server
from tierserve.api.settings import ServerSettings

MAX_CONNECTIONS = 6


def limits() -> ServerSettings:
    return ServerSettings(header_timeout_s=0.5, body_timeout_s=0.5, max_connections=6)


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=5)
    return s


def _read_all(s: socket.socket, limit_s: float = 5.0) -> tuple[bytes, float]:
    """Everything until the server closes the connection, and how long that took."""
    t0, out = time.monotonic(), b""
    s.settimeout(limit_s)
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return out, time.monotonic() - t0
        out += chunk


def test_headers_that_never_end_get_408_and_the_connection_closes():
    with running_server(fake_built(), limits()) as (url, _):
        with closing(_connect(url)) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n")  # no blank line
            data, took = _read_all(s)
        assert data.startswith(b"HTTP/1.1 408"), data
        assert b"headers" in data
        assert took < 3
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200


def test_a_body_that_never_ends_gets_408_and_the_handler_is_released():
    with running_server(fake_built(), limits()) as (url, state):
        with closing(_connect(url)) as s:
            s.sendall(
                b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"content-length: 500\r\n\r\n" + b'{"prompt": "w1 w2'
            )
            data, took = _read_all(s)
        assert data.startswith(b"HTTP/1.1 408"), data
        assert b"body" in data and took < 3
        # The server is fine, and nothing was left in the engine.
        body = {"prompt": words(4), "max_tokens": 2}
        assert httpx.post(f"{url}/v1/completions", json=body, timeout=10).status_code == 200
        assert state.engine.num_in_flight() == 0


def test_connections_beyond_the_cap_get_503_until_the_idle_ones_time_out():
    with running_server(fake_built(), limits()) as (url, _):
        idle = [_connect(url) for _ in range(MAX_CONNECTIONS)]
        time.sleep(0.1)
        with closing(_connect(url)) as extra:
            data, took = _read_all(extra)
        assert data.startswith(b"HTTP/1.1 503"), data
        assert b"retry-after" in data.lower() and took < 1
        # The idle connections sent nothing: their header deadline closes them.
        for s in idle:
            with closing(s):
                data, _ = _read_all(s)
                assert data.startswith(b"HTTP/1.1 408")
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200


def test_a_kept_alive_connection_gets_a_fresh_header_deadline_per_request():
    with running_server(fake_built(), limits()) as (url, _), httpx.Client(timeout=5) as c:
        for _ in range(3):  # each request well inside its deadlines, 0.3 s apart
            assert c.get(f"{url}/health").status_code == 200
            time.sleep(0.3)
