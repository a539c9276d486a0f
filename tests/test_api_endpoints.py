"""/tokenize, /detokenize and /version in vLLM's shapes; /health answering 503 once the engine
thread has died; `--api-key` guarding every /v1 route and the tokenizer routes, and nothing
else. Fake engine, no model."""

import time

import httpx
import openai
import pytest

import tierserve
from tests.fake_engine import fake_built, tiny_tokenizer, words
from tests.server_utils import running_server
from tierserve.api.settings import ServerSettings

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def server():
    with running_server(fake_built()) as (url, state):
        yield url, state


def test_tokenize_a_prompt(server):
    url, state = server
    r = httpx.post(f"{url}/tokenize", json={"prompt": words(4), "return_token_strs": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tokens"] == tiny_tokenizer().encode(words(4)) == [1, 2, 3, 4]
    assert body["count"] == 4 and body["max_model_len"] == state.max_model_len
    assert body["token_strs"] == ["w1", "w2", "w3", "w4"]
    assert httpx.post(f"{url}/tokenize", json={"prompt": "w1"}).json()["token_strs"] is None


def test_tokenized_messages_are_the_chat_prompt(server):
    url, state = server
    messages = [{"role": "user", "content": "w5 w6"}]
    r = httpx.post(f"{url}/tokenize", json={"messages": messages}).json()
    assert state.tokenizer.decode(r["tokens"]) == "w0 w5 w6 w0"  # "user w5 w6 assistant"
    c = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
    chat = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=1)
    assert chat.usage.prompt_tokens == r["count"]
    no_gen = httpx.post(
        f"{url}/tokenize", json={"messages": messages, "add_generation_prompt": False}
    ).json()
    assert no_gen["tokens"] == r["tokens"][:-1]


def test_detokenize_and_version(server):
    url, _ = server
    r = httpx.post(f"{url}/detokenize", json={"tokens": [7, 8, 999]})
    assert r.json() == {"prompt": "w7 w8 </s>"}  # special tokens kept, as vLLM does
    assert httpx.post(f"{url}/detokenize", json={"tokens": []}).json() == {"prompt": ""}
    assert httpx.get(f"{url}/version").json() == {"version": tierserve.__version__}


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        (
            "/tokenize",
            {"prompt": "w1", "messages": [{"role": "user", "content": "x"}]},
            400,
            "exactly one",
        ),
        ("/tokenize", {}, 400, "exactly one"),
        ("/tokenize", {"prompt": "w1", "tools": []}, 400, "only with messages"),
        ("/tokenize", {"prompt": "w1", "model": "gpt-9"}, 404, "gpt-9"),
        ("/tokenize", {"prompt": "w1", "extra": 1}, 400, "unknown field 'extra'"),
        ("/detokenize", {"tokens": [1, 1000]}, 400, "[0, 1000)"),
        ("/detokenize", {"tokens": [-1]}, 400, "tokens.0"),
    ],
)
def test_tokenizer_route_errors(server, path, body, status, needle):
    url, _ = server
    r = httpx.post(f"{url}{path}", json=body)
    assert r.status_code == status and needle in r.json()["error"]["message"], r.text


def test_health_is_503_once_the_engine_thread_has_died():
    with running_server(fake_built()) as (url, state):
        assert httpx.get(f"{url}/health").json() == {"status": "ok"}

        def boom(_snapshot):
            raise RuntimeError("injected engine failure")

        state.engine._on_snapshot = boom  # the next idle tick (0.1 s) crashes the thread
        deadline = time.monotonic() + 10
        while state.engine.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        r = httpx.get(f"{url}/health")
        assert r.status_code == 503 and "injected engine failure" in r.json()["reason"]
        assert r.headers["retry-after"]
        assert httpx.get(f"{url}/ready").status_code == 503


KEY = "sk-test-123"
GUARDED = [
    ("GET", "/v1/models", None),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "w1"}]}),
    ("POST", "/v1/completions", {"prompt": "w1", "max_tokens": 1}),
    ("POST", "/tokenize", {"prompt": "w1"}),
    ("POST", "/detokenize", {"tokens": [1]}),
]
OPEN = ["/health", "/ready", "/metrics", "/version", "/openapi.json"]


def _check_auth(url: str) -> None:
    paths = httpx.get(f"{url}/openapi.json").json()["paths"]
    guarded = {p for p in paths if p.startswith("/v1") or p in ("/tokenize", "/detokenize")}
    assert guarded == {path for _, path, _ in GUARDED}  # a new route must be listed here
    for method, path, body in GUARDED:
        r = httpx.request(method, f"{url}{path}", json=body)
        assert r.status_code == 401, (path, r.text)
        assert r.json()["error"]["type"] == "authentication_error"
        bad = httpx.request(method, f"{url}{path}", json=body, headers={"authorization": "x"})
        assert bad.status_code == 401
        ok = httpx.request(
            method, f"{url}{path}", json=body, headers={"authorization": f"Bearer {KEY}"}
        )
        assert ok.status_code == 200, (path, ok.text)
    for path in OPEN:
        assert httpx.get(f"{url}{path}").status_code == 200, path
    # the key is checked before the body: no key, bad body -> 401, not 400
    r = httpx.post(f"{url}/v1/chat/completions", json={"messages": "nonsense"})
    assert r.status_code == 401
    c = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    assert [m.id for m in c.models.list().data] == [MODEL]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="sk-wrong", max_retries=0).models.list()


def test_api_key_guards_every_v1_route_and_the_tokenizer_routes():
    with running_server(fake_built(), ServerSettings(api_key=KEY)) as (url, _):
        _check_auth(url)


def test_api_key_from_the_environment(monkeypatch):
    from tests.test_serve_cli import parse

    monkeypatch.setenv("TIERSERVE_API_KEY", KEY)
    _, settings = parse("--batch-db", "off")  # the Batch API's routes: test_batch_api_faults
    assert settings.api_key == KEY
    with running_server(fake_built(), settings) as (url, _):
        _check_auth(url)
    _, settings = parse("--api-key", "sk-flag")
    assert settings.api_key == "sk-flag"  # the flag wins
