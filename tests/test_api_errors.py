"""Every error the server answers is OpenAI-shaped JSON (never plain text, never FastAPI's
`{"detail": ...}`), with the status the OpenAPI schema documents; booleans are strict; an
unexpected exception is a JSON 500 naming a request id that the log names too."""

import json
import logging

import httpx
import pytest

from tests.server_utils import running_server, small_engine_args
from tierserve.api.unsupported import pending_fields
from tierserve.engine.builder import build_engine

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def server():
    with running_server(build_engine(small_engine_args())) as (url, state):
        yield url, state


def openai_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    err = r.json()["error"]
    assert {"message", "type", "param", "code"} <= set(err), err
    return err


def ask(**extra) -> dict:
    return {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, **extra}


# -- issue 14, item 3: an empty prompt, and unexpected exceptions --------------------------------


@pytest.mark.parametrize("prompt", [[""], "", [], [[]]])
def test_empty_prompt_is_a_400(server, prompt):
    url, _ = server
    r = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 2})
    err = openai_error(r, 400)
    assert "prompt" in err["message"]


class _Broken:
    """The real tokenizer, except that `method` raises."""

    def __init__(self, real, method):
        self._real, self._method = real, method

    def __getattr__(self, name):
        if name == self._method:

            def boom(*_a, **_k):
                raise RuntimeError("injected failure")

            return boom
        return getattr(self._real, name)


def test_unexpected_exception_is_a_json_500_with_a_logged_request_id(server, caplog):
    url, state = server
    real = state.chat
    state.chat = _Broken(real, "encode")
    try:
        with caplog.at_level(logging.ERROR, logger="tierserve.api"):
            r = httpx.post(f"{url}/v1/chat/completions", json=ask())
    finally:
        state.chat = real
    err = openai_error(r, 500)
    rid = r.headers["x-request-id"]
    assert rid in err["message"] and err["type"] == "server_error"
    logged = [rec for rec in caplog.records if rid in rec.getMessage()]
    assert logged and logged[0].exc_info is not None  # the traceback, under that id
    assert httpx.post(f"{url}/v1/chat/completions", json=ask()).status_code == 200


def test_exception_inside_a_stream_ends_it_with_an_error_event_and_done(server, caplog):
    url, state = server
    real = state.tokenizer
    state.tokenizer = _Broken(real, "token_bytes")  # used for chat logprobs, after the 200
    try:
        with caplog.at_level(logging.ERROR, logger="tierserve.api"):
            r = httpx.post(
                f"{url}/v1/chat/completions", json=ask(stream=True, logprobs=True), timeout=60
            )
    finally:
        state.tokenizer = real
    assert r.status_code == 200
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    err = json.loads(events[-2])["error"]
    assert err["type"] == "server_error" and "request id" in err["message"]
    assert any("injected failure" in str(rec.exc_info) for rec in caplog.records)


# -- issue 14, item 6: OpenAI error shape everywhere, 413 when chunked, strict booleans ---------


def test_invalid_utf8_body_is_an_openai_400(server):
    url, _ = server
    body = b'{"prompt": "\xff\xfe", "max_tokens": 2}'
    r = httpx.post(
        f"{url}/v1/completions", content=body, headers={"content-type": "application/json"}
    )
    assert "UTF-8" in openai_error(r, 400)["message"]


def test_unknown_route_and_wrong_method(server):
    url, _ = server
    err = openai_error(httpx.get(f"{url}/v1/nothing-here"), 404)
    assert "/v1/nothing-here" in err["message"] and err["code"] == "not_found"
    r = httpx.get(f"{url}/v1/completions")
    err = openai_error(r, 405)
    assert err["code"] == "method_not_allowed" and r.headers["allow"] == "POST"


def test_chunked_body_over_the_limit_is_413(server):
    """20 MB without a Content-Length (the default limit is 4 MiB)."""
    url, _ = server

    def body():
        yield b'{"prompt": "'
        for _ in range(20):
            yield b"x" * (1 << 20)
        yield b'"}'

    r = httpx.post(
        f"{url}/v1/completions",
        content=body(),
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert "content-length" not in r.request.headers
    assert openai_error(r, 413)["code"] == "request_too_large"


@pytest.mark.parametrize(
    ("path", "extra", "field"),
    [
        ("/v1/chat/completions", {"logprobs": "true"}, "logprobs"),
        ("/v1/chat/completions", {"ignore_eos": 1}, "ignore_eos"),
        ("/v1/chat/completions", {"stream": "false"}, "stream"),
        ("/v1/chat/completions", {"stream_options": {"include_usage": 1}}, "include_usage"),
        ("/v1/completions", {"echo": "yes"}, "echo"),
        ("/v1/completions", {"temperature": "0.5"}, "temperature"),
        ("/v1/completions", {"max_tokens": 2.5}, "max_tokens"),
        ("/v1/completions", {"max_tokens": "2"}, "max_tokens"),
        ("/v1/completions", {"n": True}, "n"),
    ],
)
def test_booleans_and_numbers_are_strict(server, path, extra, field):
    url, _ = server
    body = ask(**extra) if "chat" in path else {"prompt": "Hi", "max_tokens": 2, **extra}
    err = openai_error(httpx.post(f"{url}{path}", json=body), 400)
    assert field in err["param"]


def test_openapi_documents_what_the_server_answers(server):
    url, state = server
    schema = httpx.get(f"{url}/openapi.json").json()
    assert '"422"' not in json.dumps(schema["paths"])
    assert "HTTPValidationError" not in schema["components"]["schemas"]
    for path in ("/v1/chat/completions", "/v1/completions"):
        responses = schema["paths"][path]["post"]["responses"]
        for status in ("400", "401", "404", "413", "429", "503"):
            ref = responses[status]["content"]["application/json"]["schema"]["$ref"]
            assert ref.rsplit("/", 1)[1] in ("ErrorResponse", "OverloadResponse")
        for status in ("429", "503"):
            assert "Retry-After" in responses[status]["headers"]
        assert str(state.settings.max_request_bytes) in responses["413"]["description"]
    assert "Retry-After" in schema["paths"]["/ready"]["get"]["responses"]["503"]["headers"]
    props = schema["components"]["schemas"]["CompletionRequest"]["properties"]
    assert (props["n"]["minimum"], props["n"]["maximum"]) == (1, 8)
    assert props["max_tokens"]["anyOf"][0]["minimum"] == 0  # 0: scoring the prompt
    pending = pending_fields("completions")  # their descriptions say so, and only theirs
    for name, prop in props.items():
        assert ("Not supported yet" in prop.get("description", "")) == (name in pending), name
    chat = schema["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert chat["max_tokens"]["anyOf"][0]["minimum"] == 1
    assert '"ge"' not in json.dumps(schema)  # every bound is a JSON Schema keyword
    assert props["max_tokens"]["anyOf"][0]["maximum"] == state.max_model_len - 1
    assert props["prompt"]["anyOf"][0]["minLength"] == 1
    assert props["logprobs"]["anyOf"][0]["maximum"] == 5
    assert schema["info"]["x-max-request-bytes"] == state.settings.max_request_bytes


# -- issue 14, item 5: draining answers 503 with Retry-After, /ready says 503 -------------------


def test_while_draining_requests_and_ready_get_503_with_retry_after(server):
    url, state = server
    state.draining = True
    try:
        r = httpx.post(f"{url}/v1/chat/completions", json=ask())
        ready = httpx.get(f"{url}/ready")
    finally:
        state.draining = False
    assert openai_error(r, 503)["type"] == "resource_exhausted"
    assert int(r.headers["retry-after"]) >= 1
    assert ready.status_code == 503 and int(ready.headers["retry-after"]) >= 1


# -- issue 46, item 6: small ones ---------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_an_empty_body_is_named_as_such(server, path):
    url, _ = server
    r = httpx.post(f"{url}{path}", content=b"", headers={"content-type": "application/json"})
    err = openai_error(r, 400)
    assert "missing request body" in err["message"] and "None" not in err["message"]


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_stream_options_without_streaming_is_a_400(server, path):
    url, _ = server
    extra = {"stream_options": {"include_usage": True}}
    body = ask(**extra) if "chat" in path else {"prompt": "Hi", "max_tokens": 2, **extra}
    err = openai_error(httpx.post(f"{url}{path}", json=body), 400)
    assert "stream_options is only allowed when stream is true" in err["message"]
    ok = httpx.post(f"{url}{path}", json={**body, "stream": True}, timeout=60)
    assert ok.status_code == 200
