"""Helpers of the Batch API tests: input files, the openai client, waiting for a status."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

FINAL = ("completed", "failed", "expired", "cancelled")


def client(url: str, tenant: str | None = None, key: str = "none") -> openai.OpenAI:
    headers = {"x-tenant-id": tenant} if tenant else None
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, default_headers=headers)


def chat_line(cid: str, text: str, max_tokens: int = 4, **body) -> dict:
    return {
        "custom_id": cid,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens,
            "temperature": 0,
            **body,
        },
    }


def completion_line(cid: str, prompt: str, max_tokens: int = 3, **body) -> dict:
    return {
        "custom_id": cid,
        "method": "POST",
        "url": "/v1/completions",
        "body": {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **body},
    }


def jsonl(lines: list[dict]) -> bytes:
    return ("\n".join(json.dumps(x) for x in lines) + "\n").encode()


def upload(c: openai.OpenAI, lines: list[dict], name: str = "in.jsonl"):
    return c.files.create(file=(name, jsonl(lines)), purpose="batch")


def wait_status(c: openai.OpenAI, batch_id: str, statuses=FINAL, timeout: float = 300):
    deadline = time.monotonic() + timeout
    while True:
        b = c.batches.retrieve(batch_id)
        if b.status in statuses:
            return b
        assert time.monotonic() < deadline, f"batch {batch_id} still {b.status}: {b}"
        time.sleep(0.2)


def read_jsonl(c: openai.OpenAI, file_id: str | None) -> dict[str, dict]:
    """A result file's lines by custom_id (and no custom_id twice)."""
    if file_id is None:
        return {}
    lines = [json.loads(x) for x in c.files.content(file_id).text.splitlines() if x.strip()]
    by_id = {x["custom_id"]: x for x in lines}
    assert len(by_id) == len(lines), "a custom_id appears twice"
    return by_id


@contextmanager
def batch_server(built, settings):
    """`server_utils.running_server`, also yielding the Batch API's service (in this process:
    tests reach into it to break its store)."""
    from fastapi import FastAPI

    from tests import server_utils

    made: list[FastAPI] = []
    real = server_utils.build_app

    def capture(state):
        made.append(real(state))
        return made[-1]

    server_utils.build_app = capture
    try:
        with server_utils.running_server(built, settings) as (url, state):
            yield url, state, made[-1].state.batch
    finally:
        server_utils.build_app = real


def metric(url: str, name: str, **labels) -> float:
    """The sum of the server's samples of `name` with these labels."""
    total = 0.0
    for fam in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total
